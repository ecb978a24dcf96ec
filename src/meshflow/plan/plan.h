// Plan: one way to train a transformer on a cluster, as the planner prices it
// and `meshflow plan --out` writes it: the mesh degrees (data, tensor,
// pipeline, context), sequence parallelism, the pipeline schedule with its
// virtual stages, micro-batching, the recompute policy and the ZeRO stage.
//
//   Plan p;  p.dp = 16; p.tp = 8; p.pp = 8; p.vp = 2;
//   p.micro_batch = 1; p.num_micro_batches = 96;
//   p.schedule = ScheduleKind::kInterleaved; p.recompute = Recompute::kFull;
//   std::string s = plan_label(p);   // "dp=16 tp=8 pp=8 vp=2 mb=1x96 interleaved full zero0"
//   (recompute_layers = 3: "... interleaved full:3 zero0")
//
// Invariant (the search only makes such plans; validate_plan says why not):
// dp * tp * pp * cp = the number of devices; vp > 1 only with kInterleaved;
// pp == 1 uses k1F1B (no pipeline: one stage, micro-batches accumulate).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshflow/core/status.h"
#include "meshflow/pipeline/schedule.h"

namespace meshflow {
struct StrategySearch;  // parallel/strategy_search.h
}

namespace meshflow::plan {

enum class Recompute { kNone, kSelective, kFull };

// "none", "selective", "full" and back.
const char* recompute_name(Recompute r);
Result<Recompute> parse_recompute(const std::string& s);

// Where the optimizer state (fp32 master weights, moments) of a ZeRO plan
// lives: on the device, in host memory (ZeRO-Offload: the update runs on the
// CPU, gradients go down and weights come up over PCIe), or on the node's
// NVMe (ZeRO-Infinity: host memory as a staging buffer, the state read and
// written each step). Priced from the cluster file's "host" section.
enum class Offload { kNone, kHost, kNvme };
const char* offload_name(Offload o);  // "none", "host", "nvme"
Result<Offload> parse_offload(const std::string& s);

struct Plan {
  int64_t dp = 1;                 // data-parallel replicas
  int64_t tp = 1;                 // tensor-parallel (Megatron: heads and ffn split)
  int64_t pp = 1;                 // pipeline stages
  int64_t cp = 1;                 // context-parallel (sequence split across ranks, ring attention)
  bool sp = false;                // sequence parallelism inside the tp group (Korthikanti 2022)
  int64_t vp = 1;                 // virtual stages (model chunks) per pipeline rank
  int64_t micro_batch = 1;        // sequences per micro-batch (per data-parallel replica)
  int64_t num_micro_batches = 1;  // per step per replica: global_batch / (dp * micro_batch)
  // The runtime's schedules (pipeline/schedule.h): one enum, one parser
  // (parse_schedule_kind), one generator of the per-rank orders.
  ScheduleKind schedule = ScheduleKind::k1F1B;
  Recompute recompute = Recompute::kNone;
  // With kFull: the first recompute_layers blocks of each pipeline chunk
  // recompute their forward, the rest keep their activations (Megatron-LM's
  // --recompute-method block --recompute-num-layers N; MindSpore's
  // recompute by cell). 0: every block.
  int64_t recompute_layers = 0;
  int zero = 0;                      // ZeRO stage 0..3, over the dp * cp replicas
  Offload offload = Offload::kNone;  // the optimizer state off the device (zero >= 1)
  // ZeRO-1 as weights grouping (parallel.zero_style "group"): whole
  // parameters owned by dp ranks (balanced by size), each owner updating
  // its group and broadcasting it; zero == 1, dp >= 2, pp == 1.
  bool group = false;
  // Context parallel over the keys (ring attention, preset "ring": k/v blocks
  // circulate around the cp ranks) instead of Ulysses' all_to_all to head
  // shards; cp >= 2, no ops. With sp (tp >= 2): preset "ring-sp", the
  // sequence over cp*tp outside attention.
  bool ring = false;
  // Per-operator strategies on the tp axis, chosen by the strategy search
  // (parallel/strategy_search.h) in place of the Megatron template; `searched`
  // holds them once CostModel::price has priced the plan (what
  // parallel_section writes as the config's split tuples).
  bool ops = false;
  // Blocks per pipeline stage (one entry per stage, pp of them, summing to
  // the model's blocks: a language model's transformer blocks, a ResNet's
  // residual layers); empty: the runtime's balanced split. Uneven splits
  // come from CostModel::stage_split (time and memory together) or the user.
  std::vector<int64_t> layers_per_stage;
  std::shared_ptr<const StrategySearch> searched;

  int64_t devices() const { return dp * tp * pp * cp; }
  bool operator==(const Plan&) const = default;
};

// The share of a stage's `blocks` blocks that recompute their forward under
// full recompute: all of them, or the first recompute_layers of each of its
// vp chunks; 0 without full recompute.
inline double full_recompute_share(const Plan& p, double blocks) {
  if (p.recompute != Recompute::kFull) return 0;
  if (p.recompute_layers <= 0 || blocks <= 0) return 1;
  return std::min(1.0, double(p.vp * p.recompute_layers) / blocks);
}

// The blocks of each of the plan's pp * vp pipeline chunks: its
// layers_per_stage, or `layers` split evenly (the first chunks one more
// where they do not divide), as the planner prices a balanced split.
std::vector<int64_t> chunk_blocks(const Plan& p, int64_t layers);
// The block numbers full recompute of the first `n` blocks of each chunk of
// `chunks` (chunk_blocks) recomputes, in increasing order.
std::vector<int64_t> first_blocks_of_chunks(const std::vector<int64_t>& chunks, int64_t n);
// Its inverse: the N >= 1 for which `blocks` (any order, repeats allowed) are
// the first N blocks of each chunk, or nullopt.
std::optional<int64_t> first_blocks_count(const std::vector<int64_t>& chunks,
                                          std::vector<int64_t> blocks);

// Megatron's split of `layers` blocks over `chunks` pipeline chunks with the
// embedding and the loss each counted as a layer
// (--account-for-embedding/loss-in-pipeline-split): the first and the last
// chunk hold one block fewer than the others. Empty where `chunks` does not
// divide layers + 2, or a chunk would hold none.
std::vector<int64_t> embedding_and_loss_split(int64_t layers, int64_t chunks);

// One line: "dp=16 tp=8 pp=8 vp=2 mb=1x96 interleaved full zero0" (cp, sp only when used).
std::string plan_label(const Plan& p);
// The mesh string of `meshflow train`'s parallel config: "dp=16,tp=8,pp=8" (size-1 axes
// other than dp left out).
std::string plan_mesh(const Plan& p);

}  // namespace meshflow::plan
