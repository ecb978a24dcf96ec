#include "meshflow/plan/cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <vector>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/autodiff/recompute.h"
#include "meshflow/core/check.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/parallel/strategy_search.h"
#include "meshflow/pipeline/stage_graph.h"
#include "meshflow/runtime/grad_buckets.h"
#include "meshflow/runtime/run_config.h"

namespace meshflow::plan {

namespace {

std::string str(int64_t x) {
  return std::to_string(x);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A node the recompute pass cloned into the backward, or a collective the
// partitioner inserted for one.
bool is_recompute(const Graph& g, const Node& n) {
  if (ends_with(n.name, "@recompute")) return true;
  if (!is_collective(n.kind) || n.inputs.empty()) return false;
  const NodeId p = g.value(n.inputs[0]).producer;
  return p >= 0 && ends_with(g.node(p).name, "@recompute");
}

// Backward nodes off the input-gradient chain: the W of zero-bubble
// schedules. The chain (B) is every backward node the embedding's gradient
// depends on, i.e. what carries the gradient from the loss down to the model's
// input; the rest only produces weight gradients.
std::vector<bool> weight_grad_nodes(const Graph& g) {
  std::vector<bool> on_chain(g.num_nodes(), false);
  std::vector<NodeId> stack;
  for (NodeId i = 0; i < g.num_nodes(); ++i)
    if (g.node(i).kind == OpKind::kEmbeddingGrad) stack.push_back(i);
  while (!stack.empty()) {
    const NodeId i = stack.back();
    stack.pop_back();
    if (on_chain[i] || g.node(i).phase != Phase::kBackward) continue;
    on_chain[i] = true;
    for (ValueId v : g.node(i).inputs) stack.push_back(g.value(v).producer);
  }
  std::vector<bool> w(g.num_nodes(), false);
  for (NodeId i = 0; i < g.num_nodes(); ++i)
    w[i] = g.node(i).phase == Phase::kBackward && !on_chain[i];
  return w;
}

// The block a node's work belongs to: its own layer; for a collective the
// partitioner inserted, the layer of the value it moves (it is emitted in its
// consumer's layer, so the embedding's all_reduce would count in block 0).
std::vector<int> priced_layers(const Graph& g) {
  std::vector<int> layer(g.num_nodes(), -1);
  for (NodeId i = 0; i < g.num_nodes(); ++i) {
    const Node& n = g.node(i);
    layer[i] = n.layer;
    if (is_collective(n.kind) && !n.inputs.empty()) {
      const NodeId p = g.value(n.inputs[0]).producer;
      layer[i] = p >= 0 && !is_source(g.node(p).kind) ? layer[p] : -1;
    }
  }
  return layer;
}

// Nodes outside the blocks on the embedding's side: forward nodes the first
// block reads from, backward nodes fed by a block's backward (the embedding
// gradient) and parameters the embedding-side forward reads. The rest of the
// nodes outside blocks (final norm, head, loss) are the head's; without
// blocks, everything is.
std::vector<bool> before_blocks(const Graph& g, const std::vector<int>& layer) {
  std::vector<bool> before(g.num_nodes(), false);
  std::vector<NodeId> stack;
  auto push_producers = [&](NodeId i) {
    for (ValueId v : g.node(i).inputs) stack.push_back(g.value(v).producer);
  };
  for (NodeId i = 0; i < g.num_nodes(); ++i)
    if (layer[i] == 0 && g.node(i).phase == Phase::kForward) push_producers(i);
  while (!stack.empty()) {
    const NodeId i = stack.back();
    stack.pop_back();
    if (i < 0 || before[i] || layer[i] >= 0) continue;
    const Phase ph = g.node(i).phase;
    if (ph != Phase::kForward && !is_source(g.node(i).kind)) continue;
    before[i] = true;
    push_producers(i);
  }
  std::vector<bool> fed(g.num_nodes(), false);  // reads a block's backward output
  for (NodeId i = 0; i < g.num_nodes(); ++i) {
    const Node& n = g.node(i);
    if (n.phase != Phase::kBackward) continue;
    for (ValueId v : n.inputs) {
      const NodeId p = g.value(v).producer;
      if (p >= 0 && g.node(p).phase == Phase::kBackward && (layer[p] >= 0 || fed[p])) fed[i] = true;
    }
    if (fed[i] && layer[i] < 0) before[i] = true;
  }
  return before;
}

}  // namespace

Result<LocalProgram> CostModel::rank_program(const RankShape& s) const {
  // The partitioner's strategy, per (degrees, recompute, blocks), and per
  // micro-batch with exact strategies (set_exact_strategies).
  const auto key =
      std::make_tuple(s.tp, s.cp, s.sp,
                      int(s.recompute) + (s.optimizer ? 8 : 0) + (s.pipeline ? 16 : 0) +
                          (s.ring ? 32 : 0) + 64 * s.zero,
                      s.blocks, s.ops.get(), s.zero > 0 || s.with_dp ? s.dp : 1, s.recompute_blocks,
                      exact_strategies_ ? s.micro_batch : int64_t{0});
  std::shared_ptr<const Annotation> strategy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = strategy_cache_.find(key); it != strategy_cache_.end()) strategy = it->second;
  }
  const bool had = strategy != nullptr;
  Result<LocalProgram> lp = build_rank_program(job_.model, s, cluster_, dtype_size(dtype_),
                                               &strategy, reshard_plans_.get());
  if (!had && strategy) {
    std::lock_guard<std::mutex> lock(mu_);
    strategy_cache_.emplace(key, strategy);
  }
  return lp;
}

std::unique_ptr<CostModel> CostModel::exact_model() const {
  auto m = std::make_unique<CostModel>(job_, cluster_, k_);
  m->fixed_ops_ = fixed_ops_;
  m->op_deadline_ = op_deadline_;
  m->exact_strategies_ = true;
  m->reshard_plans_ = reshard_plans_;  // the same cluster's links
  std::lock_guard<std::mutex> lock(mu_);
  m->op_search_cache_ = op_search_cache_;
  return m;
}

double CostModel::compute_time_s(double flops, double shape_factor) const {
  return cluster_.matmul_time_s(flops, dtype_) / (k_.matmul_efficiency_scale * shape_factor);
}

double CostModel::update_bytes_per_param(bool mixed) const {
  return (mixed ? k_.adam_bytes_per_param_mixed : k_.adam_bytes_per_param_f32) -
         8.0 * double(2 - job_.optimizer_states);
}

double CostModel::optimizer_state_bytes_per_param(bool mixed) const {
  return (mixed ? 4.0 : 0.0) + 4.0 * double(job_.optimizer_states);
}

double roofline_time_s(const Cluster& c, const CostConstants& k, DType dtype, double flops,
                       double bytes) {
  return std::max(c.matmul_time_s(flops, dtype) / k.matmul_efficiency_scale,
                  c.memory_time_s(bytes));
}

double CostModel::roofline_time_s(double flops, double bytes) const {
  return plan::roofline_time_s(cluster_, k_, dtype_, flops, bytes);
}

CostModel::CostModel(TrainingJob job, Cluster cluster, CostConstants constants)
    : job_(std::move(job)), cluster_(std::move(cluster)), k_(constants) {
  dtype_ = cluster_.device.peak_flops.bf16 > 0 ? DType::BF16 : DType::F32;
  if (!is_language_model(job_.model)) {
    // One example is one "token"; the memory of a model without blocks is its
    // program's static arena (no Korthikanti formula for it).
    job_.seq = 1;
    k_.memory_model = MemoryModel::kStaticArena;
  } else {
    Result<TransformerDims> d = transformer_dims(job_.model);
    if (!d.is_ok()) {
      status_ = d.status();
      return;
    }
    dims_ = *d;
  }
  pipeline_layers_ = dims_.layers;
  if (const auto* r = std::get_if<ResNetConfig>(&job_.model)) {
    pipeline_layers_ = 0;
    for (int64_t depth : r->depths) pipeline_layers_ += depth;
  }
  if (Status big = check_priceable_size(dims_, job_.seq);
      is_language_model(job_.model) && !big.is_ok()) {
    status_ = big;
    return;
  }
  const ModelSummary sum = summarize(job_.model, job_.seq);
  num_parameters_ = sum.parameters;
  forward_flops_per_token_ = sum.forward_flops_per_token;
  if (has_blocks() && (job_.seq < 1 || job_.seq > dims_.max_seq))
    status_ = Status::invalid("seq=" + str(job_.seq) + " must be in [1, " + str(dims_.max_seq) +
                              "] (the model's maximum positions)");
  else if (job_.global_batch < 1)
    status_ = Status::invalid("global batch must be >= 1, got " + str(job_.global_batch));
  else if (job_.fp8 && !is_language_model(job_.model))
    status_ = Status::invalid(
        "FP8 training prices the transformer blocks' linear layers in FP8; this model has no "
        "transformer blocks (plan it without FP8)");
  else if (job_.fp8 && cluster_.device.peak_flops.fp8 <= 0)
    status_ = Status::invalid(
        "FP8 training needs the device's FP8 tensor-core rate, device.peak_flops.fp8 in the "
        "cluster file ('" +
        cluster_.device.name + "' gives none; Hopper and later GPUs have one)");
}

int64_t CostModel::num_parameters() const {
  return num_parameters_;
}

double CostModel::model_flops_per_token() const {
  return 3 * forward_flops_per_token_;
}

double CostModel::collective_time_on(OpKind kind, int64_t group, double buffer_bytes,
                                     const std::string& axis, const Plan& p, double* bytes) const {
  const Collective c = collective_of(kind);
  *bytes = collective_bytes_per_rank(c, group, buffer_bytes);
  return collective_time_s(c, group, buffer_bytes, collective_link(kind, group, axis, p));
}

Link CostModel::collective_link(OpKind kind, int64_t group, const std::string& axis,
                                const Plan& p) const {
  const int64_t stride = axis_stride(p, axis);
  return is_ring_collective(collective_of(kind)) ? ring_link(group, stride)
                                                 : cluster_.link_for_axis(group, stride);
}

Link CostModel::ring_link(int64_t size, int64_t stride) const {
  // (Inside a node the rings cross its islands on each member's own path,
  // whichever the stack: NCCL's rings inside a node.)
  const bool in_node = (size - 1) * stride + 1 <= cluster_.fabric_devices();
  return k_.striped_rings || in_node ? cluster_.ring_link_for_axis(size, stride)
                                     : cluster_.link_for_axis(size, stride);
}

double CostModel::collective_node_time_s(const Graph& g, const Mesh& mesh, const Node& n,
                                         const Plan& p, double* bytes, std::string* axis) const {
  // The full buffer: the gathered output of an all_gather, else the input.
  const int64_t elems = g.shape(n.kind == OpKind::kAllGather ? n.outputs[0] : n.inputs[0]).numel();
  // f32 values move in the compute dtype (what a mixed-precision run sends).
  const DType dt = g.value(n.inputs[0]).dtype;
  *axis = mesh.axis_name(n.attrs.mesh_axis);
  // A block's tp all_gathers in FP8 where the stack casts before them
  // (CostConstants::fp8_tp_all_gather).
  const bool fp8 = job_.fp8_tensorwise() && k_.fp8_tp_all_gather && n.kind == OpKind::kAllGather &&
                   n.layer >= 0 && *axis == "tp";
  const double buffer =
      double(elems) * (fp8 ? 1.0 : double(dtype_size(dt == DType::F32 ? dtype_ : dt)));
  return collective_time_on(n.kind, n.attrs.group_size, buffer, *axis, p, bytes);
}

Result<LayerCost> CostModel::layer_cost(int64_t tp, int64_t cp, int64_t micro_batch, bool sp,
                                        bool ops, bool ring) const {
  MF_RETURN_IF_ERROR(status_);
  const auto key = std::make_tuple(tp, cp, micro_batch, int(sp) + (ops ? 2 : 0) + (ring ? 4 : 0));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return *it->second;
  }
  Result<LayerCost> r = price_program(tp, cp, micro_batch, sp, ops, ring);
  auto shared = std::make_shared<const Result<LayerCost>>(r);
  std::lock_guard<std::mutex> lock(mu_);
  cache_.emplace(key, shared);
  return r;
}

namespace {

// What one rank program costs, summed by kind of work (seconds, bytes sent,
// parameter counts). A block's cost is the second block's nodes of the
// two-block program, the collectives at its edge counted where the
// partitioner emits them: in their consumer's layer (price_program).
enum Slot {
  kFwd,
  kBwd,
  kWgrad,  // compute: forward, B, W
  kTpFwd,
  kTpBwd,
  kCpFwd,
  kCpBwd,  // collectives (seconds)
  kTpFwdBytes,
  kTpBwdBytes,
  kCpFwdBytes,
  kCpBwdBytes,
  kOptComm,
  kOptCommBytes,   // optimizer phase, once per step
  kOptBucketedTp,  // buffer bytes of the gradient all_reduces over tp run in buckets
  kOptCpParams,    // gradient elements all_reduced over cp (Partial there)
  kGradChains,     // gradients reduced through all_reduce chains (grad_buckets.h)
  kAttention,      // the attention op's forward
  kFwdMatMul,      // the matmuls' forward
  kRecompute,      // recompute clones and their collectives
  kRecomputeTp,    // of those, the collectives over tp
  kRecomputeCp,    // and over cp
  kParams,
  kParamTensors,
  kNodes,
  kLaunches,  // kernels launched per micro-batch: compute nodes and collectives
  kCollectives,
  kInputBytes,  // fed data of one micro-batch
  kSlots
};

}  // namespace

// The slots' sums (declared in the header for CostModel::price_nodes).
struct NodeTotals : std::array<double, kSlots> {};

namespace {

using Totals = NodeTotals;

// A forward or backward collective's seconds and bytes, on cp or (any other axis) tp.
int comm_seconds_slot(const std::string& axis, bool fwd) {
  return axis == "cp" ? (fwd ? kCpFwd : kCpBwd) : (fwd ? kTpFwd : kTpBwd);
}

void add_comm(Totals& t, const std::string& axis, bool fwd, double seconds, double bytes) {
  t[kCollectives] += 1;
  const bool cp = axis == "cp";
  t[comm_seconds_slot(axis, fwd)] += seconds;
  t[cp ? (fwd ? kCpFwdBytes : kCpBwdBytes) : (fwd ? kTpFwdBytes : kTpBwdBytes)] += bytes;
}

Totals minus(const Totals& a, const Totals& b) {
  Totals d{};
  for (int i = 0; i < kSlots; ++i) d[i] = a[i] - b[i];
  return d;
}

// The LayerCost fields read from the priced totals: of one block (`block`),
// the embedding side (`embed`), the head, and a one-block program (`one`).
// The optimizer and recompute fields are filled by price_program.
LayerCost layer_cost_of(const Totals& one, const Totals& block, const Totals& embed,
                        const Totals& head) {
  LayerCost lc;
  lc.forward_s = block[kFwd], lc.backward_s = block[kBwd], lc.weight_grad_s = block[kWgrad];
  lc.tp_fwd_s = block[kTpFwd], lc.tp_bwd_s = block[kTpBwd];
  lc.cp_fwd_s = block[kCpFwd], lc.cp_bwd_s = block[kCpBwd];
  lc.tp_fwd_bytes = block[kTpFwdBytes], lc.tp_bwd_bytes = block[kTpBwdBytes];
  lc.cp_fwd_bytes = block[kCpFwdBytes], lc.cp_bwd_bytes = block[kCpBwdBytes];
  lc.attention_core_s = block[kAttention];
  lc.forward_matmul_s = block[kFwdMatMul];
  auto comm = [](const Totals& t, bool fwd) {
    return fwd ? t[kTpFwd] + t[kCpFwd] : t[kTpBwd] + t[kCpBwd];
  };
  lc.embed_fwd_s = embed[kFwd] + comm(embed, true);
  lc.embed_bwd_s = embed[kBwd] + embed[kWgrad] + comm(embed, false);
  lc.head_fwd_s = head[kFwd] + comm(head, true);
  lc.head_bwd_s = head[kBwd] + comm(head, false);
  lc.head_wgrad_s = head[kWgrad];
  lc.embed_comm_s = comm(embed, true) + comm(embed, false);
  lc.head_comm_s = comm(head, true) + comm(head, false);
  lc.embed_cp_comm_s = embed[kCpFwd] + embed[kCpBwd];
  lc.head_cp_comm_s = head[kCpFwd] + head[kCpBwd];
  lc.embed_comm_bytes = embed[kTpFwdBytes] + embed[kTpBwdBytes];
  lc.head_comm_bytes = head[kTpFwdBytes] + head[kTpBwdBytes];
  lc.outside_cp_bytes =
      embed[kCpFwdBytes] + embed[kCpBwdBytes] + head[kCpFwdBytes] + head[kCpBwdBytes];
  auto count = [](double x) { return static_cast<int64_t>(std::llround(x)); };
  lc.layer_params = count(block[kParams]),
  lc.layer_param_tensors = int(count(block[kParamTensors]));
  lc.embed_params = count(embed[kParams]),
  lc.embed_param_tensors = int(count(embed[kParamTensors]));
  lc.head_params = count(head[kParams]), lc.head_param_tensors = int(count(head[kParamTensors]));
  lc.nodes = int(count(one[kNodes]));
  lc.block_launches = int(count(block[kLaunches]));
  lc.input_bytes = one[kInputBytes];
  lc.collectives = int(count(one[kCollectives]));
  return lc;
}

}  // namespace

void CostModel::price_nodes(const Graph& g, const Mesh& mesh, const Plan& p,
                            const std::vector<bool>& wgrad, const std::vector<uint8_t>& part,
                            NodeTotals* parts) const {
  std::vector<bool> bucketed(g.num_nodes(), false);  // run by the runtime's GradientBuckets
  if (k_.bucketed_grad_all_reduce)
    for (const GradientSync& s : gradient_syncs(g))
      for (NodeId id : s.reduce) bucketed[id] = true;
  for (NodeId i = 0; i < g.num_nodes(); ++i) {
    const Node& n = g.node(i);
    Totals& t = parts[part.empty() ? 0 : part[i]];
    if (n.kind == OpKind::kParameter) {
      t[kParams] += double(g.shape(n.outputs[0]).numel());
      t[kParamTensors] += 1;
      continue;
    }
    if (n.kind == OpKind::kInput) {  // fed data (scalars like lr are not)
      const Value& v = g.value(n.outputs[0]);
      if (v.shape.rank() > 0) t[kInputBytes] += double(v.shape.numel() * dtype_size(v.dtype));
      continue;
    }
    if (is_source(n.kind) || n.kind == OpKind::kShardSlice || n.phase == Phase::kMetric) continue;
    const bool fwd = n.phase == Phase::kForward;
    double time = 0;
    std::string comm_axis;  // a collective's
    if (is_collective(n.kind)) {
      double bytes = 0;
      std::string& axis = comm_axis;
      time = collective_node_time_s(g, mesh, n, p, &bytes, &axis);
      if (n.phase == Phase::kOptimizer) {
        t[kCollectives] += 1;
        // Over tp only: the gradients' reduction over the dp * cp replicas
        // is priced with the schedule (bucketed, overlapped), not twice;
        // so are the tp ones the runtime puts in its buckets.
        if (axis == "cp" && n.kind == OpKind::kAllReduce)
          t[kOptCpParams] += double(g.shape(n.inputs[0]).numel());
        if (bucketed[i]) t[kGradChains] += 1;
        if (axis == "tp" && bucketed[i]) {
          // The buffer a bucketed chain reduces (a reduce_scatter's gather
          // back moves no more of it).
          if (n.kind != OpKind::kAllGather)
            t[kOptBucketedTp] += double(g.shape(n.inputs[0]).numel() * dtype_size(dtype_));
        } else if (axis == "tp")
          t[kOptComm] += time, t[kOptCommBytes] += bytes;
        continue;
      }
      add_comm(t, axis, fwd, time, bytes);
    } else {
      if (n.phase == Phase::kOptimizer) continue;  // priced as memory-bound work
      time = node_time_s(g, n);
      t[kNodes] += 1;
      t[fwd ? kFwd : wgrad[i] ? kWgrad : kBwd] += time;
      if (n.kind == OpKind::kAttention) t[kAttention] += time;
      if (fwd && n.kind == OpKind::kMatMul) t[kFwdMatMul] += time;
      // The collectives its kernel runs inside itself (the vocab-parallel
      // cross-entropy's f32 all_reduces, ring attention's shifts; ops/op_def.h).
      // Those in flight while it computes cost only what its compute does not
      // hide: max(0, their time - the node's), as if the steps were even (the
      // ring's zigzag order makes them so).
      double hidden = 0, hide_under = time;
      std::string hidden_axis;
      Link hidden_link;
      for (const InnerCollective& ic : inner_collectives(g, n)) {
        double bytes = 0;
        const std::string& axis = mesh.axis_name(ic.mesh_axis);
        const double ct = collective_time_on(ic.kind, mesh.size(ic.mesh_axis),
                                             double(ic.elements) * 4.0, axis, p, &bytes);
        if (ic.overlapped) {
          hidden += ct, hidden_axis = axis;
          hidden_link = collective_link(ic.kind, mesh.size(ic.mesh_axis), axis, p);
          add_comm(t, axis, fwd, 0, bytes);
          continue;
        }
        add_comm(t, axis, fwd, ct, bytes);
        time += ct;
      }
      if (hidden > 0) {
        const double exposed =
            overlap_exposed_s(hidden, hide_under, overlap_slowdown_on(hidden_link));
        t[comm_seconds_slot(hidden_axis, fwd)] += exposed;
        time += exposed;
      }
    }
    if (is_recompute(g, n)) {
      t[kRecompute] += time;
      if (is_collective(n.kind)) t[comm_axis == "cp" ? kRecomputeCp : kRecomputeTp] += time;
    }
    // Launched synchronously, the kernel's host dispatch adds to the rank's
    // time (CostConstants::blocking_launch_s); a collective's too, counted as
    // compute, not as time on the wire.
    t[kLaunches] += 1;
    if (k_.blocking_launch_s > 0) {
      t[fwd ? kFwd : wgrad[i] ? kWgrad : kBwd] += k_.blocking_launch_s;
      if (is_recompute(g, n)) t[kRecompute] += k_.blocking_launch_s;
    }
  }
}

Result<LayerCost> CostModel::price_program(int64_t tp, int64_t cp, int64_t micro_batch, bool sp,
                                           bool ops, bool ring) const {
  Plan p;
  p.tp = tp, p.cp = cp, p.ring = ring;
  std::shared_ptr<const StrategySearch> searched;
  if (ops) {
    MF_ASSIGN_OR_RETURN(searched, op_search(tp, cp, micro_batch));
  }
  // Totals of the program with `blocks` blocks and recompute `rc`, all of
  // it (the optimizer phase's collectives with `optimizer`).
  auto program = [&](int64_t blocks, Recompute rc, bool optimizer = false) {
    RankShape shape{micro_batch, job_.seq, tp, cp, sp, rc, blocks, optimizer};
    shape.ops = searched;
    shape.ring = ring;
    return rank_program(shape);
  };
  auto totals = [&](int64_t blocks, Recompute rc, bool optimizer = false) -> Result<Totals> {
    MF_ASSIGN_OR_RETURN(const LocalProgram lp, program(blocks, rc, optimizer));
    Totals all{};
    price_nodes(lp.graph, lp.mesh, p, weight_grad_nodes(lp.graph), {}, &all);
    return all;
  };
  // One block's cost is the second block's nodes in the two-block program
  // (Node::layer 1: its forward and backward, and the reshards the
  // partitioner emits into them, which carry their consumer's layer); the
  // rest of that program, less its embedding side, is the head's. One
  // program per micro-batch, not two: it was the one- and two-block
  // programs' difference, which is the same where the partitioner lays the
  // embedding and head out alike in both, and was wrong where it did not
  // (LLaMA's GQA under megatron-sp with cp: the one-block program's head ran
  // on gathered sequences; a third program was then built).
  //
  // The program is the run's, optimizer phase included; a parameter's
  // optimizer nodes carry its block (optim/optimizer.cc), so the optimizer
  // phase's collectives split by block like the rest. Its strategy is the one
  // annotated at this micro-batch with exact strategies, else the one first
  // annotated for these degrees (rank_program, set_exact_strategies).
  Totals embed{}, one{}, block{};
  {
    MF_ASSIGN_OR_RETURN(const LocalProgram lp,
                        program(has_blocks() ? 2 : 1, Recompute::kNone, /*optimizer=*/true));
    const Graph& g = lp.graph;
    // One pass, three parts: 0 the rest (the first block and the head), 1
    // the embedding side, 2 the second block. (A reshard of an
    // embedding-side value into the second block, the rotary tables' say,
    // is the block's: the one-block program has one.)
    // Without blocks (the MLP, a ResNet, whose stages carry layers too)
    // everything is the head's: one part.
    std::vector<uint8_t> part;
    if (has_blocks()) {
      const std::vector<bool> before = before_blocks(g, priced_layers(g));
      part.assign(g.num_nodes(), 0);
      for (NodeId i = 0; i < g.num_nodes(); ++i)
        part[i] = g.node(i).layer == 1 ? 2 : before[i] ? 1 : 0;
    }
    Totals parts[3] = {};
    price_nodes(g, lp.mesh, p, weight_grad_nodes(g), part, parts);
    embed = parts[1], block = parts[2];
    one = parts[0];
    for (int i = 0; i < kSlots; ++i) one[i] += embed[i];
  }
  const Totals head = minus(minus(one, block), embed);

  LayerCost lc = layer_cost_of(one, block, embed, head);
  // The optimizer phase's collectives, once per step: a block's, and the
  // rest's (the program less both blocks: embedding, head, the norm's sum).
  lc.opt_comm_s = block[kOptComm], lc.opt_comm_bytes = block[kOptCommBytes];
  lc.opt_comm_outside_s = one[kOptComm] - block[kOptComm];
  lc.opt_comm_outside_bytes = one[kOptCommBytes] - block[kOptCommBytes];
  lc.opt_bucketed_tp_bytes = block[kOptBucketedTp];
  lc.opt_bucketed_tp_outside_bytes = one[kOptBucketedTp] - block[kOptBucketedTp];
  lc.opt_cp_params = block[kOptCpParams];
  lc.opt_cp_params_outside = one[kOptCpParams] - block[kOptCpParams];
  lc.grad_chains = int(one[kGradChains]);
  if (k_.recompute_from_pass && has_blocks()) {
    // What the recompute pass clones into a block's backward (and the
    // collectives lowered for the clones), priced node by node.
    for (Recompute mode : {Recompute::kFull, Recompute::kSelective}) {
      MF_ASSIGN_OR_RETURN(const Totals r1, totals(1, mode));
      MF_ASSIGN_OR_RETURN(const Totals r2, totals(2, mode));
      (mode == Recompute::kFull ? lc.recompute_full_s : lc.recompute_selective_s) =
          r2[kRecompute] - r1[kRecompute];
    }
  }
  return lc;
}

Result<std::array<double, 3>> CostModel::whole_recompute(
    const Plan& p, std::shared_ptr<const StrategySearch> ops) const {
  MF_RETURN_IF_ERROR(status_);
  const auto key =
      std::make_tuple(p.tp, p.cp, p.micro_batch, p.ring, ops.get(), p.recompute_layers);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = whole_recompute_cache_.find(key); it != whole_recompute_cache_.end())
      return it->second;
  }
  // The program price_program prices, recompute pass applied: every block
  // (a ResNet's residual layers) recomputes, as the runtime's full policy
  // does, or the first recompute_layers of them.
  RankShape shape{p.micro_batch, job_.seq, p.tp, p.cp, false, Recompute::kFull, 1, true};
  shape.ops = ops;
  shape.ring = p.ring;
  for (int b = 0; b < static_cast<int>(p.recompute_layers); ++b)
    shape.recompute_blocks.push_back(b);
  MF_ASSIGN_OR_RETURN(const LocalProgram lp, rank_program(shape));
  Plan q;
  q.tp = p.tp, q.cp = p.cp, q.ring = p.ring;
  Totals all{};
  price_nodes(lp.graph, lp.mesh, q, weight_grad_nodes(lp.graph), {}, &all);
  const std::array<double, 3> r = {all[kRecompute] - all[kRecomputeTp] - all[kRecomputeCp],
                                   all[kRecomputeTp], all[kRecomputeCp]};
  std::lock_guard<std::mutex> lock(mu_);
  whole_recompute_cache_.emplace(key, r);
  return r;
}

Result<std::vector<ChunkCost>> CostModel::chunk_costs(int64_t tp, int64_t cp, int64_t micro_batch,
                                                      int64_t chunks, bool sp, Recompute recompute,
                                                      const std::vector<int64_t>& layers,
                                                      std::shared_ptr<const StrategySearch> ops,
                                                      bool ring, int64_t recompute_first) const {
  MF_RETURN_IF_ERROR(status_);
  if (recompute != Recompute::kFull || !has_blocks()) recompute_first = 0;
  // The blocks that recompute: the first recompute_first of each chunk.
  std::vector<int> rc_blocks;
  if (recompute_first > 0) {
    Plan q;
    q.pp = chunks, q.layers_per_stage = layers;
    for (int64_t b : first_blocks_of_chunks(chunk_blocks(q, dims_.layers), recompute_first))
      rc_blocks.push_back(static_cast<int>(b));
  }
  const int variant =
      int(sp) + 2 * int(recompute) + (ring ? 8 : 0) + 16 * static_cast<int>(recompute_first);
  const auto key = std::make_tuple(tp, cp, micro_batch, chunks, variant, layers, ops.get());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = chunk_cache_.find(key); it != chunk_cache_.end()) return *it->second;
  }
  auto compute = [&]() -> Result<std::vector<ChunkCost>> {
    // The program the pipeline trainer splits: forward, backward and the
    // optimizer (its collectives over tp), partitioned on the stage's mesh.
    // Built once per (tp, cp, micro_batch) and split for each chunk count.
    std::shared_ptr<const LocalProgram> program;
    const auto pkey = std::make_tuple(tp, cp, micro_batch, variant, ops.get(), rc_blocks);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = pipeline_programs_.find(pkey); it != pipeline_programs_.end())
        program = it->second;
    }
    if (!program) {
      // Every block of a language model (the pipeline splits them).
      RankShape shape{
          micro_batch, job_.seq, tp, cp, sp, recompute, has_blocks() ? dims_.layers : 1};
      shape.optimizer = true;
      shape.pipeline = true;
      shape.ops = ops;
      shape.ring = ring;
      shape.recompute_blocks = rc_blocks;
      MF_ASSIGN_OR_RETURN(LocalProgram built, rank_program(shape));
      program = std::make_shared<const LocalProgram>(std::move(built));
      std::lock_guard<std::mutex> lock(mu_);
      pipeline_programs_.emplace(pkey, program);
    }
    const LocalProgram& lp = *program;
    MF_ASSIGN_OR_RETURN(const PipelineSplit split,
                        split_pipeline(lp.graph, static_cast<int>(chunks), layers));
    Plan p;
    p.tp = tp, p.cp = cp;
    std::vector<ChunkCost> out;
    for (const ChunkProgram& c : split.chunks) {
      const Graph& g = c.graph;
      std::vector<bool> wgrad(g.num_nodes(), false);
      for (NodeId id : c.backward_weight) wgrad[id] = true;
      Totals t{};
      price_nodes(g, lp.mesh, p, wgrad, {}, &t);
      ChunkCost cc;
      cc.first_layer = c.first_layer, cc.num_layers = c.num_layers;
      cc.times.forward_s = t[kFwd] + t[kTpFwd] + t[kCpFwd];
      cc.times.backward_s = t[kBwd] + t[kTpBwd] + t[kCpBwd];
      cc.times.weight_grad_s = t[kWgrad];
      cc.times.tp_comm_s = t[kTpFwd] + t[kTpBwd];
      cc.times.cp_comm_s = t[kCpFwd] + t[kCpBwd];
      // Of B, the recompute clones' compute (their collectives are in the comm).
      cc.times.recompute_s = t[kRecompute] - t[kRecomputeTp] - t[kRecomputeCp];
      cc.tp_bytes = t[kTpFwdBytes] + t[kTpBwdBytes];
      cc.cp_bytes = t[kCpFwdBytes] + t[kCpBwdBytes];
      for (ValueId v : c.act_out) {  // f32 activations move in the compute dtype
        const DType dt = g.value(v).dtype;
        cc.act_bytes +=
            double(g.shape(v).numel()) * double(dtype_size(dt == DType::F32 ? dtype_ : dt));
      }
      cc.params = static_cast<int64_t>(std::llround(t[kParams]));
      cc.param_tensors = static_cast<int>(std::llround(t[kParamTensors]));
      cc.opt_comm_s = t[kOptComm], cc.opt_comm_bytes = t[kOptCommBytes];
      cc.opt_bucketed_tp_bytes = t[kOptBucketedTp];
      cc.arena_bytes = static_arena_bytes(g, c.keep_alive());
      auto bytes = [&g](const std::vector<ValueId>& values) {
        double b = 0;
        for (ValueId v : values)
          b += double(g.shape(v).numel()) * double(dtype_size(g.value(v).dtype));
        return b;
      };
      cc.kept_bytes = bytes(c.keep_alive());
      cc.act_out_bytes = bytes(c.act_out), cc.grad_out_bytes = bytes(c.grad_out);
      cc.stash_bytes = double(c.stash_bytes());
      cc.weight_hold_bytes = double(c.weight_hold_bytes());
      // (Entries the forward writes in place, ChunkProgram::stash_in_place,
      // are not copied.)
      const std::vector<char> in_place = c.stash_in_place();
      double copied = 0, read_by_bi = 0, read_by_w = 0;
      for (size_t i = 0; i < c.stash.size(); ++i) {
        if (in_place[i]) continue;
        const double b =
            double(g.shape(c.stash[i]).numel()) * double(dtype_size(g.value(c.stash[i]).dtype));
        copied += b;
        if (i < c.stash_for_input.size() && c.stash_for_input[i]) read_by_bi += b;
        if (i < c.stash_for_weight.size() && c.stash_for_weight[i]) read_by_w += b;
      }
      const double w_stash = bytes(c.weight_stash);
      auto copy_s = [this](double b) { return cluster_.memory_time_s(2 * b); };
      cc.save_s = copy_s(copied);
      cc.restore_s = copy_s(copied);
      cc.bi_copy_s = copy_s(read_by_bi + w_stash);
      cc.w_copy_s = copy_s(read_by_w + w_stash);
      cc.input_bytes = t[kInputBytes];
      out.push_back(cc);
    }
    for (const PipelineSplit::Tied& t : split.tied)
      for (int c : t.copies) {
        const Graph& g = split.chunks[static_cast<size_t>(c)].graph;
        const ValueId v = g.find(t.name);
        if (v != kNoValue) out[static_cast<size_t>(c)].copied_params += g.shape(v).numel();
      }
    return out;
  };
  Result<std::vector<ChunkCost>> r = compute();
  if (!r.is_ok())
    r = r.status().with_context("pricing " + str(chunks) + " pipeline chunks at tp=" + str(tp) +
                                ", cp=" + str(cp));
  auto shared = std::make_shared<const Result<std::vector<ChunkCost>>>(r);
  std::lock_guard<std::mutex> lock(mu_);
  chunk_cache_.emplace(key, shared);
  return r;
}

std::string CostModel::invalid_reason(const Plan& p) const {
  if (!status_.is_ok()) return status_.message();
  const TransformerDims& d = dims_;
  if (p.dp < 1 || p.tp < 1 || p.pp < 1 || p.cp < 1 || p.vp < 1 || p.micro_batch < 1 ||
      p.num_micro_batches < 1)
    return "every degree, the micro-batch and the micro-batch count must be >= 1";
  if (p.devices() > cluster_.total_devices())
    return "dp*tp*pp*cp = " + str(p.devices()) + " devices, the cluster has " +
           str(cluster_.total_devices());
  if (p.dp * p.micro_batch * p.num_micro_batches != job_.global_batch)
    return "dp * micro_batch * num_micro_batches = " + str(p.dp) + "*" + str(p.micro_batch) + "*" +
           str(p.num_micro_batches) + " must equal the global batch " + str(job_.global_batch);
  if (!has_blocks()) {
    // A model without blocks or sequence: dp and tp only (whether tp divides
    // its layers is the partitioner's answer, when the plan is priced); a
    // ResNet's cp splits its images' height (auto_plan.h: parallel_section).
    // Its residual layers are a pipeline's blocks (chunk_costs).
    const bool resnet = std::holds_alternative<ResNetConfig>(job_.model);
    if (resnet && p.sp)
      return "the resnet has no sequence for sp: its plans are dp x tp x cp (the height) x pp "
             "with ZeRO and recompute";
    if (resnet && p.recompute == Recompute::kSelective)
      return "selective recompute recomputes the attention core, which the resnet does not "
             "have: use recompute=full (every residual layer recomputes in the backward) or "
             "none";
    if (!resnet && (p.pp > 1 || p.cp > 1 || p.sp || p.vp > 1 || p.recompute != Recompute::kNone))
      return "the " + summarize(job_.model, 1).kind +
             " has no transformer blocks to pipeline (pp) or recompute and no sequence to "
             "split (cp, sp): its plans are dp x tp with ZeRO";
    if (p.pp * p.vp > 1 && p.pp * p.vp > pipeline_layers_)
      return "pp*vp = " + str(p.pp * p.vp) + " pipeline chunks, the resnet has " +
             str(pipeline_layers_) + " residual layers (a chunk holds at least one)";
  } else {
    Status s = check_local_shape(d, RankShape{p.micro_batch, job_.seq, p.tp, p.cp});
    if (!s.is_ok()) return s.message();
  }
  if (p.sp && p.tp == 1) return "sp (sequence parallelism) needs tp > 1";
  if (!p.layers_per_stage.empty()) {
    // (Spelled only when refused: the search asks this of every split it prices.)
    auto given = [&] {
      std::string g = "layers_per_stage [";
      for (size_t i = 0; i < p.layers_per_stage.size(); ++i)
        g += (i ? ", " : "") + str(p.layers_per_stage[i]);
      return g + "]";
    };
    if (int64_t(p.layers_per_stage.size()) != p.pp * p.vp)
      return given() + " needs one entry per pipeline chunk (pp*vp = " + str(p.pp * p.vp) + ")";
    int64_t sum = 0;
    for (int64_t n : p.layers_per_stage) {
      if (n < 1) return given() + ": every stage holds at least one block";
      sum += n;
    }
    if (sum != pipeline_layers_)
      return given() + " sums to " + str(sum) + ", the model has " + str(pipeline_layers_) +
             " blocks to split";
  }
  if (p.ops && (p.tp * p.cp == 1 || p.sp))
    return "per-operator strategies (ops) are searched on the tp and cp axes of a dp x tp x cp "
           "mesh (and pipeline stages of it): they need tp > 1 or cp > 1, and no sp (the search "
           "decides where the sequence is split)";
  if (p.ops && p.cp > 1 && !is_language_model(job_.model))
    return "per-operator strategies on cp split a language model's sequence (ring attention "
           "included); a ResNet's cp is the template's height split";
  if (p.ops && p.cp > 1 && job_.seq % (2 * p.cp) != 0)
    return "per-operator strategies on cp run the sequence in zigzag order (ring attention's "
           "causal balance), which cuts seq=" +
           str(job_.seq) + " into 2*cp = " + str(2 * p.cp) + " chunks, which must divide it";
  if (p.sp && (job_.seq / p.cp) % p.tp != 0)
    return "sp splits the local seq " + str(job_.seq / p.cp) + " by tp=" + str(p.tp) +
           ", which does not divide it";
  if (has_blocks() && p.pp > d.layers)
    return "pp=" + str(p.pp) + " exceeds the " + str(d.layers) + " layers";
  if (p.zero < 0 || p.zero > 3) return "zero must be 0, 1, 2 or 3, got " + str(p.zero);
  if (p.pp == 1 && p.schedule != ScheduleKind::k1F1B)
    return "pp=1 has no pipeline schedule (use 1f1b), got " +
           std::string(schedule_name(p.schedule));
  if (p.schedule == ScheduleKind::kInterleaved) {
    if (p.vp < 2) return "the interleaved schedule needs vp >= 2 virtual stages";
    if (p.layers_per_stage.empty() && d.layers % (p.pp * p.vp) != 0)
      return "interleaved: pp*vp = " + str(p.pp * p.vp) + " must divide the " + str(d.layers) +
             " layers (or give layers_per_stage, one entry per chunk)";
    if (p.num_micro_batches % p.pp != 0)
      return "interleaved: the micro-batch count " + str(p.num_micro_batches) +
             " must be a multiple of pp=" + str(p.pp);
  } else if (p.schedule == ScheduleKind::kZbV) {
    if (p.vp != 2) return "zb-v runs two chunks per stage in a V: vp must be 2, got " + str(p.vp);
    if (p.layers_per_stage.empty() && d.layers % (2 * p.pp) != 0)
      return "zb-v: 2*pp = " + str(2 * p.pp) + " chunks must divide the " + str(d.layers) +
             " layers (or give layers_per_stage, one entry per chunk)";
  } else if (p.vp != 1) {
    return "vp > 1 needs the interleaved schedule (or zb-v with 2), got " +
           std::string(schedule_name(p.schedule));
  }
  if (p.ring && (p.cp < 2 || p.ops))
    return "ring attention (cp over the keys, preset \"ring\") needs cp >= 2, and no ops";
  if (p.recompute_layers != 0) {
    const std::string n = "recompute_layers=" + str(p.recompute_layers);
    if (p.recompute_layers < 0) return n + " must be >= 0 (0: every block recomputes)";
    // A ResNet's first residual layers (the largest activations), without pipelines.
    const bool resnet_layers = std::holds_alternative<ResNetConfig>(job_.model) && p.pp == 1;
    if (p.recompute != Recompute::kFull || (!has_blocks() && !resnet_layers))
      return n +
             " recomputes the first blocks of each pipeline chunk under full recompute; "
             "it needs recompute=full and a model with transformer blocks (a resnet's "
             "first residual layers: without pipelines, pp=1)";
    const std::vector<int64_t> chunks =
        has_blocks() ? chunk_blocks(p, d.layers) : std::vector<int64_t>{pipeline_layers_};
    const int64_t chunk = *std::min_element(chunks.begin(), chunks.end());
    if (p.recompute_layers >= chunk)
      return n + " covers every block of a chunk of " + str(chunk) +
             ": use recompute_layers=0 (all) or fewer than " + str(chunk);
  }
  if (p.ring && job_.seq % (2 * p.cp) != 0)
    return "ring attention's zigzag order (its causal load balance) cuts seq=" + str(job_.seq) +
           " into 2*cp = " + str(2 * p.cp) + " chunks, which must divide it";
  if (p.group && (p.zero != 1 || p.dp < 2 || p.pp > 1 || p.cp > 1))
    return "weights grouping (group) is ZeRO-1 over dp with whole parameters per rank: it needs "
           "zero=1, dp >= 2, and no pp or cp (the runtime groups one program's parameters)";
  if (p.offload != Offload::kNone) {
    const std::string o = "offload=" + std::string(offload_name(p.offload));
    if (p.zero < 1)
      return o +
             " moves each replica's ZeRO shard of the optimizer state off the device: it "
             "needs zero >= 1";
    const Host& h = cluster_.host;
    if (!(h.link_bandwidth_bytes_per_s > 0 && h.memory_bytes > 0 &&
          h.memory_bandwidth_bytes_per_s > 0))
      return o +
             " is priced from the cluster file's \"host\" section: it needs "
             "link_bandwidth_bytes_per_s, memory_bytes and memory_bandwidth_bytes_per_s";
    if (p.offload == Offload::kNvme && !(h.nvme_bandwidth_bytes_per_s > 0 && h.nvme_bytes > 0))
      return o + " needs host.nvme_bandwidth_bytes_per_s and host.nvme_bytes in the cluster file";
  }
  return "";
}

int64_t CostModel::blocks_per_stage(const Plan& p) const {
  if (!has_blocks()) return 0;
  if (!p.layers_per_stage.empty()) {
    const std::vector<int64_t> per = stage_blocks(p);
    return *std::max_element(per.begin(), per.end());
  }
  return (dims_.layers + p.pp - 1) / p.pp;
}

std::vector<int64_t> CostModel::stage_blocks(const Plan& p) const {
  if (has_blocks() && !p.layers_per_stage.empty()) {
    if (p.vp <= 1) return p.layers_per_stage;
    // One entry per chunk: a stage holds the blocks of its chunks (the
    // runtime's placement: round robin, zb-v's V). The formula prices a
    // stage's chunks as even shares of their sum.
    const ScheduleOptions so{p.schedule, static_cast<int>(p.pp), 1, static_cast<int>(p.vp)};
    std::vector<int64_t> per(static_cast<size_t>(p.pp), 0);
    for (size_t c = 0; c < p.layers_per_stage.size(); ++c)
      per[static_cast<size_t>(chunk_rank(so, static_cast<int>(c)))] += p.layers_per_stage[c];
    return per;
  }
  // Balanced: every stage priced with the most blocks one holds.
  return std::vector<int64_t>(static_cast<size_t>(p.pp), blocks_per_stage(p));
}

StageTimes CostModel::slowest_stage(const Plan& p, const LayerCost& lc, double* p2p_bytes) const {
  const TransformerDims& d = dims_;
  const Cluster& cl = cluster_;
  const double act = double(dtype_size(dtype_));
  const double s_local = double(job_.seq) / double(p.cp);
  const Link tp_link = ring_link(p.tp, 1);
  const double act_buf = double(p.micro_batch) * s_local * double(d.hidden) * act;
  // The stage with the most work per micro-batch (the first on ties).
  auto total = [](const StageTimes& st) { return st.forward_s + st.backward_s + st.weight_grad_s; };
  const std::vector<int64_t> blocks = stage_blocks(p);
  StageTimes st;
  double most = -1;
  std::vector<int64_t> seen;  // a middle stage's work depends on its blocks alone
  for (int64_t s = 0; s < p.pp; ++s) {
    if (s > 0 && s < p.pp - 1) {
      if (std::find(seen.begin(), seen.end(), blocks[size_t(s)]) != seen.end()) continue;
      seen.push_back(blocks[size_t(s)]);
    }
    const StageTimes t = stage_times(p, lc, s, double(blocks[size_t(s)]));
    if (total(t) > most) most = total(t), st = t;
  }

  // ---- pipeline: p2p sends. Under sequence parallelism the activation
  // between stages is already split over tp (Megatron-Core's p2p tensor
  // shape is seq / tp): each rank sends its shard, nothing is gathered.
  // Without it, Megatron's scatter/gather: 1/tp of the activation sent, then
  // all_gathered over tp.
  const int64_t pp_stride = p.tp * p.cp * p.dp;
  const Link& pp_link = cl.link_for_axis(p.pp, pp_stride);
  const bool split = p.sp && p.tp > 1;
  *p2p_bytes = split || k_.p2p_scatter_gather ? act_buf / double(p.tp) : act_buf;
  st.p2p_s = 0;
  if (p.pp > 1) {
    st.p2p_s =
        cl.collective_time_s(Collective::kSendRecv, 2, *p2p_bytes, pp_link) / k_.p2p_efficiency;
    if (k_.p2p_scatter_gather && !split)
      st.p2p_s += cl.collective_time_s(Collective::kAllGather, p.tp, act_buf, tp_link);
  }
  return st;
}

// The stage holding the final norm, the head and the loss: the last, or the
// first under zb-v (its V ends on stage 0).
namespace {
int64_t head_stage(const Plan& p) {
  return p.schedule == ScheduleKind::kZbV ? 0 : p.pp - 1;
}
}  // namespace

StageTimes CostModel::stage_times(const Plan& p, const LayerCost& lc, int64_t stage,
                                  double blocks) const {
  const double ls = blocks;
  // ---- one block, one micro-batch: compute + the collectives the partitioner put in it
  const double f_layer = lc.forward_s, b_layer = lc.backward_s, w_layer = lc.weight_grad_s;
  // tp communication a stack overlaps with the GEMMs (CostConstants::tp_comm_overlap).
  auto exposed_tp = [&](double comm, double compute) {
    if (!k_.tp_comm_overlap || p.tp <= 1) return comm;
    const double first = comm / double(p.tp);
    return first + overlap_exposed_s(comm - first, compute, k_.tp_overlap_compute_slowdown);
  };
  const double tp_fwd = exposed_tp(lc.tp_fwd_s, f_layer);
  double tp_bwd =
      k_.tp_comm_overlap_backward ? exposed_tp(lc.tp_bwd_s, b_layer + w_layer) : lc.tp_bwd_s;
  if (k_.tp_backward_overlap && !k_.tp_comm_overlap && p.tp > 1)
    tp_bwd = overlap_exposed_s(lc.tp_bwd_s, w_layer,
                               overlap_slowdown_on(ring_link(p.tp, axis_stride(p, "tp"))));
  const double cp_fwd = lc.cp_fwd_s, cp_bwd = lc.cp_bwd_s;

  // ---- stages: blocks per stage, first (embedding) and last (head) stage
  double recompute_layer = 0;
  if (p.recompute == Recompute::kFull)
    recompute_layer = k_.recompute_from_pass ? lc.recompute_full_s : f_layer + tp_fwd + cp_fwd;
  // TorchTitan's op-level SAC: every second matmul, everything but the
  // matmuls and the attention, and the tp collectives it does not save (the
  // all_gathers before the projections with sp; the all_reduces without).
  const bool op_sac = p.recompute == Recompute::kSelective && k_.selective_is_op_sac;
  const double op_sac_tp = op_sac ? (p.sp ? 0.5 : 1.0) * tp_fwd : 0.0;
  if (p.recompute == Recompute::kSelective)
    recompute_layer =
        op_sac ? lc.forward_matmul_s * op_sac_matmul_share(dims_) +
                     std::max(0.0, lc.forward_s - lc.forward_matmul_s - lc.attention_core_s) +
                     op_sac_tp
        : k_.recompute_from_pass ? lc.recompute_selective_s
                                 : lc.attention_core_s;
  // Blocks that recompute: all, or under full recompute the first
  // recompute_layers of each chunk (full_recompute_share).
  const bool full = p.recompute == Recompute::kFull;
  const double rc_blocks = full ? ls * full_recompute_share(p, ls) : ls;
  // The collectives a recomputed block runs again count as communication,
  // the rest of it as recompute: each second once in the breakdown.
  const double rc_tp = full ? tp_fwd : op_sac_tp, rc_cp = full ? cp_fwd : 0.0;
  StageTimes base;
  base.forward_s = ls * (f_layer + tp_fwd + cp_fwd);
  base.backward_s = ls * (b_layer + tp_bwd + cp_bwd) + rc_blocks * recompute_layer;
  base.weight_grad_s = ls * w_layer;
  base.recompute_s = rc_blocks * std::max(0.0, recompute_layer - rc_tp - rc_cp);
  base.tp_comm_s = ls * (tp_fwd + tp_bwd) + rc_blocks * rc_tp;
  base.cp_comm_s = ls * (cp_fwd + cp_bwd) + rc_blocks * rc_cp;
  StageTimes st = base;
  if (stage == 0) {  // the embedding
    st.forward_s += lc.embed_fwd_s;
    st.backward_s += lc.embed_bwd_s;
    st.tp_comm_s += lc.embed_comm_s - lc.embed_cp_comm_s;
    st.cp_comm_s += lc.embed_cp_comm_s;
  }
  if (stage == head_stage(p)) {  // the final norm, head and loss
    st.forward_s += lc.head_fwd_s;
    st.backward_s += lc.head_bwd_s;
    st.weight_grad_s += lc.head_wgrad_s;
    st.tp_comm_s += lc.head_comm_s - lc.head_cp_comm_s;
    st.cp_comm_s += lc.head_cp_comm_s;
    // A model without blocks that recomputes (its whole program's clones).
    st.backward_s += lc.head_recompute_s + lc.head_recompute_tp_s + lc.head_recompute_cp_s;
    st.recompute_s += lc.head_recompute_s;
    st.tp_comm_s += lc.head_recompute_tp_s;
    st.cp_comm_s += lc.head_recompute_cp_s;
  }
  // The stack's pass adding the micro-batch's gradients into f32 ones
  // (CostConstants::hp_grad_pass_bytes), over the stage's parameters.
  if (k_.hp_grad_pass_bytes > 0)
    st.backward_s +=
        cluster_.memory_time_s(k_.hp_grad_pass_bytes * stage_params(p, lc, stage, blocks));
  return st;
}

double CostModel::stage_params(const Plan& p, const LayerCost& lc, int64_t stage,
                               double blocks) const {
  const TransformerDims& d = dims_;
  double params = blocks * double(lc.layer_params);
  if (stage == 0) params += double(lc.embed_params);
  if (stage == head_stage(p)) {
    params += double(lc.head_params);
    if (p.pp > 1 && d.tied)
      params += double((d.vocab + p.tp - 1) / p.tp) * double(d.hidden);  // the table's copy
  }
  return params;
}

double CostModel::most_stage_params(const Plan& p, const LayerCost& lc) const {
  const std::vector<int64_t> blocks = stage_blocks(p);
  // The first, the last, and the middle stage with the most blocks.
  int64_t middle = 0;
  for (int64_t s = 1; s + 1 < p.pp; ++s) middle = std::max(middle, blocks[size_t(s)]);
  double most = std::max(stage_params(p, lc, 0, double(blocks.front())),
                         stage_params(p, lc, p.pp - 1, double(blocks.back())));
  if (p.pp > 2) most = std::max(most, stage_params(p, lc, 1, double(middle)));
  return most;
}

namespace {

// The model states of `params` parameters on one device under p's ZeRO stage
// (over its dp * cp replicas; those split over cp already, the share
// 1 - cp_share, over dp alone), `o_b` bytes of optimizer state each. Mixed
// precision with AdamW: 16-bit weights (2) and gradients (2), f32 master
// weights and Adam moments (12) = 16 B/param; f32 training: 4 + 4 + 8 = 16.
// grad_b: bytes per gradient element (0: act; 4 where they accumulate in f32).
void model_states(double params, const Plan& p, double o_b, double act, MemoryBreakdown* mb,
                  double cp_share = 1.0, const CostConstants* k = nullptr) {
  const double sharded = params * (cp_share / double(p.dp * p.cp) + (1 - cp_share) / double(p.dp));
  const double grad_b = k && k->grad_accumulation_bytes > 0 ? k->grad_accumulation_bytes : act;
  mb->params = (p.zero >= 3 ? sharded : params) * act;
  mb->grads = (p.zero >= 2 ? sharded : params) * (grad_b + (k ? k->grad_copy_bytes : 0.0));
  mb->optimizer = (p.zero >= 1 ? sharded : params) * o_b;
  if (!k || p.zero < 1 || p.zero > 2) return;
  // ZeRO-1/2 as the stack keeps it (CostConstants): a whole f32 master copy
  // (its moments alone sharded), the step's f32 gradient partition.
  const double master = act < 4 ? 4.0 : 0.0;
  if (k->whole_master_weights) mb->optimizer += (params - sharded) * master;
  mb->grads += sharded * k->zero_grad_partition_bytes;
}

}  // namespace

// Micro-batches whose activations stage `stage` holds at its peak: 1F1B and
// ZB-H1 keep pp - stage (at most m), GPipe all m, the interleaved schedule a
// little more on the first stages (Narayanan et al. 2021).
double stage_in_flight(const Plan& p, int64_t stage) {
  if (p.pp <= 1) return 1;
  const double m = double(p.num_micro_batches), pp = double(p.pp);
  const double ahead = std::min(m, pp - double(stage));
  switch (p.schedule) {
    case ScheduleKind::kGPipe:
      return m;
    case ScheduleKind::k1F1B:
    case ScheduleKind::kZbH1:
      return ahead;
    case ScheduleKind::kZbV:  // 2p half-stage chunks on every stage (schedule.h)
      return std::min(m, pp);
    case ScheduleKind::kInterleaved:
      return stage == p.pp - 1 ? 1.0 : ahead * (1 + (pp - 1) / (pp * m));
  }
  return ahead;
}

// Bytes per device of pipeline stage `stage` holding `blocks` blocks: its
// model states, the activations of the micro-batches its schedule keeps in
// flight, and its temporaries.
// Does the runtime keep persistent gradient buckets (ZeRO-0)? When the
// program reduces its gradients through chains the buckets run
// (runtime/grad_buckets.h gradient_syncs): read off the priced program (dp =
// 1), or over dp alone (all_reduce); when they are also Partial over cp (the
// reshard planner's reduce_scatter, all_reduce, all_gather over both axes)
// asked of the program of one of dp replicas (one block, once per plan
// shape).
Result<bool> CostModel::grads_in_buckets(const Plan& p, const LayerCost& lc) const {
  if (p.dp <= 1) return lc.grad_chains > 0;
  if (p.cp <= 1) return true;
  RankShape shape{p.micro_batch, job_.seq, p.tp, p.cp, p.sp, Recompute::kNone, 1, true};
  shape.ring = p.ring;
  shape.dp = p.dp, shape.with_dp = true;
  if (p.ops) {
    MF_ASSIGN_OR_RETURN(shape.ops, op_search(p.tp, p.cp, p.micro_batch));
  }
  MF_ASSIGN_OR_RETURN(const LocalProgram lp, rank_program(shape));
  for (const GradientSync& sync : gradient_syncs(lp.graph))
    if (!sync.reduce.empty()) return true;
  return false;
}

Result<MemoryBreakdown> CostModel::stage_memory(const Plan& p, const LayerCost& lc, int64_t stage,
                                                double blocks) const {
  const TransformerDims& d = dims_;
  const double act = double(dtype_size(dtype_));
  const bool mixed = dtype_ != DType::F32;
  const double s_local = double(job_.seq) / double(p.cp);
  const double layer_params = double(lc.layer_params);
  const bool first = stage == 0, last = stage == head_stage(p);
  const double w_b = act;
  const double in_flight = stage_in_flight(p, stage);
  const double embed_act = double(p.micro_batch) * s_local * double(d.hidden) *
                           (act + (d.dropout ? 1.0 : 0.0)) / (p.sp ? double(p.tp) : 1.0);
  // Temporaries: the recompute working set (one layer's full activations),
  // ZeRO-3's gathered weights of two layers (current + prefetch), the loss's
  // peak on the head stage (CostConstants::loss_bytes_per_logit).
  Plan no_rc = p;
  no_rc.recompute = Recompute::kNone;
  const bool op_sac = p.recompute == Recompute::kSelective && k_.selective_is_op_sac;
  const double rc_ws =
      p.recompute == Recompute::kFull || op_sac
          ? layer_activation_bytes(d, no_rc, job_.seq, k_.attention, act, false, k_.eager)
          : 0.0;
  const double z3_ws = p.zero >= 3 ? 2 * layer_params * w_b : 0.0;
  const double logits = k_.loss_bytes_per_logit * double(p.micro_batch) * s_local *
                        double((d.vocab + p.tp - 1) / p.tp);
  MemoryBreakdown mb;
  model_states(stage_params(p, lc, stage, blocks), p, optimizer_state_bytes_per_param(mixed), act,
               &mb, cp_replicated_share(p, lc, blocks), &k_);
  if (k_.memory_model == MemoryModel::kStaticArena) {
    // meshflow's executor: the arena holds activations, gradients and
    // temporaries together (activations); persistent gradient buckets exist
    // with micro-batching, or when the buckets all_reduce gradients (ZeRO-0
    // and weights grouping: over dp, or the program's chains over tp or cp); the fed inputs
    // (an LM's i32 token and target ids, an MLP's f32 features and i32
    // labels: the program's input values) are the temporaries.
    MF_ASSIGN_OR_RETURN(const double arena,
                        arena_bytes(p, static_cast<int64_t>(std::llround(blocks))));
    bool buckets = p.num_micro_batches > 1;
    if (!buckets && (p.zero == 0 || p.group)) {
      MF_ASSIGN_OR_RETURN(buckets, grads_in_buckets(p, lc));
    }
    if (!buckets) mb.grads = 0;
    mb.activations = in_flight * arena;
    mb.temporaries = lc.input_bytes;
  } else {
    MF_ASSIGN_OR_RETURN(double act_layer, layer_activations(p));
    const double share = full_recompute_share(p, blocks);
    if (p.recompute == Recompute::kFull && share < 1) {
      // The blocks that do not recompute keep all their activations.
      MF_ASSIGN_OR_RETURN(const double kept, layer_activations(no_rc));
      act_layer = share * act_layer + (1 - share) * kept;
    }
    mb.activations = in_flight * (blocks * act_layer + (first ? embed_act : 0.0));
    // DeepSpeed ZeRO-1/2's contiguous reduce bucket (CostConstants).
    const double bucket =
        p.zero >= 1 && p.zero <= 2 && p.dp * p.cp > 1 ? k_.zero_reduce_bucket_elements * act : 0.0;
    mb.temporaries = rc_ws + z3_ws + bucket + (last ? logits : 0.0);
  }
  mb.total = mb.params + mb.grads + mb.optimizer + mb.activations + mb.temporaries;
  return mb;
}

// Bytes per device: the stage that needs the most (the first on ties). A
// middle stage holding as many blocks as an earlier middle one needs no more
// (it has as many or fewer micro-batches in flight), so it is not priced.
Result<MemoryBreakdown> CostModel::memory_per_device(const Plan& p, const LayerCost& lc,
                                                     std::vector<MemoryBreakdown>* stages) const {
  const std::vector<int64_t> blocks = stage_blocks(p);
  MemoryBreakdown worst;
  worst.total = -1;
  // A middle stage's memory depends on its blocks and its micro-batches in
  // flight; those with the blocks of one priced before are priced only when
  // every stage is asked for.
  std::vector<int64_t> seen;
  for (int64_t s = 0; s < p.pp; ++s) {
    if (!stages && s > 0 && s < p.pp - 1) {
      if (std::find(seen.begin(), seen.end(), blocks[size_t(s)]) != seen.end()) continue;
      seen.push_back(blocks[size_t(s)]);
    }
    MF_ASSIGN_OR_RETURN(const MemoryBreakdown mb,
                        stage_memory(p, lc, s, double(blocks[size_t(s)])));
    if (stages) stages->push_back(mb);
    if (mb.total > worst.total) worst = mb;
  }
  return worst;
}

MemoryBreakdown CostModel::chunk_rank_memory(const Plan& p, double params, double copied,
                                             double arena, double inputs, double bucketed_tp,
                                             double stash) const {
  const bool mixed = dtype_ != DType::F32;
  const double act = double(dtype_size(dtype_));
  MemoryBreakdown mb;
  model_states(params - copied, p, optimizer_state_bytes_per_param(mixed), act, &mb);
  mb.params += copied * act;  // a tied copy: its weights alone
  // Gradient buckets exist with micro-batching or bucketed all_reduces
  // (as memory_per_device's static arena).
  const bool buckets =
      p.num_micro_batches > 1 || (p.zero == 0 && (p.dp * p.cp > 1 || bucketed_tp > 0));
  if (!buckets) mb.grads = 0;
  mb.activations = arena + stash;
  mb.temporaries = inputs;
  mb.total = mb.params + mb.grads + mb.optimizer + mb.activations + mb.temporaries;
  return mb;
}

Result<std::vector<int64_t>> CostModel::stage_split(const Plan& p) const {
  if (p.pp <= 1 || p.vp > 1) return std::vector<int64_t>{};
  if (prices_by_chunk(p)) return chunk_stage_split(p);
  Plan q = p;  // (REQUIRES: p valid; the search asks only for valid plans)
  q.layers_per_stage.clear();
  MF_ASSIGN_OR_RETURN(const LayerCost lc,
                      layer_cost(q.tp, q.cp, q.micro_batch, q.sp, q.ops, q.ring));
  const int64_t layers = dims_.layers, pp = p.pp;
  const double usable = k_.usable_memory_fraction * double(cluster_.device.memory_bytes);
  auto work = [&](int64_t s, double n) {
    const StageTimes t = stage_times(q, lc, s, n);
    return t.forward_s + t.backward_s + t.weight_grad_s;
  };
  // Per stage: time t0 + n dt, memory b + n a (both linear in the blocks n).
  // The first and the last stage are priced as they are; a middle stage
  // differs from stage 1 only in the micro-batches it keeps in flight, each
  // holding one block's activations per block.
  std::vector<double> t0(static_cast<size_t>(pp)), a(static_cast<size_t>(pp)),
      b(static_cast<size_t>(pp));
  const double dt = work(0, 1) - work(0, 0);
  MF_ASSIGN_OR_RETURN(const double act_layer, layer_activations(q));
  for (int64_t s : {int64_t{0}, int64_t{1}, pp - 1}) {
    if (s >= pp) continue;
    t0[size_t(s)] = work(s, 0);
    MF_ASSIGN_OR_RETURN(const MemoryBreakdown m0, stage_memory(q, lc, s, 0));
    MF_ASSIGN_OR_RETURN(const MemoryBreakdown m1, stage_memory(q, lc, s, 1));
    b[size_t(s)] = m0.total, a[size_t(s)] = m1.total - m0.total;
  }
  for (int64_t s = 2; s < pp - 1; ++s) {
    t0[size_t(s)] = t0[1], b[size_t(s)] = b[1];
    a[size_t(s)] = a[1] + (stage_in_flight(q, s) - stage_in_flight(q, 1)) * act_layer;
  }
  // The most blocks stage s takes within time T and memory.
  auto cap = [&](int64_t s, double T) -> int64_t {
    double n = double(layers);
    if (dt > 0) n = std::min(n, std::floor((T - t0[size_t(s)]) / dt * (1 + 1e-12)));
    if (a[size_t(s)] > 0) n = std::min(n, std::floor((usable - b[size_t(s)]) / a[size_t(s)]));
    return std::max<int64_t>(0, static_cast<int64_t>(n));
  };
  auto fits = [&](double T) {
    int64_t total = 0;
    for (int64_t s = 0; s < pp; ++s) {
      const int64_t c = cap(s, T);
      if (c < 1) return false;
      total += c;
    }
    return total >= layers;
  };
  double hi = 0;
  for (int64_t s = 0; s < pp; ++s) hi = std::max(hi, t0[size_t(s)] + double(layers) * dt);
  if (!fits(hi)) return std::vector<int64_t>{};  // memory: no split fits
  // The slowest stage's time is t0 + k dt of the first, a middle or the last
  // stage for some k: the least that fits, by bisection on k for each.
  for (int64_t s : {int64_t{0}, std::min<int64_t>(1, pp - 1), pp - 1}) {
    int64_t lo_k = 0, hi_k = layers;  // fits(t0 + hi_k dt) is known for hi_k = layers
    if (!fits(t0[size_t(s)] + double(hi_k) * dt)) continue;
    while (hi_k - lo_k > 1) {
      const int64_t mid = (lo_k + hi_k) / 2;
      (fits(t0[size_t(s)] + double(mid) * dt) ? hi_k : lo_k) = mid;
    }
    hi = std::min(hi, t0[size_t(s)] + double(hi_k) * dt);
  }
  std::vector<int64_t> n(static_cast<size_t>(pp));
  int64_t total = 0;
  for (int64_t s = 0; s < pp; ++s) total += n[size_t(s)] = std::min(cap(s, hi), layers);
  // Give back the surplus from the stages with the most work (never below one block).
  while (total > layers) {
    int64_t worst = -1;
    for (int64_t s = 0; s < pp; ++s)
      if (n[size_t(s)] > 1 && (worst < 0 || t0[size_t(s)] + double(n[size_t(s)]) * dt >
                                                t0[size_t(worst)] + double(n[size_t(worst)]) * dt))
        worst = s;
    --n[size_t(worst)], --total;
  }
  return n;
}

Result<StepCost> CostModel::price(const Plan& p, PipelineModel model) const {
  const std::string why = invalid_reason(p);
  if (!why.empty()) return Status::invalid("plan " + plan_label(p) + ": " + why);
  // A pipeline of meshflow's executor (the static-arena memory model: any
  // model here, a ResNet anywhere): the runtime's own split of the whole
  // program, its chunks priced one by one (their arenas and stashes are the
  // memory the pipeline trainer holds).
  const bool by_chunk = prices_by_chunk(p);
  std::vector<ChunkCost> chunks;
  LayerCost lc;
  std::shared_ptr<const StrategySearch> searched;
  if (p.ops) {
    MF_ASSIGN_OR_RETURN(searched, op_search(p.tp, p.cp, p.micro_batch));
  }
  if (by_chunk) {
    MF_ASSIGN_OR_RETURN(chunks,
                        chunk_costs(p.tp, p.cp, p.micro_batch, p.pp * p.vp, p.sp, p.recompute,
                                    p.layers_per_stage, searched, p.ring, p.recompute_layers));
  } else {
    MF_ASSIGN_OR_RETURN(lc, layer_cost(p.tp, p.cp, p.micro_batch, p.sp, p.ops, p.ring));
    if (!has_blocks() && p.recompute == Recompute::kFull) {
      MF_ASSIGN_OR_RETURN(const auto rc, whole_recompute(p, searched));
      lc.head_recompute_s = rc[0], lc.head_recompute_tp_s = rc[1], lc.head_recompute_cp_s = rc[2];
    }
  }
  const TransformerDims& d = dims_;
  const Cluster& cl = cluster_;
  const bool mixed = dtype_ != DType::F32;
  const double m = double(p.num_micro_batches), v = double(p.vp);
  // (Priced by chunk, a stage's blocks are in its chunks' totals.)
  const double ls = by_chunk ? 0.0 : double(blocks_per_stage(p));

  StepCost r;
  r.plan = p;
  r.plan.searched = searched;
  double p2p_bytes = 0;
  double p_stage = 0;  // the most parameters a stage holds
  if (by_chunk) {
    stages_from_chunks(p, chunks, &r.stage, &lc, &p2p_bytes);
    p_stage = double(lc.head_params);
  } else {
    r.stage = slowest_stage(p, lc, &p2p_bytes);
    p_stage = most_stage_params(p, lc);
  }
  MF_ASSIGN_OR_RETURN(const double pipeline, pipeline_time(p, r.stage, model, &r));
  const int64_t replicas = p.dp * p.cp;
  double dp_bytes = 0;
  r.dp_comm_s = data_parallel_time(p, lc, r.stage, p_stage, &dp_bytes);

  // ---- optimizer: memory-bound AdamW over the parameters this rank updates
  const double p_update = p.zero >= 1 ? p_stage / double(replicas) : p_stage;
  r.optimizer_s = cl.memory_time_s(p_update * update_bytes_per_param(mixed));
  // The optimizer phase's collectives in the program (tp: gradient norms of
  // the parameters split or partial over it), once per step.
  r.optimizer_s += ls * lc.opt_comm_s + lc.opt_comm_outside_s;
  // FP8 weights cached for the step's micro-batches: one cast of the stage's
  // block weights (and its transpose) a step (CostConstants::fp8_weight_cache;
  // priced by chunk, of every weight of the rank's chunks: a bound, the
  // embedding's and the head's few included).
  if (job_.fp8_tensorwise() && k_.fp8_weight_cache)
    r.optimizer_s += cl.memory_time_s(4.0 * (by_chunk ? p_stage : ls * double(lc.layer_params)));
  // Micro-batches summed in f32 buckets (CostConstants::grads_accumulated_in_buckets):
  // a copy (2 x 4 bytes an element) and an add pass (3 x 4) for each later one,
  // of the rank's shard under ZeRO-2/3 (reduce-scattered in the backward).
  if (k_.grads_accumulated_in_buckets && (p.num_micro_batches > 1 || replicas > 1)) {
    const double summed = p.zero >= 2 ? p_stage / double(replicas) : p_stage;
    r.optimizer_s += cl.memory_time_s(4.0 * summed * (2.0 + 3.0 * double(p.num_micro_batches - 1)));
  }
  r.step_time_s = pipeline + r.dp_comm_s + r.optimizer_s;

  if (by_chunk) {
    MF_ASSIGN_OR_RETURN(const std::vector<MemoryBreakdown> ranks,
                        memory_by_rank(p, chunks, r.stage));
    r.memory = *std::max_element(
        ranks.begin(), ranks.end(),
        [](const MemoryBreakdown& a, const MemoryBreakdown& b) { return a.total < b.total; });
  } else {
    MF_ASSIGN_OR_RETURN(r.memory, memory_per_device(p, lc));
  }
  r.usable_memory = k_.usable_memory_fraction * double(cl.device.memory_bytes);
  r.fits = r.memory.total <= r.usable_memory;
  if (p.group) {
    // Weights grouping: the largest group sets the optimizer state and the
    // update (at least an even share, at least the largest tensor: the word
    // embedding); gradients are all-reduced as without ZeRO; after the
    // updates every parameter is broadcast from its owner (one collective per
    // tensor, after the backward: not overlapped).
    const double largest = std::max(p_stage / double(p.dp), double(lc.embed_params));
    const double o_b = optimizer_state_bytes_per_param(mixed);
    const double adam_b = update_bytes_per_param(mixed);
    r.memory.total += o_b * largest - r.memory.optimizer;
    r.memory.optimizer = o_b * largest;
    r.fits = r.memory.total <= r.usable_memory;
    Plan ddp = p;
    ddp.zero = 0, ddp.group = false;
    double ddp_bytes = 0;
    const double ddp_s = data_parallel_time(ddp, lc, r.stage, p_stage, &ddp_bytes);
    const double act = double(dtype_size(dtype_));
    const Link dp_link = ring_link(p.dp, p.tp);
    const double tensors =
        std::max(1.0, ls * double(lc.layer_param_tensors) + double(lc.embed_param_tensors) +
                          double(lc.head_param_tensors));
    const double bcast = tensors * cl.collective_time_s(Collective::kBroadcast, p.dp,
                                                        p_stage * act / tensors, dp_link);
    const double update = cl.memory_time_s(largest * adam_b) - cl.memory_time_s(p_update * adam_b);
    r.step_time_s += ddp_s + bcast - r.dp_comm_s + update;
    r.optimizer_s += update;
    r.dp_comm_s = ddp_s + bcast;
    r.comm.data_parallel = ddp_bytes + p_stage * act * double(p.dp - 1) / double(p.dp);
    dp_bytes = r.comm.data_parallel;
  }
  if (p.offload != Offload::kNone) {
    // ZeRO-Offload / ZeRO-Infinity: the state leaves the device; each step the
    // gradients go down and the updated weights come up over the device's
    // PCIe link, the update runs on the CPU bound by the node's memory
    // bandwidth (shared by its devices), and with NVMe the state is read and
    // written at the node's disk bandwidth (shared too). Not overlapped with
    // the backward (DeepSpeed's default; its one-step delayed update would be).
    const Host& h = cl.host;
    const double share = double(cl.devices_per_node);
    const double state = r.memory.optimizer;  // bytes per device of fp32 state
    const double act = double(dtype_size(dtype_));
    const double pcie = 2 * p_update * act / h.link_bandwidth_bytes_per_s;
    const double cpu =
        p_update * update_bytes_per_param(mixed) / (h.memory_bandwidth_bytes_per_s / share);
    const double nvme =
        p.offload == Offload::kNvme ? 2 * state / (h.nvme_bandwidth_bytes_per_s / share) : 0.0;
    const double on_device = cl.memory_time_s(p_update * update_bytes_per_param(mixed));
    r.optimizer_s += pcie + cpu + nvme - on_device;
    r.step_time_s += pcie + cpu + nvme - on_device;
    r.comm.offload = 2 * p_update * act + (p.offload == Offload::kNvme ? 2 * state : 0.0);
    r.memory.offload_optimizer();
    r.fits = r.memory.total <= r.usable_memory;
    // The node's host memory (host offload) or NVMe holds its devices' states.
    const double node_state = share * state;
    if (p.offload == Offload::kHost)
      r.fits = r.fits && node_state <= k_.usable_memory_fraction * h.memory_bytes;
    else
      r.fits = r.fits && node_state <= h.nvme_bytes;
  }

  // ---- communication bytes per device per step
  const double full = full_recompute_share(p, ls);
  r.comm.tensor_parallel = m * (ls * (lc.tp_fwd_bytes * (1 + full) + lc.tp_bwd_bytes) +
                                lc.embed_comm_bytes + lc.head_comm_bytes);
  r.comm.context_parallel =
      m * (ls * (lc.cp_fwd_bytes * (1 + full) + lc.cp_bwd_bytes) + lc.outside_cp_bytes);
  r.comm.tensor_parallel += ls * lc.opt_comm_bytes + lc.opt_comm_outside_bytes;
  if (p.tp > 1)  // the tp gradient all_reduces in buckets (ring: 2 (tp-1)/tp of the buffer)
    r.comm.tensor_parallel += 2.0 * double(p.tp - 1) / double(p.tp) *
                              (ls * lc.opt_bucketed_tp_bytes + lc.opt_bucketed_tp_outside_bytes);
  r.comm.pipeline = p.pp > 1 ? m * 2 * v * p2p_bytes : 0.0;
  r.comm.data_parallel = dp_bytes;

  // ---- throughput
  const double tokens = double(job_.global_batch) * double(job_.seq);
  const double fwd_token = model_flops_per_token() / 3;
  const double head_token = 2.0 * double(d.hidden) * double(d.vocab);
  const double layers_fwd_token = fwd_token - head_token;
  r.model_flops = 3 * fwd_token * tokens;
  double extra = 0;
  if (p.recompute == Recompute::kFull) extra = layers_fwd_token * full;
  if (p.recompute == Recompute::kSelective)
    extra = k_.selective_is_op_sac ? 2.0 * double(d.layers) * op_sac_recomputed_params(d)
                                   : 4.0 * double(d.layers) * double(job_.seq) * double(d.hidden);
  r.hardware_flops = r.model_flops + extra * tokens;
  const double n = double(p.devices());
  r.tokens_per_s = tokens / r.step_time_s;
  r.tflops_per_gpu = r.hardware_flops / r.step_time_s / n / 1e12;
  r.mfu = r.model_flops / r.step_time_s / (n * cl.peak_flops(dtype_));
  r.reserved_memory = r.memory.total * k_.allocator_reserved_ratio;
  return r;
}

}  // namespace meshflow::plan
