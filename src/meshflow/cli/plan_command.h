// `meshflow plan` and `meshflow simulate`: the planner on the command line.
//
//   meshflow plan configs/models/gpt3_175b.json --cluster configs/clusters/dgx_a100_80gb.json
//       --gpus 1024 --global-batch 1536 [--seq 2048] [--top 3] [--json] [--out plan.json]
//       [--emit megatron|deepspeed|torchtitan]   (the best plan as that stack's launch config)
//       [--fix tp=8,pp=8,schedule=interleaved] [--time-limit SECONDS]
//   meshflow simulate plan.json --trace step.json      (Chrome trace of one predicted step)
//
// plan prints the best plan and K runners-up (degrees, micro-batching,
// schedule, recompute, ZeRO stage, step time, tokens/s, TFLOP/s, MFU, memory
// per device, communication per step, why each runner-up loses); --json prints
// the same as one object (keys in docs/planner.md, read by other tools);
// --out writes the best plan as a run config fragment (model, train, parallel)
// that `meshflow train` and `meshflow simulate` read. Exit codes: 0 ok, 2 a
// user error (bad file, impossible request: the message says what would fit).
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace meshflow::cli {

struct PlanOptions {
  std::string model;    // model config JSON (Hugging Face keys)
  std::string cluster;  // cluster JSON (configs/clusters/)
  int64_t gpus = 0;
  int64_t global_batch = 0;  // 0: max(512, gpus)
  int64_t seq = 0;           // 0: the model's maximum positions
  int top = 3;
  bool json = false;
  std::string out;
  std::string fix;                  // "tp=8,pp=4"
  std::string attention = "fused";  // fused | flash1 | ... | materialized (Megatron-LM 2021)
  bool attention_given = false;     // --attention on the command line (a model without
                                    // attention refuses it)
  double time_limit_s = 60;         // the search stops here with the best plan so far
  int threads = 0;                  // the search's threads (0: one per core)
  // megatron | deepspeed | torchtitan: print the best plan in that stack's
  // spelling (plan/emit.h) as the only output on stdout.
  std::string emit;
  // The optimizer the job trains with: "adamw" (two f32 states per
  // parameter) or "sgd" (momentum: one), for the model states' memory and
  // the update's traffic.
  std::string optimizer = "adamw";
  // The blocks' linear layers in FP8 (TrainingJob::fp8); needs the cluster
  // file's device.peak_flops.fp8.
  bool fp8 = false;
  // With fp8: "tensorwise" (default) or "rowwise" (TrainingJob::fp8_scaling).
  std::string fp8_scaling;
  bool eager = false;  // the stack runs the model's memory-bound ops eagerly (PyTorch eager mode)
  bool launch_blocking = false;  // kernels launch synchronously (CUDA_LAUNCH_BLOCKING=1)
  // The GPUs' power limit in watts (device.power_limit_w); 0: the file's.
  double power_limit_w = 0;
};

// The most devices `plan --gpus` accepts (about ten times the largest clusters built).
inline constexpr int64_t kMaxPlanDevices = int64_t{1} << 20;
int run_plan(const PlanOptions& o);

struct SimulateOptions {
  std::string plan;   // a file written by `meshflow plan --out`
  std::string trace;  // Chrome trace destination
};
int run_simulate(const SimulateOptions& o);

// Registers the `plan` and `simulate` subcommands (main.cc calls this once).
void add_plan_commands(CLI::App& app);

}  // namespace meshflow::cli
