// Embedding lookup and its scatter-add gradient on the CPU.
//
// Legend: V = vocab rows, C = channels, N = number of ids (product of the ids' dims).
//   table, dtable are (V, C); ids are (N) i32; y, dy are (N, C).
//
// The gradient is a deterministic scatter-add: threads split the C columns
// (in blocks of 16 floats, one cache line), and each walks every position in
// order, so each dtable element is summed in position order whatever the
// thread count, and no two threads write the same cache line.
#include <cstring>

#include "meshflow/core/check.h"
#include "meshflow/kernels/cpu/parallel.h"
#include "meshflow/kernels/kernel.h"

namespace meshflow {

namespace {

constexpr int64_t kColumnBlock = 16;

inline void check_id(const Node& n, int32_t id, int64_t pos, int64_t V) {
  MF_CHECK(id >= 0 && id < V) << "embedding '" << n.name << "': id " << id << " at position " << pos
                              << " is outside [0, V) with V = " << V;
}

// A vocab shard (attrs.global_offset set by the partitioner) holds rows
// [first, first + V) of a table of `whole` rows.
struct Rows {
  int64_t first = 0, whole = 0;
};
Rows rows_of(const Attrs& a, int64_t V) {
  if (a.global_offset.empty()) return {0, V};
  return {a.global_offset[0], a.global_dims[0]};
}

// embedding: table (V, C), ids (N) -> y (N, C); ids outside a shard's rows give zeros.
void embedding_kernel(const KernelCall& c) {
  const float* table = c.in_f(0);
  const int32_t* ids = c.in_i(1);
  float* y = c.out_f(0);
  const int64_t V = c.in_shape(0).size(0), C = c.in_shape(0).size(1);
  const int64_t N = c.in_shape(1).numel();
  const Rows rows = rows_of(c.attrs(), V);
  cpu::parallel_for(N, 2 * C, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int32_t id = ids[i];
      check_id(c.n, id, i, rows.whole);
      const int64_t local = id - rows.first;
      if (local >= 0 && local < V)
        std::memcpy(y + i * C, table + local * C, C * sizeof(float));
      else
        std::memset(y + i * C, 0, C * sizeof(float));
    }
  });
}

// embedding_grad: dy (N, C), ids (N) -> dtable (V, C)
void embedding_grad_kernel(const KernelCall& c) {
  const float* dy = c.in_f(0);
  const int32_t* ids = c.in_i(1);
  float* dt = c.out_f(0);
  const Shape& ts = c.out_shape(0);
  const int64_t V = ts.size(0), C = ts.size(1);
  const int64_t N = c.in_shape(1).numel();
  const Rows rows = rows_of(c.attrs(), V);
  for (int64_t i = 0; i < N; ++i) check_id(c.n, ids[i], i, rows.whole);
  cpu::parallel_for(V, C, [&](int64_t lo, int64_t hi) {
    std::memset(dt + lo * C, 0, (hi - lo) * C * sizeof(float));
  });
  const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
  cpu::parallel_for(blocks, N * kColumnBlock, [&](int64_t blo, int64_t bhi) {
    const int64_t j0 = blo * kColumnBlock, j1 = std::min(C, bhi * kColumnBlock);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t local = ids[i] - rows.first;
      if (local < 0 || local >= V) continue;  // another shard's row
      const float* src = dy + i * C;
      float* dst = dt + local * C;
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) dst[j] += src[j];
    }
  });
}

}  // namespace

void register_embedding_kernels(KernelTable& t) {
  t[static_cast<int>(OpKind::kEmbedding)] = embedding_kernel;
  t[static_cast<int>(OpKind::kEmbeddingGrad)] = embedding_grad_kernel;
}

}  // namespace meshflow
