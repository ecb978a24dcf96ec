// Pipeline schedules measured: schedule x recompute on p in-process ranks
// (one compute thread each) training a small GPT or LLaMA. Prints, per run:
// step time, per-rank peak memory by kind (parameters, gradient
// accumulators, optimizer state, activations = executor arena + measured
// stash high-water mark), and the bubble fraction measured from the trace
// spans next to the textbook formula and the simulator run with the measured
// op times.
//
//   build/bench/pipeline_bench --model gpt --stages 4 --micro-batches 8 --steps 3
//
// Measured bubble of one step = 1 - sum over ranks of compute time (F, B, Bi,
// W spans) / (p x the pipeline phase's wall time: first F start to last
// backward end over all ranks); the optimizer and gradient sync are outside
// it, as in the formulas. ZeRO: the pipeline path has none yet (column "-").
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meshflow/comm/local_world.h"
#include "meshflow/engine/pipeline_trainer.h"
#include "meshflow/kernels/cpu/blas_core.h"

namespace meshflow {
namespace {

struct Args {
  std::string model = "gpt";
  int stages = 4, micro_batches = 8, steps = 3, layers = 8, width = 128, seq = 64, batch = 32;
};

json model_json(const Args& a) {
  if (a.model == "llama")
    return {{"model_type", "llama"},    {"num_hidden_layers", a.layers},
            {"hidden_size", a.width},   {"num_attention_heads", 4},
            {"num_key_value_heads", 2}, {"intermediate_size", 2 * a.width},
            {"vocab_size", 256},        {"max_position_embeddings", a.seq}};
  return {{"model_type", "gpt2"},
          {"n_layer", a.layers},
          {"n_embd", a.width},
          {"n_head", 4},
          {"n_positions", a.seq},
          {"vocab_size", 256},
          {"tie_word_embeddings", false},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0}};
}

RunConfig run_config(const Args& a, const std::string& recompute) {
  json doc = {{"model", model_json(a)},
              {"data", {{"dataset", "fortunes"}}},
              {"train",
               {{"steps", a.steps + 1},
                {"batch_size", a.batch},
                {"seq_len", a.seq},
                {"threads", a.stages},  // one per rank
                {"recompute", recompute}}},
              {"optimizer", {{"type", "adamw"}, {"lr", 1e-3}, {"grad_clip", 1.0}}}};
  return value_or_throw(parse_run_config(doc, ""));
}

struct RankResult {
  std::vector<double> step_s;
  MemoryStats mem;
  int64_t stash_peak = 0;
  std::vector<std::string> traces;  // one JSON per measured step
};

struct Row {
  double step_ms = 0, bubble = 0, formula = 0, simulated = 0;
  std::vector<RankResult> ranks;
};

// Bubble of one step from the ranks' traces; also sums op times for SimCosts.
double measured_bubble(const std::vector<std::string>& traces, std::map<std::string, double>* sum,
                       std::map<std::string, int>* count) {
  double start = 1e300, end = -1e300, busy = 0;
  for (const std::string& t : traces) {
    json doc = json::parse(t);
    for (const json& e : doc["traceEvents"]) {
      if (e.value("ph", "") != "X") continue;
      const std::string cat = e["cat"];
      if (cat != "forward" && cat != "backward" && cat != "weight_grad") continue;
      const double ts = e["ts"], dur = e["dur"];
      start = std::min(start, ts);
      end = std::max(end, ts + dur);
      busy += dur;
      const std::string name = e["name"];
      const std::string kind = name.substr(0, name.find(' '));  // F, B, Bi, W
      (*sum)[kind] += dur;
      (*count)[kind] += 1;
    }
  }
  const double p = static_cast<double>(traces.size());
  return end > start ? 1 - busy / (p * (end - start)) : 0;
}

Row run_case(const Args& a, ScheduleKind kind, int v, const std::string& recompute) {
  const RunConfig rc = run_config(a, recompute);
  PipelineConfig pc;
  pc.stages = a.stages;
  pc.schedule = kind;
  pc.micro_batches = a.micro_batches;
  pc.virtual_stages = v;
  Row row;
  row.ranks.resize(a.stages);
  Status s = run_local_ranks(a.stages, [&](const std::shared_ptr<Transport>& t) -> Status {
    auto world = Communicator::world(t);
    MF_ASSIGN_OR_RETURN(auto pt, PipelineTrainer::create(rc, pc, world));
    RankResult& out = row.ranks[world->rank()];
    pt->step();  // warm-up: first-touch allocations, thread start-up
    for (int i = 0; i < a.steps; ++i) {
      TraceWriter tw;
      pt->set_trace(&tw);
      out.step_s.push_back(pt->step().seconds);
      pt->set_trace(nullptr);
      out.traces.push_back(tw.to_json());
    }
    out.mem = pt->memory();
    out.stash_peak = pt->stash_stats().peak_bytes;
    return Status::ok();
  });
  throw_if_error(s);
  std::map<std::string, double> sum;
  std::map<std::string, int> count;
  for (int i = 0; i < a.steps; ++i) {
    std::vector<std::string> traces;
    double step_s = 0;
    for (const RankResult& r : row.ranks) {
      traces.push_back(r.traces[i]);
      step_s = std::max(step_s, r.step_s[i]);
    }
    row.bubble += measured_bubble(traces, &sum, &count) / a.steps;
    row.step_ms += 1e3 * step_s / a.steps;
  }
  auto mean = [&](const char* k) { return count[k] ? sum[k] / count[k] : 0.0; };
  ScheduleOptions o{kind, a.stages, a.micro_batches, v};
  row.formula = ideal_bubble_fraction(o, SimCosts{});
  SimCosts measured;
  const bool split = splits_backward(kind);
  measured.forward = mean("F");
  measured.backward = split ? mean("Bi") + mean("W") : mean("B");
  if (split) {
    measured.backward_input = mean("Bi");
    measured.backward_weight = mean("W");
  }
  // (zb-v: the trainer's order, made for the chunks' FLOPs, is what ran; the
  // simulation here makes it for the measured times instead.)
  o.zb_v_costs = measured;
  Schedule sched = value_or_throw(make_schedule(o));
  row.simulated = value_or_throw(simulate(sched, measured)).bubble_fraction;
  return row;
}

std::string kib(int64_t bytes) {
  return std::to_string((bytes + 512) / 1024);
}

}  // namespace
}  // namespace meshflow

int main(int argc, char** argv) {
  meshflow::cpu::use_supported_blas_kernels(argv);  // kernels/cpu/blas_core.h
  using namespace meshflow;
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int n = std::atoi(argv[i + 1]);
    if (k == "--model")
      a.model = argv[i + 1];
    else if (k == "--stages")
      a.stages = n;
    else if (k == "--micro-batches")
      a.micro_batches = n;
    else if (k == "--steps")
      a.steps = n;
    else if (k == "--layers")
      a.layers = n;
    else if (k == "--width")
      a.width = n;
    else if (k == "--seq")
      a.seq = n;
    else if (k == "--batch")
      a.batch = n;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  std::printf(
      "\n%s, %d layers, d=%d, seq %d, batch %d; p=%d stages (in-process ranks, 1 compute thread "
      "each), m=%d micro-batches; mean of %d steps after 1 warm-up.\n",
      a.model.c_str(), a.layers, a.width, a.seq, a.batch, a.stages, a.micro_batches, a.steps);
  std::printf(
      "memory in KiB: params/grads/optim = max over ranks; act = arena + stash peak per rank\n");
  std::printf("%-15s %-9s %4s %8s %7s %6s %6s %-28s %7s %7s %7s\n", "schedule", "recompute", "zero",
              "step_ms", "params", "grads", "optim", "act r0/r1/...", "bubble", "formula", "sim");
  struct Case {
    ScheduleKind kind;
    int v;
  };
  for (const Case c : {Case{ScheduleKind::kGPipe, 1}, Case{ScheduleKind::k1F1B, 1},
                       Case{ScheduleKind::kInterleaved, 2}, Case{ScheduleKind::kZbH1, 1},
                       Case{ScheduleKind::kZbV, 2}}) {
    for (const char* recompute : {"none", "full"}) {
      Row row = run_case(a, c.kind, c.v, recompute);
      int64_t params = 0, grads = 0, optim = 0;
      std::string act;
      for (const RankResult& r : row.ranks) {
        params = std::max(params, r.mem.params);
        grads = std::max(grads, r.mem.grads);
        optim = std::max(optim, r.mem.optimizer);
        act += (act.empty() ? "" : "/") + kib(r.mem.arena + r.stash_peak);
      }
      std::string name(schedule_name(c.kind));
      if (c.v > 1) name += " v=" + std::to_string(c.v);
      std::printf("%-15s %-9s %4s %8.1f %7s %6s %6s %-28s %7.3f %7.3f %7.3f\n", name.c_str(),
                  recompute, "-", row.step_ms, kib(params).c_str(), kib(grads).c_str(),
                  kib(optim).c_str(), act.c_str(), row.bubble, row.formula, row.simulated);
      std::fflush(stdout);
    }
  }
  std::printf(
      "bubble: measured from trace spans; formula: (p-1)/(m+p-1), interleaved (p-1)/(v*m+p-1), "
      "zb-h1 (p-1)/(3m+p-1), zb-v (p-1)/(6m+p-1) at unit costs; sim: the simulator with the "
      "measured mean F/B/Bi/W "
      "times. zero '-': the pipeline path has no ZeRO yet. Timings on a shared 2-core machine "
      "with p ranks are indicative only (ranks > cores oversubscribe).\n");
  return 0;
}
