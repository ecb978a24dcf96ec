// The per-rank program of one transformer layer under a plan, as a Graph the
// cost model prices node by node: the same ops, names and gradient rules as
// models/gpt.cc and models/llama.cc, but at the shapes one rank holds under
// Megatron tensor parallelism (heads / tp, kv_heads / tp, ffn / tp, vocab / tp)
// and context parallelism (seq / cp for the queries; keys and values gathered
// to the full seq). It is a whole training graph of a one-layer model
// (embedding -> block 0 -> head -> loss, then append_backward), so every
// forward and backward node of a layer is there, with node.layer = 0, and the
// embedding/head/loss nodes with node.layer = -1 (with LocalShape::layers > 1,
// blocks 0, 1, ... in order).
//
//   LocalShape s{.micro_batch = 2, .seq = 2048, .tp = 8, .cp = 1};
//   MF_ASSIGN_OR_RETURN(Graph g, build_local_layer_graph(model, s));
//
// Why not build_gpt itself: its head_dim is n_embd / n_head, so a config with
// n_head / tp heads would change head_dim; the local program keeps head_dim
// and drops heads. Keep the two in step when a model builder changes.
#pragma once

#include <cstdint>

#include "meshflow/core/status.h"
#include "meshflow/ir/graph.h"
#include "meshflow/models/from_config.h"

namespace meshflow::plan {

struct LocalShape {
  int64_t micro_batch = 1;
  int64_t seq = 1;  // the full sequence; the queries of one rank are seq / cp
  int64_t tp = 1;
  int64_t cp = 1;
  // Sequence parallelism (tp > 1): the replicated region (embedding output,
  // norms, residuals, dropout) on seq / tp shards, a concat standing for the
  // all_gather before each tensor-parallel region and a slice for the
  // reduce_scatter after it (what the megatron-sp program holds).
  bool sp = false;
  // Transformer blocks (node.layer 0 .. layers-1). The time model prices block
  // 0 of a one-block program; the static-arena memory model plans a one- and
  // a two-block program and extrapolates.
  int64_t layers = 1;
};

// The sizes a language model's planner needs, read from its config.
struct TransformerDims {
  bool llama = false;  // LLaMA (RMSNorm, rope, SwiGLU, GQA, no biases) or GPT-2 style
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  int64_t max_seq = 0;   // n_positions / max_position_embeddings
  bool tied = true;      // tied embeddings (the last stage keeps a copy of the table)
  bool dropout = false;  // residual/embedding dropout (its masks are activations)
};

// REQUIRES nothing; errors for a model that is not a language model.
Result<TransformerDims> transformer_dims(const ModelConfig& model);

// Errors name the dim and the degree that does not divide it.
Status check_local_shape(const TransformerDims& d, const LocalShape& s);

Result<Graph> build_local_layer_graph(const ModelConfig& model, const LocalShape& s);

}  // namespace meshflow::plan
