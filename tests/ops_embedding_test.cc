// embedding and embedding_grad: shape rule, forward and scatter-add against
// naive references, finite-difference gradients, determinism, and errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>

#include "grad_check.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

using testing::check_gradients;
using testing::GradCase;
using testing::random_tensor;

using testing::S;

// Ids 0..V-1 in a scrambled order, with repeats.
Tensor make_ids(const Shape& s, int64_t V, uint64_t seed) {
  Tensor t(s, DType::I32);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<int32_t>()[i] = static_cast<int32_t>((i * 7 + seed * 13 + (i * i) % 5) % V);
  return t;
}

std::vector<float> run(const Graph& g, const std::map<std::string, Tensor>& feeds, ValueId out) {
  Executor ex(g, {.seed = 0, .fetch = {out}, .run_elsewhere = {}, .offload = {}});
  for (const auto& [name, t] : feeds) {
    Status s = ex.feed(name, t);
    EXPECT_TRUE(s.is_ok()) << s.message();
  }
  ex.run(ex.eval_order());
  return std::vector<float>(ex.data_f(out), ex.data_f(out) + g.shape(out).numel());
}

TEST(Embedding, ShapeRuleTakesIdDimsThenChannels) {
  Graph g;
  Builder b(g);
  ValueId t = b.input("wte", Shape{{"vocab", 10}, {"hidden", 4}});
  ValueId ids = b.input("ids", Shape{{"batch", 2}, {"seq", 3}}, DType::I32);
  EXPECT_EQ(g.shape(b.embedding(t, ids)).to_string(), "[batch=2,seq=3,hidden=4]");
}

TEST(Embedding, ForwardMatchesNaiveLookup) {
  for (Shape is : {S({5}), S({3, 40}), S({16, 128})}) {
    const int64_t V = 37, C = 100;
    Graph g;
    Builder b(g);
    ValueId y = b.embedding(b.input("t", S({V, C})), b.input("ids", is, DType::I32));
    Tensor tt = random_tensor(S({V, C}), 1), ti = make_ids(is, V, 2);
    std::vector<float> got = run(g, {{"t", tt}, {"ids", ti}}, y);
    for (int64_t i = 0; i < is.numel(); ++i)
      for (int64_t j = 0; j < C; ++j)
        ASSERT_EQ(got[i * C + j], tt.data<float>()[ti.data<int32_t>()[i] * C + j]) << i << "," << j;
  }
}

TEST(Embedding, GradKernelMatchesNaiveScatterAdd) {
  for (int64_t C : {4, 100, 256}) {
    const int64_t V = 50;
    const Shape is = S({6, 500});
    Graph g;
    Builder b(g);
    Attrs at;
    at.shape = S({V, C});
    ValueId dt = b.op1(OpKind::kEmbeddingGrad,
                       {b.input("dy", is.concat(S({C}))), b.input("ids", is, DType::I32)}, at);
    Tensor tdy = random_tensor(is.concat(S({C})), 3), ti = make_ids(is, V - 3, 4);
    std::vector<float> got = run(g, {{"dy", tdy}, {"ids", ti}}, dt);
    std::vector<float> ref(V * C, 0.f);  // same order of adds: position order
    for (int64_t i = 0; i < is.numel(); ++i)
      for (int64_t j = 0; j < C; ++j)
        ref[ti.data<int32_t>()[i] * C + j] += tdy.data<float>()[i * C + j];
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0) << "C=" << C;
    for (int64_t j = (V - 3) * C; j < V * C; ++j) ASSERT_EQ(got[j], 0.f);  // unused rows
  }
}

TEST(Embedding, GradDoesNotDependOnThreadCount) {
  const Shape is = S({16, 128});
  Graph g;
  Builder b(g);
  Attrs at;
  at.shape = S({64, 96});
  ValueId dt = b.op1(OpKind::kEmbeddingGrad,
                     {b.input("dy", is.concat(S({96}))), b.input("ids", is, DType::I32)}, at);
  std::map<std::string, Tensor> feeds = {{"dy", random_tensor(is.concat(S({96})), 1)},
                                         {"ids", make_ids(is, 64, 5)}};
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<float> one = run(g, feeds, dt);
  omp_set_num_threads(3);
  std::vector<float> three = run(g, feeds, dt);
  omp_set_num_threads(saved);
  EXPECT_EQ(std::memcmp(one.data(), three.data(), one.size() * sizeof(float)), 0);
}

TEST(Embedding, GradientsMatchFiniteDifferences) {
  for (Shape is : {S({7}), S({2, 5}), S({2, 2, 3})}) {
    GradCase c;
    c.params = {S({6, 3})};
    c.inputs = {{"ids", make_ids(is, 5, 1)}};  // repeated ids, and a row never used
    c.build = [is](Builder& b, const std::vector<ValueId>& p) {
      return b.embedding(p[0], b.input("ids", is, DType::I32));
    };
    EXPECT_TRUE(check_gradients(c)) << is.to_string();
  }
}

TEST(Embedding, SecondOrderThroughEmbeddingGrad) {
  // embedding_grad is linear in dy; its gradient is a lookup.
  GradCase c;
  c.params = {S({2, 3, 4})};
  c.inputs = {{"ids", make_ids(S({2, 3}), 5, 2)}};
  c.build = [](Builder& b, const std::vector<ValueId>& p) {
    Attrs at;
    at.shape = S({5, 4});
    return b.op1(OpKind::kEmbeddingGrad, {p[0], b.input("ids", S({2, 3}), DType::I32)}, at);
  };
  EXPECT_TRUE(check_gradients(c));
}

TEST(Embedding, FloatIdsAreAClearError) {
  Graph g;
  Builder b(g);
  ValueId t = b.input("t", S({10, 4}));
  ValueId ids = b.input("ids", S({3}));
  try {
    b.embedding(t, ids, "wte");
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("embedding 'wte'"), std::string::npos) << m;
    EXPECT_NE(m.find("must be i32"), std::string::npos) << m;
  }
}

TEST(Embedding, TableMustBeTwoDimensional) {
  Graph g;
  Builder b(g);
  ValueId t = b.input("t", S({10, 4, 2}));
  ValueId ids = b.input("ids", S({3}), DType::I32);
  try {
    b.embedding(t, ids, "wte");
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    EXPECT_NE(std::string(e.what()).find("must be 2-D"), std::string::npos) << e.what();
  }
}

TEST(EmbeddingDeathTest, IdOutOfRangeNamesIdAndVocab) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Graph g;
  Builder b(g);
  ValueId y = b.embedding(b.input("t", S({10, 4})), b.input("ids", S({3}), DType::I32), "wte");
  Tensor ids(S({3}), DType::I32);
  ids.data<int32_t>()[0] = 1;
  ids.data<int32_t>()[1] = 12;
  ids.data<int32_t>()[2] = 2;
  EXPECT_DEATH(run(g, {{"t", random_tensor(S({10, 4}), 1)}, {"ids", ids}}, y),
               "embedding 'wte': id 12 at position 1 is outside \\[0, V\\) with V = 10");
}

}  // namespace
}  // namespace meshflow
