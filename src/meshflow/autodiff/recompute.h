// Recomputation (activation checkpointing) as a graph pass on a training graph.
//
// Normally every forward value the backward reads stays alive from the forward
// to the backward. apply_recompute picks forward nodes (whole blocks, the
// attention core, or nodes by name), clones the ones whose outputs the backward
// of their block reads into the backward phase, and rewires those reads to the
// clones. Each block's clones sit in one run placed right before the first
// backward node of that block that reads them, so blocks are recomputed one at
// a time during the backward (as Megatron's and MindSpore's per-layer
// checkpointing). Values produced outside the selected nodes of a block (the
// block input, parameters, rng_offset) are the boundary: they stay saved.
//
// Invariants: existing ValueIds (and g.loss, g.grad_of_param, g.outputs) are
// unchanged; clones get new values at the end, named "<name>@recompute", with
// the original's layer, attrs and (boundary) inputs and Phase::kBackward.
// NodeIds change (clones are inserted). A dropout clone reads the same
// rng_offset with the same attrs.seed, so it draws the same mask.
//
//   Graph& g = model.graph;
//   append_backward(g);
//   RecomputePolicy p;  p.mode = RecomputePolicy::kFull;  p.layers = {0, 1};
//   MF_RETURN_IF_ERROR(apply_recompute(g, p));   // before or after append_optimizer
//   double extra = recompute_extra_flops(g);     // forward FLOPs done twice per step
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshflow/core/status.h"
#include "meshflow/ir/graph.h"

namespace meshflow {

struct RecomputePolicy {
  enum Mode {
    kNone,
    // Every forward op of the selected blocks; the block input is the checkpoint.
    kFull,
    // The attention core only (Korthikanti et al. 2022): the fused attention op
    // (its out and lse), the layout ops right after it that only read it (the
    // "from_heads" transpose), and the q/k/v layout ops (transpose, rope,
    // reshape) before it when their input is saved for the backward anyway.
    kSelective,
    // Forward nodes whose Node::name matches one of op_names ('*' matches any
    // run of characters: "h.1.mlp.*"; no '*' means the whole name).
    kOps,
  };
  Mode mode = kNone;
  std::vector<int> layers;            // Node::layer of the blocks to use; empty = all blocks
  std::vector<std::string> op_names;  // kOps only
};

// Rewrites g (after append_backward; before or after append_optimizer).
// Errors (g unchanged): a layer in p.layers that the graph does not have (lists
// the valid range), an op_names pattern matching no forward node (lists similar
// names), kSelective on blocks without an attention op, a graph without a
// backward phase, or a graph the pass was already applied to.
Status apply_recompute(Graph& g, const RecomputePolicy& p);

// FLOPs (ops/op_def.h cost) of the "@recompute" clones: the forward work done
// a second time per micro-batch.
double recompute_extra_flops(const Graph& g);

// Bytes of the forward-phase values (not parameters/inputs/state) that some
// backward node reads: what the forward leaves alive for the backward.
int64_t saved_for_backward_bytes(const Graph& g);

// Matches a name against a pattern where '*' is any run of characters.
bool recompute_name_matches(const std::string& pattern, const std::string& name);

}  // namespace meshflow
