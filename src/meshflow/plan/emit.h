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

// OK iff the target runs `p` exactly as planned (the search's filter for
// --emit: the best plan the target can run); else why not and what to pin.
Status emit_check(const Plan& p, const TransformerDims& d, EmitTarget t);

// The plan for `job` in the target's spelling. bf16: mixed precision (the
// cluster's compute dtype). Megatron-LM: one argument per line, ending in
// " \" for a launch script (model shape, parallel degrees, batch,
// recompute, optimizer sharding). DeepSpeed: the JSON config. TorchTitan:
// the TOML's [training], [parallelism] and [activation_checkpoint] tables.
Result<std::string> emit_plan(const Plan& p, const TrainingJob& job, bool bf16, EmitTarget t);

}  // namespace meshflow::plan
