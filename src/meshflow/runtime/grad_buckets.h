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
// as all_reduce nodes of the optimizer phase (a gradient Partial over dp, or
// over tp for a weight replicated across tensor-parallel ranks). The buckets
// take them over: gradient_syncs() finds each gradient's chain of all_reduce
// nodes, the buckets run those sums (one bucket per chain of mesh axes), and
// the trainer leaves the nodes out of its optimizer order (replaced()).
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
  // The program's all_reduce nodes that sum it, in order (one per mesh axis);
  // each is the only reader of the one before. Empty: accumulated only.
  std::vector<NodeId> reduce;
};

// Every parameter gradient of `g` (g.grad_of_param) with the chain of
// optimizer-phase all_reduce nodes that is its only reader, when it has one.
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
    std::vector<Communicator*> groups;  // summed over each, in order; empty: none
    std::vector<float> data;
    int total = 0, pending = 0;
    bool launched = false;
    Work work;
  };
  void build(const Graph& g, const std::vector<NodeId>& order,
             const std::vector<GradientSync>& syncs,
             const std::vector<std::vector<Communicator*>>& groups, int64_t bucket_bytes);
  void launch(Bucket& b);

  std::shared_ptr<Communicator> comm_;  // the replica form's group (kept alive)
  bool overlap_;
  std::vector<Slot> slots_;
  std::vector<std::vector<int>> slots_of_node_;  // node id -> slot indices it finalizes
  std::vector<Bucket> buckets_;
  std::vector<bool> replaced_;  // node id -> run by the buckets
  double wait_s_ = 0;
};

}  // namespace meshflow
