// Ways a user gives parallel strategies (before the partitioner consumes them):
//
// 1. MindSpore-style split tuples per op: one tuple per input, one entry per
//    input dim saying how many ways (or over which mesh axes) it is split.
//    Entries: a mesh axis name ("dp"), a product ("dp*tp", major first), an
//    integer equal to one axis size or a product of axis sizes (must be unique
//    on the mesh), or 1 (not split).
//      auto st = strategy_from_splits(g, node_id, mesh, "((dp, 1), (1, tp))");  // Result
//      st->inputs / st->outputs: the layouts; outputs derived and validated.
// 2. Mesh-TensorFlow-style layout rules: dim name -> mesh axis.
//      DimRules r = value_or_throw(DimRules::parse("{batch: dp, ffn: tp, heads: tp}"));
//      Layout l = value_or_throw(apply_rules(r, mesh, shape));
//      RulesReport rep = value_or_throw(apply_rules(g, mesh, r));  // rep.needs_reshard
// 3. StrategyConfig: the run config's "parallel" object (strict keys):
//      {"mode": "hybrid", "mesh": {"dp": 2, "tp": 2}, "rules": {"batch": "dp"},
//       "strategies": {"h.*.mlp.c_fc": "((dp, 1), (1, tp))"}}
//      {"mode": "data", "zero": 1, "zero_style": "group"}   // weights grouping
//      StrategyConfig c = value_or_throw(parse_strategy_config(j));
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "meshflow/core/glob.h"
#include "meshflow/core/layout.h"
#include "meshflow/core/mesh.h"
#include "meshflow/core/shape.h"
#include "meshflow/core/status.h"
#include "meshflow/ir/graph.h"
#include "meshflow/ops/sharding_rule.h"

namespace meshflow {

// ---- 1. split tuples ----

// "((dp, 1), (1, tp))" -> {{"dp", "1"}, {"1", "tp"}}. Python tuple syntax:
// "()" is an empty tuple, "(dp,)" a 1-tuple. Entries are returned trimmed
// and unchecked.
Result<std::vector<std::vector<std::string>>> parse_split_tuples(const std::string& text);

// The mesh axes (major first) one entry means: "1" -> {}, "tp" -> {1},
// "dp*tp" -> {0, 1}, "4" -> the unique set of axes (in mesh order, axes of
// size 1 left out) whose sizes multiply to 4. Errors name the entry and what
// the mesh offers ("split 3 ways, but the mesh {dp: 2, tp: 4} splits only 1,
// 2, 4 or 8 ways"; ambiguity lists the candidate axis sets).
Result<std::vector<int>> split_entry_axes(const std::string& entry, const Mesh& mesh);

// "1, 2, 4 or 8": the distinct products of subsets of the mesh's axis sizes.
std::string mesh_split_counts(const Mesh& mesh);

// The input layouts the tuples give node `id`, its derived output layouts,
// validated against the node's ShardingRule. Errors name the node, the input,
// the dim and the sizes.
Result<ShardingStrategy> strategy_from_splits(const Graph& g, NodeId id, const Mesh& mesh,
                                              const std::string& text);

// ---- 2. dim-name rules (Mesh-TensorFlow) ----

struct DimRules {
  // dim name -> mesh axis name, in the order given.
  std::vector<std::pair<std::string, std::string>> rules;
  // Dims that stay whole where the axis does not divide them, instead of an
  // error: the presets' vocabulary (a GPT-2 vocabulary of 50257 on tp=2 keeps
  // the embedding and head replicated, as without vocab parallelism). Every
  // other dim of a preset must divide, like a user's rule.
  std::vector<std::string> may_stay_whole;

  // A JSON object {"batch": "dp", ...}; values must be strings.
  static Result<DimRules> from_json(const nlohmann::json& j);
  // "batch: dp, ffn: tp" or "{batch: dp, ffn: tp}" ('=' also accepted), or a JSON object.
  static Result<DimRules> parse(const std::string& text);
  // The mesh axis of `dim`, or nullptr.
  const std::string* axis_of(const std::string& dim) const;
  // Every mesh axis name a rule's text names ("cp*tp|cp": cp, tp, cp).
  static std::vector<std::string> axes_in(const std::string& text);
  // Every rule's axis exists on `mesh`; error names the rule and the axes.
  Status check(const Mesh& mesh) const;
  std::string to_string() const;  // "{batch: dp, ffn: tp}"
};

// The layout of a value of `shape`: each dim named in the rules is Shard on
// its axis, unless an earlier rule already took that axis for this value
// (then that dim stays replicated): rule order is priority, so
// {heads: tp, seq: tp} shards heads where a value has both, seq elsewhere. A rule dim whose size
// the axis does not divide is an error naming the dim, the sizes and the valid splits.
Result<Layout> apply_rules(const DimRules& rules, const Mesh& mesh, const Shape& shape);

struct RulesReport {
  std::vector<Layout> layouts;        // per value of the graph
  std::vector<NodeId> needs_reshard;  // nodes whose layouts are not a valid strategy
  std::vector<std::string> reasons;   // per entry of needs_reshard: why (validate_strategy)
  bool needs(NodeId id) const;
};

// Applies the rules to every value of `g`, then checks each non-source node:
// do its input layouts with its output layouts form a valid strategy of its
// ShardingRule? The nodes that do not are where the partitioner will insert
// reshards. Errors (a rule that does not divide) name the value and its producer.
Result<RulesReport> apply_rules(const Graph& g, const Mesh& mesh, const DimRules& rules);

// ---- 3. the "parallel" object of the run config ----

// The rules of a named preset on a mesh (rules naming axes the mesh lacks are
// left out): "dp" {batch: dp}; "megatron" {batch: dp, heads: tp, kv_heads: tp,
// ffn: tp, vocab: tp} (column-parallel QKV / fc1, row-parallel out-proj / fc2,
// vocab-parallel embedding, LM head and cross-entropy);
// "megatron-sp" the same + {seq: tp} (norms, dropout and residuals on sequence
// shards: all_gather / reduce_scatter in place of all_reduce); "ulysses"
// {batch: dp, seq: cp} (attention gets its heads split by all_to_all);
// "ring" {batch: dp, heads: tp, kv_heads: tp, ffn: tp, vocab: tp, seq: cp}
// (attention stays on sequence shards: ring attention over cp, Megatron over tp).
DimRules preset_rules(const std::string& preset, const Mesh& mesh);
// On a mesh with a cp axis the Megatron presets also split seq over cp
// ("megatron-sp": over cp*tp), with the attention core on heads over tp*cp
// (Megatron-LM's context parallel, Ulysses-style all_to_all).
// The per-node split tuples a preset adds to its rules ("ulysses": the
// attention core and its gradient on head shards over cp).
std::vector<std::pair<std::string, std::string>> preset_strategies(const std::string& preset,
                                                                   const Mesh& mesh);

struct StrategyConfig {
  std::string mode = "data";         // "data" | "semi" | "hybrid" | "auto"
  std::string preset;                // "" | "dp" | "megatron" | "megatron-sp" | "ulysses" | "ring"
  std::string search = "propagate";  // auto mode: "propagate" | "full"
  int zero = 0;                      // ZeRO stage over the dp axis
  // How stage 1 splits the optimizer over dp: "shard" (every parameter's state
  // and update sliced N ways, the slices all-gathered: ZeRO-1, MindSpore's
  // weights sharding) or "group" (whole parameters balanced by size into N
  // groups, each rank keeps and updates its group's, the owner broadcasts the
  // updated weight: MindSpore's weights grouping, PyTorch's
  // ZeroRedundancyOptimizer, Lightning's "ddp_sharded"). "group" needs zero 1.
  std::string zero_style = "shard";
  // Preset "ring" under causal masking: "zigzag" (rank r holds chunks r and
  // 2n-1-r of the sequence cut in 2n, every rank does the same work;
  // parallel/seq_balance.h) or "contiguous" (one block per rank; the last
  // rank does the most). Read with the preset "ring", and with split tuples
  // ("strategies") on a cp axis when given (ring_order_set): a searched plan
  // whose attention runs as a ring over cp writes "zigzag".
  std::string ring_order = "zigzag";
  bool ring_order_set = false;
  // "pipeline": {...} (engine/pipeline_trainer.h parse_pipeline_config), kept raw here.
  nlohmann::json pipeline;
  // "recompute": "none" | "full" | "selective" as a plan writes it (the same
  // as train.recompute; "" when absent).
  std::string recompute;
  // "recompute_layers": [blocks] as a plan writes it for full recompute of
  // some blocks (the first N of each pipeline chunk): the same as
  // train.recompute_layers' block numbers.
  std::vector<int> recompute_layers;
  Mesh mesh = Mesh::line(1, "dp");
  bool has_mesh = false;
  DimRules rules;
  // Node name or glob ('*' any run of characters, '?' one) -> split tuples, in file order.
  std::vector<std::pair<std::string, std::string>> strategies;

  // The split text for node `name`: an exact key first, else the first glob
  // that matches; nullptr if none.
  const std::string* strategy_for(const std::string& name) const;
};

// Data parallel as a plan of the partitioner: `c` (mode "data", perhaps with
// a ZeRO stage) becomes mode "semi" with the preset "dp" (the batch split over
// dp) on `mesh`. The gradient reductions are then the program's all_reduce
// (ZeRO: reduce_scatter) nodes, which the trainer runs in buckets overlapped
// with the backward (runtime/grad_buckets.h).
void use_data_parallel_plan(StrategyConfig* c, const Mesh& mesh);

// Strict: unknown keys and bad values are errors naming the key ("parallel.mesh.tp").
// Rules are checked against the mesh, split tuples parsed (not yet applied to nodes).
Result<StrategyConfig> parse_strategy_config(const nlohmann::json& j,
                                             const std::string& where = "parallel");

}  // namespace meshflow
