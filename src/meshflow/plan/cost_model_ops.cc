// The cost model's per-operator layout (Plan::ops): the strategy search
// (parallel/strategy_search.h) of a job's program on the tp axis, and the
// activations such a plan keeps under the Megatron memory model. Pricing
// itself is in cost_model.cc, like every other layout's.
#include <algorithm>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/parallel/strategy_search.h"
#include "meshflow/plan/cost_model.h"
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

Result<double> CostModel::layer_activations(const Plan& p) const {
  const double act = double(dtype_size(dtype_));
  if (!p.ops) return layer_activation_bytes(dims_, p, job_.seq, k_.attention, act);
  // A per-operator plan keeps what its program's backward reads: Korthikanti's
  // count for the Megatron layout at the same degrees, scaled by the ratio of
  // the two programs' stashed forward values per block.
  Plan megatron = p;
  megatron.ops = false, megatron.searched = nullptr, megatron.sp = false;
  const auto key = std::make_pair(p.tp, p.micro_batch);
  double ratio = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = stash_ratio_cache_.find(key); it != stash_ratio_cache_.end()) ratio = it->second;
  }
  if (ratio == 0) {
    MF_ASSIGN_OR_RETURN(const std::shared_ptr<const StrategySearch> searched,
                        op_search(p.tp, p.micro_batch));
    double per_block[2] = {0, 0};
    for (int layout = 0; layout < 2; ++layout) {
      double bytes[2] = {0, 0};
      for (int64_t blocks = 1; blocks <= 2; ++blocks) {
        RankShape shape{p.micro_batch, job_.seq, p.tp, 1, false, Recompute::kNone, blocks};
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
  return ratio * layer_activation_bytes(dims_, megatron, job_.seq, k_.attention, act);
}

Result<std::shared_ptr<const StrategySearch>> CostModel::op_search(int64_t tp,
                                                                   int64_t micro_batch) const {
  MF_RETURN_IF_ERROR(status_);
  const auto key = std::make_pair(tp, micro_batch);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = op_search_cache_.find(key);
    if (it != op_search_cache_.end()) return *it->second;
  }
  auto solve = [&]() -> Result<std::shared_ptr<const StrategySearch>> {
    // The program the trainer builds (forward, backward, the default
    // optimizer), whole: identical blocks are tied, so the model's own block
    // count weighs its blocks against its embedding and head. (Capped: past
    // 16 blocks the weights hardly move.)
    const int64_t all_blocks = num_blocks(job_.model);
    const int64_t built = std::min<int64_t>(all_blocks, 16);
    const ModelConfig model = all_blocks > 16 ? with_blocks(job_.model, 16) : job_.model;
    MF_ASSIGN_OR_RETURN(ModelGraph m, build_model(model, micro_batch, job_.seq));
    try {
      append_backward(m.graph);
    } catch (const StatusError& e) {
      return e.status().with_context("the strategy search's program");
    }
    append_optimizer(m.graph, RunConfig{}.optimizer);
    Plan p;
    p.tp = tp;
    MF_ASSIGN_OR_RETURN(const Mesh mesh, Mesh::parse("dp=1,tp=" + std::to_string(tp)));
    StrategySearchOptions o;
    o.cost = reshard_costs(cluster_, mesh, {axis_stride(p, "dp"), axis_stride(p, "tp")},
                           int64_t(dtype_size(dtype_)));
    o.node_time_s = [this](const Graph& g, const Node& n) {
      const OpCost c = op_cost(g, n);
      return roofline_time_s(c.flops, c.bytes);
    };
    // The device's memory, for the blocks built (a cut model holds a share).
    o.memory_budget_bytes = k_.usable_memory_fraction * double(cluster_.device.memory_bytes) *
                            (all_blocks > built ? double(built) / double(all_blocks) : 1.0);
    o.activation_bytes = double(dtype_size(dtype_));
    o.batch_axes = {"dp"};
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
  auto shared = std::make_shared<const Result<std::shared_ptr<const StrategySearch>>>(solve());
  std::lock_guard<std::mutex> lock(mu_);
  op_search_cache_.emplace(key, shared);
  return *shared;
}

}  // namespace meshflow::plan
