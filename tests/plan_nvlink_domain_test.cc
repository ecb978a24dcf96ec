// NVLink domains larger than a node (Cluster::devices_per_domain): a GB200 or
// GB300 NVL72 rack joins its 18 trays of 4 GPUs over its NVLink switches, so
// a tensor-parallel group that spans trays rides NVLink, not the network, and
// the planner keeps tp inside the domain rather than inside a tray.
#include <gtest/gtest.h>

#include <string>

#include "cli_run.h"
#include "meshflow/config/json_reader.h"
#include "meshflow/core/check.h"
#include "meshflow/plan/search.h"
#include "shipped_files.h"

namespace meshflow::plan {
namespace {

using meshflow::testing::source_dir;

using meshflow::testing::load_model;

Cluster nvl72(int64_t gpus, bool domain = true) {
  Result<Cluster> c = load_cluster(source_dir() + "/configs/clusters/gb200_nvl72.json");
  MF_CHECK(c.is_ok()) << c.status().message();
  Cluster r = *c;
  if (!domain) r.devices_per_domain = 0;  // each tray its own fabric
  return value_or_throw(with_devices(r, gpus));
}

double tp_comm_s(const Cluster& c, int64_t tp) {
  CostModel cm(TrainingJob{load_model("llama3_70b.json"), 16, 8192}, c);
  Plan p;
  p.tp = tp, p.dp = c.total_devices() / tp, p.sp = true;
  p.micro_batch = 1, p.num_micro_batches = 16 / p.dp;
  p.recompute = Recompute::kFull;
  p.zero = 1;
  Result<StepCost> s = cm.price(p);
  MF_CHECK(s.is_ok()) << s.status().message();
  return s->tp_comm_s;
}

TEST(PlanNvlinkDomain, TensorParallelAcrossTraysRidesNvlink) {
  // tp=4 stays in a tray either way; tp=8 spans two trays: over the rack's
  // NVLink with the domain (540 GB/s effective), over the trays' four
  // 400 Gb/s ports a ring without (180).
  EXPECT_DOUBLE_EQ(tp_comm_s(nvl72(16), 4), tp_comm_s(nvl72(16, false), 4));
  const double rack = tp_comm_s(nvl72(16), 8), trays = tp_comm_s(nvl72(16, false), 8);
  EXPECT_GT(trays, 2 * rack) << trays << " vs " << rack;
  // Inside the rack tp=8 costs what 900 GB/s links give it, like an 8-GPU
  // board of the same links.
  Cluster board = nvl72(8);
  board.nodes = 1, board.devices_per_node = 8, board.devices_per_domain = 0;
  EXPECT_DOUBLE_EQ(tp_comm_s(nvl72(8), 8), tp_comm_s(board, 8));
}

TEST(PlanNvlinkDomain, TheSearchTriesTensorParallelAcrossTheRack) {
  // The sweep's tp degrees stop at the NVLink fabric: a tray of 4 without
  // the domain, the rack of 72 with it (tp=8, 16, ... dividing the heads).
  const TrainingJob job{load_model("llama3_70b.json"), 64, 8192};
  SearchOptions o;
  o.top_k = 0;
  o.no_op_search = true;
  Result<SearchResult> rack = search_plans(CostModel(job, nvl72(64)), 64, o);
  Result<SearchResult> trays = search_plans(CostModel(job, nvl72(64, false)), 64, o);
  ASSERT_TRUE(rack.is_ok()) << rack.status().message();
  ASSERT_TRUE(trays.is_ok()) << trays.status().message();
  EXPECT_GT(rack->evaluated, trays->evaluated);
  o.fixed = value_or_throw(parse_fixed("tp=8"));
  rack = search_plans(CostModel(job, nvl72(64)), 64, o);
  ASSERT_TRUE(rack.is_ok()) << rack.status().message();
  EXPECT_EQ(rack->plans[0].plan.tp, 8);

  const std::string cli =
      "plan " + source_dir() + "/configs/models/llama3_70b.json --cluster " + source_dir() +
      "/configs/clusters/gb200_nvl72.json --gpus 144 --seq 8192 --global-batch 144 --top 0";
  testing::CliRun run = testing::run_cli(cli);
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("(36 nodes x 4; NVLink domains of 72 GPUs)"), std::string::npos)
      << run.output;
}

}  // namespace
}  // namespace meshflow::plan
