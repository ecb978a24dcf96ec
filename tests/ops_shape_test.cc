// transpose, reshape, slice, slice_grad, concat: shape rules (names move with
// dims), forward against naive index arithmetic, finite-difference gradients,
// and error messages.
#include <gtest/gtest.h>

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

std::vector<float> run(const Graph& g, const std::map<std::string, Tensor>& feeds, ValueId out) {
  Executor ex(g, {.seed = 0, .fetch = {out}, .run_elsewhere = {}, .offload = {}});
  for (const auto& [name, t] : feeds) {
    Status s = ex.feed(name, t);
    EXPECT_TRUE(s.is_ok()) << s.message();
  }
  ex.run(ex.eval_order());
  return std::vector<float>(ex.data_f(out), ex.data_f(out) + g.shape(out).numel());
}

// Expects `f` to throw a StatusError whose message contains every one of `parts`.
template <class Fn>
void expect_error(std::initializer_list<std::string> parts, Fn f) {
  try {
    f();
    ADD_FAILURE() << "expected an error";
  } catch (const StatusError& e) {
    const std::string m = e.what();
    for (const std::string& p : parts) EXPECT_NE(m.find(p), std::string::npos) << m;
  }
}

// Multi-index of flat index `i` in `sizes` (row-major).
std::vector<int64_t> unflatten(int64_t i, const std::vector<int64_t>& sizes) {
  std::vector<int64_t> idx(sizes.size());
  for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
    idx[d] = i % sizes[d];
    i /= sizes[d];
  }
  return idx;
}

int64_t flatten(const std::vector<int64_t>& idx, const std::vector<int64_t>& sizes) {
  int64_t f = 0;
  for (size_t d = 0; d < sizes.size(); ++d) f = f * sizes[d] + idx[d];
  return f;
}

// ---- transpose ----

TEST(Transpose, NamesMoveWithDims) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"batch", 2}, {"seq", 3}, {"heads", 4}, {"head_dim", 5}});
  EXPECT_EQ(g.shape(b.transpose(x, {0, 2, 1, 3})).to_string(),
            "[batch=2,heads=4,seq=3,head_dim=5]");
  EXPECT_EQ(g.shape(b.transpose(x, {-1, 0, -2, 1})).to_string(),
            "[head_dim=5,batch=2,heads=4,seq=3]");
}

struct PermCase {
  std::vector<int64_t> sizes, perm;
};

TEST(Transpose, ForwardMatchesNaiveIndexing) {
  const std::vector<PermCase> cases = {
      {{2, 3, 4, 5}, {0, 2, 1, 3}},        // [B,T,H,D] -> [B,H,T,D]
      {{4, 64, 8, 32}, {0, 2, 1, 3}},      // same, big enough for threads
      {{4, 8, 64, 32}, {0, 2, 1, 3}},      // and back
      {{2, 3, 4, 5}, {3, 2, 1, 0}},        // innermost dim moves
      {{37, 70}, {1, 0}},                  // 2-D, tiles with ragged edges
      {{300, 200}, {1, 0}},                // 2-D, threaded
      {{3, 1, 4, 1, 5}, {4, 3, 2, 1, 0}},  // size-1 dims dropped
      {{2, 3, 4, 5}, {1, 2, 0, 3}},        // merged dims (2,3 stay adjacent)
      {{2, 3, 4, 5}, {2, 3, 0, 1}},        // two merged groups swapped
      {{6, 5, 4}, {0, 2, 1}},              // batched 2-D transpose
      {{2, 3, 4}, {0, 1, 2}},              // identity
      {{5, 2, 3, 4}, {-1, 0, -2, 1}},      // negative axes
  };
  for (const PermCase& pc : cases) {
    Graph g;
    Builder b(g);
    const Shape xs = S(pc.sizes);
    ValueId y = b.transpose(b.input("x", xs), pc.perm);
    Tensor tx = random_tensor(xs, 1);
    std::vector<float> got = run(g, {{"x", tx}}, y);
    const std::vector<int64_t> ys = g.shape(y).sizes();
    const int r = xs.rank();
    for (int64_t i = 0; i < xs.numel(); ++i) {
      std::vector<int64_t> oi = unflatten(i, ys), ii(r);
      for (int d = 0; d < r; ++d) ii[xs.norm(static_cast<int>(pc.perm[d]))] = oi[d];
      ASSERT_EQ(got[i], tx.data<float>()[flatten(ii, pc.sizes)])
          << xs.to_string() << " perm " << ::testing::PrintToString(pc.perm) << " at " << i;
    }
  }
}

TEST(Transpose, GradientsMatchFiniteDifferences) {
  const std::vector<PermCase> cases = {{{3, 4}, {1, 0}},
                                       {{2, 3, 4}, {2, 0, 1}},
                                       {{2, 3, 2, 4}, {0, 2, 1, 3}},
                                       {{2, 3, 4}, {-1, -3, -2}}};
  for (const PermCase& pc : cases) {
    GradCase c;
    c.params = {S(pc.sizes)};
    std::vector<int64_t> perm = pc.perm;
    c.build = [perm](Builder& b, const std::vector<ValueId>& p) { return b.transpose(p[0], perm); };
    EXPECT_TRUE(check_gradients(c)) << ::testing::PrintToString(pc.perm);
  }
}

TEST(Transpose, BadPermutationIsAClearError) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", S({2, 3, 4}));
  expect_error({"transpose 'tr'", "{0,0,1}", "not a permutation", "[d0=2,d1=3,d2=4]"}, [&] {
    b.transpose(x, {0, 0, 1}, "tr");
  });
  expect_error({"{0,1}", "not a permutation"}, [&] { b.transpose(x, {0, 1}, "tr"); });
  expect_error({"{0,1,3}", "each of 0..2 exactly once"}, [&] { b.transpose(x, {0, 1, 3}, "tr"); });
  expect_error({"{0,2,-1}", "not a permutation"}, [&] { b.transpose(x, {0, 2, -1}, "tr"); });
}

// ---- reshape ----

TEST(Reshape, NamesComeFromTargetAndDataIsKept) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"batch", 2}, {"seq", 3}, {"hidden", 8}});
  ValueId y = b.reshape(x, Shape{{"tokens", 6}, {"heads", 2}, {"head_dim", 4}});
  EXPECT_EQ(g.shape(y).to_string(), "[tokens=6,heads=2,head_dim=4]");
  Tensor tx = random_tensor(g.shape(x), 1);
  std::vector<float> got = run(g, {{"x", tx}}, y);
  EXPECT_EQ(std::memcmp(got.data(), tx.data<float>(), tx.nbytes()), 0);
}

TEST(Reshape, KeepsIntegerDtype) {
  Graph g;
  Builder b(g);
  ValueId ids = b.input("ids", S({4, 5}), DType::I32);
  ValueId y = b.reshape(ids, S({20}));
  EXPECT_EQ(g.value(y).dtype, DType::I32);
}

TEST(Reshape, GradientsMatchFiniteDifferences) {
  GradCase c;
  c.params = {S({2, 3, 4})};
  c.build = [](Builder& b, const std::vector<ValueId>& p) {
    return b.mul(b.reshape(p[0], S({6, 4})), b.reshape(p[0], S({6, 4})));
  };
  EXPECT_TRUE(check_gradients(c));
}

TEST(Reshape, ElementCountMismatchNamesBothShapes) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"batch", 2}, {"seq", 3}});
  expect_error({"reshape 'flat'", "[batch=2,seq=3]", "(6 elements)", "[tokens=4]", "(4 elements)"},
               [&] {
                 b.reshape(x, Shape{{"tokens", 4}}, "flat");
               });
}

// ---- slice / slice_grad ----

struct SliceCase {
  std::vector<int64_t> sizes;
  int axis;
  int64_t start, end;
};

TEST(Slice, ForwardMatchesNaiveIndexing) {
  const std::vector<SliceCase> cases = {
      {{5, 3}, 0, 1, 4},     {{2, 6, 4}, 1, 2, 5},        {{2, 3, 7}, 2, 0, 3},
      {{2, 3, 7}, -1, 4, 7}, {{8, 96, 768}, 2, 256, 512}, {{3, 200, 64}, -2, 50, 51},
      {{4}, 0, 0, 4}};
  for (const SliceCase& sc : cases) {
    Graph g;
    Builder b(g);
    const Shape xs = S(sc.sizes);
    ValueId y = b.slice(b.input("x", xs), sc.axis, sc.start, sc.end);
    const int axis = xs.norm(sc.axis);
    EXPECT_EQ(g.shape(y).name(axis), xs.name(axis));
    EXPECT_EQ(g.shape(y).size(axis), sc.end - sc.start);
    Tensor tx = random_tensor(xs, 2);
    std::vector<float> got = run(g, {{"x", tx}}, y);
    const std::vector<int64_t> ys = g.shape(y).sizes();
    for (int64_t i = 0; i < g.shape(y).numel(); ++i) {
      std::vector<int64_t> idx = unflatten(i, ys);
      idx[axis] += sc.start;
      ASSERT_EQ(got[i], tx.data<float>()[flatten(idx, sc.sizes)]) << xs.to_string() << " " << i;
    }
  }
}

TEST(Slice, SliceGradPlacesDyInRangeAndZerosElsewhere) {
  for (const SliceCase& sc :
       std::vector<SliceCase>{{{4, 5, 6}, 1, 1, 3}, {{300, 130}, -1, 7, 100}}) {
    Graph g;
    Builder b(g);
    const Shape full = S(sc.sizes);
    const int axis = full.norm(sc.axis);
    const Shape dys = full.with_size(axis, sc.end - sc.start);
    Attrs at;
    at.shape = full;
    at.axes = {sc.axis};
    at.ints = {sc.start, sc.end};
    ValueId y = b.op1(OpKind::kSliceGrad, {b.input("dy", dys)}, at);
    Tensor tdy = random_tensor(dys, 3);
    std::vector<float> got = run(g, {{"dy", tdy}}, y);
    for (int64_t i = 0; i < full.numel(); ++i) {
      std::vector<int64_t> idx = unflatten(i, sc.sizes);
      if (idx[axis] < sc.start || idx[axis] >= sc.end) {
        ASSERT_EQ(got[i], 0.f) << i;
      } else {
        idx[axis] -= sc.start;
        ASSERT_EQ(got[i], tdy.data<float>()[flatten(idx, dys.sizes())]) << i;
      }
    }
  }
}

TEST(Slice, GradientsMatchFiniteDifferences) {
  const std::vector<SliceCase> cases = {
      {{5}, 0, 1, 4}, {{4, 3}, 0, 2, 4}, {{2, 5, 3}, 1, 1, 3}, {{2, 3, 4}, -1, 0, 2}};
  for (const SliceCase& sc : cases) {
    GradCase c;
    c.params = {S(sc.sizes)};
    c.build = [sc](Builder& b, const std::vector<ValueId>& p) {
      return b.slice(p[0], sc.axis, sc.start, sc.end);
    };
    EXPECT_TRUE(check_gradients(c)) << S(sc.sizes).to_string() << " axis " << sc.axis;
  }
}

TEST(Slice, SecondOrderThroughSliceGrad) {
  GradCase c;
  c.params = {S({2, 2, 3})};
  c.build = [](Builder& b, const std::vector<ValueId>& p) {
    Attrs at;
    at.shape = S({2, 5, 3});
    at.axes = {1};
    at.ints = {1, 3};
    return b.op1(OpKind::kSliceGrad, {p[0]}, at);
  };
  EXPECT_TRUE(check_gradients(c));
}

TEST(Slice, OutOfRangeIsAClearError) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"batch", 2}, {"seq", 4}});
  expect_error({"slice 'sl'", "[2, 9)", "dim 1 'seq' of size 4", "0 <= start < end <= 4"},
               [&] { b.slice(x, 1, 2, 9, "sl"); });
  expect_error({"[3, 3)", "0 <= start < end <= 4"}, [&] { b.slice(x, -1, 3, 3, "sl"); });
  expect_error({"[-1, 1)", "dim 0 'batch' of size 2"}, [&] { b.slice(x, 0, -1, 1, "sl"); });
  expect_error({"slice 'sl'", "axis 2 is out of range for rank 2", "-2..1"},
               [&] { b.slice(x, 2, 0, 1, "sl"); });
}

// ---- concat ----

TEST(Concat, ShapeKeepsFirstInputsAxisName) {
  Graph g;
  Builder b(g);
  ValueId a = b.input("a", Shape{{"batch", 2}, {"q", 3}, {"hidden", 4}});
  ValueId c = b.input("c", Shape{{"batch", 2}, {"kv", 5}, {"hidden", 4}});
  EXPECT_EQ(g.shape(b.concat({a, c}, 1)).to_string(), "[batch=2,q=8,hidden=4]");
  EXPECT_EQ(g.shape(b.concat({a, a, a}, -1)).to_string(), "[batch=2,q=3,hidden=12]");
}

TEST(Concat, ForwardMatchesNaiveIndexing) {
  struct Case {
    std::vector<std::vector<int64_t>> sizes;
    int axis;
  };
  const std::vector<Case> cases = {{{{2, 3}, {4, 3}}, 0},
                                   {{{2, 1, 4}, {2, 3, 4}, {2, 2, 4}}, 1},
                                   {{{2, 3, 1}, {2, 3, 5}}, -1},
                                   {{{16, 128, 256}, {16, 128, 256}, {16, 128, 256}}, 2},
                                   {{{7}}, 0}};
  for (const Case& cs : cases) {
    Graph g;
    Builder b(g);
    std::vector<ValueId> xs;
    std::map<std::string, Tensor> feeds;
    std::vector<Tensor> ts;
    for (size_t i = 0; i < cs.sizes.size(); ++i) {
      const std::string name = "x" + std::to_string(i);
      xs.push_back(b.input(name, S(cs.sizes[i])));
      ts.push_back(random_tensor(S(cs.sizes[i]), 10 + i));
      feeds[name] = ts.back();
    }
    ValueId y = b.concat(xs, cs.axis);
    std::vector<float> got = run(g, feeds, y);
    const std::vector<int64_t> ys = g.shape(y).sizes();
    const int axis = g.shape(y).norm(cs.axis);
    for (int64_t i = 0; i < g.shape(y).numel(); ++i) {
      std::vector<int64_t> idx = unflatten(i, ys);
      size_t k = 0;
      while (idx[axis] >= cs.sizes[k][axis]) idx[axis] -= cs.sizes[k++][axis];
      ASSERT_EQ(got[i], ts[k].data<float>()[flatten(idx, cs.sizes[k])]) << i;
    }
  }
}

TEST(Concat, GradientsMatchFiniteDifferences) {
  for (int axis : {0, 1, -1}) {
    GradCase c;
    const int a = axis < 0 ? axis + 3 : axis;
    std::vector<int64_t> s0 = {2, 3, 4}, s1 = {2, 3, 4}, s2 = {2, 3, 4};
    s0[a] = 1;
    s2[a] = 3;
    c.params = {S(s0), S(s1), S(s2)};
    c.build = [axis](Builder& b, const std::vector<ValueId>& p) {
      return b.concat({p[0], p[1], p[2], p[0]}, axis);  // p[0] used twice: gradients add
    };
    EXPECT_TRUE(check_gradients(c)) << "axis " << axis;
  }
}

TEST(Concat, MismatchIsAClearError) {
  Graph g;
  Builder b(g);
  ValueId a = b.input("a", Shape{{"batch", 2}, {"seq", 3}});
  ValueId c = b.input("c", Shape{{"batch", 4}, {"seq", 5}});
  ValueId r3 = b.input("r3", S({2, 3, 1}));
  ValueId ids = b.input("ids", S({2, 3}), DType::I32);
  expect_error({"concat 'cat'", "input 1[batch=4,seq=5]", "size 4 in dim 0", "has 2",
                "except the concat axis 1"},
               [&] {
                 b.concat({a, c}, 1, "cat");
               });
  expect_error({"has rank 3", "has rank 2"}, [&] { b.concat({a, r3}, 0, "cat"); });
  expect_error({"is i32", "input 0 is f32"}, [&] { b.concat({a, ids}, 0, "cat"); });
  expect_error({"axis -3 is out of range for rank 2"}, [&] { b.concat({a, a}, -3, "cat"); });
  expect_error({"needs at least one input"}, [&] { b.concat({}, 0, "cat"); });
}

}  // namespace
}  // namespace meshflow
