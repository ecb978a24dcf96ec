// Hugging Face `transformers` state dicts for the models meshflow builds:
// GPT-2 (GPT2LMHeadModel: `transformer.h.0.attn.c_attn.weight`, Conv1D
// weights stored [in, out], q, k and v in one c_attn matrix) and LLaMA
// (LlamaForCausalLM: `model.layers.0.self_attn.q_proj.weight`, nn.Linear
// weights stored [out, in]), read into meshflow's parameters and written
// back, name for name, exactly (a permutation of the same floats).
//
//   if (is_hf_state_dict(model, file.tensors)) {
//     MF_ASSIGN_OR_RETURN(auto ours, from_hf_state_dict(model, file.tensors, shapes));
//   }
//   NamedTensors hf = to_hf_state_dict(model, ours);   // names and layouts as transformers'
//
// meshflow's own names: GPT-2's without the `transformer.` prefix, q, k and v
// apart (`h.0.attn.q_proj.weight` [hidden, heads, head_dim]); LLaMA's as
// transformers' but [in.., out..]. RoPE is the same (rotate_half), so no
// weight permutation is needed.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "meshflow/core/shape.h"
#include "meshflow/core/status.h"
#include "meshflow/core/tensor.h"
#include "meshflow/models/from_config.h"

namespace meshflow {

// Whether `tensors` are named and laid out as transformers' for `model`
// (GPT-2: a `c_attn` weight; LLaMA: a 2-D q_proj weight). Other models: false.
bool is_hf_state_dict(const ModelConfig& model, const std::map<std::string, Tensor>& tensors);

// meshflow's parameters (`shapes`: name -> shape, the model's) from a
// transformers state dict. Buffers transformers keeps that meshflow computes
// (`attn.bias`, `attn.masked_bias`, `rotary_emb.inv_freq`) are ignored; a
// tied `lm_head.weight` must equal the embedding. Errors name the
// transformers tensor that is missing or of the wrong shape, or left unused.
Result<std::map<std::string, Tensor>> from_hf_state_dict(
    const ModelConfig& model, const std::map<std::string, Tensor>& hf,
    const std::map<std::string, Shape>& shapes);

// The transformers state dict of meshflow's parameters `ours` (GPT-2 under
// `transformer.`, the tied lm_head left out as save_pretrained does).
// Errors: not a GPT-2 or LLaMA, or a parameter missing.
Result<std::vector<std::pair<std::string, Tensor>>> to_hf_state_dict(
    const ModelConfig& model, const std::map<std::string, Tensor>& ours);

}  // namespace meshflow
