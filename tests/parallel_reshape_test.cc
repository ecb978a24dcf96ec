// Reshape across layouts (parallel/reshape_layout.h): which splits a per-rank
// reshape keeps (agreeing with the reshape rule where the rule allows a
// split), the routes the planner picks (all_to_all where legal, none where the
// blocks line up), errors, and random input/output layouts of the attention
// heads merge [b, s, heads, head_dim] -> [b, s, hidden] and split (and their
// gradients, the reshapes back) on {tp: 2}, {tp: 4} and {dp: 2, tp: 2}: every
// rank's block of y and of dx equals one device's exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <set>

#include "grad_check.h"
#include "meshflow/autodiff/autodiff.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/comm/mesh_comms.h"
#include "meshflow/ops/builder.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/parallel/partition.h"
#include "meshflow/parallel/reshape_layout.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

Layout L(const std::string& s) {
  return value_or_throw(Layout::parse(s));
}
Mesh M(const std::string& s) {
  return value_or_throw(Mesh::parse(s));
}
Shape heads_shape(int64_t heads, int64_t head_dim) {
  return Shape{{"batch", 2}, {"seq", 4}, {"heads", heads}, {"head_dim", head_dim}};
}
Shape hidden_shape(int64_t hidden) {
  return Shape{{"batch", 2}, {"seq", 4}, {"hidden", hidden}};
}

std::string text(const std::optional<Layout>& l) {
  return l ? l->to_string() : "none";
}

// Every canonical layout of `s` on `mesh` without Partial: each axis R or
// Shard(d), a dim split by several axes in every order, dividing evenly.
std::vector<Layout> all_layouts(const Shape& s, const Mesh& mesh) {
  std::vector<Layout> out;
  std::set<std::string> seen;
  const int na = mesh.num_axes();
  std::vector<int> pick(na, -1);  // per axis: the dim it splits, -1 none
  std::function<void(int)> rec = [&](int a) {
    if (a < na) {
      for (int d = -1; d < s.rank(); ++d) {
        pick[a] = d;
        rec(a + 1);
      }
      return;
    }
    std::vector<int> axes(na);
    for (int i = 0; i < na; ++i) axes[i] = i;
    do {  // every order of the axes: the order among a dim's axes
      std::vector<int> order(na, 0), count(s.rank(), 0);
      for (int ax : axes)
        if (pick[ax] >= 0) order[ax] = count[pick[ax]]++;
      std::vector<Placement> p(na, Placement::Replicate());
      for (int ax = 0; ax < na; ++ax)
        if (pick[ax] >= 0) p[ax] = Placement::Shard(pick[ax], order[ax]);
      Layout l = canonical(value_or_throw(Layout::make(p)), mesh);
      if (divides_evenly(l, mesh, s) && seen.insert(l.to_string()).second) out.push_back(l);
    } while (std::next_permutation(axes.begin(), axes.end()));
  };
  rec(0);
  return out;
}

TEST(ParallelReshape, BlockLayoutsOfTheHeadsMerge) {
  const Mesh tp = M("tp=2");
  const Shape x = heads_shape(4, 8), y = hidden_shape(32);
  EXPECT_EQ(text(reshape_block_layout(x, y, tp, L("[S(2)]"))), "[S(2)]");
  EXPECT_EQ(text(reshape_block_layout(x, y, tp, L("[S(0)]"))), "[S(0)]");
  EXPECT_EQ(text(reshape_block_layout(x, y, tp, L("[P]"))), "[P]");
  EXPECT_EQ(text(reshape_block_layout(x, y, tp, L("[S(3)]"))), "none");  // head_dim alone
  EXPECT_EQ(text(reshape_block_layout(y, x, tp, L("[S(2)]"))), "[S(2)]");
  // hidden split 4 ways with 2 heads: half a head per rank, no block of [heads, head_dim].
  EXPECT_EQ(text(reshape_block_layout(hidden_shape(16), heads_shape(2, 8), M("tp=4"), L("[S(2)]"))),
            "none");
  // heads split fully on dp, head_dim on tp: hidden over (dp, tp); and the other way round.
  const Mesh m = M("dp=2,tp=2");
  const Shape x2 = heads_shape(2, 8), y2 = hidden_shape(16);
  EXPECT_EQ(text(reshape_block_layout(x2, y2, m, L("[S(2), S(3)]"))), "[S(2), S(2)]");
  EXPECT_EQ(text(reshape_block_layout(x2, y2, m, L("[S(3), S(2)]"))), "[S(2)#1, S(2)#0]");
  EXPECT_EQ(text(reshape_block_layout(y2, x2, m, L("[S(2), S(2)]"))), "[S(2), S(3)]");
  EXPECT_EQ(text(reshape_block_layout(y2, x2, m, L("[S(2)#1, S(2)#0]"))), "[S(3), S(2)]");
  // heads=4 split only 2 ways on dp: head_dim's split on tp lands mid-row.
  EXPECT_EQ(text(reshape_block_layout(x, y, m, L("[S(2), S(3)]"))), "none");
  // A size-1 dim in the middle, and a split group's later dims.
  EXPECT_EQ(text(reshape_block_layout(Shape{{"a", 4}, {"one", 1}, {"b", 6}},
                                      Shape{{"x", 8}, {"y", 3}}, tp, L("[S(0)]"))),
            "[S(0)]");
}

// Where the reshape rule (ops/sharding_rule.h) allows a split, the per-rank
// reshape gives the layout the rule derives: the lowering adds no route to any
// strategy the rule enumerates.
TEST(ParallelReshape, BlockLayoutsAgreeWithTheReshapeRule) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {heads_shape(4, 8), hidden_shape(32)},
      {hidden_shape(32), heads_shape(4, 8)},
      {heads_shape(2, 8), hidden_shape(16)},
      {Shape{{"a", 4}, {"b", 6}, {"c", 8}}, Shape{{"a", 4}, {"bc", 48}}},
      {Shape{{"a", 4}, {"b", 6}}, Shape{{"x", 8}, {"one", 1}, {"y", 3}}},
      {Shape{{"a", 6}, {"b", 4}}, Shape{{"x", 4}, {"y", 6}}},
  };
  int checked = 0;
  for (const char* mesh_text : {"tp=2", "tp=4", "dp=2,tp=2", "a=2,b=2,c=2"}) {
    const Mesh mesh = M(mesh_text);
    for (const auto& [in, out] : cases) {
      Graph g;
      Builder b(g);
      b.reshape(b.input("x", in), out, "r");
      const Node& n = g.node(g.num_nodes() - 1);
      for (const ShardingStrategy& st : enumerate_strategies(g, n, mesh)) {
        EXPECT_EQ(text(reshape_block_layout(in, out, mesh, st.inputs[0])),
                  canonical(st.outputs[0], mesh).to_string())
            << mesh_text << " " << in.to_string() << " " << st.to_string();
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

std::multiset<std::string> kinds(const ReshapePlan& p) {
  std::multiset<std::string> k;
  for (const ReshardPlan* r : {&p.before, &p.after})
    for (const ReshardStep& s : r->steps)
      if (s.is_collective()) k.insert(reshard_kind_name(s.kind));
  return k;
}

TEST(ParallelReshape, RoutesMoveTheSplitWithAllToAll) {
  // Sizes where bandwidth, not latency, decides (the default links).
  const Shape x{{"batch", 8}, {"seq", 1024}, {"heads", 4}, {"head_dim", 64}};
  const Shape y{{"batch", 8}, {"seq", 1024}, {"hidden", 256}};
  const Mesh tp = M("tp=2");
  // head_dim split -> hidden split: all_to_all head_dim -> heads, then local.
  ReshapePlan p = value_or_throw(plan_reshape(x, y, tp, L("[S(3)]"), L("[S(2)]")));
  EXPECT_EQ(kinds(p), (std::multiset<std::string>{"all_to_all"})) << p.to_string(tp);
  ASSERT_EQ(p.before.steps.size(), 1u);
  EXPECT_EQ(p.before.steps[0].src_dim, 3);
  EXPECT_EQ(p.before.steps[0].dst_dim, 2);
  EXPECT_EQ(p.local_in, L("[S(2)]"));
  EXPECT_TRUE(p.after.steps.empty());
  // Aligned splits reshape locally: no steps at all.
  p = value_or_throw(plan_reshape(x, y, tp, L("[S(2)]"), L("[S(2)]")));
  EXPECT_TRUE(p.is_local());
  EXPECT_EQ(p.cost_s, 0.0);
  // hidden split 4 ways over 2 heads -> head_dim split: the split moves to
  // seq and back (two all_to_alls), not through a gathered whole.
  const Shape x2{{"batch", 8}, {"seq", 1024}, {"heads", 2}, {"head_dim", 64}};
  const Shape y2{{"batch", 8}, {"seq", 1024}, {"hidden", 128}};
  const Mesh tp4 = M("tp=4");
  p = value_or_throw(plan_reshape(y2, x2, tp4, L("[S(2)]"), L("[S(3)]")));
  EXPECT_EQ(kinds(p), (std::multiset<std::string>{"all_to_all", "all_to_all"})) << p.to_string(tp4);
  EXPECT_FALSE(kinds(p).count("all_gather"));
  // 2-D: hidden over (dp, tp) is heads on dp and head_dim on tp: local.
  const Mesh m = M("dp=2,tp=2");
  p = value_or_throw(plan_reshape(y2, x2, m, L("[S(2), S(2)]"), L("[S(2), S(3)]")));
  EXPECT_TRUE(p.is_local()) << p.to_string(m);
  // The split changes mesh axis: heads on tp -> hidden on dp. One all_gather
  // over tp and a free local slice over dp (on either side of the reshape:
  // the bytes are the same).
  p = value_or_throw(plan_reshape(x, y, m, L("[R, S(2)]"), L("[S(2), R]")));
  EXPECT_EQ(kinds(p), (std::multiset<std::string>{"all_gather"})) << p.to_string(m);
  EXPECT_EQ(p.before.steps.size() + p.after.steps.size(), 2u) << p.to_string(m);
  EXPECT_EQ(p.after.dst, L("[S(2), R]"));
  // No route is dearer than gathering the whole input and slicing the target.
  for (const Layout& src : all_layouts(x2, m)) {
    for (const Layout& dst : all_layouts(y2, m)) {
      const ReshapePlan r = value_or_throw(plan_reshape(x2, y2, m, src, dst));
      const ReshardPlan gather = value_or_throw(plan_reshard(x2, m, src, L("[R, R]")));
      EXPECT_LE(r.cost_s, gather.cost_s + 1e-12) << src.to_string() << " -> " << dst.to_string();
    }
  }
}

// y = reshape(x) of a parameter x; loss = sum(y * probe); append_backward:
// dx = reshape(dy) back, in the backward.
struct ReshapeGraph {
  Graph g;
  ValueId x, y, dx;
  NodeId fwd = -1, bwd = -1;
  ReshapeGraph(const Shape& in, const Shape& out) {
    Builder b(g);
    x = b.parameter("x", in, Init::normal(1.f));
    y = b.reshape(x, out, "merge");
    const ValueId probe = b.input("probe", out);
    g.loss = b.matmul(y, probe, {false, false, out.rank(), 0}, "loss");
    append_backward(g);
    dx = g.grad_of_param.at(x);
    for (NodeId id = 0; id < g.num_nodes(); ++id) {
      if (g.node(id).kind != OpKind::kReshape) continue;
      (g.node(id).phase == Phase::kForward ? fwd : bwd) = id;
    }
  }
};

struct Reference {
  float loss = 0;
  Tensor y, dx, probe;
};

Reference one_device(const ReshapeGraph& m, uint64_t seed) {
  Reference r;
  r.probe = testing::random_tensor(m.g.shape(m.y), seed);
  Executor one(m.g, {.seed = 3, .fetch = {m.y, m.dx}, .run_elsewhere = {}, .offload = {}});
  EXPECT_TRUE(one.feed("probe", r.probe).is_ok());
  one.run(one.forward_backward_order());
  r.loss = one.scalar(m.g.loss);
  r.y = Tensor(m.g.shape(m.y), DType::F32);
  r.y.copy_from(one.data(m.y));
  r.dx = Tensor(m.g.shape(m.dx), DType::F32);
  r.dx.copy_from(one.data(m.dx));
  return r;
}

// Lowers `a` for every rank, runs the programs on local ranks and checks each
// rank's y and dx against the reference's blocks (exactly: a reshape and its
// route only move numbers). Returns rank 0's program.
LocalProgram run_and_compare(const ReshapeGraph& m, const Annotation& a, const Reference& ref) {
  const Mesh& mesh = a.mesh;
  std::vector<LocalProgram> programs(mesh.num_ranks());
  Status s = run_local_ranks(mesh.num_ranks(), [&](const std::shared_ptr<Transport>& t) -> Status {
    const int rank = t->rank();
    MF_ASSIGN_OR_RETURN(LocalProgram p, lower(m.g, a, rank));
    MF_ASSIGN_OR_RETURN(MeshComms comms, MeshComms::make(Communicator::world(t), mesh));
    const ValueId ly = p.local_of[m.y], ldx = p.local_of[m.dx];
    Executor ex(p.graph, {.seed = 3, .fetch = {ly, ldx}, .run_elsewhere = {}, .offload = {}});
    ex.set_mesh_comms(&comms);
    const ValueId probe = m.g.find("probe");
    MF_RETURN_IF_ERROR(
        ex.feed("probe", local_block(ref.probe, mesh, a.produced(m.g, probe), rank)));
    ex.run(ex.forward_backward_order());
    EXPECT_NEAR(ex.scalar(p.graph.loss), ref.loss, 1e-5 * std::max(1.f, std::fabs(ref.loss)));
    for (const auto& [lv, whole, name] :
         {std::tuple{ly, &ref.y, "y"}, std::tuple{ldx, &ref.dx, "dx"}}) {
      const Layout& l = p.layout[lv];
      EXPECT_FALSE(l.has_partial()) << name;
      if (l.has_partial()) continue;
      const Tensor want = local_block(*whole, mesh, l, rank);
      const float* got = static_cast<const float*>(ex.data(lv));
      int64_t wrong = 0;
      for (int64_t i = 0; i < want.numel(); ++i) wrong += got[i] != want.data<float>()[i];
      EXPECT_EQ(wrong, 0) << name << " in " << l.to_string() << " rank " << rank;
    }
    programs[rank] = std::move(p);
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
  return std::move(programs[0]);
}

std::multiset<std::string> collectives_for(const LocalProgram& p, const std::string& consumer) {
  std::multiset<std::string> k;
  for (const CollectiveRecord& c : p.collectives)
    if (c.consumer == consumer) k.insert(std::string(op_name(c.kind)));
  return k;
}

// Random legal input and output layouts for the forward reshape, and (half
// the time) for the backward one too, else left to propagation; random
// stored layouts of x and probe. Every rank's y and dx equal one device's.
TEST(ParallelReshape, RandomLayoutsEqualOneDevice) {
  struct Case {
    const char* mesh;
    int64_t heads, head_dim;
    bool merge;
  };
  const std::vector<Case> cases = {
      {"tp=2", 4, 8, true},       {"tp=2", 4, 8, false},     {"tp=4", 2, 8, true},
      {"tp=4", 2, 8, false},      {"tp=4", 4, 6, true},      {"dp=2,tp=2", 2, 8, true},
      {"dp=2,tp=2", 2, 8, false}, {"dp=2,tp=2", 4, 4, true}, {"dp=2,tp=2", 6, 4, false},
  };
  std::mt19937_64 rng(20240515);
  int routed = 0, runs = 0;
  for (const Case& c : cases) {
    const Mesh mesh = M(c.mesh);
    const Shape heads = heads_shape(c.heads, c.head_dim),
                hidden = hidden_shape(c.heads * c.head_dim);
    const Shape& in = c.merge ? heads : hidden;
    const Shape& out = c.merge ? hidden : heads;
    ReshapeGraph m(in, out);
    const std::vector<Layout> ins = all_layouts(in, mesh), outs = all_layouts(out, mesh);
    auto pick = [&](const std::vector<Layout>& v) { return v[rng() % v.size()]; };
    for (int trial = 0; trial < 6; ++trial) {
      const Reference ref = one_device(m, 100 + runs);
      PartitionOptions o;
      o.source_layouts[m.x] = pick(ins);
      o.source_layouts[m.g.find("probe")] = pick(outs);
      const ShardingStrategy fwd{{pick(ins)}, {pick(outs)}};
      o.fixed[m.fwd] = fwd;
      if (trial % 2) o.fixed[m.bwd] = ShardingStrategy{{pick(outs)}, {pick(ins)}};
      SCOPED_TRACE(std::string(c.mesh) + " " + in.to_string() + " -> " + out.to_string() + " x " +
                   o.source_layouts[m.x].to_string() + ", reshape " + fwd.to_string() +
                   (trial % 2 ? ", backward " + o.fixed[m.bwd].to_string() : ""));
      const Annotation a = value_or_throw(annotate(m.g, mesh, o));
      const LocalProgram p = run_and_compare(m, a, ref);
      routed += !reshape_block_layout(in, out, mesh, fwd.inputs[0]) ||
                *reshape_block_layout(in, out, mesh, fwd.inputs[0]) != fwd.outputs[0];
      ++runs;
    }
  }
  // Not a vacuous draw: most forward reshapes needed a route.
  EXPECT_GT(routed, runs / 2) << routed << " of " << runs;
}

// The case: head_dim split on tp, hidden wanted split on tp. The
// lowering moves the split with one all_to_all (no all_gather); so does the
// gradient (the reshape back) when dx is wanted where x is stored, and left
// to propagation it reshapes dy locally (dx split on heads: nothing reads it
// elsewhere here).
TEST(ParallelReshape, HeadDimSplitToHiddenUsesAllToAll) {
  ReshapeGraph m(heads_shape(4, 8), hidden_shape(32));
  const Mesh mesh = M("tp=2");
  const std::string bwd = m.g.node(m.bwd).name;
  for (bool fix_gradient : {false, true}) {
    SCOPED_TRACE(fix_gradient ? "backward fixed" : "backward propagated");
    PartitionOptions o;
    o.source_layouts[m.x] = L("[S(3)]");
    o.source_layouts[m.g.find("probe")] = L("[S(2)]");
    o.fixed[m.fwd] = ShardingStrategy{{L("[S(3)]")}, {L("[S(2)]")}};
    if (fix_gradient) o.fixed[m.bwd] = ShardingStrategy{{L("[S(2)]")}, {L("[S(3)]")}};
    const Annotation a = value_or_throw(annotate(m.g, mesh, o));
    const LocalProgram p = run_and_compare(m, a, one_device(m, 7));
    EXPECT_EQ(collectives_for(p, "merge"), (std::multiset<std::string>{"all_to_all"}));
    if (fix_gradient) {
      EXPECT_EQ(collectives_for(p, bwd), (std::multiset<std::string>{"all_to_all"})) << bwd;
    } else {
      EXPECT_EQ(a.node[m.bwd].to_string(), "[S(2)] -> [S(2)]");
      EXPECT_TRUE(collectives_for(p, bwd).empty()) << bwd;
    }
    for (const CollectiveRecord& c : p.collectives) EXPECT_NE(c.kind, OpKind::kAllGather);
  }
}

// Propagation from the rules: x stored with head_dim on tp, y wished with
// hidden on tp. The reshape's strategy is a route (no per-rank reshape
// connects them) and it is an all_to_all.
TEST(ParallelReshape, RulesWishedOutputIsRouted) {
  ReshapeGraph m(heads_shape(4, 8), hidden_shape(32));
  const Mesh mesh = M("tp=2");
  PartitionOptions o;
  o.rules = value_or_throw(DimRules::parse("head_dim: tp, hidden: tp"));
  const Annotation a = value_or_throw(annotate(m.g, mesh, o));
  EXPECT_EQ(a.produced(m.g, m.y), L("[S(2)]"));
  const LocalProgram p = run_and_compare(m, a, one_device(m, 11));
  EXPECT_EQ(collectives_for(p, "merge"), (std::multiset<std::string>{"all_to_all"}));
}

TEST(ParallelReshape, UnreachableSplitIsAnError) {
  ReshapeGraph m(heads_shape(3, 4), hidden_shape(12));
  const Mesh mesh = M("tp=8");
  PartitionOptions o;
  o.fixed[m.fwd] = ShardingStrategy{{L("[R]")}, {L("[S(2)]")}};
  const Result<Annotation> a = annotate(m.g, mesh, o);
  ASSERT_FALSE(a.is_ok());
  const std::string msg = a.status().message();
  EXPECT_NE(msg.find("reshape 'merge': output dim 2 (hidden=12, made of heads=3 x head_dim=4) "
                     "cannot be split 8 ways (tp=8)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("valid splits of hidden on mesh {tp: 8}: 1"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  // The input side too, and a layout for another mesh.
  o.fixed[m.fwd] = ShardingStrategy{{L("[S(2)]")}, {L("[R]")}};
  EXPECT_NE(annotate(m.g, mesh, o)
                .status()
                .message()
                .find("input dim 2 (heads=3, a part of hidden=12) cannot be split 8 ways"),
            std::string::npos)
      << annotate(m.g, mesh, o).status().message();
  o.fixed[m.fwd] = ShardingStrategy{{L("[R, R]")}, {L("[R]")}};
  EXPECT_NE(annotate(m.g, mesh, o).status().message().find("has 2 placements, the mesh {tp: 8}"),
            std::string::npos);
}

}  // namespace
}  // namespace meshflow
