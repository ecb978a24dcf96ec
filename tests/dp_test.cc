// Data parallel = one device: N ranks (threads, local backend) training on
// 1/N of every batch each give the losses and weights of one rank training on
// the whole batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>

#include "grad_check.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/engine/job.h"
#include "meshflow/engine/trainer.h"
#include "meshflow/plan/auto_plan.h"
#include "meshflow/plan/cluster.h"
#include "scoped_env.h"

namespace meshflow {
namespace {

RunConfig dp_run(const std::string& model, int micro_batches, const std::string& optimizer) {
  json gpt = {{"model_type", "gpt2"}, {"n_layer", 2},      {"n_embd", 32},
              {"n_head", 2},          {"n_positions", 16}, {"vocab_size", 256}};
  json llama = {{"model_type", "llama"},    {"num_hidden_layers", 2},
                {"hidden_size", 32},        {"num_attention_heads", 4},
                {"num_key_value_heads", 2}, {"intermediate_size", 64},
                {"vocab_size", 256},        {"max_position_embeddings", 16}};
  json gpt_dropout = gpt;
  gpt_dropout["resid_pdrop"] = 0.1;
  gpt_dropout["embd_pdrop"] = 0.1;
  json doc = {{"model", model == "gpt"           ? gpt
                        : model == "gpt_dropout" ? gpt_dropout
                                                 : llama},
              {"data", {{"dataset", "fortunes"}}},
              {"train",
               {{"steps", 3},
                {"batch_size", 16},
                {"micro_batches", micro_batches},
                {"seq_len", 16},
                {"threads", 2},
                {"eval_batches", 2},
                {"bucket_mib", 0.01}}},
              {"optimizer",
               {{"type", optimizer}, {"lr", optimizer == "sgd" ? 0.1 : 1e-3}, {"momentum", 0.0}}}};
  if (optimizer == "sgd") doc["optimizer"]["momentum"] = 0.9;
  return value_or_throw(parse_run_config(doc, ""));
}

struct Trace {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> weights;
  float eval_loss = 0;
};

Trace train(const RunConfig& rc, std::shared_ptr<Communicator> comm) {
  Trace t;
  auto trainer = value_or_throw(Trainer::create(rc, comm));
  for (int s = 0; s < rc.train.steps; ++s) t.losses.push_back(trainer->step().loss);
  t.eval_loss = trainer->evaluate().loss;
  for (const auto& [name, w] : value_or_throw(trainer->gather_parameters()))
    t.weights[name].assign(w.data<float>(), w.data<float>() + w.numel());
  return t;
}

struct DpCase {
  std::string model, optimizer;
  int ranks, micro_batches;
};

class DataParallel : public ::testing::TestWithParam<DpCase> {};

// Tolerance: f32 sums of the same numbers in another order (per-rank means,
// then a ring all-reduce) differ at rounding level: 2e-5 relative.
TEST_P(DataParallel, SameLossesAndWeightsAsOneRank) {
  const DpCase& c = GetParam();
  RunConfig rc = dp_run(c.model, c.micro_batches, c.optimizer);
  Trace single = train(rc, nullptr);
  std::vector<Trace> per_rank(c.ranks);
  Status s = run_local_ranks(c.ranks, [&](const std::shared_ptr<Transport>& t) -> Status {
    per_rank[t->rank()] = train(rc, Communicator::world(t));
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.message();
  for (int r = 0; r < c.ranks; ++r) {
    const Trace& t = per_rank[r];
    ASSERT_EQ(t.losses.size(), single.losses.size());
    for (size_t i = 0; i < t.losses.size(); ++i)
      EXPECT_NEAR(t.losses[i], single.losses[i], 2e-5 * std::fabs(single.losses[i]))
          << "rank " << r << " step " << i;
    EXPECT_NEAR(t.eval_loss, single.eval_loss, 2e-5 * single.eval_loss) << "rank " << r;
    for (const auto& [name, w] : single.weights) {
      const std::vector<float>& got = t.weights.at(name);
      EXPECT_LT(testing::max_rel_diff(got.data(), w.data(), static_cast<int64_t>(w.size())), 2e-5)
          << name << " rank " << r;
      // Every rank holds bit-identical weights (they apply the same reduced gradient).
      EXPECT_EQ(got, per_rank[0].weights.at(name)) << name << " rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, DataParallel,
                         ::testing::Values(DpCase{"gpt", "sgd", 1, 1}, DpCase{"gpt", "sgd", 2, 1},
                                           DpCase{"gpt", "sgd", 4, 1}, DpCase{"gpt", "sgd", 8, 1},
                                           DpCase{"gpt", "sgd", 2, 2},
                                           DpCase{"llama", "adamw", 2, 1},
                                           DpCase{"llama", "adamw", 4, 2},
                                           // Dropout masks: each rank draws the global elements of
                                           // its rows, so they are the one-device masks.
                                           DpCase{"gpt_dropout", "sgd", 2, 1},
                                           DpCase{"gpt_dropout", "sgd", 4, 2}),
                         [](const auto& info) {
                           const DpCase& c = info.param;
                           return c.model + "_" + c.optimizer + "_" + std::to_string(c.ranks) +
                                  "ranks_" + std::to_string(c.micro_batches) + "micro";
                         });

TEST(DataParallelErrors, BatchThatDoesNotSplitAcrossRanks) {
  RunConfig rc = dp_run("gpt", 1, "sgd");
  rc.train.batch_size = 6;
  // As the CLI resolves it: in the user's terms.
  Result<Job> job = resolve_job(rc, 4);
  ASSERT_FALSE(job.is_ok());
  EXPECT_NE(job.status().message().find("train.batch_size=6"), std::string::npos)
      << job.status().message();
  EXPECT_NE(job.status().message().find("4 data-parallel replicas"), std::string::npos)
      << job.status().message();
  // The C++ API straight to the trainer resolves the same job: the same message.
  Status s = run_local_ranks(4, [&](const std::shared_ptr<Transport>& t) -> Status {
    return Trainer::create(rc, Communicator::world(t)).status();
  });
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find(job.status().message()), std::string::npos) << s.message();
}

// The partitioner ranks redistributions on the local cluster file's links
// (shared among the ranks, as the planner shares them), so the runtime makes
// the choices the planner priced; without the file, the defaults, and a note.
TEST(JobLinks, ReshardCostComesFromTheLocalClusterFile) {
  RunConfig rc = dp_run("gpt", 1, "sgd");
  rc.has_parallel = true;
  rc.parallel = value_or_throw(parse_strategy_config(
      json{{"mode", "semi"}, {"mesh", "dp=2,tp=2"}, {"preset", "megatron"}}, "parallel"));
  const Job job = value_or_throw(resolve_job(rc, 4));
  const plan::Cluster shared =
      value_or_throw(plan::share_machine(value_or_throw(plan::load_local_cluster()), 4));
  const ReshardCostModel want = plan::reshard_costs(shared, job.mesh);
  ASSERT_EQ(job.reshard_cost.axes.size(), 2u);
  for (int a = 0; a < 2; ++a) {
    EXPECT_EQ(job.reshard_cost.axes[a].bandwidth_bytes_per_s, want.axes[a].bandwidth_bytes_per_s);
    EXPECT_EQ(job.reshard_cost.axes[a].latency_s, want.axes[a].latency_s);
  }
  // Not the defaults: the file's links are a CPU's memory, not 50 GB/s.
  EXPECT_NE(job.reshard_cost.axes[0].bandwidth_bytes_per_s, Link{}.bandwidth_bytes_per_s);

  const Result<Job> without = [&] {
    testing::ScopedEnv missing("MESHFLOW_LOCAL_CLUSTER", "/nonexistent/cluster.json");
    return resolve_job(rc, 4);
  }();
  ASSERT_TRUE(without.is_ok()) << without.status().message();
  EXPECT_TRUE(without->reshard_cost.axes.empty());
  bool noted = false;
  for (const std::string& n : without->notes) noted |= n.find("default links") != std::string::npos;
  EXPECT_TRUE(noted);
}

// Data parallel is the partitioner's plan: its gradient all_reduces are run by
// the buckets (overlapped with the backward), not as nodes of the optimizer.
TEST(DataParallel, GradientReductionsRunInBuckets) {
  RunConfig rc = dp_run("gpt", 2, "sgd");
  Status s = run_local_ranks(2, [&](const std::shared_ptr<Transport>& t) -> Status {
    auto trainer = value_or_throw(Trainer::create(rc, Communicator::world(t)));
    const Graph& pg = trainer->program_graph();
    const std::vector<GradientSync> syncs = gradient_syncs(pg);
    EXPECT_EQ(syncs.size(), pg.grad_of_param.size());
    for (const GradientSync& sync : syncs)
      EXPECT_EQ(sync.reduce.size(), 1u) << pg.value(sync.grad).name;
    trainer->step();
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.message();
}

// Gradients Partial over dp and cp (context parallel beside data parallel):
// the reshard planner sums them with a reduce_scatter over one axis, an
// all_reduce over the other and an all_gather back. The buckets run those
// chains too (as all_reduces over both axes), overlapped with the backward.
TEST(DataParallel, GradientsOverDpAndCpRunInBuckets) {
  RunConfig rc = dp_run("gpt", 1, "sgd");
  rc.has_parallel = true;
  rc.parallel = value_or_throw(parse_strategy_config(
      json{{"mode", "semi"}, {"mesh", "dp=2,cp=2"}, {"preset", "ring"}}, "parallel"));
  std::mutex mu;
  int scattered = 0;
  Status s = run_local_ranks(4, [&](const std::shared_ptr<Transport>& t) -> Status {
    auto trainer = value_or_throw(Trainer::create(rc, Communicator::world(t)));
    const Graph& pg = trainer->program_graph();
    for (const GradientSync& sync : gradient_syncs(pg)) {
      const std::string& name = pg.value(sync.grad).name;
      int readers = 0;
      for (const Node& n : pg.nodes())
        readers += int(std::count(n.inputs.begin(), n.inputs.end(), sync.grad));
      if (readers > 1) continue;  // summed in the backward (wpe's zigzag gather)
      EXPECT_FALSE(sync.reduce.empty()) << name;
      if (sync.sums.empty()) {
        ADD_FAILURE() << name << ": no chain found";
        continue;
      }
      EXPECT_EQ(pg.shape(sync.sums.back()), pg.shape(sync.grad)) << name;
      std::vector<int> axes = sync.axes;
      std::sort(axes.begin(), axes.end());
      EXPECT_EQ(axes, (std::vector<int>{0, 1})) << name;  // dp and cp, once each
      bool rs = false;
      for (NodeId id : sync.reduce) rs |= pg.node(id).kind == OpKind::kReduceScatter;
      std::lock_guard<std::mutex> lock(mu);
      scattered += rs;
    }
    trainer->step();
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_GT(scattered, 0);  // the chains this test is about were there
}

// ZeRO on a mesh with cp shards over dp x cp: every rank of a dp=2, cp=2 run
// holds a quarter of a weight's optimizer state (as Megatron's distributed
// optimizer and the planner's model states: over dp * cp replicas).
TEST(DataParallel, ZeroShardsOverDpAndCp) {
  RunConfig rc = dp_run("gpt", 1, "adamw");
  rc.has_parallel = true;
  rc.parallel = value_or_throw(parse_strategy_config(
      json{{"mode", "semi"}, {"mesh", "dp=2,cp=2"}, {"preset", "ring"}, {"zero", 1}}, "parallel"));
  Status s = run_local_ranks(4, [&](const std::shared_ptr<Transport>& t) -> Status {
    auto trainer = value_or_throw(Trainer::create(rc, Communicator::world(t)));
    const Graph& pg = trainer->program_graph();
    int checked = 0;
    for (const Node& n : pg.nodes()) {
      if (n.kind != OpKind::kState) continue;
      const std::string& name = pg.value(n.outputs[0]).name;
      if (name != "h.0.mlp.c_fc.weight.exp_avg") continue;
      // c_fc.weight: [32, 128] whole.
      EXPECT_EQ(pg.shape(n.outputs[0]).numel(), 32 * 128 / 4) << name;
      ++checked;
    }
    EXPECT_EQ(checked, 1);
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.message();
}

TEST(DataParallelErrors, AFailingRankStopsTheOthers) {
  RunConfig rc = dp_run("gpt", 1, "sgd");
  rc.train.steps = 50;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<Status> per_rank;
  Status s = run_local_ranks(
      4,
      [&](const std::shared_ptr<Transport>& t) -> Status {
        auto trainer = value_or_throw(Trainer::create(rc, Communicator::world(t)));
        for (int i = 0; i < rc.train.steps; ++i) {
          if (t->rank() == 2 && i == 1) throw std::runtime_error("disk on fire");
          trainer->step();
        }
        return Status::ok();
      },
      {}, &per_rank);
  double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("rank 2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("disk on fire"), std::string::npos) << s.message();
  for (int r : {0, 1, 3}) {
    EXPECT_FALSE(per_rank[r].is_ok()) << "rank " << r << " finished although rank 2 died";
    EXPECT_NE(per_rank[r].message().find("rank 2"), std::string::npos) << per_rank[r].message();
  }
  EXPECT_LT(el, 30.0);
}

}  // namespace
}  // namespace meshflow
