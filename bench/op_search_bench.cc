// The per-operator strategy search's time (issue 12, "Speed"): the program of
// a model built with shapes only (forward, backward, AdamW), then
// search_strategies on the tp axis with the cluster file's tp links and its
// device's roofline per node. Prints, per case, the graph build time, the
// search time, the classes, columns and rows of the integer program and its
// gap.
//
//   op_search_bench [--cluster configs/clusters/dgx_a100_80gb.json] [--repeat 3]
//
// Cases: GPT-3 175B (96 blocks, tied: one decision per block position) at
// tp=8; LLaMA-3 405B (126 blocks) at tp=8; GPT-3 1.3B with 8 blocks untied
// (every node decides for itself: a graph of ~250 forward nodes with no
// repeated layers) at tp=4 and tp=8.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/config/json_reader.h"
#include "meshflow/kernels/cpu/blas_core.h"
#include "meshflow/models/from_config.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/parallel/strategy_search.h"
#include "meshflow/plan/cluster.h"
#include "meshflow/plan/rank_program.h"
#include "meshflow/runtime/run_config.h"

using namespace meshflow;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Case {
  std::string name, model;
  int64_t blocks = 0;  // 0: the model's own
  int64_t micro_batch = 1, seq = 2048, tp = 8;
  bool tie = true;
};

}  // namespace

int main(int argc, char** argv) {
  meshflow::cpu::use_supported_blas_kernels(argv);  // kernels/cpu/blas_core.h
  std::string cluster_path = "configs/clusters/dgx_a100_80gb.json";
  int repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--cluster")
      cluster_path = argv[i + 1];
    else if (k == "--repeat")
      repeat = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: op_search_bench [--cluster FILE] [--repeat N]\n");
      return 2;
    }
  }
  const plan::Cluster cluster = value_or_throw(plan::load_cluster(cluster_path));
  const std::vector<Case> cases = {
      {"gpt3-175b tied", "configs/models/gpt3_175b.json", 0, 1, 2048, 8, true},
      {"llama3-405b tied", "configs/models/llama3_405b.json", 0, 1, 8192, 8, true},
      {"gpt3-1.3b x8 untied", "configs/models/gpt3_1.3b.json", 8, 4, 2048, 4, false},
      {"gpt3-1.3b x8 untied", "configs/models/gpt3_1.3b.json", 8, 4, 2048, 8, false},
  };
  std::printf("%-22s %4s %7s %8s %7s %7s %8s %9s %9s  %s\n", "case", "tp", "nodes", "classes",
              "cols", "rows", "build s", "search s", "total s", "answer");
  for (const Case& c : cases) {
    ModelConfig model = value_or_throw(parse_model_config(value_or_throw(read_json_file(c.model))));
    if (c.blocks > 0) model = plan::with_blocks(model, c.blocks);
    double best_build = 1e9, best_search = 1e9;
    StrategySearch last;
    int forward = 0;
    for (int r = 0; r < repeat; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      ModelGraph m = value_or_throw(build_model(model, c.micro_batch, c.seq));
      append_backward(m.graph);
      append_optimizer(m.graph, RunConfig{}.optimizer);
      const double build = seconds_since(t0);
      forward = 0;
      for (const Node& n : m.graph.nodes()) forward += n.phase == Phase::kForward;
      const Mesh mesh = value_or_throw(Mesh::parse("dp=1,tp=" + std::to_string(c.tp)));
      plan::Plan p;
      p.tp = c.tp;
      StrategySearchOptions o;
      o.cost = plan::reshard_costs(cluster, mesh,
                                   {plan::axis_stride(p, "dp"), plan::axis_stride(p, "tp")}, 2);
      o.node_time_s = [&](const Graph& g, const Node& n) {
        const OpCost oc = op_cost(g, n);
        return std::max(oc.flops / cluster.device.peak_flops.bf16,
                        oc.bytes / cluster.device.memory_bandwidth_bytes_per_s);
      };
      o.batch_axes = {"dp"};
      o.tie_layers = c.tie;
      const auto t1 = std::chrono::steady_clock::now();
      last = value_or_throw(search_strategies(m.graph, mesh, o));
      const double search = seconds_since(t1);
      best_build = std::min(best_build, build);
      best_search = std::min(best_search, search);
    }
    std::printf("%-22s %4lld %7d %8d %7d %7d %8.3f %9.3f %9.3f  %s\n", c.name.c_str(),
                static_cast<long long>(c.tp), forward, last.classes, last.columns, last.rows,
                best_build, best_search, best_build + best_search,
                last.optimal ? "optimal" : ("gap " + std::to_string(last.gap)).c_str());
    std::fflush(stdout);
  }
  return 0;
}
