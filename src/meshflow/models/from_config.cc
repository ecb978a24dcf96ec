#include "meshflow/models/from_config.h"

#include <cstdio>

#include "meshflow/config/json_reader.h"

namespace meshflow {

namespace {

Result<std::string> model_kind(const nlohmann::json& j) {
  if (!j.is_object())
    return Status::invalid("model must be a JSON object, got " + json_type_name(j));
  if (j.contains("type")) {
    const json& t = j.at("type");
    if (!t.is_string())
      return Status::invalid("model.type must be a string, got " + json_type_name(t));
    const std::string s = t.get<std::string>();
    if (s == "mlp" || s == "gpt" || s == "llama") return s;
    return Status::invalid("model.type must be one of \"mlp\", \"gpt\", \"llama\", got \"" + s +
                           "\"");
  }
  if (j.contains("model_type")) {
    const json& t = j.at("model_type");
    if (!t.is_string())
      return Status::invalid("model.model_type must be a string, got " + json_type_name(t));
    const std::string s = t.get<std::string>();
    if (s == "gpt2") return std::string("gpt");
    if (s == "llama" || s == "resnet") return s;
    return Status::invalid(
        "model.model_type must be one of \"gpt2\", \"llama\", \"resnet\" (Hugging Face "
        "names), got \"" +
        s + "\"");
  }
  return Status::invalid(
      "model: says neither \"type\" (one of \"mlp\", \"gpt\", \"llama\") nor Hugging Face's "
      "\"model_type\" (\"gpt2\", \"llama\", \"resnet\")");
}

std::string millions(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2fM", x / 1e6);
  return buf;
}

}  // namespace

Result<ModelConfig> parse_model_config(const nlohmann::json& j) {
  MF_ASSIGN_OR_RETURN(std::string kind, model_kind(j));
  if (kind == "mlp") {
    MF_ASSIGN_OR_RETURN(MlpConfig c, parse_mlp_config(j));
    return ModelConfig(std::move(c));
  }
  if (kind == "gpt") {
    MF_ASSIGN_OR_RETURN(GptConfig c, parse_gpt_config(j));
    return ModelConfig(std::move(c));
  }
  if (kind == "resnet") {
    MF_ASSIGN_OR_RETURN(ResNetConfig c, parse_resnet_config(j));
    return ModelConfig(std::move(c));
  }
  MF_ASSIGN_OR_RETURN(LlamaConfig c, parse_llama_config(j));
  return ModelConfig(std::move(c));
}

Result<ModelGraph> build_model(const ModelConfig& cfg, int64_t batch, int64_t seq) {
  if (const auto* c = std::get_if<MlpConfig>(&cfg)) return build_mlp(*c, batch);
  if (const auto* c = std::get_if<GptConfig>(&cfg)) return build_gpt(*c, batch, seq);
  if (const auto* c = std::get_if<ResNetConfig>(&cfg)) return build_resnet(*c, batch);
  return build_llama(std::get<LlamaConfig>(cfg), batch, seq);
}

bool is_language_model(const ModelConfig& cfg) {
  return std::holds_alternative<GptConfig>(cfg) || std::holds_alternative<LlamaConfig>(cfg);
}

std::string model_noun(const ModelConfig& cfg) {
  if (std::holds_alternative<MlpConfig>(cfg)) return "an mlp";
  if (std::holds_alternative<ResNetConfig>(cfg)) return "a resnet";
  return std::holds_alternative<GptConfig>(cfg) ? "a gpt2 model" : "a llama model";
}

ModelSummary summarize(const ModelConfig& cfg, int64_t seq) {
  ModelSummary s;
  if (const auto* c = std::get_if<MlpConfig>(&cfg)) {
    s.kind = "mlp";
    s.parameters = mlp_num_parameters(*c);
    s.forward_flops_per_token = mlp_forward_flops_per_example(*c);
    std::string widths;
    for (int64_t h : c->hidden) widths += std::to_string(h) + "-";
    s.text = "mlp " + std::to_string(c->input_dim) + "-" + widths + std::to_string(c->num_classes) +
             " (" + c->activation + "), " + millions(static_cast<double>(s.parameters)) +
             " parameters";
  } else if (const auto* c = std::get_if<ResNetConfig>(&cfg)) {
    s.kind = "resnet";
    Result<ModelGraph> m = build_resnet(*c, 1);
    if (m.is_ok()) {
      s.parameters = count_parameters(m->graph);
      s.forward_flops_per_token = graph_forward_flops(m->graph);  // per image
    }
    std::string sizes;
    for (size_t i = 0; i < c->depths.size(); ++i)
      sizes +=
          (i ? ", " : "") + std::to_string(c->depths[i]) + "x" + std::to_string(c->hidden_sizes[i]);
    s.text = "resnet (" + c->layer_type + "): stages " + sizes + ", " +
             std::to_string(c->image_size) + "x" + std::to_string(c->image_size) + "x" +
             std::to_string(c->num_channels) + " images, " + std::to_string(c->num_labels) +
             " labels, " + millions(static_cast<double>(s.parameters)) + " parameters";
  } else if (const auto* c = std::get_if<GptConfig>(&cfg)) {
    s.kind = "gpt";
    s.parameters = gpt_num_parameters(*c);
    s.forward_flops_per_token = gpt_forward_flops_per_token(*c, seq);
    s.text = "gpt: " + std::to_string(c->n_layer) + " layers, hidden " + std::to_string(c->n_embd) +
             ", " + std::to_string(c->n_head) + " heads, ffn " + std::to_string(c->ffn()) +
             ", vocab " + std::to_string(c->vocab_size) + ", " +
             millions(static_cast<double>(s.parameters)) + " parameters";
  } else {
    const auto& l = std::get<LlamaConfig>(cfg);
    s.kind = "llama";
    s.parameters = llama_num_parameters(l);
    s.forward_flops_per_token = llama_forward_flops_per_token(l, seq);
    s.text = "llama: " + std::to_string(l.num_hidden_layers) + " layers, hidden " +
             std::to_string(l.hidden_size) + ", " + std::to_string(l.num_attention_heads) +
             " heads (" + std::to_string(l.kv_heads()) + " kv), ffn " +
             std::to_string(l.intermediate_size) + ", vocab " + std::to_string(l.vocab_size) +
             ", " + millions(static_cast<double>(s.parameters)) + " parameters";
  }
  return s;
}

}  // namespace meshflow
