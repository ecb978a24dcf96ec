// Small helpers shared by the model config parsers and builders (internal to
// models/). Messages follow the "model.<key> ..." form of JsonObjectReader.
//
//   ignore_harmless_hf_keys(r);                         // architectures, torch_dtype, ...
//   MF_RETURN_IF_ERROR(r.finish());                     // unknown keys first
//   MF_RETURN_IF_ERROR(require_keys(j, {"n_layer"}));   // then missing ones
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "meshflow/config/json_reader.h"

namespace meshflow {

// Marks as known the Hugging Face config.json keys that do not change the
// computation (metadata, tokenizer ids, generation and hub settings).
inline void ignore_harmless_hf_keys(JsonObjectReader& r) {
  r.ignore({"architectures", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype",
            "transformers_version", "use_cache", "task_specific_params", "_name_or_path",
            "id2label", "label2id", "tokenizer_class", "prefix", "output_past"});
}

// "model.<key> is required" for the first absent key.
inline Status require_keys(const json& j, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (!j.contains(k)) return Status::invalid(std::string("model.") + k + " is required");
  return Status::ok();
}

// "model.<key> must be >= 1, got 0" for the first non-positive value.
inline Status check_positive(std::initializer_list<std::pair<const char*, int64_t>> fields) {
  for (const auto& [key, v] : fields)
    if (v < 1)
      return Status::invalid(std::string("model.") + key + " must be >= 1, got " +
                             std::to_string(v));
  return Status::ok();
}

inline Status check_batch_seq(const char* model, int64_t batch, int64_t seq, int64_t max_seq,
                              const char* max_key) {
  if (batch < 1)
    return Status::invalid(std::string(model) + ": batch must be >= 1, got " +
                           std::to_string(batch));
  if (seq < 1)
    return Status::invalid(std::string(model) + ": seq must be >= 1, got " + std::to_string(seq));
  if (seq > max_seq)
    return Status::invalid(std::string(model) + ": seq=" + std::to_string(seq) + " exceeds " +
                           max_key + "=" + std::to_string(max_seq) +
                           " (the longest sequence the model supports)");
  return Status::ok();
}

}  // namespace meshflow
