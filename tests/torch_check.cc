// torch_check: the meshflow half of the numerics check against PyTorch.
//
// Builds a tiny GPT or LLaMA training graph (model + backward + AdamW), runs it
// on a fixed batch and writes what tests/torch/check_model.py compares:
//   weights.safetensors     initial parameters; metadata: model, config (HF JSON),
//                           batch, seq and the optimizer settings
//   batch.safetensors       tokens, targets: i32 [batch, seq] (some targets -1: ignored)
//   grads.safetensors       loss (scalar), grad_norm (scalar), and the gradient of
//                           every parameter under the parameter's name (first step)
//   after_adam.safetensors  parameters after `steps` AdamW steps on the same batch;
//                           metadata "losses": the loss before each step
//
//   torch_check gpt OUT_DIR && /usr/bin/python3 tests/torch/check_model.py OUT_DIR
//
// Models: gpt (tied embeddings), gpt_untied, llama (untied), llama_tied.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/core/random.h"
#include "meshflow/io/safetensors.h"
#include "meshflow/models/gpt.h"
#include "meshflow/models/llama.h"
#include "meshflow/ops/verify.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

constexpr int64_t kBatch = 3, kSeq = 16, kVocab = 256;
constexpr int kSteps = 3;

// Larger than the usual 0.02 so attention scores and logits are far from
// uniform and the softmax / mask paths are really exercised.
constexpr float kInitRange = 0.2f;

nlohmann::json model_config(const std::string& model) {
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
  append_optimizer(g, oc);
  MF_RETURN_IF_ERROR(verify(g));

  ExecutorOptions eo;
  eo.seed = 1234;
  Executor ex(g, eo);
  perturb_gains_and_biases(ex);

  const std::map<std::string, std::string> meta = {
      {"model", model},
      {"config", cfg.dump()},
      {"batch", std::to_string(kBatch)},
      {"seq", std::to_string(kSeq)},
      {"steps", std::to_string(kSteps)},
      {"lr", fmt(oc.lr)},
      {"beta1", fmt(oc.beta1)},
      {"beta2", fmt(oc.beta2)},
      {"eps", fmt(oc.eps)},
      {"weight_decay", fmt(oc.weight_decay)},
      {"grad_clip", fmt(oc.grad_clip)},
  };
  const std::filesystem::path dir(out_dir);
  MF_RETURN_IF_ERROR(save_parameters(ex, (dir / "weights.safetensors").string(), meta));

  const Tensor tokens = tokens_tensor(1, false), targets = tokens_tensor(2, true);
  MF_RETURN_IF_ERROR(write_safetensors((dir / "batch.safetensors").string(),
                                       {{"tokens", tokens}, {"targets", targets}}));
  MF_RETURN_IF_ERROR(ex.feed("tokens", tokens));
  MF_RETURN_IF_ERROR(ex.feed("targets", targets));
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
  return save_parameters(ex, (dir / "after_adam.safetensors").string(), after_meta);
}

}  // namespace
}  // namespace meshflow

int main(int argc, char** argv) {
  const std::string usage = "usage: torch_check gpt|gpt_untied|llama|llama_tied OUT_DIR\n";
  if (argc != 3) {
    std::fputs(usage.c_str(), stderr);
    return 2;
  }
  const std::string model = argv[1];
  if (model != "gpt" && model != "gpt_untied" && model != "llama" && model != "llama_tied") {
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
