// GPT-2 style decoder-only transformer, configured with Hugging Face GPT-2
// config.json keys.
//
//   {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4,
//    "n_positions": 128, "vocab_size": 256}
//
//   MF_ASSIGN_OR_RETURN(GptConfig cfg, parse_gpt_config(j));
//   MF_ASSIGN_OR_RETURN(ModelGraph m, build_gpt(cfg, /*batch=*/8, /*seq=*/128));
//
// Legend: B = batch, T = seq, C = hidden (n_embd), H = heads, D = head_dim
// (C / H), F = ffn (n_inner), V = vocab, P = n_positions, L = n_layer.
// Graph (pre-LayerNorm, as GPT-2):
//   x = wte[tokens] + wpe[0:T]                       // [B,T,C]  (+ dropout(embd_pdrop))
//   block i (scope "h.i", layer i):
//     a = ln_1(x)
//     q,k,v = a @ W[C,H,D] + b[H,D] -> transpose [B,H,T,D]; o = causal attention
//     x = x + dropout(transpose(o)[B,T,H,D] @ c_proj.weight[H,D,C] + c_proj.bias[C])
//     x = x + dropout(gelu(ln_2(x) @ c_fc[C,F] + b) @ c_proj[F,C] + b)
//   logits = ln_f(x) @ wte^T (tied) or @ lm_head.weight[C,V]     // [B,T,V]
// Parameters (weights are [in.., out..], x @ W; see model.h):
//   wte.weight [V,C], wpe.weight [P,C], h.i.ln_1.{weight,bias} [C],
//   h.i.attn.{q,k,v}_proj.weight [C,H,D], .bias [H,D], h.i.attn.c_proj.weight [H,D,C], .bias [C],
//   h.i.ln_2.*, h.i.mlp.c_fc.weight [C,F], .bias [F], h.i.mlp.c_proj.weight [F,C], .bias [C],
//   ln_f.{weight,bias} [C], lm_head.weight [C,V] (untied only).
// Init (GPT-2): weights normal(initializer_range), the two c_proj weights
// normal(initializer_range / sqrt(2 L)), biases zero, norm gains one.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "meshflow/models/model.h"

namespace meshflow {

struct GptConfig {
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_head = 0;
  int64_t n_positions = 0;
  int64_t vocab_size = 0;
  int64_t n_inner = 0;  // 0: 4 * n_embd
  float layer_norm_epsilon = 1e-5f;
  bool tie_word_embeddings = true;
  float resid_pdrop = 0.f;
  float embd_pdrop = 0.f;
  float attn_pdrop = 0.f;  // must be 0: the fused attention has no probability dropout
  float initializer_range = 0.02f;
  std::string activation_function = "gelu_new";  // the tanh approximation; the only one

  int64_t head_dim() const { return n_embd / n_head; }
  int64_t ffn() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
};

// Accepts "type": "gpt" or "model_type": "gpt2", the keys of GptConfig, and
// ignores harmless HF keys (architectures, bos/eos_token_id, n_ctx, torch_dtype,
// transformers_version, use_cache, summary_*, task_specific_params, ...).
Result<GptConfig> parse_gpt_config(const nlohmann::json& j);
Status validate_gpt_config(const GptConfig& cfg);

// Inputs "tokens" and "targets", [batch, seq] i32. REQUIRES: seq <= n_positions.
Result<ModelGraph> build_gpt(const GptConfig& cfg, int64_t batch, int64_t seq);

int64_t gpt_num_parameters(const GptConfig& cfg);
// Forward FLOPs per token: 2 per weight of every matmul (lm_head included,
// embedding lookups not) + 4*L*T*C for the attention scores and weighted sum,
// counted as full T x T (the PaLM / Megatron MFU convention) although the
// causal kernel skips about half.
double gpt_forward_flops_per_token(const GptConfig& cfg, int64_t seq);

}  // namespace meshflow
