#include "meshflow/models/llama.h"

#include "meshflow/config/json_reader.h"
#include "meshflow/models/model_util.h"
#include "meshflow/ops/builder.h"

namespace meshflow {

Result<LlamaConfig> parse_llama_config(const nlohmann::json& j) {
  LlamaConfig c;
  JsonObjectReader r(j, "model");
  std::string type = "llama", model_type = "llama";
  r.choice("type", &type, {"llama"});
  r.choice("model_type", &model_type, {"llama"});
  r.integer("num_hidden_layers", &c.num_hidden_layers, 1, kMaxModelLayers);
  r.integer("hidden_size", &c.hidden_size, 1, kMaxModelDim);
  r.integer("num_attention_heads", &c.num_attention_heads, 1, kMaxModelDim);
  if (j.is_object() && j.contains("num_key_value_heads") && j.at("num_key_value_heads").is_null())
    r.ignore({"num_key_value_heads"});  // HF: null means = num_attention_heads
  else
    r.integer("num_key_value_heads", &c.num_key_value_heads, 1, kMaxModelDim);
  r.integer("intermediate_size", &c.intermediate_size, 1, kMaxModelDim);
  r.integer("vocab_size", &c.vocab_size, 2, kMaxModelDim);
  r.integer("max_position_embeddings", &c.max_position_embeddings, 1, kMaxModelDim);
  r.number("rms_norm_eps", &c.rms_norm_eps, 0.0, 1.0);
  r.number("rope_theta", &c.rope_theta, 1.0, 1e12);
  r.boolean("tie_word_embeddings", &c.tie_word_embeddings);
  r.number("initializer_range", &c.initializer_range, 0.0, 10.0);
  r.choice("hidden_act", &c.hidden_act, {"silu"});
  // Accepted only at the value that means "what this builder does".
  bool attention_bias = false, mlp_bias = false;
  float attention_dropout = 0.f;
  int64_t head_dim = 0;
  r.boolean("attention_bias", &attention_bias);
  r.boolean("mlp_bias", &mlp_bias);
  r.number("attention_dropout", &attention_dropout, 0.0, 1.0);
  r.integer("head_dim", &head_dim, 1, kMaxModelDim);
  if (attention_bias)
    r.fail("model.attention_bias must be false (LLaMA projections have no biases)");
  if (attention_dropout != 0.f)
    r.fail("model.attention_dropout must be 0 (the fused attention has no probability dropout)");
  if (mlp_bias) r.fail("model.mlp_bias must be false (LLaMA projections have no biases)");
  if (j.is_object() && j.contains("rope_scaling") && !j.at("rope_scaling").is_null())
    r.fail("model.rope_scaling must be null (rope scaling is not supported)");
  r.ignore({"rope_scaling", "pretraining_tp"});
  ignore_harmless_hf_keys(r);
  MF_RETURN_IF_ERROR(r.finish());
  MF_RETURN_IF_ERROR(
      require_keys(j, {"num_hidden_layers", "hidden_size", "num_attention_heads",
                       "intermediate_size", "vocab_size", "max_position_embeddings"}));
  MF_RETURN_IF_ERROR(validate_llama_config(c));
  if (head_dim != 0 && head_dim != c.head_dim())
    return Status::invalid(
        "model.head_dim=" + std::to_string(head_dim) +
        " must equal hidden_size / num_attention_heads = " + std::to_string(c.head_dim()));
  return c;
}

Status validate_llama_config(const LlamaConfig& c) {
  MF_RETURN_IF_ERROR(check_positive({{"num_hidden_layers", c.num_hidden_layers},
                                     {"hidden_size", c.hidden_size},
                                     {"num_attention_heads", c.num_attention_heads},
                                     {"intermediate_size", c.intermediate_size},
                                     {"vocab_size", c.vocab_size},
                                     {"max_position_embeddings", c.max_position_embeddings}}));
  const int64_t H = c.num_attention_heads, K = c.kv_heads();
  if (c.hidden_size % H != 0)
    return Status::invalid(
        "model: hidden_size=" + std::to_string(c.hidden_size) +
        " is not divisible by num_attention_heads=" + std::to_string(H) +
        " (head_dim = hidden_size / num_attention_heads must be a whole number)");
  if (H % K != 0)
    return Status::invalid("model: num_key_value_heads=" + std::to_string(K) +
                           " does not divide num_attention_heads=" + std::to_string(H) +
                           " (each key/value head serves heads / kv_heads query heads)");
  if (c.head_dim() % 2 != 0)
    return Status::invalid("model: head_dim=" + std::to_string(c.head_dim()) +
                           " (hidden_size / num_attention_heads) must be even for rotary "
                           "embeddings");
  if (c.hidden_act != "silu")
    return Status::invalid("model.hidden_act must be \"silu\", got \"" + c.hidden_act + "\"");
  return Status::ok();
}

Result<ModelGraph> build_llama(const LlamaConfig& cfg, int64_t batch, int64_t seq) {
  MF_RETURN_IF_ERROR(validate_llama_config(cfg));
  MF_RETURN_IF_ERROR(
      check_batch_seq("llama", batch, seq, cfg.max_position_embeddings, "max_position_embeddings"));
  const int64_t B = batch, T = seq, C = cfg.hidden_size, H = cfg.num_attention_heads,
                K = cfg.kv_heads(), D = cfg.head_dim(), F = cfg.intermediate_size,
                V = cfg.vocab_size, L = cfg.num_hidden_layers;
  const Dim hidden{"hidden", C}, heads{"heads", H}, kv_heads{"kv_heads", K},
      head_dim{"head_dim", D}, ffn{"ffn", F}, vocab{"vocab", V};
  const Init w_init = Init::normal(cfg.initializer_range);
  const float eps = cfg.rms_norm_eps;

  ModelGraph m;
  m.inputs = {"tokens", "targets"};
  try {
    Builder b(m.graph);
    auto param = [&b](const std::string& name, Shape s, Init init) {
      return b.parameter(b.qualify(name), std::move(s), init);
    };
    ValueId tokens = b.input("tokens", Shape{{"batch", B}, {"seq", T}}, DType::I32);
    ValueId targets = b.input("targets", Shape{{"batch", B}, {"seq", T}}, DType::I32);
    ValueId embed = param("model.embed_tokens.weight", Shape{vocab, hidden}, w_init);
    ValueId x = b.embedding(embed, tokens, "model.embed_tokens");  // [B,T,C]
    m.cells.push_back({"model.embed_tokens", -1});

    for (int64_t i = 0; i < L; ++i) {
      m.cells.push_back({"model.layers." + std::to_string(i), static_cast<int>(i)});
      auto block = b.scope(m.cells.back().name, static_cast<int>(i));
      ValueId a = b.rms_norm(x, param("input_layernorm.weight", Shape{hidden}, Init::ones()), eps,
                             "input_layernorm");
      ValueId o;
      {
        auto attn = b.scope("self_attn");
        // [B,T,C] @ [C,n,D] -> [B,T,n,D]; rope (q, k) in this layout; -> [B,n,T,D].
        auto project = [&](const std::string& name, const Dim& n, bool rotate) {
          ValueId w = param(name + ".weight", Shape{hidden, n, head_dim}, w_init);
          ValueId y = b.matmul(a, w, {}, name);
          if (rotate) y = b.rope(y, cfg.rope_theta, name + ".rope");
          return b.transpose(y, {0, 2, 1, 3}, name + ".to_heads");
        };
        ValueId q = project("q_proj", heads, true);
        ValueId k = project("k_proj", kv_heads, true);
        ValueId v = project("v_proj", kv_heads, false);
        ValueId y = b.attention(q, k, v, /*causal=*/true, 0.f, "core");  // [B,H,T,D]
        y = b.transpose(y, {0, 2, 1, 3}, "from_heads");                  // [B,T,H,D]
        ValueId wo = param("o_proj.weight", Shape{heads, head_dim, hidden}, w_init);
        o = b.matmul(y, wo, {.contract = 2}, "o_proj");  // [B,T,C]
      }
      x = b.add(x, o, "residual_attn");
      ValueId h =
          b.rms_norm(x, param("post_attention_layernorm.weight", Shape{hidden}, Init::ones()), eps,
                     "post_attention_layernorm");
      {
        auto mlp = b.scope("mlp");
        ValueId gate =
            b.matmul(h, param("gate_proj.weight", Shape{hidden, ffn}, w_init), {}, "gate_proj");
        ValueId up =
            b.matmul(h, param("up_proj.weight", Shape{hidden, ffn}, w_init), {}, "up_proj");
        ValueId act = b.mul(b.silu(gate, "silu"), up, "swiglu");  // [B,T,F]
        h = b.matmul(act, param("down_proj.weight", Shape{ffn, hidden}, w_init), {}, "down_proj");
      }
      x = b.add(x, h, "residual_mlp");
    }

    x = b.rms_norm(x, param("model.norm.weight", Shape{hidden}, Init::ones()), eps, "model.norm");
    m.cells.push_back({"model.norm", -1});
    m.cells.push_back({"lm_head", -1});
    add_lm_head(b, m.graph, x, cfg.tie_word_embeddings ? embed : kNoValue, vocab, w_init, targets);
  } catch (const StatusError& e) {
    return e.status().with_context("building llama");
  }
  return m;
}

int64_t llama_num_parameters(const LlamaConfig& cfg) {
  const int64_t C = cfg.hidden_size, KD = cfg.kv_heads() * cfg.head_dim(),
                F = cfg.intermediate_size, V = cfg.vocab_size;
  const int64_t attn = C * C + 2 * C * KD + C * C;  // q, k, v, o
  const int64_t mlp = 3 * C * F;
  const int64_t per_layer = attn + mlp + 2 * C;
  return V * C + cfg.num_hidden_layers * per_layer + C + (cfg.tie_word_embeddings ? 0 : C * V);
}

double llama_forward_flops_per_token(const LlamaConfig& cfg, int64_t seq) {
  const double C = cfg.hidden_size, KD = cfg.kv_heads() * cfg.head_dim(), F = cfg.intermediate_size,
               V = cfg.vocab_size, L = cfg.num_hidden_layers;
  const double matmul_weights = L * (2 * C * C + 2 * C * KD + 3 * C * F) + C * V;
  return 2 * matmul_weights + 4 * L * static_cast<double>(seq) * C;
}

}  // namespace meshflow
