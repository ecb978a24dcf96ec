#include "meshflow/plan/rank_program.h"

#include <nlohmann/json.hpp>
#include <string>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/autodiff/recompute.h"
#include "meshflow/core/glob.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/parallel/configured.h"
#include "meshflow/parallel/seq_balance.h"
#include "meshflow/plan/auto_plan.h"
#include "meshflow/runtime/run_config.h"

namespace meshflow::plan {

ModelConfig with_blocks(const ModelConfig& model, int64_t blocks) {
  ModelConfig m = model;
  if (auto* g = std::get_if<GptConfig>(&m)) g->n_layer = blocks;
  if (auto* l = std::get_if<LlamaConfig>(&m)) l->num_hidden_layers = blocks;
  return m;
}

int64_t num_blocks(const ModelConfig& model) {
  if (const auto* g = std::get_if<GptConfig>(&model)) return g->n_layer;
  if (const auto* l = std::get_if<LlamaConfig>(&model)) return l->num_hidden_layers;
  return 0;
}

int64_t axis_stride(const Plan& p, const std::string& axis) {
  if (axis == "tp") return 1;
  if (axis == "cp") return p.tp;
  if (axis == "dp") return p.tp * p.cp;
  return p.tp * p.cp * p.dp;  // pp
}

std::shared_ptr<ReshardPlanCache> ReshardPlanCaches::for_links(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<ReshardPlanCache>& c = caches_[key];
  if (!c) c = std::make_shared<ReshardPlanCache>();
  return c;
}

Result<LocalProgram> build_rank_program(const ModelConfig& model, const RankShape& s,
                                        const Cluster& cluster, int64_t bytes_per_element,
                                        std::shared_ptr<const Annotation>* strategy,
                                        ReshardPlanCaches* reshard_plans) {
  const ModelConfig cut = num_blocks(model) > 0 ? with_blocks(model, s.blocks) : model;
  const bool dp_in = s.dp > 1 && (s.zero > 0 || s.with_dp);
  const int64_t replicas = dp_in ? s.dp : 1;
  MF_ASSIGN_OR_RETURN(ModelGraph m, build_model(cut, s.micro_batch * replicas, s.seq));
  Graph& g = m.graph;
  // Ring attention runs its sequence in zigzag order (the preset's default,
  // parallel/seq_balance.h): every rank does the same causal work. So does a
  // searched plan on cp (parallel_section writes ring_order "zigzag").
  if ((s.ring || s.ops) && s.cp > 1 && num_blocks(model) > 0) {
    Result<SeqBalance> sb = balance_sequence(g, s.cp);
    if (!sb.is_ok()) return sb.status().with_context("the planner's ring program");
  }
  try {
    append_backward(g);
  } catch (const StatusError& e) {
    return e.status().with_context("the planner's program");
  }
  if (s.recompute != Recompute::kNone) {
    RecomputePolicy rp;
    rp.mode =
        s.recompute == Recompute::kFull ? RecomputePolicy::kFull : RecomputePolicy::kSelective;
    if (s.recompute == Recompute::kFull) rp.layers = s.recompute_blocks;
    MF_RETURN_IF_ERROR(apply_recompute(g, rp).with_context("pricing recompute"));
  }
  if (s.optimizer) append_optimizer(g, RunConfig{}.optimizer);
  Plan p;
  p.tp = s.tp, p.cp = s.cp, p.sp = s.sp, p.ring = s.ring;
  if (dp_in) p.dp = s.dp, p.zero = s.zero;
  p.ops = s.ops != nullptr, p.searched = s.ops;
  MF_ASSIGN_OR_RETURN(nlohmann::json section, parallel_section(p, model));
  if (section.contains("strategies")) {
    // A program cut to fewer blocks than the model has: the searched keys for
    // blocks it lacks ("h.??.mlp.c_fc" past block 9) name none of its nodes.
    nlohmann::json kept = nlohmann::json::object();
    for (const auto& [key, splits] : section["strategies"].items())
      for (const Node& n : g.nodes())
        if (glob_match(key, n.name)) {
          kept[key] = splits;
          break;
        }
    section["strategies"] = kept;
  }
  if (section.value("mode", "data") == "data") {
    LocalProgram lp;
    lp.graph = std::move(g);
    lp.mesh = Mesh::line(1, "dp");
    return lp;
  }
  MF_ASSIGN_OR_RETURN(StrategyConfig pc, parse_strategy_config(section, "parallel (planned)"));
  const Mesh& mesh = pc.mesh;
  std::vector<int64_t> strides;
  for (int a = 0; a < mesh.num_axes(); ++a) strides.push_back(axis_stride(p, mesh.axis_name(a)));
  ReshardCostModel cost = reshard_costs(cluster, mesh, strides, bytes_per_element);
  if (reshard_plans) {
    std::string key = mesh.to_string() + " " + std::to_string(bytes_per_element);
    for (int64_t st : strides) key += " " + std::to_string(st);
    cost.plans = reshard_plans->for_links(key);
  }
  std::shared_ptr<const Annotation> shared = strategy ? *strategy : nullptr;
  if (!shared) {
    MF_ASSIGN_OR_RETURN(
        Annotation a,
        annotate_config(g, mesh, pc, "the planned " + summarize(model, s.seq).kind, &cost));
    a.one_norm_reduction = !s.pipeline;
    shared = std::make_shared<const Annotation>(std::move(a));
    if (strategy) *strategy = shared;
  }
  return lower(g, *shared, /*rank=*/0, cost);
}

}  // namespace meshflow::plan
