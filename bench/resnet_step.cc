// Times full ResNet training steps (forward + backward + SGD with momentum) in
// meshflow, for bench/resnet_vs_torch.sh, and says where a step's time goes:
// a second, profiled run (the executor's per-op-kind timer) gives the share of
// the convolutions (conv2d + its two gradients: the kernel library's share,
// oneDNN when built with it), of batch norm, and of everything else.
//
//   resnet_step --threads 2 --steps 10 [--batch 32 --image 32 --labels 10
//               --config configs/models/resnet18.json --nodes N]
// Prints one JSON line: {"threads", "images_per_s", "step_ms", "conv_share",
// "batch_norm_share", "other_share", "profile": {op kind: share}, ...}.
// --nodes N also prints the N slowest nodes of one profiled step to stderr.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/core/random.h"
#include "meshflow/engine/trainer.h"
#include "meshflow/kernels/cpu/blas_core.h"
#include "meshflow/kernels/cpu/conv.h"
#include "meshflow/models/model.h"
#include "meshflow/models/resnet.h"
#include "meshflow/ops/verify.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/runtime/executor.h"

using namespace meshflow;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool is_conv(OpKind k) {
  return k == OpKind::kConv2d || k == OpKind::kConv2dGradInput || k == OpKind::kConv2dGradWeight;
}

bool is_batch_norm(OpKind k) {
  return k == OpKind::kBatchNorm || k == OpKind::kBatchNormGrad || k == OpKind::kBatchNormUpdate;
}

}  // namespace

int main(int argc, char** argv) {
  meshflow::cpu::use_supported_blas_kernels(argv);  // kernels/cpu/blas_core.h
  int threads = 1, steps = 10, nodes = 0;
  int64_t batch = 32, image = 32, labels = 10;
  std::string config = "configs/models/resnet18.json";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--threads")
      threads = std::atoi(v.c_str());
    else if (k == "--steps")
      steps = std::atoi(v.c_str());
    else if (k == "--batch")
      batch = std::atoll(v.c_str());
    else if (k == "--image")
      image = std::atoll(v.c_str());
    else if (k == "--labels")
      labels = std::atoll(v.c_str());
    else if (k == "--config")
      config = v;
    else if (k == "--nodes")
      nodes = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "resnet_step: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  set_compute_threads(threads);
  std::ifstream in(config);
  if (!in) {
    std::fprintf(stderr, "resnet_step: cannot read %s (run from the repository root)\n",
                 config.c_str());
    return 2;
  }
  nlohmann::json j = nlohmann::json::parse(in);
  j["image_size"] = image;
  j["num_labels"] = labels;
  ResNetConfig cfg = value_or_throw(parse_resnet_config(j));
  ModelGraph m = value_or_throw(build_resnet(cfg, batch));
  Graph& g = m.graph;
  const int64_t params = count_parameters(g);
  append_backward(g);
  OptimizerConfig oc;
  oc.kind = OptimizerKind::kSgd;
  oc.lr = 0.01f;
  oc.momentum = 0.9f;
  append_optimizer(g, oc);
  throw_if_error(verify(g));
  ExecutorOptions eo;
  eo.seed = 1;
  Executor ex(g, eo);
  Tensor x(g.shape(g.find("x")), DType::F32), y(g.shape(g.find("labels")), DType::I32);
  Rng rng(3);
  for (int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = static_cast<float>(rng.below(2001)) / 1000.f - 1.f;
  for (int64_t i = 0; i < y.numel(); ++i)
    y.data<int32_t>()[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(labels)));
  throw_if_error(ex.feed("x", x));
  throw_if_error(ex.feed("labels", y));
  ex.feed_scalar("loss_scale", 1.f);
  ex.feed_scalar("lr", oc.lr);
  const std::vector<NodeId> order = ex.training_order();
  auto run_step = [&](int s) {
    ex.feed_scalar("step", static_cast<float>(s + 1));
    ex.run(order);
  };
  int s = 0;
  for (; s < 3; ++s) run_step(s);  // warm up (oneDNN builds its primitives here)
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) run_step(s++);
  const double el = seconds_since(t0);
  const float loss = ex.scalar(g.loss);

  // The profiled run, apart from the timed one.
  ex.set_profiling(true);
  for (int i = 0; i < steps; ++i) run_step(s++);
  ex.set_profiling(false);
  const std::vector<double>& by_kind = ex.seconds_by_kind();
  double total = 0, conv = 0, bn = 0;
  for (int k = 0; k < kNumOpKinds; ++k) {
    total += by_kind[k];
    if (is_conv(static_cast<OpKind>(k))) conv += by_kind[k];
    if (is_batch_norm(static_cast<OpKind>(k))) bn += by_kind[k];
  }
  nlohmann::json profile = nlohmann::json::object();
  for (int k = 0; k < kNumOpKinds; ++k)
    if (by_kind[k] > 0)
      profile[std::string(op_name(static_cast<OpKind>(k)))] =
          std::round(1e4 * by_kind[k] / total) / 1e4;

  // Optional: the slowest nodes of one step (time between after_node calls).
  if (nodes > 0) {
    std::vector<std::pair<double, NodeId>> per_node;
    per_node.reserve(order.size());
    for (int rep = 0; rep < 3; ++rep) {  // best of 3 per node
      auto last = Clock::now();
      size_t i = 0;
      ex.feed_scalar("step", static_cast<float>(++s));
      ex.run(order, [&](NodeId id) {
        const auto now = Clock::now();
        const double t = std::chrono::duration<double>(now - last).count();
        if (rep == 0)
          per_node.push_back({t, id});
        else
          per_node[i].first = std::min(per_node[i].first, t);
        ++i;
        last = now;
      });
    }
    double step_total = 0;
    for (auto& p : per_node) step_total += p.first;
    std::sort(per_node.rbegin(), per_node.rend());
    std::fprintf(stderr, "slowest nodes (threads %d, one step %.2f ms):\n", threads,
                 1e3 * step_total);
    for (int i = 0; i < nodes && i < static_cast<int>(per_node.size()); ++i) {
      const Node& n = g.node(per_node[i].second);
      std::string shapes;
      for (ValueId v : n.inputs) shapes += g.shape(v).to_string() + " ";
      std::fprintf(stderr, "  %8.3f ms %5.1f%%  %-18s %-60s %s\n", 1e3 * per_node[i].first,
                   100 * per_node[i].first / step_total, std::string(op_name(n.kind)).c_str(),
                   n.name.c_str(), shapes.c_str());
    }
  }

  nlohmann::json out = {
      {"impl", "meshflow"},
      {"threads", threads},
      {"batch", batch},
      {"image_size", image},
      {"parameters", params},
      {"images_per_s", std::round(10.0 * batch * steps / el) / 10.0},
      {"step_ms", std::round(1e5 * el / steps) / 100.0},
      {"conv_library", cpu::conv_library()},
      {"conv_share", std::round(1e4 * conv / total) / 1e4},
      {"batch_norm_share", std::round(1e4 * bn / total) / 1e4},
      {"other_share", std::round(1e4 * (total - conv - bn) / total) / 1e4},
      {"profiled_step_ms", std::round(1e5 * total / steps) / 100.0},
      {"loss", loss},
      {"profile", profile},
  };
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
