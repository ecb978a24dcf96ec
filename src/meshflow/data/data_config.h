// The "data" section of a training config, and opening the dataset it names.
//
//   {"type": "fashion_mnist", "validation": 5000, "normalize": true}
//   {"type": "fortunes", "eval_fraction": 0.05, "split_seed": 0}
//   Optional for both: "dir" (defaults: /usr/share/datasets/fashion-mnist,
//   /usr/share/games/fortunes). fashion_mnist also takes "eval_on": "test" | "validation".
//
//   MF_ASSIGN_OR_RETURN(DataConfig dc, parse_data_config(doc["data"]));
//   MF_ASSIGN_OR_RETURN(std::unique_ptr<Dataset> ds, open_dataset(dc, /*seq_len=*/128));
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <variant>

#include "meshflow/data/fashion_mnist.h"
#include "meshflow/data/text.h"

namespace meshflow {

using DataConfig = std::variant<FashionMnistOptions, TextOptions>;

Result<DataConfig> parse_data_config(const nlohmann::json& j);

// seq_len is used by text datasets (it overrides TextOptions::seq_len).
Result<std::unique_ptr<Dataset>> open_dataset(const DataConfig& cfg, int64_t seq_len);

}  // namespace meshflow
