// The cost model's per-operator layout (Plan::ops): the strategy search
// (parallel/strategy_search.h) of a job's program on the tp axis, the
// activations a block keeps under the Megatron memory model (Korthikanti's
// count, layer_activation_bytes; a per-operator plan's scaled by its
// program's), the arena of meshflow's executor (static_arena_bytes,
// arena_bytes), and a node's time on the device. Pricing itself is in
// cost_model.cc, like every other layout's.
#include <algorithm>
#include <exception>
#include <future>
#include <mutex>
#include <utility>
#include <vector>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/ops/matmul_dims.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/zigzag.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/parallel/seq_balance.h"
#include "meshflow/parallel/strategy_search.h"
#include "meshflow/plan/cost_model.h"
#include "meshflow/runtime/grad_buckets.h"
#include "meshflow/runtime/memory_plan.h"
#include "meshflow/runtime/run_config.h"

namespace meshflow::plan {

namespace {

std::string str(int64_t x) {
  return std::to_string(x);
}

// Bytes of the forward values a program's backward reads (the activations a
// micro-batch keeps), f32 values counted at `f32_bytes` per element (the
// compute dtype).
double forward_stash_bytes(const Graph& g, double f32_bytes) {
  std::vector<char> read_back(static_cast<size_t>(g.num_values()), 0);
  for (const Node& n : g.nodes())
    if (n.phase == Phase::kBackward)
      for (ValueId v : n.inputs) read_back[static_cast<size_t>(v)] = 1;
  double bytes = 0;
  for (const Node& n : g.nodes()) {
    if (n.phase != Phase::kForward || n.inputs.empty()) continue;
    for (ValueId v : n.outputs) {
      if (!read_back[static_cast<size_t>(v)]) continue;
      const DType dt = g.value(v).dtype;
      bytes += double(g.shape(v).numel()) * (dt == DType::F32 ? f32_bytes : double(dtype_size(dt)));
    }
  }
  return bytes;
}

}  // namespace

double ring_attention_pass_bytes(const Graph& g, const Node& n) {
  if (n.kind != OpKind::kAttention && n.kind != OpKind::kAttentionGrad) return 0;
  const bool fwd = n.kind == OpKind::kAttention;
  const int64_t ring = n.attrs.mesh_axis >= 0 ? n.attrs.group_size : 1;
  const Shape& q = g.shape(n.inputs[fwd ? 0 : 1]);
  const Shape& kv = g.shape(n.inputs[fwd ? 1 : 2]);
  if (ring <= 1 || q.size(2) != kv.size(2)) return 0;
  const double nq = double(q.numel()), block = 2.0 * double(kv.numel()), steps = double(ring);
  // A copy reads and writes its bytes; a fill writes them.
  const double passes =
      fwd ? nq + 2 * block + (steps - 1) * 2 * block
          : nq + 2 * block + (steps - 1) * 2 * block  // dq zeroed; packed; received
                + steps * block                       // each step's share zeroed
                + (steps - 1) * 3 * block             // an arriving accumulator added in
                + steps * 2 * block + 2 * block;      // accumulators received; dk, dv out
  return 4.0 * passes;
}

// The seconds one node of a rank program takes on this device.
double CostModel::node_time_s(const Graph& g, const Node& n) const {
  const OpCost c = op_cost(g, n);
  const double byte_scale = double(dtype_size(dtype_)) / 4.0;  // OpCost counts f32
  double t = 0;
  if (n.kind == OpKind::kAttention || n.kind == OpKind::kAttentionGrad) {
    const bool fwd = n.kind == OpKind::kAttention;
    const Shape& q = g.shape(n.inputs[fwd ? 0 : 1]);
    const Shape& k = g.shape(n.inputs[fwd ? 1 : 2]);
    const int64_t tq = q.size(2), tk = k.size(2);
    const double rows = double(q.size(0)) * double(q.size(1));
    if (k_.attention == AttentionKernel::kMaterialized) {
      // Batched GEMMs over all tq x tk scores (the mask is applied after), the
      // score matrix streamed through memory between them.
      const double scores = rows * double(tq) * double(tk);
      const double gemm_flops = (fwd ? 4.0 : 8.0) * scores * double(q.size(3));
      const double per_score =
          fwd ? k_.materialized_fwd_bytes_per_score : k_.materialized_bwd_bytes_per_score;
      // The batched GEMMs step from head to head by d_head elements. cuBLAS's
      // tensor-op kernels load their operands in 16-byte vectors (NVIDIA's
      // "Matrix Multiplication Background User's Guide", Tensor Core
      // Requirements: dimensions and strides in multiples of 16 bytes); where
      // d_head's bytes are not a multiple of 16 the heads' matrices are
      // misaligned and the GEMMs run on the CUDA cores, at the device's f32
      // rate. BigScience's 2022 topology benchmarks show it: h 13824 with 128
      // heads (d_head 108) measured 26-44% slower per step than with 64 or 96
      // heads in the same layout (public_runs rows 221/222/256, 252-254).
      const bool tensor_cores = (q.size(3) * dtype_size(dtype_)) % 16 == 0;
      const double gemm_t = tensor_cores ? compute_time_s(gemm_flops / 2) * 2
                                         : 2 * cluster_.matmul_time_s(gemm_flops / 2, DType::F32) /
                                               k_.matmul_efficiency_scale;
      t = gemm_t + cluster_.memory_time_s(scores * per_score + c.bytes * byte_scale);
    } else if (k_.attention == AttentionKernel::kBlockedCpu) {
      constexpr int64_t kBlockQ = 64;  // kernels/cpu/attention.cc
      const double gemms = fwd ? 2.0 : 5.0;
      const int64_t d_head = q.size(3);
      double gemm_t = 0;
      const int64_t ring = n.attrs.mesh_axis >= 0 ? n.attrs.group_size : 1;
      if (ring > 1 && tq == tk) {
        // Ring attention (kernels/cpu/ring_attention.cc): at each of its
        // steps the visiting k/v block's GEMMs in tiles of kRingTileRows
        // query rows, each against the keys its rows see (ops/zigzag.h
        // ring_step_blocks); the step waits for the rank with the most.
        for (int64_t r = 0; r < ring; ++r) {
          double rank_t = 0;
          for (int64_t src = 0; src < ring; ++src) {
            for (const RingBlock& b : ring_step_blocks(tq, tq * ring, n.attrs.seq_zigzag, r, src,
                                                       n.attrs.causal, kRingTileRows))
              rank_t += compute_time_s(
                  2.0 * double(b.rows) * double(b.cols) * double(d_head),
                  cluster_.matmul_shape_factor(double(b.rows), double(b.cols), double(d_head)));
          }
          gemm_t = std::max(gemm_t, rank_t);
        }
      } else {
        for (int64_t i0 = 0; i0 < tq; i0 += kBlockQ) {
          const int64_t r = std::min(kBlockQ, tq - i0);
          const int64_t keys = std::clamp<int64_t>(i0 + r + tk - tq, 0, tk);
          gemm_t +=
              compute_time_s(2.0 * double(r) * double(keys) * double(d_head),
                             cluster_.matmul_shape_factor(double(r), double(keys), double(d_head)));
        }
      }
      // Ring attention's copies and fills beyond the GEMMs' tiles, on the
      // rank's thread (ring_attention_pass_bytes).
      t = std::max(rows * gemms * gemm_t, cluster_.memory_time_s(c.bytes * byte_scale)) +
          cluster_.memory_time_s(ring_attention_pass_bytes(g, n));
    } else {
      // Fused (FlashAttention): at the kernel's own efficiency at this call's
      // key length where the cluster file gives it, else on the GEMM curve.
      const auto& kernels = cluster_.device.attention_efficiency;
      const auto it = kernels.find(k_.fused_attention);
      const double eff = it == kernels.end() ? 0 : it->second.at(double(tk), fwd);
      t = eff > 0
              ? std::max(cluster_.compute_bound_time_s(c.flops, cluster_.peak_flops(dtype_), eff),
                         cluster_.memory_time_s(c.bytes * byte_scale))
              : roofline_time_s(c.flops, c.bytes * byte_scale);
    }
  } else if (n.kind == OpKind::kMatMul) {
    // One GEMM per batch element: the curve by its FLOPs, and by its shape
    // where the cluster file measured thin GEMMs (Cluster::matmul_shape_factor).
    double f = 1.0;
    if (!cluster_.device.matmul_thin_efficiency.empty()) {  // (none in the GPU files)
      const Result<MatMulDims> d = matmul_dims(g, n);
      if (d.is_ok()) f = cluster_.matmul_shape_factor(double(d->M), double(d->N), double(d->K));
    }
    if (job_.fp8 && n.layer >= 0) {
      // A block's linear in FP8 (TrainingJob::fp8). Each of its three GEMMs
      // reads two of the three operands (x, W, dy), each cast once from the
      // compute dtype into both layouts the GEMMs read (read 2 bytes, write
      // 1 + 1: torchao's float8 roofline, roofline_utils.py, its amax fused
      // into the producer; Transformer Engine's cast_transpose) and read by
      // two GEMMs: 2 bytes an input element a GEMM, on top of its own traffic
      // at 1 byte. The weight's cast is the step's where the stack caches it
      // (CostConstants::fp8_weight_cache). Rowwise scaling casts each
      // operand per GEMM along that GEMM's reduction axis, one layout: read
      // 2, write 1, with its amax in the same pass along a row (the forward's
      // two operands, dy in the input gradient) or in a pass of its own
      // along a column (the other three): 4 bytes an input element on
      // average, on kernels at fp8_rowwise_gemm_efficiency of the rate.
      const bool rowwise = job_.fp8_scaling == Fp8Scaling::kRowwise;
      double in = 0;
      for (ValueId v : n.inputs) {
        const NodeId from = g.value(v).producer;
        if (k_.fp8_weight_cache && !rowwise && from >= 0 && g.node(from).kind == OpKind::kParameter)
          continue;
        in += double(g.shape(v).numel());
      }
      const double cast = (rowwise ? 4.0 : 2.0) * in;
      const double gemm =
          cluster_.fp8_matmul_time_s(c.flops) /
          (k_.matmul_efficiency_scale * f * (rowwise ? k_.fp8_rowwise_gemm_efficiency : 1.0));
      t = std::max(gemm, cluster_.memory_time_s(c.bytes * byte_scale * 0.5)) +
          cluster_.memory_time_s(cast);
    } else {
      t = std::max(compute_time_s(c.flops, f), cluster_.memory_time_s(c.bytes * byte_scale));
    }
  } else {
    // (kernel_scale: the calibration's measured time over this roofline for
    // the kinds it lists, the local CPU's windowed and per-channel kernels.)
    t = roofline_time_s(c.flops, c.bytes * byte_scale) * k_.elementwise_cost *
        cluster_.device.kernel_scale(n.kind);
  }
  return t;
}

const char* fp8_scaling_name(Fp8Scaling s) {
  return s == Fp8Scaling::kRowwise ? "rowwise" : "tensorwise";
}

Result<Fp8Scaling> parse_fp8_scaling(const std::string& name, const std::string& what) {
  if (name == "tensorwise") return Fp8Scaling::kTensorwise;
  if (name == "rowwise") return Fp8Scaling::kRowwise;
  return Status::invalid(what +
                         " must be tensorwise (one scale a tensor) or rowwise (one a row: "
                         "torchao's rowwise recipe), got '" +
                         name + "'");
}

double op_sac_recomputed_params(const TransformerDims& d) {
  const double h = double(d.hidden), f = double(d.ffn), kv = double(d.kv_heads * d.head_dim);
  return d.llama ? h * kv + h * h + h * f : h * h + f * h;  // wk, wo, w3; proj, fc2
}

double op_sac_matmul_share(const TransformerDims& d) {
  const double h = double(d.hidden), f = double(d.ffn), kv = double(d.kv_heads * d.head_dim);
  const double all = d.llama ? 2 * h * h + 2 * h * kv + 3 * h * f : 4 * h * h + 2 * f * h;
  return all > 0 ? op_sac_recomputed_params(d) / all : 0.0;
}

double layer_activation_bytes(const TransformerDims& d, const Plan& p, int64_t seq,
                              AttentionKernel attention, double act_bytes, bool op_sac,
                              bool eager) {
  // Korthikanti et al. 2022, in units of 2 bytes (16-bit) per element, for s
  // local tokens (seq / cp), b sequences, h hidden, t = tp.
  const double s = double(seq) / double(p.cp), b = double(p.micro_batch), h = double(d.hidden),
               t = double(p.tp), a = double(d.heads), f = double(d.ffn),
               kv = double(d.kv_heads) * double(d.head_dim);
  const double sbh = s * b * h, e = act_bytes / 2.0;  // e scales 16-bit counts to act_bytes
  if (p.recompute == Recompute::kFull) return 2 * sbh * e / (p.sp ? t : 1.0);
  if (p.recompute == Recompute::kSelective && op_sac) {
    // TorchTitan's op-level SAC keeps the block's input, the outputs of the
    // matmuls it saves (LLaMA: wq, wv, w1 split over tp, and w2's whole
    // partial sum before its reduction; GPT: qkv and fc1), the attention's
    // output and f32 log-sum-exp, and with sequence parallelism the two
    // reduce_scatters' outputs (sequence-split). Eager PyTorch caches every
    // output its policy saves; compiled, the partitioner keeps those the
    // backward reads, which drops w2's output and the reduce_scatter after
    // the MLP (they feed the residual add alone): 13.0 B a token and hidden
    // unit measured for LLaMA-3 8B, 15.0 eager (docs/cluster.md).
    const double split = d.llama ? sbh + s * b * kv + sbh + s * b * f : 3 * sbh + sbh + s * b * f;
    const double whole = d.llama && eager ? sbh : 0.0;
    const double scattered = p.sp && p.tp > 1 ? (eager ? 2 : 1) * sbh / t : 0.0;
    return 2 * e * (sbh / (p.sp ? t : 1.0) + split / t + whole + scattered) + 4 * a * s * b / t;
  }
  const double scores_fused = 4 * a * s * b;  // the fused kernel's f32 log-sum-exp per row
  if (eager && d.llama && p.recompute == Recompute::kNone) {
    // A LLaMA block as TorchTitan writes it, run by eager PyTorch, keeps its
    // Python's intermediates: each RMSNorm its input's f32 copy and its
    // 16-bit output (the linears' input), RoPE its f32 q and k, SDPA the K
    // and V repeated to every head, SwiGLU w1's and w3's outputs, silu's and
    // their product. 53 B a token and hidden unit for LLaMA-3 8B, measured
    // 52.0 (docs/cluster.md; Korthikanti's count, 34, is the compiled one's
    // 36.5). No f32 copies where the activations are f32 already.
    const double up = act_bytes < 4 ? 4.0 : 0.0;
    const double replicated = 2 * (up + act_bytes) * sbh;
    const double split =
        act_bytes * (sbh + 2 * sbh + sbh + 4 * s * b * f) + up * (sbh + s * b * kv);
    const double scores = attention == AttentionKernel::kMaterialized
                              ? 2 * e * a * s * double(seq) * b
                              : scores_fused;
    return replicated / (p.sp ? t : 1.0) + (split + scores) / t;
  }
  // Replicated region: two norm inputs (4), the QKV and MLP inputs (2 + 2),
  // and 1-byte dropout masks after attention and the MLP (1 + 1).
  const double masks = d.dropout ? 2 * sbh : 0;
  const double replicated = (8 * sbh) * e + masks;
  // Tensor-parallel region: Q (2sbh), K and V (2 x 2 s b kv), the output
  // projection's input (2sbh); the MLP's ffn-wide tensors: GeLU input and
  // output (2 x 2sbf) for GPT, gate, up and their product (3 x 2sbf) for SwiGLU.
  const double ffn_tensors = d.llama ? 3 : 2;
  const double split = (4 * sbh + 4 * s * b * kv + ffn_tensors * 2 * s * b * f) * e;
  // Attention scores: softmax output (2), dropout mask (1) and output (2) per
  // element when materialized (the dropout ones only with dropout); fused
  // attention keeps only the f32 log-sum-exp per row.
  const double score_bytes = d.dropout ? 5 : 2;
  double scores = attention == AttentionKernel::kMaterialized
                      ? score_bytes * e * a * s * double(seq) * b
                      : scores_fused;
  if (p.recompute == Recompute::kSelective) scores = 0;
  return (replicated / (p.sp ? t : 1.0)) + (split + scores) / t;
}

// The executor's arena for a local program (runtime/executor.cc): sources have
// their own storage, the loss and the parameter gradients stay alive to the
// end, everything else is planned over the graph order.
double static_arena_bytes(const Graph& g, const std::vector<ValueId>& kept) {
  std::vector<char> persistent(g.num_values(), 0), keep(g.num_values(), 0);
  std::vector<char> elsewhere(g.num_nodes(), 0);  // the gradient all_reduces the buckets run
  for (const GradientSync& s : gradient_syncs(g))
    for (NodeId id : s.reduce) {
      elsewhere[id] = 1;
      persistent[g.node(id).outputs[0]] = 1;
    }
  std::vector<NodeId> order;
  for (NodeId i = 0; i < g.num_nodes(); ++i) {
    const Node& n = g.node(i);
    if (elsewhere[i]) continue;
    order.push_back(i);
    if (is_source(n.kind))
      for (ValueId v : n.outputs) persistent[v] = 1;
  }
  if (g.loss != kNoValue) keep[g.loss] = 1;
  for (ValueId v : kept)
    if (!persistent[v]) keep[v] = 1;
  for (const auto& [param, grad] : g.grad_of_param)
    if (!persistent[grad]) keep[grad] = 1;
  return double(plan_memory(g, order, persistent, keep).arena_bytes);
}

Result<double> CostModel::arena_bytes(const Plan& p, int64_t layers) const {
  MF_RETURN_IF_ERROR(status_);
  // The arenas of the rank programs of one and of two blocks at p's shapes,
  // without ZeRO or with it (`zero`: the program of one of dp replicas with
  // the optimizer phase, as the runtime runs ZeRO: gradients reduced to
  // shards in the backward or kept whole for the optimizer phase's
  // reduce_scatter, the gathers after). `mixed`: the second is the two-block
  // program whose first block alone recomputes (cached as recompute 3).
  auto program_arenas = [&](const Plan& q, bool zero,
                            bool mixed) -> Result<std::pair<double, double>> {
    // (A model without blocks recomputes its first recompute_layers blocks:
    // a ResNet's residual layers, in its one program.)
    const int first = has_blocks() ? 0 : static_cast<int>(q.recompute_layers);
    const auto key = std::make_tuple(
        q.tp, q.cp, q.micro_batch, int(q.sp) + (q.ops ? 2 : 0) + (q.ring ? 4 : 0),
        mixed ? 3 : int(q.recompute) + 4 * first, zero ? q.zero : 0, zero ? q.dp : 1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = arena_cache_.find(key);
      if (it != arena_cache_.end()) return it->second;
    }
    double bytes[2] = {0, 0};
    // A model without blocks: its one whole program (nothing to extrapolate).
    const int64_t programs = has_blocks() ? 2 : 1;
    for (int64_t n = mixed ? 2 : 1; n <= programs; ++n) {
      RankShape shape{q.micro_batch, job_.seq, q.tp, q.cp, q.sp, q.recompute, n};
      shape.ring = q.ring;
      if (mixed) shape.recompute_blocks = {0};
      if (q.recompute == Recompute::kFull)
        for (int b = 0; b < first; ++b) shape.recompute_blocks.push_back(b);
      if (zero) shape.dp = q.dp, shape.zero = q.zero, shape.optimizer = true;
      if (q.ops) {
        MF_ASSIGN_OR_RETURN(shape.ops, op_search(q.tp, q.cp, q.micro_batch));
      }
      MF_ASSIGN_OR_RETURN(LocalProgram lp, rank_program(shape));
      bytes[n - 1] = static_arena_bytes(lp.graph);
    }
    if (programs == 1) bytes[1] = bytes[0];
    const std::pair<double, double> a = {bytes[0], bytes[1]};
    std::lock_guard<std::mutex> lock(mu_);
    arena_cache_.emplace(key, a);
    return a;
  };
  // ZeRO moves gradients, shards and gathers through the arena: its own
  // program (CostConstants::zero_arena_program), else the arena without it.
  // Weights grouping all_reduces whole gradients in the buckets, as ZeRO-0
  // does: the program without ZeRO's.
  const bool zero = k_.zero_arena_program && p.zero > 0 && p.dp > 1 && !p.group;
  layers = std::max<int64_t>(layers, 1);
  MF_ASSIGN_OR_RETURN(const auto a, program_arenas(p, zero, false));
  const int64_t n = p.recompute == Recompute::kFull && has_blocks() ? p.recompute_layers : 0;
  if (n <= 0 || n >= layers) return a.first + double(layers - 1) * (a.second - a.first);
  // Only the first n of the blocks recompute (Plan::recompute_layers): from
  // the two-block program whose first block recomputes, each further block
  // adds what a block adds with recompute (n - 1 of them) or without it
  // (layers - n - 1).
  Plan none = p;
  none.recompute = Recompute::kNone;
  MF_ASSIGN_OR_RETURN(const auto mixed, program_arenas(p, zero, true));
  MF_ASSIGN_OR_RETURN(const auto kept, program_arenas(none, zero, false));
  return mixed.second + double(n - 1) * (a.second - a.first) +
         double(layers - n - 1) * (kept.second - kept.first);
}

Result<double> CostModel::layer_activations(const Plan& p) const {
  const double act = double(dtype_size(dtype_));
  const bool op_sac = k_.selective_is_op_sac;
  if (!p.ops)
    return layer_activation_bytes(dims_, p, job_.seq, k_.attention, act, op_sac, k_.eager);
  // A per-operator plan keeps what its program's backward reads: Korthikanti's
  // count for the Megatron layout at the same degrees, scaled by the ratio of
  // the two programs' stashed forward values per block.
  Plan megatron = p;
  megatron.ops = false, megatron.searched = nullptr, megatron.sp = false;
  const auto key = std::make_tuple(p.tp, p.cp, p.micro_batch);
  double ratio = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = stash_ratio_cache_.find(key); it != stash_ratio_cache_.end()) ratio = it->second;
  }
  if (ratio == 0) {
    MF_ASSIGN_OR_RETURN(const std::shared_ptr<const StrategySearch> searched,
                        op_search(p.tp, p.cp, p.micro_batch));
    double per_block[2] = {0, 0};
    for (int layout = 0; layout < 2; ++layout) {
      double bytes[2] = {0, 0};
      for (int64_t blocks = 1; blocks <= 2; ++blocks) {
        RankShape shape{p.micro_batch, job_.seq, p.tp, p.cp, false, Recompute::kNone, blocks};
        if (layout == 1) shape.ops = searched;
        MF_ASSIGN_OR_RETURN(const LocalProgram lp, rank_program(shape));
        bytes[blocks - 1] = forward_stash_bytes(lp.graph, act);
      }
      per_block[layout] = bytes[1] - bytes[0];
    }
    if (per_block[0] <= 0 || per_block[1] <= 0)
      return Status::internal("per-operator plan at tp=" + str(p.tp) +
                              ": a block's stashed activations came out non-positive");
    ratio = per_block[1] / per_block[0];
    std::lock_guard<std::mutex> lock(mu_);
    stash_ratio_cache_.emplace(key, ratio);
  }
  return ratio *
         layer_activation_bytes(dims_, megatron, job_.seq, k_.attention, act, op_sac, k_.eager);
}

Result<std::shared_ptr<const StrategySearch>> CostModel::op_search(int64_t tp, int64_t cp,
                                                                   int64_t micro_batch) const {
  MF_RETURN_IF_ERROR(status_);
  if (fixed_ops_) return fixed_ops_;
  const auto key = std::make_tuple(tp, cp, micro_batch);
  // One solve per key, whichever thread asks first; the others wait for it.
  // (One StrategySearch per key also keeps the caches keyed by its address
  // true: a second solve's object, freed, could lend its address to another.)
  using Answer = Result<std::shared_ptr<const StrategySearch>>;
  std::promise<Answer> mine;
  std::shared_future<Answer> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, inserted] = op_search_cache_.try_emplace(key);
    if (inserted)
      it->second = mine.get_future().share();
    else
      pending = it->second;
  }
  if (pending.valid()) return pending.get();
  auto solve = [&]() -> Result<std::shared_ptr<const StrategySearch>> {
    // The program the trainer builds (forward, backward, the default
    // optimizer), whole: identical blocks are tied, so the model's own block
    // count weighs its blocks against its embedding and head. (Capped: past
    // 16 blocks the weights hardly move.)
    const int64_t all_blocks = num_blocks(job_.model);
    const int64_t built = std::min<int64_t>(all_blocks, 16);
    const ModelConfig model = all_blocks > 16 ? with_blocks(job_.model, 16) : job_.model;
    MF_ASSIGN_OR_RETURN(ModelGraph m, build_model(model, micro_batch, job_.seq));
    // Ring attention over cp runs the sequence in zigzag order (as the rank
    // program and the trainer do), so the search decides for the same nodes.
    if (cp > 1 && all_blocks > 0) {
      Result<SeqBalance> sb = balance_sequence(m.graph, cp);
      if (!sb.is_ok()) return sb.status().with_context("the strategy search's program");
    }
    try {
      append_backward(m.graph);
    } catch (const StatusError& e) {
      return e.status().with_context("the strategy search's program");
    }
    append_optimizer(m.graph, RunConfig{}.optimizer);
    Plan p;
    p.tp = tp, p.cp = cp;
    MF_ASSIGN_OR_RETURN(const Mesh mesh, Mesh::parse(plan_mesh(p)));
    std::vector<int64_t> strides;
    for (int a = 0; a < mesh.num_axes(); ++a) strides.push_back(axis_stride(p, mesh.axis_name(a)));
    StrategySearchOptions o;
    o.cost = reshard_costs(cluster_, mesh, strides, int64_t(dtype_size(dtype_)));
    o.node_time_s = [this](const Graph& g, const Node& n) {
      const OpCost c = op_cost(g, n);
      return roofline_time_s(c.flops, c.bytes);
    };
    // The device's memory, for the blocks built (a cut model holds a share).
    o.memory_budget_bytes = k_.usable_memory_fraction * double(cluster_.device.memory_bytes) *
                            (all_blocks > built ? double(built) / double(all_blocks) : 1.0);
    o.activation_bytes = double(dtype_size(dtype_));
    o.state_copies = 2.0 + double(job_.optimizer_states);  // weights, gradients, the states
    o.batch_axes = {"dp"};
    if (cp > 1 && all_blocks > 0) o.ring_axes = {"cp"};
    // A gradient Partial over cp is summed in the data-parallel reduction
    // over dp x cp (data_parallel_time), in buckets under the last
    // backward: what it adds is its exposed share (overlap_exposed_s while
    // hidden), not a standalone all_reduce. (Over a dp ring it adds less
    // still, about 1/dp; the search is not keyed by dp.)
    if (cp > 1) {
      o.folded_axes = {"cp"};
      // The slowdown on the cp part of the group (dp is not known here).
      const double s = overlap_slowdown_on(ring_link(cp, axis_stride(p, "cp")));
      o.folded_scale = k_.overlap_grad_reduce ? s / (1 + s) : 1.0;
    }
    if (op_deadline_ != std::chrono::steady_clock::time_point::max()) {
      const double left =
          std::chrono::duration<double>(op_deadline_ - std::chrono::steady_clock::now()).count();
      if (left <= 0)
        return Status::invalid("the time limit passed before the per-operator search of tp=" +
                               std::to_string(tp) + " cp=" + std::to_string(cp) + " micro-batch " +
                               std::to_string(micro_batch) + " could start");
      o.time_limit_s = std::min(o.time_limit_s, left);
    }
    Result<StrategySearch> r = search_strategies(m.graph, mesh, o);
    if (!r.is_ok() && o.memory_budget_bytes > 0) {
      // The search's memory term is every stashed activation without
      // recompute: past the budget, it chooses by time alone and the plan's
      // price (recompute, ZeRO, the real memory model) decides whether it fits.
      o.memory_budget_bytes = 0;
      r = search_strategies(m.graph, mesh, o);
    }
    MF_RETURN_IF_ERROR(r.status());
    return std::shared_ptr<const StrategySearch>(
        std::make_shared<const StrategySearch>(std::move(*r)));
  };
  try {
    Answer r = solve();
    mine.set_value(r);
    return r;
  } catch (...) {  // the waiting threads (and later askers) get it too
    mine.set_exception(std::current_exception());
    throw;
  }
}

}  // namespace meshflow::plan
