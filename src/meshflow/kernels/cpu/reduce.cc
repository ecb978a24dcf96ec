// Reduction kernels (reduce_sum, reduce_mean, reduce_max, reduce_max_grad).
//
// x's dims are first simplified: size-1 dims dropped, adjacent dims that are
// both reduced or both kept merged. Then one of two loop nests runs, so the
// innermost loop is always contiguous and vectorized:
//   - last dim reduced ("rows"): one output per item; it sums contiguous
//     segments of length `inner`, one per combination of the other reduced dims;
//   - last dim kept ("columns"): an item is a block of up to kBlock adjacent
//     outputs; it adds whole contiguous blocks of x into kBlock accumulators.
// Each output is produced by one thread in a fixed order (deterministic).
// Sums accumulate in double.
#include <algorithm>
#include <limits>
#include <vector>

#include "meshflow/kernels/cpu/parallel.h"
#include "meshflow/kernels/kernel.h"

namespace meshflow {

namespace {

constexpr int64_t kBlock = 256;

struct Dims {
  std::vector<int64_t> size, stride;
  int64_t count() const {
    int64_t n = 1;
    for (int64_t s : size) n *= s;
    return n;
  }
  // Offset in x of the k-th combination (row-major over these dims).
  int64_t offset(int64_t k) const {
    int64_t off = 0;
    for (int d = static_cast<int>(size.size()) - 1; d >= 0; --d) {
      off += (k % size[d]) * stride[d];
      k /= size[d];
    }
    return off;
  }
};

// Walks every combination of `dims` in row-major order, tracking the offset.
class Odometer {
 public:
  explicit Odometer(const Dims& dims) : dims_(dims), idx_(dims.size.size(), 0) {}
  void reset() {
    std::fill(idx_.begin(), idx_.end(), 0);
    off_ = 0;
  }
  int64_t offset() const { return off_; }
  void next() {
    for (int d = static_cast<int>(idx_.size()) - 1; d >= 0; --d) {
      off_ += dims_.stride[d];
      if (++idx_[d] < dims_.size[d]) return;
      off_ -= idx_[d] * dims_.stride[d];
      idx_[d] = 0;
    }
  }

 private:
  const Dims& dims_;
  std::vector<int64_t> idx_;
  int64_t off_ = 0;
};

// x viewed as outer kept dims, reduced dims and a contiguous innermost run.
struct Geometry {
  bool inner_reduced = false;  // the innermost run is reduced (rows) or kept (columns)
  int64_t inner = 1;           // length of the innermost run (stride 1)
  Dims outer_kept;             // kept dims other than the innermost run
  Dims outer_reduced;          // reduced dims other than the innermost run
  int64_t per_output = 1;      // x elements per output
};

Geometry geometry(const Shape& x, const std::vector<int64_t>& attr_axes) {
  std::vector<char> reduced(x.rank(), attr_axes.empty() ? 1 : 0);
  for (int64_t a : attr_axes) reduced[a < 0 ? a + x.rank() : a] = 1;
  const std::vector<int64_t> strides = x.strides();
  // Merged runs: (size, stride of the innermost member, reduced).
  std::vector<int64_t> size, stride;
  std::vector<char> red;
  for (int i = 0; i < x.rank(); ++i) {
    if (x.size(i) == 1) continue;
    if (!red.empty() && red.back() == reduced[i]) {
      size.back() *= x.size(i);
      stride.back() = strides[i];
    } else {
      size.push_back(x.size(i));
      stride.push_back(strides[i]);
      red.push_back(reduced[i]);
    }
  }
  Geometry geo;
  if (size.empty()) return geo;  // one element: a kept run of length 1
  geo.inner_reduced = red.back() != 0;
  geo.inner = size.back();
  for (size_t i = 0; i + 1 < size.size(); ++i) {
    Dims& d = red[i] ? geo.outer_reduced : geo.outer_kept;
    d.size.push_back(size[i]);
    d.stride.push_back(stride[i]);
  }
  geo.per_output = geo.outer_reduced.count() * (geo.inner_reduced ? geo.inner : 1);
  return geo;
}

struct SumOp {
  using Acc = double;
  static Acc init() { return 0; }
  static Acc merge(Acc a, Acc b) { return a + b; }
  static Acc segment(const float* p, int64_t n) {
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; ++j) s += static_cast<double>(p[j]);
    return s;
  }
  static void add_block(Acc* acc, const float* p, int64_t n) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(p[j]);
  }
};

struct MaxOp {
  using Acc = float;
  static Acc init() { return -std::numeric_limits<float>::infinity(); }
  static Acc merge(Acc a, Acc b) { return b > a ? b : a; }
  static Acc segment(const float* p, int64_t n) {
    float m = init();
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; ++j) m = p[j] > m ? p[j] : m;
    return m;
  }
  static void add_block(Acc* acc, const float* p, int64_t n) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) acc[j] = p[j] > acc[j] ? p[j] : acc[j];
  }
};

// y = Op-reduction of x, times `scale` (1/count for the mean).
template <class Op>
void reduce(const KernelCall& c, float scale) {
  const float* x = c.in_f(0);
  float* y = c.out_f(0);
  const Geometry geo = geometry(c.in_shape(0), c.attrs().axes);
  using Acc = typename Op::Acc;
  if (geo.inner_reduced) {
    const int64_t outputs = geo.outer_kept.count();
    cpu::parallel_for(outputs, geo.per_output, [&](int64_t lo, int64_t hi) {
      Odometer red(geo.outer_reduced);
      for (int64_t o = lo; o < hi; ++o) {
        const float* base = x + geo.outer_kept.offset(o);
        Acc acc = Op::init();
        red.reset();
        for (int64_t k = 0, n = geo.outer_reduced.count(); k < n; ++k, red.next())
          acc = Op::merge(acc, Op::segment(base + red.offset(), geo.inner));
        y[o] = static_cast<float>(acc * scale);
      }
    });
    return;
  }
  const int64_t blocks = (geo.inner + kBlock - 1) / kBlock;
  const int64_t items = geo.outer_kept.count() * blocks;
  const int64_t cost = geo.per_output * std::min(kBlock, geo.inner);
  cpu::parallel_for(items, cost, [&](int64_t lo, int64_t hi) {
    Odometer red(geo.outer_reduced);
    Acc acc[kBlock];
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t o = item / blocks, j0 = (item % blocks) * kBlock;
      const int64_t len = std::min(kBlock, geo.inner - j0);
      const float* base = x + geo.outer_kept.offset(o) + j0;
      std::fill(acc, acc + len, Op::init());
      red.reset();
      for (int64_t k = 0; k < geo.per_output; ++k, red.next())
        Op::add_block(acc, base + red.offset(), len);
      float* yo = y + o * geo.inner + j0;
      for (int64_t j = 0; j < len; ++j) yo[j] = static_cast<float>(acc[j] * scale);
    }
  });
}

void reduce_sum_kernel(const KernelCall& c) {
  reduce<SumOp>(c, 1.f);
}

void reduce_mean_kernel(const KernelCall& c) {
  const double count =
      static_cast<double>(c.in_shape(0).numel()) / static_cast<double>(c.out_shape(0).numel());
  reduce<SumOp>(c, static_cast<float>(1.0 / count));
}

void reduce_max_kernel(const KernelCall& c) {
  reduce<MaxOp>(c, 1.f);
}

// inputs x, y (the max), dy; output dx: dy / (number of ties) where x == y, else 0.
void reduce_max_grad_kernel(const KernelCall& c) {
  const float* x = c.in_f(0);
  const float* y = c.in_f(1);
  const float* dy = c.in_f(2);
  float* dx = c.out_f(0);
  const Geometry geo = geometry(c.in_shape(0), c.attrs().axes);
  if (geo.inner_reduced) {
    const int64_t outputs = geo.outer_kept.count(), n = geo.outer_reduced.count();
    cpu::parallel_for(outputs, 2 * geo.per_output, [&](int64_t lo, int64_t hi) {
      Odometer red(geo.outer_reduced);
      for (int64_t o = lo; o < hi; ++o) {
        const int64_t base = geo.outer_kept.offset(o);
        const float m = y[o];
        int64_t ties = 0;
        red.reset();
        for (int64_t k = 0; k < n; ++k, red.next()) {
          const float* p = x + base + red.offset();
#pragma omp simd reduction(+ : ties)
          for (int64_t j = 0; j < geo.inner; ++j) ties += p[j] == m ? 1 : 0;
        }
        const float share = ties > 0 ? dy[o] / static_cast<float>(ties) : 0.f;
        red.reset();
        for (int64_t k = 0; k < n; ++k, red.next()) {
          const float* p = x + base + red.offset();
          float* q = dx + base + red.offset();
#pragma omp simd
          for (int64_t j = 0; j < geo.inner; ++j) q[j] = p[j] == m ? share : 0.f;
        }
      }
    });
    return;
  }
  const int64_t blocks = (geo.inner + kBlock - 1) / kBlock;
  const int64_t items = geo.outer_kept.count() * blocks;
  const int64_t cost = 2 * geo.per_output * std::min(kBlock, geo.inner);
  cpu::parallel_for(items, cost, [&](int64_t lo, int64_t hi) {
    Odometer red(geo.outer_reduced);
    float ties[kBlock];
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t o = item / blocks, j0 = (item % blocks) * kBlock;
      const int64_t len = std::min(kBlock, geo.inner - j0);
      const int64_t base = geo.outer_kept.offset(o) + j0;
      const float* m = y + o * geo.inner + j0;
      const float* g = dy + o * geo.inner + j0;
      std::fill(ties, ties + len, 0.f);
      red.reset();
      for (int64_t k = 0; k < geo.per_output; ++k, red.next()) {
        const float* p = x + base + red.offset();
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) ties[j] += p[j] == m[j] ? 1.f : 0.f;
      }
      for (int64_t j = 0; j < len; ++j) ties[j] = ties[j] > 0.f ? g[j] / ties[j] : 0.f;
      red.reset();
      for (int64_t k = 0; k < geo.per_output; ++k, red.next()) {
        const float* p = x + base + red.offset();
        float* q = dx + base + red.offset();
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) q[j] = p[j] == m[j] ? ties[j] : 0.f;
      }
    }
  });
}

}  // namespace

void register_reduce_kernels(KernelTable& t) {
  t[static_cast<int>(OpKind::kReduceSum)] = reduce_sum_kernel;
  t[static_cast<int>(OpKind::kReduceMean)] = reduce_mean_kernel;
  t[static_cast<int>(OpKind::kReduceMax)] = reduce_max_kernel;
  t[static_cast<int>(OpKind::kReduceMaxGrad)] = reduce_max_grad_kernel;
}

}  // namespace meshflow
