// The program one rank runs under a plan, built the way the engine builds it,
// for the planner to price node by node: the model's own builder
// (models/from_config.h) with the model cut to `blocks` transformer blocks,
// autodiff, the recompute pass, then the SPMD partitioner (parallel/configured.h)
// on the plan's mesh, annotated from plan::parallel_section, the same section
// `meshflow plan --out` writes and the trainer runs. So the planner prices the
// ops, local shapes and collectives that run, for any model the engine builds
// (GPT, LLaMA, the MLP), not a hand-written copy of a layer.
//
//   RankShape s{.micro_batch = 2, .seq = 2048, .tp = 8, .cp = 1, .blocks = 1};
//   MF_ASSIGN_OR_RETURN(LocalProgram p, build_rank_program(model, s, cost));
//   for (const Node& n : p.graph.nodes()) ...      // the per-rank program
//
// The mesh is cp x tp with dp = 1: a rank's forward and backward do not depend
// on how many replicas there are, and the gradient reduction over dp is priced
// by the cost model (bucketed and overlapped as the data-parallel runtime runs
// it). The optimizer's nodes only with RankShape::optimizer (the cost model
// prices the update itself as memory-bound work, and the optimizer phase's
// collectives from the program).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "meshflow/core/status.h"
#include "meshflow/models/from_config.h"
#include "meshflow/parallel/partition.h"
#include "meshflow/plan/cluster.h"
#include "meshflow/plan/plan.h"

namespace meshflow::plan {

struct RankShape {
  int64_t micro_batch = 1;  // sequences (examples) one rank runs per micro-batch
  int64_t seq = 1;          // the full sequence (ignored by the MLP)
  int64_t tp = 1;
  int64_t cp = 1;
  bool sp = false;
  Recompute recompute = Recompute::kNone;
  // Transformer blocks of the program (node.layer 0 .. blocks-1); a model
  // without blocks (the MLP) is built whole.
  int64_t blocks = 1;
  // The optimizer a run config gets by default (AdamW, global-norm clipping's
  // norm), so the collectives of the optimizer phase are in the program.
  bool optimizer = false;
  // Lowered for a pipeline split (pipeline/stage_graph.h), as the pipeline
  // trainer lowers it: the gradient norm's sums of squares are exchanged per
  // parameter between the chunks, not reduced as one.
  bool pipeline = false;
  // Per-operator strategies (a plan's Plan::searched) in place of the
  // Megatron template on tp; null: the template.
  std::shared_ptr<const StrategySearch> ops = nullptr;
  bool ring = false;  // cp as ring attention (Plan::ring)
  // ZeRO over dp replicas (zero > 0): the program of one replica of dp, the
  // batch (micro_batch x dp rows) split over them and the optimizer state,
  // gradients or weights sharded as the runtime runs it, for the executor's
  // arena (CostModel::arena_bytes). The times keep dp = 1 (the cost model
  // prices the data-parallel collectives itself).
  int64_t dp = 1;
  int zero = 0;
  // The program of one of dp replicas without ZeRO too (zero 0): how its
  // gradients reduce over dp and the rest (CostModel::grads_in_buckets).
  bool with_dp = false;
  // Under full recompute, the blocks (node.layer) that recompute; empty:
  // every block (Plan::recompute_layers: the first N of each chunk).
  std::vector<int> recompute_blocks = {};
};

// The model with `blocks` transformer blocks (GPT n_layer, LLaMA
// num_hidden_layers); a model without blocks unchanged.
ModelConfig with_blocks(const ModelConfig& model, int64_t blocks);

// Transformer blocks of the model (0 for a model without blocks).
int64_t num_blocks(const ModelConfig& model);

// The stride of a mesh axis in the planner's device order (rank = ((pp * dp +
// d) * cp + c) * tp + t, as Megatron-LM: tp innermost), which decides the link
// an axis's collectives use. axis: "tp", "cp", "dp" or "pp".
int64_t axis_stride(const Plan& p, const std::string& axis);

// The reshard planner's answers kept across the rank programs of one
// cluster: one ReshardPlanCache per (mesh, axis strides, bytes per element),
// whose links those decide (a CostModel holds one).
class ReshardPlanCaches {
 public:
  std::shared_ptr<ReshardPlanCache> for_links(const std::string& key);

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<ReshardPlanCache>> caches_;
};

// The per-rank program of rank 0 (every rank of a cp x tp group runs the same
// ops at the same shapes), on the mesh the section names (dp = 1), the
// reshard planner pricing each axis on the cluster link its stride maps to
// (reshard_costs). Errors: the model cannot be built at these shapes, or the
// plan's section does not partition it (names the dim and degree).
//
// `strategy` (may be null) caches the partitioner's annotation: when it holds
// one, the program is lowered with it instead of annotating again (the
// strategy of the same model and degrees at another micro-batch: annotating
// is most of the cost); when empty, it receives the one chosen. No axis of
// this mesh splits the batch, but the partitioner's choices weigh sizes that
// grow with it (a table against its tokens), so a run at another
// micro-batch may choose otherwise: CostModel::set_exact_strategies keys it
// by the micro-batch too (the search's leaders, local auto mode).
//
// `reshard_plans` (may be null) keeps the reshard planner's answers across
// programs (ReshardPlanCaches above).
Result<LocalProgram> build_rank_program(const ModelConfig& model, const RankShape& s,
                                        const Cluster& cluster, int64_t bytes_per_element,
                                        std::shared_ptr<const Annotation>* strategy = nullptr,
                                        ReshardPlanCaches* reshard_plans = nullptr);

}  // namespace meshflow::plan
