#include "meshflow/parallel/collective_cost.h"

#include "meshflow/core/check.h"

namespace meshflow {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllToAll:
      return "all_to_all";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kSendRecv:
      return "send_recv";
  }
  return "?";
}

Collective collective_of(OpKind kind) {
  switch (kind) {
    case OpKind::kAllGather:
      return Collective::kAllGather;
    case OpKind::kReduceScatter:
      return Collective::kReduceScatter;
    case OpKind::kAllToAll:
      return Collective::kAllToAll;
    case OpKind::kBroadcast:
      return Collective::kBroadcast;
    case OpKind::kNeighborExchange:
    case OpKind::kNeighborExchangeGrad:
      return Collective::kSendRecv;
    default:
      return Collective::kAllReduce;
  }
}

double collective_bytes_per_rank(Collective c, int64_t n, double bytes) {
  MF_CHECK(n >= 1);
  if (c == Collective::kSendRecv) return bytes;
  const double frac = static_cast<double>(n - 1) / static_cast<double>(n);
  return (c == Collective::kAllReduce ? 2 * frac : frac) * bytes;
}

double collective_time_s(Collective c, int64_t n, double bytes, const Link& link) {
  MF_CHECK(n >= 1);
  const double bw = link.effective_bandwidth();
  if (c == Collective::kSendRecv) return link.latency_s + bytes / bw;
  if (n == 1) return 0;
  const double steps = static_cast<double>(n - 1);
  const double rounds = c == Collective::kAllReduce ? 2 * steps : steps;
  // A broadcast's pipeline carries the whole buffer over every link.
  const double carried =
      c == Collective::kBroadcast ? bytes : collective_bytes_per_rank(c, n, bytes);
  return rounds * link.latency_s + carried / bw;
}

}  // namespace meshflow
