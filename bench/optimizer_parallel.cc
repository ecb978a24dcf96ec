// Optimizer parallel side by side (issue 15 §3): plain data parallel, ZeRO-1
// weights sharding ("zero": 1) and weights grouping ("zero": 1, "zero_style":
// "group") on 4 in-process ranks, each from the same config, in one run.
// Per plan: the largest per-rank optimizer-state bytes and peak bytes (the
// executor's memory report), the mean step time and the optimizer's compute
// time per step (its trace spans, collectives excluded), and the bytes each
// rank sends per step (the program's collectives, as `meshflow explain`).
// Two models: the config's GPT (parameters of similar sizes: grouping
// balances to within a few percent of an even split) and the same GPT with a
// 16384-token vocabulary, whose embedding alone outweighs an even share: the
// largest group sets grouping's memory and update time.
//
//   optimizer_parallel [--config configs/gpt_fortunes.json] [--steps 6] [--ranks 4]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/core/file_io.h"
#include "meshflow/core/trace.h"
#include "meshflow/engine/job.h"
#include "meshflow/engine/trainer.h"
#include "meshflow/kernels/cpu/blas_core.h"

using namespace meshflow;
using Clock = std::chrono::steady_clock;

namespace {

struct Plan {
  const char* name;
  std::vector<std::string> set;  // --set overrides
};

struct Row {
  int64_t optimizer = 0, peak = 0;  // bytes, the largest over ranks
  double step_s = 0, opt_compute_s = 0;
  int64_t sent_per_step = 0;  // bytes per rank
  double imbalance = 0;       // grouping: the largest group over an even split
};

// The optimizer's compute spans of one rank's trace (collective spans are
// separate events), in seconds.
double optimizer_compute_s(const std::string& trace_json) {
  double us = 0;
  const nlohmann::json doc = nlohmann::json::parse(trace_json);
  for (const auto& e : doc.at("traceEvents"))
    if (e.value("cat", "") == "optimizer") us += e.value("dur", 0.0);
  return us * 1e-6;
}

Row measure(const RunConfig& rc, int ranks, int steps) {
  const Job job = value_or_throw(resolve_job(rc, ranks));
  std::vector<Row> per(ranks);
  Status s = run_local_ranks(ranks, [&](const std::shared_ptr<Transport>& t) -> Status {
    MF_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> tr, Trainer::create(job, Communicator::world(t)));
    Row& r = per[t->rank()];
    tr->step();  // warm-up: first touches, caches
    TraceWriter tw;
    tr->set_trace(&tw);
    const auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i) tr->step();
    r.step_s = std::chrono::duration<double>(Clock::now() - t0).count() / steps;
    tr->set_trace(nullptr);
    r.opt_compute_s = optimizer_compute_s(tw.to_json()) / steps;
    const MemoryStats m = tr->executor().memory();
    r.optimizer = m.optimizer;
    r.peak = m.total();
    for (const CollectiveRecord& c : tr->program()->collectives)
      r.sent_per_step += c.bytes_per_rank * runs_per_step(c, rc.train.micro_batches);
    if (tr->annotation() && tr->annotation()->groups.on())
      r.imbalance = tr->annotation()->groups.imbalance();
    return Status::ok();
  });
  if (!s.is_ok()) {
    std::fprintf(stderr, "optimizer_parallel: %s\n", s.message().c_str());
    std::exit(1);
  }
  Row out = per[0];
  for (const Row& r : per) {
    out.optimizer = std::max(out.optimizer, r.optimizer);
    out.peak = std::max(out.peak, r.peak);
    out.step_s = std::max(out.step_s, r.step_s);
    out.opt_compute_s = std::max(out.opt_compute_s, r.opt_compute_s);
    out.sent_per_step = std::max(out.sent_per_step, r.sent_per_step);
  }
  return out;
}

double mib(int64_t b) {
  return static_cast<double>(b) / (1 << 20);
}

}  // namespace

int main(int argc, char** argv) {
  meshflow::cpu::use_supported_blas_kernels(argv);  // kernels/cpu/blas_core.h
  std::string config = "configs/gpt_fortunes.json";
  int steps = 6, ranks = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--config") {
      config = argv[i + 1];
    } else if (a == "--steps") {
      steps = std::atoi(argv[i + 1]);
    } else if (a == "--ranks") {
      ranks = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "optimizer_parallel: unknown option %s (--config, --steps, --ranks)\n",
                   a.c_str());
      return 2;
    }
  }
  const std::vector<Plan> plans = {
      {"ddp (zero 0)", {"parallel.mode=data"}},
      {"zero-1 shard", {"parallel.mode=data", "parallel.zero=1"}},
      {"zero-1 group", {"parallel.mode=data", "parallel.zero=1", "parallel.zero_style=group"}},
  };
  struct Model {
    const char* name;
    std::vector<std::string> set;
  };
  // The second model: the config's with a 16384-token vocabulary (a copy of
  // its model file; the byte-level data uses the first 256 ids).
  const nlohmann::json doc = nlohmann::json::parse(value_or_throw(read_regular_file(config)));
  const std::string base = std::filesystem::path(config).parent_path().string();
  nlohmann::json big = nlohmann::json::parse(
      value_or_throw(read_regular_file(resolve_path(doc.at("model").get<std::string>(), base))));
  big["vocab_size"] = 16384;
  const std::string big_path =
      (std::filesystem::temp_directory_path() / "optimizer_parallel_vocab16k.json").string();
  throw_if_error(write_file_atomic(big_path, big.dump(), "optimizer_parallel"));
  const std::vector<Model> models = {
      {"config's GPT", {}},
      {"GPT, vocab 16384 (one dominant parameter)", {"model=" + big_path}},
  };
  for (const Model& model : models) {
    std::printf("\n%s, %d ranks, %d steps (after one warm-up)\n", model.name, ranks, steps);
    std::printf("%-14s %12s %10s %9s %13s %12s %9s\n", "plan", "opt_MiB/rank", "peak_MiB",
                "step_ms", "opt_compute_ms", "sent_MiB/step", "imbalance");
    for (const Plan& p : plans) {
      std::vector<std::string> set = p.set;
      set.insert(set.end(), model.set.begin(), model.set.end());
      RunConfig rc = value_or_throw(load_run_config(config, set));
      const Row r = measure(rc, ranks, steps);
      char imb[16] = "-";
      if (r.imbalance > 0) std::snprintf(imb, sizeof imb, "%.3f", r.imbalance);
      std::printf("%-14s %12.2f %10.2f %9.1f %13.1f %12.2f %9s\n", p.name, mib(r.optimizer),
                  mib(r.peak), 1e3 * r.step_s, 1e3 * r.opt_compute_s, mib(r.sent_per_step), imb);
    }
  }
  return 0;
}
