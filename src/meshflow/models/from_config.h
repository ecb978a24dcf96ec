// Any model from its JSON config: picks the builder by "type" ("mlp", "gpt",
// "llama") or by Hugging Face's "model_type" ("gpt2", "llama"), so an HF
// config.json can be used as it is.
//
//   MF_ASSIGN_OR_RETURN(ModelConfig cfg, parse_model_config(doc["model"]));
//   ModelSummary s = summarize(cfg, /*seq=*/128);   // "gpt: 2 layers, ..., 0.43M parameters"
//   MF_ASSIGN_OR_RETURN(ModelGraph m, build_model(cfg, /*batch=*/8, /*seq=*/128));
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <variant>

#include "meshflow/models/gpt.h"
#include "meshflow/models/llama.h"
#include "meshflow/models/mlp.h"
#include "meshflow/models/resnet.h"

namespace meshflow {

using ModelConfig = std::variant<MlpConfig, GptConfig, LlamaConfig, ResNetConfig>;

Result<ModelConfig> parse_model_config(const nlohmann::json& j);

// seq is ignored by the MLP and ResNet (their inputs are sized by the config).
Result<ModelGraph> build_model(const ModelConfig& cfg, int64_t batch, int64_t seq);

// True for language models (inputs tokens/targets [batch, seq]).
bool is_language_model(const ModelConfig& cfg);
// The model's kind as a message names it: "an mlp", "a resnet", "a gpt2
// model", "a llama model".
std::string model_noun(const ModelConfig& cfg);

struct ModelSummary {
  std::string kind;  // "mlp" | "gpt" | "llama" | "resnet"
  int64_t parameters = 0;
  // Forward FLOPs per token (LMs; see gpt_forward_flops_per_token) or per
  // example (MLP). Training is about 3x this.
  double forward_flops_per_token = 0;
  std::string text;  // one line for logs
};
ModelSummary summarize(const ModelConfig& cfg, int64_t seq);

}  // namespace meshflow
