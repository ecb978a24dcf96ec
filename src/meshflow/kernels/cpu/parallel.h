// Small helpers for the CPU kernels: OpenMP loops with a grain size, so tiny
// tensors are not split across threads, and the broadcasting index walker.
#pragma once

#include <omp.h>

#include <cstdint>
#include <vector>

#include "meshflow/core/shape.h"

namespace meshflow::cpu {

// Runs fn(begin, end) over [0, n) in chunks; serial when n * cost_per_item is small.
template <class Fn>
void parallel_for(int64_t n, int64_t cost_per_item, Fn fn) {
  const int64_t kMinWork = 32768;
  int threads = omp_get_max_threads();
  if (threads <= 1 || n <= 1 || n * cost_per_item < kMinWork || omp_in_parallel()) {
    fn(int64_t{0}, n);
    return;
  }
  int64_t chunks = std::min<int64_t>(threads, n);
#pragma omp parallel for num_threads(static_cast <int>(chunks)) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
    fn(b, e);
  }
}

// Strides of `in` viewed as broadcast to `out` (0 on broadcast dims); `in` is
// right-aligned against `out`.
inline std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out) {
  std::vector<int64_t> st(out.rank(), 0);
  std::vector<int64_t> own = in.strides();
  int off = out.rank() - in.rank();
  for (int i = 0; i < in.rank(); ++i) st[i + off] = in.size(i) == 1 ? 0 : own[i];
  return st;
}

// Offset in a broadcast operand of the element at flat index `flat` of `out`.
inline int64_t broadcast_offset(int64_t flat, const std::vector<int64_t>& out_sizes,
                                const std::vector<int64_t>& strides) {
  int64_t off = 0;
  for (int d = static_cast<int>(out_sizes.size()) - 1; d >= 0; --d) {
    int64_t i = flat % out_sizes[d];
    flat /= out_sizes[d];
    off += i * strides[d];
  }
  return off;
}

}  // namespace meshflow::cpu
