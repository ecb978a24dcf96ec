// A multi-layer perceptron classifier (Fashion-MNIST and friends).
//
//   {"type": "mlp", "input_dim": 784, "hidden": [256, 128], "num_classes": 10,
//    "activation": "relu"}
//
//   MF_ASSIGN_OR_RETURN(MlpConfig cfg, parse_mlp_config(j));
//   MF_ASSIGN_OR_RETURN(ModelGraph m, build_mlp(cfg, /*batch=*/64));
//
// Graph: inputs "x" [batch, features] f32 and "labels" [batch] i32;
//   h = act(x @ fc1.weight + fc1.bias) ... ; logits = h @ fcN.weight + fcN.bias [batch, classes].
// Weights are [in, out] (x @ W; see model.h), initialized uniform(+-1/sqrt(in))
// like PyTorch's nn.Linear, biases zero. Hidden layer i's dim is named
// "hidden" for i = 0 and "hidden<i>" after it (names must be unique within a
// weight's shape, e.g. fc2.weight is [hidden, hidden1]).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meshflow/models/model.h"

namespace meshflow {

struct MlpConfig {
  int64_t input_dim = 0;
  std::vector<int64_t> hidden;  // widths of the hidden layers (may be empty: logistic regression)
  int64_t num_classes = 0;
  std::string activation = "relu";  // "relu" | "gelu"
};

// Keys: type ("mlp"), input_dim, hidden, num_classes, activation.
Result<MlpConfig> parse_mlp_config(const nlohmann::json& j);
Status validate_mlp_config(const MlpConfig& cfg);

Result<ModelGraph> build_mlp(const MlpConfig& cfg, int64_t batch);

int64_t mlp_num_parameters(const MlpConfig& cfg);
// Matmul FLOPs of one example's forward pass (2 per multiply-add).
double mlp_forward_flops_per_example(const MlpConfig& cfg);

}  // namespace meshflow
