// A plan written is the plan that runs: for every plan kind the planner emits
// (dp, tp, sp, cp, tp x cp, pp, ZeRO 1-3, recompute), `meshflow plan --out`
// then `meshflow explain` shows the collectives of that plan (and no other
// layout), and `meshflow train` runs it. Where the planner prices the same
// collectives the partitioner inserts (data parallel, Megatron tp, ZeRO), the
// bytes per rank per step agree within 10%.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <regex>
#include <string>

#include "cli_run.h"
#include "meshflow/config/json_reader.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::run_cli;
using testing::source_dir;

struct Case {
  const char* fix;         // --fix
  const char* mode;        // written parallel.mode
  const char* preset;      // written parallel.preset ("" none)
  const char* collective;  // a line explain must show ("" none)
  // The planner's bytes per mesh axis = explain's (within 10%). With cp the
  // totals are compared: the planner counts the gradients' reduction over the
  // dp * cp replicas as data-parallel traffic, explain per axis (dp and cp).
  bool bytes_match;
};

// Per-axis bytes per rank per step from explain's "by mesh axis" line.
std::map<std::string, double> axis_bytes(const std::string& explain) {
  std::map<std::string, double> out;
  const std::regex re("(\\w+) [0-9.]+ [KMG]?i?B \\(([0-9]+) B\\)");
  const size_t at = explain.find("by mesh axis:");
  if (at == std::string::npos) return out;
  const std::string line = explain.substr(at, explain.find('\n', at) - at);
  for (std::sregex_iterator it(line.begin(), line.end(), re), end; it != end; ++it)
    out[(*it)[1]] = std::stod((*it)[2]);
  return out;
}

TEST(PlanRoundTrip, EveryPlanKindRunsAsPriced) {
  const fs::path dir = fs::temp_directory_path() / ("meshflow_rt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string out = (dir / "plan.json").string();
  const std::string model = source_dir() + "/configs/models/gpt_bytes_small.json";
  const std::string cluster = source_dir() + "/configs/clusters/local_cpu.json";
  const Case cases[] = {
      {"tp=1,pp=1,cp=1,zero=0,recompute=none", "data", "", "", true},
      {"tp=2,sp=false,ops=false,pp=1,cp=1,zero=0", "semi", "megatron",
       "fwd       all_reduce      over tp", true},
      {"tp=2,sp=true,pp=1,cp=1,zero=0", "semi", "megatron-sp", "fwd       reduce_scatter  over tp",
       true},
      {"tp=1,cp=2,ops=false,ring=false,pp=1,zero=0", "semi", "ulysses",
       "fwd       all_to_all      over cp", true},
      {"tp=2,sp=false,ops=false,cp=2,pp=1,zero=0", "semi", "megatron",
       "fwd       all_to_all      over cp", true},
      {"tp=1,pp=2,cp=1,zero=0", "data", "", "", false},
      {"tp=1,pp=1,cp=1,zero=1", "semi", "dp", "opt       all_gather      over dp", true},
      {"tp=1,pp=1,cp=1,zero=1,zero_style=group", "semi", "dp", "opt       broadcast       over dp",
       true},
      {"tp=1,pp=1,cp=1,zero=2", "semi", "dp", "bwd       reduce_scatter  over dp", false},
      {"tp=1,pp=1,cp=1,zero=3", "semi", "dp", "fwd       all_gather      over dp", true},
      {"tp=1,pp=1,cp=1,zero=0,recompute=full", "data", "", "", true},
      // The strategy search's plan: split tuples, no preset.
      {"tp=2,ops=true,pp=1,cp=1,zero=0", "semi", "", "", true},
      // ... and on cp (its attention as a ring, the sequence in zigzag order).
      {"tp=1,ops=true,pp=1,cp=2,zero=0", "semi", "", "", true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fix);
    CliRun r =
        run_cli("plan " + model + " --cluster " + cluster +
                " --gpus 4 --global-batch 8 --seq 64 --top 0 --fix " + c.fix + " --out " + out);
    ASSERT_EQ(r.code, 0) << r.output;
    const json f = value_or_throw(read_json_file(out));
    const json& par = f["parallel"];
    const json& pred = f["plan"]["prediction"];
    EXPECT_EQ(par["mode"], c.mode) << par.dump();
    EXPECT_EQ(par.value("preset", std::string()), c.preset) << par.dump();
    EXPECT_EQ(par.value("recompute", std::string()), pred["recompute"].get<std::string>());
    EXPECT_EQ(par.value("zero", 0), pred["zero"].get<int>());
    const int pp = pred["degrees"]["pp"];
    EXPECT_EQ(par.contains("pipeline"), pp > 1) << par.dump();

    CliRun e = run_cli("explain " + out + " --no-nodes");
    ASSERT_EQ(e.code, 0) << e.output;
    EXPECT_NE(e.output.find("job: 4 rank(s)"), std::string::npos) << e.output;
    if (pp > 1) {
      EXPECT_NE(e.output.find("pipeline " + std::to_string(pp) + " stages"), std::string::npos)
          << e.output;
    }
    if (*c.collective) {
      EXPECT_NE(e.output.find(c.collective), std::string::npos) << e.output;
    }
    // Every mesh axis of the plan carries traffic (nothing silently replicated).
    const std::map<std::string, double> bytes = axis_bytes(e.output);
    const std::pair<const char*, const char*> kinds[] = {
        {"dp", "data_parallel"}, {"tp", "tensor_parallel"}, {"cp", "context_parallel"}};
    const bool by_total = pred["degrees"]["cp"].get<int>() > 1;
    if (c.bytes_match && by_total) {
      double total = 0;
      for (const auto& [axis, b] : bytes) total += b;
      const json& priced = pred["comm_bytes_per_step"];
      const double sum = double(priced["tensor_parallel"]) + double(priced["context_parallel"]) +
                         double(priced["data_parallel"]);
      EXPECT_NEAR(total / sum, 1.0, 0.10) << "total: explain " << total << " B, planner " << sum;
    }
    for (const auto& [axis, kind] : kinds) {
      const int degree = pred["degrees"][axis];
      if (degree <= 1) continue;
      ASSERT_TRUE(bytes.count(axis)) << axis << "\n" << e.output;
      if (c.bytes_match && !by_total) {
        const double priced = pred["comm_bytes_per_step"][kind];
        EXPECT_NEAR(bytes.at(axis) / priced, 1.0, 0.10)
            << axis << ": explain " << bytes.at(axis) << " B, planner " << priced << " B";
      }
    }
    CliRun t = run_cli("train " + out + " --ranks 4 --steps 1 --quiet");
    EXPECT_EQ(t.code, 0) << t.output;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshflow
