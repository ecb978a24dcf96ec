// LLaMA-style decoder (RMSNorm, rotary embeddings, grouped-query attention,
// SwiGLU MLP, no biases), configured with Hugging Face LlamaConfig keys.
//
//   {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
//    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 176,
//    "vocab_size": 256, "max_position_embeddings": 256}
//
//   MF_ASSIGN_OR_RETURN(LlamaConfig cfg, parse_llama_config(j));
//   MF_ASSIGN_OR_RETURN(ModelGraph m, build_llama(cfg, /*batch=*/8, /*seq=*/128));
//
// Legend: B = batch, T = seq, C = hidden, H = heads, K = kv_heads, D = head_dim
// (C / H), F = ffn (intermediate_size), V = vocab, L = layers.
// Graph:
//   x = embed_tokens[tokens]                                   // [B,T,C]
//   block i (scope "model.layers.i", layer i):
//     a = input_layernorm(x)
//     q = rope(a @ q_proj[C,H,D]); k = rope(a @ k_proj[C,K,D]); v = a @ v_proj[C,K,D]
//         (rope in [B,T,heads,D] layout, then transpose to [B,heads,T,D])
//     x = x + transpose(gqa_causal_attention(q, k, v)) @ o_proj[H,D,C]
//     a = post_attention_layernorm(x)
//     x = x + (silu(a @ gate_proj[C,F]) * (a @ up_proj[C,F])) @ down_proj[F,C]
//   logits = model.norm(x) @ lm_head.weight[C,V]   (or @ embed_tokens^T when tied)
// Parameter names are HF's: model.embed_tokens.weight [V,C],
// model.layers.i.{input_layernorm,post_attention_layernorm}.weight [C],
// model.layers.i.self_attn.{q,k,v,o}_proj.weight, model.layers.i.mlp.{gate,up,down}_proj.weight,
// model.norm.weight [C], lm_head.weight [C,V]. Weights are [in.., out..] (x @ W), the
// transpose of HF's [out, in] (see model.h). Init: every weight
// normal(initializer_range), norm gains one (as HF LlamaPreTrainedModel).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "meshflow/models/model.h"

namespace meshflow {

struct LlamaConfig {
  int64_t num_hidden_layers = 0;
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // 0: = num_attention_heads (multi-head attention)
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.f;
  bool tie_word_embeddings = false;
  float initializer_range = 0.02f;
  std::string hidden_act = "silu";

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t kv_heads() const {
    return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads;
  }
};

// Accepts "type": "llama" or "model_type": "llama", the keys of LlamaConfig,
// and ignores harmless HF keys (architectures, bos/eos/pad_token_id, pretraining_tp,
// torch_dtype, ...). attention_bias / mlp_bias must be false, attention_dropout 0,
// rope_scaling null, head_dim (if given) hidden_size / num_attention_heads.
Result<LlamaConfig> parse_llama_config(const nlohmann::json& j);
Status validate_llama_config(const LlamaConfig& cfg);

// Inputs "tokens" and "targets", [batch, seq] i32. REQUIRES: seq <= max_position_embeddings.
Result<ModelGraph> build_llama(const LlamaConfig& cfg, int64_t batch, int64_t seq);

int64_t llama_num_parameters(const LlamaConfig& cfg);
// Same convention as gpt_forward_flops_per_token: 2 per matmul weight
// (lm_head included) + 4*L*T*C for attention at full T x T.
double llama_forward_flops_per_token(const LlamaConfig& cfg, int64_t seq);

}  // namespace meshflow
