#include "meshflow/models/gpt.h"

#include <cmath>

#include "meshflow/config/json_reader.h"
#include "meshflow/core/random.h"
#include "meshflow/models/model_util.h"
#include "meshflow/ops/builder.h"

namespace meshflow {

Result<GptConfig> parse_gpt_config(const nlohmann::json& j) {
  GptConfig c;
  JsonObjectReader r(j, "model");
  std::string type = "gpt", model_type = "gpt2";
  r.choice("type", &type, {"gpt"});
  r.choice("model_type", &model_type, {"gpt2"});
  r.integer("n_layer", &c.n_layer, 1, kMaxModelLayers);
  r.integer("n_embd", &c.n_embd, 1, kMaxModelDim);
  r.integer("n_head", &c.n_head, 1, kMaxModelDim);
  r.integer("n_positions", &c.n_positions, 1, kMaxModelDim);
  r.integer("vocab_size", &c.vocab_size, 2, kMaxModelDim);
  if (j.is_object() && j.contains("n_inner") && j.at("n_inner").is_null())
    r.ignore({"n_inner"});  // HF writes null for the default
  else
    r.integer("n_inner", &c.n_inner, 1, kMaxModelDim);
  r.number("layer_norm_epsilon", &c.layer_norm_epsilon, 0.0, 1.0);
  r.boolean("tie_word_embeddings", &c.tie_word_embeddings);
  r.number("resid_pdrop", &c.resid_pdrop, 0.0, 0.999);
  r.number("embd_pdrop", &c.embd_pdrop, 0.0, 0.999);
  r.number("attn_pdrop", &c.attn_pdrop, 0.0, 0.999);
  r.number("initializer_range", &c.initializer_range, 0.0, 10.0);
  // gelu_pytorch_tanh is the same function as gelu_new.
  r.choice("activation_function", &c.activation_function, {"gelu_new", "gelu_pytorch_tanh"});
  bool scale_attn_weights = true, scale_by_layer = false;
  r.boolean("scale_attn_weights", &scale_attn_weights);
  r.boolean("scale_attn_by_inverse_layer_idx", &scale_by_layer);
  if (!scale_attn_weights)
    r.fail(
        "model.scale_attn_weights must be true (attention scores are scaled by 1/sqrt(head_dim))");
  if (scale_by_layer) r.fail("model.scale_attn_by_inverse_layer_idx must be false (not supported)");
  ignore_harmless_hf_keys(r);
  r.ignore({"n_ctx", "reorder_and_upcast_attn", "summary_activation", "summary_first_dropout",
            "summary_proj_to_labels", "summary_type", "summary_use_proj"});
  MF_RETURN_IF_ERROR(r.finish());
  MF_RETURN_IF_ERROR(require_keys(j, {"n_layer", "n_embd", "n_head", "n_positions", "vocab_size"}));
  MF_RETURN_IF_ERROR(validate_gpt_config(c));
  return c;
}

Status validate_gpt_config(const GptConfig& c) {
  MF_RETURN_IF_ERROR(check_positive({{"n_layer", c.n_layer},
                                     {"n_embd", c.n_embd},
                                     {"n_head", c.n_head},
                                     {"n_positions", c.n_positions},
                                     {"vocab_size", c.vocab_size}}));
  if (c.n_embd % c.n_head != 0)
    return Status::invalid("model: n_embd=" + std::to_string(c.n_embd) +
                           " is not divisible by n_head=" + std::to_string(c.n_head) +
                           " (head_dim = n_embd / n_head must be a whole number)");
  if (c.attn_pdrop != 0.f)
    return Status::invalid("model.attn_pdrop must be 0, got " + std::to_string(c.attn_pdrop) +
                           ": the fused attention kernel has no dropout on attention "
                           "probabilities (resid_pdrop and embd_pdrop are supported)");
  if (c.activation_function != "gelu_new" && c.activation_function != "gelu_pytorch_tanh")
    return Status::invalid("model.activation_function must be \"gelu_new\", got \"" +
                           c.activation_function + "\"");
  if (c.resid_pdrop < 0.f || c.resid_pdrop >= 1.f || c.embd_pdrop < 0.f || c.embd_pdrop >= 1.f)
    return Status::invalid("model: resid_pdrop and embd_pdrop must be in [0, 1)");
  return Status::ok();
}

Result<ModelGraph> build_gpt(const GptConfig& cfg, int64_t batch, int64_t seq) {
  MF_RETURN_IF_ERROR(validate_gpt_config(cfg));
  MF_RETURN_IF_ERROR(check_batch_seq("gpt", batch, seq, cfg.n_positions, "n_positions"));
  const int64_t B = batch, T = seq, C = cfg.n_embd, H = cfg.n_head, D = cfg.head_dim(),
                F = cfg.ffn(), V = cfg.vocab_size, P = cfg.n_positions, L = cfg.n_layer;
  const Dim hidden{"hidden", C}, heads{"heads", H}, head_dim{"head_dim", D}, ffn{"ffn", F},
      vocab{"vocab", V};
  const Init w_init = Init::normal(cfg.initializer_range);
  const Init proj_init =
      Init::normal(cfg.initializer_range / std::sqrt(2.f * static_cast<float>(L)));
  const float eps = cfg.layer_norm_epsilon;

  ModelGraph m;
  m.inputs = {"tokens", "targets"};
  try {
    Builder b(m.graph);
    auto param = [&b](const std::string& name, Shape s, Init init) {
      return b.parameter(b.qualify(name), std::move(s), init);
    };
    auto dropout = [&b](ValueId x, float p, const std::string& name) {
      return p > 0.f ? b.dropout(x, p, stream_seed(b.qualify(name), 0), name) : x;
    };
    ValueId tokens = b.input("tokens", Shape{{"batch", B}, {"seq", T}}, DType::I32);
    ValueId targets = b.input("targets", Shape{{"batch", B}, {"seq", T}}, DType::I32);

    ValueId wte = param("wte.weight", Shape{vocab, hidden}, w_init);
    ValueId wpe = param("wpe.weight", Shape{{"positions", P}, hidden}, w_init);
    ValueId x = b.embedding(wte, tokens, "wte");                      // [B,T,C]
    ValueId pos = T == P ? wpe : b.slice(wpe, 0, 0, T, "wpe.slice");  // [T,C]
    x = b.add(x, pos, "embed");                                       // [B,T,C] + [T,C]
    x = dropout(x, cfg.embd_pdrop, "embd_drop");

    m.cells = {{"wte", -1}, {"wpe", -1}};
    for (int64_t i = 0; i < L; ++i) {
      m.cells.push_back({"h." + std::to_string(i), static_cast<int>(i)});
      auto block = b.scope(m.cells.back().name, static_cast<int>(i));
      // Attention: a = ln_1(x); q, k, v: [B,T,H,D]; o: [B,T,C].
      ValueId a = b.layer_norm(x, param("ln_1.weight", Shape{hidden}, Init::ones()),
                               param("ln_1.bias", Shape{hidden}, Init::zeros()), eps, "ln_1");
      ValueId o;
      {
        auto attn = b.scope("attn");
        auto project = [&](const std::string& name) {
          ValueId w = param(name + ".weight", Shape{hidden, heads, head_dim}, w_init);
          ValueId bias = param(name + ".bias", Shape{heads, head_dim}, Init::zeros());
          ValueId y = b.add(b.matmul(a, w, {}, name), bias, name + ".bias_add");  // [B,T,H,D]
          return b.transpose(y, {0, 2, 1, 3}, name + ".to_heads");                // [B,H,T,D]
        };
        ValueId q = project("q_proj"), k = project("k_proj"), v = project("v_proj");
        ValueId y = b.attention(q, k, v, /*causal=*/true, 0.f, "core");  // [B,H,T,D]
        y = b.transpose(y, {0, 2, 1, 3}, "from_heads");                  // [B,T,H,D]
        ValueId wo = param("c_proj.weight", Shape{heads, head_dim, hidden}, proj_init);
        ValueId bo = param("c_proj.bias", Shape{hidden}, Init::zeros());
        o = b.bias_add(b.matmul(y, wo, {.contract = 2}, "c_proj"), bo, "c_proj.bias_add");
        o = dropout(o, cfg.resid_pdrop, "resid_drop");
      }
      x = b.add(x, o, "residual_attn");
      // MLP: x = x + c_proj(gelu(c_fc(ln_2(x)))).
      ValueId h = b.layer_norm(x, param("ln_2.weight", Shape{hidden}, Init::ones()),
                               param("ln_2.bias", Shape{hidden}, Init::zeros()), eps, "ln_2");
      {
        auto mlp = b.scope("mlp");
        ValueId w1 = param("c_fc.weight", Shape{hidden, ffn}, w_init);
        ValueId b1 = param("c_fc.bias", Shape{ffn}, Init::zeros());
        h = b.gelu(b.bias_add(b.matmul(h, w1, {}, "c_fc"), b1, "c_fc.bias_add"),
                   "gelu");  // [B,T,F]
        ValueId w2 = param("c_proj.weight", Shape{ffn, hidden}, proj_init);
        ValueId b2 = param("c_proj.bias", Shape{hidden}, Init::zeros());
        h = b.bias_add(b.matmul(h, w2, {}, "c_proj"), b2, "c_proj.bias_add");  // [B,T,C]
        h = dropout(h, cfg.resid_pdrop, "resid_drop");
      }
      x = b.add(x, h, "residual_mlp");
    }

    x = b.layer_norm(x, param("ln_f.weight", Shape{hidden}, Init::ones()),
                     param("ln_f.bias", Shape{hidden}, Init::zeros()), eps, "ln_f");
    m.cells.push_back({"ln_f", -1});
    m.cells.push_back({"lm_head", -1});
    add_lm_head(b, m.graph, x, cfg.tie_word_embeddings ? wte : kNoValue, vocab, w_init, targets);
  } catch (const StatusError& e) {
    return e.status().with_context("building gpt");
  }
  return m;
}

int64_t gpt_num_parameters(const GptConfig& cfg) {
  const int64_t C = cfg.n_embd, F = cfg.ffn(), V = cfg.vocab_size, P = cfg.n_positions;
  const int64_t attn = 3 * (C * C + C) + C * C + C;  // q, k, v (+ biases), c_proj (+ bias)
  const int64_t mlp = C * F + F + F * C + C;
  const int64_t norms = 2 * 2 * C;
  const int64_t per_layer = attn + mlp + norms;
  return V * C + P * C + cfg.n_layer * per_layer + 2 * C + (cfg.tie_word_embeddings ? 0 : C * V);
}

double gpt_forward_flops_per_token(const GptConfig& cfg, int64_t seq) {
  const double C = cfg.n_embd, F = cfg.ffn(), V = cfg.vocab_size, L = cfg.n_layer;
  const double matmul_weights = L * (4 * C * C + 2 * C * F) + C * V;
  return 2 * matmul_weights + 4 * L * static_cast<double>(seq) * C;
}

}  // namespace meshflow
