// `meshflow explain CONFIG.json`: what the partitioner does with a run config:
// each node's layouts (and why it got them), every collective inserted with
// its bytes per rank, and per-step totals by kind and phase.
#pragma once

#include <string>
#include <vector>

#include "meshflow/parallel/partition.h"

namespace meshflow::cli {

struct ExplainOptions {
  std::string config;
  std::vector<std::string> overrides;
  int rank = 0;       // whose program to show (they differ only in offsets)
  int ranks = 0;      // the job's rank count (0: the config's mesh, else 1)
  bool nodes = true;  // list every node's layouts
  // The planner's prediction for this layout on this machine, beside the
  // fastest plan it prices (engine/job.h price_job_plan; auto mode's own
  // answer is always shown).
  bool predict = false;
  int micro_batches = 0;  // 0: from the config
};
int run_explain(const ExplainOptions& o);

// The report for one lowered program (also used by tests).
std::string explain_text(const Graph& g, const Annotation& a, const LocalProgram& p,
                         bool list_nodes, int micro_batches);

}  // namespace meshflow::cli
