// Cells by name (models/cells.h): the seed's `cell.pipeline_stage = k` as
// parallel.pipeline.stage_of and `cell.recompute()` as train.recompute_layers
// names, resolved against the model's cells; the runs they give equal one
// device, and every mistake is one line naming the cell and what is valid.
#include "meshflow/models/cells.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "cli_run.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/config/json_reader.h"
#include "meshflow/engine/job.h"
#include "meshflow/io/safetensors.h"
#include "meshflow/models/from_config.h"
#include "meshflow/runtime/run_config.h"
#include "temp_dir_test.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::run_cli;
using testing::source_dir;
using StageOf = std::vector<std::pair<std::string, int64_t>>;

std::vector<ModelCell> cells_of(const std::string& model_file) {
  std::ifstream f(source_dir() + "/configs/models/" + model_file);
  Result<ModelConfig> cfg = parse_model_config(json::parse(f));
  EXPECT_TRUE(cfg.is_ok()) << cfg.status().message();
  Result<ModelGraph> m = build_model(*cfg, 1, 1);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  return m->cells;
}

// The seed's ResNet-50 split, in Hugging Face's names: head, layer1, layer2 on
// stage 0; layer3, layer4, fc on stage 1 (depths 3, 4, 6, 3).
const StageOf kSeedStages = {{"embedder", 0},         {"encoder.stages.0", 0},
                             {"encoder.stages.1", 0}, {"encoder.stages.2", 1},
                             {"encoder.stages.3", 1}, {"pooler", 1},
                             {"classifier", 1}};

TEST(Cells, ModelsNameTheirCellsInForwardOrder) {
  const std::vector<ModelCell> r = cells_of("resnet50.json");
  ASSERT_EQ(r.size(), 3u + 16u);
  EXPECT_EQ(r.front().name, "embedder");
  EXPECT_EQ(r.front().block, -1);
  EXPECT_EQ(r[1].name, "encoder.stages.0.layers.0");
  EXPECT_EQ(r[1].block, 0);
  EXPECT_EQ(r[16].name, "encoder.stages.3.layers.2");
  EXPECT_EQ(r[16].block, 15);
  EXPECT_EQ(r.back().name, "classifier");
  const std::vector<ModelCell> g = cells_of("gpt_bytes_small.json");
  EXPECT_EQ(g.front().name, "wte");
  EXPECT_EQ(g[2].name, "h.0");
  EXPECT_EQ(g.back().name, "lm_head");
  const std::vector<ModelCell> l = cells_of("llama_bytes_small.json");
  EXPECT_EQ(l.front().name, "model.embed_tokens");
  EXPECT_EQ(l[1].name, "model.layers.0");
}

TEST(Cells, TheSeedsStagesGiveBlocksPerStage) {
  Result<std::vector<int64_t>> per = blocks_per_stage(cells_of("resnet50.json"), kSeedStages, 2);
  ASSERT_TRUE(per.is_ok()) << per.status().message();
  EXPECT_EQ(*per, (std::vector<int64_t>{7, 9}));
  // Globs and prefixes; the name of the smaller cell wins, then fewer wildcards.
  per = blocks_per_stage(cells_of("resnet50.json"),
                         {{"embedder", 0},
                          {"encoder.*", 0},
                          {"encoder.stages.3", 1},
                          {"encoder.stages.2.layers.5", 1},
                          {"pooler", 1},
                          {"classifier", 1}},
                         2);
  ASSERT_TRUE(per.is_ok()) << per.status().message();
  EXPECT_EQ(*per, (std::vector<int64_t>{12, 4}));
  per =
      blocks_per_stage(cells_of("resnet50.json"),
                       {{"*", 0}, {"encoder.stages.3.*", 1}, {"pooler", 1}, {"classifier", 1}}, 2);
  ASSERT_TRUE(per.is_ok()) << per.status().message();
  EXPECT_EQ(*per, (std::vector<int64_t>{13, 3}));
  per = blocks_per_stage(
      cells_of("gpt_bytes_small.json"),
      {{"wte", 0}, {"wpe", 0}, {"h.0", 0}, {"h.*", 1}, {"ln_f", 1}, {"lm_head", 1}}, 2);
  ASSERT_TRUE(per.is_ok()) << per.status().message();
  EXPECT_EQ((*per)[0], 1);
}

void expect_error(const Result<std::vector<int64_t>>& r, const std::string& want) {
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos) << r.status().message();
}

TEST(Cells, MistakesNameTheCellAndWhatIsValid) {
  const std::vector<ModelCell> c = cells_of("resnet50.json");
  StageOf s = kSeedStages;
  s.emplace_back("layer4", 1);  // torchvision's name, not this model's
  expect_error(blocks_per_stage(c, s, 2),
               "names 'layer4', which is no cell of the model; the cells are embedder, "
               "encoder.stages.0.layers.0");
  s = kSeedStages;
  s.emplace_back("encoder.stages.3.layers.0.layer.1", 1);
  expect_error(blocks_per_stage(c, s, 2), "a part inside the cell 'encoder.stages.3.layers.0'");
  s = kSeedStages;
  s.erase(s.begin() + 3);  // encoder.stages.2
  expect_error(blocks_per_stage(c, s, 2),
               "leaves the cell 'encoder.stages.2.layers.0' without a stage");
  s = kSeedStages;
  s[1].second = 1;  // stage 0 of the encoder on 1, stage 1 on 0
  expect_error(blocks_per_stage(c, s, 2),
               "puts 'encoder.stages.1.layers.0' on stage 0 after 'encoder.stages.0.layers.2' on "
               "stage 1; stages follow the model's order");
  s = kSeedStages;
  s[0].second = 1;
  s[1].second = 1;
  s[2].second = 1;
  expect_error(blocks_per_stage(c, s, 2), "gives stage 0 no block");
  s = kSeedStages;
  s[4].second = 2;
  expect_error(blocks_per_stage(c, s, 2), "is 2; stages are 0 to 1");
  s = {{"embedder", 0}, {"encoder.stages.?", 0}, {"encoder.stages.*", 1}, {"classifier", 1}};
  expect_error(blocks_per_stage(c, s, 2), "gives the cell 'encoder.stages.0.layers.0' two stages");
  Result<std::vector<int64_t>> one =
      blocks_per_stage(c, {{"embedder", 1}, {"encoder", 1}, {"pooler", 1}, {"classifier", 1}}, 2);
  expect_error(one, "gives stage 0 no block");
  Result<std::vector<int64_t>> head = blocks_per_stage(c,
                                                       {{"embedder", 0},
                                                        {"encoder.stages.0", 0},
                                                        {"encoder.stages.1", 0},
                                                        {"encoder.stages.2", 0},
                                                        {"encoder.stages.3", 1},
                                                        {"pooler", 2},
                                                        {"classifier", 2}},
                                                       3);
  expect_error(head,
               "puts 'pooler' on stage 2, but it runs after the block "
               "'encoder.stages.3.layers.2' on stage 1");
}

TEST(Cells, RecomputeNamesGiveTheirBlocks) {
  const std::vector<ModelCell> c = cells_of("resnet50.json");
  Result<std::vector<int>> b =
      blocks_named(c, {"encoder.stages.1", "encoder.stages.3.layers.2"}, "k");
  ASSERT_TRUE(b.is_ok()) << b.status().message();
  EXPECT_EQ(*b, (std::vector<int>{3, 4, 5, 6, 15}));
  b = blocks_named(c, {"encoder.stages.*", "encoder"}, "k");
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->size(), 16u);
  b = blocks_named(c, {"classifier"}, "train.recompute_layers");
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().message().find("'classifier', which holds no block"), std::string::npos);
  b = blocks_named(c, {"layer1"}, "train.recompute_layers");
  ASSERT_FALSE(b.is_ok());
  EXPECT_NE(b.status().message().find("'layer1', which is no cell"), std::string::npos);
}

// ---- through the CLI, on the Fashion-MNIST ResNet (3 stages of 1 block) ----

class CellsCli : public meshflow::testing::TempDirTest {
 protected:
  std::string config(const json& train_extra, const json& parallel) {
    json j;
    j["model"] = source_dir() + "/configs/models/resnet_fashion.json";
    j["data"] = {{"dataset", "fashion_mnist"}};
    j["train"] = {{"steps", 2}, {"batch_size", 32}, {"log_every", 1}, {"eval_batches", 2}};
    j["train"].update(train_extra);
    j["optimizer"] = {{"type", "sgd"}, {"lr", 0.05}, {"momentum", 0.9}};
    if (!parallel.is_null()) j["parallel"] = parallel;
    const std::string path = (dir_ / ("cfg" + std::to_string(++n_) + ".json")).string();
    std::ofstream(path) << j.dump(2);
    return path;
  }
  struct Run {
    std::vector<double> losses;
    double eval = -1, accuracy = -1, planned_mib = -1;
  };
  Run run(const std::string& cfg, const std::string& extra) {
    const std::string m = (dir_ / ("m" + std::to_string(++n_) + ".jsonl")).string();
    CliRun r = run_cli("train " + cfg + " --metrics " + m + " " + extra);
    EXPECT_EQ(r.code, 0) << r.output;
    Run out;
    std::smatch sm;
    if (std::regex_search(r.output, sm, std::regex("memory planned ([0-9.]+) (KiB|MiB)")))
      out.planned_mib = std::stod(sm[1]) / (sm[2] == "KiB" ? 1024 : 1);
    std::ifstream f(m);
    for (std::string line; std::getline(f, line);) {
      const json j = json::parse(line);
      if (j.contains("eval")) {
        out.eval = j["eval"]["loss"].get<double>();
        out.accuracy = j["eval"].value("accuracy", -1.0);
      }
      if (j.contains("loss") && !j.contains("eval")) out.losses.push_back(j["loss"].get<double>());
    }
    return out;
  }
  static json pipeline(const std::string& schedule) {
    return {{"pipeline",
             {{"stages", 2},
              {"micro_batches", 4},
              {"schedule", schedule},
              {"stage_of",
               {{"embedder", 0},
                {"encoder.stages.0", 0},
                {"encoder.stages.1", 1},
                {"encoder.stages.2", 1},
                {"pooler", 1},
                {"classifier", 1}}}}}};
  }
  int n_ = 0;
};

// Batch norm's statistics are per micro-batch, as in any pipeline: one device
// runs the same 4 micro-batches (gradient accumulation).
TEST_F(CellsCli, StageOfPipelinesEqualOneDevice) {
  const Run one = run(config({{"micro_batches", 4}}, json()), "");
  ASSERT_EQ(one.losses.size(), 2u);
  for (const char* schedule : {"gpipe", "1f1b"}) {
    const Run pp = run(config(json::object(), pipeline(schedule)), "--ranks 2");
    ASSERT_EQ(pp.losses.size(), 2u) << schedule;
    for (size_t i = 0; i < 2; ++i)
      EXPECT_NEAR(pp.losses[i], one.losses[i], 1e-5 * one.losses[i]) << schedule;
    // The running statistics the eval reads were updated on the stages too,
    // and the last stage counts the argmax hits.
    EXPECT_NEAR(pp.eval, one.eval, 1e-5 * one.eval) << schedule;
    EXPECT_GE(one.accuracy, 0.0);
    EXPECT_EQ(pp.accuracy, one.accuracy) << schedule;
  }
}

TEST_F(CellsCli, RecomputeByCellNameEqualsAndSavesMemory) {
  const Run plain = run(config({{"batch_size", 128}}, json()), "");
  const Run rc = run(
      config(
          {{"batch_size", 128}, {"recompute", "full"}, {"recompute_layers", {"encoder.stages.*"}}},
          json()),
      "");
  ASSERT_EQ(rc.losses.size(), plain.losses.size());
  for (size_t i = 0; i < rc.losses.size(); ++i)
    EXPECT_NEAR(rc.losses[i], plain.losses[i], 1e-6 * plain.losses[i]);
  EXPECT_NEAR(rc.eval, plain.eval, 1e-6 * plain.eval);
  EXPECT_LT(rc.planned_mib, plain.planned_mib);
}

// `--check-plan` prices a ResNet's recompute by cell as the run does it: the
// first residual layer alone (the largest activations) within 4% of the
// memory held, less than none and no less than every layer; a later layer alone is not
// priced (the planner prices the first N), said by name.
TEST_F(CellsCli, RecomputeOfTheFirstResidualLayersIsPriced) {
  auto predicted_measured = [&](const json& train) {
    CliRun r = run_cli("train " + config(train, json()) + " --ranks 2 --check-plan");
    EXPECT_EQ(r.code, 0) << r.output;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(
        r.output, m, std::regex("memory +predicted +([0-9.]+) MiB measured +([0-9.]+) MiB")))
        << r.output;
    return m.size() > 2 ? std::make_pair(std::stod(m[1]), std::stod(m[2]))
                        : std::make_pair(0.0, 0.0);
  };
  const auto [p_first, m_first] = predicted_measured(
      {{"recompute", "full"}, {"recompute_layers", {"encoder.stages.0.layers.0"}}});
  EXPECT_NEAR(m_first / p_first, 1.0, 0.04);
  const auto [p_all, m_all] = predicted_measured({{"recompute", "full"}});
  EXPECT_NEAR(m_all / p_all, 1.0, 0.04);
  const auto [p_none, m_none] = predicted_measured(json::object());
  EXPECT_LE(p_all, p_first);  // (equal here: the first layer's backward sets the peak)
  EXPECT_LT(p_first, p_none);
  EXPECT_LT(m_first, m_none);
  CliRun r = run_cli(
      "train " +
      config({{"recompute", "full"}, {"recompute_layers", {"encoder.stages.1.layers.0"}}}, json()) +
      " --ranks 2 --check-plan");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("train.recompute_layers [1] is not priced: the planner prices full "
                          "recompute of the first N blocks of each pipeline chunk (N = 1: [0])"),
            std::string::npos)
      << r.output;
}

TEST_F(CellsCli, BadNamesAreOneLineErrors) {
  auto one_line = [](const CliRun& r) {
    return r.code == 2 && r.output.rfind("meshflow: error: ", 0) == 0 &&
           r.output.find('\n') == r.output.size() - 1;
  };
  json p = pipeline("gpipe");
  p["pipeline"]["stage_of"]["layer1"] = 0;
  CliRun r = run_cli("train " + config(json::object(), p) + " --ranks 2");
  EXPECT_TRUE(one_line(r)) << r.output;
  EXPECT_NE(r.output.find("parallel.pipeline.stage_of names 'layer1'"), std::string::npos)
      << r.output;
  p = pipeline("gpipe");
  p["pipeline"]["stage_of"].erase("pooler");
  r = run_cli("explain " + config(json::object(), p) + " --ranks 2");
  EXPECT_TRUE(one_line(r)) << r.output;
  EXPECT_NE(r.output.find("leaves the cell 'pooler' without a stage"), std::string::npos)
      << r.output;
  p = pipeline("gpipe");
  p["pipeline"]["layers_per_stage"] = {1, 2};
  r = run_cli("train " + config(json::object(), p) + " --ranks 2");
  EXPECT_TRUE(one_line(r)) << r.output;
  EXPECT_NE(r.output.find("give one"), std::string::npos) << r.output;
  p = pipeline("interleaved");
  p["pipeline"]["virtual_stages"] = 2;
  r = run_cli("train " + config(json::object(), p) + " --ranks 2");
  EXPECT_TRUE(one_line(r)) << r.output;
  EXPECT_NE(r.output.find("stage_of with virtual_stages=2"), std::string::npos) << r.output;
  p = pipeline("zb-v");  // two chunks per stage by definition
  r = run_cli("train " + config(json::object(), p) + " --ranks 2");
  EXPECT_TRUE(one_line(r)) << r.output;
  EXPECT_NE(r.output.find("stage_of with schedule \"zb-v\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("take layers_per_stage"), std::string::npos) << r.output;
  p = pipeline("gpipe");
  p["pipeline"]["stage_of"] = {"embedder", 0};
  r = run_cli("train " + config(json::object(), p) + " --ranks 2");
  EXPECT_TRUE(one_line(r)) << r.output;
  EXPECT_NE(r.output.find("stage_of must be an object of cell names to stages"), std::string::npos)
      << r.output;
  r = run_cli("train " + config({{"recompute_layers", {"encoder.stages.1"}}}, json()));
  EXPECT_TRUE(one_line(r)) << r.output;
  EXPECT_NE(r.output.find("train.recompute is \"none\""), std::string::npos) << r.output;
  r = run_cli("train " +
              config({{"recompute", "full"}, {"recompute_layers", {"stages.1"}}}, json()));
  EXPECT_TRUE(one_line(r)) << r.output;
  EXPECT_NE(r.output.find("'stages.1', which is no cell"), std::string::npos) << r.output;
  r = run_cli("train " + config({{"recompute", "full"}, {"recompute_layers", {1.5}}}, json()));
  EXPECT_TRUE(one_line(r)) << r.output;
  EXPECT_NE(r.output.find("block numbers >= 0 or cell names"), std::string::npos) << r.output;
}

// Batch norm's running statistics are model buffers (Graph::buffers): a
// checkpoint holds them with the weights, so a ResNet saved after training
// and loaded into a fresh engine evaluates as it did, on one rank, on the
// partitioner (2 ranks) and in a 2-stage pipeline (GPipe, by stage_of).
TEST_F(CellsCli, CheckpointsKeepBatchNormRunningStatistics) {
  for (const auto& [parallel, ranks] :
       {std::pair{json(), 1}, std::pair{json{{"mode", "semi"}, {"mesh", "dp=2"}}, 2},
        std::pair{pipeline("gpipe"), 2}}) {
    SCOPED_TRACE(parallel.dump());
    const RunConfig rc = value_or_throw(load_run_config(config({{"steps", 3}}, parallel), {}));
    const Job job = value_or_throw(resolve_job(rc, ranks));
    const std::string ckpt = (dir_ / ("ckpt" + std::to_string(++n_) + ".safetensors")).string();
    std::vector<float> trained(ranks), loaded(ranks);
    Status s = run_local_ranks(ranks, [&](const std::shared_ptr<Transport>& t) -> Status {
      auto comm = ranks > 1 ? Communicator::world(t) : nullptr;
      MF_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, make_engine(job, comm));
      for (int i = 0; i < 3; ++i) e->step();
      trained[t->rank()] = e->evaluate().loss;
      MF_RETURN_IF_ERROR(e->save_checkpoint(ckpt));
      MF_RETURN_IF_ERROR(comm ? comm->barrier() : Status::ok());
      MF_ASSIGN_OR_RETURN(std::unique_ptr<Engine> fresh, make_engine(job, comm));
      MF_RETURN_IF_ERROR(fresh->load_checkpoint(ckpt));
      loaded[t->rank()] = fresh->evaluate().loss;
      return Status::ok();
    });
    ASSERT_TRUE(s.is_ok()) << s.message();
    const SafetensorsFile f = value_or_throw(read_safetensors(ckpt));
    EXPECT_TRUE(f.tensors.count("encoder.stages.1.layers.0.layer.0.normalization.running_var"));
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(loaded[r], trained[r]) << "rank " << r;
      EXPECT_GT(trained[r], 0.f);
    }
  }
}

}  // namespace
}  // namespace meshflow
