#include "meshflow/pipeline/pipeline_config.h"

#include <string>

namespace meshflow {

Result<PipelineConfig> parse_pipeline_config(const json& j) {
  PipelineConfig pc;
  JsonObjectReader r(j, "pipeline");
  r.integer("stages", &pc.stages, 1);
  r.int_list("layers_per_stage", &pc.layers_per_stage, 1);
  std::string schedule = "1f1b";
  r.choice("schedule", &schedule, {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"});
  r.integer("micro_batches", &pc.micro_batches, 1);
  r.integer("virtual_stages", &pc.virtual_stages, 1);
  r.ignore({"stage_of"});
  MF_RETURN_IF_ERROR(r.finish());
  if (j.contains("stage_of")) {
    const json& so = j.at("stage_of");
    if (!so.is_object() || so.empty())
      return Status::invalid(
          "pipeline.stage_of must be an object of cell names to stages, like {\"embedder\": 0, "
          "\"encoder.stages.2\": 1}, got " +
          (so.is_object() ? std::string("an empty object") : json_type_name(so)));
    for (const auto& [name, stage] : so.items()) {
      if (!stage.is_number_integer())
        return Status::invalid("pipeline.stage_of[\"" + name + "\"] must be a stage number, got " +
                               json_type_name(stage));
      pc.stage_of.emplace_back(name, stage.get<int64_t>());
    }
    if (!pc.layers_per_stage.empty())
      return Status::invalid(
          "pipeline.stage_of and pipeline.layers_per_stage both place the layers; give one");
    if (pc.virtual_stages > 1 || schedule == "zb-v")
      return Status::invalid("pipeline.stage_of with " +
                             (schedule == "zb-v"
                                  ? std::string("schedule \"zb-v\"")
                                  : "virtual_stages=" + std::to_string(pc.virtual_stages)) +
                             ": stage_of gives each cell one stage; several chunks per stage take "
                             "layers_per_stage (one entry per chunk)");
  }
  MF_ASSIGN_OR_RETURN(pc.schedule, parse_schedule_kind(schedule));
  // zb-v is two chunks per stage by definition: left out, virtual_stages is 2.
  if (pc.schedule == ScheduleKind::kZbV && !j.contains("virtual_stages")) pc.virtual_stages = 2;
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
