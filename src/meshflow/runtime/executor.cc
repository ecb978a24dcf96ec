#include "meshflow/runtime/executor.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "meshflow/core/random.h"
#include "meshflow/kernels/kernel.h"
#include "meshflow/ops/op_def.h"

namespace meshflow {

// The global linear index of each local element of a block [off, off+local)
// of a tensor with dims `global`, row by row (last dim contiguous).
template <typename F>
void for_each_global_index(const Shape& local, const std::vector<int64_t>& global,
                           const std::vector<int64_t>& off, F&& f) {
  const int r = local.rank();
  if (r == 0) {
    f(0, 0);
    return;
  }
  std::vector<int64_t> stride(r, 1);
  for (int d = r - 2; d >= 0; --d) stride[d] = stride[d + 1] * global[d + 1];
  const int64_t row = local.size(r - 1), rows = local.numel() / std::max<int64_t>(row, 1);
  std::vector<int64_t> idx(r, 0);
  for (int64_t i = 0; i < rows; ++i) {
    int64_t base = off[r - 1];
    for (int d = 0; d < r - 1; ++d) base += (idx[d] + off[d]) * stride[d];
    for (int64_t k = 0; k < row; ++k) f(i * row + k, base + k);
    for (int d = r - 2; d >= 0; --d) {  // next row
      if (++idx[d] < local.size(d)) break;
      idx[d] = 0;
    }
  }
}

void initialize(Tensor& t, const Init& init, const std::string& name, uint64_t seed,
                const std::vector<int64_t>& global_dims,
                const std::vector<int64_t>& global_offset) {
  float* p = t.data<float>();
  const int64_t n = t.numel();
  const uint64_t s = stream_seed(name, seed);
  if (!global_dims.empty() &&
      (init.kind == Init::Kind::kNormal || init.kind == Init::Kind::kUniform)) {
    // A shard: each element draws the number of its global index, so the
    // weights equal the single-device ones whatever the layout.
    MF_CHECK_EQ(static_cast<int>(global_dims.size()), t.shape().rank()) << name;
    const bool normal = init.kind == Init::Kind::kNormal;
    for_each_global_index(t.shape(), global_dims, global_offset, [&](int64_t i, int64_t gi) {
      p[i] = normal ? init.scale * normal01(s, gi) : init.scale * (2.f * uniform01(s, gi) - 1.f);
    });
    return;
  }
  switch (init.kind) {
    case Init::Kind::kZeros:
      std::memset(p, 0, t.nbytes());
      break;
    case Init::Kind::kOnes:
      for (int64_t i = 0; i < n; ++i) p[i] = 1.f;
      break;
    case Init::Kind::kNormal:
      for (int64_t i = 0; i < n; ++i) p[i] = init.scale * normal01(s, i);
      break;
    case Init::Kind::kUniform:
      for (int64_t i = 0; i < n; ++i) p[i] = init.scale * (2.f * uniform01(s, i) - 1.f);
      break;
  }
}

Status Executor::check_fits_in_memory(const Graph& g, const OffloadOptions& offload) {
  const double machine =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  double persistent = 0, largest = 0;
  std::vector<std::pair<double, ValueId>> sizes;
  for (ValueId v = 0; v < g.num_values(); ++v) {
    const Shape& s = g.shape(v);
    double n = 4;  // bytes, computed in double: products of large dims overflow int64
    for (int d = 0; d < s.rank(); ++d) n *= static_cast<double>(s.size(d));
    sizes.emplace_back(n, v);
    largest = std::max(largest, n);
    const OpKind k = g.producer(v).kind;
    if ((k == OpKind::kParameter || k == OpKind::kState || k == OpKind::kInput) &&
        !offload.offloads(g, v))
      persistent += n;
  }
  if (persistent <= machine && largest <= machine) return Status::ok();
  std::sort(sizes.rbegin(), sizes.rend());
  auto gib = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g GiB", b / (1024.0 * 1024 * 1024));
    return std::string(buf);
  };
  std::string top;
  for (size_t i = 0; i < std::min<size_t>(3, sizes.size()); ++i)
    top += (i ? ", " : "") + ("'" + g.value(sizes[i].second).name + "' " +
                              g.shape(sizes[i].second).to_string() + " " + gib(sizes[i].first));
  return Status::invalid("the model does not fit in this machine's " + gib(machine) +
                         " of memory: parameters, optimizer state and inputs need " +
                         gib(persistent) + ", the largest tensors are " + top +
                         "; use smaller model sizes, a shorter train.seq_len or a smaller "
                         "batch, or split the model over more ranks (parallel.zero, tp)");
}

Executor::Executor(const Graph& g, ExecutorOptions options) : g_(g) {
  const int nv = g.num_values();
  persistent_.resize(nv);
  seconds_by_kind_.assign(kNumOpKinds, 0.0);
  override_.assign(nv, nullptr);
  std::vector<char> is_persistent(nv, 0), keep(nv, 0), elsewhere(g.num_nodes(), 0);
  for (NodeId id : options.run_elsewhere) {
    elsewhere[id] = 1;
    for (ValueId v : g.node(id).outputs) is_persistent[v] = 1;  // bound, not in the arena
  }
  // Offloaded values: page-aligned ranges of one file, zero-filled by it.
  std::vector<OffloadStreamer::Range> ranges;
  if (options.offload.active()) {
    ranges.resize(static_cast<size_t>(nv));
    int64_t at = 0;
    const int64_t page = sysconf(_SC_PAGE_SIZE);
    for (ValueId v = 0; v < nv; ++v) {
      if (!options.offload.offloads(g, v)) continue;
      const int64_t bytes = g.shape(v).numel() * static_cast<int64_t>(dtype_size(g.value(v).dtype));
      ranges[v] = {at, bytes};
      at += (bytes + page - 1) / page * page;
    }
    offload_file_ = value_or_throw(OffloadFile::create(options.offload.dir, at));
    stats_.offloaded = at;
  }
  // Storage of source v: its range of the offload file, or its own buffer.
  auto storage_for = [&](ValueId v) {
    if (ranges.empty() || ranges[v].offset < 0) return Tensor(g.shape(v), g.value(v).dtype);
    return Tensor::external(
        g.shape(v), g.value(v).dtype,
        std::shared_ptr<void>(offload_file_->at(ranges[v].offset), [](void*) {}));
  };
  for (const Node& n : g.nodes()) {
    if (elsewhere[&n - g.nodes().data()]) continue;
    switch (n.kind) {
      case OpKind::kParameter: {
        ValueId v = n.outputs[0];
        persistent_[v] = storage_for(v);
        initialize(persistent_[v], n.attrs.init, g.value(v).name, options.seed, n.attrs.global_dims,
                   n.attrs.global_offset);
        if (ranges.empty() || ranges[v].offset < 0) stats_.params += persistent_[v].nbytes();
        is_persistent[v] = 1;
        break;
      }
      case OpKind::kState:
      case OpKind::kInput: {
        ValueId v = n.outputs[0];
        persistent_[v] = storage_for(v);
        if (n.kind == OpKind::kState && n.attrs.init.kind != Init::Kind::kZeros)
          initialize(persistent_[v], n.attrs.init, g.value(v).name, options.seed,
                     n.attrs.global_dims, n.attrs.global_offset);
        if (ranges.empty() || ranges[v].offset < 0)
          (n.kind == OpKind::kState ? stats_.optimizer : stats_.inputs) += persistent_[v].nbytes();
        is_persistent[v] = 1;
        break;
      }
      default:
        break;
    }
    if (n.kind == OpKind::kParameter || n.kind == OpKind::kInput || n.kind == OpKind::kState)
      continue;
    (n.phase == Phase::kOptimizer ? opt_ : fwd_bwd_).push_back(&n - g.nodes().data());
  }
  // The offloaded values are initialized: out to the file before the arena
  // is touched, so they never add to the peak.
  if (offload_file_) {
    streamer_ = std::make_unique<OffloadStreamer>(offload_file_.get(), std::move(ranges),
                                                  options.offload.lookahead);
    streamer_->release_all();
  }
  // fwd_bwd_ holds forward, backward and metric nodes in graph order; split out
  // metrics (eval only) and build the eval order (forward + metric).
  std::vector<NodeId> fb;
  for (NodeId id : fwd_bwd_) {
    Phase p = g.node(id).phase;
    if (p != Phase::kMetric) fb.push_back(id);
    // Evaluation updates no state (batch norm's running statistics).
    const bool updates = op_def(g.node(id).kind).mutates != 0;
    if ((p == Phase::kForward && !updates) || p == Phase::kMetric) eval_.push_back(id);
  }
  fwd_bwd_ = std::move(fb);

  if (g.loss != kNoValue) keep[g.loss] = 1;
  for (auto& [name, v] : g.outputs) keep[v] = 1;
  for (auto& [p, grad] : g.grad_of_param) keep[grad] = is_persistent[grad] ? 0 : 1;
  for (ValueId v : options.fetch) keep[v] = 1;
  // One plan over everything: forward, backward, optimizer, metrics in graph
  // order. Every sub-order is a subsequence of it, so the plan is valid for each.
  std::vector<NodeId> all;
  for (NodeId id = 0; id < g.num_nodes(); ++id)
    if (!elsewhere[id]) all.push_back(id);
  plan_ = plan_memory(g, all, is_persistent, keep);
  arena_ = aligned_buffer(static_cast<size_t>(plan_.arena_bytes));
  stats_.arena = plan_.arena_bytes;
}

Executor::~Executor() = default;

std::vector<NodeId> Executor::training_order() const {
  std::vector<NodeId> o = fwd_bwd_;
  o.insert(o.end(), opt_.begin(), opt_.end());
  return o;
}

void* Executor::data(ValueId v) {
  if (override_[v]) return override_[v];
  if (persistent_[v].defined()) return persistent_[v].raw();
  MF_CHECK_GE(plan_.offset[v], 0) << "value '" << g_.value(v).name << "' has no storage";
  return static_cast<char*>(arena_.get()) + plan_.offset[v];
}

Tensor& Executor::storage(ValueId v) {
  MF_CHECK(persistent_[v].defined()) << "value '" << g_.value(v).name << "' is not persistent";
  return persistent_[v];
}

void Executor::unbind_all() {
  std::fill(override_.begin(), override_.end(), nullptr);
}

void Executor::run(const std::vector<NodeId>& nodes,
                   const std::function<void(NodeId)>& after_node) {
  if (streamer_) streamer_->begin_run(g_, nodes);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const NodeId id = nodes[i];
    const Node& n = g_.node(id);
    if (streamer_) streamer_->before(i);
    KernelCall call{g_, n, {}, {}, comms_};
    call.in.reserve(n.inputs.size());
    call.out.reserve(n.outputs.size());
    for (ValueId v : n.inputs) call.in.push_back(data(v));
    for (ValueId v : n.outputs) call.out.push_back(data(v));
    if (!profiling_) {
      cpu_kernel(n.kind)(call);
    } else {
      auto t0 = std::chrono::steady_clock::now();
      cpu_kernel(n.kind)(call);
      seconds_by_kind_[static_cast<int>(n.kind)] +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (streamer_) streamer_->after(i);
    if (after_node) after_node(id);
  }
  if (streamer_) streamer_->end_run();
}

std::string Executor::profile_report() const {
  std::vector<std::pair<double, int>> rows;
  double total = 0;
  for (int k = 0; k < kNumOpKinds; ++k)
    if (seconds_by_kind_[k] > 0) {
      rows.push_back({seconds_by_kind_[k], k});
      total += seconds_by_kind_[k];
    }
  std::sort(rows.rbegin(), rows.rend());
  std::string out;
  char line[128];
  for (auto& [s, k] : rows) {
    std::snprintf(line, sizeof line, "  %-20s %9.3f s  %5.1f%%\n",
                  std::string(op_name(static_cast<OpKind>(k))).c_str(), s, 100 * s / total);
    out += line;
  }
  return out;
}

Status Executor::feed(const std::string& name, const Tensor& t) {
  ValueId v = g_.find(name);
  if (v == kNoValue || g_.producer(v).kind != OpKind::kInput)
    return Status::not_found("graph has no input named '" + name + "'");
  Tensor& dst = persistent_[v];
  if (!dst.shape().same_sizes(t.shape()) || dst.dtype() != t.dtype())
    return Status::invalid("input '" + name + "' expects " + std::string(dtype_name(dst.dtype())) +
                           dst.shape().to_string() + ", got " + std::string(dtype_name(t.dtype())) +
                           t.shape().to_string());
  dst.copy_from(t.raw());
  return Status::ok();
}

Status Executor::feed_data(const std::string& name, const void* src, size_t bytes) {
  ValueId v = g_.find(name);
  if (v == kNoValue || g_.producer(v).kind != OpKind::kInput)
    return Status::not_found("graph has no input named '" + name + "'");
  Tensor& dst = persistent_[v];
  if (dst.nbytes() != bytes)
    return Status::invalid("input '" + name + "' expects " + std::to_string(dst.nbytes()) +
                           " bytes, got " + std::to_string(bytes));
  dst.copy_from(src);
  return Status::ok();
}

void Executor::feed_scalar(const std::string& name, float v) {
  ValueId id = g_.find(name);
  if (id != kNoValue) *persistent_[id].data<float>() = v;
}

void Executor::feed_scalar_i32(const std::string& name, int32_t v) {
  ValueId id = g_.find(name);
  if (id != kNoValue) *persistent_[id].data<int32_t>() = v;
}

}  // namespace meshflow
