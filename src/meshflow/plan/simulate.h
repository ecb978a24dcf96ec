// Simulated step: the timeline of one training step under a priced plan, as
// the schedule runs it: each pipeline stage executes its forward (F), backward
// (B) and weight-gradient (W) work per micro-batch (per model chunk when
// interleaved) in the schedule's order, waiting for its neighbours' sends; the
// gradient reduce and the optimizer close the step. Written as a Chrome trace
// with the shared writer (core/trace.h), one process per stage with rows for
// compute and p2p, so `meshflow simulate --trace` and `meshflow train --trace`
// look alike.
//
//   MF_ASSIGN_OR_RETURN(StepCost c, cm.price(plan));
//   SimulatedStep s = simulate_step(c);
//   MF_RETURN_IF_ERROR(s.trace.write("step.json"));
//
// Every stage is given the slowest stage's times (StepCost::stage), so the
// simulated step is an upper bound of the cost model's closed-form one and
// equals it for 1F1B and GPipe.
#pragma once

#include <cstdint>

#include "meshflow/core/status.h"
#include "meshflow/core/trace.h"
#include "meshflow/plan/cost_model.h"

namespace meshflow::plan {

struct SimulatedStep {
  double step_time_s = 0;
  double pipeline_s = 0;       // until the last backward finishes
  double bubble_fraction = 0;  // idle share of the compute rows during the pipeline
  TraceWriter trace;
};

// REQUIRES: c came from CostModel::price (a valid plan).
SimulatedStep simulate_step(const StepCost& c);

// What `meshflow plan --out` wrote, read back: the job, the cluster it was
// planned for, the cost constants and the plan. Errors name the key.
struct PlannedRun {
  TrainingJob job;
  Cluster cluster;
  CostConstants constants;
  Plan plan;
};
Result<PlannedRun> parse_plan_file(const json& f);

}  // namespace meshflow::plan
