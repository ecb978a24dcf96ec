// ResNet from Hugging Face ResNetConfig keys (model_type "resnet"), built as
// transformers' ResNetForImageClassification is, with its module names:
//
//   embedder.embedder.{convolution,normalization}  7x7/2 conv, batch norm, act
//   embedder.pooler                                 3x3/2 max pool
//   encoder.stages.<i>.layers.<j>.layer.<k>.{convolution,normalization}
//   encoder.stages.<i>.layers.<j>.shortcut.{convolution,normalization}
//   pooler                                          global average pool
//   classifier.1.{weight,bias}                      [hidden_sizes[-1], num_labels]
//
// "basic" layers: two 3x3 convs; "bottleneck": 1x1 (to out / 4), 3x3, 1x1
// (the stride on the 3x3 unless downsample_in_bottleneck). Convolutions have
// no bias; every one is followed by batch norm. A stage's first layer has
// stride 2 (the first stage's only with downsample_in_first_stage) and a
// 1x1 projection shortcut when the shape changes.
//
// meshflow keys beyond ResNetConfig's: image_size (the input's height and
// width, 224 by default); inputs are x [batch, features = num_channels *
// image_size^2] (the Fashion-MNIST loader's layout) reshaped to NCHW.
//
// Named dims: activations [batch, channels, height, width]; inside a residual
// layer the convs' inner channels are "mid", so {"mid": "tp"} splits a layer
// like Megatron's MLP (first conv by output channels, last by input channels,
// one all_reduce). Each residual layer is one block (node.layer), counted
// across the stages, for the pipeline split and recomputation.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meshflow/models/model.h"

namespace meshflow {

struct ResNetConfig {
  int64_t num_channels = 3;
  int64_t embedding_size = 64;
  std::vector<int64_t> hidden_sizes = {256, 512, 1024, 2048};
  std::vector<int64_t> depths = {3, 4, 6, 3};
  std::string layer_type = "bottleneck";  // "basic" | "bottleneck"
  std::string hidden_act = "relu";        // "relu" | "gelu"
  bool downsample_in_first_stage = false;
  bool downsample_in_bottleneck = false;
  int64_t num_labels = 1000;
  int64_t image_size = 224;
  int64_t num_blocks() const;
};

Result<ResNetConfig> parse_resnet_config(const nlohmann::json& j);
Status validate_resnet_config(const ResNetConfig& c);
Result<ModelGraph> build_resnet(const ResNetConfig& c, int64_t batch);
int64_t resnet_num_parameters(const ResNetConfig& c);

}  // namespace meshflow
