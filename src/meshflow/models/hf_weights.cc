#include "meshflow/models/hf_weights.h"

#include <cstring>
#include <set>

namespace meshflow {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

Shape flat2(int64_t rows, int64_t cols) {
  return Shape{{"rows", rows}, {"cols", cols}};
}

// [rows, cols] -> [cols, rows].
Tensor transpose2(const Tensor& t, int64_t rows, int64_t cols) {
  Tensor out(flat2(cols, rows), DType::F32);
  const float* a = t.data<float>();
  float* b = out.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) b[c * rows + r] = a[r * cols + c];
  return out;
}

// Columns [c0, c1) of a [rows, cols] matrix.
Tensor columns(const Tensor& t, int64_t rows, int64_t cols, int64_t c0, int64_t c1) {
  Tensor out(flat2(rows, c1 - c0), DType::F32);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data<float>() + r * (c1 - c0), t.data<float>() + r * cols + c0,
                sizeof(float) * static_cast<size_t>(c1 - c0));
  return out;
}

// Matrices [rows, cols_i] side by side.
Tensor side_by_side(const std::vector<Tensor>& parts, int64_t rows) {
  int64_t cols = 0;
  for (const Tensor& p : parts) cols += p.numel() / rows;
  Tensor out(flat2(rows, cols), DType::F32);
  int64_t at = 0;
  for (const Tensor& p : parts) {
    const int64_t pc = p.numel() / rows;
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(out.data<float>() + r * cols + at, p.data<float>() + r * pc,
                  sizeof(float) * static_cast<size_t>(pc));
    at += pc;
  }
  return out;
}

// The same floats under another shape.
Tensor reshaped(const Tensor& t, const Shape& s) {
  Tensor out(s, DType::F32);
  out.copy_from(t.raw());
  return out;
}

// How one meshflow parameter comes from one transformers tensor:
// transposed ([out, in] -> [in, out]) and/or a column range of it.
struct Rule {
  std::string ours, hf;
  bool transpose = false;
  int part = -1, parts = 1;  // columns part/parts of the (transposed) matrix
};

std::vector<Rule> gpt2_rules(const GptConfig& c) {
  std::vector<Rule> r = {{"wte.weight", "transformer.wte.weight"},
                         {"wpe.weight", "transformer.wpe.weight"},
                         {"ln_f.weight", "transformer.ln_f.weight"},
                         {"ln_f.bias", "transformer.ln_f.bias"}};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "h." + std::to_string(i) + ".", h = "transformer." + p;
    for (const char* n : {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias",
                          "attn.c_proj.weight", "attn.c_proj.bias", "mlp.c_fc.weight",
                          "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"})
      r.push_back({p + n, h + n});
    const char* qkv[3] = {"q_proj", "k_proj", "v_proj"};
    for (int k = 0; k < 3; ++k) {
      r.push_back({p + "attn." + qkv[k] + ".weight", h + "attn.c_attn.weight", false, k, 3});
      r.push_back({p + "attn." + qkv[k] + ".bias", h + "attn.c_attn.bias", false, k, 3});
    }
  }
  if (!c.tie_word_embeddings) r.push_back({"lm_head.weight", "lm_head.weight", true});
  return r;
}

std::vector<Rule> llama_rules(const LlamaConfig& c) {
  std::vector<Rule> r = {{"model.embed_tokens.weight", "model.embed_tokens.weight"},
                         {"model.norm.weight", "model.norm.weight"}};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* n : {"input_layernorm.weight", "post_attention_layernorm.weight"})
      r.push_back({p + n, p + n});
    for (const char* n : {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                          "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"})
      r.push_back({p + n, p + n, true});
  }
  if (!c.tie_word_embeddings) r.push_back({"lm_head.weight", "lm_head.weight", true});
  return r;
}

Result<std::vector<Rule>> rules_for(const ModelConfig& model) {
  if (const auto* g = std::get_if<GptConfig>(&model)) return gpt2_rules(*g);
  if (const auto* l = std::get_if<LlamaConfig>(&model)) return llama_rules(*l);
  return Status::invalid(
      "Hugging Face weights: only GPT-2 and LLaMA models map to transformers' "
      "names, not a " +
      summarize(model, 1).kind);
}

// transformers' buffers that meshflow computes instead of storing.
bool ignored_buffer(const std::string& name) {
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") ||
         ends_with(name, "rotary_emb.inv_freq");
}

// GPT-2 files from the Hub name tensors without the `transformer.` prefix
// (GPT2Model's state dict); save_pretrained of GPT2LMHeadModel with it.
std::string canonical_hf_name(const ModelConfig& model, const std::string& name) {
  if (std::holds_alternative<GptConfig>(model) && name != "lm_head.weight" &&
      name.rfind("transformer.", 0) != 0)
    return "transformer." + name;
  return name;
}

}  // namespace

bool is_hf_state_dict(const ModelConfig& model, const std::map<std::string, Tensor>& tensors) {
  for (const auto& [name, t] : tensors) {
    if (std::holds_alternative<GptConfig>(model) && ends_with(name, "attn.c_attn.weight"))
      return true;
    if (std::holds_alternative<LlamaConfig>(model) && ends_with(name, "self_attn.q_proj.weight") &&
        t.shape().rank() == 2)
      return true;
  }
  return false;
}

Result<std::map<std::string, Tensor>> from_hf_state_dict(
    const ModelConfig& model, const std::map<std::string, Tensor>& file,
    const std::map<std::string, Shape>& shapes) {
  MF_ASSIGN_OR_RETURN(const std::vector<Rule> rules, rules_for(model));
  std::map<std::string, Tensor> hf;
  for (const auto& [name, t] : file)
    if (!ignored_buffer(name)) hf[canonical_hf_name(model, name)] = t;
  std::set<std::string> used;
  std::map<std::string, Tensor> out;
  for (const Rule& r : rules) {
    auto want = shapes.find(r.ours);
    if (want == shapes.end())
      return Status::internal("Hugging Face weights: the model has no parameter '" + r.ours + "'");
    auto it = hf.find(r.hf);
    if (it == hf.end())
      return Status::not_found("Hugging Face weights: tensor '" + r.hf + "' (meshflow's '" +
                               r.ours + "') is missing");
    used.insert(r.hf);
    const Tensor& t = it->second;
    const int64_t numel = want->second.numel() * r.parts;
    if (t.dtype() != DType::F32 || t.numel() != numel || (r.transpose && t.shape().rank() != 2) ||
        (r.parts > 1 && t.shape().rank() > 2))
      return Status::invalid(
          "Hugging Face weights: tensor '" + r.hf + "' is " + t.shape().to_string() +
          "; meshflow's '" + r.ours + "' is " + want->second.to_string() +
          (r.parts > 1 ? " (one of " + std::to_string(r.parts) + " parts)" : ""));
    Tensor m = t;
    if (r.transpose)
      m = transpose2(t, t.shape().size(0), t.shape().size(1));  // [out,in] -> [in,out]
    if (r.parts > 1) {
      // [rows, parts * n] (a bias: one row) -> part `part`.
      const int64_t rows = m.shape().rank() == 2 ? m.shape().size(0) : 1;
      const int64_t cols = m.numel() / rows, n = cols / r.parts;
      m = columns(m, rows, cols, r.part * n, (r.part + 1) * n);
    }
    out[r.ours] = reshaped(m, want->second);
  }
  // A tied lm_head is the embedding; any other tensor left over is a mismatch.
  for (const auto& [name, t] : hf) {
    if (used.count(name)) continue;
    if (name == "lm_head.weight") {
      const std::string emb = std::holds_alternative<GptConfig>(model)
                                  ? "transformer.wte.weight"
                                  : "model.embed_tokens.weight";
      auto e = hf.find(emb);
      if (e != hf.end() && e->second.nbytes() == t.nbytes() &&
          std::memcmp(e->second.raw(), t.raw(), t.nbytes()) == 0)
        continue;
      return Status::invalid("Hugging Face weights: 'lm_head.weight' differs from '" + emb +
                             "' but the model ties them (tie_word_embeddings)");
    }
    return Status::invalid("Hugging Face weights: tensor '" + name +
                           "' matches no parameter of the model (another model or size?)");
  }
  return out;
}

Result<std::vector<std::pair<std::string, Tensor>>> to_hf_state_dict(
    const ModelConfig& model, const std::map<std::string, Tensor>& ours) {
  MF_ASSIGN_OR_RETURN(const std::vector<Rule> rules, rules_for(model));
  std::map<std::string, std::vector<const Rule*>> by_hf;
  std::vector<std::string> order;
  for (const Rule& r : rules) {
    if (!ours.count(r.ours))
      return Status::not_found("Hugging Face export: parameter '" + r.ours + "' is missing");
    if (by_hf[r.hf].empty()) order.push_back(r.hf);
    by_hf[r.hf].push_back(&r);
  }
  std::vector<std::pair<std::string, Tensor>> out;
  for (const std::string& name : order) {
    const std::vector<const Rule*>& rs = by_hf[name];
    const Rule& r0 = *rs[0];
    const Tensor& first = ours.at(r0.ours);
    Tensor t;
    if (r0.parts > 1) {
      // A weight [in, heads, head_dim] per part: [in, part cols] side by side;
      // a bias [heads, head_dim]: one row.
      const bool bias = ends_with(name, ".bias");
      const int64_t rows = bias ? 1 : first.shape().size(0);
      std::vector<Tensor> parts;
      for (const Rule* r : rs) parts.push_back(ours.at(r->ours));
      t = side_by_side(parts, rows);
      if (bias) t = reshaped(t, Shape{{"cols", t.numel()}});
    } else if (r0.transpose) {
      // meshflow's [in.., out..] -> transformers' [out, in]: in is the first
      // dim, except o_proj / c_proj style [heads, head_dim, out] (two in dims).
      const Shape& s = first.shape();
      const bool two_in = ends_with(name, "o_proj.weight");
      const int64_t in = two_in ? s.size(0) * s.size(1) : s.size(0);
      t = transpose2(first, in, first.numel() / in);
    } else if (std::holds_alternative<GptConfig>(model) && first.shape().rank() > 2) {
      // c_proj [heads, head_dim, hidden] -> Conv1D's [in, out] = [heads*head_dim, hidden].
      const Shape& s = first.shape();
      t = reshaped(first, flat2(s.size(0) * s.size(1), s.size(2)));
    } else {
      t = first;
    }
    out.emplace_back(name, t);
  }
  return out;
}

}  // namespace meshflow
