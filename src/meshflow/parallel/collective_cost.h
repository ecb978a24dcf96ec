// The one cost of a collective, used by both the reshard planner (choosing the
// cheapest redistribution, parallel/reshard.h) and the planner (pricing the
// collectives of a rank's program, plan/cost_model.h). The links come from
// the cluster file (plan/cluster.h: intra_node / inter_node, the link a mesh
// axis maps to by its size and stride); without one, the reshard planner uses
// Link's defaults, which only rank redistributions against each other.
//
//   Link nvlink{.bandwidth_bytes_per_s = 300e9, .latency_s = 5e-6, .efficiency = 0.8};
//   double t = collective_time_s(Collective::kAllReduce, 8, 64e6, nvlink);
#pragma once

#include <cstdint>

#include "meshflow/ir/op_kind.h"

namespace meshflow {

// A link, as seen by one device: bandwidth per direction per device.
struct Link {
  double bandwidth_bytes_per_s = 50e9;
  double latency_s = 5e-6;  // alpha: per message step
  double efficiency = 1;
  double effective_bandwidth() const { return bandwidth_bytes_per_s * efficiency; }
};

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast, kSendRecv };
const char* collective_name(Collective c);  // "all_reduce", ...
// The collective a graph op runs (all_gather, reduce_scatter, all_to_all,
// broadcast; all_reduce for the rest).
Collective collective_of(OpKind kind);
// NCCL runs these as rings over its channels, which it spreads over a node's
// network ports (plan::Cluster::ring_link_for_axis); all_to_all and send/recv
// are point to point, one port per device.
inline bool is_ring_collective(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kAllGather ||
         c == Collective::kReduceScatter || c == Collective::kBroadcast;
}

// Ring alpha-beta time of one collective over `n` ranks on `link`; `bytes` is
// the full buffer (all_reduce: the buffer; all_gather: the gathered output;
// reduce_scatter: the input; all_to_all: one rank's input; broadcast: the
// buffer; send_recv: the message).
//   all_reduce      2(n-1) alpha + 2(n-1)/n bytes / bw
//   all_gather,
//   reduce_scatter,
//   all_to_all      (n-1) alpha +  (n-1)/n bytes / bw
//   broadcast       (n-1) alpha +        bytes / bw   (a pipelined ring from the
//                   root: every link carries the whole buffer once; n-1 of the
//                   n ranks send it, so (n-1)/n bytes per rank on average)
//   send_recv       alpha + bytes / bw
// with bw = link bandwidth * efficiency. n == 1: 0 (send_recv: its one message).
// REQUIRES: n >= 1, link bandwidth and efficiency > 0.
double collective_time_s(Collective c, int64_t n, double bytes, const Link& link);

// Bytes each rank sends in that collective (the ring factor applied to `bytes`).
double collective_bytes_per_rank(Collective c, int64_t n, double bytes);

}  // namespace meshflow
