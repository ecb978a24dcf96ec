// Finite-difference gradient checks, shared by every op test.
//
// The case builds a graph from parameters (the differentiable inputs, with the
// given values or a seeded normal fill) and fixed inputs (targets, ids), and
// returns the op's output y. The check forms loss = sum(y * r) with a fixed
// random r, differentiates it with append_backward, and compares every
// parameter's gradient with central differences of the same loss.
//
//   GradCase c;
//   c.params = {Shape{{"m",3},{"k",4}}, Shape{{"k",4},{"n",5}}};
//   c.build = [](Builder& b, const std::vector<ValueId>& p) { return b.matmul(p[0], p[1]); };
//   EXPECT_TRUE(check_gradients(c));
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "meshflow/core/tensor.h"
#include "meshflow/ops/builder.h"

namespace meshflow::testing {

struct GradCase {
  std::vector<Shape> params;
  std::vector<Tensor> param_values;      // optional, same order as params
  std::map<std::string, Tensor> inputs;  // fixed inputs (created by build via b.input)
  std::function<ValueId(Builder&, const std::vector<ValueId>&)> build;
  float eps = 1e-2f;  // finite-difference step
  float tol = 1e-2f;  // max |analytic - numeric| / max(1, |numeric|)
  uint64_t seed = 7;
};

::testing::AssertionResult check_gradients(const GradCase& c);

// A shape with dims named d0, d1, ...: S({2, 3}) is [d0=2,d1=3].
Shape S(const std::vector<int64_t>& sizes);

// Runs the forward (and metric) nodes of g with the given feeds; returns the
// values of ys.
std::vector<std::vector<float>> run_forward(const Graph& g, const std::vector<ValueId>& ys,
                                            const std::map<std::string, Tensor>& feeds);

// A tensor filled from a seeded normal (for test inputs).
Tensor random_tensor(const Shape& s, uint64_t seed, float scale = 1.f);
// Max |a - b| / max(1e-6, max|b|) over all elements.
double max_rel_diff(const float* a, const float* b, int64_t n);

}  // namespace meshflow::testing
