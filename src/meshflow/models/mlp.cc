#include "meshflow/models/mlp.h"

#include <cmath>

#include "meshflow/config/json_reader.h"
#include "meshflow/ops/builder.h"

namespace meshflow {

Result<MlpConfig> parse_mlp_config(const nlohmann::json& j) {
  MlpConfig c;
  JsonObjectReader r(j, "model");
  std::string type = "mlp";
  r.choice("type", &type, {"mlp"});
  r.integer("input_dim", &c.input_dim, 1, kMaxModelDim);
  r.int_list("hidden", &c.hidden, 1);
  r.integer("num_classes", &c.num_classes, 2, kMaxModelDim);
  r.choice("activation", &c.activation, {"relu", "gelu"});
  MF_RETURN_IF_ERROR(r.finish());
  // Required keys are checked after finish() so a misspelled key is reported
  // as unknown rather than as a missing one.
  for (const char* key : {"input_dim", "num_classes"})
    if (!j.contains(key)) return Status::invalid(std::string("model.") + key + " is required");
  MF_RETURN_IF_ERROR(validate_mlp_config(c));
  return c;
}

Status validate_mlp_config(const MlpConfig& c) {
  if (c.input_dim < 1)
    return Status::invalid("model.input_dim must be >= 1, got " + std::to_string(c.input_dim));
  if (c.num_classes < 2)
    return Status::invalid("model.num_classes must be >= 2, got " + std::to_string(c.num_classes));
  for (size_t i = 0; i < c.hidden.size(); ++i)
    if (c.hidden[i] < 1 || c.hidden[i] > kMaxModelDim)
      return Status::invalid("model.hidden[" + std::to_string(i) + "] must be in [1, " +
                             std::to_string(kMaxModelDim) + "], got " +
                             std::to_string(c.hidden[i]));
  if (static_cast<int64_t>(c.hidden.size()) > kMaxModelLayers)
    return Status::invalid("model.hidden has " + std::to_string(c.hidden.size()) +
                           " layers; at most " + std::to_string(kMaxModelLayers));
  if (c.activation != "relu" && c.activation != "gelu")
    return Status::invalid("model.activation must be one of \"relu\", \"gelu\", got \"" +
                           c.activation + "\"");
  return Status::ok();
}

namespace {

std::string hidden_dim_name(size_t i) {
  return i == 0 ? "hidden" : "hidden" + std::to_string(i);
}

}  // namespace

Result<ModelGraph> build_mlp(const MlpConfig& cfg, int64_t batch) {
  MF_RETURN_IF_ERROR(validate_mlp_config(cfg));
  if (batch < 1) return Status::invalid("mlp: batch must be >= 1, got " + std::to_string(batch));
  ModelGraph m;
  m.inputs = {"x", "labels"};
  try {
    Builder b(m.graph);
    ValueId h = b.input("x", Shape{{"batch", batch}, {"features", cfg.input_dim}});
    ValueId labels = b.input("labels", Shape{{"batch", batch}}, DType::I32);
    Dim in{"features", cfg.input_dim};
    const size_t n_layers = cfg.hidden.size() + 1;
    for (size_t i = 0; i < n_layers; ++i) {
      const bool last = i + 1 == n_layers;
      Dim out = last ? Dim{"classes", cfg.num_classes} : Dim{hidden_dim_name(i), cfg.hidden[i]};
      const std::string fc = "fc" + std::to_string(i + 1);
      m.cells.push_back({fc, -1});
      const float bound = 1.f / std::sqrt(static_cast<float>(in.size));
      ValueId w = b.parameter(fc + ".weight", Shape{in, out}, Init::uniform(bound));
      ValueId bias = b.parameter(fc + ".bias", Shape{out}, Init::zeros());
      h = b.bias_add(b.matmul(h, w, {}, fc), bias, fc + ".bias_add");  // [batch, out]
      if (!last) h = cfg.activation == "gelu" ? b.gelu(h, fc + ".act") : b.relu(h, fc + ".act");
      in = out;
    }
    m.graph.loss = b.cross_entropy(h, labels, "loss");
    m.graph.outputs["logits"] = h;
    m.graph.outputs["correct"] = b.correct_count(h, labels, "correct");
  } catch (const StatusError& e) {
    return e.status().with_context("building mlp");
  }
  return m;
}

int64_t mlp_num_parameters(const MlpConfig& cfg) {
  int64_t n = 0, in = cfg.input_dim;
  for (int64_t h : cfg.hidden) {
    n += in * h + h;
    in = h;
  }
  return n + in * cfg.num_classes + cfg.num_classes;
}

double mlp_forward_flops_per_example(const MlpConfig& cfg) {
  double f = 0;
  int64_t in = cfg.input_dim;
  for (int64_t h : cfg.hidden) {
    f += 2.0 * in * h;
    in = h;
  }
  return f + 2.0 * in * cfg.num_classes;
}

}  // namespace meshflow
