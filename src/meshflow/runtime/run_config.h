// RunConfig: everything `meshflow train CONFIG.json` reads, parsed strictly
// (config/json_reader.h): an unknown key, a wrong type or an out-of-range value
// is a one-line error naming the key and what is valid.
//
//   {
//     "model": "configs/models/gpt_tiny.json"  (or the model object inline),
//     "data": {"dataset": "fortunes", "eval_fraction": 0.05},
//     "train": {"steps": 2000, "batch_size": 16, "seq_len": 128, "micro_batches": 1,
//               "seed": 1, "log_every": 10, "eval_every": 500, "eval_batches": 20, "threads": 2},
//     "optimizer": {"type": "adamw", "lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 100,
//                   "schedule": "cosine", "weight_decay": 0.1, "betas": [0.9, 0.95],
//                   "eps": 1e-8, "grad_clip": 1.0},
//     "parallel": {"mode": "semi", "mesh": "dp=2,tp=2", "preset": "megatron", "zero": 1},
//     "offload": {"optimizer": "disk", "params": "none", "dir": "/mnt/nvme", "prefetch": 8}
//   }
// Relative paths are resolved against the config file's directory, then the
// current directory.
#pragma once

#include <string>
#include <vector>

#include "meshflow/autodiff/recompute.h"
#include "meshflow/config/json_reader.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/parallel/strategy.h"
#include "meshflow/runtime/offload.h"

namespace meshflow {

struct DataConfig {
  std::string dataset;  // "fashion_mnist" | "fortunes"
  std::string path;     // optional override of the Debian package's location
  float eval_fraction = 0.05f;
  // Training-image augmentation ("augment": {"crop_padding": 2, "flip": true}):
  // a random crop of the image padded with zeros by crop_padding on each side,
  // and a horizontal flip half the time; deterministic by (seed, position).
  int crop_padding = 0;
  bool flip = false;
};

struct TrainConfig {
  int steps = 100;
  int batch_size = 32;    // global batch (all micro-batches)
  int micro_batches = 1;  // gradient accumulation steps
  int seq_len = 128;      // language models
  uint64_t seed = 1;
  int log_every = 10;
  int eval_every = 0;  // 0: only at the end
  int eval_batches = 20;
  int threads = 0;  // 0: all cores
  // Written at the end (and every save_every steps): a directory of
  // full-state sharded checkpoints (engine/state_checkpoint.h:
  // checkpoint/step-NNNNNNNN/, which --resume continues from), or, for a path
  // ending in .safetensors, one file of the weights alone (gathered).
  std::string checkpoint;
  int save_every = 0;
  int keep_checkpoints = 0;  // full-state checkpoints kept (the newest); 0: all
  // The save_every checkpoints of a directory written in the background
  // (engine/state_checkpoint.h BackgroundSave): the step waits only for a
  // copy of this rank's blocks; the commit follows at the first step
  // boundary after every rank has written. The final checkpoint is waited for.
  bool async_save = false;
  // A step whose loss or gradients are not finite: "stop" the run with an
  // error naming the step and the first parameter whose gradient is not
  // finite, or "skip" its update (the weights and optimizer state stay) and go on.
  bool skip_nonfinite = false;
  float bucket_mib = 4.f;    // data parallel: gradient all-reduce bucket size
  bool overlap_comm = true;  // data parallel: start all-reduces during the backward
  // Activation recomputation (autodiff/recompute.h): "recompute": "none" |
  // "full" (every op of the blocks) | "selective" (the attention core) | "ops"
  // (with "recompute_ops": [names or globs]); "recompute_layers": [blocks] (all if absent),
  // block numbers or cell names ("encoder.stages.*", models/cells.h).
  RecomputePolicy recompute;
  // recompute_layers given by cell name; the job resolves them against the
  // model into recompute.layers (engine/job.h).
  std::vector<std::string> recompute_cells;
};

struct RunConfig {
  json model;                // the model object (HF-style keys)
  std::string model_source;  // where it came from, for messages
  // The config as parsed (--set overrides applied, "model" the object): what
  // a checkpoint's manifest records as the run's config.
  json document;
  DataConfig data;
  TrainConfig train;
  OptimizerConfig optimizer;
  LrSchedule schedule;
  // "parallel": how the ranks split the work (parallel/strategy.h). Absent or
  // mode "data": data parallel over all ranks (runtime/grad_buckets.h).
  // "semi" / "auto": the SPMD partitioner (parallel/partition.h).
  StrategyConfig parallel;
  bool has_parallel = false;
  // "offload": the optimizer state ("optimizer": "disk") and the parameters
  // ("params": "disk") in memory-mapped files in "dir", streamed around each
  // node with "prefetch" nodes of lookahead (runtime/offload.h).
  OffloadOptions offload;
};

// Parses a run config's "optimizer" section (what a plan file carries too);
// `steps` ends its learning-rate schedule.
Status parse_optimizer(const json& j, OptimizerConfig* o, LrSchedule* s, int steps);
// Parses a whole run config. base_dir resolves relative paths.
Result<RunConfig> parse_run_config(const json& doc, const std::string& base_dir);
// Reads CONFIG.json, applies --set overrides, parses.
Result<RunConfig> load_run_config(const std::string& path,
                                  const std::vector<std::string>& overrides);
// Resolves a path relative to base_dir if it exists there, else as given.
std::string resolve_path(const std::string& path, const std::string& base_dir);

}  // namespace meshflow
