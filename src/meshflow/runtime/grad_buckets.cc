#include "meshflow/runtime/grad_buckets.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace meshflow {

GradientBuckets::GradientBuckets(const Graph& g, const std::vector<NodeId>& order,
                                 std::shared_ptr<Communicator> comm, int64_t bucket_bytes,
                                 bool overlap)
    : comm_(std::move(comm)), overlap_(overlap) {
  // Gradients in the order their producers run.
  std::vector<int> position(g.num_nodes(), -1);
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int>(i);
  std::vector<std::pair<int, ValueId>> grads;
  for (const auto& [param, grad] : g.grad_of_param)
    grads.push_back({position[g.value(grad).producer], grad});
  std::sort(grads.begin(), grads.end());
  slots_of_node_.assign(g.num_nodes(), {});
  const int64_t bucket_elems = std::max<int64_t>(1, bucket_bytes / 4);
  for (const auto& [pos, grad] : grads) {
    const int64_t n = g.shape(grad).numel();
    if (buckets_.empty() || (buckets_.back().data.size() > 0 &&
                             static_cast<int64_t>(buckets_.back().data.size()) + n > bucket_elems))
      buckets_.emplace_back();
    Bucket& b = buckets_.back();
    slots_.push_back(
        {grad, static_cast<int>(buckets_.size()) - 1, static_cast<int64_t>(b.data.size()), n});
    b.data.resize(b.data.size() + n);
    ++b.total;
    slots_of_node_[g.value(grad).producer].push_back(static_cast<int>(slots_.size()) - 1);
  }
}

int64_t GradientBuckets::bytes() const {
  int64_t b = 0;
  for (const Bucket& x : buckets_) b += static_cast<int64_t>(x.data.size()) * 4;
  return b;
}

void GradientBuckets::launch(Bucket& b) {
  b.launched = true;
  if (comm_ && comm_->size() > 1)
    b.work =
        comm_->all_reduce_async(b.data.data(), static_cast<int64_t>(b.data.size()), ReduceOp::kSum);
}

void GradientBuckets::on_node(Executor& ex, NodeId id, int micro, int m) {
  for (int si : slots_of_node_[id]) {
    const Slot& s = slots_[si];
    Bucket& b = buckets_[s.bucket];
    const float* src = ex.data_f(s.grad);
    float* dst = b.data.data() + s.offset;
    if (micro == 0) {
      std::memcpy(dst, src, s.count * sizeof(float));
      b.pending = b.total;
      b.launched = false;
    } else {
      for (int64_t i = 0; i < s.count; ++i) dst[i] += src[i];
    }
    if (micro == m - 1 && --b.pending == 0 && overlap_) launch(b);
  }
}

Status GradientBuckets::finish(Executor& ex) {
  for (Bucket& b : buckets_)
    if (!b.launched) launch(b);
  auto t0 = std::chrono::steady_clock::now();
  Status first;
  for (Bucket& b : buckets_) {
    Status s = b.work.wait();
    b.work = Work();
    if (first.is_ok() && !s.is_ok()) first = s;
  }
  wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const Slot& s : slots_) ex.bind(s.grad, buckets_[s.bucket].data.data() + s.offset);
  return first;
}

}  // namespace meshflow
