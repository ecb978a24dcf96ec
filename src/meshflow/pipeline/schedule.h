// Pipeline schedules: per-rank action lists (forward, backward, weight-grad,
// send, recv) for p pipeline ranks, m micro-batches and v model chunks per
// rank, plus a simulator that runs the lists with given op times, matches
// every receive to its send, and reports deadlocks, makespan and bubble.
//
//   MF_ASSIGN_OR_RETURN(Schedule s, make_schedule({.kind = ScheduleKind::k1F1B,
//                                                 .stages = 4, .micro_batches = 8}));
//   for (const Action& a : s.ranks[0]) std::cout << to_string(a) << "\n";
//   MF_ASSIGN_OR_RETURN(SimResult r, simulate(s, SimCosts{}));
//   // r.bubble_fraction vs ideal_bubble_fraction(s.options, SimCosts{})
//
// Model chunks: the model is cut into p*v chunks (a "chunk" is a virtual
// stage); chunk c runs on rank c % p (round-robin, as in Megatron-LM's
// interleaved schedule), so for v = 1 chunk == stage == rank. zb-v places its
// two chunks per rank in a V instead: chunk c < p on rank c, chunk c >= p on
// rank 2p-1-c (rank 0 holds the first and the last chunk; rank p-1 hands
// chunk p-1's output to chunk p without a message).
//
// How the lists are made (one global order): first each rank's compute order
// (F/B/W) is fixed by the schedule's rule; then every cross-rank dependency
// becomes a Send right after its producer and a Recv right before its
// consumer. Sends are eager (the runtime hands them to a sender thread per
// channel and goes on), receives block. Each (src, dst, kind) channel is
// FIFO; simulate() checks that the k-th receive on a channel expects exactly
// the k-th message sent on it (nothing can cross), that every dependency is
// met, and that no set of ranks waits on each other (deadlock). Every
// generated schedule is checked this way in make_schedule().
//
// Compute order rules (F = forward, B = backward, W = weight-gradient):
//   GPipe        all F in micro-batch order, then all B in micro-batch order.
//   1F1B         rank r: min(p-r-1, m) warm-up F, then alternate F,B, then the
//                remaining B; at most p - r micro-batches in flight on rank r.
//   interleaved  Megatron-LM: forwards in groups of p micro-batches, chunk by
//                chunk; warm-up (p-r-1)*2 + (v-1)*p forwards, then 1F1B.
//                Valid for v >= 1 when m % p == 0 (see make_schedule).
//   zb-h1        Qi et al. 2023: B split into BackwardInput (the gradient the
//                previous stage waits for) and BackwardWeight (W, deferred to
//                fill bubbles). Built by list scheduling with unit times:
//                F first (1F1B's in-flight rule, p - r on rank r), then Bi,
//                then a pending W; at most p micro-batches hold activations
//                (F done, W not done) on any rank: 1F1B's peak.
//   zb-v         Qi et al. 2024: two chunks per rank in a V, B split as in
//                zb-h1. List scheduling (event-driven, at chunk times), a
//                free rank taking Bi of its first chunk, Bi of its second, F
//                of the second, F of the first, else its oldest pending W; at
//                most 2p (mb, chunk) pairs hold activations on any rank
//                (1F1B's peak of p whole-stage micro-batches, on every rank).
//                At equal times (F = Bi = W) and m >= p it reaches the
//                makespan 6m + p - 1 chunk units: every rank idles only p-1.
//                An order made for equal times runs badly when W is shorter
//                than Bi (each round of micro-batches then waits), so three
//                candidate orders are made (at equal times; at
//                options.zb_v_costs; at those, reserving room for each
//                started micro-batch's second chunk) and the one whose
//                simulated makespan at zb_v_costs is least is kept.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshflow/core/status.h"

namespace meshflow {

enum class ScheduleKind : uint8_t { kGPipe, k1F1B, kInterleaved, kZbH1, kZbV };
std::string_view schedule_name(ScheduleKind k);  // "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"
// "gpipe" | "1f1b" | "interleaved" | "zb-h1" | "zb-v"; the error lists them.
Result<ScheduleKind> parse_schedule_kind(const std::string& name);

enum class ActionKind : uint8_t {
  kForward,         // F(mb, chunk)
  kBackward,        // B(mb, chunk): input and weight gradients
  kBackwardInput,   // zb-h1, zb-v: input gradient only
  kBackwardWeight,  // zb-h1, zb-v: weight gradient (W)
  kSendAct,         // output of F(mb, chunk) to rank_of(chunk + 1)
  kRecvAct,         // input of F(mb, chunk) from rank_of(chunk - 1)
  kSendGrad,        // input gradient of B(mb, chunk) to rank_of(chunk - 1)
  kRecvGrad,        // output gradient of B(mb, chunk) from rank_of(chunk + 1)
};
std::string_view action_name(ActionKind k);  // "F", "B", "Bi", "W", "send_act", ...
bool is_compute(ActionKind k);

struct Action {
  ActionKind kind = ActionKind::kForward;
  int micro = 0;  // micro-batch in [0, m)
  int chunk = 0;  // model chunk in [0, p*v)
  int peer = -1;  // sends/recvs: the other rank
  bool operator==(const Action&) const = default;
};
std::string to_string(const Action& a);  // "F(mb=3,c=1)", "send_act(mb=3,c=1->r2)"

// Op times for simulate(), per chunk (a chunk holds 1/v of a stage's layers,
// so the interleaved schedule's F costs forward/v when comparing schedules).
// backward is a whole B; for zb-h1 and zb-v, BackwardInput and BackwardWeight each
// cost backward / 2 unless given.
struct SimCosts {
  double forward = 1;
  double backward = 2;
  double backward_input = -1;   // < 0: backward / 2
  double backward_weight = -1;  // < 0: backward / 2
  // A split backward's two halves, the defaults above applied.
  double bi() const { return backward_input >= 0 ? backward_input : backward / 2; }
  double bw() const { return backward_weight >= 0 ? backward_weight : backward / 2; }
  double p2p = 0;  // latency of one message
  // Optional, per chunk: the bytes one micro-batch's stash holds from its F
  // to its B (Bi with a split backward), and from Bi to W;
  // SimResult::peak_stash_bytes.
  std::vector<double> stash_bytes, weight_hold_bytes;
  // Ranks time-sharing fewer cores (meshflow's in-process ranks on one
  // machine, plan::share_machine): each pipeline rank of the schedule stands
  // for `ranks_per_stage` ranks (its dp x tp x cp group), each with one core's
  // thread, and the costs above are priced at 1/ranks of the machine. While k
  // of the p pipeline ranks compute, each runs at ranks / max(cores,
  // k x ranks_per_stage) of that speed (processor sharing: the ranks waiting
  // in a bubble give their cores up), so simulate() runs the lists in time
  // order. 0, or no more ranks than cores: every rank has its own device.
  int cores = 0;
  int ranks_per_stage = 1;
};

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int stages = 1;          // p: pipeline ranks
  int micro_batches = 1;   // m
  int virtual_stages = 1;  // v: chunks per rank (interleaved: any; zb-v: 2; others: 1)
  // zb-v only: one chunk's F, Bi and W times its order is list-scheduled for
  // (the runtime: from the chunk programs' FLOPs; the planner: its priced
  // times). Only the ratios matter; every rank must pass the same.
  SimCosts zb_v_costs{};
  // zb-v only: the candidate order to make (0 for equal times, 1 at
  // zb_v_costs, 2 at those reserving room); -1: the one of least makespan.
  // make_schedule records the one it made in Schedule::options.
  int zb_v_order = -1;
};

// The rank that runs model chunk `chunk` (see "Model chunks" above).
int chunk_rank(const ScheduleOptions& o, int chunk);
// zb-h1 and zb-v run B as Bi and W.
bool splits_backward(ScheduleKind k);

struct Schedule {
  ScheduleOptions options;
  std::vector<std::vector<Action>> ranks;  // ranks[r]: rank r's actions in order
  int num_chunks() const { return options.stages * options.virtual_stages; }
  int rank_of_chunk(int chunk) const { return chunk_rank(options, chunk); }
  bool split_backward() const { return splits_backward(options.kind); }
};

// Errors (a Status naming what is valid): p < 1, m < 1, v < 1; v > 1 with a
// schedule other than interleaved or zb-v; zb-v with v != 2; interleaved with
// v > 1 and m % p != 0.
Result<Schedule> make_schedule(const ScheduleOptions& options);

struct SimResult {
  double makespan = 0;
  std::vector<double> busy;                 // per rank: compute time
  double bubble_fraction = 0;               // 1 - sum(busy) / (p * makespan)
  std::vector<int> peak_in_flight;          // per rank: max (mb, chunk) pairs with F done and B
                                            // (zb-h1, zb-v: W) not yet done
  std::vector<double> peak_stash_bytes;     // per rank: the most SimCosts::stash_bytes held at once
  std::vector<std::vector<double>> start;   // per rank, per action: start time
  std::vector<std::vector<double>> finish;  // per rank, per action: end time (time-shared
                                            // cores stretch a compute action past its cost)
};

// Runs the lists. Errors name the rank and action: a dependency run before
// it is met, a receive matched to a different message (crossed), a
// deadlock (listing what each blocked rank waits for), a missing or
// repeated F/B/W.
Result<SimResult> simulate(const Schedule& s, const SimCosts& costs = {});

// The textbook bubble fraction for the options under these costs:
//   gpipe, 1f1b:  (p-1) / (m + p - 1)
//   interleaved:  (p-1) / (v*m + p - 1)          (chunk costs; Narayanan et al. 2021)
//   zb-h1:        (p-1)(F + Bi - W) / (m(F + Bi + W) + (p-1)(F + Bi - W))   (Qi et al. 2023)
//                 = (p-1) / (3m + p - 1) for F = Bi = W, a third of 1F1B's bubble time.
//   zb-v:         (p-1)F / (2m(F + Bi + W) + (p-1)F)                       (chunk costs)
//                 the start-up skew alone (each rank waits p-1 chunk forwards);
//                 = (p-1) / (6m + p - 1) for F = Bi = W, m >= p: half of zb-h1's
//                 bubble time when a chunk is half a stage. (Qi et al. count
//                 zero by letting the next step start during the skew, which
//                 a step ending in the gradient-norm all-reduce does not.)
double ideal_bubble_fraction(const ScheduleOptions& o, const SimCosts& costs = {});

}  // namespace meshflow
