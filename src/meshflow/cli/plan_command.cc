#include "meshflow/cli/plan_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "meshflow/cli/errors.h"
#include "meshflow/config/json_reader.h"
#include "meshflow/core/file_io.h"
#include "meshflow/models/from_config.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/plan/auto_plan.h"
#include "meshflow/plan/emit.h"
#include "meshflow/plan/prediction_band.h"
#include "meshflow/plan/search.h"
#include "meshflow/plan/simulate.h"

namespace meshflow::cli {

namespace {

using ojson = nlohmann::ordered_json;
using namespace meshflow::plan;

int user_error(const std::string& msg) {
  std::fprintf(stderr, "meshflow: error: %s\n", msg.c_str());
  return 2;
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}
std::string gib(double b) {
  return fmt("%.1f", b / (1024.0 * 1024.0 * 1024.0));
}
std::string gbytes(double b) {
  return b >= 1e8 || b == 0 ? fmt("%.2f GB", b / 1e9) : fmt("%.2f MB", b / 1e6);
}
// A small model's step is microseconds and its memory megabytes: units that show them.
std::string secs(double s) {
  if (s >= 1) return fmt("%.2f s", s);
  return s >= 1e-3 || s == 0 ? fmt("%.1f ms", s * 1e3) : fmt("%.1f us", s * 1e6);
}
std::string mem(double b) {
  return b >= 0.1 * (1 << 30) ? gib(b) + " GiB" : fmt("%.1f MiB", b / (1 << 20));
}

ojson plan_json(const StepCost& c, const std::vector<MemoryBreakdown>& stages) {
  const Plan& p = c.plan;
  ojson j;
  j["label"] = plan_label(p);
  j["degrees"] = {{"dp", p.dp}, {"tp", p.tp}, {"pp", p.pp}, {"cp", p.cp}};
  j["sp"] = p.sp;
  j["virtual_stages"] = p.vp;
  j["micro_batch"] = p.micro_batch;
  j["num_micro_batches"] = p.num_micro_batches;
  j["schedule"] = std::string(schedule_name(p.schedule));
  j["recompute"] = recompute_name(p.recompute);
  if (p.recompute_layers > 0) j["recompute_layers_per_chunk"] = p.recompute_layers;
  j["zero"] = p.zero;
  j["offload"] = offload_name(p.offload);
  j["step_time_s"] = c.step_time_s;
  j["tokens_per_s"] = c.tokens_per_s;
  j["tflops_per_gpu"] = c.tflops_per_gpu;
  j["mfu"] = c.mfu;
  j["memory_bytes_per_device"] = {
      {"params", c.memory.params},           {"grads", c.memory.grads},
      {"optimizer", c.memory.optimizer},     {"activations", c.memory.activations},
      {"temporaries", c.memory.temporaries}, {"total", c.memory.total},
      {"offloaded", c.memory.offloaded}};
  j["memory_bytes_per_stage"] = json::array();  // a pipeline's stages, stage 0 first
  for (const MemoryBreakdown& m : stages) j["memory_bytes_per_stage"].push_back(m.total);
  j["usable_memory_bytes_per_device"] = c.usable_memory;
  // The peak the stack's allocator reports reserved (TorchTitan's logged
  // memory; total where the stack reports the tensors' peak).
  j["reserved_memory_bytes_per_device"] = c.reserved_memory;
  j["comm_bytes_per_step"] = {{"tensor_parallel", c.comm.tensor_parallel},
                              {"context_parallel", c.comm.context_parallel},
                              {"pipeline", c.comm.pipeline},
                              {"data_parallel", c.comm.data_parallel},
                              {"total", c.comm.total()},
                              {"offload_pcie_nvme", c.comm.offload}};
  j["step_breakdown_s"] = {{"compute", c.compute_s}, {"recompute", c.recompute_s},
                           {"tp_comm", c.tp_comm_s}, {"cp_comm", c.cp_comm_s},
                           {"pp_comm", c.pp_comm_s}, {"bubble", c.bubble_s},
                           {"dp_comm", c.dp_comm_s}, {"optimizer", c.optimizer_s}};
  return j;
}

// The prediction's band (plan/prediction_band.h): where published runs on
// this cluster file at this scale fell relative to their predictions.
struct Band {
  const BandEntry* entry = nullptr;
  std::string cluster, why_none;
};

std::string band_range(const BandEntry& e) {
  return e.max_gpus >= (int64_t{1} << 40)
             ? std::to_string(e.min_gpus) + "+"
             : std::to_string(e.min_gpus) + "-" + std::to_string(e.max_gpus);
}

void print_plan(const StepCost& c, const std::vector<MemoryBreakdown>& stages, bool lm,
                const Band& band) {
  const MemoryBreakdown& m = c.memory;
  std::printf(
      "  step time       %s  (compute %s, recompute %s, tp comm %s, cp comm %s, "
      "pp p2p %s, bubble %s, dp comm %s, optimizer %s)\n",
      secs(c.step_time_s).c_str(), secs(c.compute_s).c_str(), secs(c.recompute_s).c_str(),
      secs(c.tp_comm_s).c_str(), secs(c.cp_comm_s).c_str(), secs(c.pp_comm_s).c_str(),
      secs(c.bubble_s).c_str(), secs(c.dp_comm_s).c_str(), secs(c.optimizer_s).c_str());
  if (band.entry)
    std::printf(
        "  band            %s..%s (published runs took %.2fx..%.2fx their prediction: p10..p90 "
        "of %d runs on %s at %s GPUs)\n",
        secs(band.entry->lo * c.step_time_s).c_str(), secs(band.entry->hi * c.step_time_s).c_str(),
        band.entry->lo, band.entry->hi, band.entry->runs, band.cluster.c_str(),
        band_range(*band.entry).c_str());
  else if (!band.why_none.empty())
    std::printf("  band            none: %s\n", band.why_none.c_str());
  std::printf("  throughput      %.0f %s/s, %.1f TFLOP/s per GPU, MFU %.1f%%\n", c.tokens_per_s,
              lm ? "tokens" : "examples", c.tflops_per_gpu, 100 * c.mfu);
  if (c.plan.recompute == Recompute::kFull && c.plan.recompute_layers > 0)
    std::printf(
        "  recompute       full, on the first %lld block(s) of each pipeline chunk "
        "(Megatron-LM's --recompute-method block); the others keep their activations\n",
        static_cast<long long>(c.plan.recompute_layers));
  if (c.plan.offload != Offload::kNone)
    std::printf(
        "  offload         %s GiB of optimizer state per device on the %s; %s per step "
        "over PCIe%s\n",
        gib(m.offloaded).c_str(), c.plan.offload == Offload::kHost ? "host" : "NVMe",
        gbytes(c.comm.offload).c_str(), c.plan.offload == Offload::kNvme ? " and to NVMe" : "");
  if (m.total >= 0.1 * (1 << 30)) {
    std::printf(
        "  memory/device   %s GiB of %s usable: params %s, grads %s, optimizer %s, "
        "activations %s, temporaries %s\n",
        gib(m.total).c_str(), gib(c.usable_memory).c_str(), gib(m.params).c_str(),
        gib(m.grads).c_str(), gib(m.optimizer).c_str(), gib(m.activations).c_str(),
        gib(m.temporaries).c_str());
  } else {
    std::printf(
        "  memory/device   %s of %s GiB usable: params %s, grads %s, optimizer %s, "
        "activations %s, temporaries %s\n",
        mem(m.total).c_str(), gib(c.usable_memory).c_str(), mem(m.params).c_str(),
        mem(m.grads).c_str(), mem(m.optimizer).c_str(), mem(m.activations).c_str(),
        mem(m.temporaries).c_str());
  }
  if (stages.size() > 1) {
    std::string per;
    const bool small = m.total < 0.1 * (1 << 30);
    for (const MemoryBreakdown& s : stages)
      per += (per.empty() ? "" : ", ") + (small ? mem(s.total) : gib(s.total));
    std::printf("  memory/stage    %s%s (stage 0 first)\n", per.c_str(), small ? "" : " GiB");
  }
  std::printf(
      "  comm/device     tensor-parallel %s, context-parallel %s, pipeline %s, "
      "data-parallel %s per step\n",
      gbytes(c.comm.tensor_parallel).c_str(), gbytes(c.comm.context_parallel).c_str(),
      gbytes(c.comm.pipeline).c_str(), gbytes(c.comm.data_parallel).c_str());
}

// The run-config fragment `--out` writes (and `simulate` reads back).
Result<ojson> plan_file(const json& model, const Cluster& cluster, const CostModel& cm,
                        int64_t gpus, const std::string& attention,
                        const std::optional<EmitTarget>& stack, const StepCost& best,
                        const std::vector<MemoryBreakdown>& stages) {
  const Plan& p = best.plan;
  ojson f;
  f["description"] = "written by meshflow plan: " + plan_label(p);
  f["model"] = ojson::parse(model.dump());
  // A run config `meshflow train` reads: byte-level text data (the planner
  // does not pick a dataset), the plan's batch and micro-batches (the
  // pipeline's when there is one), and its parallel layout.
  const bool lm = is_language_model(cm.job().model);
  f["data"] = {{"dataset", lm ? "fortunes" : "fashion_mnist"}};
  f["train"] = {{"batch_size", cm.job().global_batch}};
  if (lm) f["train"]["seq_len"] = cm.job().seq;
  f["train"]["micro_batches"] = p.pp > 1 ? 1 : p.num_micro_batches;
  // The optimizer priced (`--optimizer`), with the run config's defaults.
  f["optimizer"] = {{"type", cm.job().optimizer_states == 1 ? "sgd" : "adamw"}};
  MF_ASSIGN_OR_RETURN(json par, parallel_section(p, cm.job().model));
  f["parallel"] = ojson::parse(par.dump());
  ojson planner;
  planner["gpus"] = gpus;
  planner["cluster"] = ojson::parse(cluster_to_json(cluster).dump());
  planner["attention"] = attention;
  // The stack priced with (--emit): `simulate` prices the plan again with
  // the same constants, so the two agree.
  if (stack) planner["stack"] = emit_target_key(*stack);
  if (cm.job().fp8) planner["fp8"] = true;
  if (cm.job().fp8 && cm.job().fp8_scaling != Fp8Scaling::kTensorwise)
    planner["fp8_scaling"] = fp8_scaling_name(cm.job().fp8_scaling);
  if (cm.constants().eager) planner["eager"] = true;
  if (cm.constants().blocking_launch_s > 0) planner["launch_blocking"] = true;
  planner["prediction"] = plan_json(best, stages);
  f["plan"] = planner;
  return f;
}

}  // namespace

int run_plan(const PlanOptions& o) {
  std::optional<EmitTarget> emit;
  if (!o.emit.empty()) {
    Result<EmitTarget> t = parse_emit_target(o.emit);
    if (!t.is_ok()) return user_error(t.status().message());
    if (o.json) return user_error("--emit and --json both print to stdout; give one");
    emit = *t;
  }
  // Before the search, not after it: the --out file can be written.
  if (!o.out.empty()) {
    Status s = check_output_file(o.out, "--out");
    if (!s.is_ok()) return user_error(s.message());
  }
  Result<json> mj = read_json_file(o.model);
  if (!mj.is_ok()) return user_error(mj.status().message());
  Result<ModelConfig> model = parse_model_config(*mj);
  if (!model.is_ok()) return user_error(o.model + ": " + model.status().message());
  if (o.attention_given && !is_language_model(*model))
    return user_error("--attention " + o.attention + ": " + o.model + " is " + model_noun(*model) +
                      ", which has no attention; plan it without --attention");
  Result<Cluster> base = load_cluster(o.cluster);
  if (!base.is_ok()) return user_error(base.status().message());
  if (o.power_limit_w > 0) {
    if (base->device.rated_power_w <= 0)
      return user_error("--power-limit: " + o.cluster +
                        " gives no device.rated_power_w, the board power its compute figures "
                        "hold at (700 for an H100 or H200 SXM, 400 for an A100 SXM)");
    if (o.power_limit_w > base->device.rated_power_w) {
      auto w = [](double x) {
        char b[32];
        std::snprintf(b, sizeof b, "%g", x);
        return std::string(b);
      };
      return user_error("--power-limit " + w(o.power_limit_w) + " W is above the rated " +
                        w(base->device.rated_power_w) + " W of " + o.cluster +
                        "'s device: give at most " + w(base->device.rated_power_w));
    }
    base->device.power_limit_w = o.power_limit_w;
  }
  if (o.gpus < 1) return user_error("--gpus must be >= 1, got " + std::to_string(o.gpus));
  Result<Cluster> cluster = with_devices(*base, o.gpus);
  if (!cluster.is_ok()) return user_error(cluster.status().message());
  // With --emit, the constants of the stack that will run the plan.
  const bool bf16 = cluster->device.peak_flops.bf16 > 0;
  CostConstants k = emit ? stack_constants(*emit, bf16) : CostConstants{};
  // "fused" under --emit: the stack's own fused kernel on this device.
  if (emit && o.attention == "fused") {
    apply_stack_attention(*emit, *cluster, &k);
  } else if (Status a = set_attention_kernel(o.attention, *cluster, "--attention", &k);
             !a.is_ok()) {
    return user_error(a.message());
  }
  if (o.eager) set_eager(&k);
  if (o.launch_blocking) set_launch_blocking(&k);
  SearchOptions so;
  so.top_k = o.top;
  so.time_limit_s = o.time_limit_s;
  so.threads = o.threads;
  if (!o.fix.empty()) {
    Result<FixedChoices> f = parse_fixed(o.fix);
    if (!f.is_ok()) return user_error(f.status().message());
    so.fixed = *f;
  }
  const bool lm = is_language_model(*model);
  if (!lm && o.seq > 1)
    return user_error(o.model + ": --seq is for language models; " + model_noun(*model) +
                      " has no sequence");
  TrainingJob job;
  job.model = *model;
  job.seq = 1;
  if (lm) {
    Result<TransformerDims> dims = transformer_dims(*model);
    if (!dims.is_ok()) return user_error(dims.status().message());
    job.seq = o.seq > 0 ? o.seq : dims->max_seq;
  }
  job.global_batch = o.global_batch > 0 ? o.global_batch : std::max<int64_t>(512, o.gpus);
  OptimizerConfig opt;
  opt.kind = o.optimizer == "sgd" ? OptimizerKind::kSgd : OptimizerKind::kAdamW;
  job.optimizer_states = optimizer_state_values(opt);
  job.fp8 = o.fp8;
  if (o.fp8 && !lm)
    return user_error("--fp8: " + o.model +
                      " has no transformer blocks, whose linear layers --fp8 runs in FP8; plan "
                      "it without --fp8");
  if (o.fp8 && cluster->device.peak_flops.fp8 <= 0)
    return user_error("--fp8: " + o.cluster + " gives no FP8 rate for its device ('" +
                      cluster->device.name +
                      "'): device.peak_flops.fp8 (FP8 tensor cores: Hopper and later)");
  if (!o.fp8_scaling.empty()) {
    if (!o.fp8)
      return user_error("--fp8-scaling " + o.fp8_scaling +
                        ": it scales the FP8 linears of --fp8; add --fp8, or drop it");
    Result<Fp8Scaling> sc = parse_fp8_scaling(o.fp8_scaling, "--fp8-scaling");
    if (!sc.is_ok()) return user_error(sc.status().message());
    job.fp8_scaling = *sc;
  }
  if (job.fp8 && job.fp8_scaling == Fp8Scaling::kRowwise && emit == EmitTarget::kMegatron)
    return user_error(
        "--fp8-scaling rowwise --emit megatron: Transformer Engine has no rowwise recipe "
        "(Megatron-LM's --fp8-recipe: delayed, tensorwise, mxfp8, blockwise); plan with "
        "--fp8-scaling tensorwise, or emit torchtitan");
  if (o.fp8 && emit == EmitTarget::kDeepSpeed)
    return user_error(
        "--fp8 --emit deepspeed: DeepSpeed's config has no FP8 training of its own; plan "
        "without --fp8, or emit megatron or torchtitan");
  CostModel cm(job, *cluster, k);
  if (!cm.status().is_ok()) return user_error(o.model + ": " + cm.status().message());
  if (o.time_limit_s > 0) {
    // One deadline for the per-operator searches and the sweep.
    so.deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(o.time_limit_s));
    cm.set_op_search_deadline(*so.deadline);
  }
  if (emit) {  // only the plans the target runs as planned
    Result<TransformerDims> dims = transformer_dims(*model);
    if (!dims.is_ok())
      return user_error(std::string("--emit ") + o.emit + ": " + o.model +
                        " is not a transformer language model, which " + emit_target_name(*emit) +
                        " trains");
    so.reject = [d = *dims, t = *emit](const Plan& p) {
      Status s = emit_check(p, d, t);
      return s.is_ok() ? std::string() : s.message();
    };
  }
  Result<SearchResult> r = search_plans(cm, o.gpus, so);
  if (!r.is_ok()) return user_error(r.status().message());
  std::vector<std::vector<MemoryBreakdown>> stage_memory;  // the plans shown, every stage
  for (const StepCost& c : r->plans) {
    Result<std::vector<MemoryBreakdown>> stages = cm.memory_by_stage(c.plan);
    if (!stages.is_ok()) return user_error(stages.status().message());
    stage_memory.push_back(std::move(*stages));
  }

  const ModelSummary sum = summarize(*model, job.seq);
  const StepCost& best = r->plans[0];
  // The calibration's spread, from prediction_bands.json beside the cluster file.
  PredictionBands bands;
  Band band;
  band.cluster = base->name;
  {
    const std::string path =
        (std::filesystem::path(o.cluster).parent_path() / "prediction_bands.json").string();
    if (!std::filesystem::exists(path)) {
      band.why_none = "no " + path + " (bench/public_runs --write-bands writes one)";
    } else {
      Result<PredictionBands> b = load_prediction_bands(path);
      if (!b.is_ok()) return user_error(b.status().message());
      bands = std::move(*b);
      band.entry = lm ? find_band(bands, base->name, o.gpus) : nullptr;
      if (!lm)
        // (bench/public_runs prices published transformer LM runs alone; a
        // convolutional network's or an MLP's kernels err differently.)
        band.why_none =
            "the published runs that set the bands are transformer language models; "
            "none is " +
            model_noun(*model);
      else if (!band.entry)
        band.why_none = "no published runs on " + base->name + " at " + std::to_string(o.gpus) +
                        " GPUs in " + path;
    }
  }
  if (emit) {
    Result<std::string> text =
        emit_plan(best.plan, job, cm.compute_dtype() == DType::BF16, *emit, o.eager);
    if (!text.is_ok()) return user_error(text.status().message());
    std::fputs(text->c_str(), stdout);
    // The memory as the stack reports it: TorchTitan logs its allocator's
    // reserved peak (CostConstants::allocator_reserved_ratio).
    std::fprintf(stderr,
                 "meshflow: best plan %s, %.3f s per step predicted, %.1f GiB per device%s, "
                 "priced as %s%s\n",
                 plan_label(best.plan).c_str(), best.step_time_s,
                 best.reserved_memory / double(1 << 30),
                 best.reserved_memory > best.memory.total ? " reserved by PyTorch's allocator" : "",
                 stack_priced(*emit, bf16, cm.job().fp8, cm.job().fp8_scaling).c_str(),
                 o.launch_blocking ? ", its kernels launched synchronously: run it with "
                                     "CUDA_LAUNCH_BLOCKING=1 set, as priced"
                                   : "");
  } else if (o.json) {
    ojson j;
    j["model"] = o.model;
    j["model_summary"] = sum.text;
    j["parameters"] = sum.parameters;
    j["cluster"] = cluster->name;
    j["device"] = cluster->device.name;
    if (cluster->device.power_limit_w > 0) {
      j["power_limit_w"] = cluster->device.power_limit_w;
      j["compute_clock_scale"] = cluster->device.compute_clock_scale();
    }
    j["gpus"] = o.gpus;
    j["global_batch"] = job.global_batch;
    j["seq"] = job.seq;
    j["optimizer"] = o.optimizer;
    j["dtype"] = std::string(dtype_name(cm.compute_dtype()));
    j["fp8"] = job.fp8;  // the blocks' linears in FP8 (--fp8)
    if (job.fp8) j["fp8_scaling"] = fp8_scaling_name(job.fp8_scaling);
    j["fixed"] = so.fixed.to_string();
    ojson plans = ojson::array();
    for (size_t i = 0; i < r->plans.size(); ++i) {
      ojson pj = plan_json(r->plans[i], stage_memory[i]);
      if (band.entry)
        pj["band_s"] = {{"low", band.entry->lo * r->plans[i].step_time_s},
                        {"high", band.entry->hi * r->plans[i].step_time_s},
                        {"runs", band.entry->runs},
                        {"gpus", band_range(*band.entry)}};
      else if (!band.why_none.empty())
        pj["band_none"] = band.why_none;  // why this prediction has no band
      if (i > 0) pj["why_slower"] = explain_loss(best, r->plans[i]);
      plans.push_back(pj);
    }
    j["plans"] = plans;
    j["plans_evaluated"] = r->evaluated;
    j["plans_valid"] = r->valid;
    j["plans_fitting"] = r->fitting;
    j["search_time_s"] = r->search_time_s;
    j["search_complete"] = !r->timed_out;  // false: stopped at --time-limit
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("model    %s: %s\n", o.model.c_str(), sum.text.c_str());
    std::string power;
    if (cluster->device.compute_clock_scale() < 1) {
      char b[128];
      std::snprintf(b, sizeof b, "; %g of %g W: GEMMs and attention at %.3f of the rated clock",
                    cluster->device.power_limit_w, cluster->device.rated_power_w,
                    cluster->device.compute_clock_scale());
      power = b;
    }
    std::string fabric;  // islands inside a node, or a domain over nodes
    if (cluster->island_devices() < cluster->devices_per_node) {
      char b[128];
      std::snprintf(b, sizeof b, "; NVLink islands of %lld, %g GB/s a GPU between them",
                    static_cast<long long>(cluster->island_devices()),
                    cluster->between_islands.effective_bandwidth() / 1e9);
      fabric = b;
    }
    if (cluster->fabric_devices() > cluster->devices_per_node)
      fabric = "; NVLink domains of " + std::to_string(cluster->fabric_devices()) + " GPUs";
    std::printf("cluster  %s: %lld x %s (%d nodes x %d%s), %s mixed precision%s\n",
                cluster->name.c_str(), static_cast<long long>(o.gpus), cluster->device.name.c_str(),
                cluster->nodes, cluster->devices_per_node, fabric.c_str(),
                std::string(dtype_name(cm.compute_dtype())).c_str(), power.c_str());
    std::printf("job      global batch %lld %s%s%s\n", static_cast<long long>(job.global_batch),
                (lm ? "x seq " + std::to_string(job.seq) : std::string("examples")).c_str(),
                (std::string(o.optimizer == "adamw" ? "" : "; optimizer " + o.optimizer) +
                 (job.fp8 ? std::string("; the blocks' linears in FP8") +
                                (job.fp8_scaling == Fp8Scaling::kRowwise ? ", rowwise scaled" : "")
                          : ""))
                    .c_str(),
                so.fixed.to_string().empty() ? "" : ("; pinned " + so.fixed.to_string()).c_str());
    std::printf("stack    %s; --emit megatron|deepspeed|torchtitan prices that framework's own\n",
                stack_assumed(cm.constants(), cm.compute_dtype(), lm).c_str());
    std::printf("search   %lld plans priced, %lld valid, %lld fit in memory, in %.3f s\n",
                static_cast<long long>(r->evaluated), static_cast<long long>(r->valid),
                static_cast<long long>(r->fitting), r->search_time_s);
    if (r->timed_out)
      std::printf(
          "         stopped at the time limit (--time-limit %g s): the best of the plans priced "
          "so far, not of all plans\n",
          o.time_limit_s);
    std::printf("\n");
    std::printf("best plan: %s\n", plan_label(best.plan).c_str());
    print_plan(best, stage_memory[0], lm, band);
    for (size_t i = 1; i < r->plans.size(); ++i) {
      std::printf("\nrunner-up %zu of %zu (rank #%zu): %s\n", i, r->plans.size() - 1, i + 1,
                  plan_label(r->plans[i].plan).c_str());
      std::printf("  loses by        %s\n", explain_loss(best, r->plans[i]).c_str());
      print_plan(r->plans[i], stage_memory[i], lm, band);
    }
  }
  if (!o.out.empty()) {
    const Result<ojson> f =
        plan_file(*mj, *cluster, cm, o.gpus, o.attention, emit, best, stage_memory[0]);
    if (!f.is_ok()) return user_error("--out " + o.out + ": " + f.status().message());
    Status s = write_file_atomic(o.out, f->dump(2) + "\n", "--out");
    if (!s.is_ok()) return user_error(s.message());
    if (emit)
      std::fprintf(stderr, "meshflow: wrote %s\n", o.out.c_str());
    else if (!o.json)
      std::printf("\nwrote %s\n", o.out.c_str());
  }
  return 0;
}

int run_simulate(const SimulateOptions& o) {
  if (!o.trace.empty()) {
    Status s = check_output_file(o.trace, "--trace");
    if (!s.is_ok()) return user_error(s.message());
  }
  Result<json> f = read_json_file(o.plan);
  if (!f.is_ok()) return user_error(f.status().message());
  Result<PlannedRun> run = parse_plan_file(*f);
  if (!run.is_ok()) return user_error(o.plan + ": " + run.status().message());
  CostModel cm(run->job, run->cluster, run->constants);
  if (!cm.status().is_ok()) return user_error(o.plan + ": " + cm.status().message());
  Result<StepCost> c = cm.price(run->plan);
  if (!c.is_ok()) return user_error(o.plan + ": " + c.status().message());
  if (!c->fits)
    std::fprintf(stderr, "meshflow: warning: the plan needs %s GiB per device, %s GiB usable\n",
                 gib(c->memory.total).c_str(), gib(c->usable_memory).c_str());
  SimulatedStep sim = simulate_step(*c);
  std::printf("plan      %s\n", plan_label(run->plan).c_str());
  std::printf("predicted %s per step (cost model), %s (simulated timeline); bubble %.1f%%\n",
              secs(c->step_time_s).c_str(), secs(sim.step_time_s).c_str(),
              100 * sim.bubble_fraction);
  if (o.trace.empty()) return 0;
  Status s = write_file_atomic(o.trace, sim.trace.to_json(), "--trace");
  if (!s.is_ok()) return user_error(s.message());
  std::printf("wrote %s (%zu spans; open in ui.perfetto.dev or chrome://tracing)\n",
              o.trace.c_str(), sim.trace.num_spans());
  return 0;
}

void add_plan_commands(CLI::App& app) {
  auto po = std::make_shared<PlanOptions>();
  CLI::App* p = app.add_subcommand("plan", "Find the best parallel plan for a model on a cluster");
  p->add_option("model", po->model, "Model config JSON (Hugging Face keys, configs/models/)")
      ->required();
  p->add_option("--cluster", po->cluster, "Cluster JSON (configs/clusters/)")->required();
  p->add_option("--gpus", po->gpus, "Number of devices")
      ->required()
      ->check(CLI::Range(int64_t{1}, kMaxPlanDevices));
  p->add_option("--global-batch", po->global_batch,
                "Sequences per optimizer step (default: max(512, gpus))")
      ->check(CLI::Range(int64_t{1}, kMaxGlobalBatch));
  p->add_option("--seq", po->seq, "Sequence length (default: the model's maximum positions)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  p->add_option("--time-limit", po->time_limit_s,
                "Stop searching after SECONDS and report the best plan found so far")
      ->check(CLI::Range(0.001, 86400.0));
  p->add_option("--threads", po->threads,
                "Threads the search runs on (default 0: one per core); the answer is the same "
                "for any count")
      ->check(CLI::Range(0, 256));
  p->add_option("--top", po->top,
                "Runners-up to show AFTER the best plan (K does not count the best: --top 0 "
                "shows the best plan only, --top 3 the best and 3 runners-up; default 3)")
      ->check(CLI::Range(0, 100));
  p->add_flag("--json", po->json, "Print one JSON object (plans, search_time_s, ...)");
  p->add_option("--out", po->out, "Write the best plan as a run config fragment");
  p->add_option("--fix", po->fix,
                "Pin choices: tp, pp, dp, cp, sp, vp, micro_batch, schedule, recompute, "
                "recompute_layers, zero, zero_style, ops, ring, offload "
                "(e.g. tp=8,pp=4,schedule=1f1b)")
      ->check([](const std::string& v) {
        return v.empty() ? std::string("empty; give key=value items, e.g. tp=8,pp=4")
                         : std::string();
      });
  p->add_option("--emit", po->emit,
                "Print the best plan as another stack's launch config: megatron (Megatron-LM "
                "arguments), deepspeed (config JSON) or torchtitan (job TOML tables)");
  p->add_option("--optimizer", po->optimizer,
                "The optimizer the job trains with: adamw (two f32 states per parameter, "
                "default) or sgd (momentum: one); sets the model states' memory and the "
                "update's traffic")
      ->check(CLI::IsMember({"adamw", "sgd"}));
  p->add_flag("--fp8", po->fp8,
              "The blocks' linear layers in FP8 (Transformer Engine, TorchTitan's Float8): "
              "priced at the cluster file's device.peak_flops.fp8, attention and the head in "
              "16-bit");
  p->add_option("--fp8-scaling", po->fp8_scaling,
                "With --fp8, how the FP8 operands are scaled: tensorwise (one scale a tensor, "
                "default; Transformer Engine, torchao's tensorwise) or rowwise (torchao's "
                "rowwise recipe: each GEMM casts its operands per row, on slower kernels, "
                "FSDP gathers in 16-bit; --emit torchtitan writes its recipe_name)")
      ->check(CLI::IsMember({"tensorwise", "rowwise"}));
  char eager_cost[16];
  std::snprintf(eager_cost, sizeof eager_cost, "%.2fx", CostConstants::kEagerElementwise);
  p->add_flag("--eager", po->eager,
              "The stack runs the model's memory-bound ops (norms, activations, rotary "
              "embedding, residual adds) eagerly, a kernel per PyTorch op (PyTorch without "
              "torch.compile): priced at " +
                  std::string(eager_cost) +
                  " the fused ops, with the tensors eager PyTorch keeps for the backward and "
                  "its f32 loss (docs/planner.md)");
  char launch_cost[16];
  std::snprintf(launch_cost, sizeof launch_cost, "%.1f", CostConstants::kBlockingLaunch * 1e6);
  p->add_flag("--launch-blocking", po->launch_blocking,
              "The job runs with CUDA_LAUNCH_BLOCKING=1 (as BLOOM's training did, to avoid a "
              "hang): each kernel launch waits for its kernel, so the host's dispatch of every "
              "kernel adds to the step, priced at " +
                  std::string(launch_cost) +
                  " us a launch from BigScience's published A/B (docs/planner.md)");
  p->add_option("--power-limit", po->power_limit_w,
                "The GPUs' power limit in watts (nvidia-smi -pl), at most the cluster file's "
                "device.rated_power_w: GEMMs and attention priced at the clock it leaves, the "
                "cube root of the power ratio (docs/cluster.md)")
      ->check(CLI::Range(1.0, 100000.0));
  CLI::Option* attention =
      p->add_option("--attention", po->attention,
                    "Attention kernel: fused (FlashAttention-2; with --emit, the stack's own: "
                    "cuDNN's for Megatron-LM where the cluster file prices it), another fused "
                    "kernel the cluster file prices (flash1: FlashAttention-1 and its Triton port; "
                    "cudnn) or materialized (Megatron-LM 2021)");
  p->callback([po, attention]() {
    po->attention_given = attention->count() > 0;
    std::exit(guard([&] { return run_plan(*po); }));
  });

  auto so = std::make_shared<SimulateOptions>();
  CLI::App* s = app.add_subcommand("simulate", "Chrome trace of one predicted step of a plan");
  s->add_option("plan", so->plan, "Plan file written by meshflow plan --out")->required();
  s->add_option("--trace", so->trace, "Write the Chrome trace (JSON) to FILE");
  s->callback([so]() { std::exit(guard([&] { return run_simulate(*so); })); });
}

}  // namespace meshflow::cli
