#include "meshflow/plan/model_dims.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace meshflow::plan {

Result<TransformerDims> transformer_dims(const ModelConfig& model) {
  TransformerDims d;
  if (const auto* g = std::get_if<GptConfig>(&model)) {
    d.llama = false;
    d.layers = g->n_layer;
    d.hidden = g->n_embd;
    d.heads = g->n_head;
    d.kv_heads = g->n_head;
    d.head_dim = g->head_dim();
    d.ffn = g->ffn();
    d.vocab = g->vocab_size;
    d.max_seq = g->n_positions;
    d.tied = g->tie_word_embeddings;
    d.dropout = g->resid_pdrop > 0.f || g->embd_pdrop > 0.f;
    return d;
  }
  if (const auto* l = std::get_if<LlamaConfig>(&model)) {
    d.llama = true;
    d.layers = l->num_hidden_layers;
    d.hidden = l->hidden_size;
    d.heads = l->num_attention_heads;
    d.kv_heads = l->kv_heads();
    d.head_dim = l->head_dim();
    d.ffn = l->intermediate_size;
    d.vocab = l->vocab_size;
    d.max_seq = l->max_position_embeddings;
    d.tied = l->tie_word_embeddings;
    d.dropout = false;
    return d;
  }
  return Status::invalid(model_noun(model) +
                         " has no transformer layers, heads or positions (the sizes of a gpt2 or "
                         "llama model)");
}

namespace {

std::string str(int64_t x) {
  return std::to_string(x);
}

}  // namespace

Status check_local_shape(const TransformerDims& d, const RankShape& s) {
  if (s.micro_batch < 1 || s.seq < 1 || s.tp < 1 || s.cp < 1)
    return Status::invalid("micro_batch, seq, tp and cp must be >= 1");
  if (d.heads % s.tp != 0)
    return Status::invalid("tp=" + str(s.tp) + " does not divide heads=" + str(d.heads) +
                           " (tensor parallelism splits the attention heads)");
  if (d.kv_heads % s.tp != 0 && s.tp % d.kv_heads != 0)
    return Status::invalid("tp=" + str(s.tp) + " and kv_heads=" + str(d.kv_heads) +
                           ": one must divide the other (kv heads are split or replicated)");
  if (d.ffn % s.tp != 0)
    return Status::invalid("tp=" + str(s.tp) + " does not divide ffn=" + str(d.ffn));
  if (s.seq % s.cp != 0)
    return Status::invalid("cp=" + str(s.cp) + " does not divide seq=" + str(s.seq) +
                           " (context parallelism splits the sequence)");
  if (s.sp && (s.tp < 2 || (s.seq / s.cp) % s.tp != 0))
    return Status::invalid("sp splits the local seq " + str(s.seq / s.cp) + " by tp=" + str(s.tp) +
                           ", which needs tp > 1 dividing it");
  if (s.blocks < 1) return Status::invalid("blocks must be >= 1, got " + str(s.blocks));
  if (s.seq > d.max_seq)
    return Status::invalid("seq=" + str(s.seq) + " exceeds the model's maximum " + str(d.max_seq));
  return Status::ok();
}

Status check_priceable_size(const TransformerDims& d, int64_t seq) {
  // (A model of hidden 2^30 and ffn 2^31 was read as 2.8e14 parameters
  // and -0 bytes before this check.)
  const double h = double(d.hidden), f = double(d.ffn), v = double(d.vocab),
               kv = double(d.kv_heads) * double(d.head_dim);
  // (An upper bound for both block kinds: GPT's 4h^2 + 2hf has kv = h.)
  const double params = double(d.layers) * (2 * h * h + 2 * h * kv + 3 * h * f) + 2 * v * h;
  const double weight = std::max({h * f, v * h, h * h});
  const double row = double(seq) * std::max({h, f, v});
  constexpr double kMostElements = double(int64_t{1} << 40);  // 4 TiB of f32
  constexpr double kMostParameters = 1e15;
  auto fmt = [](double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3g", x);
    return std::string(b);
  };
  if (params > kMostParameters || weight > kMostElements)
    return Status::invalid("the model is past the sizes the planner prices: about " + fmt(params) +
                           " parameters, its largest weight " + fmt(weight) +
                           " elements (hidden_size x intermediate_size or vocab_size); at most " +
                           fmt(kMostParameters) + " parameters and " + fmt(kMostElements) +
                           " elements a weight");
  if (row > kMostElements)
    return Status::invalid("seq=" + std::to_string(seq) +
                           " makes one sequence's widest activation " + fmt(row) +
                           " elements (seq x the widest of hidden_size, intermediate_size, "
                           "vocab_size); the planner prices at most " +
                           fmt(kMostElements) + ": a shorter --seq");
  return Status::ok();
}

}  // namespace meshflow::plan
