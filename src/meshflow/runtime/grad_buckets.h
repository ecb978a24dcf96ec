// GradientBuckets: how data-parallel training synchronizes gradients.
//
// Parameter gradients are packed into contiguous buckets in the order the
// backward pass finalizes them (last layers first). A gradient is copied (or,
// under micro-batching, added) into its slot the moment the node producing it
// has run; on the last micro-batch of a step, a bucket's all_reduce starts as
// soon as its last gradient is in, so communication overlaps the rest of the
// backward pass (DDP's bucketing). The optimizer then reads the reduced
// gradients straight from the buckets (Executor::bind), with no copy back.
// With one rank the buckets are just the micro-batch accumulators.
//
//   GradientBuckets buckets(g, ex.forward_backward_order(), comm, 4 << 20);
//   for (micro ...) ex.run(order, [&](NodeId id) { buckets.on_node(ex, id, micro, m); });
//   MF_RETURN_IF_ERROR(buckets.finish(ex));   // waits, binds; ex.run(optimizer_order)
#pragma once

#include <memory>
#include <vector>

#include "meshflow/ir/graph.h"
#include "meshflow/comm/communicator.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {

class GradientBuckets {
 public:
  // comm may be null (one rank). overlap=false launches every all_reduce only
  // after the whole backward (for measuring what overlap buys).
  GradientBuckets(const Graph& g, const std::vector<NodeId>& order,
                  std::shared_ptr<Communicator> comm, int64_t bucket_bytes, bool overlap = true);

  // After node `id` ran during micro-batch `micro` of `m`.
  void on_node(Executor& ex, NodeId id, int micro, int m);
  // Launches what is left, waits for every all_reduce, binds each gradient
  // value to its reduced slot. Returns the first communication error.
  Status finish(Executor& ex);

  double last_wait_seconds() const { return wait_s_; }  // time finish() blocked
  int64_t bytes() const;
  int num_buckets() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Slot {
    ValueId grad;
    int bucket;
    int64_t offset, count;
  };
  struct Bucket {
    std::vector<float> data;
    int total = 0, pending = 0;
    bool launched = false;
    Work work;
  };
  void launch(Bucket& b);

  std::shared_ptr<Communicator> comm_;
  bool overlap_;
  std::vector<Slot> slots_;
  std::vector<std::vector<int>> slots_of_node_;  // node id -> slot indices it finalizes
  std::vector<Bucket> buckets_;
  double wait_s_ = 0;
};

}  // namespace meshflow
