// Per-operator strategy search: one ShardingStrategy for every forward node of
// a training graph, chosen to minimize the predicted step time, as an integer
// linear program solved exactly by COIN-OR CBC (the solver Alpa's intra-op
// pass uses). For any graph the engine builds (MLP, GPT, LLaMA, ResNet).
//
// The program (Alpa's formulation, Zheng et al. 2022 §4.2):
//   x[c][s] in {0,1}   class c (a node, or one node of every identical
//                      transformer block, tied) runs strategy s of the ones
//                      its op's ShardingRule enumerates on the mesh;
//   y[e][s][t] >= 0    edge e between two classes runs the pair (s, t);
//                      sum_t y[e][s][t] = x[u][s], sum_s y[e][s][t] = x[v][t];
//   minimize  sum compute(c, s) x[c][s] + sum reshard(e, s, t) y[e][s][t]
//   s.t.      sum_s x[c][s] = 1,  sum memory(c, s) x[c][s] <= budget.
// compute(c, s): the node's forward and gradient work (its "<name>.grad.*"
// nodes, which run the dual strategy) divided by the mesh axes the strategy
// splits, plus the reduction of its parameters' gradients where they come out
// Partial (the batch split: data parallel). reshard(e, s, t): the reshard
// planner's cheapest plan (parallel/reshard.h, the same collective cost the
// partitioner and the planner use) from the producer's output layout to the
// consumer's input layout, plus the gradient's way back. A parameter is stored
// where its first consumer reads it (as the partitioner stores it).
//
//   StrategySearchOptions o;  o.cost = reshard_costs(...);  o.node_time_s = roofline;
//   MF_ASSIGN_OR_RETURN(StrategySearch r, search_strategies(g, mesh, o));
//   r.strategies;   // [("h.?.mlp.c_fc", "((dp, 1, 1), (1, tp))"), ...] for the partitioner
//   r.gap;          // (objective - best bound) / objective: 0 when proven optimal
//
// What the search decides goes to the partitioner as split tuples (the user's
// own semi-auto input, parallel/strategy.h), so the plan it finds can be
// written to a config file, read by a person and run as written.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "meshflow/core/layout.h"
#include "meshflow/core/mesh.h"
#include "meshflow/core/status.h"
#include "meshflow/ir/graph.h"
#include "meshflow/ops/sharding_rule.h"
#include "meshflow/parallel/reshard.h"

namespace meshflow {

struct StrategySearchOptions {
  // Collectives priced on these links (bytes_per_element: the compute dtype).
  ReshardCostModel cost;
  // Seconds node `n` of the global graph takes on one device, unsplit. The
  // search divides it by the split degree. Default: a roofline of the op's
  // cost at 1 TFLOP/s and 100 GB/s.
  std::function<double(const Graph&, const Node&)> node_time_s;
  // Bytes one device may hold (0: no limit): the model states of the
  // parameters each class stores (state_copies x the parameter's local
  // bytes) plus the forward outputs the backward reads (the activations a
  // micro-batch keeps), at activation_bytes per element (0: the value's dtype).
  double memory_budget_bytes = 0;
  double state_copies = 4;  // weights, gradients, AdamW's two moments
  double activation_bytes = 0;
  // Nodes of identical transformer blocks (node.layer >= 0, the same name
  // but for the block index, the same shapes) share one decision.
  bool tie_layers = true;
  // CBC's time limit; past it the best solution found is returned with its gap.
  double time_limit_s = 20;
  // Mesh axes the batch is split over before this search (the planner's dp):
  // split tuples name them on every dim called "batch", major-most. Not
  // searched (they must be absent from `mesh` or of size 1 there).
  std::vector<std::string> batch_axes;
  // Mesh axes over which self-attention's sequence may be split (ring
  // attention: each rank keeps its query block and the k/v blocks go round
  // the axis inside the kernel, kernels/cpu/ring_attention.h). The caller runs
  // the sequence in zigzag order (parallel/seq_balance.h) so every rank's
  // causal work is equal; the ring's shifts are priced over the axis's link,
  // less what the attention's own compute hides. Empty: attention's sequence
  // is never split.
  std::vector<std::string> ring_axes;
  // Mesh axes whose parameter-gradient reductions are not collectives of
  // their own where the plan runs: the planner folds a gradient's sum over
  // cp into the data-parallel reduction over dp x cp, run in buckets under
  // the backward. Their steps of a parameter gradient's reduction cost
  // folded_scale of their standalone time (CostModel: the part of a bucket
  // the backward does not hide; 1 where nothing overlaps).
  std::vector<std::string> folded_axes;
  double folded_scale = 1;
};

// One decision: a class of forward nodes and the strategy chosen for it.
struct StrategyDecision {
  std::string pattern;  // node name, or a glob over the block index ("h.*.mlp.c_fc")
  std::vector<NodeId> nodes;
  ShardingStrategy strategy;
  std::string splits;        // the split tuples of `strategy` ("((1, 1), (1, tp))")
  int candidates = 1;        // strategies the rule enumerated (after removing equal ones)
  int chosen = 0;            // index of `strategy` among them (StrategySearch::cost_of)
  double compute_s = 0;      // forward + gradient work of every node of the class
  double grad_reduce_s = 0;  // its parameters' gradient reductions
  double comm_in_s = 0;      // reshards into its inputs (and their gradients back)
  double ring_s = 0;         // ring attention's shifts its compute does not hide
  // The best other strategy for this class with every other class fixed:
  // what it would cost more (its splits and the extra seconds). Empty when
  // the class had one candidate.
  std::string runner_up;
  double runner_up_extra_s = 0;
};

struct StrategySearch {
  std::vector<StrategyDecision> decisions;  // in graph order
  // The config's "strategies": node name or glob -> split tuples. A block
  // decision's glob names its nodes exactly ("h.?.mlp.c_fc", "h.??.mlp.c_fc").
  std::vector<std::pair<std::string, std::string>> strategies;
  double objective_s = 0;   // the program's predicted seconds
  double bound_s = 0;       // CBC's best lower bound
  double gap = 0;           // (objective - bound) / objective
  bool optimal = false;     // proven optimal (gap ~ 0)
  bool timed_out = false;   // stopped at time_limit_s
  double memory_bytes = 0;  // the memory term of the chosen strategies
  int classes = 0, nodes = 0, columns = 0, rows = 0;
  bool ring = false;  // some attention runs as a ring (its sequence split; ring_axes)
  // Split tuples written by hand (the user's semi-auto "strategies"), not
  // searched: only `strategies` (and `rules`) is set. The planner prices the
  // program they build as it prices a searched plan's (CostModel::fix_strategies).
  bool fixed = false;
  // Beside fixed tuples: the user's named-dim rules ({"batch": "dp", "ffn":
  // "tp"}, Mesh-TensorFlow's layouts), in place of the searched plans' rules
  // {"batch": "dp"}. Empty: those.
  std::vector<std::pair<std::string, std::string>> rules;
  double solve_time_s = 0;
  // The objective of any assignment: pick[k] indexes the candidates of
  // decisions[k] (`chosen` gives this search's answer). For tests and for
  // pricing a neighbour of the answer.
  std::function<double(const std::vector<int>&)> cost_of;
  std::string summary() const;  // "42 classes (300 nodes), 1234 columns: optimal, 0.05 s"
};

// Errors: no strategy fits memory_budget_bytes (says the least any plan
// needs), the solver fails; a node with no valid strategy at all names it.
Result<StrategySearch> search_strategies(const Graph& g, const Mesh& mesh,
                                         const StrategySearchOptions& options);

// The split tuples of a strategy's inputs on `mesh` ("((dp, 1), (1, tp))",
// "()" for a scalar input), with `batch_axes` put major-most on dims named
// "batch". The inverse of strategy_from_splits.
std::string splits_text(const Graph& g, const Node& n, const ShardingStrategy& s, const Mesh& mesh,
                        const std::vector<std::string>& batch_axes = {});

}  // namespace meshflow
