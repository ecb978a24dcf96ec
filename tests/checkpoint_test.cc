// Full-state sharded checkpoints (io/checkpoint.h, engine/state_checkpoint.h):
// a run stopped at step k and resumed equals the uninterrupted run bit for
// bit at every plan; a checkpoint loads into another plan and number of ranks
// and training goes on as if nothing switched; damaged or foreign
// checkpoints are refused with a message naming the file and the tensor, and
// change nothing.
#include "meshflow/io/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cli_run.h"
#include "meshflow/comm/communicator.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/config/json_reader.h"
#include "meshflow/engine/job.h"
#include "meshflow/engine/pipeline_trainer.h"
#include "meshflow/engine/trainer.h"
#include "meshflow/io/safetensors.h"
#include "meshflow/models/from_config.h"
#include "meshflow/models/hf_weights.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;

json small_gpt() {
  return {{"model_type", "gpt2"}, {"n_layer", 2},      {"n_embd", 64},
          {"n_head", 4},          {"n_positions", 64}, {"vocab_size", 256},
          {"resid_pdrop", 0.1},   {"embd_pdrop", 0.1}, {"tie_word_embeddings", true}};
}

json small_resnet() {
  return {{"model_type", "resnet"},  {"num_channels", 1}, {"embedding_size", 8},
          {"hidden_sizes", {8, 16}}, {"depths", {1, 1}},  {"layer_type", "basic"},
          {"num_labels", 10},        {"image_size", 28}};
}

RunConfig run_config(const json& model, const json& parallel, int steps,
                     const json& train_extra = json::object()) {
  const bool lm = model.contains("n_layer");
  json train = {{"steps", steps}, {"batch_size", 8}, {"eval_batches", 2}, {"seed", 3}};
  if (lm) train["seq_len"] = 32;
  for (const auto& [k, v] : train_extra.items()) train[k] = v;
  json doc = {
      {"model", model},
      {"data", {{"dataset", lm ? "fortunes" : "fashion_mnist"}}},
      {"train", train},
      {"optimizer", {{"type", "adamw"}, {"lr", 3e-3}, {"warmup_steps", 2}, {"grad_clip", 1.0}}}};
  if (!parallel.is_null()) doc["parallel"] = parallel;
  return value_or_throw(parse_run_config(doc, ""));
}

struct TrainRun {
  std::vector<float> losses;  // rank 0's, of the steps this run did
  float eval_loss = 0;
};

// `steps` steps (of train.steps = total) on `ranks` in-process ranks, after
// resuming from `resume` (when not empty); a full-state checkpoint under
// `save` at the end (when not empty).
Result<TrainRun> train(const RunConfig& rc, int ranks, int steps, const std::string& resume,
                       const std::string& save) {
  MF_ASSIGN_OR_RETURN(const Job job, resolve_job(rc, ranks));
  TrainRun out;
  auto body = [&](std::shared_ptr<Communicator> comm) -> Status {
    MF_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, make_engine(job, comm, nullptr, false));
    if (!resume.empty()) MF_RETURN_IF_ERROR(e->load_state(resume));
    std::vector<float> losses;
    for (int s = 0; s < steps; ++s) losses.push_back(e->step().loss);
    if (!save.empty()) MF_RETURN_IF_ERROR(e->save_state(save, 0));
    const EvalResult ev = e->evaluate();
    if (!comm || comm->rank() == 0) out.losses = losses, out.eval_loss = ev.loss;
    return Status::ok();
  };
  if (ranks == 1) {
    MF_RETURN_IF_ERROR(body(nullptr));
  } else {
    MF_RETURN_IF_ERROR(run_local_ranks(
        ranks, [&](const std::shared_ptr<Transport>& t) { return body(Communicator::world(t)); }));
  }
  return out;
}

std::string temp_dir(const std::string& tag) {
  const fs::path p =
      fs::temp_directory_path() / ("meshflow_ckpt_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p.string();
}

struct PlanCase {
  const char* name;
  json parallel;
  int ranks;
  json train = json::object();
};

// Each plan loads the checkpoint of step 2 in `dir` and trains steps 3 and 4:
// the losses of `whole`, the source plan's uninterrupted 4 steps.
void expect_continues(const json& gpt, const std::vector<PlanCase>& targets, const std::string& dir,
                      const TrainRun& whole) {
  for (const PlanCase& c : targets) {
    SCOPED_TRACE(c.name);
    Result<TrainRun> r = train(run_config(gpt, c.parallel, 4), c.ranks, 2, dir, "");
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_NEAR(r->losses[0], whole.losses[2], 2e-5 * std::abs(whole.losses[2]));
    EXPECT_NEAR(r->losses[1], whole.losses[3], 2e-5 * std::abs(whole.losses[3]));
  }
}

// Every plan: 2 steps, a checkpoint, a new engine resuming it for 2 more:
// the losses (dropout on) and the held-out loss equal the 4 uninterrupted
// steps' exactly.
TEST(Checkpoint, ResumeIsBitIdenticalAtEveryPlan) {
  const json pipe = {{"stages", 2}, {"schedule", "1f1b"}, {"micro_batches", 2}};
  const std::vector<PlanCase> cases = {
      {"one rank", nullptr, 1},
      {"dp2", {{"mode", "data"}}, 2},
      {"tp2", {{"mode", "semi"}, {"mesh", "dp=1,tp=2"}, {"preset", "megatron"}}, 2},
      {"tp2-sp", {{"mode", "semi"}, {"mesh", "dp=1,tp=2"}, {"preset", "megatron-sp"}}, 2},
      {"cp2-ulysses", {{"mode", "semi"}, {"mesh", "dp=1,cp=2"}, {"preset", "ulysses"}}, 2},
      {"dp2-zero1", {{"mode", "semi"}, {"mesh", "dp=2"}, {"preset", "dp"}, {"zero", 1}}, 2},
      {"dp2-zero2", {{"mode", "semi"}, {"mesh", "dp=2"}, {"preset", "dp"}, {"zero", 2}}, 2},
      {"dp2-zero3", {{"mode", "semi"}, {"mesh", "dp=2"}, {"preset", "dp"}, {"zero", 3}}, 2},
      // Weights grouping: each optimizer state on its owner alone, who writes it.
      {"dp4-zero1-group", {{"mode", "data"}, {"zero", 1}, {"zero_style", "group"}}, 4},
      {"recompute-mb2", nullptr, 1, {{"recompute", "full"}, {"micro_batches", 2}}},
      {"pp2-1f1b", {{"pipeline", pipe}}, 2},
      {"pp2-zb-dp2",
       {{"mode", "semi"},
        {"mesh", "dp=2"},
        {"preset", "dp"},
        {"pipeline", {{"stages", 2}, {"schedule", "zb-h1"}, {"micro_batches", 2}}}},
       4},
  };
  for (const PlanCase& c : cases) {
    SCOPED_TRACE(c.name);
    const RunConfig rc = run_config(small_gpt(), c.parallel, 4, c.train);
    const std::string dir = temp_dir(c.name[0] == 'p' ? "pp" : "plan");
    Result<TrainRun> whole = train(rc, c.ranks, 4, "", "");
    ASSERT_TRUE(whole.is_ok()) << whole.status().message();
    Result<TrainRun> first = train(rc, c.ranks, 2, "", dir);
    ASSERT_TRUE(first.is_ok()) << first.status().message();
    Result<TrainRun> second = train(rc, c.ranks, 2, dir, "");
    ASSERT_TRUE(second.is_ok()) << second.status().message();
    ASSERT_EQ(whole->losses.size(), 4u);
    EXPECT_EQ(first->losses[0], whole->losses[0]);
    EXPECT_EQ(first->losses[1], whole->losses[1]);
    EXPECT_EQ(second->losses[0], whole->losses[2]);
    EXPECT_EQ(second->losses[1], whole->losses[3]);
    EXPECT_EQ(second->eval_loss, whole->eval_loss);
    EXPECT_NE(first->losses[1], whole->losses[3]);  // the steps differ: the test can fail
    fs::remove_all(dir);
  }
}

// Batch norm's running statistics are buffers of the checkpoint: the
// held-out loss (eval mode reads them) after a resume equals the run's.
TEST(Checkpoint, ResumeKeepsBatchNormStatistics) {
  const RunConfig rc = run_config(small_resnet(), json{{"mode", "data"}}, 4);
  const std::string dir = temp_dir("bn");
  Result<TrainRun> whole = train(rc, 2, 4, "", "");
  ASSERT_TRUE(whole.is_ok()) << whole.status().message();
  ASSERT_TRUE(train(rc, 2, 2, "", dir).is_ok());
  Result<TrainRun> second = train(rc, 2, 2, dir, "");
  ASSERT_TRUE(second.is_ok()) << second.status().message();
  EXPECT_EQ(second->losses[1], whole->losses[3]);
  EXPECT_EQ(second->eval_loss, whole->eval_loss);
  Result<CheckpointManifest> m = open_checkpoint(dir);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  int buffers = 0;
  for (const auto& [name, t] : m->tensors) buffers += t.kind == "buffer";
  // Running mean and variance of 6 batch norms: the stem's, two per basic
  // layer, the second stage's projection shortcut's.
  EXPECT_EQ(buffers, 2 * 6);
  fs::remove_all(dir);
}

// A checkpoint written by one plan loads into others (ranks, mesh, pipeline,
// ZeRO stage), each rank reading its blocks: the two steps after the switch
// equal the source plan's own within the float tolerance of another
// reduction order.
TEST(Checkpoint, LoadsIntoAnotherPlanAndTrainsOn) {
  // Without dropout: a pipeline's micro-batches draw other masks than one
  // batch does, which is the plan's difference, not the checkpoint's.
  json gpt = small_gpt();
  gpt["resid_pdrop"] = 0.0, gpt["embd_pdrop"] = 0.0;
  const json dp4_zero3 = {{"mode", "semi"}, {"mesh", "dp=4"}, {"preset", "dp"}, {"zero", 3}};
  const RunConfig src = run_config(gpt, dp4_zero3, 4);
  const std::string dir = temp_dir("reshard");
  Result<TrainRun> whole = train(src, 4, 4, "", "");
  ASSERT_TRUE(whole.is_ok()) << whole.status().message();
  ASSERT_TRUE(train(src, 4, 2, "", dir).is_ok());
  const std::vector<PlanCase> targets = {
      {"tp2 x dp2", {{"mode", "semi"}, {"mesh", "dp=2,tp=2"}, {"preset", "megatron"}}, 4},
      {"dp2 zero1", {{"mode", "semi"}, {"mesh", "dp=2"}, {"preset", "dp"}, {"zero", 1}}, 2},
      {"dp4 zero1 group", {{"mode", "data"}, {"zero", 1}, {"zero_style", "group"}}, 4},
      {"pp2", {{"pipeline", {{"stages", 2}, {"schedule", "1f1b"}, {"micro_batches", 2}}}}, 2},
      {"one rank", nullptr, 1},
  };
  expect_continues(gpt, targets, dir, *whole);
  // And back: a pipeline's checkpoint into one rank.
  const RunConfig pp = run_config(gpt, targets[2].parallel, 4);
  const std::string dir2 = temp_dir("reshard_pp");
  ASSERT_TRUE(train(pp, 2, 2, dir, dir2).is_ok());
  Result<TrainRun> back = train(run_config(gpt, nullptr, 6), 1, 1, dir2, "");
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_TRUE(std::isfinite(back->losses[0]));
  fs::remove_all(dir);
  fs::remove_all(dir2);
}

// A weights-grouping checkpoint (each optimizer state written whole by its
// owner) holds every state once and loads into plans that shard or replicate
// the state, and into another grouping: the next two steps equal the source
// plan's own.
TEST(Checkpoint, WeightGroupsCheckpointLoadsIntoOtherPlans) {
  json gpt = small_gpt();
  gpt["resid_pdrop"] = 0.0, gpt["embd_pdrop"] = 0.0;
  const json group4 = {{"mode", "data"}, {"zero", 1}, {"zero_style", "group"}};
  const RunConfig src = run_config(gpt, group4, 4);
  const std::string dir = temp_dir("groups");
  Result<TrainRun> whole = train(src, 4, 4, "", "");
  ASSERT_TRUE(whole.is_ok()) << whole.status().message();
  ASSERT_TRUE(train(src, 4, 2, "", dir).is_ok());
  Result<CheckpointManifest> m = open_checkpoint(dir);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  int params = 0, states = 0;
  for (const auto& [name, t] : m->tensors) {
    params += t.kind == "parameter";
    states += t.kind == "optimizer";
  }
  EXPECT_EQ(states, 2 * params);  // AdamW's two moments of every parameter
  const std::vector<PlanCase> targets = {
      {"dp2 zero1 shard", {{"mode", "semi"}, {"mesh", "dp=2"}, {"preset", "dp"}, {"zero", 1}}, 2},
      {"dp2 group", {{"mode", "data"}, {"zero", 1}, {"zero_style", "group"}}, 2},
      {"one rank", nullptr, 1},
  };
  expect_continues(gpt, targets, dir, *whole);
  fs::remove_all(dir);
}

// ---- damaged, foreign and interrupted checkpoints ----

class CheckpointFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir("faults");
    rc_ = run_config(small_gpt(), json{{"mode", "data"}}, 4);
    ASSERT_TRUE(train(rc_, 2, 1, "", dir_).is_ok());
    step_ = checkpoint_dir(dir_, 1);
    shard_ = (fs::path(step_) / "rank-00000.safetensors").string();
  }
  void TearDown() override { fs::remove_all(dir_); }
  // The load's error (empty when it loaded), and that a failed load changed
  // nothing: the engine's next loss is a fresh run's first.
  std::string load_error(const RunConfig& rc, int ranks = 2) {
    Result<TrainRun> r = train(rc, ranks, 1, dir_, "");
    return r.is_ok() ? "" : r.status().message();
  }
  std::string dir_, step_, shard_;
  RunConfig rc_;
};

// The manifest records the run: its whole config (as parsed, the model
// inlined), the plan, the step and the data cursor.
TEST_F(CheckpointFaults, ManifestRecordsTheRunsConfig) {
  const json m = json::parse(std::ifstream((fs::path(step_) / "manifest.json").string()));
  const json& info = m.at("info");
  EXPECT_EQ(info.at("config").at("train").at("batch_size"), 8);
  EXPECT_EQ(info.at("config").at("optimizer").at("type"), "adamw");
  EXPECT_EQ(info.at("config").at("parallel").at("mode"), "data");
  EXPECT_EQ(info.at("config").at("model"), small_gpt());
  EXPECT_EQ(info.at("schedule").at("step"), 1);
  EXPECT_EQ(info.at("data").at("examples_seen"), 8);
  EXPECT_FALSE(info.at("plan").get<std::string>().empty());
}

TEST_F(CheckpointFaults, CorruptShardIsRefusedNamingFileAndTensor) {
  {
    std::fstream f(shard_, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(shard_) - 100));
    const char junk[4] = {0x11, 0x22, 0x33, 0x44};
    f.write(junk, 4);
  }
  const std::string e = load_error(rc_);
  EXPECT_NE(e.find("rank-00000.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("is corrupt (CRC-32"), std::string::npos) << e;
  // The failed load changed nothing: the tensors read before the corrupt one
  // are not in the model either, nor is the step.
  auto t = value_or_throw(Trainer::create(run_config(small_gpt(), nullptr, 4)));
  std::map<std::string, Tensor> before;  // copies: one rank's map shares the executor's buffers
  for (const auto& [name, w] : value_or_throw(t->gather_parameters())) before[name] = w.clone();
  EXPECT_FALSE(t->load_state(dir_).is_ok());
  const std::map<std::string, Tensor> after = value_or_throw(t->gather_parameters());
  for (const auto& [name, w] : before)
    EXPECT_EQ(std::memcmp(w.raw(), after.at(name).raw(), w.nbytes()), 0) << name;
  EXPECT_EQ(t->steps_done(), 0);
  testing::CliRun v = testing::run_cli("checkpoint inspect " + dir_ + " --verify");
  EXPECT_EQ(v.code, 2) << v.output;
  EXPECT_NE(v.output.find("files are damaged: 'rank-00000.safetensors' is corrupt"),
            std::string::npos)
      << v.output;
}

TEST_F(CheckpointFaults, TruncatedOrMissingShardIsRefused) {
  fs::resize_file(shard_, fs::file_size(shard_) / 2);
  std::string e = load_error(rc_);
  EXPECT_NE(e.find("'rank-00000.safetensors' has"), std::string::npos) << e;
  EXPECT_NE(e.find("(truncated or replaced)"), std::string::npos) << e;
  fs::remove(shard_);
  e = load_error(rc_);
  EXPECT_NE(e.find("'rank-00000.safetensors' (listed in the manifest) is missing"),
            std::string::npos)
      << e;
}

TEST_F(CheckpointFaults, BadManifestsAreRefused) {
  const std::string manifest = (fs::path(step_) / "manifest.json").string();
  const json good = json::parse(std::ifstream(manifest));
  auto with = [&](const json& m) {
    std::ofstream(manifest) << m.dump();
    return load_error(rc_);
  };
  std::ofstream(manifest) << "{not json";
  EXPECT_NE(load_error(rc_).find("manifest.json is not valid JSON"), std::string::npos);
  json m = good;
  m["version"] = 7;
  EXPECT_NE(with(m).find("version 7 (this build reads version 1)"), std::string::npos);
  m = good;
  m["tensors"]["wte.weight"]["blocks"][0]["ranges"][0] = {0, 100000};
  EXPECT_NE(with(m).find("is not inside dim 0"), std::string::npos) << with(m);
  m = good;
  m["tensors"]["wte.weight"]["blocks"][0]["file"] = "elsewhere.safetensors";
  EXPECT_NE(with(m).find("which \"files\" does not list"), std::string::npos) << with(m);
  m = good;
  m["tensors"]["wte.weight"]["shape"] = {512, 64};
  EXPECT_NE(with(m).find("'wte.weight' is [vocab=512,hidden=64] in the checkpoint but "
                         "[vocab=256,hidden=64] in the model"),
            std::string::npos)
      << with(m);
  m = good;
  m["format"] = "something else";
  EXPECT_NE(with(m).find("\"format\" is not \"meshflow-checkpoint\""), std::string::npos);
}

TEST_F(CheckpointFaults, AnotherModelsCheckpointIsRefused) {
  json bigger = small_gpt();
  bigger["n_embd"] = 128;
  std::string e = load_error(run_config(bigger, json{{"mode", "data"}}, 4));
  EXPECT_NE(e.find("in the checkpoint but"), std::string::npos) << e;
  json deeper = small_gpt();
  deeper["n_layer"] = 3;
  e = load_error(run_config(deeper, json{{"mode", "data"}}, 4));
  EXPECT_NE(e.find("has no parameter 'h.2."), std::string::npos) << e;
  json shallower = small_gpt();
  shallower["n_layer"] = 1;
  e = load_error(run_config(shallower, json{{"mode", "data"}}, 4));
  EXPECT_NE(e.find("which this model and optimizer do not have"), std::string::npos) << e;
  const RunConfig resnet = run_config(small_resnet(), nullptr, 4);
  e = load_error(resnet, 1);
  EXPECT_NE(e.find("which this model and optimizer do not have"), std::string::npos) << e;
}

TEST_F(CheckpointFaults, InterruptedSavesAndKeepCheckpoints) {
  // A crashed save's staging directory and a step directory without its
  // manifest are not checkpoints: the latest complete one is opened.
  fs::create_directories(fs::path(dir_) / ".step-00000009.partial");
  fs::create_directories(fs::path(dir_) / "step-00000010");
  Result<CheckpointManifest> m = open_checkpoint(dir_);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_EQ(m->step, 1);
  EXPECT_EQ(list_checkpoints(dir_).size(), 1u);
  // Saves beyond keep_checkpoints remove the oldest, after the new is in place.
  const RunConfig keep2 = run_config(small_gpt(), json{{"mode", "data"}}, 8);
  const Job job = value_or_throw(resolve_job(keep2, 1));
  std::unique_ptr<Engine> e = value_or_throw(make_engine(job, nullptr, nullptr, false));
  ASSERT_TRUE(e->load_state(dir_).is_ok());
  for (int s = 0; s < 3; ++s) {
    e->step();
    ASSERT_TRUE(e->save_state(dir_, 2).is_ok());
  }
  const std::vector<std::string> left = list_checkpoints(dir_);
  ASSERT_EQ(left.size(), 2u);
  EXPECT_EQ(fs::path(left[0]).filename(), "step-00000003");
  EXPECT_EQ(fs::path(left[1]).filename(), "step-00000004");
  // A save that cannot write (a file where the checkpoint root should be)
  // is an error naming it, and leaves the others as they were.
  const std::string blocked = (fs::path(dir_) / "blocked").string();
  std::ofstream(blocked) << "x";
  Status s = e->save_state(blocked, 0);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("'" + blocked + "' is a file"), std::string::npos) << s.message();
  EXPECT_EQ(list_checkpoints(dir_).size(), 2u);
}

// ---- the command line ----

// Sets MESHFLOW_INJECT_FAULT for the scope (engine/faults.h).
struct InjectFault {
  explicit InjectFault(const char* spec) { ::setenv("MESHFLOW_INJECT_FAULT", spec, 1); }
  ~InjectFault() { ::unsetenv("MESHFLOW_INJECT_FAULT"); }
};

TEST(CheckpointCli, ResumeLatestContinuesAndKillDuringSaveKeepsThePrevious) {
  const std::string dir = temp_dir("cli");
  const std::string cfg = testing::source_dir() + "/configs/fashion_mlp.json";
  const std::string common = "train " + cfg +
                             " --set train.log_every=1 --set train.eval_batches=1 "
                             "--set train.save_every=2 --checkpoint " +
                             dir;
  testing::CliRun a = testing::run_cli(common + " --steps 4 --ranks 2");
  ASSERT_EQ(a.code, 0) << a.output;
  EXPECT_NE(a.output.find("wrote checkpoint " + dir + "/step-00000004"), std::string::npos)
      << a.output;
  // A job killed while saving step 6: the checkpoint of step 4 stays the latest.
  ::setenv("MESHFLOW_INJECT_FAULT", "1:6:save", 1);
  testing::CliRun k = testing::run_cli(common + " --steps 8 --ranks 2 --resume latest");
  ::unsetenv("MESHFLOW_INJECT_FAULT");
  EXPECT_EQ(k.code, 128 + 9) << k.output;  // SIGKILL
  EXPECT_TRUE(fs::exists(fs::path(dir) / ".step-00000006.partial"));
  Result<CheckpointManifest> m = open_checkpoint(dir);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_EQ(m->step, 4);
  testing::CliRun r = testing::run_cli(common + " --steps 8 --ranks 2 --resume latest");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + dir + " at step 4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 5/8"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 4/8"), std::string::npos) << r.output;
  // Export the model; --init takes it.
  const std::string exported = dir + "/exported.safetensors";
  testing::CliRun x = testing::run_cli("checkpoint export " + dir + " --to " + exported);
  ASSERT_EQ(x.code, 0) << x.output;
  testing::CliRun i = testing::run_cli("train " + cfg + " --steps 1 --quiet --init " + exported);
  EXPECT_EQ(i.code, 0) << i.output;
  testing::CliRun insp = testing::run_cli("checkpoint inspect " + dir + " --verify");
  EXPECT_EQ(insp.code, 0) << insp.output;
  EXPECT_NE(insp.output.find("step 8"), std::string::npos) << insp.output;
  fs::remove_all(dir);
}

// Losses by step from a --metrics file (the last record of a step wins).
std::map<int, std::string> metric_losses(const std::string& path) {
  std::map<int, std::string> out;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) {
    const json j = json::parse(line);
    if (j.contains("step") && j.contains("loss")) out[j["step"].get<int>()] = j["loss"].dump();
  }
  return out;
}

// train.async_save: the save_every checkpoints are written in the background
// and committed at a later step boundary; they resume bit-identically, and a
// rank killed while writing one leaves the previous one the latest.
TEST(CheckpointCli, AsyncSaveResumesBitIdenticallyAndKillKeepsThePrevious) {
  const std::string dir = temp_dir("async");
  fs::create_directories(dir);
  const std::string cfg = testing::source_dir() + "/configs/fashion_mlp.json";
  const std::string common = "train " + cfg + " --ranks 2 --set train.log_every=1 ";
  ASSERT_EQ(testing::run_cli(common + "--steps 6 --quiet --metrics " + dir + "/ref.jsonl").code, 0);
  const std::map<int, std::string> ref = metric_losses(dir + "/ref.jsonl");
  const std::string saving = common +
                             "--set train.save_every=1 --set train.async_save=true "
                             "--checkpoint " +
                             dir + "/ck ";
  testing::CliRun a = testing::run_cli(saving + "--steps 4");
  ASSERT_EQ(a.code, 0) << a.output;
  EXPECT_NE(a.output.find("wrote checkpoint " + dir + "/ck/step-00000001 (in the background)"),
            std::string::npos)
      << a.output;
  EXPECT_NE(a.output.find("wrote checkpoint " + dir + "/ck/step-00000004"), std::string::npos);
  for (int s = 1; s <= 4; ++s) EXPECT_TRUE(open_checkpoint(checkpoint_dir(dir + "/ck", s)).is_ok());
  // From step 2 (written in the background): the uninterrupted run's losses.
  testing::CliRun r = testing::run_cli(saving + "--steps 6 --quiet --metrics " + dir +
                                       "/r.jsonl --resume " + checkpoint_dir(dir + "/ck", 2));
  ASSERT_EQ(r.code, 0) << r.output;
  const std::map<int, std::string> resumed = metric_losses(dir + "/r.jsonl");
  for (int s = 3; s <= 6; ++s) EXPECT_EQ(resumed.at(s), ref.at(s)) << "step " << s;
  // Killed while writing step 2 in the background: step 1 stays the latest.
  fs::remove_all(dir + "/ck");
  ::setenv("MESHFLOW_INJECT_FAULT", "1:2:save", 1);
  testing::CliRun k = testing::run_cli(saving + "--steps 4");
  ::unsetenv("MESHFLOW_INJECT_FAULT");
  EXPECT_EQ(k.code, 128 + 9) << k.output;  // SIGKILL
  Result<CheckpointManifest> m = open_checkpoint(dir + "/ck");
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_EQ(m->step, 1);
  fs::remove_all(dir);
}

// A rank that fails mid-run (rank 1 throws before the 4th step): with
// --max-restarts the job restarts from its step-2 checkpoint and ends with
// the uninterrupted run's losses; --elastic restarts it on fewer ranks.
TEST(CheckpointCli, MaxRestartsResumeFromTheLatestCheckpoint) {
  const std::string dir = temp_dir("restart");
  fs::create_directories(dir);
  const std::string cfg = testing::source_dir() + "/configs/fashion_mlp.json";
  const std::string common =
      "train " + cfg + " --steps 6 --ranks 2 --quiet --set train.log_every=1 ";
  ASSERT_EQ(testing::run_cli(common + "--metrics " + dir + "/ref.jsonl").code, 0);
  const std::map<int, std::string> ref = metric_losses(dir + "/ref.jsonl");
  const std::string saving = common + "--set train.save_every=2 --checkpoint " + dir + "/ck ";
  const InjectFault fault("1:3:throw");
  testing::CliRun none = testing::run_cli(saving);
  EXPECT_EQ(none.code, 1) << none.output;
  fs::remove_all(dir + "/ck");
  testing::CliRun r = testing::run_cli(saving + "--max-restarts 1 --metrics " + dir + "/r.jsonl");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("restart 1 of 1 from its latest checkpoint (" + dir +
                          "/ck/step-00000002) on 2 ranks"),
            std::string::npos)
      << r.output;
  const std::map<int, std::string> got = metric_losses(dir + "/r.jsonl");
  ASSERT_EQ(got.size(), 6u);
  for (int step = 1; step <= 6; ++step) EXPECT_EQ(got.at(step), ref.at(step)) << step;
  fs::remove_all(dir + "/ck");
  testing::CliRun e = testing::run_cli(saving + "--max-restarts 1 --elastic");
  EXPECT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("on 1 rank\n"), std::string::npos) << e.output;
  testing::CliRun bad = testing::run_cli(common + "--elastic");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--elastic restarts: give --max-restarts"), std::string::npos);
  fs::remove_all(dir);
}

TEST(CheckpointCli, BadResumeRequestsExit2) {
  const std::string cfg = testing::source_dir() + "/configs/fashion_mlp.json";
  const std::string dir = temp_dir("cli_bad");
  struct Bad {
    std::string args, says;
  };
  const std::vector<Bad> bad = {
      {"--resume latest", "--resume latest needs train.checkpoint"},
      {"--resume " + dir + "/none", "does not exist"},
      {"--resume " + dir + " --init x.safetensors", "--resume and --init"},
      {"--resume latest --checkpoint w.safetensors", "is a weights file"},
      {"--resume " + cfg, "is a file, not a checkpoint directory"},
  };
  fs::create_directories(dir);
  for (const Bad& b : bad) {
    testing::CliRun r = testing::run_cli("train " + cfg + " --steps 1 " + b.args);
    EXPECT_EQ(r.code, 2) << b.args << ": " << r.output;
    EXPECT_NE(r.output.find(b.says), std::string::npos) << b.args << ": " << r.output;
  }
  testing::CliRun done =
      testing::run_cli("train " + cfg + " --steps 2 --quiet --checkpoint " + dir);
  ASSERT_EQ(done.code, 0) << done.output;
  testing::CliRun again = testing::run_cli("train " + cfg + " --steps 2 --resume " + dir);
  EXPECT_EQ(again.code, 2) << again.output;
  EXPECT_NE(again.output.find("is at step 2, train.steps is 2"), std::string::npos) << again.output;
  fs::remove_all(dir);
}

// ---- Hugging Face names (models/hf_weights.h; against PyTorch: tests/torch/hf_check.py) ----

// A checkpoint exported in transformers' names loads back (--init) to the
// same weights as the one in meshflow's names; a file of another size is
// refused naming the transformers tensor.
TEST(HfWeights, ExportInTransformersNamesAndInitFromIt) {
  const std::string dir = temp_dir("hf");
  const std::string cfg = testing::source_dir() + "/configs/gpt_fortunes.json";
  testing::CliRun t = testing::run_cli("train " + cfg +
                                       " --steps 1 --quiet --set train.eval_batches=1 "
                                       "--checkpoint " +
                                       dir);
  ASSERT_EQ(t.code, 0) << t.output;
  const std::string plain = dir + "/plain.safetensors", hf = dir + "/hf.safetensors";
  ASSERT_EQ(testing::run_cli("checkpoint export " + dir + " --to " + plain).code, 0);
  testing::CliRun x = testing::run_cli("checkpoint export " + dir + " --to " + hf + " --hf");
  ASSERT_EQ(x.code, 0) << x.output;
  const SafetensorsFile h = value_or_throw(read_safetensors(hf));
  EXPECT_TRUE(h.tensors.count("transformer.h.0.attn.c_attn.weight"));
  EXPECT_FALSE(h.tensors.count("h.0.attn.q_proj.weight"));
  const RunConfig rc = value_or_throw(load_run_config(cfg, {"train.steps=1"}));
  auto trainer = value_or_throw(Trainer::create(rc));
  ASSERT_TRUE(trainer->load_checkpoint(hf).is_ok());
  const SafetensorsFile p = value_or_throw(read_safetensors(plain));
  for (const auto& [name, w] : value_or_throw(trainer->gather_parameters())) {
    ASSERT_TRUE(p.tensors.count(name)) << name;
    EXPECT_EQ(std::memcmp(w.raw(), p.tensors.at(name).raw(), w.nbytes()), 0) << name;
  }
  // Another width: the transformers tensor is named.
  json wide = value_or_throw(
      read_json_file(testing::source_dir() + "/configs/models/gpt_bytes_small.json"));
  wide["n_embd"] = 128;
  const std::string wide_path = dir + "/wide.json";
  std::ofstream(wide_path) << wide.dump();
  testing::CliRun wrong =
      testing::run_cli("train " + cfg + " --steps 1 --set model=" + wide_path + " --init " + hf);
  EXPECT_EQ(wrong.code, 2) << wrong.output;
  EXPECT_NE(wrong.output.find("Hugging Face weights: tensor 'transformer."), std::string::npos)
      << wrong.output;
  fs::remove_all(dir);
}

// The mapping's refusals, on a state dict made from a real model's parameters.
TEST(HfWeights, MismatchedStateDictsAreRefused) {
  const ModelConfig model = value_or_throw(parse_model_config(small_gpt()));
  ModelGraph m = value_or_throw(build_model(model, 2, 8));
  std::map<std::string, Shape> shapes;
  std::map<std::string, Tensor> ours;
  for (ValueId v : m.graph.parameters()) {
    const std::string& name = m.graph.value(v).name;
    shapes.emplace(name, m.graph.shape(v));
    Tensor t(m.graph.shape(v), DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 0.001f * static_cast<float>(i);
    ours.emplace(name, t);
  }
  const auto hf_list = value_or_throw(to_hf_state_dict(model, ours));
  const std::map<std::string, Tensor> hf(hf_list.begin(), hf_list.end());
  ASSERT_TRUE(is_hf_state_dict(model, hf));
  EXPECT_FALSE(is_hf_state_dict(model, ours));
  ASSERT_TRUE(from_hf_state_dict(model, hf, shapes).is_ok());
  auto with = [&](const std::string& name, const Tensor& t) {
    std::map<std::string, Tensor> d = hf;
    d[name] = t;
    Result<std::map<std::string, Tensor>> r = from_hf_state_dict(model, d, shapes);
    return r.is_ok() ? std::string() : r.status().message();
  };
  Tensor other = hf.at("transformer.wte.weight").clone();
  other.data<float>()[0] += 1;
  EXPECT_NE(with("lm_head.weight", other)
                .find("'lm_head.weight' differs from "
                      "'transformer.wte.weight' but the model ties them"),
            std::string::npos);
  EXPECT_EQ(with("lm_head.weight", hf.at("transformer.wte.weight")), "");  // tied: the same
  EXPECT_NE(with("transformer.h.7.mlp.c_fc.weight", other).find("matches no parameter"),
            std::string::npos);
  std::map<std::string, Tensor> missing = hf;
  missing.erase("transformer.h.1.attn.c_attn.bias");
  Result<std::map<std::string, Tensor>> r = from_hf_state_dict(model, missing, shapes);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("'transformer.h.1.attn.c_attn.bias' (meshflow's "
                                      "'h.1.attn.q_proj.bias') is missing"),
            std::string::npos)
      << r.status().message();
  const ModelConfig resnet = value_or_throw(parse_model_config(small_resnet()));
  EXPECT_FALSE(to_hf_state_dict(resnet, ours).is_ok());
}

// ---- non-finite steps (train.on_nonfinite) ----

std::map<std::string, Tensor> weights(Trainer& t) {
  std::map<std::string, Tensor> out;  // copies: one rank's map shares the executor's buffers
  for (const auto& [name, w] : value_or_throw(t.gather_parameters())) out[name] = w.clone();
  return out;
}

bool same(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  for (const auto& [name, w] : a)
    if (std::memcmp(w.raw(), b.at(name).raw(), w.nbytes()) != 0) return false;
  return true;
}

// The message of the StatusError `step` stops the run with ("" and a failure
// when it does not stop).
template <typename F>
std::string stop_message(F&& step, const char* what) {
  try {
    step();
  } catch (const StatusError& e) {
    return e.status().message();
  }
  ADD_FAILURE() << what << " did not stop the run";
  return "";
}

TEST(NonFinite, StopNamesTheStepAndTheFirstParameter) {
  const InjectFault nan("0:1:nan");  // rank 0's gradients are NaN in the second step
  auto t = value_or_throw(Trainer::create(run_config(small_gpt(), nullptr, 4)));
  EXPECT_FALSE(t->step().skipped);
  const auto before = weights(*t);
  std::string m = stop_message([&] { t->step(); }, "a non-finite step");
  EXPECT_NE(m.find("step 2: the gradient of '"), std::string::npos) << m;
  EXPECT_NE(m.find("train.on_nonfinite"), std::string::npos) << m;
  // The NaN seed enters the backward: the first non-finite value is there.
  EXPECT_NE(m.find("; the first non-finite value: node '"), std::string::npos) << m;
  EXPECT_NE(m.find(", backward) of micro-batch 0 on rank 0"), std::string::npos) << m;
  EXPECT_TRUE(same(before, weights(*t)));  // stopped before any update
  // A NaN weight in block 1: the loss is NaN, and the first non-finite value
  // is a forward node of block 1.
  auto t2 = value_or_throw(Trainer::create(run_config(small_gpt(), nullptr, 4)));
  const Graph& g2 = t2->program_graph();
  t2->executor().storage(g2.find("h.1.mlp.c_fc.weight")).data<float>()[0] = std::nanf("");
  m = stop_message([&] { t2->step(); }, "a NaN weight");
  EXPECT_NE(m.find("step 1: the loss is nan"), std::string::npos) << m;
  EXPECT_NE(m.find("the first non-finite value: node 'h.1."), std::string::npos) << m;
  EXPECT_NE(m.find(", forward) of micro-batch 0"), std::string::npos) << m;
  // Four micro-batches, the third poisoned alone: the gradients it adds are
  // NaN, and the replay names that micro-batch, not the first.
  {
    const InjectFault nan_micro("0:1:nan@2");
    auto t3 = value_or_throw(
        Trainer::create(run_config(small_gpt(), nullptr, 4, json{{"micro_batches", 4}})));
    EXPECT_FALSE(t3->step().skipped);
    m = stop_message([&] { t3->step(); }, "a NaN in the third micro-batch");
    EXPECT_NE(m.find("step 2: the gradient of '"), std::string::npos) << m;
    EXPECT_NE(m.find(", backward) of micro-batch 2 on rank 0"), std::string::npos) << m;
  }
  // Two data-parallel ranks (rank 1 poisoned): the reduced gradients are
  // NaN on both, both stop, nothing hangs.
  const InjectFault nan1("1:1:nan");
  const Job job =
      value_or_throw(resolve_job(run_config(small_gpt(), json{{"mode", "data"}}, 4), 2));
  Status s = run_local_ranks(2, [&](const std::shared_ptr<Transport>& tr) -> Status {
    MF_ASSIGN_OR_RETURN(auto e, make_engine(job, Communicator::world(tr), nullptr, false));
    e->step();
    e->step();
    return Status::ok();
  });
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("step 2: the gradient"), std::string::npos) << s.message();
}

TEST(NonFinite, SkipLeavesTheWeightsAndTrainsOn) {
  const InjectFault nan("0:1:nan");
  auto t = value_or_throw(
      Trainer::create(run_config(small_gpt(), nullptr, 4, json{{"on_nonfinite", "skip"}})));
  t->step();
  const auto before = weights(*t);
  const StepResult r = t->step();
  EXPECT_TRUE(r.skipped);
  EXPECT_NE(r.nonfinite.find("step 2: the gradient of '"), std::string::npos) << r.nonfinite;
  EXPECT_TRUE(same(before, weights(*t)));
  const StepResult next = t->step();  // no NaN left behind in the accumulators
  EXPECT_FALSE(next.skipped);
  EXPECT_TRUE(std::isfinite(next.loss) && std::isfinite(next.grad_norm));
  EXPECT_FALSE(same(before, weights(*t)));
  EXPECT_EQ(next.step, 3);
}

// A pipeline: the poisoned stage's squares reach every stage, which all skip.
TEST(NonFinite, PipelineStagesAllSkipTogether) {
  const InjectFault nan("1:1:nan");  // stage 1's gradients
  const json par = {{"pipeline", {{"stages", 2}, {"schedule", "1f1b"}, {"micro_batches", 2}}}};
  const Job job = value_or_throw(
      resolve_job(run_config(small_gpt(), par, 4, json{{"on_nonfinite", "skip"}}), 2));
  std::vector<int> skipped(2, 0);
  std::vector<float> after(2, 0.f);
  Status s = run_local_ranks(2, [&](const std::shared_ptr<Transport>& tr) -> Status {
    MF_ASSIGN_OR_RETURN(auto e, make_engine(job, Communicator::world(tr), nullptr, false));
    for (int i = 0; i < 3; ++i) {
      const StepResult r = e->step();
      skipped[static_cast<size_t>(tr->rank())] += r.skipped;
      after[static_cast<size_t>(tr->rank())] = r.loss;
    }
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(skipped[0], 1);
  EXPECT_EQ(skipped[1], 1);
  EXPECT_TRUE(std::isfinite(after[0]));
}

// A pipeline that stops names the earliest non-finite node over its stages
// (a replay of the step watching every node), the same on every rank.
TEST(NonFinite, PipelineStopNamesTheFirstNodeOverTheStages) {
  const json par = {{"pipeline", {{"stages", 2}, {"schedule", "1f1b"}, {"micro_batches", 2}}}};
  const Job job = value_or_throw(resolve_job(run_config(small_gpt(), par, 4), 2));
  // poison: "" (a NaN loss scale on stage 1: the backward's seed) or a NaN
  // weight of block 0, on stage 0 (its forward).
  auto stop = [&](const std::string& weight) {
    std::vector<std::string> messages(2);
    Status s = run_local_ranks(2, [&](const std::shared_ptr<Transport>& tr) -> Status {
      MF_ASSIGN_OR_RETURN(auto t, PipelineTrainer::create(job, Communicator::world(tr)));
      if (!weight.empty() && tr->rank() == 0) {
        const Graph& g = t->chunk_program(0).graph;
        t->executor(0).storage(g.find(weight)).data<float>()[0] = std::nanf("");
      }
      try {
        t->step();
      } catch (const StatusError& e) {
        messages[static_cast<size_t>(tr->rank())] = e.status().message();
      }
      return Status::ok();
    });
    EXPECT_TRUE(s.is_ok()) << s.message();
    EXPECT_EQ(messages[0], messages[1]);
    return messages[0];
  };
  {
    const InjectFault nan("1:0:nan");
    const std::string m = stop("");
    EXPECT_NE(m.find("step 1: the gradient of '"), std::string::npos) << m;
    EXPECT_NE(m.find(", backward) of micro-batch 0 in pipeline chunk 1 on rank 1"),
              std::string::npos)
        << m;
  }
  const std::string m = stop("h.0.mlp.c_fc.weight");
  EXPECT_NE(m.find("step 1: the loss is nan"), std::string::npos) << m;
  EXPECT_NE(m.find("the first non-finite value: node 'h.0."), std::string::npos) << m;
  EXPECT_NE(m.find(", forward) of micro-batch 0 in pipeline chunk 0 on rank 0"), std::string::npos)
      << m;
}

TEST(NonFinite, CommandLineStopsOrSkips) {
  const std::string cfg = testing::source_dir() + "/configs/fashion_mlp.json";
  const InjectFault nan("0:1:nan");
  testing::CliRun stop = testing::run_cli("train " + cfg + " --steps 3 --ranks 2");
  EXPECT_EQ(stop.code, 1) << stop.output;
  EXPECT_NE(stop.output.find("step 2: the gradient of '"), std::string::npos) << stop.output;
  testing::CliRun skip =
      testing::run_cli("train " + cfg + " --steps 3 --ranks 2 --set train.on_nonfinite=skip");
  EXPECT_EQ(skip.code, 0) << skip.output;
  EXPECT_NE(skip.output.find("skipped the update of step 2: the gradient of '"), std::string::npos)
      << skip.output;
  testing::CliRun bad = testing::run_cli("train " + cfg + " --steps 1 --set train.on_nonfinite=go");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("on_nonfinite"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace meshflow
