// Hybrid parallel: a per-rank program written by hand with collectives on
// local shards (like JAX's shard_map or Megatron's f/g operators), trained by
// meshflow's own autodiff through the collectives, gives the loss and the
// gradients (as shards) of the one-device program.
#include <gtest/gtest.h>

#include <cstring>

#include "grad_check.h"
#include "meshflow/autodiff/autodiff.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/ops/builder.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/parallel/partition.h"
#include "meshflow/parallel/reshard_exec.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

constexpr int64_t B = 8, C = 16, F = 32;

ValueId shard_param(Builder& b, const std::string& name, const Shape& whole, const Mesh& mesh,
                    const Layout& layout, int rank) {
  return shard_parameter(b, name, whole, mesh, layout, rank, Init::normal(0.5f));
}

// loss = mean((gelu(x W1) W2)^2); on tp ranks W1 is split by columns and W2 by
// rows (Megatron's MLP): y = all_reduce(gelu(x W1_r) W2_r).
Graph mlp(int tp, int rank) {
  Graph g;
  Builder b(g);
  const Mesh mesh = Mesh::line(tp, "tp");
  ValueId x = b.input("x", Shape{{"batch", B}, {"hidden", C}});
  ValueId w1 = shard_param(b, "w1", Shape{{"hidden", C}, {"ffn", F}}, mesh,
                           value_or_throw(Layout::parse("[S(1)]")), rank);
  ValueId w2 = shard_param(b, "w2", Shape{{"ffn", F}, {"hidden", C}}, mesh,
                           value_or_throw(Layout::parse("[S(0)]")), rank);
  ValueId y = b.matmul(b.gelu(b.matmul(x, w1)), w2);
  if (tp > 1) y = b.all_reduce(y, /*axis=*/0, tp, "g");  // Megatron's g: sum the partials
  g.loss = b.reduce_mean(b.mul(y, y), {0, 1}, false, "loss");
  append_backward(g);
  return g;
}

TEST(Hybrid, HandWrittenTensorParallelMlpMatchesOneDevice) {
  const Tensor x = testing::random_tensor(Shape{{"batch", B}, {"hidden", C}}, 7);
  auto run = [&](Executor& ex) {
    throw_if_error(ex.feed("x", x));
    ex.feed_scalar("loss_scale", 1.f);
    ex.run(ex.forward_backward_order());
  };
  Graph g1 = mlp(1, 0);
  Executor one(g1);
  run(one);
  const float want_loss = one.scalar(g1.loss);
  const int tp = 2;
  std::vector<float> losses(tp);
  Status s = run_local_ranks(tp, [&](const std::shared_ptr<Transport>& t) -> Status {
    const int rank = t->rank();
    const Mesh mesh = Mesh::line(tp, "tp");
    MF_ASSIGN_OR_RETURN(MeshComms comms, MeshComms::make(Communicator::world(t), mesh));
    Graph g = mlp(tp, rank);
    Executor ex(g);
    ex.set_mesh_comms(&comms);
    run(ex);
    losses[rank] = ex.scalar(g.loss);
    // Each rank's gradient is its block of the one-device gradient.
    for (auto [name, layout] : {std::pair{"w1", "[S(1)]"}, {"w2", "[S(0)]"}}) {
      const ValueId p1 = g1.find(name), p = g.find(name);
      Tensor whole(g1.shape(p1), DType::F32);
      whole.copy_from(one.data(g1.grad_of_param.at(p1)));
      Tensor want = local_block(whole, mesh, value_or_throw(Layout::parse(layout)), rank);
      EXPECT_LT(testing::max_rel_diff(static_cast<const float*>(ex.data(g.grad_of_param.at(p))),
                                      want.data<float>(), want.numel()),
                1e-5)
          << name << " rank " << rank;
    }
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.message();
  for (int r = 0; r < tp; ++r) EXPECT_NEAR(losses[r], want_loss, 1e-5 * want_loss) << r;
}

// The gradient of each collective, on two ranks: for loss = sum(P * C) of a
// whole P [8, 6] (C fixed), each rank's parameter gets its share of dP = C.
//   all_gather:     p_r = block r of P (rows);   y = all_gather(p_r) = P
//   reduce_scatter: p_r an addend of P;          y = block r of sum_r p_r
//   all_to_all:     p_r = block r of P (rows);   y = block r of P (columns)
TEST(Hybrid, GradientsOfTheCollectives) {
  const Shape whole{{"a", 8}, {"b", 6}};
  const Tensor c = testing::random_tensor(whole, 3);
  const Mesh mesh = Mesh::line(2, "x");
  const Layout rows = value_or_throw(Layout::parse("[S(0)]"));
  const Layout cols = value_or_throw(Layout::parse("[S(1)]"));
  for (OpKind kind : {OpKind::kAllGather, OpKind::kReduceScatter, OpKind::kAllToAll}) {
    Status s = run_local_ranks(2, [&](const std::shared_ptr<Transport>& t) -> Status {
      const int r = t->rank();
      MF_ASSIGN_OR_RETURN(MeshComms comms, MeshComms::make(Communicator::world(t), mesh));
      Graph g;
      Builder b(g);
      const Shape pshape =
          kind == OpKind::kReduceScatter ? whole : local_block(c, mesh, rows, r).shape();
      ValueId p = b.parameter("p", pshape, Init::normal(1.f));
      ValueId y;
      Layout y_layout = Layout::Replicated(1);
      if (kind == OpKind::kAllGather) {
        y = b.all_gather(p, 0, 0, 2);
      } else if (kind == OpKind::kReduceScatter) {
        y = b.reduce_scatter(p, 0, 0, 2);
        y_layout = rows;
      } else {
        y = b.all_to_all(p, 0, 1, 0, 2);
        y_layout = cols;
      }
      const Tensor cy = local_block(c, mesh, y_layout, r);
      ValueId cv = b.input("c", cy.shape());
      ValueId l = b.reduce_sum(b.mul(y, cv), {0, 1});
      // A sharded y's loss is a part of the whole loss: sum the parts.
      g.loss = y_layout.is_replicated() ? l : b.all_reduce(l, 0, 2, "loss");
      append_backward(g);
      Executor ex(g);
      ex.set_mesh_comms(&comms);
      MF_RETURN_IF_ERROR(ex.feed("c", cy));
      ex.feed_scalar("loss_scale", 1.f);
      ex.run(ex.forward_backward_order());
      const Tensor want = kind == OpKind::kReduceScatter ? c : local_block(c, mesh, rows, r);
      const float* got = static_cast<const float*>(ex.data(g.grad_of_param.at(p)));
      EXPECT_LT(testing::max_rel_diff(got, want.data<float>(), want.numel()), 1e-6)
          << op_name(kind) << " rank " << r;
      return Status::ok();
    });
    ASSERT_TRUE(s.is_ok()) << s.message();
  }
}

// neighbor_exchange (the halo of a spatially split window) on a line of 3:
// each block grows by its neighbours' border rows (the fill at the ends), and
// autodiff's gradient sums every copy of a row back into its owner.
TEST(Hybrid, NeighborExchangeAndItsGradient) {
  constexpr int n = 3;
  constexpr int64_t L = 4, lo = 1, hi = 2;
  const Shape whole{{"h", n * L}, {"w", 5}};
  const Tensor x = testing::random_tensor(whole, 5);
  const Shape grown{{"h", L + lo + hi}, {"w", 5}};
  std::vector<Tensor> cot;  // each rank's cotangent of its grown block
  for (int r = 0; r < n; ++r) cot.push_back(testing::random_tensor(grown, 10 + r));
  // Global row of grown row j on rank r (-1: the fill beyond the ends).
  auto row_of = [&](int r, int64_t j) {
    const int64_t g = r * L - lo + j;
    return g < 0 || g >= n * L ? int64_t{-1} : g;
  };
  Status s = run_local_ranks(n, [&](const std::shared_ptr<Transport>& t) -> Status {
    const int r = t->rank();
    const Mesh mesh = Mesh::line(n, "x");
    MF_ASSIGN_OR_RETURN(MeshComms comms, MeshComms::make(Communicator::world(t), mesh));
    Graph g;
    Builder b(g);
    const Tensor block = local_block(x, mesh, value_or_throw(Layout::parse("[S(0)]")), r);
    ValueId p = b.parameter("p", block.shape(), Init::zeros());
    Attrs a;
    a.mesh_axis = 0, a.group_size = n, a.axes = {0}, a.ints = {lo, hi}, a.alpha = -7.f;
    ValueId y = b.op1(OpKind::kNeighborExchange, {p}, a, "halo");
    ValueId cv = b.input("c", grown);
    g.loss = b.all_reduce(b.reduce_sum(b.mul(y, cv), {0, 1}), 0, n, "loss");
    append_backward(g);
    Executor ex(g, {.seed = 0, .fetch = {y}, .run_elsewhere = {}, .offload = {}});
    ex.set_mesh_comms(&comms);
    std::memcpy(ex.storage(p).data<float>(), block.data<float>(), block.nbytes());
    MF_RETURN_IF_ERROR(ex.feed("c", cot[r]));
    ex.feed_scalar("loss_scale", 1.f);
    ex.run(ex.forward_backward_order());
    const float* got = ex.data_f(y);
    for (int64_t j = 0; j < grown.size(0); ++j)
      for (int64_t k = 0; k < 5; ++k) {
        const int64_t gr = row_of(r, j);
        EXPECT_EQ(got[j * 5 + k], gr < 0 ? -7.f : x.data<float>()[gr * 5 + k])
            << "rank " << r << " row " << j;
      }
    const float* dp = static_cast<const float*>(ex.data(g.grad_of_param.at(p)));
    for (int64_t i = 0; i < L; ++i)
      for (int64_t k = 0; k < 5; ++k) {
        double want = 0;  // every grown row, on every rank, that copies row r L + i
        for (int q = 0; q < n; ++q)
          for (int64_t j = 0; j < grown.size(0); ++j)
            if (row_of(q, j) == r * L + i) want += cot[q].data<float>()[j * 5 + k];
        EXPECT_NEAR(dp[i * 5 + k], want, 1e-5) << "rank " << r << " row " << i;
      }
    return Status::ok();
  });
  ASSERT_TRUE(s.is_ok()) << s.message();
}

TEST(Hybrid, CollectiveShapesAndErrors) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"a", 4}, {"b", 6}});
  EXPECT_EQ(g.shape(b.all_gather(x, 1, 0, 2)).size(1), 12);
  EXPECT_EQ(g.shape(b.reduce_scatter(x, 0, 0, 2)).size(0), 2);
  const Shape a2a = g.shape(b.all_to_all(x, 0, 1, 0, 2));
  EXPECT_EQ(a2a.size(0), 8);
  EXPECT_EQ(a2a.size(1), 3);
  Attrs halo;  // a block of 4 rows cannot lend 5 to a neighbour
  halo.mesh_axis = 0, halo.group_size = 2, halo.axes = {0}, halo.ints = {5, 1};
  try {
    b.op1(OpKind::kNeighborExchange, {x}, halo, "halo");
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    EXPECT_NE(std::string(e.what()).find("is smaller than its halo (5, 1)"), std::string::npos)
        << e.what();
  }
  try {
    b.reduce_scatter(x, 1, 0, 4);  // 6 does not split 4 ways
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    EXPECT_NE(std::string(e.what()).find("does not split 4 ways"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshflow
