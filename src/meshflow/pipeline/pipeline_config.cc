#include "meshflow/pipeline/pipeline_config.h"

#include <string>

namespace meshflow {

Result<PipelineConfig> parse_pipeline_config(const json& j) {
  PipelineConfig pc;
  JsonObjectReader r(j, "pipeline");
  r.integer("stages", &pc.stages, 1);
  r.int_list("layers_per_stage", &pc.layers_per_stage, 1);
  std::string schedule = "1f1b";
  r.choice("schedule", &schedule, {"gpipe", "1f1b", "interleaved", "zb-h1"});
  r.integer("micro_batches", &pc.micro_batches, 1);
  r.integer("virtual_stages", &pc.virtual_stages, 1);
  MF_RETURN_IF_ERROR(r.finish());
  MF_ASSIGN_OR_RETURN(pc.schedule, parse_schedule_kind(schedule));
  if (!pc.layers_per_stage.empty() &&
      static_cast<int>(pc.layers_per_stage.size()) != pc.stages * pc.virtual_stages)
    return Status::invalid(
        "pipeline.layers_per_stage has " + std::to_string(pc.layers_per_stage.size()) +
        " entries; give one per " +
        "model chunk: stages x virtual_stages = " + std::to_string(pc.stages * pc.virtual_stages));
  // Schedule constraints (micro-batches vs stages, virtual stages) come back now, not mid-run.
  MF_RETURN_IF_ERROR(
      make_schedule({pc.schedule, pc.stages, pc.micro_batches, pc.virtual_stages}).status());
  return pc;
}

}  // namespace meshflow
