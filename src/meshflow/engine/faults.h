// Fault injection for the tests of failure handling, read from the
// environment (never set in a real run):
//   MESHFLOW_INJECT_FAULT=RANK:STEP:save  rank RANK's process is killed (SIGKILL) after it
//                                         wrote its shard of step STEP's checkpoint, before
//                                         the commit (engine/state_checkpoint.h)
//   MESHFLOW_INJECT_FAULT=RANK:STEP:nan   rank RANK's backward seed is NaN in step STEP (the
//                                         0-based step index): its gradients, and so the
//                                         reduced ones, are not finite (train.on_nonfinite)
//   MESHFLOW_INJECT_FAULT=RANK:STEP:nan@M the same in micro-batch M of that step alone (the
//                                         one-program engine; the pipeline's poisons all)
// (the command line handles the kinds "throw" and "kill": cli/commands.cc).
#pragma once

#include <cstdint>

namespace meshflow {

// The step MESHFLOW_INJECT_FAULT names for `rank` and fault `kind`, or -1
// (the one parser of the variable; the command line uses it for "throw" and
// "kill").
int64_t injected_fault_step(const char* kind, int rank);

// SIGKILLs this process when the "save" fault names (rank, step).
void kill_if_injected(int rank, int64_t step);

// True when the "nan" fault names (rank, step).
bool nan_injected(int rank, int64_t step);
// True when the "nan" fault names (rank, step), or "nan@M" names it and
// micro-batch `micro` is M.
bool nan_injected(int rank, int64_t step, int micro);

}  // namespace meshflow
