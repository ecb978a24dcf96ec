// Sharding rules (ops/sharding_rule.h): rule/shape consistency for every
// op of real training graphs, enumeration on 1-D and 2-D meshes, error
// messages, and a numerical check per op family: for strategies from
// enumerate_strategies, each rank runs the op's CPU kernel on its local block
// (a small local graph, no communication), and the assembled outputs (Partial
// shards summed) must equal the unsharded result.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/comm/mesh_comms.h"
#include "meshflow/models/gpt.h"
#include "meshflow/models/llama.h"
#include "meshflow/ops/builder.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/sharding_rule.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

// Every factor maps to dims of its size (reshape: a part of the dim), and no
// operand dim has two factors.
void expect_consistent(const Graph& g, const Node& n) {
  SCOPED_TRACE(print_node(g, n));
  ShardingRule r = sharding_rule(g, n);
  auto check = [&](const std::vector<ValueId>& vals, bool input) {
    for (size_t i = 0; i < vals.size(); ++i) {
      const Shape& s = g.shape(vals[i]);
      std::vector<int> seen(s.rank(), 0);
      for (const auto& f : r.factors) {
        int d = input ? f.input_dim[i] : f.output_dim[i];
        if (d < 0) continue;
        ASSERT_LT(d, s.rank()) << f.name;
        ++seen[d];
        const bool cut = (n.kind == OpKind::kSlice || n.kind == OpKind::kSliceGrad) &&
                         f.kind == ShardingRule::Factor::kNeedReplicate;
        // reshape's split groups and attention's GQA heads (query heads split with
        // the kv heads: the factor's size is kv_heads) divide the dim.
        if (n.kind == OpKind::kReshape || n.kind == OpKind::kAttention ||
            n.kind == OpKind::kAttentionGrad) {
          EXPECT_EQ(s.size(d) % f.size, 0) << f.name;
        } else if (f.kind == ShardingRule::Factor::kHalo) {
          // A spatial dim a window slides along: output rows, or stride x as many input rows.
          EXPECT_TRUE(s.size(d) == f.size || s.size(d) == f.size * f.halo_unit) << f.name;
        } else if (!cut) {
          EXPECT_EQ(s.size(d), f.size) << f.name << " on " << (input ? "input " : "output ") << i;
        }
      }
      for (int d = 0; d < s.rank(); ++d) EXPECT_LE(seen[d], 1) << "dim " << d;
    }
  };
  check(n.inputs, true);
  check(n.outputs, false);
}

Tensor random_tensor(const Shape& s, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  Tensor t = Tensor::zeros(s);
  std::uniform_real_distribution<float> u(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < s.numel(); ++i) p[i] = u(rng);
  return t;
}

Tensor random_ids(const Shape& s, int32_t n, std::mt19937& rng) {
  Tensor t = Tensor::zeros(s, DType::I32);
  int32_t* p = t.data<int32_t>();
  for (int64_t i = 0; i < s.numel(); ++i) p[i] = static_cast<int32_t>(rng() % n);
  return t;
}

// Calls fn(global flat index, local flat index) over the block `r` of `s`.
template <typename Fn>
void for_block(const Shape& s, const Ranges& r, Fn fn) {
  const int rank = s.rank();
  std::vector<int64_t> idx(rank, 0), strides = s.strides();
  int64_t local_n = 1;
  for (int d = 0; d < rank; ++d) local_n *= r[d].second - r[d].first;
  for (int64_t l = 0; l < local_n; ++l) {
    int64_t gflat = 0;
    for (int d = 0; d < rank; ++d) gflat += (r[d].first + idx[d]) * strides[d];
    fn(gflat, l);
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < r[d].second - r[d].first) break;
      idx[d] = 0;
    }
  }
}

// The block of `t` rank holds; Partial axes: the addend w = (c+1)/sum(1..k) per axis.
Tensor local_block(const Tensor& t, const Mesh& mesh, const Layout& l, int rank) {
  Shape ls = value_or_throw(local_shape(t.shape(), mesh, l));
  Tensor out = Tensor::zeros(ls, t.dtype());
  Ranges r = local_ranges(t.shape(), mesh, l, rank);
  float w = 1.f;
  std::vector<int> c = mesh.coords(rank);
  for (int a = 0; a < mesh.num_axes(); ++a)
    if (l.at(a).is_partial()) {
      const int k = mesh.size(a);
      w *= static_cast<float>(c[a] + 1) / static_cast<float>(k * (k + 1) / 2);
    }
  if (t.dtype() == DType::I32) {
    for_block(t.shape(), r,
              [&](int64_t gi, int64_t li) { out.data<int32_t>()[li] = t.data<int32_t>()[gi]; });
  } else {
    for_block(t.shape(), r,
              [&](int64_t gi, int64_t li) { out.data<float>()[li] = t.data<float>()[gi] * w; });
  }
  return out;
}

// Runs node `id` of g on `ins` (one tensor per node input); returns the outputs
// and then the inputs it mutates, after the run.
std::vector<Tensor> run_node(const Graph& g, NodeId id, const std::vector<Tensor>& ins,
                             const MeshComms* comms = nullptr) {
  const Node& n = g.node(id);
  ExecutorOptions opt;
  opt.fetch = n.outputs;
  Executor ex(g, opt);
  if (comms != nullptr) ex.set_mesh_comms(comms);
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const Tensor& t = ins[i];
    std::memcpy(ex.storage(n.inputs[i]).data<char>(), t.data<char>(), t.nbytes());
  }
  ex.run({id});
  std::vector<Tensor> outs;
  for (ValueId v : n.outputs) {
    Tensor t = Tensor::zeros(g.shape(v), g.value(v).dtype);
    std::memcpy(t.data<char>(), ex.data(v), t.nbytes());
    outs.push_back(std::move(t));
  }
  const uint32_t mut = op_def(n.kind).mutates;
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (mut & (1u << i)) {
      Tensor t = Tensor::zeros(g.shape(n.inputs[i]));
      std::memcpy(t.data<char>(), ex.storage(n.inputs[i]).data<char>(), t.nbytes());
      outs.push_back(std::move(t));
    }
  return outs;
}

int g_checked = 0;       // strategies checked numerically
int g_halo_checked = 0;  // of those, with a height or width split (real ranks)
int g_ring_checked = 0;  // of those, attention with its sequence split (a ring)

// Runs `n` of `g` split by `st` on `mesh` and compares with `want`.
void check_strategy(const Graph& g, NodeId id, const Mesh& mesh, const ShardingStrategy& st,
                    const std::vector<Tensor>& ins, const std::vector<Tensor>& want) {
  const Node& n = g.node(id);
  SCOPED_TRACE(node_label(n) + " on " + mesh.to_string() + ": " + st.to_string());
  ASSERT_TRUE(validate_strategy(g, n, mesh, st.inputs, st.outputs).is_ok())
      << validate_strategy(g, n, mesh, st.inputs, st.outputs).message();
  // Output layouts, then those of the mutated inputs.
  std::vector<Layout> out_l = st.outputs;
  std::vector<Shape> out_s;
  for (ValueId v : n.outputs) out_s.push_back(g.shape(v));
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (op_def(n.kind).mutates & (1u << i)) {
      out_l.push_back(st.inputs[i]);
      out_s.push_back(g.shape(n.inputs[i]));
    }
  std::vector<Tensor> got;
  for (size_t o = 0; o < want.size(); ++o)
    got.push_back(Tensor::zeros(want[o].shape(), want[o].dtype()));
  // A split height or width (kHalo): the kernel exchanges halos with its
  // neighbours, so the ranks run at once on in-process communicators.
  const ShardingRule rule = sharding_rule(g, n);
  std::array<int, 2> halo_axis{-1, -1};
  for (const ShardingRule::Factor& f : rule.factors) {
    if (f.kind != ShardingRule::Factor::kHalo) continue;
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (f.input_dim[i] >= 0)
        for (int ax : st.inputs[i].shard_axes(f.input_dim[i])) halo_axis[f.input_dim[i] - 2] = ax;
    for (size_t o = 0; o < n.outputs.size(); ++o)
      if (f.output_dim[o] >= 0)
        for (int ax : st.outputs[o].shard_axes(f.output_dim[o]))
          halo_axis[f.output_dim[o] - 2] = ax;
  }
  bool halo = halo_axis[0] >= 0 || halo_axis[1] >= 0;
  std::vector<std::unique_ptr<Graph>> graphs;
  std::vector<std::vector<Tensor>> inputs;
  for (int rank = 0; rank < mesh.num_ranks(); ++rank) {
    graphs.push_back(std::make_unique<Graph>());
    Graph& lg = *graphs.back();
    Builder lb(lg);
    std::vector<ValueId> lin;
    std::vector<Tensor> lt;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      lt.push_back(local_block(ins[i], mesh, st.inputs[i], rank));
      lin.push_back(lb.input("in" + std::to_string(i), lt.back().shape(), lt.back().dtype()));
    }
    Attrs a = n.attrs;
    if (a.shape.rank() > 0 && !n.outputs.empty())
      a.shape = value_or_throw(local_shape(g.shape(n.outputs[0]), mesh, st.outputs[0]));
    // What the partitioner tells kernels that need their place in the whole tensor.
    auto offsets = [&](const Shape& whole, const Layout& l) {
      for (auto [first, last] : local_ranges(whole, mesh, l, rank)) {
        a.global_offset.push_back(first);
        (void)last;
      }
      for (int d = 0; d < whole.rank(); ++d) a.global_dims.push_back(whole.size(d));
    };
    if (n.kind == OpKind::kRope || n.kind == OpKind::kDropout || n.kind == OpKind::kDropoutGrad ||
        n.kind == OpKind::kEmbeddingGrad)
      offsets(g.shape(n.outputs[0]), st.outputs[0]);
    if (n.kind == OpKind::kEmbedding) offsets(g.shape(n.inputs[0]), st.inputs[0]);
    if (n.kind == OpKind::kCrossEntropy || n.kind == OpKind::kCrossEntropyGrad) {
      const Shape& logits = g.shape(n.inputs[0]);
      if (!st.inputs[0].shard_axes(logits.rank() - 1).empty()) {
        // Vocab-parallel: the kernel's own all_reduces need communicators;
        // tests/parallel_partition_test.cc trains it on real ranks.
        if (n.kind == OpKind::kCrossEntropy) return;
        for (int ax : st.inputs[0].shard_axes(logits.rank() - 1)) a.ints.push_back(ax);
        offsets(logits, st.inputs[0]);
      }
    }
    a.halo_axis = halo_axis;
    if (n.kind == OpKind::kAttention || n.kind == OpKind::kAttentionGrad) {
      // A split sequence runs the ring (kernels/cpu/ring_attention.h) on real ranks.
      LocalAttrsCall lc{g, n, st.inputs, st.outputs, mesh, rank, a};
      set_local_attrs(lc);
      halo |= a.mesh_axis >= 0;
      if (rank == 0 && a.mesh_axis >= 0) ++g_ring_checked;
    }
    if (n.kind == OpKind::kBatchNorm || n.kind == OpKind::kBatchNormGrad) {
      // The batch or spatial dims split: the kernel all-reduces its sums over
      // real ranks (tests/ops_batch_norm_test.cc, SplitBatchEqualsOneDevice).
      const int xi = n.kind == OpKind::kBatchNorm ? 0 : 1;
      for (int d = 0; d < g.shape(n.inputs[xi]).rank(); ++d)
        if (d != 1 && !st.inputs[xi].shard_axes(d).empty()) return;
    }
    lb.op(n.kind, lin, a, n.name);
    inputs.push_back(std::move(lt));
  }
  std::vector<std::vector<Tensor>> outs(mesh.num_ranks());
  if (halo) {
    const Status s = run_local_ranks(mesh.num_ranks(), [&](const std::shared_ptr<Transport>& t) {
      MF_ASSIGN_OR_RETURN(MeshComms comms, MeshComms::make(Communicator::world(t), mesh));
      const int rank = t->rank();
      outs[rank] = run_node(*graphs[rank], graphs[rank]->num_nodes() - 1, inputs[rank], &comms);
      return Status::ok();
    });
    ASSERT_TRUE(s.is_ok()) << s.message();
    ++g_halo_checked;
  } else {
    for (int rank = 0; rank < mesh.num_ranks(); ++rank)
      outs[rank] = run_node(*graphs[rank], graphs[rank]->num_nodes() - 1, inputs[rank]);
  }
  for (int rank = 0; rank < mesh.num_ranks(); ++rank) {
    const std::vector<Tensor>& lo = outs[rank];
    // Sum the blocks of the ranks at coordinate 0 of every replicated axis.
    std::vector<int> c = mesh.coords(rank);
    for (size_t o = 0; o < want.size(); ++o) {
      bool rep = false;
      for (int ax = 0; ax < mesh.num_axes(); ++ax)
        rep = rep || (!out_l[o].at(ax).is_shard() && !out_l[o].at(ax).is_partial() && c[ax] != 0);
      if (rep) continue;
      Ranges r = local_ranges(out_s[o], mesh, out_l[o], rank);
      if (want[o].dtype() == DType::I32) {
        for_block(out_s[o], r, [&](int64_t gi, int64_t li) {
          got[o].data<int32_t>()[gi] += lo[o].data<int32_t>()[li];
        });
      } else {
        for_block(out_s[o], r, [&](int64_t gi, int64_t li) {
          got[o].data<float>()[gi] += lo[o].data<float>()[li];
        });
      }
    }
  }
  ++g_checked;
  for (size_t o = 0; o < want.size(); ++o) {
    const int64_t numel = want[o].shape().numel();
    if (want[o].dtype() == DType::I32) {
      for (int64_t i = 0; i < numel; ++i)
        ASSERT_EQ(got[o].data<int32_t>()[i], want[o].data<int32_t>()[i])
            << "output " << o << " @" << i;
      continue;
    }
    float scale = 0;
    for (int64_t i = 0; i < numel; ++i) scale = std::max(scale, std::abs(want[o].data<float>()[i]));
    for (int64_t i = 0; i < numel; ++i) {
      const float w = want[o].data<float>()[i], v = got[o].data<float>()[i];
      if (std::isinf(w) && w == v) continue;
      ASSERT_LE(std::abs(v - w), 1e-5f * (std::abs(w) + scale) + 1e-7f)
          << "output " << o << " @" << i << ": " << v << " vs " << w;
    }
  }
}

// A graph of input nodes feeding one op, with global values for its inputs.
struct OpCase {
  Graph g;
  Builder b{g};
  std::vector<ValueId> ins;
  std::vector<Tensor> vals;
  std::mt19937 rng{7};

  ValueId in(const Shape& s, float lo = -1.f, float hi = 1.f) {
    ins.push_back(b.input("x" + std::to_string(ins.size()), s));
    vals.push_back(random_tensor(s, rng, lo, hi));
    return ins.back();
  }
  ValueId ids(const Shape& s, int32_t n) {
    ins.push_back(b.input("x" + std::to_string(ins.size()), s, DType::I32));
    vals.push_back(random_ids(s, n, rng));
    return ins.back();
  }
  NodeId op(OpKind k, Attrs a = {}, const std::string& name = "op") {
    b.op(k, ins, a, name);
    return g.num_nodes() - 1;
  }
};

// Every strategy (up to `max_per_mesh`, sampled) on each mesh, plus, where the
// rule allows, a variant with a Partial input set on a replicated axis.
void check_op(OpCase& c, NodeId id, int max_per_mesh = 24) {
  const Node& n = c.g.node(id);
  const int checked0 = g_checked;
  struct Report {
    const Node& n;
    const int& c0;
    ~Report() {
      if (std::getenv("MF_SHARDING_VERBOSE"))
        std::fprintf(stderr, "%s: %d strategies checked\n", node_label(n).c_str(), g_checked - c0);
    }
  } report{n, checked0};
  expect_consistent(c.g, n);
  std::vector<Tensor> want = run_node(c.g, id, c.vals);
  ShardingRule rule = sharding_rule(c.g, n);
  std::mt19937 rng(11);
  for (const char* m : {"x=2", "x=3", "x=4", "x=2,y=2"}) {
    Mesh mesh = value_or_throw(Mesh::parse(m));
    std::vector<ShardingStrategy> all = enumerate_strategies(c.g, n, mesh);
    ASSERT_FALSE(all.empty());
    EXPECT_TRUE(all[0].inputs.empty() || all[0].inputs[0].is_replicated());
    std::shuffle(all.begin() + 1, all.end(), rng);
    if (static_cast<int>(all.size()) > max_per_mesh) all.resize(max_per_mesh);
    for (const ShardingStrategy& st : all) {
      check_strategy(c.g, id, mesh, st, c.vals, want);
      if (::testing::Test::HasFatalFailure()) return;
      for (const auto& set : rule.partial_inputs)
        for (int ax = 0; ax < mesh.num_axes(); ++ax) {
          bool free = true;
          for (const Layout& l : st.inputs) free = free && l.at(ax).is_replicate();
          if (!free) continue;
          ShardingStrategy p = st;
          for (int i : set) p.inputs[i] = p.inputs[i].with(ax, Placement::Partial());
          auto outs = derive_output_layouts(c.g, n, mesh, p.inputs);
          ASSERT_TRUE(outs.is_ok()) << outs.status().message();
          p.outputs = outs.value();
          check_strategy(c.g, id, mesh, p, c.vals, want);
          if (::testing::Test::HasFatalFailure()) return;
          break;
        }
    }
  }
}

Shape S(std::vector<std::pair<const char*, int64_t>> dims) {
  std::vector<Dim> d;
  for (auto& [name, size] : dims) d.push_back(Dim{name, size});
  return Shape(d);
}

// ---- rules of real graphs ----

TEST(ParallelSharding, EveryOpKindHasARule) {
  for (int k = 0; k < kNumOpKinds; ++k)
    EXPECT_NE(op_def(static_cast<OpKind>(k)).sharding, nullptr) << op_name(static_cast<OpKind>(k));
}

void check_graph_rules(const Graph& g) {
  Mesh mesh = value_or_throw(Mesh::parse("dp=2,tp=2"));
  for (const Node& n : g.nodes()) {
    expect_consistent(g, n);
    std::vector<ShardingStrategy> all = enumerate_strategies(g, n, mesh);
    ASSERT_FALSE(all.empty()) << print_node(g, n);
    for (const ShardingStrategy& st : all)
      ASSERT_TRUE(validate_strategy(g, n, mesh, st.inputs, st.outputs).is_ok()) << print_node(g, n);
  }
}

TEST(ParallelSharding, GptTrainingGraphRulesAreConsistent) {
  GptConfig cfg;
  cfg.n_layer = 1, cfg.n_embd = 16, cfg.n_head = 2, cfg.n_positions = 16, cfg.vocab_size = 32;
  cfg.resid_pdrop = 0.1f;
  ModelGraph m = value_or_throw(build_gpt(cfg, 2, 8));
  append_backward(m.graph);
  OptimizerConfig oc;
  oc.grad_clip = 1.f;
  append_optimizer(m.graph, oc);
  check_graph_rules(m.graph);
}

TEST(ParallelSharding, LlamaTrainingGraphRulesAreConsistent) {
  LlamaConfig cfg;
  cfg.num_hidden_layers = 1, cfg.hidden_size = 16, cfg.num_attention_heads = 4;
  cfg.num_key_value_heads = 2, cfg.intermediate_size = 32, cfg.vocab_size = 32;
  cfg.max_position_embeddings = 16;
  ModelGraph m = value_or_throw(build_llama(cfg, 2, 8));
  append_backward(m.graph);
  OptimizerConfig oc;
  oc.kind = OptimizerKind::kSgd;
  oc.momentum = 0.9f;
  append_optimizer(m.graph, oc);
  check_graph_rules(m.graph);
}

// ---- enumeration and errors ----

TEST(ParallelSharding, EnumerateMatmulOn1DAnd2DMeshes) {
  OpCase c;
  c.in(S({{"m", 8}, {"k", 4}}));
  c.in(S({{"k", 4}, {"n", 6}}));
  NodeId id = c.op(OpKind::kMatMul);
  const Node& n = c.g.node(id);
  // 1-D, 2 ranks: R, m, n, k (all divide by 2).
  auto one = enumerate_strategies(c.g, n, Mesh::line(2));
  ASSERT_EQ(one.size(), 4u);
  EXPECT_EQ(one[0].to_string(), "[R], [R] -> [R]");
  std::vector<std::string> got;
  for (auto& s : one) got.push_back(s.to_string());
  EXPECT_EQ(got, (std::vector<std::string>{"[R], [R] -> [R]", "[S(0)], [R] -> [S(0)]",
                                           "[R], [S(1)] -> [S(1)]", "[S(1)], [S(0)] -> [P]"}));
  // 1-D, 4 ranks: n=6 does not split 4 ways.
  EXPECT_EQ(enumerate_strategies(c.g, n, Mesh::line(4)).size(), 3u);
  // 2-D {2, 2}: 4 options per axis, all valid (m=8 splits 4 ways, n 2 ways, k 4 ways; n on
  // both axes would be 4 ways: invalid) -> 16 - 1.
  auto two = enumerate_strategies(c.g, n, value_or_throw(Mesh::parse("a=2,b=2")));
  EXPECT_EQ(two.size(), 15u);
}

TEST(ParallelSharding, MismatchedSplitNamesDimSizesAndValidSplits) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", S({{"t", 16}, {"k", 1024}}));
  ValueId w = b.input("w", S({{"k", 1024}, {"n", 64}}));
  b.matmul(x, w, {}, "h.0.mlp.fc2");
  const Node& n = g.node(g.num_nodes() - 1);
  Mesh mesh = value_or_throw(Mesh::parse("dp=2,tp=4"));
  Layout a = value_or_throw(Layout::parse("[R, S(1)]"));
  Layout bl = value_or_throw(Layout::parse("[S(0), R]"));
  Status s = validate_strategy(g, n, mesh, {a, bl}, {Layout::Replicated(2)});
  EXPECT_EQ(s.message(),
            "matmul 'h.0.mlp.fc2': dim k=1024 is split 4 ways on input 0 but 2 ways on input 1; "
            "valid splits of k: 1, 2, 4, 8");
  // A consistent K split gives Partial; claiming Replicate is an error that names it.
  Layout bk = value_or_throw(Layout::parse("[R, S(0)]"));
  s = validate_strategy(g, n, mesh, {a, bk}, {Layout::Replicated(2)});
  EXPECT_NE(s.message().find("would be [R, P]"), std::string::npos) << s.message();
  EXPECT_TRUE(
      validate_strategy(g, n, mesh, {a, bk}, {value_or_throw(Layout::parse("[R, P]"))}).is_ok());
}

TEST(ParallelSharding, NeedReplicateAndPartialErrors) {
  OpCase c;
  c.in(S({{"b", 4}, {"v", 8}}));
  NodeId id = c.op(OpKind::kSoftmax, {}, "sm");
  Mesh mesh = Mesh::line(2);
  auto r =
      derive_output_layouts(c.g, c.g.node(id), mesh, {value_or_throw(Layout::parse("[S(1)]"))});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(
      r.status().message().find("softmax 'sm': dim 1 (v=8) of input 0 is factor v=8, which must "
                                "be replicated"),
      std::string::npos)
      << r.status().message();
  r = derive_output_layouts(c.g, c.g.node(id), mesh, {value_or_throw(Layout::parse("[P]"))});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("Partial inputs must be one of none"), std::string::npos)
      << r.status().message();
}

TEST(ParallelSharding, ReshapeRuleSplitsAndMerges) {
  ShardingRule r = reshape_rule(S({{"a", 4}, {"b", 6}, {"c", 8}}), S({{"a", 4}, {"bc", 48}}));
  EXPECT_EQ(r.to_string(), "a=4 b>bc=6 c=8(rep)");
  r = reshape_rule(S({{"a", 4}, {"b", 6}}), S({{"x", 8}, {"one", 1}, {"y", 3}}));
  EXPECT_EQ(r.to_string(), "a>x=4 b=6(rep) y=3(rep)");
}

// ---- numerical checks per op family ----

TEST(ParallelShardingNumeric, MatMulAllTransposes) {
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      OpCase c;
      c.in(ta ? S({{"k", 12}, {"m", 4}}) : S({{"m", 4}, {"k", 12}}));
      c.in(tb ? S({{"n", 6}, {"k", 12}}) : S({{"k", 12}, {"n", 6}}));
      Attrs a;
      a.trans_a = ta, a.trans_b = tb;
      NodeId id = c.op(OpKind::kMatMul, a);
      check_op(c, id);
      if (HasFatalFailure()) return;
    }
}

TEST(ParallelShardingNumeric, BatchedMultiDimMatMul) {
  OpCase c;
  c.in(S({{"b", 2}, {"m", 4}, {"h", 2}, {"d", 3}}));
  c.in(S({{"b", 2}, {"h", 2}, {"d", 3}, {"n", 6}}));
  Attrs a;
  a.batch_dims = 1, a.contract = 2;
  check_op(c, c.op(OpKind::kMatMul, a));
}

TEST(ParallelShardingNumeric, AddWithBroadcast) {
  {
    OpCase c;
    c.in(S({{"b", 4}, {"s", 6}, {"h", 8}}));
    c.in(S({{"h", 8}}));
    check_op(c, c.op(OpKind::kAdd));
  }
  OpCase c;
  c.in(S({{"b", 4}, {"s", 1}, {"h", 6}}));
  c.in(S({{"b", 4}, {"s", 6}, {"h", 6}}));
  check_op(c, c.op(OpKind::kMul));
}

TEST(ParallelShardingNumeric, SumToAndBroadcastTo) {
  {
    OpCase c;
    c.in(S({{"b", 4}, {"s", 6}, {"h", 8}}));
    Attrs a;
    a.shape = S({{"s", 6}, {"h", 1}});
    check_op(c, c.op(OpKind::kSumTo, a));
  }
  OpCase c;
  c.in(S({{"s", 6}, {"h", 1}}));
  Attrs a;
  a.shape = S({{"b", 4}, {"s", 6}, {"h", 8}});
  check_op(c, c.op(OpKind::kBroadcastTo, a));
}

TEST(ParallelShardingNumeric, GeluAndGrad) {
  {
    OpCase c;
    c.in(S({{"b", 4}, {"s", 6}, {"h", 8}}));
    check_op(c, c.op(OpKind::kGelu));
  }
  OpCase c;
  c.in(S({{"b", 4}, {"h", 6}}));
  c.in(S({{"b", 4}, {"h", 6}}));
  check_op(c, c.op(OpKind::kGeluGrad));
}

TEST(ParallelShardingNumeric, SoftmaxAndGrad) {
  {
    OpCase c;
    c.in(S({{"b", 4}, {"s", 6}, {"v", 8}}), -3.f, 3.f);
    check_op(c, c.op(OpKind::kSoftmax));
  }
  OpCase c;
  c.in(S({{"b", 4}, {"v", 6}}), 0.f, 1.f);
  c.in(S({{"b", 4}, {"v", 6}}));
  check_op(c, c.op(OpKind::kSoftmaxGrad));
}

TEST(ParallelShardingNumeric, CorrectCountSumsOverShards) {
  OpCase c;
  c.in(S({{"b", 4}, {"s", 6}, {"v", 5}}));
  c.ids(S({{"b", 4}, {"s", 6}}), 5);
  check_op(c, c.op(OpKind::kCorrectCount));
}

// conv2d and its gradients: batch and output channels pass through, input
// channels are a reduction (Partial), grouped convolutions split the batch only.
TEST(ParallelShardingNumeric, Conv2dAndGrads) {
  Attrs a;
  a.stride = {2, 1}, a.padding = {1, 1};
  const Shape x = S({{"b", 12}, {"c", 6}, {"h", 5}, {"w", 4}});
  const Shape w = S({{"o", 12}, {"c", 6}, {"kh", 3}, {"kw", 3}});
  const Shape y = S({{"b", 12}, {"o", 12}, {"h", 3}, {"w", 4}});
  {
    OpCase c;
    c.in(x);
    c.in(w);
    check_op(c, c.op(OpKind::kConv2d, a));
  }
  {
    OpCase c;
    c.in(y);
    c.in(w);
    a.shape = x;
    check_op(c, c.op(OpKind::kConv2dGradInput, a));
  }
  {
    OpCase c;
    c.in(y);
    c.in(x);
    a.shape = w;
    check_op(c, c.op(OpKind::kConv2dGradWeight, a));
  }
  OpCase c;  // groups = 2: the batch only
  c.in(x);
  c.in(S({{"o", 12}, {"c", 3}, {"kh", 3}, {"kw", 3}}));
  Attrs grouped;
  grouped.groups = 2;
  check_op(c, c.op(OpKind::kConv2d, grouped));
}

// A spatial split is as fine as the halo allows: each block must hold the
// rows the windows reach into it; the message names the most ways that work.
TEST(ParallelShardingRule, SpatialSplitFinerThanTheHaloIsAnError) {
  Graph g;
  Builder b(g);
  const ValueId x = b.input("x", S({{"batch", 2}, {"channels", 3}, {"height", 16}, {"width", 16}}));
  const ValueId w = b.input("w", S({{"channels_out", 4}, {"channels", 3}, {"kh", 7}, {"kw", 7}}));
  Attrs a;
  a.padding = {3, 3};
  b.op(OpKind::kConv2d, {x, w}, a, "conv");
  const Node& n = g.node(g.num_nodes() - 1);
  EXPECT_EQ(sharding_rule(g, n).factors[3].kind, ShardingRule::Factor::kHalo);
  const Mesh four = value_or_throw(Mesh::parse("sp=4")),
             eight = value_or_throw(Mesh::parse("sp=8"));
  const Layout h = value_or_throw(Layout::make({Placement::Shard(2)}));
  const Layout r = Layout::Replicated(1);
  EXPECT_TRUE(derive_output_layouts(g, n, four, {h, r}).is_ok());  // 4 rows a block, halo 3
  Result<std::vector<Layout>> bad = derive_output_layouts(g, n, eight, {h, r});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("splitting height 8 ways leaves 2 input rows per block, "
                                        "fewer than the 3 rows its window reaches into a "
                                        "neighbour's block (the halo); split it at most 4 ways"),
            std::string::npos)
      << bad.status().message();
  // One mesh axis per spatial dim: its exchange runs between line neighbours.
  const Mesh two = value_or_throw(Mesh::parse("a=2,b=2"));
  const Layout both =
      value_or_throw(Layout::make({Placement::Shard(2, 0), Placement::Shard(2, 1)}));
  Result<std::vector<Layout>> axes =
      derive_output_layouts(g, n, two, {both, Layout::Replicated(2)});
  ASSERT_FALSE(axes.is_ok());
  EXPECT_NE(axes.status().message().find("split over several mesh axes"), std::string::npos)
      << axes.status().message();
  // A stride that does not tile the input (OH x stride != H) keeps the dim whole.
  a.stride = {3, 3};
  b.op(OpKind::kConv2d, {x, w}, a, "strided");
  EXPECT_EQ(sharding_rule(g, g.node(g.num_nodes() - 1)).factors[3].kind,
            ShardingRule::Factor::kNeedReplicate);
}

// Height and width split with halo exchanges, every window op and gradient,
// strided and not, on real in-process ranks: each strategy equals one device.
TEST(ParallelShardingNumeric, WindowsSplitSpatiallyExchangeHalos) {
  const int before = g_halo_checked;
  struct Conv {
    Shape x, w, y;
    std::array<int64_t, 2> stride, padding;
  };
  for (const Conv& k : {Conv{S({{"b", 2}, {"c", 3}, {"h", 8}, {"w", 8}}),
                             S({{"o", 4}, {"c", 3}, {"kh", 3}, {"kw", 3}}),
                             S({{"b", 2}, {"o", 4}, {"h", 4}, {"w", 4}}),
                             {2, 2},
                             {1, 1}},
                        Conv{S({{"b", 2}, {"c", 2}, {"h", 8}, {"w", 6}}),
                             S({{"o", 2}, {"c", 2}, {"kh", 5}, {"kw", 3}}),
                             S({{"b", 2}, {"o", 2}, {"h", 8}, {"w", 6}}),
                             {1, 1},
                             {2, 1}}}) {
    Attrs a;
    a.stride = k.stride, a.padding = k.padding;
    {
      OpCase c;
      c.in(k.x);
      c.in(k.w);
      check_op(c, c.op(OpKind::kConv2d, a), 48);
    }
    {
      OpCase c;
      c.in(k.y);
      c.in(k.w);
      a.shape = k.x;
      check_op(c, c.op(OpKind::kConv2dGradInput, a), 48);
    }
    OpCase c;
    c.in(k.y);
    c.in(k.x);
    a.shape = k.w;
    check_op(c, c.op(OpKind::kConv2dGradWeight, a), 48);
  }
  Attrs p;  // ResNet's stem pool, and a stride-1 average
  p.kernel = {3, 3}, p.stride = {2, 2}, p.padding = {1, 1};
  const Shape x = S({{"b", 2}, {"c", 3}, {"h", 8}, {"w", 8}}),
              y = S({{"b", 2}, {"c", 3}, {"h", 4}, {"w", 4}});
  for (OpKind kind : {OpKind::kMaxPool2d, OpKind::kAvgPool2d}) {
    OpCase c;
    c.in(x);
    check_op(c, c.op(kind, p), 48);
  }
  {
    OpCase c;
    c.in(y);
    c.in(x);
    check_op(c, c.op(OpKind::kMaxPool2dGrad, p), 48);
  }
  OpCase c;
  c.in(y);
  Attrs g = p;
  g.shape = x;
  check_op(c, c.op(OpKind::kAvgPool2dGrad, g), 48);
  EXPECT_GT(g_halo_checked - before, 40);
}

// Pooling: batch and channels pass through; a split height / width needs real ranks.
TEST(ParallelShardingNumeric, PoolingAndGrads) {
  const Shape x = S({{"b", 6}, {"c", 4}, {"h", 7}, {"w", 6}});
  Attrs a;
  a.kernel = {3, 2}, a.stride = {2, 2}, a.padding = {1, 0};
  const Shape y = S({{"b", 6}, {"c", 4}, {"h", 4}, {"w", 3}});
  for (OpKind k : {OpKind::kMaxPool2d, OpKind::kAvgPool2d}) {
    OpCase c;
    c.in(x);
    check_op(c, c.op(k, a));
  }
  {
    OpCase c;
    c.in(y);
    c.in(x);
    check_op(c, c.op(OpKind::kMaxPool2dGrad, a));
  }
  OpCase c;
  c.in(y);
  Attrs g = a;
  g.shape = x;
  check_op(c, c.op(OpKind::kAvgPool2dGrad, g));
}

// Batch norm: the channels split (the batch / spatial splits need ranks: see
// tests/ops_batch_norm_test.cc); the running-statistics update per channel.
TEST(ParallelShardingNumeric, BatchNormAndGradAndUpdate) {
  const Shape x = S({{"b", 4}, {"c", 6}, {"h", 3}, {"w", 2}});
  const Shape c6 = S({{"c", 6}});
  Attrs a;
  {
    OpCase c;
    c.in(x);
    c.in(c6);
    c.in(c6);
    c.in(c6);
    c.in(c6, 0.5f, 2.f);
    c.ids(S({{"rng", 2}}), 1);  // 0: training
    check_op(c, c.op(OpKind::kBatchNorm, a));
  }
  {
    OpCase c;
    c.in(x);
    c.in(x);
    c.in(c6);
    c.in(c6);
    c.in(c6, 0.5f, 2.f);
    check_op(c, c.op(OpKind::kBatchNormGrad, a));
  }
  OpCase c;
  c.in(c6);
  c.in(c6, 0.5f, 2.f);
  c.in(c6);
  c.in(c6, 0.5f, 2.f);
  a.momentum = 0.1f, a.alpha = 1.05f;
  check_op(c, c.op(OpKind::kBatchNormUpdate, a));
}

TEST(ParallelShardingNumeric, LayerNormAndGrad) {
  {
    OpCase c;
    c.in(S({{"b", 4}, {"s", 6}, {"c", 8}}));
    c.in(S({{"c", 8}}));
    c.in(S({{"c", 8}}));
    Attrs a;
    check_op(c, c.op(OpKind::kLayerNorm, a));
  }
  OpCase c;
  c.in(S({{"b", 4}, {"s", 6}, {"c", 8}}));   // dy
  c.in(S({{"b", 4}, {"s", 6}, {"c", 8}}));   // x
  c.in(S({{"c", 8}}));                       // gamma
  c.in(S({{"b", 4}, {"s", 6}}));             // mean
  c.in(S({{"b", 4}, {"s", 6}}), 0.5f, 2.f);  // rstd
  check_op(c, c.op(OpKind::kLayerNormGrad));
}

TEST(ParallelShardingNumeric, RmsNorm) {
  OpCase c;
  c.in(S({{"b", 4}, {"s", 6}, {"c", 8}}));
  c.in(S({{"c", 8}}));
  check_op(c, c.op(OpKind::kRmsNorm));
}

TEST(ParallelShardingNumeric, EmbeddingAndGrad) {
  {
    OpCase c;
    c.in(S({{"vocab", 10}, {"c", 8}}));
    c.ids(S({{"b", 4}, {"s", 6}}), 10);
    check_op(c, c.op(OpKind::kEmbedding));
  }
  OpCase c;
  c.in(S({{"b", 4}, {"s", 6}, {"c", 8}}));
  c.ids(S({{"b", 4}, {"s", 6}}), 10);
  Attrs a;
  a.shape = S({{"vocab", 10}, {"c", 8}});
  check_op(c, c.op(OpKind::kEmbeddingGrad, a));
}

TEST(ParallelShardingNumeric, Transpose) {
  OpCase c;
  c.in(S({{"a", 4}, {"b", 6}, {"c", 8}}));
  Attrs a;
  a.axes = {2, 0, 1};
  check_op(c, c.op(OpKind::kTranspose, a));
}

TEST(ParallelShardingNumeric, Reshape) {
  std::vector<std::pair<Shape, Shape>> cases = {
      {S({{"a", 4}, {"b", 6}, {"c", 8}}), S({{"a", 4}, {"bc", 48}})},
      {S({{"ab", 24}, {"c", 8}}), S({{"a", 4}, {"b", 6}, {"c", 8}})},
      {S({{"a", 4}, {"b", 6}, {"c", 8}}), S({{"x", 8}, {"y", 6}, {"z", 4}})},
      {S({{"a", 6}, {"b", 4}}), S({{"x", 4}, {"one", 1}, {"y", 6}})},
  };
  for (auto& [in, out] : cases) {
    OpCase c;
    c.in(in);
    Attrs a;
    a.shape = out;
    check_op(c, c.op(OpKind::kReshape, a));
    if (HasFatalFailure()) return;
  }
}

TEST(ParallelShardingNumeric, SliceAndConcat) {
  {
    OpCase c;
    c.in(S({{"a", 4}, {"b", 6}}));
    Attrs a;
    a.axes = {1};
    a.ints = {1, 4};
    check_op(c, c.op(OpKind::kSlice, a));
  }
  OpCase c;
  c.in(S({{"a", 4}, {"b", 6}}));
  c.in(S({{"a", 4}, {"b", 2}}));
  Attrs a;
  a.axes = {1};
  check_op(c, c.op(OpKind::kConcat, a));
}

TEST(ParallelShardingNumeric, Reductions) {
  for (OpKind k : {OpKind::kReduceSum, OpKind::kReduceMean, OpKind::kReduceMax})
    for (bool keep : {false, true}) {
      OpCase c;
      c.in(S({{"a", 4}, {"b", 6}, {"c", 8}}));
      Attrs a;
      a.axes = {0, 2};
      a.keepdims = keep;
      check_op(c, c.op(k, a), 12);
      if (HasFatalFailure()) return;
    }
}

TEST(ParallelShardingNumeric, Attention) {
  for (bool causal : {true, false})
    for (int64_t hkv : {4, 2}) {
      OpCase c;
      c.in(S({{"b", 2}, {"h", 4}, {"t", 6}, {"d", 4}}));
      c.in(S({{"b", 2}, {"hkv", hkv}, {"s", 6}, {"d", 4}}));
      c.in(S({{"b", 2}, {"hkv", hkv}, {"s", 6}, {"d", 4}}));
      Attrs a;
      a.causal = causal;
      a.alpha = 0.f;
      check_op(c, c.op(OpKind::kAttention, a), 12);
      if (HasFatalFailure()) return;
    }
}

// Ring attention (kernels/cpu/ring_attention.h): the query and key sequence
// split together over 2 and 4 ranks (and with batch or heads over a second
// axis), causal and not, with GQA where kv_heads < cp and heads < cp; forward
// and backward equal to the unsharded op.
TEST(ParallelShardingNumeric, RingAttentionSequenceSplits) {
  const int before = g_ring_checked;
  for (bool causal : {true, false})
    for (auto [h, hkv] : {std::pair<int64_t, int64_t>{4, 4}, {4, 1}, {2, 2}, {2, 1}}) {
      SCOPED_TRACE("causal " + std::to_string(causal) + " heads " + std::to_string(h) + "/" +
                   std::to_string(hkv));
      const Shape q = S({{"b", 2}, {"h", h}, {"t", 8}, {"d", 4}});
      const Shape kv = S({{"b", 2}, {"hkv", hkv}, {"t", 8}, {"d", 4}});
      OpCase c;
      const ValueId qi = c.in(q), ki = c.in(kv), vi = c.in(kv);
      Attrs a;
      a.causal = causal;
      a.alpha = 0.f;
      check_op(c, c.op(OpKind::kAttention, a), 64);
      if (HasFatalFailure()) return;
      (void)qi, (void)ki, (void)vi;
      // The backward on the forward's real out and lse.
      std::vector<Tensor> fw = run_node(c.g, c.g.num_nodes() - 1, c.vals);
      OpCase d;
      d.in(q), d.in(q), d.in(kv), d.in(kv), d.in(q);
      d.in(S({{"b", 2}, {"h", h}, {"t", 8}}));
      for (int i = 0; i < 3; ++i) d.vals[1 + i] = c.vals[i];
      d.vals[4] = fw[0];
      d.vals[5] = fw[1];
      check_op(d, d.op(OpKind::kAttentionGrad, a), 64);
      if (HasFatalFailure()) return;
    }
  // Every case has splits of t over x=2, x=4 and one axis of x=2,y=2.
  EXPECT_GE(g_ring_checked - before, 16 * 4);
  // A long sequence: 160 and 80 local rows, more than one of the ring
  // kernels' tiles of 64 query rows (ops/zigzag.h kRingTileRows), the last
  // partial, each tile against the keys its rows see.
  for (bool causal : {true, false}) {
    SCOPED_TRACE("long sequence, causal " + std::to_string(causal));
    const Shape q = S({{"b", 1}, {"h", 2}, {"t", 320}, {"d", 4}});
    const Shape kv = S({{"b", 1}, {"hkv", 1}, {"t", 320}, {"d", 4}});
    OpCase c;
    c.in(q), c.in(kv), c.in(kv);
    Attrs a;
    a.causal = causal;
    a.alpha = 0.f;
    const int checked = g_ring_checked;
    check_op(c, c.op(OpKind::kAttention, a), 64);
    if (HasFatalFailure()) return;
    std::vector<Tensor> fw = run_node(c.g, c.g.num_nodes() - 1, c.vals);
    OpCase d;
    d.in(q), d.in(q), d.in(kv), d.in(kv), d.in(q);
    d.in(S({{"b", 1}, {"h", 2}, {"t", 320}}));
    for (int i = 0; i < 3; ++i) d.vals[1 + i] = c.vals[i];
    d.vals[4] = fw[0];
    d.vals[5] = fw[1];
    check_op(d, d.op(OpKind::kAttentionGrad, a), 64);
    if (HasFatalFailure()) return;
    EXPECT_GE(g_ring_checked - checked, 4);
  }
}

TEST(ParallelShardingNumeric, SumSquaresAndAdamW) {
  {
    OpCase c;
    c.in(S({{"a", 4}, {"b", 6}}));
    check_op(c, c.op(OpKind::kSumSquares));
  }
  OpCase c;
  Shape p = S({{"a", 4}, {"b", 6}});
  c.in(p);                      // param
  c.in(p);                      // grad
  c.in(p);                      // m
  c.in(p, 0.f, 1.f);            // v
  c.in(Shape{}, 0.01f, 0.01f);  // lr
  c.in(Shape{}, 3.f, 3.f);      // step
  c.in(Shape{}, 0.5f, 0.5f);    // coef
  Attrs a;
  a.weight_decay = 0.1f;
  check_op(c, c.op(OpKind::kAdamWUpdate, a), 12);
}

TEST(ParallelShardingNumeric, MoreElementwise) {
  for (OpKind k : {OpKind::kSub, OpKind::kDiv, OpKind::kBiasAdd}) {
    OpCase c;
    c.in(S({{"b", 4}, {"h", 6}}));
    c.in(S({{"h", 6}}), 1.f, 2.f);
    check_op(c, c.op(k));
    if (HasFatalFailure()) return;
  }
  for (OpKind k : {OpKind::kScale, OpKind::kRelu, OpKind::kSilu, OpKind::kLogSoftmax}) {
    OpCase c;
    c.in(S({{"b", 4}, {"h", 6}}));
    Attrs a;
    a.alpha = 0.5f;
    check_op(c, c.op(k, a));
    if (HasFatalFailure()) return;
  }
  for (OpKind k : {OpKind::kReluGrad, OpKind::kSiluGrad, OpKind::kLogSoftmaxGrad}) {
    OpCase c;
    c.in(S({{"b", 4}, {"h", 6}}));
    c.in(S({{"b", 4}, {"h", 6}}));
    check_op(c, c.op(k));
    if (HasFatalFailure()) return;
  }
}

// With its rows sharded, each shard divides by the whole batch's count (the
// input the partitioner adds), so the loss is Partial and the rows split.
TEST(ParallelShardingNumeric, CrossEntropyRowsWithTheGlobalCount) {
  OpCase c;
  c.in(S({{"b", 4}, {"s", 6}, {"v", 5}}));
  c.ids(S({{"b", 4}, {"s", 6}}), 5);
  c.in(Shape{}, 24.f, 24.f);  // every target is valid: 4 x 6
  NodeId id = c.op(OpKind::kCrossEntropy);
  // Replicated, b split, s split; never v.
  EXPECT_EQ(enumerate_strategies(c.g, c.g.node(id), Mesh::line(2)).size(), 3u);
  check_op(c, id);
}

TEST(ParallelShardingNumeric, RmsNormGradAndSliceGradAndReduceMaxGrad) {
  {
    OpCase c;
    c.in(S({{"b", 4}, {"c", 8}}));   // dy
    c.in(S({{"b", 4}, {"c", 8}}));   // x
    c.in(S({{"c", 8}}));             // gamma
    c.in(S({{"b", 4}}), 0.5f, 2.f);  // rstd
    check_op(c, c.op(OpKind::kRmsNormGrad));
  }
  {
    OpCase c;
    c.in(S({{"a", 4}, {"b", 3}}));
    Attrs a;
    a.axes = {1};
    a.ints = {1, 4};
    a.shape = S({{"a", 4}, {"b", 6}});
    check_op(c, c.op(OpKind::kSliceGrad, a));
  }
  OpCase c;
  c.in(S({{"a", 4}, {"b", 6}}));
  c.in(S({{"a", 4}}));
  c.in(S({{"a", 4}}));
  Attrs a;
  a.axes = {1};
  // y = the true max of x, so the grad has work to do.
  for (int i = 0; i < 4; ++i) {
    float m = -1e9f;
    for (int j = 0; j < 6; ++j) m = std::max(m, c.vals[0].data<float>()[i * 6 + j]);
    c.vals[1].data<float>()[i] = m;
  }
  check_op(c, c.op(OpKind::kReduceMaxGrad, a));
}

TEST(ParallelShardingNumeric, AttentionGradRopeDropout) {
  {
    OpCase c;
    Shape q = S({{"b", 2}, {"h", 4}, {"t", 6}, {"d", 4}});
    Graph& g = c.g;
    ValueId qi = c.in(q), ki = c.in(q), vi = c.in(q);
    ValueId out = c.b.attention(qi, ki, vi, /*causal=*/false);
    (void)g;
    // dout, q, k, v, out, lse: feed dout and the real out/lse from a forward run.
    std::vector<Tensor> fw = run_node(c.g, c.g.num_nodes() - 1, c.vals);
    OpCase d;
    d.in(q);
    d.in(q), d.in(q), d.in(q), d.in(q);
    d.in(S({{"b", 2}, {"h", 4}, {"t", 6}}));
    for (int i = 0; i < 3; ++i) d.vals[1 + i] = c.vals[i];
    d.vals[4] = fw[0];
    d.vals[5] = fw[1];
    (void)out;
    Attrs a;
    a.causal = false;
    check_op(d, d.op(OpKind::kAttentionGrad, a), 12);
    if (HasFatalFailure()) return;
  }
  {
    OpCase c;
    c.in(S({{"b", 2}, {"t", 6}, {"h", 4}, {"d", 4}}));
    Attrs a;
    check_op(c, c.op(OpKind::kRope, a));
    if (HasFatalFailure()) return;
  }
  // dropout with p = 0 (a sharded mask differs from the unsharded one for p > 0: see
  // ops/attention.cc).
  OpCase c;
  c.in(S({{"b", 4}, {"h", 6}}));
  ValueId off = c.b.rng_offset();
  c.ins.push_back(off);
  c.vals.push_back(Tensor::zeros(Shape{{"rng", 2}}, DType::I32));
  Attrs a;
  a.p = 0.f;
  check_op(c, c.op(OpKind::kDropout, a));
}

TEST(ParallelShardingNumeric, SgdUpdateAndClipCoef) {
  {
    OpCase c;
    Shape p = S({{"a", 4}, {"b", 6}});
    c.in(p), c.in(p), c.in(p);
    c.in(Shape{}, 0.1f, 0.1f);
    c.in(Shape{}, 1.f, 1.f);
    Attrs a;
    a.momentum = 0.9f;
    a.weight_decay = 0.01f;
    check_op(c, c.op(OpKind::kSgdUpdate, a));
  }
  OpCase c;
  c.in(Shape{}, 1.f, 2.f), c.in(Shape{}, 1.f, 2.f);
  Attrs a;
  a.max_norm = 1.f;
  check_op(c, c.op(OpKind::kClipCoef, a));
}

}  // namespace
}  // namespace meshflow
