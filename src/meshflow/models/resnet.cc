#include "meshflow/models/resnet.h"

#include <cmath>

#include "meshflow/config/json_reader.h"
#include "meshflow/ops/builder.h"

namespace meshflow {

int64_t ResNetConfig::num_blocks() const {
  int64_t n = 0;
  for (int64_t d : depths) n += d;
  return n;
}

Result<ResNetConfig> parse_resnet_config(const nlohmann::json& j) {
  ResNetConfig c;
  JsonObjectReader r(j, "model");
  std::string model_type = "resnet";
  r.choice("model_type", &model_type, {"resnet"});
  r.integer("num_channels", &c.num_channels, 1, 4096);
  r.integer("embedding_size", &c.embedding_size, 1, kMaxModelDim);
  r.int_list("hidden_sizes", &c.hidden_sizes, 1);
  r.int_list("depths", &c.depths, 1);
  r.choice("layer_type", &c.layer_type, {"basic", "bottleneck"});
  r.choice("hidden_act", &c.hidden_act, {"relu", "gelu"});
  r.boolean("downsample_in_first_stage", &c.downsample_in_first_stage);
  r.boolean("downsample_in_bottleneck", &c.downsample_in_bottleneck);
  r.integer("num_labels", &c.num_labels, 2, kMaxModelDim);
  r.integer("image_size", &c.image_size, 1, 65536);
  // Keys of transformers' config.json that do not change the computation.
  r.ignore({"architectures", "id2label", "label2id", "torch_dtype", "transformers_version",
            "out_features", "out_indices", "stage_names"});
  MF_RETURN_IF_ERROR(r.finish());
  MF_RETURN_IF_ERROR(validate_resnet_config(c));
  return c;
}

Status validate_resnet_config(const ResNetConfig& c) {
  if (c.hidden_sizes.empty() || c.hidden_sizes.size() != c.depths.size())
    return Status::invalid("model.hidden_sizes has " + std::to_string(c.hidden_sizes.size()) +
                           " stages and model.depths " + std::to_string(c.depths.size()) +
                           "; give one entry per stage in each (at least one)");
  for (size_t i = 0; i < c.depths.size(); ++i) {
    if (c.depths[i] < 1 || c.depths[i] > kMaxModelLayers)
      return Status::invalid("model.depths[" + std::to_string(i) + "] must be in [1, " +
                             std::to_string(kMaxModelLayers) + "], got " +
                             std::to_string(c.depths[i]));
    if (c.hidden_sizes[i] < 1 || c.hidden_sizes[i] > kMaxModelDim)
      return Status::invalid("model.hidden_sizes[" + std::to_string(i) + "] must be >= 1, got " +
                             std::to_string(c.hidden_sizes[i]));
    if (c.layer_type == "bottleneck" && c.hidden_sizes[i] % 4 != 0)
      return Status::invalid("model.hidden_sizes[" + std::to_string(i) +
                             "]=" + std::to_string(c.hidden_sizes[i]) +
                             ": a bottleneck layer reduces by 4; use a multiple of 4");
  }
  return Status::ok();
}

namespace {

class ResNetBuilder {
 public:
  ResNetBuilder(const ResNetConfig& c, Builder& b) : c_(c), b_(b) {}

  // conv (no bias) + batch norm (+ the activation), under `name`.
  ValueId conv_bn(ValueId x, const std::string& name, const Dim& out, int64_t k, int64_t stride,
                  bool act) {
    const Shape& xs = b_.graph().shape(x);
    const Dim in{xs.name(1), xs.size(1)};
    // Kaiming normal (fan_out, relu), as torchvision and transformers initialize.
    const float std = std::sqrt(2.f / static_cast<float>(out.size * k * k));
    const ValueId w = b_.parameter(b_.qualify(name + ".convolution.weight"),
                                   Shape{out, in, {"kh", k}, {"kw", k}}, Init::normal(std));
    Conv2dOpts o;
    o.stride = {stride, stride};
    o.padding = {k / 2, k / 2};
    ValueId y = b_.conv2d(x, w, o, name + ".convolution");
    const Shape ch{out};
    const ValueId gamma =
        b_.parameter(b_.qualify(name + ".normalization.weight"), ch, Init::ones());
    const ValueId beta = b_.parameter(b_.qualify(name + ".normalization.bias"), ch, Init::zeros());
    const ValueId rm = b_.state(b_.qualify(name + ".normalization.running_mean"), ch);
    const ValueId rv = b_.state(b_.qualify(name + ".normalization.running_var"), ch, Init::ones());
    y = b_.batch_norm(y, gamma, beta, rm, rv, 1e-5f, 0.1f, name + ".normalization");
    return act ? activation(y, name + ".act") : y;
  }

  ValueId activation(ValueId x, const std::string& name) {
    return c_.hidden_act == "gelu" ? b_.gelu(x, name) : b_.relu(x, name);
  }

  // One residual layer from `x` to `out` channels.
  ValueId layer(ValueId x, int64_t out, int64_t stride) {
    const Shape& xs = b_.graph().shape(x);
    const bool project = xs.size(1) != out || stride != 1;
    const Dim channels{"channels", out};
    ValueId h;
    if (c_.layer_type == "basic") {
      h = conv_bn(x, "layer.0", {"mid", out}, 3, stride, true);
      h = conv_bn(h, "layer.1", channels, 3, 1, false);
    } else {
      const Dim mid{"mid", out / 4};
      const int64_t s1 = c_.downsample_in_bottleneck ? stride : 1;
      h = conv_bn(x, "layer.0", mid, 1, s1, true);
      h = conv_bn(h, "layer.1", {"mid2", out / 4}, 3, stride / s1, true);
      h = conv_bn(h, "layer.2", channels, 1, 1, false);
    }
    const ValueId shortcut = project ? conv_bn(x, "shortcut", channels, 1, stride, false) : x;
    return activation(b_.add(h, shortcut, "residual"), "activation");
  }

  ValueId build(ValueId x) {
    int64_t block = 0;
    {
      cells_.push_back({"embedder", -1});
      auto s = b_.scope("embedder");
      x = conv_bn(x, "embedder", {"channels", c_.embedding_size}, 7, 2, true);
      x = b_.max_pool2d(x, {{3, 3}, {2, 2}, {1, 1}, {1, 1}}, "pooler");
    }
    for (size_t i = 0; i < c_.depths.size(); ++i) {
      for (int64_t j = 0; j < c_.depths[i]; ++j) {
        const int64_t stride = j > 0 ? 1 : (i > 0 || c_.downsample_in_first_stage) ? 2 : 1;
        const std::string name =
            "encoder.stages." + std::to_string(i) + ".layers." + std::to_string(j);
        cells_.push_back({name, static_cast<int>(block)});
        auto s = b_.scope(name, static_cast<int>(block++));
        x = layer(x, c_.hidden_sizes[i], stride);
      }
    }
    return x;
  }

  std::vector<ModelCell> cells_;  // as build() met them

 private:
  const ResNetConfig& c_;
  Builder& b_;
};

}  // namespace

Result<ModelGraph> build_resnet(const ResNetConfig& c, int64_t batch) {
  MF_RETURN_IF_ERROR(validate_resnet_config(c));
  if (batch < 1) return Status::invalid("resnet: batch must be >= 1, got " + std::to_string(batch));
  ModelGraph m;
  m.inputs = {"x", "labels"};
  try {
    Builder b(m.graph);
    const int64_t s = c.image_size;
    const ValueId flat =
        b.input("x", Shape{{"batch", batch}, {"features", c.num_channels * s * s}});
    const ValueId labels = b.input("labels", Shape{{"batch", batch}}, DType::I32);
    Attrs to_nchw;
    to_nchw.shape =
        Shape{{"batch", batch}, {"channels", c.num_channels}, {"height", s}, {"width", s}};
    ValueId x = b.op1(OpKind::kReshape, {flat}, to_nchw, "to_nchw");
    ResNetBuilder rb(c, b);
    x = rb.build(x);
    m.cells = std::move(rb.cells_);
    m.cells.push_back({"pooler", -1});
    m.cells.push_back({"classifier", -1});
    // pooler: the global average over height and width; then the classifier.
    const Shape& xs = m.graph.shape(x);
    x = b.reduce_mean(x, {2, 3}, false, "pooler");  // [batch, channels]
    const Dim in{xs.name(1), xs.size(1)}, out{"classes", c.num_labels};
    const float bound = 1.f / std::sqrt(static_cast<float>(in.size));
    const ValueId w = b.parameter("classifier.1.weight", Shape{in, out}, Init::uniform(bound));
    const ValueId bias = b.parameter("classifier.1.bias", Shape{out}, Init::uniform(bound));
    const ValueId logits =
        b.bias_add(b.matmul(x, w, {}, "classifier.1"), bias, "classifier.1.bias_add");
    m.graph.loss = b.cross_entropy(logits, labels, "loss");
    m.graph.outputs["logits"] = logits;
    m.graph.outputs["correct"] = b.correct_count(logits, labels, "correct");
  } catch (const StatusError& e) {
    return e.status().with_context("building resnet");
  }
  return m;
}

int64_t resnet_num_parameters(const ResNetConfig& c) {
  Result<ModelGraph> m = build_resnet(c, 1);
  return m.is_ok() ? count_parameters(m->graph) : 0;
}

}  // namespace meshflow
