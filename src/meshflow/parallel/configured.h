// The run config's "parallel" section applied to a training graph: the one
// way every engine and `meshflow explain` annotate a graph from a config, with
// the checks that need the graph, so that nothing a user asks for is silently
// ignored:
//   - a strategy key (node name or glob) that matches no node, or a rule naming
//     a dim no value has, is an error listing the closest names;
//   - a mesh axis of size > 1 over which no computation is split (every rank
//     of it would compute the same values) is an error naming the axis and how
//     to use it.
//
//   MF_ASSIGN_OR_RETURN(Annotation a, annotate_config(g, mesh, rc.parallel, rc.model_source));
//   MF_ASSIGN_OR_RETURN(LocalProgram p, lower(g, a, rank));
#pragma once

#include <string>

#include "meshflow/core/status.h"
#include "meshflow/ir/graph.h"
#include "meshflow/parallel/partition.h"
#include "meshflow/parallel/strategy.h"

namespace meshflow {

// "h.11.mlp.c_fc" -> "h.*.mlp.c_fc": the glob that names a node in every layer.
std::string layer_glob(const std::string& name);

// The partitioner's options from the "parallel" object (rules, split tuples, ZeRO over dp).
PartitionOptions partition_options(const StrategyConfig& pc, const Mesh& mesh);

// Every user strategy key matches a node of `g`, every user rule names a dim of
// some value of `g`. Errors list up to three close matches.
Status check_config_names(const Graph& g, const StrategyConfig& pc);

// Every mesh axis of size > 1 splits some forward computation (a forward node
// reads or produces a value sharded over it). model: for the message.
Status check_axes_used(const Graph& g, const Annotation& a, const StrategyConfig& pc,
                       const std::string& model);

// check_config_names, annotate with partition_options, check_axes_used.
// cost: the links the reshard planner prices each mesh axis on (the planner
// passes the cluster's, plan::reshard_costs); null: ReshardCostModel's defaults.
Result<Annotation> annotate_config(const Graph& g, const Mesh& mesh, const StrategyConfig& pc,
                                   const std::string& model,
                                   const ReshardCostModel* cost = nullptr);

}  // namespace meshflow
