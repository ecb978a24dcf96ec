#include "meshflow/runtime/grad_buckets.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "meshflow/kernels/cpu/parallel.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/parallel/reshard_exec.h"

namespace meshflow {

std::vector<GradientSync> gradient_syncs(const Graph& g) {
  std::vector<std::vector<NodeId>> readers(g.num_values());
  for (NodeId id = 0; id < g.num_nodes(); ++id)
    for (ValueId v : g.node(id).inputs) readers[v].push_back(id);
  std::vector<GradientSync> out;
  for (const auto& [param, grad] : g.grad_of_param) {
    GradientSync s;
    s.grad = grad;
    // Walks the chain; `open` counts the reduce_scatters not yet gathered
    // back, by (mesh axis, dim): the planner may gather them in another
    // order than it scattered them (over dp, then cp; gathered over dp, then
    // cp). The sync is the longest prefix with none open, back at the
    // gradient's shape.
    GradientSync walk = s;
    std::map<std::pair<int, std::vector<int64_t>>, int> open;
    int pending = 0;
    for (ValueId cur = grad; readers[cur].size() == 1;) {
      const NodeId id = readers[cur][0];
      const Node& n = g.node(id);
      if (n.phase != Phase::kOptimizer) break;
      const auto key = std::make_pair(n.attrs.mesh_axis, n.attrs.axes);
      if (n.kind == OpKind::kAllReduce) {
        walk.axes.push_back(n.attrs.mesh_axis);
      } else if (n.kind == OpKind::kReduceScatter) {
        ++open[key], ++pending;
      } else if (n.kind == OpKind::kAllGather && open[key] > 0) {
        walk.axes.push_back(n.attrs.mesh_axis);
        --open[key], --pending;
      } else {
        break;
      }
      walk.reduce.push_back(id);
      cur = n.outputs[0];
      if (pending == 0 && g.shape(cur) == g.shape(grad)) {
        walk.sums.push_back(cur);
        s = walk;
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

GradientBuckets::GradientBuckets(const Graph& g, const std::vector<NodeId>& order,
                                 const std::vector<GradientSync>& syncs, const MeshComms* comms,
                                 int64_t bucket_bytes, bool overlap)
    : overlap_(overlap) {
  std::vector<Communicator*> groups;                // per sync: the group it sums over
  std::map<std::vector<int>, Communicator*> joint;  // axes -> one group over them all
  for (const GradientSync& s : syncs) {
    Communicator* group = nullptr;  // none: accumulated only
    if (!s.axes.empty())
      MF_CHECK(comms != nullptr) << "gradient reductions need the mesh's communicators";
    if (s.axes.size() == 1) {
      group = &comms->axis(s.axes[0]);
    } else if (s.axes.size() > 1) {
      // Over several axes (dp and cp): one all_reduce over all of them, a
      // ring over their product (what the planner prices), started during
      // the backward like the others.
      std::vector<int> axes = s.axes;
      std::sort(axes.begin(), axes.end());
      auto it = joint.find(axes);
      if (it == joint.end()) {
        Result<std::shared_ptr<Communicator>> c = comms->over(axes);
        MF_CHECK(c.is_ok()) << c.status().message();
        joints_.push_back(*c);
        it = joint.emplace(axes, joints_.back().get()).first;
      }
      group = it->second;
    }
    groups.push_back(group);
  }
  build(g, order, syncs, groups, bucket_bytes);
}

GradientBuckets::GradientBuckets(const Graph& g, const std::vector<NodeId>& order,
                                 std::shared_ptr<Communicator> comm, int64_t bucket_bytes,
                                 bool overlap)
    : comm_(std::move(comm)), overlap_(overlap) {
  std::vector<GradientSync> syncs;
  std::vector<Communicator*> groups;
  for (const auto& [param, grad] : g.grad_of_param) {
    GradientSync sync;  // accumulated only: the replica form sums it over `comm`
    sync.grad = grad;
    syncs.push_back(std::move(sync));
    groups.push_back(comm_ && comm_->size() > 1 ? comm_.get() : nullptr);
  }
  build(g, order, syncs, groups, bucket_bytes);
}

// Gradients in the order their producers run; one open bucket per group.
void GradientBuckets::build(const Graph& g, const std::vector<NodeId>& order,
                            const std::vector<GradientSync>& syncs,
                            const std::vector<Communicator*>& groups, int64_t bucket_bytes) {
  std::vector<int> position(g.num_nodes(), -1);
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int>(i);
  std::vector<std::pair<int, size_t>> by_position;
  for (size_t i = 0; i < syncs.size(); ++i)
    by_position.push_back({position[g.value(syncs[i].grad).producer], i});
  std::sort(by_position.begin(), by_position.end());
  slots_of_node_.assign(g.num_nodes(), {});
  replaced_.assign(g.num_nodes(), false);
  const int64_t bucket_elems = std::max<int64_t>(1, bucket_bytes / 4);
  std::map<Communicator*, int> open;  // group -> its filling bucket
  for (const auto& [pos, i] : by_position) {
    const GradientSync& s = syncs[i];
    const int64_t n = g.shape(s.grad).numel();
    auto it = open.find(groups[i]);
    if (it == open.end() ||
        (buckets_[it->second].data.size() > 0 &&
         static_cast<int64_t>(buckets_[it->second].data.size()) + n > bucket_elems)) {
      buckets_.emplace_back();
      buckets_.back().group = groups[i];
      it = open.insert_or_assign(groups[i], static_cast<int>(buckets_.size()) - 1).first;
    }
    Bucket& b = buckets_[it->second];
    Slot slot{s.grad, {}, it->second, static_cast<int64_t>(b.data.size()), n};
    for (NodeId id : s.reduce) replaced_[id] = true;
    slot.reduced = s.sums;
    slots_.push_back(std::move(slot));
    b.data.resize(b.data.size() + n);
    ++b.total;
    slots_of_node_[g.value(s.grad).producer].push_back(static_cast<int>(slots_.size()) - 1);
  }
}

int64_t GradientBuckets::bytes() const {
  int64_t b = 0;
  for (const Bucket& x : buckets_) b += static_cast<int64_t>(x.data.size()) * 4;
  return b;
}

std::vector<NodeId> GradientBuckets::without_replaced(const std::vector<NodeId>& order) const {
  std::vector<NodeId> out;
  for (NodeId id : order)
    if (!replaced_[id]) out.push_back(id);
  return out;
}

void GradientBuckets::launch(Bucket& b) {
  b.launched = true;
  if (b.group)
    b.work = b.group->all_reduce_async(b.data.data(), static_cast<int64_t>(b.data.size()),
                                       ReduceOp::kSum);
}

void GradientBuckets::on_node(Executor& ex, NodeId id, int micro, int m) {
  if (slots_of_node_[id].empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
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
      // (on the rank's threads: a pass over memory a micro-batch, priced as
      // CostConstants::grads_accumulated_in_buckets)
      cpu::parallel_for(s.count, 1, [dst, src](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) dst[i] += src[i];
      });
    }
    if (micro == m - 1 && --b.pending == 0 && overlap_) launch(b);
  }
  accumulate_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
  for (const Slot& s : slots_) {
    float* at = buckets_[s.bucket].data.data() + s.offset;
    ex.bind(s.grad, at);
    for (ValueId v : s.reduced) ex.bind(v, at);
  }
  return first;
}

}  // namespace meshflow
