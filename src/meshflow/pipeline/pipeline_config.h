// PipelineConfig: the "pipeline" section of a run config (inside "parallel"),
// parsed strictly. engine/job.h resolves it with the rest of the job; the
// pipeline engine (engine/pipeline_trainer.h) runs it.
//
//   MF_ASSIGN_OR_RETURN(PipelineConfig pc, parse_pipeline_config(doc["pipeline"]));
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "meshflow/config/json_reader.h"
#include "meshflow/core/status.h"
#include "meshflow/pipeline/schedule.h"

namespace meshflow {

// The run config's "pipeline" section:
//   {"stages": 2, "layers_per_stage": [2, 2], "schedule": "1f1b", "micro_batches": 8,
//    "virtual_stages": 1}
// layers_per_stage has one entry per model chunk (stages x virtual_stages
// entries; chunk c runs on stage c % stages, or in a V with "zb-v": chunk c
// and chunk 2*stages-1-c on stage c); absent: balanced. "zb-v" without
// "virtual_stages" runs 2 chunks per stage.
struct PipelineConfig {
  int stages = 1;
  std::vector<int64_t> layers_per_stage;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int micro_batches = 1;
  int virtual_stages = 1;
  // "stage_of": {"embedder": 0, "encoder.stages.2": 1, ...}: the stage of each
  // cell by name (MindSpore's cell.pipeline_stage; models/cells.h). The job
  // resolves it against the model into layers_per_stage (engine/job.h).
  std::vector<std::pair<std::string, int64_t>> stage_of;
};

// Strict: unknown keys and bad values are errors naming the key and what is valid.
Result<PipelineConfig> parse_pipeline_config(const json& j);

}  // namespace meshflow
