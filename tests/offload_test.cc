// Offload to disk (runtime/offload.h): the optimizer state, and the
// parameters, in a memory-mapped file streamed around each node. A run with
// offload is the same run: losses and every weight bit-identical to the run
// without it, on one rank, on dp=2, with ZeRO-3 stages and with a pipeline.
// The executor reports the offloaded bytes apart, the streamer prefetches and
// releases, and a bad directory is one line.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_run.h"
#include "meshflow/comm/communicator.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/engine/job.h"
#include "meshflow/ops/builder.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;

json small_gpt() {
  return {{"model_type", "gpt2"},
          {"n_layer", 2},
          {"n_embd", 32},
          {"n_head", 2},
          {"n_positions", 32},
          {"vocab_size", 256},
          {"tie_word_embeddings", true}};
}

std::string temp_dir(const std::string& tag) {
  const fs::path p =
      fs::temp_directory_path() / ("meshflow_offload_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

struct Run {
  std::vector<float> losses;
  std::string weights;  // the gathered safetensors file's bytes
  int64_t peak = 0;     // rank 0's planned bytes in RAM (Engine::peak_bytes)
};

// Trains `steps` AdamW steps with clipping on `ranks` in-process ranks and
// returns rank 0's losses and the whole model's weights file.
Run train(const json& parallel, const json& offload, int ranks, int steps = 3) {
  json doc = {{"model", small_gpt()},
              {"data", {{"dataset", "fortunes"}}},
              {"train", {{"steps", steps}, {"batch_size", 8}, {"seq_len", 16}, {"threads", 1}}},
              {"optimizer", {{"type", "adamw"}, {"lr", 3e-3}, {"grad_clip", 1.0}}}};
  if (!parallel.is_null()) doc["parallel"] = parallel;
  if (!offload.is_null()) doc["offload"] = offload;
  const Job job = value_or_throw(resolve_job(value_or_throw(parse_run_config(doc, "")), ranks));
  const std::string out = temp_dir("weights") + "/w.safetensors";
  Run run;
  Status s = run_local_ranks(ranks, [&](const std::shared_ptr<Transport>& t) -> Status {
    MF_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e,
                        make_engine(job, Communicator::world(t), nullptr, false));
    for (int i = 0; i < steps; ++i) {
      const StepResult r = e->step();
      if (t->rank() == 0) run.losses.push_back(r.loss);
    }
    if (t->rank() == 0) run.peak = e->peak_bytes();
    return e->save_checkpoint(out);
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
  std::ifstream in(out, std::ios::binary);
  run.weights.assign(std::istreambuf_iterator<char>(in), {});
  fs::remove_all(fs::path(out).parent_path());
  return run;
}

// a without offload, b with: the same numbers, b holding less in RAM.
void expect_same(const Run& a, const Run& b) {
  EXPECT_LT(b.peak, a.peak) << "nothing was offloaded";
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i;
  EXPECT_FALSE(a.weights.empty());
  EXPECT_TRUE(a.weights == b.weights) << "the weights differ";
}

TEST(Offload, OptimizerAndParametersOnDiskTrainBitIdentically) {
  const std::string dir = temp_dir("run");
  const json optimizer = {{"optimizer", "disk"}, {"dir", dir}};
  const json both = {{"optimizer", "disk"}, {"params", "disk"}, {"dir", dir}, {"prefetch", 2}};
  expect_same(train(nullptr, nullptr, 1), train(nullptr, optimizer, 1));
  expect_same(train(nullptr, nullptr, 1), train(nullptr, both, 1));
  const json dp = {{"mode", "data"}};
  expect_same(train(dp, nullptr, 2), train(dp, optimizer, 2));
  // ZeRO-3 with offload: each rank's shards of the parameters and optimizer state on disk.
  const json zero3 = {{"mode", "semi"}, {"mesh", "dp=2"}, {"preset", "dp"}, {"zero", 3}};
  expect_same(train(zero3, nullptr, 2), train(zero3, both, 2));
  // A pipeline's stages (each chunk's executor its own file).
  const json pipe = {{"pipeline", {{"stages", 2}, {"schedule", "1f1b"}, {"micro_batches", 2}}}};
  expect_same(train(pipe, nullptr, 2), train(pipe, both, 2));
  // Nothing is left in the directory: the files are unlinked when created.
  EXPECT_TRUE(fs::is_empty(dir));
  fs::remove_all(dir);
}

// The executor: the offloaded bytes are reported apart (not in total()), the
// streamer prefetches what the next nodes read and releases what is not read
// again soon, and the values read back what was written.
TEST(Offload, ExecutorStreamsTheOffloadedValues) {
  const std::string dir = temp_dir("exec");
  Graph g;
  Builder b(g);
  const ValueId x = b.input("x", Shape{{"batch", 4}, {"d0", 8}});
  ValueId h = x;
  for (int i = 0; i < 6; ++i) {
    const std::string in = "d" + std::to_string(i), out = "d" + std::to_string(i + 1);
    const ValueId w =
        b.parameter("w" + std::to_string(i), Shape{{in, 8}, {out, 8}}, Init::normal(0.5f));
    h = b.matmul(h, w, {}, "mm" + std::to_string(i));
  }
  g.outputs["y"] = h;
  Executor plain(g, {.seed = 7, .fetch = {h}, .run_elsewhere = {}, .offload = {}});
  OffloadOptions o;
  o.params = true;
  o.dir = dir;
  o.lookahead = 1;
  ASSERT_TRUE(check_offload(g, o).is_ok());
  Executor off(g, {.seed = 7, .fetch = {h}, .run_elsewhere = {}, .offload = o});
  EXPECT_EQ(off.memory().params, 0);
  EXPECT_EQ(off.memory().offloaded, 6 * sysconf(_SC_PAGE_SIZE));  // one page per 256 B weight
  EXPECT_EQ(plain.memory().params, 6 * 8 * 8 * 4);
  Tensor in = Tensor::zeros(Shape{{"batch", 4}, {"d0", 8}});
  for (int64_t i = 0; i < in.numel(); ++i) in.data<float>()[i] = 0.1f * static_cast<float>(i % 7);
  for (Executor* e : {&plain, &off}) {
    ASSERT_TRUE(e->feed("x", in).is_ok());
    e->run(e->forward_backward_order());
  }
  for (int64_t i = 0; i < 32; ++i) EXPECT_EQ(plain.data_f(h)[i], off.data_f(h)[i]) << i;
  const OffloadStreamer* s = off.offload_streamer();
  ASSERT_NE(s, nullptr);
  // Released after initialization, then each weight read once a run:
  // prefetched ahead of its read and released after it.
  EXPECT_EQ(s->prefetches(), 6);
  EXPECT_EQ(s->releases(), 12);
  off.run(off.forward_backward_order());
  EXPECT_EQ(s->prefetches(), 12);
  EXPECT_EQ(s->releases(), 18);
  for (int64_t i = 0; i < 32; ++i) EXPECT_EQ(plain.data_f(h)[i], off.data_f(h)[i]) << i;
  fs::remove_all(dir);
}

// A model whose optimizer state does not fit in RAM passes the memory check
// with the state offloaded (and then needs the disk space).
TEST(Offload, MemoryCheckCountsOnlyWhatStaysInRam) {
  Graph g;
  Builder b(g);
  const double machine =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  const int64_t n = static_cast<int64_t>(machine / 4 / 2.5);  // 40% of RAM in f32
  const ValueId w = b.parameter("w", Shape{{"n", n}}, Init::zeros());
  b.state("w.m", Shape{{"n", n}});
  b.state("w.v", Shape{{"n", n}});
  g.outputs["w"] = w;
  EXPECT_FALSE(Executor::check_fits_in_memory(g).is_ok());
  OffloadOptions o;
  o.optimizer = true;
  o.dir = fs::temp_directory_path().string();
  EXPECT_TRUE(Executor::check_fits_in_memory(g, o).is_ok());
  EXPECT_EQ(offload_bytes(g, o), 2 * ((n * 4 + sysconf(_SC_PAGE_SIZE) - 1) /
                                      sysconf(_SC_PAGE_SIZE) * sysconf(_SC_PAGE_SIZE)));
}

TEST(Offload, BadDirectoriesAreOneLine) {
  Graph g;
  Builder b(g);
  b.parameter("w", Shape{{"n", 1 << 20}}, Init::zeros());
  b.state("w.m", Shape{{"n", 1 << 20}});
  OffloadOptions o;
  o.optimizer = true;
  o.dir = "/nonexistent/meshflow";
  std::string m = check_offload(g, o).message();
  EXPECT_NE(m.find("offload.dir \"/nonexistent/meshflow\" does not exist"), std::string::npos) << m;
  const std::string file = temp_dir("file") + "/plain";
  std::ofstream(file) << "x";
  o.dir = file;
  m = check_offload(g, o).message();
  EXPECT_NE(m.find("is not a directory"), std::string::npos) << m;
  // Not writable: a mode-0500 directory, or, as root (whom modes do not
  // stop), a read-only mount when this machine has one.
  std::string locked;
  if (::geteuid() != 0) {
    locked = temp_dir("locked");
    fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
  } else {
    std::ifstream mounts("/proc/self/mounts");
    for (std::string dev, at, type, opts; locked.empty() && mounts >> dev >> at >> type >> opts;) {
      std::getline(mounts, dev);
      if (("," + opts + ",").find(",ro,") != std::string::npos && fs::is_directory(at)) locked = at;
    }
  }
  if (!locked.empty()) {
    o.dir = locked;
    m = check_offload(g, o).message();
    EXPECT_NE(m.find("cannot be written"), std::string::npos) << locked << ": " << m;
    EXPECT_NE(m.find("name a directory this user can write"), std::string::npos) << m;
  }
  if (::geteuid() != 0) {
    fs::permissions(locked, fs::perms::owner_all);
    fs::remove_all(locked);
  }
  // Full: a state larger than the disk's free space.
  o.dir = fs::temp_directory_path().string();
  Graph big;
  Builder bb(big);
  bb.parameter("w", Shape{{"n", 1}}, Init::zeros());
  bb.state("w.m", Shape{{"a", int64_t{1} << 31}, {"b", int64_t{1} << 20}});  // 8 PiB
  m = check_offload(big, o).message();
  EXPECT_NE(m.find("free; the optimizer state of this rank need"), std::string::npos) << m;
  EXPECT_NE(m.find("free space there or name a larger disk"), std::string::npos) << m;
  fs::remove_all(fs::path(file).parent_path());
}

// Through the CLI: config mistakes are one line and exit 2.
TEST(Offload, ConfigErrorsExit2) {
  const std::string dir = temp_dir("cli");
  auto run_with = [&](const json& offload) {
    const json doc = {{"model", small_gpt()},
                      {"data", {{"dataset", "fortunes"}}},
                      {"train", {{"steps", 1}, {"batch_size", 4}, {"seq_len", 16}}},
                      {"offload", offload}};
    const std::string cfg = dir + "/run.json";
    std::ofstream(cfg) << doc.dump();
    return testing::run_cli("train " + cfg + " --quiet");
  };
  testing::CliRun r = run_with({{"optimizer", "disk"}, {"dir", dir + "/missing"}});
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;
  r = run_with({{"optimizer", "disk"}});
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("needs offload.dir"), std::string::npos) << r.output;
  r = run_with({{"optimizer", "cpu"}, {"dir", dir}});
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("already lives in host memory"), std::string::npos) << r.output;
  r = run_with({{"optimizer", "nvme"}, {"dir", dir}});
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("\"disk\""), std::string::npos) << r.output;
  r = run_with({{"dir", dir}});
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("nothing is offloaded"), std::string::npos) << r.output;
  r = run_with({{"optimizer", "disk"}, {"dir", dir}});
  EXPECT_EQ(r.code, 0) << r.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshflow
