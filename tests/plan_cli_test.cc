// `meshflow plan` and `meshflow simulate` as a user runs them (the real
// binary, as tests/cli_test.cc does): the --json keys other tools read, the
// prediction's band, --attention, NVLink islands, --out and the Chrome trace,
// user errors with their answers, and the plans written training as planned.
// (The cost model and the search: tests/plan_search_test.cc.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_run.h"
#include "meshflow/config/json_reader.h"
#include "meshflow/plan/prediction_band.h"
#include "shipped_files.h"
#include "temp_dir_test.h"

namespace meshflow::plan {
namespace {

namespace fs = std::filesystem;

using meshflow::testing::source_dir;

// ---- the binary

using meshflow::testing::CliRun;
CliRun run(const std::string& args) {
  return meshflow::testing::run_cli(args);
}

class PlanCli : public meshflow::testing::TempDirTest {
 protected:
  std::string model(const std::string& f) { return source_dir() + "/configs/models/" + f; }
  std::string dgx() { return source_dir() + "/configs/clusters/dgx_a100_80gb.json"; }
};

TEST_F(PlanCli, JsonKeysOtherToolsRead) {
  CliRun r = run("plan " + model("gpt3_175b.json") + " --cluster " + dgx() +
                 " --gpus 1024 --global-batch 1536 --seq 2048 --top 2 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const json j = json::parse(r.output);
  ASSERT_TRUE(j.contains("search_time_s"));
  ASSERT_EQ(j["plans"].size(), 3u);
  for (const json& p : j["plans"]) {
    for (const char* k : {"dp", "tp", "pp", "cp"}) EXPECT_TRUE(p["degrees"].contains(k)) << k;
    for (const char* k : {"micro_batch", "num_micro_batches", "schedule", "recompute", "zero",
                          "step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu",
                          "memory_bytes_per_device", "comm_bytes_per_step"})
      EXPECT_TRUE(p.contains(k)) << k;
    for (const char* k : {"params", "grads", "optimizer", "activations", "total"})
      EXPECT_TRUE(p["memory_bytes_per_device"].contains(k)) << k;
    EXPECT_EQ(p["degrees"]["dp"].get<int64_t>() * p["degrees"]["tp"].get<int64_t>() *
                  p["degrees"]["pp"].get<int64_t>() * p["degrees"]["cp"].get<int64_t>(),
              1024);
  }
  EXPECT_TRUE(j["plans"][1].contains("why_slower"));
}

// A prediction comes with its band: where published runs on the cluster
// file at that scale fell against their predictions (prediction_bands.json
// beside the cluster file); none, saying why, where there were none.
TEST_F(PlanCli, PredictionBandFromThePublishedRunsSpread) {
  const PredictionBands shipped = value_or_throw(
      load_prediction_bands(source_dir() + "/configs/clusters/prediction_bands.json"));
  const BandEntry* e = find_band(shipped, "dgx_a100_80gb", 1024);
  ASSERT_NE(e, nullptr);
  CliRun r = run("plan " + model("gpt3_175b.json") + " --cluster " + dgx() +
                 " --gpus 1024 --top 0 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const json j = json::parse(r.output);
  const double step = j["plans"][0]["step_time_s"];
  EXPECT_DOUBLE_EQ(j["plans"][0]["band_s"]["low"].get<double>(), e->lo * step);
  EXPECT_DOUBLE_EQ(j["plans"][0]["band_s"]["high"].get<double>(), e->hi * step);
  EXPECT_EQ(j["plans"][0]["band_s"]["runs"], e->runs);
  r = run("plan " + model("gpt3_175b.json") + " --cluster " + dgx() + " --gpus 1024 --top 0");
  EXPECT_NE(r.output.find("  band            "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("of " + std::to_string(e->runs) + " runs on dgx_a100_80gb at 257-1024"),
            std::string::npos)
      << r.output;
  // A cluster file with no band file beside it, and a broken band file.
  const std::string dir = (dir_ / "clusters").string();
  fs::create_directories(dir);
  fs::copy_file(dgx(), dir + "/dgx_a100_80gb.json");
  r = run("plan " + model("gpt3_175b.json") + " --cluster " + dir +
          "/dgx_a100_80gb.json --gpus 1024 --top 0");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("band            none: no " + dir + "/prediction_bands.json"),
            std::string::npos)
      << r.output;
  std::ofstream(dir + "/prediction_bands.json") << R"({"clusters": {"x": [{"lo": 2, "hi": 1}]}})";
  r = run("plan " + model("gpt3_175b.json") + " --cluster " + dir +
          "/dgx_a100_80gb.json --gpus 1024 --top 0");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("prediction_bands.json.clusters.x[]"), std::string::npos) << r.output;
  // A ResNet has no band: the published runs are all transformer LMs.
  r = run("plan " + model("resnet50.json") + " --cluster " + dgx() +
          " --gpus 8 --global-batch 256 --top 0 --json");
  ASSERT_EQ(r.code, 0) << r.output;
  const json cnn = json::parse(r.output);
  EXPECT_FALSE(cnn["plans"][0].contains("band_s")) << r.output;
  EXPECT_NE(cnn["plans"][0]["band_none"].get<std::string>().find("none is a resnet"),
            std::string::npos)
      << r.output;
  r = run("plan " + model("resnet50.json") + " --cluster " + dgx() +
          " --gpus 8 --global-batch 256 --top 0");
  EXPECT_NE(r.output.find("band            none: the published runs that set the bands are "
                          "transformer language models"),
            std::string::npos)
      << r.output;
}

// --attention names the stack's kernel: flash1 (listed by the cluster file)
// plans slower than fused (FlashAttention-2) at a long sequence; a kernel the
// file does not list is refused with the valid names.
TEST_F(PlanCli, AttentionKernelOfTheStack) {
  const std::string base = "plan " + model("llama3_8b.json") + " --cluster " + dgx() +
                           " --gpus 8 --seq 8192 --global-batch 16 --top 0 --fix tp=1,pp=1,cp=1"
                           " --json --attention ";
  CliRun fa2 = run(base + "fused"), fa1 = run(base + "flash1");
  ASSERT_EQ(fa2.code, 0) << fa2.output;
  ASSERT_EQ(fa1.code, 0) << fa1.output;
  const double t2 = json::parse(fa2.output)["plans"][0]["step_time_s"];
  const double t1 = json::parse(fa1.output)["plans"][0]["step_time_s"];
  EXPECT_GT(t1, 1.1 * t2) << t1 << " vs " << t2;
  // The kernel travels with a plan file: simulate prices it the same way.
  const std::string out = (dir_ / "fa1.json").string();
  CliRun written = run(base + "flash1 --out " + out);
  ASSERT_EQ(written.code, 0) << written.output;
  json f = value_or_throw(read_json_file(out));
  EXPECT_EQ(f["plan"]["attention"], "flash1");
  CliRun sim = run("simulate " + out);
  EXPECT_EQ(sim.code, 0) << sim.output;
  for (const json& wrong : {json("flash9"), json(5)}) {
    f["plan"]["attention"] = wrong;
    std::ofstream(out) << f.dump(2);
    CliRun r = run("simulate " + out);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("plan.attention must be"), std::string::npos) << r.output;
  }
  CliRun bad = run(base + "flash9");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--attention must be materialized or a fused kernel (fused, flash2, "
                            "flash1: the cluster file's device.attention_efficiency), got "
                            "'flash9'"),
            std::string::npos)
      << bad.output;
}

// A node of NVLink-bridged pairs (cluster "islands"): tensor parallelism
// inside a pair prices as on one NVLink fabric, across pairs over PCIe; the
// plan file carries the islands, so simulate prices the same.
TEST_F(PlanCli, NvlinkIslandsPriceTheGroupsThatCrossThem) {
  json c = value_or_throw(read_json_file(dgx()));
  c["islands"] = {{"devices", 2}, {"link", {{"bandwidth_bytes_per_s", 24e9}}}};
  const std::string pairs = (dir_ / "pairs.json").string();
  std::ofstream(pairs) << c.dump(2);
  auto step = [&](const std::string& cluster, const std::string& tp, std::string* text,
                  const std::string& gpus = "8") {
    CliRun r = run("plan " + model("llama3_8b.json") + " --cluster " + cluster + " --gpus " + gpus +
                   " --seq 8192 --global-batch 16 --top 0 --fix pp=1,cp=1,tp=" + tp +
                   (text ? "" : " --json"));
    EXPECT_EQ(r.code, 0) << r.output;
    if (text) {
      *text = r.output;
      return 0.0;
    }
    return r.code == 0 ? json::parse(r.output)["plans"][0]["step_time_s"].get<double>() : 0.0;
  };
  // Two GPUs of a pair: one NVLink island, priced as the fabric.
  EXPECT_DOUBLE_EQ(step(pairs, "2", nullptr, "2"), step(dgx(), "2", nullptr, "2"));
  // Eight: tp=2 keeps its all_reduces on the bridges, its gradients' ring
  // over dp=4 crosses the pairs; tp=8 crosses them with every all_reduce.
  const double tp2 = step(pairs, "2", nullptr), tp2_fabric = step(dgx(), "2", nullptr);
  const double crossing = step(pairs, "8", nullptr), fabric = step(dgx(), "8", nullptr);
  EXPECT_GT(tp2, tp2_fabric);
  EXPECT_GT(crossing, 1.05 * fabric) << crossing << " vs " << fabric;
  EXPECT_GT(crossing / fabric, tp2 / tp2_fabric);
  std::string text;
  step(pairs, "8", &text);
  EXPECT_NE(text.find("(1 nodes x 8; NVLink islands of 2, 24 GB/s a GPU between them)"),
            std::string::npos)
      << text;
  // simulate prices each plan file on its own cluster, islands included.
  auto simulated = [&](const std::string& cluster, const std::string& name) {
    const std::string out = (dir_ / name).string();
    CliRun w =
        run("plan " + model("llama3_8b.json") + " --cluster " + cluster +
            " --gpus 8 --seq 8192 --global-batch 16 --top 0 --fix pp=1,cp=1,tp=8 --out " + out);
    EXPECT_EQ(w.code, 0) << w.output;
    CliRun sim = run("simulate " + out);
    EXPECT_EQ(sim.code, 0) << sim.output;
    const size_t at = sim.output.find("predicted ");
    EXPECT_NE(at, std::string::npos) << sim.output;
    return std::make_pair(value_or_throw(read_json_file(out)),
                          sim.output.substr(at, sim.output.find(" per step", at) - at));
  };
  const auto [on_pairs, t_pairs] = simulated(pairs, "pairs_plan.json");
  const auto [on_fabric, t_fabric] = simulated(dgx(), "fabric_plan.json");
  EXPECT_EQ(on_pairs["plan"]["cluster"]["islands"]["devices"], 2);
  EXPECT_FALSE(on_fabric["plan"]["cluster"].contains("islands"));
  EXPECT_NE(t_pairs, t_fabric);
}

TEST_F(PlanCli, TextOutOfPlanAndSimulateTrace) {
  const std::string out = (dir_ / "plan.json").string(), trace = (dir_ / "trace.json").string();
  CliRun r = run("plan " + model("llama2_70b.json") + " --cluster " + dgx() +
                 " --gpus 256 --global-batch 512 --seq 4096 --top 2 --out " + out +
                 " --fix pp=8,schedule=1f1b");
  ASSERT_EQ(r.code, 0) << r.output;
  // --top 2: the best plan and 2 runners-up (K does not count the best).
  EXPECT_EQ(r.output.find("runner-up 3"), std::string::npos) << r.output;
  // The stack it assumes without --emit is named, from the constants used.
  for (const char* s : {"best plan:", "runner-up 2 of 2 (rank #3)", "loses by", "memory/device",
                        "MFU", "stack    gradients held in 16-bit", "fused attention (flash2)"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
  Result<json> f = read_json_file(out);
  ASSERT_TRUE(f.is_ok());
  const json& par = (*f)["parallel"];
  // The plan written is the plan priced: sequence parallelism is kept
  // (megatron-sp), and so is ring attention over cp (ring).
  const std::string best = (*f)["description"];
  EXPECT_EQ(par["preset"], best.find("ring") != std::string::npos  ? "ring"
                           : best.find("+sp") != std::string::npos ? "megatron-sp"
                                                                   : "megatron")
      << best;
  EXPECT_EQ(par["pipeline"]["stages"], 8);
  EXPECT_EQ(par["pipeline"]["schedule"], "1f1b");
  for (const char* k : {"mesh", "recompute"}) EXPECT_TRUE(par.contains(k)) << k;
  EXPECT_EQ(par.contains("zero"), best.find("zero0") == std::string::npos) << best;
  r = run("simulate " + out + " --trace " + trace);
  ASSERT_EQ(r.code, 0) << r.output;
  Result<json> t = read_json_file(trace);
  ASSERT_TRUE(t.is_ok());
  const std::string text = t->dump();
  for (const char* s : {"\"stage 7\"", "\"bubble\"", "\"forward\"", "\"send\"", "optimizer"})
    EXPECT_NE(text.find(s), std::string::npos) << s;
  // A plan file whose stage split is not one: each refusal names it and what is valid.
  const std::pair<json, std::string> bad_splits[] = {
      {json("12/12"), "layers_per_stage must be a list of block counts"},
      {json::array({12, 0, 12, 12, 12, 12, 12, 12}), "entries are block counts >= 1"},
      {json::array({12, 12}), "needs one entry per pipeline chunk (pp*vp = 8)"},
      {json::array({1, 1, 1, 1, 1, 1, 1, 1}), "sums to 8, the model has 80 blocks"}};
  for (const auto& [split, want] : bad_splits) {
    json edited = *f;
    edited["parallel"]["pipeline"]["layers_per_stage"] = split;
    std::ofstream(out) << edited.dump(2);
    r = run("simulate " + out);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  }
}

TEST_F(PlanCli, UserErrorsExit2WithAnAnswer) {
  CliRun r = run("plan " + model("gpt3_175b.json") + " --cluster " + dgx() + " --gpus 8");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("does not fit on 8 devices"), std::string::npos) << r.output;
  r = run("plan " + model("gpt3_1.3b.json") + " --cluster " + dgx() + " --gpus 12");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("do not fill whole nodes"), std::string::npos) << r.output;
  r = run("plan " + model("gpt3_1.3b.json") + " --cluster " + dgx() + " --gpus 8 --fix tq=2");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("unknown key 'tq'"), std::string::npos) << r.output;
  r = run("plan " + model("gpt3_1.3b.json") + " --cluster " + dgx() + " --gpus 8 --seq 9000");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("seq=9000"), std::string::npos) << r.output;
  r = run("plan " + model("gpt3_1.3b.json") + " --cluster " + dgx() + " --gpus 8 --threads -1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("--threads: Value -1 not in range 0 to 256"), std::string::npos)
      << r.output;
  r = run("simulate " + model("gpt3_1.3b.json"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("plan file"), std::string::npos) << r.output;
  // The MLP: no sequence, no blocks to pipeline; the answer says so.
  r = run("plan " + model("mlp_fashion.json") + " --cluster " + dgx() + " --gpus 4 --seq 128");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("an mlp has no sequence"), std::string::npos) << r.output;
  r = run("plan " + model("resnet50.json") + " --cluster " + dgx() + " --gpus 4 --seq 128");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("a resnet has no sequence"), std::string::npos) << r.output;
  r = run("plan " + model("resnet50.json") + " --cluster " + dgx() + " --gpus 4 --attention cudnn");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("is a resnet, which has no attention; plan it without --attention"),
            std::string::npos)
      << r.output;
  r = run("plan " + model("mlp_fashion.json") + " --cluster " + dgx() + " --gpus 4 --fix pp=2");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("no transformer blocks"), std::string::npos) << r.output;
  r = run("plan " + model("mlp_fashion.json") + " --cluster " + dgx() + " --gpus 3 --fix tp=3");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("hidden"), std::string::npos) << r.output;
}

// --optimizer: SGD keeps one f32 state per parameter where AdamW keeps two,
// so the same plan holds a third less optimizer state under mixed precision
// (4 + 4 against 4 + 8 bytes with the master weight) and streams 8 bytes
// less per parameter in the update. The plan file names it; simulate
// prices what it names, and refuses another optimizer by name.
TEST_F(PlanCli, OptimizerSetsTheModelStates) {
  auto best = [&](const std::string& opt, const std::string& out) {
    CliRun r = run("plan " + model("gpt3_1.3b.json") + " --cluster " + dgx() +
                   " --gpus 8 --global-batch 64 --fix dp=8,tp=1,pp=1,zero=0 --top 0 --json" +
                   " --optimizer " + opt + (out.empty() ? "" : " --out " + out));
    EXPECT_EQ(r.code, 0) << r.output;
    const json j = json::parse(r.output);
    EXPECT_EQ(j["optimizer"], opt);
    return j["plans"][0];
  };
  const std::string file = (dir_ / "sgd.json").string();
  const json adamw = best("adamw", ""), sgd = best("sgd", file);
  const double a = adamw["memory_bytes_per_device"]["optimizer"].get<double>();
  const double b = sgd["memory_bytes_per_device"]["optimizer"].get<double>();
  EXPECT_NEAR(b / a, 8.0 / 12.0, 1e-9);
  EXPECT_LT(sgd["step_time_s"].get<double>(), adamw["step_time_s"].get<double>());
  json f = value_or_throw(read_json_file(file));
  EXPECT_EQ(f["optimizer"]["type"], "sgd");
  CliRun r = run("simulate " + file);
  ASSERT_EQ(r.code, 0) << r.output;
  f["optimizer"]["type"] = "lamb";
  std::ofstream(file) << f.dump();
  r = run("simulate " + file);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("optimizer.type must be one of \"adamw\", \"sgd\", got \"lamb\""),
            std::string::npos)
      << r.output;
  r = run("plan " + model("gpt3_1.3b.json") + " --cluster " + dgx() + " --gpus 8 --optimizer lamb");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--optimizer: lamb not in {adamw,sgd}"), std::string::npos) << r.output;
}

TEST_F(PlanCli, MlpPlanWrittenTrainsAsPlanned) {
  // `meshflow plan` on the MLP config, its --out written and trained: the
  // rules it writes are the ones the planner partitioned its program with.
  const std::string out = path("mlp_plan.json");
  CliRun r = run("plan " + model("mlp_fashion.json") + " --cluster " + source_dir() +
                 "/configs/clusters/local_cpu.json --gpus 4 --global-batch 64 --top 0 " +
                 "--fix tp=2,ops=false --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("examples/s"), std::string::npos) << r.output;
  const json f = value_or_throw(read_json_file(out));
  EXPECT_EQ(f["data"]["dataset"], "fashion_mnist");
  EXPECT_EQ(f["parallel"]["rules"]["hidden"], "tp") << f["parallel"].dump();
  CliRun t = run("train " + out + " --ranks 4 --steps 2 --quiet");
  EXPECT_EQ(t.code, 0) << t.output;
}

TEST_F(PlanCli, ResNetPipelinePlanWrittenTrainsAsPlanned) {
  // A ResNet's residual layers on two pipeline stages, written and trained:
  // the runtime splits the program as the planner priced it (balanced chunks).
  const std::string out = path("resnet_pp.json");
  CliRun r = run("plan " + model("resnet_fashion.json") + " --cluster " + source_dir() +
                 "/configs/clusters/local_cpu.json --gpus 4 --global-batch 32 --top 0 " +
                 "--fix pp=2,tp=2,schedule=1f1b --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("pp=2"), std::string::npos) << r.output;
  const json f = value_or_throw(read_json_file(out));
  EXPECT_EQ(f["parallel"]["pipeline"]["stages"], 2) << f["parallel"].dump();
  EXPECT_EQ(f["parallel"]["rules"]["mid"], "tp") << f["parallel"].dump();
  CliRun t = run("train " + out + " --ranks 4 --steps 2 --quiet");
  EXPECT_EQ(t.code, 0) << t.output;
  // `simulate` prices the file (a model without a sequence needs no
  // train.seq_len), and the user's own stage assignment by cell
  // (MindSpore's cell.pipeline_stage) as the blocks it puts on each stage.
  auto predicted = [&](const json& pipeline) {
    json edited = f;
    edited["parallel"]["pipeline"] = pipeline;
    std::ofstream(out) << edited.dump(2);
    return run("simulate " + out);
  };
  json by_blocks = f["parallel"]["pipeline"], by_cells = by_blocks;
  by_blocks.erase("stage_of");
  by_blocks["layers_per_stage"] = {2, 1};
  by_cells.erase("layers_per_stage");
  by_cells["stage_of"] = {{"embedder", 0},         {"encoder.stages.0", 0}, {"encoder.stages.1", 0},
                          {"encoder.stages.2", 1}, {"pooler", 1},           {"classifier", 1}};
  const CliRun blocks = predicted(by_blocks), cells = predicted(by_cells);
  ASSERT_EQ(blocks.code, 0) << blocks.output;
  ASSERT_EQ(cells.code, 0) << cells.output;
  EXPECT_NE(cells.output.find("stages=2/1"), std::string::npos) << cells.output;
  EXPECT_EQ(cells.output, blocks.output);
  json many = f;  // more stages than cells to place
  many["parallel"]["mesh"] = "dp=1,tp=2,pp=1000";
  many["parallel"]["pipeline"] = by_cells;
  many["parallel"]["pipeline"]["stages"] = 1000;
  std::ofstream(out) << many.dump(2);
  const CliRun huge = run("simulate " + out);
  EXPECT_EQ(huge.code, 2) << huge.output;
  EXPECT_NE(huge.output.find("cells to place"), std::string::npos) << huge.output;
  by_cells["stage_of"]["encoder.stages.0"] = 1;  // stage 1, then 0: backwards
  const CliRun back = predicted(by_cells);
  EXPECT_EQ(back.code, 2) << back.output;
  EXPECT_NE(back.output.find("stages follow the model's order"), std::string::npos) << back.output;
}

TEST_F(PlanCli, ResNetHeightPlanWrittenTrainsAsPlanned) {
  // A ResNet plan splitting the images' height over cp, written and trained:
  // the split tuple it writes is the one its program was priced with.
  const std::string out = path("resnet_plan.json");
  CliRun r = run("plan " + model("resnet_fashion.json") + " --cluster " + source_dir() +
                 "/configs/clusters/local_cpu.json --gpus 2 --global-batch 32 --top 0 " +
                 "--fix cp=2 --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  const json f = value_or_throw(read_json_file(out));
  EXPECT_EQ(f["parallel"]["mode"], "auto") << f["parallel"].dump();
  EXPECT_EQ(f["parallel"]["strategies"]["embedder.embedder.convolution"],
            "((dp,1,cp,1),(1,1,1,1))");
  CliRun t = run("train " + out + " --ranks 2 --steps 2 --quiet");
  EXPECT_EQ(t.code, 0) << t.output;
  CliRun e = run("explain " + out + " --ranks 2 --no-nodes");
  EXPECT_NE(e.output.find("neighbor_exchange over cp"), std::string::npos) << e.output;
}

}  // namespace
}  // namespace meshflow::plan
