// Softmax-family kernels over the last dim. x is viewed as [rows, V]; rows are
// split across threads, each row is done by one thread (deterministic).
//
// The row logsumexp is "online" over chunks of kChunk logits: per chunk, its
// max (one vectorized sweep), a rescale of the running sum if the max grew,
// then the sum of exp(x - max) (a second sweep over the same chunk, still in
// L1). So a [2048, 50257] logits tensor is read from memory once.
//
//   cross_entropy        x[rows, V], t[rows] -> loss[], lse[rows]
//   cross_entropy_grad   dx = (exp(x - lse) - onehot(t)) * dloss / count_valid
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "meshflow/comm/mesh_comms.h"
#include "meshflow/core/check.h"
#include "meshflow/kernels/cpu/parallel.h"
#include "meshflow/kernels/cpu/vmath.h"
#include "meshflow/kernels/kernel.h"
#include "meshflow/ops/op_def.h"

namespace meshflow {

namespace {

using cpu::exp_approx;

constexpr int64_t kChunk = 1024;  // logits per online-logsumexp chunk (4 KB)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct RowMaxSum {
  float max;
  double sum;  // sum of exp(x - max)
  float lse() const { return max + static_cast<float>(std::log(sum)); }
};

// x: [n]. One pass over memory (each chunk is swept twice while in L1).
RowMaxSum row_max_sum(const float* x, int64_t n) {
  float m = kNegInf;
  double s = 0;
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const float* xc = x + c0;
    const int64_t len = std::min(kChunk, n - c0);
    float cm = kNegInf;
#pragma omp simd reduction(max : cm)
    for (int64_t j = 0; j < len; ++j) cm = xc[j] > cm ? xc[j] : cm;
    if (cm > m) {
      s *= std::exp(static_cast<double>(m) - static_cast<double>(cm));
      m = cm;
    }
    float cs = 0;
#pragma omp simd simdlen(16) reduction(+ : cs)
    for (int64_t j = 0; j < len; ++j) cs += exp_approx(xc[j] - m);
    s += cs;
  }
  return {m, s};
}

// Cost per row for parallel_for, in rough per-element units.
int64_t row_cost(int64_t v, int64_t per_element) {
  return v * per_element;
}

void softmax_kernel(const KernelCall& c) {
  const float* x = c.in_f(0);
  float* y = c.out_f(0);
  const int64_t v = c.in_shape(0).size(-1), rows = c.in_shape(0).numel() / v;
  cpu::parallel_for(rows, row_cost(v, 6), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = x + r * v;
      float* yr = y + r * v;
      const RowMaxSum ms = row_max_sum(xr, v);
      const float m = ms.max, inv = static_cast<float>(1.0 / ms.sum);
#pragma omp simd simdlen(16)
      for (int64_t j = 0; j < v; ++j) yr[j] = exp_approx(xr[j] - m) * inv;
    }
  });
}

void log_softmax_kernel(const KernelCall& c) {
  const float* x = c.in_f(0);
  float* y = c.out_f(0);
  const int64_t v = c.in_shape(0).size(-1), rows = c.in_shape(0).numel() / v;
  cpu::parallel_for(rows, row_cost(v, 6), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = x + r * v;
      float* yr = y + r * v;
      const float lse = row_max_sum(xr, v).lse();
#pragma omp simd
      for (int64_t j = 0; j < v; ++j) yr[j] = xr[j] - lse;
    }
  });
}

// dx = y * (dy - sum(dy * y))
void softmax_grad_kernel(const KernelCall& c) {
  const float* y = c.in_f(0);
  const float* dy = c.in_f(1);
  float* dx = c.out_f(0);
  const int64_t v = c.in_shape(0).size(-1), rows = c.in_shape(0).numel() / v;
  cpu::parallel_for(rows, row_cost(v, 4), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* yr = y + r * v;
      const float* dyr = dy + r * v;
      float* dxr = dx + r * v;
      double dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < v; ++j) dot += static_cast<double>(dyr[j] * yr[j]);
      const float d = static_cast<float>(dot);
#pragma omp simd
      for (int64_t j = 0; j < v; ++j) dxr[j] = yr[j] * (dyr[j] - d);
    }
  });
}

// dx = dy - exp(y) * sum(dy)
void log_softmax_grad_kernel(const KernelCall& c) {
  const float* y = c.in_f(0);
  const float* dy = c.in_f(1);
  float* dx = c.out_f(0);
  const int64_t v = c.in_shape(0).size(-1), rows = c.in_shape(0).numel() / v;
  cpu::parallel_for(rows, row_cost(v, 6), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* yr = y + r * v;
      const float* dyr = dy + r * v;
      float* dxr = dx + r * v;
      double sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < v; ++j) sum += static_cast<double>(dyr[j]);
      const float s = static_cast<float>(sum);
#pragma omp simd simdlen(16)
      for (int64_t j = 0; j < v; ++j) dxr[j] = dyr[j] - exp_approx(yr[j]) * s;
    }
  });
}

// Stops with a message naming the node, the value and the class count when a
// target is >= V (negative targets are ignored positions).
void check_target(const KernelCall& c, int32_t t, int64_t row, int64_t v) {
  MF_CHECK(t < v) << node_label(c.n) << ": target " << t << " at position " << row
                  << " is out of range for " << v << " classes (valid: 0.." << v - 1
                  << ", or negative to ignore the position)";
}

// Number of valid (target >= 0) positions; checks every target < V.
int64_t count_valid(const KernelCall& c, const int32_t* t, int64_t rows, int64_t v) {
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    check_target(c, t[r], r, v);
    count += t[r] >= 0 ? 1 : 0;
  }
  return count;
}

// Vocab-parallel (attrs.ints: the mesh axes splitting V; attrs.global_offset /
// global_dims: this shard's first class and the class count): each rank holds
// classes [v0, v0 + V) of every row. The row maxima, the sums of exp and the
// target logits are all-reduced over those axes (Megatron's
// vocab_parallel_cross_entropy), so loss and lse come out whole.
struct VocabShard {
  int64_t v0 = 0, whole = 0;
  std::vector<int> axes;
  bool split() const { return !axes.empty(); }
};
VocabShard vocab_shard(const KernelCall& c) {
  VocabShard v;
  v.whole = c.in_shape(0).size(-1);
  if (c.attrs().ints.empty()) return v;
  for (int64_t a : c.attrs().ints) v.axes.push_back(static_cast<int>(a));
  MF_CHECK(!c.attrs().global_offset.empty() && !c.attrs().global_dims.empty())
      << node_label(c.n) << ": vocab-parallel (attrs.ints) without the shard's global_offset";
  v.v0 = c.attrs().global_offset.back();
  v.whole = c.attrs().global_dims.back();
  MF_CHECK(c.comms != nullptr) << node_label(c.n)
                               << ": vocab-parallel needs the mesh's communicators";
  return v;
}
void reduce_over(const KernelCall& c, const VocabShard& vs, float* data, int64_t n, ReduceOp op) {
  for (int a : vs.axes) {
    Status s = c.comms->axis(a).all_reduce(data, n, op);
    if (!s.is_ok()) throw StatusError(s.with_context(node_label(c.n)));
  }
}

void cross_entropy_vocab_parallel(const KernelCall& c, const VocabShard& vs) {
  const float* x = c.in_f(0);
  const int32_t* t = c.in_i(1);
  const int64_t v = c.in_shape(0).size(-1), rows = c.in_shape(0).numel() / v;
  int64_t count = count_valid(c, t, rows, vs.whole);
  if (c.n.inputs.size() == 3) count = static_cast<int64_t>(*c.in_f(2));
  std::vector<float> mx(rows), sum(rows), tl(rows);
  cpu::parallel_for(rows, row_cost(v, 1), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      float m = kNegInf;
      for (int64_t j = 0; j < v; ++j) m = std::max(m, x[r * v + j]);
      mx[r] = m;
    }
  });
  reduce_over(c, vs, mx.data(), rows, ReduceOp::kMax);
  cpu::parallel_for(rows, row_cost(v, 4), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      // The same exp and chunked sums as the whole-row path (row_max_sum),
      // so the probabilities the gradient computes sum to what lse says.
      double s = 0;
      for (int64_t c0 = 0; c0 < v; c0 += kChunk) {
        const float* xc = x + r * v + c0;
        const int64_t len = std::min(kChunk, v - c0);
        const float m = mx[r];
        float cs = 0;
#pragma omp simd simdlen(16) reduction(+ : cs)
        for (int64_t j = 0; j < len; ++j) cs += exp_approx(xc[j] - m);
        s += cs;
      }
      sum[r] = static_cast<float>(s);
      const int64_t local = static_cast<int64_t>(t[r]) - vs.v0;
      tl[r] = t[r] >= 0 && local >= 0 && local < v ? x[r * v + local] : 0.f;
    }
  });
  reduce_over(c, vs, sum.data(), rows, ReduceOp::kSum);
  reduce_over(c, vs, tl.data(), rows, ReduceOp::kSum);
  float* lse = c.out_f(1);
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    lse[r] = mx[r] + std::log(sum[r]);
    if (t[r] >= 0) total += static_cast<double>(lse[r]) - static_cast<double>(tl[r]);
  }
  *c.out_f(0) = count > 0 ? static_cast<float>(total / static_cast<double>(count)) : 0.f;
}

// outputs: loss [] = mean over valid rows of lse - x[t]; lse [rows].
void cross_entropy_kernel(const KernelCall& c) {
  if (const VocabShard vs = vocab_shard(c); vs.split()) return cross_entropy_vocab_parallel(c, vs);
  const float* x = c.in_f(0);
  const int32_t* t = c.in_i(1);
  float* loss = c.out_f(0);
  float* lse = c.out_f(1);
  const int64_t v = c.in_shape(0).size(-1), rows = c.in_shape(0).numel() / v;
  int64_t count = count_valid(c, t, rows, v);
  if (c.n.inputs.size() == 3)
    count = static_cast<int64_t>(*c.in_f(2));  // global count (sharded rows)
  cpu::parallel_for(rows, row_cost(v, 6), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) lse[r] = row_max_sum(x + r * v, v).lse();
  });
  // Serial sum in row order: the same bits for any thread count.
  double total = 0;
  for (int64_t r = 0; r < rows; ++r)
    if (t[r] >= 0) total += static_cast<double>(lse[r]) - static_cast<double>(x[r * v + t[r]]);
  *loss = count > 0 ? static_cast<float>(total / static_cast<double>(count)) : 0.f;
}

// inputs: logits [rows, V], targets [rows], lse [rows], dloss []; output dlogits.
void cross_entropy_grad_kernel(const KernelCall& c) {
  const float* x = c.in_f(0);
  const int32_t* t = c.in_i(1);
  const float* lse = c.in_f(2);
  const float dloss = *c.in_f(3);
  float* dx = c.out_f(0);
  const int64_t v = c.in_shape(0).size(-1), rows = c.in_shape(0).numel() / v;
  const VocabShard vs = vocab_shard(c);  // a vocab shard: classes [v0, v0 + v) of each row
  int64_t count = count_valid(c, t, rows, vs.whole);
  if (c.n.inputs.size() == 5)
    count = static_cast<int64_t>(*c.in_f(4));  // global count (sharded rows)
  const float scale = count > 0 ? dloss / static_cast<float>(count) : 0.f;
  cpu::parallel_for(rows, row_cost(v, 5), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      float* dxr = dx + r * v;
      if (t[r] < 0) {
        std::memset(dxr, 0, static_cast<size_t>(v) * sizeof(float));
        continue;
      }
      const float* xr = x + r * v;
      const float l = lse[r];
#pragma omp simd simdlen(16)
      for (int64_t j = 0; j < v; ++j) dxr[j] = exp_approx(xr[j] - l) * scale;
      const int64_t local = static_cast<int64_t>(t[r]) - vs.v0;
      if (local >= 0 && local < v) dxr[local] -= scale;
    }
  });
}

// output: [] number of valid rows whose first maximum is at the target.
void correct_count_kernel(const KernelCall& c) {
  const float* x = c.in_f(0);
  const int32_t* t = c.in_i(1);
  const int64_t v = c.in_shape(0).size(-1), rows = c.in_shape(0).numel() / v;
  for (int64_t r = 0; r < rows; ++r) check_target(c, t[r], r, v);
  std::atomic<int64_t> hits{0};  // integer sum: the same for any order
  cpu::parallel_for(rows, row_cost(v, 2), [&](int64_t lo, int64_t hi) {
    int64_t local = 0;
    for (int64_t r = lo; r < hi; ++r) {
      if (t[r] < 0) continue;
      const float* xr = x + r * v;
      float m = kNegInf;
#pragma omp simd reduction(max : m)
      for (int64_t j = 0; j < v; ++j) m = xr[j] > m ? xr[j] : m;
      int64_t arg = 0;
      while (arg < v && xr[arg] != m) ++arg;
      local += arg == t[r] ? 1 : 0;
    }
    hits += local;
  });
  *c.out_f(0) = static_cast<float>(hits.load());
}

}  // namespace

void register_softmax_kernels(KernelTable& t) {
  t[static_cast<int>(OpKind::kSoftmax)] = softmax_kernel;
  t[static_cast<int>(OpKind::kSoftmaxGrad)] = softmax_grad_kernel;
  t[static_cast<int>(OpKind::kLogSoftmax)] = log_softmax_kernel;
  t[static_cast<int>(OpKind::kLogSoftmaxGrad)] = log_softmax_grad_kernel;
  t[static_cast<int>(OpKind::kCrossEntropy)] = cross_entropy_kernel;
  t[static_cast<int>(OpKind::kCrossEntropyGrad)] = cross_entropy_grad_kernel;
  t[static_cast<int>(OpKind::kCorrectCount)] = correct_count_kernel;
}

}  // namespace meshflow
