// GradientBuckets: how gradients are accumulated over micro-batches and
// reduced over the data-parallel group.
//
// Parameter gradients are packed into contiguous buckets in the order the
// backward pass finalizes them (last layers first). A gradient is copied (or,
// under micro-batching, added) into its slot the moment the node producing it
// has run; on the last micro-batch of a step, a bucket's all_reduce starts as
// soon as its last gradient is in, so communication overlaps the rest of the
// backward pass (DDP's bucketing). The optimizer then reads the reduced
// gradients straight from the buckets (Executor::bind), with no copy back.
//
// A partitioned program (parallel/partition.h) holds its gradient reductions
// as collectives of the optimizer phase (a gradient Partial over dp, or over
// tp for a weight replicated across tensor-parallel ranks): all_reduces, or,
// over two axes (dp and cp), the reshard planner's reduce_scatter over one,
// all_reduce over the other and all_gather back. The buckets take them over:
// gradient_syncs() finds each gradient's chain, the buckets run its sum as
// one all_reduce over the chain's mesh axes (a group over all of them when
// there are several: MeshComms::over; one bucket per set of axes), and the
// trainer leaves the nodes out of its optimizer order (replaced()).
//
//   std::vector<GradientSync> syncs = gradient_syncs(program.graph);
//   GradientBuckets buckets(g, ex.forward_backward_order(), syncs, &mesh_comms, 4 << 20);
//   for (micro ...) ex.run(order, [&](NodeId id) { buckets.on_node(ex, id, micro, m); });
//   MF_RETURN_IF_ERROR(buckets.finish(ex));   // waits, binds; run the optimizer
//                                             // order minus buckets.replaced()
#pragma once

#include <memory>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/ir/graph.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {

class MeshComms;  // parallel/reshard_exec.h

// One parameter gradient and the reduction the optimizer reads it through.
struct GradientSync {
  ValueId grad = kNoValue;  // as the backward produces it (one micro-batch's)
  // The program's collectives that sum it, in order, each the only reader of
  // the one before: all_reduces, and reduce_scatters each closed by an
  // all_gather over the same mesh axis and dim. Empty: accumulated only.
  std::vector<NodeId> reduce;
  // The mesh axes the chain sums over (an all_reduce's; a reduce_scatter and
  // its all_gather count once), in the chain's order.
  std::vector<int> axes;
  // The chain's values that hold the whole sum (an all_reduce's output
  // outside any reduce_scatter, an all_gather's that closes one): the
  // buckets bind them to the reduced gradient. The last is what the
  // optimizer reads.
  std::vector<ValueId> sums;
};

// Every parameter gradient of `g` (g.grad_of_param) with the chain of
// optimizer-phase collectives that is its only reader and ends in the whole
// sum, when it has one. (A reduce_scatter the optimizer reads as a shard,
// ZeRO's, is not part of it.)
std::vector<GradientSync> gradient_syncs(const Graph& g);

class GradientBuckets {
 public:
  // A partitioned program: the gradients `syncs` names, each summed over the
  // mesh axes of its all_reduce nodes on `comms` (may be null when no sync has
  // nodes). overlap=false launches every all_reduce only after the whole
  // backward (for measuring what overlap buys).
  GradientBuckets(const Graph& g, const std::vector<NodeId>& order,
                  const std::vector<GradientSync>& syncs, const MeshComms* comms,
                  int64_t bucket_bytes, bool overlap = true);
  // A replica's program (data-parallel pipeline stages): every gradient
  // summed over `comm` (null: one replica, accumulation only).
  GradientBuckets(const Graph& g, const std::vector<NodeId>& order,
                  std::shared_ptr<Communicator> comm, int64_t bucket_bytes, bool overlap = true);

  // After node `id` ran during micro-batch `micro` of `m`.
  void on_node(Executor& ex, NodeId id, int micro, int m);
  // Launches what is left, waits for every all_reduce, binds each gradient
  // value (and each replaced node's output) to its reduced slot. Returns the
  // first communication error.
  Status finish(Executor& ex);

  // `order` without the all_reduce nodes the buckets run instead.
  std::vector<NodeId> without_replaced(const std::vector<NodeId>& order) const;

  double last_wait_seconds() const { return wait_s_; }  // time finish() blocked
  // Seconds on_node has spent so far copying and adding the micro-batches'
  // gradients into the buckets (the plan check's optimizer part: the planner
  // prices it there, CostConstants::grads_accumulated_in_buckets).
  double accumulate_seconds() const { return accumulate_s_; }
  int64_t bytes() const;
  int num_buckets() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Slot {
    ValueId grad;
    std::vector<ValueId> reduced;  // replaced nodes' outputs, read from the slot
    int bucket;
    int64_t offset, count;
  };
  struct Bucket {
    Communicator* group = nullptr;  // summed over it; null: accumulated only
    std::vector<float> data;
    int total = 0, pending = 0;
    bool launched = false;
    Work work;
  };
  void build(const Graph& g, const std::vector<NodeId>& order,
             const std::vector<GradientSync>& syncs, const std::vector<Communicator*>& groups,
             int64_t bucket_bytes);
  void launch(Bucket& b);

  std::shared_ptr<Communicator> comm_;                 // the replica form's group (kept alive)
  std::vector<std::shared_ptr<Communicator>> joints_;  // groups over several mesh axes
  bool overlap_;
  std::vector<Slot> slots_;
  std::vector<std::vector<int>> slots_of_node_;  // node id -> slot indices it finalizes
  std::vector<Bucket> buckets_;
  std::vector<bool> replaced_;  // node id -> run by the buckets
  double wait_s_ = 0;
  double accumulate_s_ = 0;
};

}  // namespace meshflow
