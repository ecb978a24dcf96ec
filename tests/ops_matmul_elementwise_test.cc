#include <gtest/gtest.h>

#include "grad_check.h"
#include "meshflow/ops/op_def.h"

namespace meshflow {
namespace {

using testing::check_gradients;
using testing::GradCase;

using testing::S;

TEST(MatMul, ShapeRuleNamesDims) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"batch", 2}, {"seq", 3}, {"hidden", 4}});
  ValueId w = b.input("w", Shape{{"hidden", 4}, {"heads", 2}, {"head_dim", 5}});
  ValueId y = b.matmul(x, w);
  EXPECT_EQ(g.shape(y).to_string(), "[batch=2,seq=3,heads=2,head_dim=5]");
}

TEST(MatMul, MismatchedContractionIsAClearError) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"m", 2}, {"k", 3}});
  ValueId w = b.input("w", Shape{{"k", 4}, {"n", 5}});
  try {
    b.matmul(x, w, {}, "fc1");
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    EXPECT_NE(std::string(e.what()).find("matmul 'fc1'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("contracted dims differ"), std::string::npos) << e.what();
  }
}

struct MatMulCase {
  bool ta, tb;
  int contract, batch;
  Shape a, b;
};

class MatMulGrad : public ::testing::TestWithParam<MatMulCase> {};

TEST_P(MatMulGrad, MatchesFiniteDifferences) {
  const MatMulCase& m = GetParam();
  GradCase c;
  c.params = {m.a, m.b};
  c.build = [m](Builder& b, const std::vector<ValueId>& p) {
    return b.matmul(p[0], p[1], {m.ta, m.tb, m.contract, m.batch});
  };
  EXPECT_TRUE(check_gradients(c));
}

INSTANTIATE_TEST_SUITE_P(
    AllTransposes, MatMulGrad,
    ::testing::Values(MatMulCase{false, false, 1, 0, S({3, 4}), S({4, 5})},
                      MatMulCase{true, false, 1, 0, S({4, 3}), S({4, 5})},
                      MatMulCase{false, true, 1, 0, S({3, 4}), S({5, 4})},
                      MatMulCase{true, true, 1, 0, S({4, 3}), S({5, 4})},
                      MatMulCase{false, false, 1, 0, S({2, 3, 4}), S({4, 5})},     // folded M
                      MatMulCase{false, false, 2, 0, S({3, 2, 2}), S({2, 2, 5})},  // 2 K dims
                      MatMulCase{false, false, 1, 1, S({2, 3, 4}), S({2, 4, 5})},  // batched
                      MatMulCase{true, true, 1, 2, S({2, 2, 4, 3}), S({2, 2, 5, 4})}));

TEST(Elementwise, BroadcastGradients) {
  for (OpKind k : {OpKind::kAdd, OpKind::kSub, OpKind::kMul, OpKind::kDiv}) {
    GradCase c;
    c.params = {S({2, 3, 4}), S({3, 1})};
    c.build = [k](Builder& b, const std::vector<ValueId>& p) {
      ValueId rhs = p[1];
      if (k == OpKind::kDiv)
        rhs = b.add(b.mul(p[1], p[1]), b.broadcast_to(p[1], b.graph().shape(p[1])));
      return b.op1(k, {p[0], k == OpKind::kDiv ? b.add(b.mul(p[1], p[1]), p[1]) : rhs});
    };
    if (k == OpKind::kDiv) {
      // keep the divisor away from zero: b*b + b + 2 via a shifted value
      c.param_values = {testing::random_tensor(c.params[0], 1), Tensor(c.params[1], DType::F32)};
      for (int i = 0; i < 3; ++i) c.param_values[1].data<float>()[i] = 1.5f + 0.25f * i;
    }
    EXPECT_TRUE(check_gradients(c)) << op_name(k);
  }
}

TEST(Elementwise, ScaleBiasSumToBroadcastTo) {
  GradCase c;
  c.params = {S({2, 3, 4}), S({4})};
  c.build = [](Builder& b, const std::vector<ValueId>& p) {
    ValueId y = b.scale(b.bias_add(p[0], p[1]), 0.5f);
    ValueId s = b.sum_to(y, Shape{{"x", 3}, {"y", 1}});
    return b.mul(b.broadcast_to(s, b.graph().shape(y)), y);
  };
  EXPECT_TRUE(check_gradients(c));
}

}  // namespace
}  // namespace meshflow
