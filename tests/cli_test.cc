// The CLI as a user meets it: bad input gets one line naming the key and what
// is valid, and exit code 2; good input trains and writes the metrics file.
// Runs the real binary (MESHFLOW_BIN, set by CMake).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_run.h"
#include "temp_dir_test.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using meshflow::testing::CliRun;
CliRun run(const std::string& args) {
  return meshflow::testing::run_cli(args);
}

class Cli : public meshflow::testing::TempDirTest {
 protected:
  // Writes a run config and returns its path.
  std::string write(const json& j, const std::string& name = "run.json") {
    std::string p = (dir_ / name).string();
    std::ofstream(p) << j.dump(2);
    return p;
  }

  static json gpt_run() {
    return {
        {"model",
         {{"model_type", "gpt2"},
          {"n_layer", 1},
          {"n_embd", 32},
          {"n_head", 2},
          {"n_positions", 16},
          {"vocab_size", 256}}},
        {"data", {{"dataset", "fortunes"}}},
        {"train",
         {{"steps", 2}, {"batch_size", 4}, {"seq_len", 16}, {"threads", 1}, {"eval_batches", 1}}},
        {"optimizer", {{"type", "adamw"}, {"lr", 1e-3}}}};
  }
};

// One line, naming the thing, exit code 2.
void expect_user_error(const CliRun& r, const std::string& must_contain) {
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(must_contain), std::string::npos) << "output: " << r.output;
  EXPECT_EQ(r.output.find("Aborted"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1)
      << "expected one line: " << r.output;
}

TEST_F(Cli, HelpExitsZero) {
  CliRun r = run("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.output.find("train"), std::string::npos);
  EXPECT_EQ(run("train --help").code, 0);
  EXPECT_EQ(run("graph --help").code, 0);
}

TEST_F(Cli, UnknownCommandOrOptionIsExit2) {
  EXPECT_EQ(run("trian x.json").code, 2);
  EXPECT_EQ(run("train x.json --stepz 3").code, 2);
}

TEST_F(Cli, MissingConfigFile) {
  expect_user_error(run("train " + (dir_ / "nope.json").string()), "nope.json");
}

TEST_F(Cli, ConfigThatIsNotJson) {
  std::string p = (dir_ / "bad.json").string();
  std::ofstream(p) << "{\"model\": ";
  expect_user_error(run("train " + p), "not valid JSON");
}

TEST_F(Cli, UnknownKeyNamesTheKeyAndTheValidOnes) {
  json j = gpt_run();
  j["train"]["stepz"] = 3;
  CliRun r = run("train " + write(j));
  expect_user_error(r, "unknown key 'stepz'");
  EXPECT_NE(r.output.find("steps"), std::string::npos);
}

TEST_F(Cli, UnknownModelKey) {
  json j = gpt_run();
  j["model"]["n_emb"] = 32;
  expect_user_error(run("train " + write(j)), "n_emb");
}

TEST_F(Cli, WrongType) {
  json j = gpt_run();
  j["train"]["steps"] = "many";
  expect_user_error(run("train " + write(j)), "train.steps must be an integer");
}

TEST_F(Cli, WrongTypeThroughSet) {
  expect_user_error(run("train " + write(gpt_run()) + " --set optimizer.lr=fast"),
                    "optimizer.lr must be a number");
}

TEST_F(Cli, HeadsDoNotDivideEmbedding) {
  json j = gpt_run();
  j["model"]["n_embd"] = 30;
  j["model"]["n_head"] = 4;
  CliRun r = run("train " + write(j));
  expect_user_error(r, "n_embd=30");
  EXPECT_NE(r.output.find("n_head=4"), std::string::npos) << r.output;
}

TEST_F(Cli, MissingDataFileNamesThePath) {
  json j = gpt_run();
  j["data"]["path"] = (dir_ / "no_such_corpus").string();
  expect_user_error(run("train " + write(j)), "no_such_corpus");
  json m = {{"model", {{"type", "mlp"}, {"input_dim", 784}, {"hidden", {16}}, {"num_classes", 10}}},
            {"data", {{"dataset", "fashion_mnist"}, {"path", (dir_ / "no_images").string()}}},
            {"train", {{"steps", 1}, {"batch_size", 4}}}};
  expect_user_error(run("train " + write(m, "mlp.json")), "no_images");
}

TEST_F(Cli, DatasetThatDoesNotFitTheModel) {
  json j = gpt_run();
  j["data"]["dataset"] = "fashion_mnist";
  expect_user_error(run("train " + write(j)), "fortunes");
}

TEST_F(Cli, BatchNotDivisibleByMicroBatches) {
  json j = gpt_run();
  j["train"]["micro_batches"] = 3;
  expect_user_error(run("train " + write(j)), "micro_batches=3");
}

TEST_F(Cli, SeqLongerThanThePositions) {
  json j = gpt_run();
  j["train"]["seq_len"] = 64;
  expect_user_error(run("train " + write(j)), "n_positions=16");
}

TEST_F(Cli, UnknownModelType) {
  json j = gpt_run();
  j["model"]["model_type"] = "bert";
  expect_user_error(run("train " + write(j)), "bert");
}

TEST_F(Cli, TrainsAndWritesMetrics) {
  std::string metrics = (dir_ / "m.jsonl").string();
  std::string ckpt = (dir_ / "w.safetensors").string();
  CliRun r = run("train " + write(gpt_run()) + " --metrics " + metrics + " --checkpoint " + ckpt +
                 " --quiet");
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(metrics);
  std::string line;
  int steps = 0;
  bool eval = false;
  while (std::getline(in, line)) {
    json j = json::parse(line);
    if (j.contains("eval")) {
      eval = true;
      EXPECT_TRUE(j["eval"].contains("loss"));
      continue;
    }
    ++steps;
    for (const char* k : {"step", "loss", "lr", "tokens_per_s", "gflops", "peak_bytes"})
      EXPECT_TRUE(j.contains(k)) << k << " missing in " << line;
  }
  EXPECT_EQ(steps, 2);
  EXPECT_TRUE(eval);
  EXPECT_TRUE(fs::exists(ckpt));
  // Resuming from the checkpoint works; a checkpoint of another model is a clear error.
  EXPECT_EQ(run("train " + write(gpt_run()) + " --init " + ckpt + " --quiet").code, 0);
  json other = gpt_run();
  other["model"]["n_embd"] = 64;
  expect_user_error(run("train " + write(other, "other.json") + " --init " + ckpt + " --quiet"),
                    "shape");
}

TEST_F(Cli, UnwritableCheckpointFailsBeforeTraining) {
  expect_user_error(run("train " + write(gpt_run()) + " --checkpoint " +
                        (dir_ / "no_dir" / "w.safetensors").string()),
                    "no_dir");
}

TEST_F(Cli, MissingInitCheckpoint) {
  expect_user_error(
      run("train " + write(gpt_run()) + " --init " + (dir_ / "none.safetensors").string()),
      "none.safetensors");
}

TEST_F(Cli, GraphPrintsTheTrainingGraph) {
  CliRun r = run("graph " + write(gpt_run()) + " --phase optimizer");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("adamw_update"), std::string::npos);
  EXPECT_EQ(r.output.find("attention("), std::string::npos);
}

}  // namespace
