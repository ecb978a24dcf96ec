// `meshflow train` with a pipeline, with --trace, and on a `meshflow plan
// --out` file, as a user runs them: the real binary (MESHFLOW_BIN, set by
// CMake). Checks exit codes, the progress/metrics output, the merged Chrome
// trace (valid JSON, the expected span names per rank) and that a pipeline
// run's losses match the one-device run with the same micro-batches.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_run.h"
#include "temp_dir_test.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using meshflow::testing::CliRun;
CliRun run(const std::string& args) {
  return meshflow::testing::run_cli(args);
}

using meshflow::testing::source_dir;

class PipelineCli : public meshflow::testing::TempDirTest {
 protected:
  std::string write(const json& j, const std::string& name = "run.json") {
    std::ofstream(path(name)) << j.dump(2);
    return path(name);
  }

  // A 4-layer GPT (untied embeddings: one stage holds each), 3 steps.
  static json gpt_run() {
    return {{"model",
             {{"model_type", "gpt2"},
              {"n_layer", 4},
              {"n_embd", 32},
              {"n_head", 2},
              {"n_positions", 16},
              {"vocab_size", 256},
              {"tie_word_embeddings", false}}},
            {"data", {{"dataset", "fortunes"}}},
            {"train",
             {{"steps", 3},
              {"batch_size", 8},
              {"seq_len", 16},
              {"threads", 1},
              {"eval_batches", 1},
              {"log_every", 1}}},
            {"optimizer", {{"type", "adamw"}, {"lr", 1e-3}, {"grad_clip", 1.0}}}};
  }
  static json pipeline(int stages, const std::string& schedule, int micro_batches) {
    return {{"stages", stages}, {"schedule", schedule}, {"micro_batches", micro_batches}};
  }
};

std::vector<json> read_lines(const std::string& p) {
  std::vector<json> out;
  std::ifstream f(p);
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

std::vector<double> losses(const std::string& metrics) {
  std::vector<double> out;
  for (const json& j : read_lines(metrics))
    if (j.contains("loss") && !j.contains("eval")) out.push_back(j["loss"].get<double>());
  return out;
}

// Span names ("ph": "X") of a trace file, and the pids they are on.
struct TraceSpans {
  std::vector<std::string> names;
  std::set<int> pids;
  bool has_prefix(const std::string& prefix) const {
    for (const std::string& n : names)
      if (n.rfind(prefix, 0) == 0) return true;
    return false;
  }
};

TraceSpans read_trace(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  json doc = json::parse(ss.str());  // throws (fails the test) on invalid JSON
  TraceSpans t;
  EXPECT_TRUE(doc.contains("traceEvents"));
  for (const json& e : doc["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    t.names.push_back(e["name"].get<std::string>());
    t.pids.insert(e["pid"].get<int>());
  }
  return t;
}

TEST_F(PipelineCli, TrainsTwoStagesTimesTwoReplicasWithTraceEvalAndCheckpoint) {
  json j = gpt_run();
  j["parallel"] = {{"mesh", "dp=2"}, {"pipeline", pipeline(2, "1f1b", 2)}};
  const std::string cfg = write(j);
  CliRun r = run("train " + cfg + " --ranks 4 --trace " + path("trace.json") + " --metrics " +
                 path("m.jsonl") + " --checkpoint " + path("w.safetensors"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("pipeline 2 stages x mesh {dp: 2}, 1f1b"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tok/s"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(path("w.safetensors")));
  std::vector<json> lines = read_lines(path("m.jsonl"));
  ASSERT_EQ(lines.size(), 4u);  // 3 steps + the final eval
  EXPECT_TRUE(lines.back().contains("eval"));
  EXPECT_GT(lines.back()["eval"]["loss"].get<double>(), 0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_GT(lines[i]["tokens_per_s"].get<double>(), 0);
    EXPECT_GT(lines[i]["peak_bytes"].get<double>(), 0);
  }

  TraceSpans t = read_trace(path("trace.json"));
  EXPECT_EQ(t.pids, (std::set<int>{0, 1, 2, 3}));
  for (const char* s :
       {"F mb=0 c=0", "F mb=1 c=1", "B mb=0 c=1", "B mb=1 c=0", "recv_act mb=0", "recv_grad mb=1",
        "send_act mb=0", "send_grad mb=1", "grad sync", "optimizer"})
    EXPECT_TRUE(t.has_prefix(s)) << s;

  // The weights continue from the checkpoint (--init), through the pipeline.
  r = run("train " + cfg + " --ranks 4 --steps 1 --init " + path("w.safetensors"));
  EXPECT_EQ(r.code, 0) << r.output;
}

// Same micro-batches, same losses: 2 stages x 2 replicas (m = 2) against one
// rank with train.micro_batches = 2; zb-h1 with recompute on 2 stages; and
// zb-v (its 2 chunks per stage by default: 4 chunks of one layer).
TEST_F(PipelineCli, LossesMatchOneRank) {
  json one = gpt_run();
  one["train"]["micro_batches"] = 2;
  ASSERT_EQ(run("train " + write(one, "one.json") + " --metrics " + path("one.jsonl")).code, 0);
  json pipe = gpt_run();
  pipe["parallel"] = {{"mesh", "dp=2"}, {"pipeline", pipeline(2, "1f1b", 2)}};
  CliRun r = run("train " + write(pipe, "pipe.json") + " --ranks 4 --metrics " + path("p.jsonl"));
  ASSERT_EQ(r.code, 0) << r.output;
  json zb = gpt_run();
  zb["train"]["micro_batches"] = 2;
  zb["parallel"] = {{"pipeline", pipeline(2, "zb-h1", 2)}, {"recompute", "full"}};
  r = run("train " + write(zb, "zb.json") + " --ranks 2 --metrics " + path("zb.jsonl"));
  ASSERT_EQ(r.code, 0) << r.output;
  json zbv = gpt_run();
  zbv["parallel"] = {{"pipeline", pipeline(2, "zb-v", 2)}};
  r = run("train " + write(zbv, "zbv.json") + " --ranks 2 --metrics " + path("zbv.jsonl"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("zb-v"), std::string::npos) << r.output;
  const std::vector<double> a = losses(path("one.jsonl")), b = losses(path("p.jsonl")),
                            c = losses(path("zb.jsonl")), v = losses(path("zbv.jsonl"));
  ASSERT_EQ(v.size(), 3u);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  ASSERT_EQ(c.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], 1e-4 * std::abs(a[i])) << "step " << i + 1;
    EXPECT_NEAR(a[i], c[i], 1e-4 * std::abs(a[i])) << "step " << i + 1;
    EXPECT_NEAR(a[i], v[i], 1e-4 * std::abs(a[i])) << "step " << i + 1;
  }
}

TEST_F(PipelineCli, DataParallelTraceHasForwardBackwardOptimizerPerMicroBatch) {
  json j = gpt_run();
  j["train"]["micro_batches"] = 2;
  CliRun r = run("train " + write(j) + " --ranks 2 --steps 1 --trace " + path("t.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  TraceSpans t = read_trace(path("t.json"));
  EXPECT_EQ(t.pids, (std::set<int>{0, 1}));
  for (const char* s : {"forward mb=0", "backward mb=0", "forward mb=1", "backward mb=1",
                        "gradient all-reduce (wait)", "optimizer"})
    EXPECT_TRUE(t.has_prefix(s)) << s;
}

TEST_F(PipelineCli, PartitionedTraceHasOneSpanPerCollective) {
  json j = gpt_run();
  j["parallel"] = {{"mode", "semi"}, {"mesh", "dp=2"}, {"preset", "dp"}};
  CliRun r = run("train " + write(j) + " --ranks 2 --steps 1 --trace " + path("t.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  TraceSpans t = read_trace(path("t.json"));
  EXPECT_TRUE(t.has_prefix("forward mb=0")) << r.output;
  EXPECT_TRUE(t.has_prefix("all_reduce ")) << "no collective span";
}

// Pipeline x tensor parallel: each stage the Megatron program on its tp=2
// sub-mesh (4 ranks), with evaluation and a checkpoint that --init reads back.
TEST_F(PipelineCli, PipelineTimesMegatronTrains) {
  json j = gpt_run();
  j["parallel"] = {{"mode", "semi"},
                   {"mesh", "dp=1,tp=2"},
                   {"preset", "megatron"},
                   {"pipeline", pipeline(2, "1f1b", 2)}};
  const std::string cfg = write(j);
  CliRun r = run("train " + cfg + " --ranks 4 --metrics " + path("m.jsonl") + " --checkpoint " +
                 path("w.safetensors"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("pipeline 2 stages x mesh"), std::string::npos) << r.output;
  EXPECT_EQ(losses(path("m.jsonl")).size(), 3u);
  EXPECT_TRUE(fs::exists(path("w.safetensors")));
  r = run("train " + cfg + " --ranks 4 --steps 1 --init " + path("w.safetensors"));
  EXPECT_EQ(r.code, 0) << r.output;

  json one = gpt_run();
  one["train"]["micro_batches"] = 2;
  ASSERT_EQ(run("train " + write(one, "one.json") + " --metrics " + path("one.jsonl")).code, 0);
  const std::vector<double> a = losses(path("one.jsonl")), b = losses(path("m.jsonl"));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * std::abs(a[i])) << i;
}

TEST_F(PipelineCli, UnsupportedCombinationsAndWrongRankCountsAreUserErrors) {
  json j = gpt_run();
  // Tensor parallel inside the stages needs the partitioner (mode semi).
  j["parallel"] = {{"mesh", "dp=1,tp=2"}, {"pipeline", pipeline(2, "1f1b", 2)}};
  CliRun r = run("train " + write(j) + " --ranks 4");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("tp=2 with parallel.pipeline in mode \"data\""), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("\"mode\": \"semi\""), std::string::npos) << r.output;

  j["parallel"] = {{"mode", "hybrid"}, {"mesh", "tp=2"}, {"pipeline", pipeline(2, "1f1b", 2)}};
  r = run("train " + write(j) + " --ranks 4");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("\"hybrid\" (collectives placed by hand) is built through the C++ API"),
            std::string::npos)
      << r.output;

  j["parallel"] = {{"mode", "semi"},
                   {"mesh", "dp=2,tp=2"},
                   {"preset", "megatron"},
                   {"pipeline", pipeline(2, "1f1b", 2)}};
  r = run("train " + write(j) + " --ranks 4");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("run with --ranks 8"), std::string::npos) << r.output;

  j["parallel"] = {{"mesh", "dp=2"}, {"pipeline", pipeline(2, "1f1b", 2)}};
  r = run("train " + write(j) + " --ranks 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("run with --ranks 4"), std::string::npos) << r.output;

  j["parallel"] = {{"pipeline", pipeline(2, "1f1b", 2)}, {"recompute", "full"}};
  j["train"]["recompute"] = "selective";
  r = run("train " + write(j) + " --ranks 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.recompute"), std::string::npos) << r.output;
}

// `meshflow plan --out` writes a run config `meshflow train` takes.
TEST_F(PipelineCli, PlanFileTrains) {
  const std::string model = source_dir() + "/configs/models/gpt_bytes_small.json";
  const std::string cluster = source_dir() + "/configs/clusters/local_cpu.json";
  CliRun r = run("plan " + model + " --cluster " + cluster +
                 " --gpus 1 --global-batch 2 --seq 32 --out " + path("plan.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  r = run("train " + path("plan.json") + " --steps 1 --set train.eval_batches=1 --threads 1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("step 1/1"), std::string::npos) << r.output;

  // A plan for more devices than the job has: a clear message.
  r = run("plan " + model + " --cluster " + cluster +
          " --gpus 4 --global-batch 8 --seq 32 --fix pp=2,tp=1,zero=0 --out " + path("plan4.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  r = run("train " + path("plan4.json") + " --steps 1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("run with --ranks 4"), std::string::npos) << r.output;
}

// A GPU plan that recomputes the first blocks of each stage (Plan::
// recompute_layers, Megatron's block method) is written as
// parallel.recompute_layers over explicit stages: `meshflow simulate` reads it
// back as the same plan, and `meshflow train` runs those blocks recomputed.
// A list that is not the first blocks of each stage, or without full
// recompute, is refused by name.
TEST_F(PipelineCli, PlanWithSomeBlocksRecomputedTrains) {
  const std::string model = source_dir() + "/configs/models/gpt_bytes_small.json";
  const std::string cluster = source_dir() + "/configs/clusters/dgx_a100_80gb.json";
  CliRun r = run("plan " + model + " --cluster " + cluster +
                 " --gpus 2 --global-batch 4 --seq 32 --fix pp=2,tp=1,dp=1,recompute=full,"
                 "recompute_layers=1,schedule=1f1b,micro_batch=1 --out " +
                 path("partial.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("1f1b full:1 zero0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("full, on the first 1 block(s) of each pipeline chunk"),
            std::string::npos)
      << r.output;
  json plan = json::parse(std::ifstream(path("partial.json")));
  EXPECT_EQ(plan["parallel"]["recompute_layers"], json::array({0, 2})) << plan.dump();
  EXPECT_EQ(plan["parallel"]["pipeline"]["layers_per_stage"], json::array({2, 2}));
  r = run("simulate " + path("partial.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("full:1 zero0"), std::string::npos) << r.output;
  r = run("train " + path("partial.json") + " --ranks 2 --steps 1 --set train.eval_batches=1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("step 1/1"), std::string::npos) << r.output;

  // Each edit of the plan file: `command` on it exits 2 saying `want`.
  auto refused = [&](const std::string& command, const std::string& want) {
    const std::string args = command == "train" ? " --ranks 2 --steps 1" : "";
    const CliRun bad = run(command + " " + write(plan, "other.json") + args);
    EXPECT_EQ(bad.code, 2) << bad.output;
    EXPECT_NE(bad.output.find(want), std::string::npos) << bad.output;
  };
  plan["parallel"]["recompute_layers"] = {0, 1};
  refused("simulate", "the first N blocks of each pipeline chunk");
  plan["parallel"]["recompute"] = "none";
  refused("train", "parallel.recompute_layers recomputes those blocks whole");
  plan["parallel"]["recompute"] = "full";
  plan["parallel"]["recompute_layers"] = "all";
  refused("train", "parallel.recompute_layers must be a list of block numbers");
  plan["parallel"]["recompute_layers"] = {0, -2};
  refused("train", "parallel.recompute_layers must be a list of block numbers >= 0");
  plan["parallel"]["recompute_layers"] = {0, 2};
  plan["train"]["recompute_layers"] = {1};
  refused("train", "parallel.recompute_layers differs from train.recompute_layers");
}

}  // namespace
