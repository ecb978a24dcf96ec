#include "meshflow/plan/emit.h"

#include <nlohmann/json.hpp>
#include <numeric>

#include "meshflow/core/check.h"
#include "meshflow/plan/model_dims.h"

namespace meshflow::plan {

namespace {

std::string str(int64_t x) {
  return std::to_string(x);
}

Status cannot(EmitTarget t, const Plan& p, const std::string& why) {
  return Status::invalid(std::string(emit_target_name(t)) + " cannot run plan " + plan_label(p) +
                         " as planned: " + why);
}

// Every target trains a transformer language model: its dims, or why not.
Result<TransformerDims> model_dims(const TrainingJob& job, EmitTarget t) {
  Result<TransformerDims> d = transformer_dims(job.model);
  if (!d.is_ok())
    return Status::invalid(std::string(emit_target_name(t)) +
                           " trains transformer language models (GPT, LLaMA); this model is not "
                           "one: " +
                           d.status().message());
  return d;
}

// The balanced split the target makes when given only the stage count:
// equal stages. An uneven split is spelled per target.
bool uneven(const Plan& p) {
  for (int64_t n : p.layers_per_stage)
    if (n != p.layers_per_stage.front()) return true;
  return false;
}

Status check_megatron(const Plan& p) {
  const EmitTarget t = EmitTarget::kMegatron;
  if (p.pp > 1) {
    if (p.schedule == ScheduleKind::kGPipe || p.schedule == ScheduleKind::kZbH1 ||
        p.schedule == ScheduleKind::kZbV)
      return cannot(t, p,
                    "Megatron-LM runs 1F1B and its interleaved form only; pin "
                    "schedule=1f1b or schedule=interleaved");
    if (uneven(p)) {
      const std::vector<int64_t>& n = p.layers_per_stage;
      for (size_t s = 2; s + 1 < n.size(); ++s)
        if (n[s] != n[1])
          return cannot(t, p,
                        "Megatron-LM sets the first and the last stage's layers "
                        "(--decoder-first/last-pipeline-num-layers) and splits the rest evenly; "
                        "this split's middle stages differ");
      // Interleaved, its one uneven split: the embedding and the loss each
      // counted as a layer (--account-for-embedding/loss-in-pipeline-split).
      if (p.vp > 1 && n != embedding_and_loss_split(std::accumulate(n.begin(), n.end(), int64_t{0}),
                                                    static_cast<int64_t>(n.size())))
        return cannot(t, p,
                      "Megatron-LM's interleaved chunks hold equal layers, or one fewer in the "
                      "first and the last chunk (--account-for-embedding-in-pipeline-split "
                      "--account-for-loss-in-pipeline-split); this split is neither");
    }
  }
  if (p.zero == 3 && p.pp > 1)
    return cannot(t, p,
                  "ZeRO-3 is Megatron-LM's --use-torch-fsdp2, which does not run with "
                  "pipeline parallelism; pin zero=1 (--use-distributed-optimizer)");
  // Its distributed optimizer shards the optimizer state and reduce-scatters
  // the gradients, but keeps every gradient in its contiguous buffer: ZeRO-1's
  // memory with ZeRO-2's traffic, which is how the cost model prices zero=1.
  if (p.zero == 2)
    return cannot(t, p,
                  "Megatron-LM's distributed optimizer (--use-distributed-optimizer) keeps "
                  "every gradient in its buffer and shards the optimizer state, which is "
                  "ZeRO-1 (priced with the same reduce-scatter and gather); pin zero=1");
  if (p.offload == Offload::kNvme || (p.offload == Offload::kHost && p.zero == 3))
    return cannot(t, p,
                  "Megatron-LM offloads the distributed optimizer's state to host memory "
                  "(--optimizer-cpu-offload), not to NVMe or under FSDP; pin offload=host with "
                  "zero=1, or offload=none");
  return Status::ok();
}

Status check_deepspeed(const Plan& p) {
  const EmitTarget t = EmitTarget::kDeepSpeed;
  if (p.pp > 1)
    return cannot(t, p,
                  "DeepSpeed's pipeline stages are set in code (PipelineModule(num_stages=...)), "
                  "not in its JSON config; pin pp=1 or emit megatron");
  if (p.cp > 1)
    return cannot(t, p, "DeepSpeed's Ulysses sequence parallelism is set in code; pin cp=1");
  if (p.sp) return cannot(t, p, "DeepSpeed's AutoTP has no sequence parallelism; pin sp=false");
  if (p.tp > 1 && p.zero == 3)
    return cannot(t, p, "DeepSpeed's AutoTP runs with ZeRO stage 0, 1 or 2; pin zero<=2");
  if (p.recompute == Recompute::kSelective)
    return cannot(t, p,
                  "DeepSpeed checkpoints whole layers (activation_checkpointing), not selected "
                  "ops; pin recompute=full or none");
  if (p.recompute_layers > 0)
    return cannot(t, p,
                  "DeepSpeed's activation_checkpointing config has no count of blocks to "
                  "recompute (the model's code checkpoints the layers it wraps); pin "
                  "recompute_layers=0 or emit megatron (--recompute-method block)");
  return Status::ok();
}

Status check_torchtitan(const Plan& p, const TransformerDims& d) {
  const EmitTarget t = EmitTarget::kTorchTitan;
  if (!d.llama)
    return cannot(t, p, "TorchTitan's models are LLaMA-style (llama3); this model is GPT-2 style");
  if (p.tp > 1 && !p.sp)
    return cannot(t, p,
                  "TorchTitan's tensor parallelism always splits the sequence of norms and "
                  "residuals (sequence parallelism); pin sp=true");
  // FSDP2 keeps nothing between ZeRO-0 (DDP) and ZeRO-3 but
  // reshard_after_forward = "never" (parameters stay gathered from the
  // forward to the backward), which is not ZeRO-1/2's memory.
  if (p.pp == 1 && (p.zero == 1 || p.zero == 2))
    return cannot(t, p,
                  "TorchTitan shards with FSDP2: ZeRO-3 (data_parallel_shard_degree) or none "
                  "(data_parallel_replicate_degree); pin zero=0 or zero=3");
  // With pipeline parallelism its FSDP2 does not reshard after the forward
  // (fsdp_reshard_after_forward "default": not with pp), and torch's pipeline
  // stage turns resharding and gradient sync off until the step's last
  // backward: each stage's parameters and gradients stay whole for the step,
  // reduce-scattered once after it, the optimizer state sharded. ZeRO-1.
  if (p.pp > 1 && (p.zero == 2 || p.zero == 3))
    return cannot(t, p,
                  "with pipeline parallelism TorchTitan's FSDP2 keeps each stage's parameters and "
                  "gradients whole for the step and reduce-scatters them after its last backward "
                  "(no resharding after the forward; torch's pipeline stage syncs once), which is "
                  "ZeRO-1; pin zero=1 or zero=0");
  // Its context parallelism (torch's context_parallel) splits the sequence and
  // exchanges the K/V shards (context_parallel_rotate_method), a ring, not
  // Ulysses' all_to_alls to head shards, which is what meshflow's cp without
  // the ring prices.
  if (p.cp > 1 && !p.ring)
    return cannot(t, p,
                  "TorchTitan's context parallelism splits the sequence and rotates the K/V "
                  "shards (ring attention), not Ulysses' all_to_all to head shards; pin "
                  "ring=true");
  if (p.schedule == ScheduleKind::kZbH1 && p.pp > 1)
    return cannot(t, p,
                  "torch's zero-bubble schedules need two or more stages per rank "
                  "(InterleavedZeroBubble, ZBVZeroBubble); pin schedule=zb-v or 1f1b");
  if (p.offload != Offload::kNone)
    return cannot(t, p,
                  "TorchTitan's CPU offload (FSDP2's CPUOffloadPolicy) moves the parameters and "
                  "gradients with the optimizer state, which is not this plan; pin offload=none");
  if (p.recompute_layers > 0)
    return cannot(t, p,
                  "TorchTitan's activation checkpointing takes every block (mode full) or every "
                  "n-th (selective_ac_option n), not the first blocks of each stage; pin "
                  "recompute_layers=0 or emit megatron");
  return Status::ok();
}

Result<std::string> megatron(const Plan& p, const TrainingJob& job, const TransformerDims& d,
                             bool bf16) {
  std::vector<std::string> a;
  auto arg = [&](const std::string& name, const std::string& value = "") {
    a.push_back(value.empty() ? name : name + " " + value);
  };
  // The model (megatron/training/arguments.py, network size).
  arg("--num-layers", str(d.layers));
  arg("--hidden-size", str(d.hidden));
  arg("--ffn-hidden-size", str(d.ffn));
  arg("--num-attention-heads", str(d.heads));
  if (d.kv_heads != d.heads) {
    arg("--group-query-attention");
    arg("--num-query-groups", str(d.kv_heads));
  }
  arg("--seq-length", str(job.seq));
  arg("--max-position-embeddings", str(d.max_seq));
  arg("--vocab-size", str(d.vocab));
  if (d.llama) {
    arg("--normalization", "RMSNorm");
    arg("--position-embedding-type", "rope");
    arg("--swiglu");
    arg("--disable-bias-linear");
  }
  if (!d.tied) arg("--untie-embeddings-and-output-weights");
  if (bf16) arg("--bf16");
  // FP8 linears (TrainingJob::fp8): Transformer Engine's delayed-scaling
  // recipe, E4M3 forward and E5M2 backward (arguments.py,
  // _add_transformer_engine_args).
  if (job.fp8) {
    arg("--fp8-format", "hybrid");
    arg("--fp8-amax-history-len", "1024");
    arg("--fp8-amax-compute-algo", "max");
  }
  // The parallel layout (distributed).
  arg("--tensor-model-parallel-size", str(p.tp));
  if (p.sp) arg("--sequence-parallel");
  arg("--pipeline-model-parallel-size", str(p.pp));
  if (p.cp > 1) {
    arg("--context-parallel-size", str(p.cp));
    // meshflow's cp: all_to_all to head shards (Ulysses), or the ring (p2p).
    arg("--cp-comm-type", p.ring ? "p2p" : "a2a");
  }
  if (p.pp > 1) {
    if (p.schedule == ScheduleKind::kInterleaved && uneven(p)) {
      arg("--num-virtual-stages-per-pipeline-rank", str(p.vp));
      arg("--account-for-embedding-in-pipeline-split");
      arg("--account-for-loss-in-pipeline-split");
    } else if (p.schedule == ScheduleKind::kInterleaved) {
      arg("--num-layers-per-virtual-pipeline-stage", str(d.layers / (p.pp * p.vp)));
    } else if (uneven(p)) {
      arg("--decoder-first-pipeline-num-layers", str(p.layers_per_stage.front()));
      arg("--decoder-last-pipeline-num-layers", str(p.layers_per_stage.back()));
    }
  }
  if (p.zero == 3) {
    arg("--use-torch-fsdp2");
  } else if (p.zero == 1) {
    // Optimizer state sharded, gradients reduce-scattered to their owner.
    arg("--use-distributed-optimizer");
    if (p.offload == Offload::kHost) arg("--optimizer-cpu-offload");
  }
  // The overlaps the price assumes (both off by default in Megatron-LM): the
  // gradients' reduction under the last backward (CostConstants::
  // overlap_grad_reduce) and the distributed optimizer's gather under the next
  // forward (overlap_param_gather, set by stack_constants).
  if (p.dp * p.cp > 1 && p.zero <= 1) {
    arg("--overlap-grad-reduce");
    if (p.zero == 1) arg("--overlap-param-gather");
  }
  // The batch (training).
  arg("--micro-batch-size", str(p.micro_batch));
  arg("--global-batch-size", str(job.global_batch));
  if (p.recompute == Recompute::kFull && p.recompute_layers > 0) {
    // The first N layers of each (virtual) pipeline stage.
    arg("--recompute-granularity", "full");
    arg("--recompute-method", "block");
    arg("--recompute-num-layers", str(p.recompute_layers));
  } else if (p.recompute == Recompute::kFull) {
    arg("--recompute-granularity", "full");
    arg("--recompute-method", "uniform");
    arg("--recompute-num-layers", "1");
  } else if (p.recompute == Recompute::kSelective) {
    arg("--recompute-granularity", "selective");
  }
  std::string out = "# meshflow plan " + plan_label(p) + ": Megatron-LM arguments for " +
                    str(p.devices()) +
                    " GPUs (data parallel = world size / (tp x pp x cp) = " + str(p.dp) + ")\n";
  for (size_t i = 0; i < a.size(); ++i) out += a[i] + (i + 1 < a.size() ? " \\\n" : "\n");
  return out;
}

Result<std::string> deepspeed(const Plan& p, const TrainingJob& job, bool bf16) {
  nlohmann::ordered_json j;
  j["train_batch_size"] = job.global_batch;
  j["train_micro_batch_size_per_gpu"] = p.micro_batch;
  j["gradient_accumulation_steps"] = p.num_micro_batches;
  j["zero_optimization"] = {{"stage", p.zero}};
  // ZeRO-1/2 reduce the gradients in buckets under the backward only with
  // overlap_comm (off by default for those stages), as the price assumes.
  if (p.zero == 1 || p.zero == 2) j["zero_optimization"]["overlap_comm"] = true;
  if (p.offload == Offload::kHost)
    j["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (p.offload == Offload::kNvme)
    j["zero_optimization"]["offload_optimizer"] = {
        {"device", "nvme"}, {"nvme_path", "/local_nvme"}, {"pin_memory", true}};
  j["bf16"] = {{"enabled", bf16}};
  if (p.tp > 1) j["tensor_parallel"] = {{"autotp_size", p.tp}};
  if (p.recompute == Recompute::kFull)
    j["activation_checkpointing"] = {{"partition_activations", false},
                                     {"contiguous_memory_optimization", false}};
  return j.dump(2) + "\n";
}

Result<std::string> torchtitan(const Plan& p, const TrainingJob& job, const TransformerDims& d,
                               bool eager) {
  std::string sched;
  switch (p.schedule) {
    case ScheduleKind::k1F1B:
      sched = "1F1B";
      break;
    case ScheduleKind::kGPipe:
      sched = "GPipe";
      break;
    case ScheduleKind::kInterleaved:
      sched = "Interleaved1F1B";
      break;
    case ScheduleKind::kZbH1:  // (pp = 1 only: no pipeline, check_torchtitan)
      sched = "1F1B";
      break;
    case ScheduleKind::kZbV:  // two stages per rank, placed in a V by the schedule
      sched = "ZBVZeroBubble";
      break;
  }
  std::string out = "# meshflow plan " + plan_label(p) + ": TorchTitan job config tables for " +
                    str(p.devices()) + " GPUs (set [model] name = \"llama3\" and its flavor" +
                    (job.fp8 ? ", in the [model] table below" : "") + ")\n";
  out += "[training]\n";
  out +=
      "local_batch_size = " + str(p.pp > 1 ? p.micro_batch * p.num_micro_batches : p.micro_batch) +
      "\n";
  out += "global_batch_size = " + str(job.global_batch) + "\n";
  out += "seq_len = " + str(job.seq) + "\n\n";
  out += "[parallelism]\n";
  // FSDP2 for ZeRO-3, and for ZeRO-1 under pipelines (check_torchtitan).
  const bool fsdp = p.zero == 3 || (p.pp > 1 && p.zero == 1);
  out += "data_parallel_replicate_degree = " + str(fsdp ? 1 : p.dp) + "\n";
  out += "data_parallel_shard_degree = " + str(fsdp ? p.dp : 1) + "\n";
  out += "tensor_parallel_degree = " + str(p.tp) + "\n";
  out += "context_parallel_degree = " + str(p.cp) + "\n";
  // The K/V shards passed round the ring, as meshflow's ring prices them.
  if (p.cp > 1) out += "context_parallel_rotate_method = \"alltoall\"\n";
  out += "pipeline_parallel_degree = " + str(p.pp) + "\n";
  if (p.pp > 1) {
    out += "pipeline_parallel_schedule = \"" + sched + "\"\n";
    out += "pipeline_parallel_microbatch_size = " + str(p.micro_batch) + "\n";
    if (uneven(p)) {
      // The modules of each stage by name (TorchTitan's llama3 modules).
      out += "module_fqns_per_model_part = [";
      int64_t layer = 0;
      for (size_t s = 0; s < p.layers_per_stage.size(); ++s) {
        out += s ? ", [" : "[";
        std::string part;
        if (s == 0) part += "\"tok_embeddings\"";
        for (int64_t k = 0; k < p.layers_per_stage[s]; ++k, ++layer)
          part += (part.empty() ? "" : ", ") + std::string("\"layers.") + str(layer) + "\"";
        if (s + 1 == p.layers_per_stage.size()) part += ", \"norm\", \"output\"";
        out += part + "]";
      }
      out += "]\n";
    } else {
      out += "pipeline_parallel_layers_per_stage = " + str(d.layers / (p.pp * p.vp)) + "\n";
    }
  }
  out += "\n[activation_checkpoint]\n";
  out += std::string("mode = \"") +
         (p.recompute == Recompute::kFull        ? "full"
          : p.recompute == Recompute::kSelective ? "selective"
                                                 : "none") +
         "\"\n";
  if (p.recompute == Recompute::kSelective) out += "selective_ac_option = \"op\"\n";
  if (job.fp8) {
    // torchao's Float8Linear for the blocks' linears (the output layer stays
    // 16-bit, as the plan prices it): the model converter and its table
    // (job_config.py: Model.converters, Float8).
    out += "\n[model]\nconverters = [\"float8\"]\n";
    // FSDP's weight gathers in FP8 (priced so: fp8_weight_gather) with one
    // all_reduce of the scales (TorchTitan's recommendation for tensorwise).
    out += "\n[float8]\nfilter_fqns = [\"output\"]\n";
    // torchao's rowwise recipe (TrainingJob::fp8_scaling), whose weights
    // FSDP gathers in 16-bit: float8 all-gather is tensorwise's alone.
    if (job.fp8_scaling == Fp8Scaling::kRowwise) {
      out += "recipe_name = \"rowwise\"\n";
    } else if (p.zero > 0) {
      out += "enable_fsdp_float8_all_gather = true\n";
      out += "precompute_float8_dynamic_scale_for_fsdp = true\n";
    }
  }
  // The plan's memory-bound ops were priced fused: torch.compile of the
  // model and the loss (job_config.py: Compile.enable, off by default,
  // Compile.components). Priced eager (--eager): TorchTitan's default.
  if (!eager) out += "\n[compile]\nenable = true\ncomponents = [\"model\", \"loss\"]\n";
  return out;
}

}  // namespace

namespace {
// Each target: its --emit key and its name for the user.
struct TargetName {
  EmitTarget target;
  const char* key;
  const char* name;
};
constexpr TargetName kTargets[] = {{EmitTarget::kMegatron, "megatron", "Megatron-LM"},
                                   {EmitTarget::kDeepSpeed, "deepspeed", "DeepSpeed"},
                                   {EmitTarget::kTorchTitan, "torchtitan", "TorchTitan"}};
const TargetName& target_name(EmitTarget t) {
  for (const TargetName& n : kTargets)
    if (n.target == t) return n;
  MF_CHECK(false) << "unknown emit target";
  return kTargets[0];
}
}  // namespace

Result<EmitTarget> parse_emit_target(const std::string& name) {
  for (const TargetName& n : kTargets)
    if (name == n.key) return n.target;
  return Status::invalid("--emit '" + name +
                         "': valid targets are megatron, deepspeed, torchtitan");
}

const char* emit_target_key(EmitTarget t) {
  return target_name(t).key;
}

const char* emit_target_name(EmitTarget t) {
  return target_name(t).name;
}

Status emit_check(const Plan& p, const TransformerDims& d, EmitTarget t) {
  if (p.ops)
    return cannot(t, p,
                  "its per-operator strategies (the strategy search's) have no spelling there; "
                  "price the Megatron layouts instead (a plan without +ops)");
  switch (t) {
    case EmitTarget::kMegatron:
      return check_megatron(p);
    case EmitTarget::kDeepSpeed:
      return check_deepspeed(p);
    case EmitTarget::kTorchTitan:
      return check_torchtitan(p, d);
  }
  return Status::ok();
}

Result<std::string> emit_plan(const Plan& p, const TrainingJob& job, bool bf16, EmitTarget t,
                              bool eager) {
  MF_ASSIGN_OR_RETURN(const TransformerDims d, model_dims(job, t));
  MF_RETURN_IF_ERROR(emit_check(p, d, t));
  if (job.fp8 && job.fp8_scaling == Fp8Scaling::kRowwise && t == EmitTarget::kMegatron)
    return Status::invalid(
        "--emit megatron: Transformer Engine has no rowwise FP8 recipe (Megatron-LM's "
        "--fp8-recipe: delayed, tensorwise, mxfp8, blockwise); plan with tensorwise scaling, "
        "or emit torchtitan");
  if (job.fp8 && t == EmitTarget::kDeepSpeed)
    return Status::invalid(
        "--emit deepspeed: DeepSpeed's config has no FP8 training of its own (it runs "
        "Transformer Engine's modules inside the model); plan without --fp8, or emit megatron "
        "or torchtitan");
  switch (t) {
    case EmitTarget::kMegatron:
      return megatron(p, job, d, bf16);
    case EmitTarget::kDeepSpeed:
      return deepspeed(p, job, bf16);
    case EmitTarget::kTorchTitan:
      return torchtitan(p, job, d, eager);
  }
  return Status::internal("emit_plan: unknown target");
}

void apply_stack_constants(EmitTarget t, bool bf16, CostConstants* k) {
  switch (t) {
    case EmitTarget::kMegatron:
      if (bf16) k->grad_accumulation_bytes = 4, k->grad_reduce_bytes = 4;
      k->overlap_param_gather = true;     // --overlap-param-gather, which it emits
      k->tp_backward_overlap = true;      // its tensor-parallel layers' async backward
      k->overlap_p2p_interleaved = true;  // overlap_p2p_comm, its interleaved default
      k->fp8_weight_cache = true;         // TE's FP8 weights cached for the step
      k->fp8_tp_all_gather = true;        // TE's sequence-parallel gathers quantized first
      break;
    case EmitTarget::kDeepSpeed:
      k->zero_grad_partition_bytes = 4;
      k->zero_reduce_bucket_elements = 5e8;
      k->zero0_reduce_after_backward = true;  // its engine's allreduce_gradients
      break;
    case EmitTarget::kTorchTitan:
      k->grad_reduce_bytes = 4;
      // FSDP2 under mixed precision holds gradients in its reduce dtype: the
      // sharded ones in the f32 of its sharded parameters, and under a
      // pipeline's no-sync micro-batches the unsharded ones accumulated in
      // f32 (FSDPParam.to_accumulated_grad_if_needed upcasts each backward's
      // 16-bit gradient to reduce_dtype).
      if (bf16) k->grad_accumulation_bytes = 4;
      k->zero3_gather_for_recompute = false;
      k->selective_is_op_sac = true;  // what selective_ac_option = "op" runs
      // [compile] components = ["model", "loss"], as emitted unless --eager.
      k->loss_bytes_per_logit = CostConstants::kCompiledLossBytesPerLogit;
      // It logs the allocator's reserved peak (max_reserved), under
      // expandable segments.
      k->allocator_reserved_ratio = CostConstants::kReservedRatioCompiled;
      k->fp8_weight_gather = true;  // float8.enable_fsdp_float8_all_gather, emitted with FP8
      k->fp8_tp_all_gather = true;  // enable_float8_tensorwise_tp, on with tensorwise FP8
      // ZeRO-1 is FSDP2 under its pipelines: one reduce-scatter after the
      // step's last backward, the first forward's gathers prefetched.
      k->zero1_reduce_after_backward = true;
      k->overlap_param_gather = true;
      break;
  }
}

void apply_stack_attention(EmitTarget t, const Cluster& c, CostConstants* k) {
  if (t == EmitTarget::kMegatron && c.device.attention_efficiency.count("cudnn"))
    k->fused_attention = "cudnn";
}

CostConstants stack_constants(EmitTarget t, bool bf16) {
  CostConstants k;
  apply_stack_constants(t, bf16, &k);
  return k;
}

std::string stack_priced(EmitTarget t, bool bf16, bool fp8, Fp8Scaling scaling) {
  std::string s;
  switch (t) {
    case EmitTarget::kMegatron:
      s = bf16 ? "Megatron-LM's (gradients accumulated and all-reduced in f32, their "
                 "reduction, the distributed optimizer's gather and the tensor-parallel "
                 "backward's collectives overlapped, the interleaved schedule's p2p under the "
                 "other chunks' compute)"
               : "Megatron-LM's (the gradients' reduction, the distributed optimizer's "
                 "gather and the tensor-parallel backward's collectives overlapped, the "
                 "interleaved schedule's p2p under the other chunks' compute)";
      if (fp8)
        s.insert(s.size() - 1,
                 "; FP8 weights cast once a step, Transformer Engine's cache, the tp all-gathers "
                 "in FP8");
      break;
    case EmitTarget::kDeepSpeed:
      s = "DeepSpeed's (ZeRO-1/2: the step's f32 gradient partition and a 5e8-element "
          "reduce bucket; without ZeRO, gradients all-reduced after the backward)";
      break;
    case EmitTarget::kTorchTitan:
      s = "TorchTitan's (gradients held and reduced in f32, recompute inside the FSDP unit, "
          "selective recompute as its op-level SAC, FSDP2 under pipelines as ZeRO-1 "
          "reduced after the last backward)";
      if (fp8 && scaling == Fp8Scaling::kRowwise)
        s.insert(s.size() - 1,
                 "; FP8 rowwise: each GEMM casts its operands per row, weights gathered in "
                 "16-bit under FSDP");
      else if (fp8)
        s.insert(s.size() - 1,
                 "; FP8 weights cast every forward, gathered in FP8 under FSDP, the tp "
                 "all-gathers in FP8");
      break;
  }
  return s;
}

std::string stack_assumed(const CostConstants& k, DType compute, bool has_attention) {
  const double act = double(dtype_size(compute));
  auto bytes = [&](double b) { return (b > 0 ? b : act) == 4 ? "f32" : "16-bit"; };
  std::string s = "gradients held in " + std::string(bytes(k.grad_accumulation_bytes)) +
                  " and reduced in " + bytes(k.grad_reduce_bytes) +
                  (k.overlap_grad_reduce ? ", the reduction overlapped with the backward"
                                         : ", reduced after the backward");
  if (k.zero3_prefetch) s += ", ZeRO-3's gathers prefetched";
  if (k.overlap_p2p_interleaved) s += ", the interleaved schedule's p2p overlapped";
  if (k.fp8_weight_cache) s += ", FP8 weights cast once a step";
  if (has_attention) {  // (a ResNet's or an MLP's has none)
    switch (k.attention) {
      case AttentionKernel::kFused:
        s += ", fused attention (" + k.fused_attention + ")";
        break;
      case AttentionKernel::kMaterialized:
        s += ", attention scores materialized";
        break;
      case AttentionKernel::kBlockedCpu:
        s += ", the CPU's blocked attention";
        break;
    }
  }
  s += k.tp_comm_overlap ? ", tensor-parallel collectives overlapped"
                         : ", tensor-parallel collectives not overlapped";
  if (k.eager) s += ", elementwise ops eager";
  if (k.blocking_launch_s > 0) s += ", kernels launched synchronously (CUDA_LAUNCH_BLOCKING=1)";
  return s;
}

}  // namespace meshflow::plan
