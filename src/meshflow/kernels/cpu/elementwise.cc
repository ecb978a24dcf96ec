// Element-wise kernels with broadcasting. Fast paths: equal shapes, and an
// operand that broadcasts along leading dims only (a row vector, a bias);
// otherwise a general strided walk.
#include <cstring>

#include "meshflow/kernels/cpu/parallel.h"
#include "meshflow/kernels/kernel.h"

namespace meshflow {

namespace {

struct AddOp {
  static float f(float a, float b) { return a + b; }
};
struct SubOp {
  static float f(float a, float b) { return a - b; }
};
struct MulOp {
  static float f(float a, float b) { return a * b; }
};
struct DivOp {
  static float f(float a, float b) { return a / b; }
};

// Number of trailing elements `in` covers contiguously when it broadcasts only
// along leading dims of `out` (in == out's trailing dims), else 0.
int64_t trailing_block(const Shape& in, const Shape& out) {
  int off = out.rank() - in.rank();
  int first = 0;
  while (first < in.rank() && in.size(first) == 1) ++first;
  for (int i = first; i < in.rank(); ++i)
    if (in.size(i) != out.size(i + off)) return 0;
  return in.prod(first, in.rank());
}

template <class Op>
void binary_kernel(const KernelCall& c) {
  const float* a = c.in_f(0);
  const float* b = c.in_f(1);
  float* y = c.out_f(0);
  const Shape& sa = c.in_shape(0);
  const Shape& sb = c.in_shape(1);
  const Shape& so = c.out_shape(0);
  const int64_t n = so.numel();
  const int64_t na = sa.numel(), nb = sb.numel();
  if (na == n && nb == n) {
    cpu::parallel_for(n, 1, [&](int64_t lo, int64_t hi) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) y[i] = Op::f(a[i], b[i]);
    });
    return;
  }
  if (na == n && nb >= 1 && trailing_block(sb, so) == nb) {
    const int64_t rows = n / nb;
    cpu::parallel_for(rows, nb, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const float* ar = a + r * nb;
        float* yr = y + r * nb;
#pragma omp simd
        for (int64_t j = 0; j < nb; ++j) yr[j] = Op::f(ar[j], b[j]);
      }
    });
    return;
  }
  if (nb == n && na >= 1 && trailing_block(sa, so) == na) {
    const int64_t rows = n / na;
    cpu::parallel_for(rows, na, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const float* br = b + r * na;
        float* yr = y + r * na;
#pragma omp simd
        for (int64_t j = 0; j < na; ++j) yr[j] = Op::f(a[j], br[j]);
      }
    });
    return;
  }
  std::vector<int64_t> st_a = cpu::broadcast_strides(sa, so), st_b = cpu::broadcast_strides(sb, so);
  std::vector<int64_t> sizes = so.sizes();
  cpu::parallel_for(n, 8, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      y[i] =
          Op::f(a[cpu::broadcast_offset(i, sizes, st_a)], b[cpu::broadcast_offset(i, sizes, st_b)]);
  });
}

void scale_kernel(const KernelCall& c) {
  const float* x = c.in_f(0);
  float* y = c.out_f(0);
  const float alpha = c.attrs().alpha;
  cpu::parallel_for(c.out_shape(0).numel(), 1, [&](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) y[i] = alpha * x[i];
  });
}

void bias_add_kernel(const KernelCall& c) {
  const float* x = c.in_f(0);
  const float* b = c.in_f(1);
  float* y = c.out_f(0);
  const int64_t n = c.in_shape(1).numel();
  const int64_t rows = c.out_shape(0).numel() / n;
  cpu::parallel_for(rows, n, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) y[r * n + j] = x[r * n + j] + b[j];
    }
  });
}

void sum_to_kernel(const KernelCall& c) {
  const float* x = c.in_f(0);
  float* y = c.out_f(0);
  const Shape& sx = c.in_shape(0);
  const Shape& sy = c.out_shape(0);
  const int64_t n = sx.numel(), m = sy.numel();
  const int64_t block = trailing_block(sy, sx);
  if (block == m && m > 0) {
    // Sum of rows: y[j] = sum_r x[r, j]. Split columns across threads.
    const int64_t rows = n / m;
    std::memset(y, 0, m * sizeof(float));
    cpu::parallel_for(m, rows, [&](int64_t lo, int64_t hi) {
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * m;
#pragma omp simd
        for (int64_t j = lo; j < hi; ++j) y[j] += xr[j];
      }
    });
    return;
  }
  // General: accumulate each input element into its broadcast source slot.
  std::memset(y, 0, m * sizeof(float));
  std::vector<int64_t> st = cpu::broadcast_strides(sy, sx), sizes = sx.sizes();
  for (int64_t i = 0; i < n; ++i) y[cpu::broadcast_offset(i, sizes, st)] += x[i];
}

void broadcast_to_kernel(const KernelCall& c) {
  const float* x = c.in_f(0);
  float* y = c.out_f(0);
  const Shape& sx = c.in_shape(0);
  const Shape& sy = c.out_shape(0);
  std::vector<int64_t> st = cpu::broadcast_strides(sx, sy), sizes = sy.sizes();
  cpu::parallel_for(sy.numel(), 8, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) y[i] = x[cpu::broadcast_offset(i, sizes, st)];
  });
}

}  // namespace

void register_elementwise_kernels(KernelTable& t) {
  t[static_cast<int>(OpKind::kAdd)] = binary_kernel<AddOp>;
  t[static_cast<int>(OpKind::kSub)] = binary_kernel<SubOp>;
  t[static_cast<int>(OpKind::kMul)] = binary_kernel<MulOp>;
  t[static_cast<int>(OpKind::kDiv)] = binary_kernel<DivOp>;
  t[static_cast<int>(OpKind::kScale)] = scale_kernel;
  t[static_cast<int>(OpKind::kBiasAdd)] = bias_add_kernel;
  t[static_cast<int>(OpKind::kSumTo)] = sum_to_kernel;
  t[static_cast<int>(OpKind::kBroadcastTo)] = broadcast_to_kernel;
}

}  // namespace meshflow
