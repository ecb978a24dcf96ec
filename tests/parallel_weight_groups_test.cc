// Weights grouping ("zero": 1, "zero_style": "group"; parallel/weight_groups.h):
// the groups are LPT-balanced, deterministic and cover every parameter once;
// each rank stores and updates only its group's optimizer state, then every
// parameter is broadcast from its owner. It trains like one device (and bit
// for bit like plain data parallel, whose updates it only moves); its
// optimizer memory per rank is its group's; bad plans are one-line errors;
// explain's per-step totals are what the trace records. Also the broadcast
// op itself (ops/collective.cc) on in-process ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include "cli_run.h"
#include "grad_check.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/comm/mesh_comms.h"
#include "meshflow/engine/job.h"
#include "meshflow/engine/trainer.h"
#include "meshflow/ops/builder.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/verify.h"
#include "meshflow/parallel/collective_cost.h"
#include "meshflow/parallel/configured.h"
#include "meshflow/parallel/partition.h"
#include "meshflow/runtime/executor.h"
#include "one_device_trace.h"

namespace meshflow {
namespace {

// ---- the broadcast op ----

// On 3 ranks, for each root: every rank's tensor becomes the root's, in
// place, bit for bit (f32 and i32, rank-seeded so a wrong root or a stale
// buffer shows).
TEST(OpsCollectiveBroadcast, EveryMemberGetsTheRootsTensor) {
  constexpr int n = 3;
  const Shape shape{{"a", 5}, {"b", 7}};
  for (int root = 0; root < n; ++root) {
    Status s = run_local_ranks(n, [&](const std::shared_ptr<Transport>& t) -> Status {
      const int r = t->rank();
      MF_ASSIGN_OR_RETURN(MeshComms comms,
                          MeshComms::make(Communicator::world(t), Mesh::line(n, "x")));
      Graph g;
      Builder b(g);
      const ValueId p = b.parameter("p", shape, Init::zeros());
      const ValueId ids = b.input("ids", Shape{{"n", 4}}, DType::I32);
      b.broadcast(p, root, 0, n, "bp");
      b.broadcast(ids, root, 0, n, "bi");
      Executor ex(g);
      ex.set_mesh_comms(&comms);
      const Tensor mine = testing::random_tensor(shape, 100 + r);
      std::memcpy(ex.storage(p).data<float>(), mine.data<float>(), mine.nbytes());
      Tensor mine_ids(Shape{{"n", 4}}, DType::I32);
      for (int i = 0; i < 4; ++i) mine_ids.data<int32_t>()[i] = 1000 * r + i;
      MF_RETURN_IF_ERROR(ex.feed("ids", mine_ids));
      ex.run(ex.forward_backward_order());
      const Tensor want = testing::random_tensor(shape, 100 + root);
      const float* got = ex.storage(p).data<float>();
      for (int64_t i = 0; i < shape.numel(); ++i)
        EXPECT_EQ(got[i], want.data<float>()[i]) << "rank " << r << " root " << root;
      const int32_t* got_ids = static_cast<const int32_t*>(ex.data(ids));
      for (int i = 0; i < 4; ++i) EXPECT_EQ(got_ids[i], 1000 * root + i) << "rank " << r;
      return Status::ok();
    });
    ASSERT_TRUE(s.is_ok()) << s.message();
  }
}

// The graph invariant it relies on: after an update wrote a parameter in
// place, only another in-place writer of it (the broadcast) may read it.
TEST(OpsCollectiveBroadcast, OnlyAnInPlaceWriterReadsAnUpdatedParameter) {
  Graph g;
  Builder b(g);
  const ValueId p = b.parameter("p", Shape{{"a", 4}}, Init::zeros());
  const ValueId m = b.state("p.momentum", Shape{{"a", 4}});
  const ValueId grad = b.input("grad", Shape{{"a", 4}});
  const ValueId lr = b.input("lr", Shape{});
  const ValueId coef = b.input("coef", Shape{});
  b.op(OpKind::kSgdUpdate, {p, grad, m, lr, coef});
  b.broadcast(p, 0, 0, 2);
  EXPECT_TRUE(verify(g).is_ok()) << verify(g).message();
  b.scale(p, 2.f);
  const Status s = verify(g);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("after an optimizer op updated it"), std::string::npos) << s.message();
}

TEST(OpsCollectiveBroadcast, ShapeCostAndErrors) {
  Graph g;
  Builder b(g);
  const ValueId x = b.input("x", Shape{{"a", 4}, {"b", 6}});
  b.broadcast(x, 2, 0, 4);
  const Node& made = g.node(g.num_nodes() - 1);
  EXPECT_TRUE(made.outputs.empty());  // in place
  // Pipelined from the root: n-1 of n ranks forward the buffer once.
  EXPECT_DOUBLE_EQ(op_cost(g, made).bytes, 4.0 * 24 * 3 / 4);
  EXPECT_DOUBLE_EQ(collective_bytes_per_rank(Collective::kBroadcast, 4, 96), 72);
  const Link link{.bandwidth_bytes_per_s = 1e9, .latency_s = 1e-6, .efficiency = 1};
  EXPECT_DOUBLE_EQ(collective_time_s(Collective::kBroadcast, 4, 1e6, link), 3e-6 + 1e-3);
  EXPECT_EQ(collective_of(OpKind::kBroadcast), Collective::kBroadcast);
  EXPECT_TRUE(is_collective(OpKind::kBroadcast));
  Node bad;
  bad.kind = OpKind::kBroadcast;
  bad.name = "bad";
  bad.inputs = {x};
  bad.attrs.mesh_axis = 0;
  bad.attrs.group_size = 4;
  bad.attrs.ints = {4};
  std::vector<Value> outs;
  Status s = op_def(OpKind::kBroadcast).infer(g, bad, &outs);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("0 <= root < 4"), std::string::npos) << s.message();
  bad.attrs.ints = {};
  EXPECT_FALSE(op_def(OpKind::kBroadcast).infer(g, bad, &outs).is_ok());
}

// ---- LPT balancing ----

TEST(PartitionWeightGroups, LptAssignmentOfKnownSizes) {
  // Largest first to the least-loaded group: 40->0, 30->1, 25->1, 20->0,
  // 10->1, 5->0: groups of 65 and 65.
  EXPECT_EQ(balance_groups({10, 40, 30, 20, 25, 5}, 2), (std::vector<int>{1, 0, 1, 0, 1, 0}));
  // Ties: equal sizes in index order, equal loads to the lower group.
  EXPECT_EQ(balance_groups({8, 8, 8, 8}, 3), (std::vector<int>{0, 1, 2, 0}));
  // One parameter larger than all others: its group sets the peak.
  EXPECT_EQ(balance_groups({1, 100, 1, 1}, 2), (std::vector<int>{1, 0, 1, 1}));
}

// ---- runs ----

json model_json(const std::string& model) {
  if (model == "llama")
    return {{"model_type", "llama"},    {"num_hidden_layers", 2},       {"hidden_size", 32},
            {"num_attention_heads", 4}, {"num_key_value_heads", 2},     {"intermediate_size", 64},
            {"vocab_size", 256},        {"max_position_embeddings", 16}};
  return {{"model_type", "gpt2"},
          {"n_layer", 2},
          {"n_embd", 32},
          {"n_head", 4},
          {"n_positions", 16},
          {"vocab_size", 256},
          {"tie_word_embeddings", true}};
}

json run_json(const std::string& model, int micro_batches, const json& parallel, int steps = 3) {
  json doc = {
      {"model", model_json(model)},
      {"data", {{"dataset", "fortunes"}}},
      {"train",
       {{"steps", steps},
        {"batch_size", 8},
        {"micro_batches", micro_batches},
        {"seq_len", 16},
        {"threads", 1},
        {"eval_batches", 2}}},
      // GPT's key bias has an exactly-zero gradient that Adam turns
      // rounding noise into steps on (parallel_partition_test.cc):
      // GPT trains with SGD + momentum, LLaMA with AdamW; both clip.
      {"optimizer",
       model == "llama"
           ? json{{"type", "adamw"}, {"lr", 1e-3}, {"weight_decay", 0.1}, {"grad_clip", 1.0}}
           : json{{"type", "sgd"}, {"lr", 0.1}, {"momentum", 0.9}, {"grad_clip", 1.0}}}};
  if (!parallel.is_null()) doc["parallel"] = parallel;
  return doc;
}

RunConfig run(const std::string& model, int micro_batches, const json& parallel, int steps = 3) {
  return value_or_throw(parse_run_config(run_json(model, micro_batches, parallel, steps), ""));
}

json grouped(const std::string& mesh, const std::string& preset = "dp") {
  return {
      {"mode", "semi"}, {"mesh", mesh}, {"preset", preset}, {"zero", 1}, {"zero_style", "group"}};
}

using testing::expect_same;
using testing::Trace;
using testing::train;
using testing::train_ranks;

// Grouping moves plain data parallel's updates (same reduced gradients, same
// norm, same kernel) onto one rank each: the numbers are identical.
void expect_identical(const std::vector<Trace>& ddp, const std::vector<Trace>& group,
                      const std::string& what) {
  ASSERT_EQ(ddp.size(), group.size());
  for (size_t r = 0; r < ddp.size(); ++r) {
    EXPECT_EQ(group[r].losses, ddp[r].losses) << what << " rank " << r;
    for (const auto& [name, w] : ddp[r].weights) {
      const Tensor& got = group[r].weights.at(name);
      EXPECT_EQ(std::memcmp(got.raw(), w.raw(), w.nbytes()), 0) << what << ": " << name;
    }
  }
}

struct GroupCase {
  std::string model, mesh, preset;
  int micro_batches = 1;
  std::string mode = "semi";  // "data": {"mode": "data", "zero": 1, "zero_style": "group"}
};

void PrintTo(const GroupCase& c, std::ostream* os) {
  *os << c.model << " " << c.mode << " " << c.mesh << " " << c.preset << " m" << c.micro_batches;
}

class PartitionWeightGroupsRuns : public ::testing::TestWithParam<GroupCase> {};

TEST_P(PartitionWeightGroupsRuns, SameLossesAndWeightsAsOneDevice) {
  const GroupCase& c = GetParam();
  const Trace single = train(run(c.model, c.micro_batches, nullptr), nullptr);
  json par = grouped(c.mesh, c.preset), ddp = grouped(c.mesh, c.preset);
  ddp.erase("zero_style");
  ddp["zero"] = 0;
  int ranks = value_or_throw(Mesh::parse(c.mesh)).num_ranks();
  if (c.mode == "data") {
    par = {{"mode", "data"}, {"zero", 1}, {"zero_style", "group"}};
    ddp = {{"mode", "data"}};
  }
  const std::vector<Trace> g = train_ranks(run(c.model, c.micro_batches, par), ranks);
  const std::string what = c.model + " " + c.mode + " " + c.mesh + " group";
  expect_same(single, g, what);
  expect_identical(train_ranks(run(c.model, c.micro_batches, ddp), ranks), g, what);
  ASSERT_EQ(g[0].group_bytes.size(), size_t(g.size() / (c.preset == "megatron" ? 2 : 1)))
      << what << ": not grouped";
}

INSTANTIATE_TEST_SUITE_P(Plans, PartitionWeightGroupsRuns,
                         ::testing::Values(GroupCase{"gpt", "dp=2", "dp"},
                                           GroupCase{"llama", "dp=4", "dp", 2},
                                           GroupCase{"gpt", "dp=4", "dp", 2},
                                           GroupCase{"llama", "dp=2,tp=2", "megatron"},
                                           GroupCase{"llama", "dp=2", "", 1, "data"}),
                         [](const auto& info) {
                           const GroupCase& c = info.param;
                           std::string mesh = c.mesh;
                           for (char& ch : mesh)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return c.model + "_" + c.mode + "_" + mesh + "_m" +
                                  std::to_string(c.micro_batches);
                         });

// ---- the groups and the programs ----

// Every parameter in exactly one group, every group non-empty, the same
// groups on every call; each rank's program stores and updates exactly its
// group's, and broadcasts every parameter in the same order as the others.
TEST(PartitionWeightGroups, EveryParameterInOneGroupAndProgramsFollow) {
  for (const std::string model : {"gpt", "llama"}) {
    SCOPED_TRACE(model);
    const RunConfig rc = run(model, 1, grouped("dp=4"));
    ModelGraph m = value_or_throw(build_training_graph(rc, rc.train.batch_size));
    const Graph& g = m.graph;
    const PartitionOptions o = partition_options(rc.parallel, rc.parallel.mesh);
    const Annotation a = value_or_throw(annotate(g, rc.parallel.mesh, o));
    const Annotation again = value_or_throw(annotate(g, rc.parallel.mesh, o));
    const WeightGroups& wg = a.groups;
    ASSERT_TRUE(wg.on());
    std::set<ValueId> seen;
    int64_t total = 0, largest_param = 0;
    for (size_t i = 0; i < wg.members.size(); ++i) {
      const WeightGroups::Member& mb = wg.members[i];
      EXPECT_TRUE(seen.insert(mb.param).second) << g.value(mb.param).name << " twice";
      EXPECT_GE(mb.owner, 0);
      EXPECT_LT(mb.owner, 4);
      EXPECT_EQ(mb.owner, again.groups.members[i].owner) << "not deterministic";
      EXPECT_EQ(mb.bytes, g.shape(mb.param).numel() * 4);
      for (ValueId s : mb.states) EXPECT_EQ(wg.owner_of(s), mb.owner);
      total += mb.bytes;
      largest_param = std::max(largest_param, mb.bytes);
    }
    const std::vector<ValueId> params = g.parameters();
    EXPECT_EQ(seen, std::set<ValueId>(params.begin(), params.end()));
    int64_t sum = 0;
    for (int c = 0; c < 4; ++c) {
      EXPECT_GE(wg.group_params[c], 1);
      sum += wg.group_bytes[c];
      // LPT's bound: no group exceeds an even split by more than one parameter.
      EXPECT_LE(wg.group_bytes[c], total / 4 + largest_param);
    }
    EXPECT_EQ(sum, total);
    std::vector<std::string> broadcasts0;
    for (int r = 0; r < 4; ++r) {
      const LocalProgram p = value_or_throw(lower(g, a, r));
      int states = 0, updates = 0;
      std::vector<std::string> broadcasts;
      for (const Node& n : p.graph.nodes()) {
        states += n.kind == OpKind::kState;
        updates += n.kind == OpKind::kSgdUpdate || n.kind == OpKind::kAdamWUpdate;
        if (n.kind == OpKind::kBroadcast) {
          broadcasts.push_back(n.name);
          EXPECT_EQ(n.attrs.ints[0], wg.owner_of(g.find(n.name.substr(0, n.name.find('/')))));
        }
      }
      const int per_param = model == "llama" ? 2 : 1;  // Adam moments; SGD momentum
      EXPECT_EQ(updates, wg.group_params[r]) << "rank " << r;
      EXPECT_EQ(states, per_param * wg.group_params[r]) << "rank " << r;
      EXPECT_EQ(broadcasts.size(), params.size());
      if (r == 0) broadcasts0 = broadcasts;
      EXPECT_EQ(broadcasts, broadcasts0) << "rank " << r << ": another order";
    }
  }
}

// ---- memory, measured ----

// f32 AdamW: 8 B of moments per parameter. Plain data parallel stores all of
// them on every rank, ZeRO-1 sharding 8/N per parameter, weights grouping its
// group's: 2 x the group's parameter bytes, the largest group the peak.
TEST(PartitionWeightGroups, OptimizerStateIsTheOwnersGroup) {
  const int n = 4;
  auto ranks = [&](const json& par) {
    RunConfig rc = run("llama", 2, par);
    rc.train.steps = 1;
    return train_ranks(rc, n);
  };
  json ddp = grouped("dp=4"), shard = grouped("dp=4");
  ddp["zero"] = 0, ddp.erase("zero_style");
  shard["zero_style"] = "shard";
  const std::vector<Trace> z0 = ranks(ddp), z1 = ranks(shard), grp = ranks(grouped("dp=4"));
  const double P = static_cast<double>(z0[0].memory.params) / 4;
  const std::vector<int64_t>& groups = grp[0].group_bytes;
  ASSERT_EQ(groups.size(), size_t{n});
  std::printf("optimizer bytes/param per rank (N=%d): ddp %.3f  zero-1 shard %.3f  group", n,
              z0[0].memory.optimizer / P, z1[0].memory.optimizer / P);
  int64_t peak = 0;
  for (int r = 0; r < n; ++r) {
    std::printf(" %.3f", grp[r].memory.optimizer / P);
    EXPECT_EQ(grp[r].memory.optimizer, 2 * groups[r]) << "rank " << r;
    EXPECT_EQ(grp[r].memory.params, z0[r].memory.params) << "rank " << r;  // weights whole
    peak = std::max(peak, grp[r].memory.optimizer);
  }
  std::printf("\n");
  EXPECT_EQ(peak, 2 * *std::max_element(groups.begin(), groups.end()));
  EXPECT_NEAR(z0[0].memory.optimizer / P, 8.0, 0.05);
  EXPECT_NEAR(z1[0].memory.optimizer / P, 8.0 / n, 0.05);
  // Whole parameters balance less finely than slices: the peak is at least
  // an even split, and LPT keeps it within one parameter of it.
  EXPECT_GE(peak / P, 8.0 / n - 1e-9);
  EXPECT_LT(peak / P, 8.0 / n * 1.5);
}

// ---- bad plans: one line naming the thing and what is valid ----

std::string parse_error(const json& par) {
  Result<StrategyConfig> c = parse_strategy_config(par);
  return c.is_ok() ? "" : c.status().message();
}

TEST(PartitionWeightGroups, BadPlansAreOneLineErrors) {
  json z2 = grouped("dp=2");
  z2["zero"] = 2;
  std::string e = parse_error(z2);
  EXPECT_NE(e.find("parallel.zero_style \"group\""), std::string::npos) << e;
  EXPECT_NE(e.find("parallel.zero is 2; use \"zero\": 1"), std::string::npos) << e;
  json z0 = grouped("dp=2");
  z0.erase("zero");
  EXPECT_NE(parse_error(z0).find("parallel.zero is 0"), std::string::npos) << parse_error(z0);
  json style = grouped("dp=2");
  style["zero_style"] = "groups";
  EXPECT_NE(parse_error(style).find("zero_style"), std::string::npos) << parse_error(style);
  // No dp axis; dp of 1 (one group splits nothing).
  EXPECT_NE(parse_error(grouped("tp=2", "megatron")).find("no axis named dp"), std::string::npos);
  ModelGraph m = value_or_throw(build_training_graph(run("gpt", 1, nullptr), 8));
  const RunConfig one = run("gpt", 1, grouped("dp=1,tp=2", "megatron"));
  Result<Annotation> a =
      annotate(m.graph, one.parallel.mesh, partition_options(one.parallel, one.parallel.mesh));
  ASSERT_FALSE(a.is_ok());
  EXPECT_NE(a.status().message().find("over dp=1 makes one group"), std::string::npos)
      << a.status().message();
  // With a pipeline: not supported, said so.
  json pp = {{"mode", "data"},
             {"zero", 1},
             {"zero_style", "group"},
             {"pipeline", {{"stages", 2}, {"micro_batches", 2}}}};
  Result<Job> job = resolve_job(run("gpt", 1, pp), 4);
  ASSERT_FALSE(job.is_ok());
  EXPECT_NE(job.status().message().find("not with parallel.pipeline"), std::string::npos)
      << job.status().message();
}

// A grouping that cannot balance: more data-parallel ranks than parameters
// (an MLP of 4 tensors on 8 ranks) would leave a rank owning nothing. The
// library's error and the CLI's: exit 2, one line.
TEST(PartitionWeightGroups, MoreRanksThanParametersCannotBalance) {
  const json mlp = {{"type", "mlp"}, {"input_dim", 784}, {"hidden", {16}}, {"num_classes", 10}};
  json doc = {{"model", mlp},
              {"data", {{"dataset", "fashion_mnist"}}},
              {"train", {{"steps", 1}, {"batch_size", 8}, {"threads", 1}, {"eval_batches", 1}}},
              {"optimizer", {{"type", "adamw"}, {"lr", 1e-3}}},
              {"parallel", {{"mode", "data"}, {"zero", 1}, {"zero_style", "group"}}}};
  const RunConfig rc = value_or_throw(parse_run_config(doc, ""));
  const Job job = value_or_throw(resolve_job(rc, 8));
  ModelGraph m = value_or_throw(build_training_graph(job.rc, job.micro_batch_rows));
  Result<Annotation> a = annotate(m.graph, job.mesh, partition_options(job.rc.parallel, job.mesh));
  ASSERT_FALSE(a.is_ok());
  EXPECT_EQ(a.status().message(),
            "weights grouping cannot balance 4 parameters over dp=8: every data-parallel rank "
            "must own at least one whole parameter; use dp <= 4, or \"zero_style\": \"shard\" "
            "(ZeRO-1 slices every parameter 8 ways)");
  // dp = 4: one parameter each, valid.
  const Job four = value_or_throw(resolve_job(rc, 4));
  EXPECT_TRUE(annotate(m.graph, four.mesh, partition_options(four.rc.parallel, four.mesh)).is_ok());
  const std::string cfg = ::testing::TempDir() + "/group_unbalanced.json";
  std::ofstream(cfg) << doc.dump();
  const testing::CliRun r = testing::run_cli("train " + cfg + " --ranks 8 --quiet", 120);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(r.output.rfind("meshflow: error: ", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("cannot balance 4 parameters over dp=8"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

// ---- communication: explain's totals, and what the trace records ----

std::map<std::string, int> traced_collectives(const std::string& trace_json, int pid) {
  std::map<std::string, int> n;
  const json doc = json::parse(trace_json);
  for (const json& e : doc.at("traceEvents")) {
    if (e.value("cat", "") != "collective" || e.value("pid", -1) != pid) continue;
    const std::string name = e.value("name", "");
    const std::string kind = name.substr(0, name.find(' '));
    for (const char* k : {"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast"})
      if (kind == k) ++n[kind];
  }
  return n;
}

// The parameters of the model a config file names.
size_t parameters_of(const std::string& cfg) {
  std::ifstream in(cfg);
  const RunConfig rc = value_or_throw(parse_run_config(json::parse(in), ""));
  return value_or_throw(build_training_graph(rc, rc.train.batch_size)).graph.parameters().size();
}

// Per step: the gradients' all_reduce (as plain data parallel: the same
// bytes) + one broadcast per parameter from its owner, (N-1)/N of the
// parameter bytes per rank (what ZeRO-1 sharding all-gathers). Explain's
// per-step lines equal the collectives `train --trace` records.
TEST(PartitionWeightGroups, ExplainTotalsAllReduceAndBroadcast) {
  const RunConfig rc = run("llama", 1, grouped("dp=4"));
  ModelGraph m = value_or_throw(build_training_graph(rc, rc.train.batch_size));
  const Graph& g = m.graph;
  auto program = [&](const json& par) {
    const RunConfig c = run("llama", 1, par);
    const Annotation a = value_or_throw(
        annotate(g, c.parallel.mesh, partition_options(c.parallel, c.parallel.mesh)));
    return value_or_throw(lower(g, a, 1));
  };
  json ddp = grouped("dp=4"), shard = grouped("dp=4");
  ddp["zero"] = 0, ddp.erase("zero_style");
  shard["zero_style"] = "shard";
  auto bytes = [](const LocalProgram& p, OpKind kind) {
    int64_t b = 0;
    for (const CollectiveRecord& c : p.collectives) b += c.kind == kind ? c.bytes_per_rank : 0;
    return b;
  };
  const LocalProgram grp = program(grouped("dp=4")), dp = program(ddp), z1 = program(shard);
  int64_t param_bytes = 0;
  for (ValueId v : g.parameters()) param_bytes += g.shape(v).numel() * 4;
  int broadcasts = 0;
  for (const CollectiveRecord& c : grp.collectives)
    if (c.kind == OpKind::kBroadcast) {
      ++broadcasts;
      EXPECT_EQ(c.phase, Phase::kOptimizer);
      EXPECT_EQ(c.mesh_axis, "dp");
    }
  EXPECT_EQ(broadcasts, static_cast<int>(g.parameters().size()));
  EXPECT_EQ(bytes(grp, OpKind::kAllReduce), bytes(dp, OpKind::kAllReduce));
  EXPECT_NEAR(bytes(grp, OpKind::kBroadcast), param_bytes * 3 / 4, broadcasts);
  EXPECT_NEAR(bytes(grp, OpKind::kBroadcast), bytes(z1, OpKind::kAllGather), broadcasts);
  EXPECT_EQ(bytes(dp, OpKind::kBroadcast), 0);

  // The CLI: explain names the groups; its per-step counts are the trace's.
  const std::string dir = ::testing::TempDir();
  const std::string cfg = dir + "/group_dp2.json";
  std::ofstream(cfg) << run_json("gpt", 2, grouped("dp=2"), 1).dump();
  const testing::CliRun ex = testing::run_cli("explain " + cfg + " --no-nodes");
  ASSERT_EQ(ex.code, 0) << ex.output;
  EXPECT_NE(ex.output.find("weights groups over dp (2, parameter bytes per rank): 0: "),
            std::string::npos)
      << ex.output;
  const testing::CliRun tr = testing::run_cli("train " + cfg + " --ranks 2 --quiet --trace " + dir +
                                              "/group_dp2.trace.json");
  ASSERT_EQ(tr.code, 0) << tr.output;
  std::ifstream in(dir + "/group_dp2.trace.json");
  const std::string trace((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, int> from_explain;
  bool totals = false;
  std::istringstream lines(ex.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("per step", 0) == 0) totals = true;
    char phase[32], kind[32];
    int count = 0, reps = 0;
    if (totals &&
        std::sscanf(line.c_str(), " %31s %31s %d x %d", phase, kind, &count, &reps) == 4 &&
        count * reps > 0)
      from_explain[kind] += count * reps;
  }
  // (The gradients' all_reduces run in the buckets, traced as one wait span;
  // the broadcasts are nodes of the optimizer, one span each.)
  EXPECT_EQ(from_explain["broadcast"], static_cast<int>(parameters_of(cfg)));
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(traced_collectives(trace, r)["broadcast"], from_explain["broadcast"]) << ex.output;
}

}  // namespace
}  // namespace meshflow
