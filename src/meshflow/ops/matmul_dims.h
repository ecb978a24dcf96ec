// The M/K/N decomposition of a matmul node (see ops/matmul.cc), shared by its
// shape rule, gradient rule, cost and kernel.
#pragma once

#include "meshflow/ir/graph.h"

namespace meshflow {

struct MatMulDims {
  Shape batch, m, k, n;                // named dims of each group
  int64_t B = 1, M = 1, K = 1, N = 1;  // their products
};

Result<MatMulDims> matmul_dims(const Graph& g, const Node& n);

}  // namespace meshflow
