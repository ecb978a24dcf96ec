// A plan written for the GPU stacks users train on today: `meshflow plan
// ... --emit megatron|deepspeed|torchtitan` prints the chosen plan as
// Megatron-LM's launch arguments, a DeepSpeed config JSON or a TorchTitan
// TOML, so a user can plan here and run there.
//
//   MF_ASSIGN_OR_RETURN(EmitTarget t, parse_emit_target("megatron"));
//   MF_ASSIGN_OR_RETURN(std::string text, emit_plan(best.plan, job, /*bf16=*/true, t));
//
// Every name written is one the target defines (Megatron-LM's
// megatron/training/arguments.py, DeepSpeed's config keys, TorchTitan's
// job_config.py; tests/plan_emit_test.cc lists them with their sources). A
// plan the target cannot express exactly (a schedule it lacks, per-operator
// strategies, an uneven split it has no flag for, a ZeRO stage its tensor
// parallelism does not combine with) is an error naming the choice and what
// the target offers, never a config that runs something else.
#pragma once

#include <string>

#include "meshflow/core/status.h"
#include "meshflow/plan/cost_model.h"
#include "meshflow/plan/model_dims.h"
#include "meshflow/plan/plan.h"

namespace meshflow::plan {

enum class EmitTarget { kMegatron, kDeepSpeed, kTorchTitan };

// "megatron", "deepspeed", "torchtitan"; errors list them.
Result<EmitTarget> parse_emit_target(const std::string& name);
const char* emit_target_name(EmitTarget t);
// The name parse_emit_target reads ("megatron", "deepspeed", "torchtitan").
const char* emit_target_key(EmitTarget t);

// OK iff the target runs `p` exactly as planned (the search's filter for
// --emit: the best plan the target can run); else why not and what to pin.
Status emit_check(const Plan& p, const TransformerDims& d, EmitTarget t);

// The plan for `job` in the target's spelling. bf16: mixed precision (the
// cluster's compute dtype). Megatron-LM: one argument per line, ending in
// " \" for a launch script (model shape, parallel degrees, batch,
// recompute, optimizer sharding; Transformer Engine's FP8 recipe with
// job.fp8). DeepSpeed: the JSON config (no FP8: refused). TorchTitan: the
// TOML's [training], [parallelism] and [activation_checkpoint] tables (with
// job.fp8, [model] converters and [float8]), and [compile] (torch.compile of
// the model and the loss, which the plan's fused memory-bound ops price)
// unless `eager` (priced at CostConstants::kEagerElementwise: TorchTitan's
// default, compile off).
Result<std::string> emit_plan(const Plan& p, const TrainingJob& job, bool bf16, EmitTarget t,
                              bool eager = false);

// The cost model's constants for the stack the target is, so `meshflow plan
// --emit` prices (and checks the memory of) the program that stack runs:
// Megatron-LM with bf16 accumulates and all-reduces gradients in f32
// (arguments.py: "bfloat16 requires gradient accumulation and all-reduce to
// be done in fp32"), 6 + 12/dp bytes per parameter under its distributed
// optimizer, whose gather overlaps the next forward (--overlap-param-gather,
// emitted); DeepSpeed's ZeRO-1/2 optimizer allocates the step's f32
// gradient partition and a 5e8-element reduce bucket (stage_1_and_2.py,
// reduce_bucket_size's default), and without ZeRO its engine all-reduces
// after the backward; TorchTitan reduces gradients in f32
// (mixed_precision_reduce's default), recomputes inside the FSDP unit
// with the backward's gather (CostConstants::zero3_gather_for_recompute),
// runs selective recompute as its op-level SAC (selective_is_op_sac), and
// under pipelines its FSDP2 is ZeRO-1 reduced after the last backward.
CostConstants stack_constants(EmitTarget t, bool bf16);
// The same set on `k`: only the fields the target's stack fixes change
// (bench/public_runs applies DeepSpeed's to its 2021-22 constants).
void apply_stack_constants(EmitTarget t, bool bf16, CostConstants* k);
// The stack's fused attention kernel on the cluster's device, set on `k`:
// Megatron-LM runs Transformer Engine's attention, which on Hopper and later
// prefers cuDNN's fused kernel to FlashAttention (TE's get_attention_backend:
// "Disabling FlashAttention to give FusedAttention preference on Hopper+ for
// performance reasons"): "cudnn" where the cluster file prices it; the
// others keep FlashAttention-2.
void apply_stack_attention(EmitTarget t, const Cluster& c, CostConstants* k);
// One line for the user: "Megatron-LM's (gradients accumulated and reduced in f32)";
// with fp8, how the stack treats its FP8 weights.
std::string stack_priced(EmitTarget t, bool bf16, bool fp8 = false,
                         Fp8Scaling scaling = Fp8Scaling::kTensorwise);
// What plain `meshflow plan` (no --emit) prices, read from `k`: the
// gradients' bytes and their reduction's overlap, ZeRO-3's prefetch, the
// attention kernel (where the model has attention), the tensor-parallel
// collectives, eager elementwise ops.
std::string stack_assumed(const CostConstants& k, DType compute, bool has_attention = true);

}  // namespace meshflow::plan
