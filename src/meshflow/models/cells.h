// Cell names, as a user writes them in a config, resolved against a model's
// cells (ModelGraph::cells): MindSpore's `cell.pipeline_stage = k` and
// `cell.recompute()` as config keys.
//
//   parallel.pipeline.stage_of {"embedder": 0, "encoder.stages.0": 0, "encoder.stages.1": 0,
//                               "encoder.stages.2": 1, "encoder.stages.3": 1, "classifier": 1}
//   MF_ASSIGN_OR_RETURN(std::vector<int64_t> per_stage, blocks_per_stage(m.cells, stage_of, 2));
//   train.recompute_layers ["encoder.stages.*"]
//   MF_ASSIGN_OR_RETURN(std::vector<int> blocks, blocks_named(m.cells, names,
//   "train.recompute_layers"));
//
// A name addresses a cell when it matches (core/glob.h) the cell's name or a
// dotted prefix of it: "encoder.stages.0" addresses encoder.stages.0.layers.*,
// "encoder.stages.*" every block of the encoder. When several names address a
// cell, the one naming the smaller cell around it wins (its shortest matching
// prefix has more parts), then the one with fewer wildcards:
// {"encoder.*": 0, "encoder.stages.3": 1} puts stage 3 on 1, and so does
// {"encoder.stages.*": 0, "encoder.stages.3": 1}.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "meshflow/core/status.h"
#include "meshflow/models/model.h"

namespace meshflow {

// Blocks per pipeline stage from stage_of (name -> stage, in [0, stages)).
// Errors (one line, naming `key` and what is valid): a name that addresses no
// cell or a part inside one, a cell left without a stage, stages that go
// back along the model, a cell outside the blocks on another stage than the
// block next to it (the pipeline runs it with that block), a stage with no
// block. REQUIRES: stages >= 1.
Result<std::vector<int64_t>> blocks_per_stage(
    const std::vector<ModelCell>& cells,
    const std::vector<std::pair<std::string, int64_t>>& stage_of, int stages,
    const std::string& key = "parallel.pipeline.stage_of");

// The blocks (sorted, unique) the names address. Errors: a name that addresses
// no cell, or only cells outside the blocks.
Result<std::vector<int>> blocks_named(const std::vector<ModelCell>& cells,
                                      const std::vector<std::string>& names,
                                      const std::string& key);

// "embedder, encoder.stages.0.layers.0, ..., classifier (12 cells)" for messages.
std::string describe_cells(const std::vector<ModelCell>& cells);

}  // namespace meshflow
