// torch_check: the meshflow half of the numerics check against PyTorch.
//
// Builds a tiny training graph (model + backward + optimizer: AdamW for the
// language models, SGD with momentum for ResNet), runs it on a fixed batch and
// writes what tests/torch/check_model.py compares:
//   weights.safetensors      initial parameters and batch-norm running statistics
//                            (ResNet); metadata: model, config (HF JSON), batch,
//                            seq and the optimizer settings
//   batch.safetensors        gpt / llama: tokens, targets i32 [batch, seq] (some
//                            targets -1: ignored); resnet: x f32 [batch, channels *
//                            image_size^2], labels i32 [batch]
//   grads.safetensors        loss (scalar), grad_norm (scalar), and the gradient of
//                            every parameter under the parameter's name (first step)
//   after_steps.safetensors  parameters (and running statistics) after `steps`
//                            optimizer steps on the same batch; metadata "losses":
//                            the loss before each step
//
//   torch_check gpt OUT_DIR && /usr/bin/python3 tests/torch/check_model.py OUT_DIR
//
// Models: gpt (tied embeddings), gpt_untied, llama (untied), llama_tied,
// resnet_basic, resnet_bottleneck.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/core/file_io.h"
#include "meshflow/core/random.h"
#include "meshflow/io/safetensors.h"
#include "meshflow/models/from_config.h"
#include "meshflow/models/gpt.h"
#include "meshflow/models/hf_weights.h"
#include "meshflow/models/llama.h"
#include "meshflow/models/resnet.h"
#include "meshflow/ops/verify.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

constexpr int64_t kBatch = 3, kSeq = 16, kVocab = 256;
constexpr int64_t kImageBatch = 4;
constexpr int kSteps = 3;

bool is_resnet(const std::string& model) {
  return model.rfind("resnet", 0) == 0;
}

// Larger than the usual 0.02 so attention scores and logits are far from
// uniform and the softmax / mask paths are really exercised.
constexpr float kInitRange = 0.2f;

nlohmann::json model_config(const std::string& model) {
  // resnet_basic: an identity-shortcut stage, then a stride-2 stage with a
  // projection shortcut. resnet_bottleneck: odd spatial sizes (20 -> 10 -> 5
  // -> 3), projections in both stages, an identity bottleneck layer after the
  // stride-2 one.
  if (model == "resnet_basic")
    return {{"model_type", "resnet"}, {"num_channels", 3},
            {"embedding_size", 8},    {"hidden_sizes", {8, 16}},
            {"depths", {1, 1}},       {"layer_type", "basic"},
            {"hidden_act", "relu"},   {"downsample_in_first_stage", false},
            {"num_labels", 5},        {"image_size", 16}};
  if (model == "resnet_bottleneck")
    return {{"model_type", "resnet"}, {"num_channels", 3},
            {"embedding_size", 8},    {"hidden_sizes", {16, 32}},
            {"depths", {1, 2}},       {"layer_type", "bottleneck"},
            {"hidden_act", "relu"},   {"downsample_in_first_stage", false},
            {"num_labels", 5},        {"image_size", 20}};
  if (model == "gpt" || model == "gpt_untied")
    return {{"model_type", "gpt2"},
            {"n_layer", 2},
            {"n_embd", 64},
            {"n_head", 4},
            {"n_positions", 32},
            {"vocab_size", kVocab},
            {"initializer_range", kInitRange},
            {"tie_word_embeddings", model == "gpt"}};
  return {{"model_type", "llama"},
          {"num_hidden_layers", 2},
          {"hidden_size", 64},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"intermediate_size", 128},
          {"vocab_size", kVocab},
          {"max_position_embeddings", 32},
          {"initializer_range", kInitRange},
          {"tie_word_embeddings", model == "llama_tied"}};
}

Result<ModelGraph> build(const std::string& model, const nlohmann::json& cfg) {
  if (is_resnet(model)) {
    MF_ASSIGN_OR_RETURN(ResNetConfig c, parse_resnet_config(cfg));
    return build_resnet(c, kImageBatch);
  }
  if (model.rfind("gpt", 0) == 0) {
    MF_ASSIGN_OR_RETURN(GptConfig c, parse_gpt_config(cfg));
    return build_gpt(c, kBatch, kSeq);
  }
  MF_ASSIGN_OR_RETURN(LlamaConfig c, parse_llama_config(cfg));
  return build_llama(c, kBatch, kSeq);
}

// Norm gains and biases start at 1 and 0; perturb them so their paths carry
// non-trivial values (a gain of exactly 1 hides a missing multiply).
void perturb_gains_and_biases(Executor& ex) {
  const Graph& g = ex.graph();
  for (ValueId v : g.parameters()) {
    const std::string& name = g.value(v).name;
    const bool gain =
        name.find("ln_") != std::string::npos || name.find("norm") != std::string::npos;
    const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (!gain && !bias) continue;
    Tensor& t = ex.storage(v);
    float* p = t.data<float>();
    const uint64_t s = stream_seed(name, 99);
    for (int64_t i = 0; i < t.numel(); ++i) p[i] += 0.1f * normal01(s, i);
  }
}

Tensor tokens_tensor(uint64_t seed, bool with_ignored) {
  Tensor t(Shape{{"batch", kBatch}, {"seq", kSeq}}, DType::I32);
  int32_t* p = t.data<int32_t>();
  const uint64_t s = stream_seed("torch_check.batch", seed);
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<int32_t>(random_bits(s, i) % static_cast<uint64_t>(kVocab));
  if (with_ignored) {  // padding positions: cross-entropy skips negative targets
    p[kSeq - 1] = -1;
    p[2 * kSeq + 5] = -1;
  }
  return t;
}

// ResNet inputs: x ~ N(0, 1) [batch, features], labels uniform in [0, num_labels).
Tensor image_tensor(const Shape& shape) {
  Tensor t(shape, DType::F32);
  float* p = t.data<float>();
  const uint64_t s = stream_seed("torch_check.x", 1);
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = normal01(s, i);
  return t;
}

Tensor labels_tensor(const Shape& shape, int64_t classes) {
  Tensor t(shape, DType::I32);
  int32_t* p = t.data<int32_t>();
  const uint64_t s = stream_seed("torch_check.labels", 2);
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<int32_t>(random_bits(s, i) % static_cast<uint64_t>(classes));
  return t;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Every parameter, then the batch-norm running statistics (the states the
// forward pass updates; not the optimizer's), under their value names.
Status save_weights(Executor& ex, const std::string& path,
                    const std::map<std::string, std::string>& meta) {
  const Graph& g = ex.graph();
  NamedTensors ts;
  for (ValueId v : g.parameters()) ts.emplace_back(g.value(v).name, ex.storage(v));
  for (ValueId v : g.states()) {
    const std::string& name = g.value(v).name;
    if (ends_with(name, ".running_mean") || ends_with(name, ".running_var"))
      ts.emplace_back(name, ex.storage(v));
  }
  return write_safetensors(path, ts, meta);
}

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

Status run(const std::string& model, const std::string& out_dir) {
  const nlohmann::json cfg = model_config(model);
  MF_ASSIGN_OR_RETURN(ModelGraph m, build(model, cfg));
  Graph& g = m.graph;
  append_backward(g);
  OptimizerConfig oc;
  if (is_resnet(model)) {
    // SGD with momentum, as torch.optim.SGD (dampening 0). Weight decay on
    // every parameter (decay_all), as torch.optim.SGD(weight_decay=...) over
    // model.parameters() and torchvision's recipe; large enough (lr * wd *
    // ~5 over the steps ~ 1e-3) that a wrong decay shows above the tolerance.
    // Nesterov on the bottleneck model. No clipping (the norm is still compared).
    oc.kind = OptimizerKind::kSgd;
    oc.lr = 0.05f;
    oc.momentum = 0.9f;
    oc.nesterov = model == "resnet_bottleneck";
    oc.weight_decay = 5e-3f;
    oc.decay_all = true;
    oc.grad_clip = 0.f;
  } else {
    oc.kind = OptimizerKind::kAdamW;
    oc.lr = 5e-3f;
    oc.beta1 = 0.9f;
    oc.beta2 = 0.95f;
    // eps 1e-5, not 1e-8: Adam's first step is lr * g / (|g| + eps), so with eps
    // below the f32 rounding noise of a gradient, an element whose exact gradient
    // is ~0 (a key bias's is exactly 0: softmax ignores a shift shared by all
    // keys) takes a full +-lr step in a direction set by noise, and the check
    // would compare noise. With 1e-5 the update still divides by sqrt(v).
    oc.eps = 1e-5f;
    oc.weight_decay = 0.1f;
    oc.grad_clip = 1.0f;
  }
  append_optimizer(g, oc);
  MF_RETURN_IF_ERROR(verify(g));

  ExecutorOptions eo;
  eo.seed = 1234;
  Executor ex(g, eo);
  perturb_gains_and_biases(ex);

  const bool sgd = oc.kind == OptimizerKind::kSgd;
  std::map<std::string, std::string> meta = {
      {"model", model},
      {"config", cfg.dump()},
      {"batch", std::to_string(is_resnet(model) ? kImageBatch : kBatch)},
      {"steps", std::to_string(kSteps)},
      {"optimizer", sgd ? "sgd" : "adamw"},
      {"lr", fmt(oc.lr)},
      {"weight_decay", fmt(oc.weight_decay)},
      {"decay_all", oc.decay_all ? "true" : "false"},
      {"grad_clip", fmt(oc.grad_clip)},
  };
  if (sgd) {
    meta["momentum"] = fmt(oc.momentum);
    meta["nesterov"] = oc.nesterov ? "true" : "false";
  } else {
    meta["seq"] = std::to_string(kSeq);
    meta["beta1"] = fmt(oc.beta1);
    meta["beta2"] = fmt(oc.beta2);
    meta["eps"] = fmt(oc.eps);
  }
  const std::filesystem::path dir(out_dir);
  MF_RETURN_IF_ERROR(save_weights(ex, (dir / "weights.safetensors").string(), meta));

  NamedTensors batch;
  if (is_resnet(model)) {
    const ValueId labels = g.find("labels");
    batch.emplace_back("x", image_tensor(g.shape(g.find("x"))));
    batch.emplace_back("labels",
                       labels_tensor(g.shape(labels), cfg.at("num_labels").get<int64_t>()));
    // Training mode: batch norm normalizes with the batch's statistics (rng_offset >= 0).
    const int32_t rng[2] = {0, 0};
    MF_RETURN_IF_ERROR(ex.feed_data("rng_offset", rng, sizeof rng));
  } else {
    batch.emplace_back("tokens", tokens_tensor(1, false));
    batch.emplace_back("targets", tokens_tensor(2, true));
  }
  MF_RETURN_IF_ERROR(write_safetensors((dir / "batch.safetensors").string(), batch));
  for (const auto& [name, t] : batch) MF_RETURN_IF_ERROR(ex.feed(name, t));
  ex.feed_scalar("loss_scale", 1.f);

  std::string losses = "[";
  for (int step = 1; step <= kSteps; ++step) {
    ex.run(ex.forward_backward_order());
    const float loss = ex.scalar(g.loss);
    losses += (step > 1 ? ", " : "") + fmt(loss);
    NamedTensors grads;
    if (step == 1) {  // copy now: the optimizer may reuse the gradients' memory
      grads.emplace_back("loss", Tensor::scalar(loss));
      for (ValueId p : g.parameters()) {
        auto it = g.grad_of_param.find(p);
        if (it == g.grad_of_param.end())
          return Status::internal("parameter '" + g.value(p).name + "' has no gradient");
        Tensor t(g.shape(p), DType::F32);
        t.copy_from(ex.data(it->second));
        grads.emplace_back(g.value(p).name, t);
      }
    }
    ex.feed_scalar("lr", oc.lr);
    ex.feed_scalar("step", static_cast<float>(step));
    ex.run(ex.optimizer_order());
    if (step == 1) {
      grads.emplace_back("grad_norm", Tensor::scalar(ex.scalar(g.outputs.at("grad_norm"))));
      MF_RETURN_IF_ERROR(write_safetensors((dir / "grads.safetensors").string(), grads));
    }
    std::printf("torch_check %s: step %d loss %.6f\n", model.c_str(), step, loss);
  }
  std::map<std::string, std::string> after_meta = meta;
  after_meta["losses"] = losses + "]";
  return save_weights(ex, (dir / "after_steps.safetensors").string(), after_meta);
}

// `hf DIR`: the model of DIR/config.json with the transformers-style weights
// of DIR/hf.safetensors (models/hf_weights.h), its loss on DIR/batch.safetensors
// (ours.safetensors), and its parameters written back in transformers' names
// (back.safetensors). tests/torch/hf_check.py writes the inputs and checks.
Status run_hf(const std::string& dir_name) {
  const std::filesystem::path dir(dir_name);
  MF_ASSIGN_OR_RETURN(std::string text, read_regular_file((dir / "config.json").string()));
  MF_ASSIGN_OR_RETURN(const ModelConfig model, parse_model_config(nlohmann::json::parse(text)));
  MF_ASSIGN_OR_RETURN(SafetensorsFile batch,
                      read_safetensors((dir / "batch.safetensors").string()));
  const Tensor& tokens = batch.tensors.at("tokens");
  MF_ASSIGN_OR_RETURN(ModelGraph m,
                      build_model(model, tokens.shape().size(0), tokens.shape().size(1)));
  Graph& g = m.graph;
  std::map<std::string, Shape> shapes;
  for (ValueId v : g.parameters()) shapes.emplace(g.value(v).name, g.shape(v));
  MF_ASSIGN_OR_RETURN(SafetensorsFile hf, read_safetensors((dir / "hf.safetensors").string()));
  if (!is_hf_state_dict(model, hf.tensors))
    return Status::invalid("hf.safetensors is not taken for a transformers state dict");
  MF_ASSIGN_OR_RETURN(auto ours, from_hf_state_dict(model, hf.tensors, shapes));
  Executor ex(g, ExecutorOptions{});
  for (ValueId v : g.parameters()) ex.storage(v).copy_from(ours.at(g.value(v).name).raw());
  MF_RETURN_IF_ERROR(ex.feed("tokens", tokens));
  MF_RETURN_IF_ERROR(ex.feed("targets", batch.tensors.at("targets")));
  ex.run(ex.eval_order());
  const float loss = ex.scalar(g.loss);
  MF_RETURN_IF_ERROR(
      write_safetensors((dir / "ours.safetensors").string(), {{"loss", Tensor::scalar(loss)}}));
  std::map<std::string, Tensor> params;
  for (ValueId v : g.parameters()) params[g.value(v).name] = ex.storage(v);
  MF_ASSIGN_OR_RETURN(auto back, to_hf_state_dict(model, params));
  std::printf("torch_check hf: loss %.7f, %zu tensors written back\n", loss, back.size());
  return write_safetensors((dir / "back.safetensors").string(), back);
}

}  // namespace
}  // namespace meshflow

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "hf") {
    meshflow::Status s = meshflow::run_hf(argv[2]);
    if (!s.is_ok()) std::fprintf(stderr, "torch_check hf: %s\n", s.message().c_str());
    return s.is_ok() ? 0 : 1;
  }
  const std::string usage =
      "usage: torch_check gpt|gpt_untied|llama|llama_tied|resnet_basic|resnet_bottleneck "
      "OUT_DIR\n";
  if (argc != 3) {
    std::fputs(usage.c_str(), stderr);
    return 2;
  }
  const std::string model = argv[1];
  if (model != "gpt" && model != "gpt_untied" && model != "llama" && model != "llama_tied" &&
      model != "resnet_basic" && model != "resnet_bottleneck") {
    std::fprintf(stderr, "torch_check: unknown model '%s'\n%s", model.c_str(), usage.c_str());
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(argv[2], ec);
  try {
    meshflow::Status s = meshflow::run(model, argv[2]);
    if (!s.is_ok()) {
      std::fprintf(stderr, "torch_check %s: %s\n", model.c_str(), s.message().c_str());
      return 1;
    }
  } catch (const meshflow::StatusError& e) {
    std::fprintf(stderr, "torch_check %s: %s\n", model.c_str(), e.what());
    return 1;
  }
  return 0;
}
