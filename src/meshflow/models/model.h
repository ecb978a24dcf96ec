// The common part of every model builder (mlp.h, gpt.h, llama.h): what a
// build function returns, and the conventions all of them follow.
//
//   MF_ASSIGN_OR_RETURN(GptConfig cfg, parse_gpt_config(json));
//   MF_ASSIGN_OR_RETURN(ModelGraph m, build_gpt(cfg, /*batch=*/8, /*seq=*/128));
//   append_backward(m.graph);               // m.graph.loss is the scalar mean cross-entropy
//   for (const std::string& name : m.inputs) executor.feed(name, batch.get(name));
//
// Conventions shared by the builders:
//   - Weight layout is [in.., out..] and a layer computes x @ W. This is the
//     transpose of PyTorch's nn.Linear weight [out, in] (Hugging Face GPT-2's
//     Conv1D weights are already [in, out]). Attention projections keep the
//     heads as dims: q_proj.weight is [hidden, heads, head_dim] and the output
//     projection [heads, head_dim, hidden], so a tensor-parallel rule can shard
//     `heads` directly. Loading HF weights = transpose, then reshape.
//   - Values carry named dims: batch, seq, hidden, heads, kv_heads, head_dim,
//     ffn, vocab (LMs); batch, features, hidden, classes (MLP).
//   - Transformer block i is built under b.scope("h.i", i) (GPT) or
//     b.scope("model.layers.i", i) (LLaMA), so its nodes carry node.layer = i
//     (pipeline split and recompute read it); nodes outside blocks have -1.
//   - g.loss is the mean cross-entropy (a scalar); g.outputs["logits"] the
//     logits; g.outputs["correct"] the number of argmax hits (Phase::kMetric).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "meshflow/core/status.h"
#include "meshflow/ir/graph.h"
#include "meshflow/ops/builder.h"

namespace meshflow {

// Bounds of model config integers: a width or count above 2^31 - 1, or more
// than 100,000 layers, is refused when the config is read (the planner's
// largest published models use widths up to ~10^5 and ~10^2 layers).
inline constexpr int64_t kMaxModelDim = (int64_t{1} << 31) - 1;
inline constexpr int64_t kMaxModelLayers = 100000;

// A part of the model a user addresses by name (parallel.pipeline.stage_of,
// train.recompute_layers; models/cells.h), as Hugging Face names its modules:
// the stem or embeddings, each block, the head. block >= 0: the block whose
// nodes carry node.layer == block; -1: outside the blocks (before or after
// them, by its place in ModelGraph::cells).
struct ModelCell {
  std::string name;
  int block = -1;
};

struct ModelGraph {
  Graph graph;
  // The model's cells in forward order ("embedder", "encoder.stages.0.layers.0",
  // ..., "classifier"); a dotted prefix addresses every cell under it.
  std::vector<ModelCell> cells;
  // Data inputs fed every step, in this order: {"tokens", "targets"} for
  // language models, {"x", "labels"} for the MLP. (Dropout adds the scalar
  // "rng_offset" and autodiff "loss_scale"; those are not data.)
  std::vector<std::string> inputs;
  // Set when the sequence runs in zigzag order over seq_zigzag ranks (causal
  // ring attention's load balance, parallel/seq_balance.h): the sequence
  // inputs the trainers feed reordered, each with its seq dim.
  int64_t seq_zigzag = 0;
  std::map<std::string, int> zigzag_inputs;
};

// The end of every language model: logits [batch, seq, vocab] = x @ tied^T
// (tied embeddings; pass the embedding table) or x @ lm_head.weight [hidden,
// vocab] (tied == kNoValue); g.loss = mean cross-entropy against targets;
// g.outputs["logits"] and g.outputs["correct"] (argmax hits, metric phase).
void add_lm_head(Builder& b, Graph& g, ValueId x, ValueId tied, const Dim& vocab, Init init,
                 ValueId targets);

// Sum of the element counts of all Parameter values of g.
int64_t count_parameters(const Graph& g);

// FLOPs of the forward-phase nodes of g by their OpDef cost (what this graph's
// kernels do, causal attention included as the kernel prices it).
double graph_forward_flops(const Graph& g);

}  // namespace meshflow
