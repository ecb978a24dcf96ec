#include "meshflow/models/cells.h"

#include <algorithm>
#include <optional>

#include "meshflow/core/glob.h"

namespace meshflow {

namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

// How specifically `pattern` addresses `cell`: the number of dotted parts of
// the shortest prefix of the cell's name it matches (the cell it names; the
// cell is under it), 0 when it matches none. "encoder.*" addresses
// encoder.stages.3.layers.0 at depth 2 ("encoder.stages"), "encoder.stages.3"
// at depth 3.
int depth_of(const std::string& pattern, const std::string& cell) {
  int parts = 0;
  for (size_t pos = 0;;) {
    const size_t end = cell.find('.', pos);
    ++parts;
    if (glob_match(pattern, cell.substr(0, end))) return parts;
    if (end == std::string::npos) return 0;
    pos = end + 1;
  }
}

int wildcards(const std::string& pattern) {
  return static_cast<int>(
      std::count_if(pattern.begin(), pattern.end(), [](char c) { return c == '*' || c == '?'; }));
}

// A name that addresses nothing: inside a cell (finer than the cells) or unknown.
Status no_cell(const std::vector<ModelCell>& cells, const std::string& name,
               const std::string& key) {
  for (const ModelCell& c : cells)
    if (name.rfind(c.name + ".", 0) == 0)
      return Status::invalid(key + " names '" + name + "', a part inside the cell '" + c.name +
                             "'; name whole cells (or a prefix of them): " + describe_cells(cells));
  return Status::invalid(key + " names '" + name +
                         "', which is no cell of the model; the cells are " +
                         describe_cells(cells) +
                         " (a dotted prefix such as the first part, or a glob with '*', addresses "
                         "every cell under it)");
}

}  // namespace

std::string describe_cells(const std::vector<ModelCell>& cells) {
  std::vector<std::string> shown;
  const size_t n = cells.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 10 && i == 5) {
      shown.emplace_back("...");
      i = n - 4;
    }
    shown.push_back(cells[i].name);
  }
  std::string out;
  for (size_t i = 0; i < shown.size(); ++i) out += (i ? ", " : "") + shown[i];
  if (n > 10) out += " (" + str(static_cast<int64_t>(n)) + " cells)";
  return out;
}

Result<std::vector<int64_t>> blocks_per_stage(
    const std::vector<ModelCell>& cells,
    const std::vector<std::pair<std::string, int64_t>>& stage_of, int stages,
    const std::string& key) {
  // Each cell's stage: the most specific name addressing it.
  struct Pick {
    int depth = 0, wild = 0;
    size_t entry = 0;
  };
  std::vector<std::optional<Pick>> pick(cells.size());
  std::vector<bool> used(stage_of.size(), false);
  for (size_t e = 0; e < stage_of.size(); ++e) {
    const auto& [name, stage] = stage_of[e];
    if (stage < 0 || stage >= stages)
      return Status::invalid(key + "[\"" + name + "\"] is " + str(stage) + "; stages are 0 to " +
                             str(stages - 1) + " (pipeline.stages=" + str(stages) + ")");
    for (size_t c = 0; c < cells.size(); ++c) {
      const int depth = depth_of(name, cells[c].name);
      if (depth == 0) continue;
      used[e] = true;
      const Pick p{depth, wildcards(name), e};
      std::optional<Pick>& cur = pick[c];
      if (!cur || p.depth > cur->depth || (p.depth == cur->depth && p.wild < cur->wild)) {
        cur = p;
      } else if (p.depth == cur->depth && p.wild == cur->wild &&
                 stage_of[cur->entry].second != stage) {
        return Status::invalid(key + " gives the cell '" + cells[c].name + "' two stages: '" +
                               stage_of[cur->entry].first + "' says " +
                               str(stage_of[cur->entry].second) + ", '" + name + "' says " +
                               str(stage) + "; name the cell itself to decide");
      }
    }
  }
  for (size_t e = 0; e < stage_of.size(); ++e)
    if (!used[e]) return no_cell(cells, stage_of[e].first, key);

  std::vector<int64_t> stage(cells.size());
  for (size_t c = 0; c < cells.size(); ++c) {
    if (!pick[c])
      return Status::invalid(key + " leaves the cell '" + cells[c].name +
                             "' without a stage; give every cell a stage (the cells are " +
                             describe_cells(cells) + ")");
    stage[c] = stage_of[pick[c]->entry].second;
  }
  for (size_t c = 1; c < cells.size(); ++c)
    if (stage[c] < stage[c - 1])
      return Status::invalid(key + " puts '" + cells[c].name + "' on stage " + str(stage[c]) +
                             " after '" + cells[c - 1].name + "' on stage " + str(stage[c - 1]) +
                             "; stages follow the model's order, stage 0 first");
  // A cell outside the blocks runs with the block before it (before the
  // first block: with the first block).
  int last_block = -1;
  for (size_t c = 0; c < cells.size(); ++c)
    if (cells[c].block >= 0) last_block = static_cast<int>(c);
  if (last_block < 0)
    return Status::invalid(key + ": the model has no blocks to put on stages (its cells are " +
                           describe_cells(cells) + "); a pipeline splits a model between blocks");
  int prev = -1;
  for (size_t c = 0; c < cells.size(); ++c) {
    if (cells[c].block >= 0) {
      prev = static_cast<int>(c);
      continue;
    }
    int next = prev;
    if (next < 0)
      for (size_t d = c + 1; d < cells.size() && next < 0; ++d)
        if (cells[d].block >= 0) next = static_cast<int>(d);
    if (stage[c] != stage[next])
      return Status::invalid(key + " puts '" + cells[c].name + "' on stage " + str(stage[c]) +
                             ", but it runs " + (prev < 0 ? "before" : "after") + " the block '" +
                             cells[next].name + "' on stage " + str(stage[next]) +
                             "; a cell outside the blocks runs on its neighbouring block's stage");
  }
  std::vector<int64_t> per_stage(stages, 0);
  for (size_t c = 0; c < cells.size(); ++c)
    if (cells[c].block >= 0) ++per_stage[stage[c]];
  for (int s = 0; s < stages; ++s)
    if (per_stage[s] == 0)
      return Status::invalid(key + " gives stage " + str(s) + " no block; each of the " +
                             str(stages) + " stages needs at least one (the blocks are " +
                             cells[0].name + " ... " + cells[last_block].name + ")");
  return per_stage;
}

Result<std::vector<int>> blocks_named(const std::vector<ModelCell>& cells,
                                      const std::vector<std::string>& names,
                                      const std::string& key) {
  std::vector<int> blocks;
  for (const std::string& name : names) {
    bool any = false, any_block = false;
    for (const ModelCell& c : cells) {
      if (depth_of(name, c.name) == 0) continue;
      any = true;
      if (c.block < 0) continue;
      any_block = true;
      blocks.push_back(c.block);
    }
    if (!any) return no_cell(cells, name, key);
    if (!any_block)
      return Status::invalid(key + " names '" + name +
                             "', which holds no block (it is outside the blocks); recompute is "
                             "per block: name blocks or cells holding them among " +
                             describe_cells(cells));
  }
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  return blocks;
}

}  // namespace meshflow
