// The sizes of a transformer language model the planner reads (its layers,
// widths and heads, for the search's divisibility checks and Megatron-LM's
// activation-memory formula), and the check that a plan's degrees divide them.
// The program the planner prices is built by the real builders and
// partitioner (plan/rank_program.h), not from these.
#pragma once

#include <cstdint>

#include "meshflow/core/status.h"
#include "meshflow/models/from_config.h"
#include "meshflow/plan/rank_program.h"

namespace meshflow::plan {

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

// Errors for a model whose sizes would overflow the planner's int64 element
// and byte counts: over 1e15 parameters, a weight or one sequence of `seq`
// tokens' widest activation over 2^40 elements. Counted in double.
Status check_priceable_size(const TransformerDims& d, int64_t seq);

// Errors name the dim and the degree that does not divide it (s.recompute ignored).
Status check_local_shape(const TransformerDims& d, const RankShape& s);

}  // namespace meshflow::plan
