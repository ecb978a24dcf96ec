// Hostile input never crashes: every user mistake gets one line
// "meshflow: error: ..." naming the thing and what is valid, exit code 2;
// never a crash, an abort, a hang or unbounded memory. Runs the real binary,
// under `timeout` where a regression would hang.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_run.h"
#include "temp_dir_test.h"

namespace {

namespace fs = std::filesystem;
using meshflow::testing::CliRun;
using nlohmann::json;

// Runs `meshflow args` killed after `seconds` (exit code 124 or 137 then).
CliRun run(const std::string& args, int seconds = 60) {
  return meshflow::testing::run_cli(args, seconds);
}

std::string config(const std::string& rel) {
  return meshflow::testing::source_dir() + "/configs/" + rel;
}

// No crash, whatever the exit code.
void expect_no_crash(const CliRun& r) {
  for (const char* bad : {"terminate called", "Segmentation", "Aborted", "core dumped"})
    EXPECT_EQ(r.output.find(bad), std::string::npos) << r.output;
  EXPECT_NE(r.code, 124) << "timed out: " << r.output;
  EXPECT_LT(r.code, 128) << "killed by a signal: " << r.output;
}

// One line naming the thing, exit code 2.
void expect_user_error(const CliRun& r, const std::string& must_contain) {
  expect_no_crash(r);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(must_contain), std::string::npos)
      << "expected '" << must_contain << "' in: " << r.output;
  EXPECT_EQ(r.output.rfind("meshflow: error: ", 0), 0u) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1)
      << "expected one line: " << r.output;
}

class CliHostile : public meshflow::testing::TempDirTest {
 protected:
  std::string write(const json& j, const std::string& name = "run.json") {
    std::ofstream(path(name)) << j.dump(2);
    return path(name);
  }

  // A one-layer GPT on fortunes: one step takes well under a second.
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
         {{"steps", 1}, {"batch_size", 4}, {"seq_len", 16}, {"threads", 1}, {"eval_batches", 1}}},
        {"optimizer", {{"type", "adamw"}, {"lr", 1e-3}}}};
  }

  std::string plan_args(const std::string& rest) const {
    return "plan " + config("models/gpt_bytes_small.json") + " --cluster " +
           config("clusters/local_cpu.json") + " --gpus 1 " + rest;
  }
};

// Item 1: a filesystem error (a name longer than NAME_MAX) is one line, exit 2.

TEST_F(CliHostile, ModelFileNameTooLongIsOneLine) {
  json j = gpt_run();
  j["model"] = std::string(256, 'm') + ".json";
  const std::string cfg = write(j);
  for (const char* cmd : {"graph", "explain", "train"}) {
    SCOPED_TRACE(cmd);
    const CliRun r = run(std::string(cmd) + " " + cfg);
    expect_user_error(r, "config.model");
    EXPECT_NE(r.output.find("File name too long"), std::string::npos) << r.output;
  }
}

TEST_F(CliHostile, ConfigPathTooLongIsOneLine) {
  const std::string cfg = path(std::string(300, 'c') + ".json");
  for (const char* cmd : {"graph", "explain", "train", "simulate"}) {
    SCOPED_TRACE(cmd);
    expect_user_error(run(std::string(cmd) + " " + cfg), "File name too long");
  }
  expect_user_error(
      run("plan " + cfg + " --cluster " + config("clusters/local_cpu.json") + " --gpus 1"),
      "File name too long");
  expect_user_error(
      run("plan " + config("models/gpt_bytes_small.json") + " --cluster " + cfg + " --gpus 1"),
      "File name too long");
}

// Item 2: inputs are regular files of bounded size.

TEST_F(CliHostile, DeviceAsInputIsRefused) {
  expect_user_error(run("train /dev/zero", 20), "'/dev/zero' is not a regular file");
  expect_user_error(run("graph /dev/zero", 20), "not a regular file");
  expect_user_error(run("simulate /dev/zero", 20), "not a regular file");
  expect_user_error(
      run("plan /dev/zero --cluster " + config("clusters/local_cpu.json") + " --gpus 1", 20),
      "'/dev/zero' is not a regular file");
  expect_user_error(
      run("plan " + config("models/gpt_bytes_small.json") + " --cluster /dev/zero --gpus 1", 20),
      "'/dev/zero' is not a regular file");
  json j = gpt_run();
  j["model"] = "/dev/zero";
  expect_user_error(run("train " + write(j), 20), "config.model");
  expect_user_error(run("train " + write(gpt_run()) + " --init /dev/zero", 20),
                    "not a regular file");
}

TEST_F(CliHostile, FifoAsInputDoesNotHang) {
  const std::string fifo = path("fifo.json");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_user_error(run("train " + fifo, 20), "is not a regular file (it is a FIFO)");
  expect_user_error(run("train " + write(gpt_run()) + " --init " + fifo, 20), "not a regular file");
}

TEST_F(CliHostile, DirectoryAsInputIsRefused) {
  expect_user_error(run("train " + dir_.string()), "is a directory");
}

TEST_F(CliHostile, OversizedInputIsRefusedNamingTheLimit) {
  const std::string big = path("big.json");
  std::ofstream(big) << "{}";
  fs::resize_file(big, (std::uintmax_t{64} << 20) + 1);  // sparse: no disk used
  expect_user_error(run("train " + big, 20), "64 MiB limit");
  expect_user_error(
      run("plan " + big + " --cluster " + config("clusters/local_cpu.json") + " --gpus 1", 20),
      "64 MiB limit");
}

TEST_F(CliHostile, DeeplyNestedJsonIsRefused) {
  const std::string deep = path("deep.json");
  std::ofstream(deep) << std::string(100000, '[') << std::string(100000, ']');
  expect_user_error(run("train " + deep, 20), "levels deep");
}

// Item 3: outputs are checked before training, and write errors are reported.

// A checkpoint is a directory (full state) or FILE.safetensors (weights): a
// regular file where the directory should be, or a directory named like a
// weights file, fails before training.
TEST_F(CliHostile, CheckpointOfTheWrongKindFailsBeforeTraining) {
  const std::string file = path("a_file");
  std::ofstream(file) << "x";
  CliRun r = run("train " + write(gpt_run()) + " --checkpoint " + file);
  expect_user_error(r, "--checkpoint '" + file + "' is a regular file, not a directory");
  EXPECT_EQ(r.output.find("step"), std::string::npos) << "trained first: " << r.output;
  const std::string weights_dir = path("w.safetensors");
  fs::create_directories(weights_dir);
  r = run("train " + write(gpt_run()) + " --checkpoint " + weights_dir);
  expect_user_error(r, "--checkpoint '" + weights_dir + "' is a directory");
  EXPECT_EQ(r.output.find("step"), std::string::npos) << "trained first: " << r.output;
}

// Ring attention splits the sequence into cp blocks: a length that does not
// divide is one line naming seq_len, cp and the valid lengths.
TEST_F(CliHostile, RingWithASequenceNotDividingByCpIsOneLine) {
  json j = gpt_run();
  j["train"]["seq_len"] = 12;
  j["parallel"] = {{"mode", "semi"}, {"mesh", "cp=4"}, {"preset", "ring"}};
  // The zigzag order (the default) cuts the sequence into 2 x cp chunks.
  expect_user_error(run("train " + write(j) + " --ranks 4"),
                    "train.seq_len=12 does not split into 2 x cp = 8 chunks (ring_order "
                    "\"zigzag\"); ring attention needs a multiple of 8 (8 or 16), or "
                    "\"ring_order\": \"contiguous\" (a multiple of 4)");
  j["train"]["seq_len"] = 6;
  j["parallel"]["ring_order"] = "contiguous";
  expect_user_error(run("train " + write(j) + " --ranks 4"),
                    "train.seq_len=6 does not split into cp=4 blocks; ring attention needs a "
                    "multiple of 4 (4 or 8)");
  j["parallel"]["ring_order"] = "mirrored";
  expect_user_error(run("train " + write(j) + " --ranks 4"), "parallel.ring_order");
  // Beside sequence parallelism (ring-sp) the preset is named, and the norms'
  // split over cp*tp names the dim and its valid splits.
  j["train"]["seq_len"] = 6;
  j["parallel"] = {{"mode", "semi"}, {"mesh", "tp=2,cp=2"}, {"preset", "ring-sp"}};
  expect_user_error(run("train " + write(j) + " --ranks 4"),
                    "parallel.preset \"ring-sp\": train.seq_len=6 does not split into 2 x cp = 4 "
                    "chunks");
  j["parallel"]["ring_order"] = "contiguous";
  expect_user_error(run("train " + write(j) + " --ranks 4"),
                    "(seq=6) cannot be split 4 ways over mesh axis cp*tp (rule seq: cp*tp|cp); "
                    "valid splits of seq: 1, 2, 3, 6");
  // Split tuples that ask for the zigzag order: over cp, which the mesh must have.
  j["train"]["seq_len"] = 12;
  j["parallel"] = {{"mode", "semi"},
                   {"mesh", "tp=2"},
                   {"strategies", {{"h.?.mlp.c_fc", "((1, 1, 1), (1, tp))"}}},
                   {"ring_order", "zigzag"}};
  expect_user_error(run("train " + write(j) + " --ranks 2"),
                    "parallel.ring_order \"zigzag\" orders ring attention's sequence over the "
                    "mesh axis \"cp\", which the mesh {tp: 2} lacks");
  j["parallel"]["mesh"] = "cp=4";
  j["parallel"]["strategies"] = {{"h.?.mlp.c_fc", "((1, cp, 1), (1, 1))"}};
  expect_user_error(run("train " + write(j) + " --ranks 4"),
                    "parallel.ring_order: train.seq_len=12 does not split into 2 x cp = 8 chunks");
  // Named-dim rules of the user's own ask for it the same way.
  j["parallel"] = {
      {"mode", "semi"}, {"mesh", "tp=2"}, {"rules", {{"ffn", "tp"}}}, {"ring_order", "zigzag"}};
  expect_user_error(run("train " + write(j) + " --ranks 2"),
                    "parallel.ring_order \"zigzag\" orders ring attention's sequence over the "
                    "mesh axis \"cp\", which the mesh {tp: 2} lacks");
}

TEST_F(CliHostile, CheckpointInConfigOfTheWrongKindFailsBeforeTraining) {
  json j = gpt_run();
  const std::string file = path("b_file");
  std::ofstream(file) << "x";
  j["train"]["checkpoint"] = file;
  expect_user_error(run("train " + write(j)), "train.checkpoint '" + file + "' is a regular file");
}

// A FIFO stands for any special file (/dev/full, /dev/null): anyone can make
// one, and were it replaced by a regression, only this test's directory would
// suffer (as root, renaming a checkpoint over /dev/full deletes the device).
TEST_F(CliHostile, SpecialFilesAreNeverReplacedByOutputs) {
  const std::string node = path("node");
  ASSERT_EQ(::mkfifo(node.c_str(), 0600), 0);
  const std::string cfg = write(gpt_run());
  const std::string kind = "' is not a regular file (it is a FIFO)";
  expect_user_error(run("train " + cfg + " --checkpoint " + node, 20),
                    "--checkpoint '" + node + "' is a FIFO, not a directory");
  const std::string weights = path("node.safetensors");
  ASSERT_EQ(::mkfifo(weights.c_str(), 0600), 0);
  expect_user_error(run("train " + cfg + " --checkpoint " + weights, 20),
                    "--checkpoint '" + weights + kind);
  expect_user_error(run("train " + cfg + " --trace " + node, 20), "--trace '" + node + kind);
  expect_user_error(run(plan_args("--out " + node), 20), "--out '" + node + kind);
  expect_user_error(run("bench --calibrate --quick --out " + node, 20), "--out '" + node + kind);
  for (const std::string& n : {node, weights}) {
    struct stat st;
    ASSERT_EQ(::stat(n.c_str(), &st), 0);
    EXPECT_TRUE(S_ISFIFO(st.st_mode)) << n << " was replaced";
  }
}

TEST_F(CliHostile, OutputsInMissingDirectoriesOrThatAreDirectoriesFailFirst) {
  const std::string cfg = write(gpt_run());
  const std::string missing = path("no_dir/x");
  expect_user_error(run("train " + cfg + " --metrics " + missing), "--metrics");
  expect_user_error(run("train " + cfg + " --metrics " + dir_.string()), "is a directory");
  expect_user_error(run("train " + cfg + " --trace " + missing), "no_dir");
  expect_user_error(run(plan_args("--out " + dir_.string())), "--out");
  expect_user_error(run(plan_args("--out " + missing)), "no_dir");
  expect_user_error(run("simulate " + cfg + " --trace " + dir_.string()), "--trace");
  expect_user_error(run("bench --calibrate --quick --out " + dir_.string()), "--out");
  EXPECT_FALSE(fs::exists(path("no_dir")));
}

TEST_F(CliHostile, MetricsWriteErrorIsReported) {
  struct stat st;  // written in place (a stream), never renamed over
  if (::stat("/dev/full", &st) != 0 || !S_ISCHR(st.st_mode)) GTEST_SKIP() << "no /dev/full";
  const CliRun r = run("train " + write(gpt_run()) + " --quiet --metrics /dev/full");
  expect_no_crash(r);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--metrics '/dev/full': cannot write"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

TEST_F(CliHostile, GoodOutputsAreStillWritten) {
  const std::string m = path("m.jsonl"), c = path("c.safetensors"), t = path("t.json");
  std::ofstream(c) << "old";  // an existing regular file is replaced
  const CliRun r = run("train " + write(gpt_run()) + " --quiet --metrics " + m + " --checkpoint " +
                       c + " --trace " + t);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_GT(fs::file_size(m), 0u);
  EXPECT_GT(fs::file_size(c), 3u);
  EXPECT_GT(fs::file_size(t), 0u);
}

// Item 4: optimizer values out of range are errors naming the key.

TEST_F(CliHostile, OptimizerRanges) {
  const std::string cfg = write(gpt_run());
  expect_user_error(run("train " + cfg + " --set optimizer.eps=0"),
                    "optimizer.eps must be in (0, 1], got 0");
  expect_user_error(run("train " + cfg + " --set optimizer.eps=1e-50"), "optimizer.eps");
  expect_user_error(run("train " + cfg + " --set optimizer.lr=0"), "optimizer.lr must be in (0");
  expect_user_error(run("train " + cfg + " --set optimizer.min_lr=0.1"),
                    "optimizer.min_lr=0.1 must be <= optimizer.lr=0.001");
  expect_user_error(run("train " + cfg + " --set optimizer.type=sgd --set optimizer.momentum=1"),
                    "optimizer.momentum must be in [0, 1)");
  expect_user_error(run("train " + cfg + " --set optimizer.lr=0.5 --set optimizer.weight_decay=2"),
                    "optimizer.weight_decay=2 times optimizer.lr=0.5 must be < 1");
}

// Item 5: command-line values never fall back to defaults silently.

TEST_F(CliHostile, TrainOptionsOutOfRange) {
  const std::string cfg = write(gpt_run());
  expect_user_error(run("train " + cfg + " --steps 0"), "--steps");
  expect_user_error(run("train " + cfg + " --steps -1"), "--steps");
  expect_user_error(run("train " + cfg + " --steps 99999999999999999999"), "--steps");
  expect_user_error(run("train " + cfg + " --steps many"), "--steps");
  expect_user_error(run("train " + cfg + " --threads -1"), "--threads");
  expect_user_error(run("train " + cfg + " --ranks 0"), "--ranks");
}

TEST_F(CliHostile, ParseErrorsAreOneLine) {
  expect_user_error(run("train"), "config");
  expect_user_error(run("train x.json --stepz 3"), "--stepz");
  expect_user_error(run(""), "subcommand");
}

TEST_F(CliHostile, PlanOptionsOutOfRange) {
  expect_user_error(run(plan_args("--global-batch 0")), "--global-batch");
  expect_user_error(run(plan_args("--global-batch -5")), "--global-batch");
  expect_user_error(run(plan_args("--seq 0")), "--seq");
  expect_user_error(run(plan_args("--seq -1")), "--seq");
  expect_user_error(run("plan " + config("models/gpt_bytes_small.json") + " --cluster " +
                        config("clusters/local_cpu.json") + " --gpus 0"),
                    "--gpus");
  expect_user_error(run("plan " + config("models/gpt_bytes_small.json") + " --cluster " +
                        config("clusters/local_cpu.json") + " --gpus 99999999999"),
                    "--gpus");
  expect_user_error(run(plan_args("--fix tp=8,tp=4")), "'tp' more than once");
  expect_user_error(run(plan_args("--fix ,,,")), "empty item");
  expect_user_error(run(plan_args("--fix tp=1,")), "empty item");
  expect_user_error(run(plan_args("--fix ''")), "--fix");
  expect_user_error(run(plan_args("--fix tp=99999999999999999999")), "--fix tp");
  expect_user_error(run(plan_args("--time-limit 0")), "--time-limit");
  // A power limit needs the file's rated power (local_cpu.json has none) and
  // may not exceed it.
  expect_user_error(run(plan_args("--power-limit 500")), "gives no device.rated_power_w");
  expect_user_error(run(plan_args("--power-limit 0")), "--power-limit");
  const std::string h100 = "plan " + config("models/llama3_8b.json") + " --cluster " +
                           config("clusters/h100_sxm.json") + " --gpus 8 --top 0 ";
  expect_user_error(run(h100 + "--power-limit 800"), "above the rated 700 W");
  const CliRun capped = run(h100 + "--power-limit 500");
  EXPECT_EQ(capped.code, 0) << capped.output;
  EXPECT_NE(capped.output.find("500 of 700 W: GEMMs and attention at 0.894 of the rated clock"),
            std::string::npos)
      << capped.output;
}

// Item 6: the plan search is bounded by more than the batch size.

TEST_F(CliHostile, PlanGlobalBatchAboveTheLimitNamesIt) {
  expect_user_error(run("plan " + config("models/gpt3_175b.json") + " --cluster " +
                            config("clusters/dgx_a100_80gb.json") +
                            " --gpus 1024 --global-batch 9223372036854775807",
                        20),
                    "4294967296");
}

TEST_F(CliHostile, PlanWithHugeBatchIsFast) {
  // Prime and power-of-two batches at the limit: micro-batch sizes come from
  // a bounded list, not from factoring the batch.
  for (const char* gb : {"4294967291", "4294967296"}) {
    const CliRun r =
        run("plan " + config("models/gpt3_175b.json") + " --cluster " +
                config("clusters/dgx_a100_80gb.json") + " --gpus 1024 --global-batch " + gb,
            20);
    expect_no_crash(r);
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("best plan"), std::string::npos) << r.output;
  }
}

TEST_F(CliHostile, PlanTimeLimitReturnsTheBestSoFar) {
  const std::string args = "plan " + config("models/gpt3_1.3b.json") + " --cluster " +
                           config("clusters/dgx_a100_80gb.json") + " --gpus 1024";
  CliRun r = run(args + " --time-limit 0.001", 20);
  expect_no_crash(r);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("stopped at the time limit"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("best plan"), std::string::npos) << r.output;
  r = run(args + " --time-limit 0.001 --json", 20);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_FALSE(json::parse(r.output).at("search_complete").get<bool>());
  r = run(args + " --json", 60);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(json::parse(r.output).at("search_complete").get<bool>());
}

// Item 7: a very deep model builds and plans its memory in about linear time
// (10,000 layers took 87 s before: the memory planner compared every pair of
// values).
TEST_F(CliHostile, TenThousandLayerMlpTrainsAStepQuickly) {
  json j = {{"model",
             {{"type", "mlp"},
              {"input_dim", 784},
              {"hidden", std::vector<int>(10000, 4)},
              {"num_classes", 10}}},
            {"data", {{"dataset", "fashion_mnist"}}},
            {"train", {{"steps", 1}, {"batch_size", 2}, {"threads", 1}, {"eval_batches", 1}}}};
  const std::string cfg = write(j);
  CliRun r = run("graph " + cfg + " --phase forward", 30);
  expect_no_crash(r);
  EXPECT_EQ(r.code, 0) << r.output.substr(0, 500);
  r = run("train " + cfg + " --quiet", 30);
  expect_no_crash(r);
  if (r.output.find("fashion") != std::string::npos && r.code == 2)
    GTEST_SKIP() << "no Fashion-MNIST here: " << r.output;
  EXPECT_EQ(r.code, 0) << r.output;
}

}  // namespace
