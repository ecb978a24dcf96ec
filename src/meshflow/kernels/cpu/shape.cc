// Data-movement kernels: transpose, reshape, slice, slice_grad, concat, zigzag.
//
// They copy 4-byte elements (f32 or i32 alike) and never do arithmetic, so the
// output is bit-exact. Work is split over output elements (not rows), so one
// huge row and many tiny rows both use every thread.
//
// transpose first drops size-1 dims and merges dims that stay adjacent and in
// order, so [B,T,H,D] -> [B,H,T,D] is a copy of contiguous D-rows. If the
// innermost input dim moves, it runs as batched 2-D transposes in 32x32 tiles.
#include <cstring>

#include "meshflow/core/check.h"
#include "meshflow/kernels/cpu/parallel.h"
#include "meshflow/kernels/kernel.h"
#include "meshflow/ops/zigzag.h"

namespace meshflow {

namespace {

using Elem = uint32_t;  // f32 or i32, moved as bits
constexpr int kMaxRank = 16;
constexpr int64_t kTile = 32;

const Elem* in_e(const KernelCall& c, int i) {
  return static_cast<const Elem*>(c.in[i]);
}
Elem* out_e(const KernelCall& c, int i) {
  return static_cast<Elem*>(c.out[i]);
}

void check_elem_size(const KernelCall& c) {
  for (ValueId v : c.n.inputs) MF_CHECK_EQ(dtype_size(c.g.value(v).dtype), sizeof(Elem));
  for (ValueId v : c.n.outputs) MF_CHECK_EQ(dtype_size(c.g.value(v).dtype), sizeof(Elem));
}

void copy_elems(Elem* dst, const Elem* src, int64_t n) {
  std::memcpy(dst, src, n * sizeof(Elem));
}
void zero_elems(Elem* dst, int64_t n) {
  std::memset(dst, 0, n * sizeof(Elem));
}

void parallel_copy(Elem* dst, const Elem* src, int64_t n) {
  cpu::parallel_for(n, 1, [&](int64_t lo, int64_t hi) { copy_elems(dst + lo, src + lo, hi - lo); });
}

// ---- transpose ----

// x viewed with fewer dims: out dim i is in dim perm[i] (sizes in `in`).
struct TransposeView {
  int rank = 0;
  int64_t in[kMaxRank];
  int perm[kMaxRank];
};

TransposeView collapse(const Shape& x, const std::vector<int64_t>& axes) {
  const int r = x.rank();
  MF_CHECK_LE(r, kMaxRank);
  // Drop size-1 dims, renumbering the remaining input axes.
  int renum[kMaxRank];
  int kept = 0;
  for (int i = 0; i < r; ++i) renum[i] = x.size(i) > 1 ? kept++ : -1;
  int p[kMaxRank];
  int np = 0;
  for (int64_t a : axes) {
    const int ax = static_cast<int>(a < 0 ? a + r : a);
    if (renum[ax] >= 0) p[np++] = renum[ax];
  }
  int64_t sizes[kMaxRank];
  for (int i = 0; i < r; ++i)
    if (renum[i] >= 0) sizes[renum[i]] = x.size(i);
  // Groups of output dims that are consecutive, in order, in the input.
  int start[kMaxRank];
  int64_t gsize[kMaxRank];
  int ng = 0;
  for (int i = 0; i < np; ++i) {
    if (i > 0 && p[i] == p[i - 1] + 1) {
      gsize[ng - 1] *= sizes[p[i]];
    } else {
      start[ng] = p[i];
      gsize[ng++] = sizes[p[i]];
    }
  }
  // A group's input index is the rank of its start among all starts.
  TransposeView v;
  v.rank = ng;
  for (int i = 0; i < ng; ++i) {
    int rank = 0;
    for (int k = 0; k < ng; ++k) rank += start[k] < start[i];
    v.perm[i] = rank;
    v.in[rank] = gsize[i];
  }
  return v;
}

void transpose_kernel(const KernelCall& c) {
  check_elem_size(c);
  const Elem* x = in_e(c, 0);
  Elem* y = out_e(c, 0);
  const int64_t total = c.in_shape(0).numel();
  const TransposeView v = collapse(c.in_shape(0), c.attrs().axes);
  const int R = v.rank;
  if (R <= 1) {
    parallel_copy(y, x, total);
    return;
  }
  int64_t in_stride[kMaxRank], os[kMaxRank], ist[kMaxRank], ost[kMaxRank];
  in_stride[R - 1] = 1;
  for (int i = R - 2; i >= 0; --i) in_stride[i] = in_stride[i + 1] * v.in[i + 1];
  for (int i = 0; i < R; ++i) {
    os[i] = v.in[v.perm[i]];
    ist[i] = in_stride[v.perm[i]];  // input stride of out dim i
  }
  ost[R - 1] = 1;
  for (int i = R - 2; i >= 0; --i) ost[i] = ost[i + 1] * os[i + 1];

  if (v.perm[R - 1] == R - 1) {
    // The innermost dim stays innermost: copy contiguous rows of length L.
    const int64_t L = os[R - 1], rows = total / L;
    cpu::parallel_for(rows, L + 8, [&](int64_t lo, int64_t hi) {
      int64_t idx[kMaxRank];
      int64_t rem = lo, off = 0;
      for (int d = R - 2; d >= 0; --d) {
        idx[d] = rem % os[d];
        rem /= os[d];
        off += idx[d] * ist[d];
      }
      for (int64_t row = lo; row < hi; ++row) {
        copy_elems(y + row * L, x + off, L);
        for (int d = R - 2; d >= 0; --d) {  // odometer step
          off += ist[d];
          if (++idx[d] < os[d]) break;
          off -= idx[d] * ist[d];
          idx[d] = 0;
        }
      }
    });
    return;
  }

  // The innermost input dim is out dim k (size A, input stride 1, output stride
  // ost[k]); the innermost out dim has size B and input stride sb. Every other
  // out dim indexes one independent A x B transpose.
  int k = 0;
  while (v.perm[k] != R - 1) ++k;
  const int64_t A = os[k], B = os[R - 1], sb = ist[R - 1], oa = ost[k];
  int od[kMaxRank];
  int nod = 0;
  for (int d = 0; d < R - 1; ++d)
    if (d != k) od[nod++] = d;
  const int64_t a_tiles = (A + kTile - 1) / kTile;
  const int64_t items = total / (A * B) * a_tiles;
  cpu::parallel_for(items, kTile * B, [&](int64_t lo, int64_t hi) {
    for (int64_t it = lo; it < hi; ++it) {
      int64_t rem = it / a_tiles, in_off = 0, out_off = 0;
      for (int e = nod - 1; e >= 0; --e) {
        const int d = od[e];
        const int64_t i = rem % os[d];
        rem /= os[d];
        in_off += i * ist[d];
        out_off += i * ost[d];
      }
      const int64_t a0 = (it % a_tiles) * kTile, a1 = std::min(A, a0 + kTile);
      for (int64_t b0 = 0; b0 < B; b0 += kTile) {
        const int64_t b1 = std::min(B, b0 + kTile);
        for (int64_t a = a0; a < a1; ++a) {
          const Elem* src = x + in_off + a;
          Elem* dst = y + out_off + a * oa;
          for (int64_t b = b0; b < b1; ++b) dst[b] = src[b * sb];
        }
      }
    }
  });
}

// ---- reshape ----

void reshape_kernel(const KernelCall& c) {
  check_elem_size(c);
  parallel_copy(out_e(c, 0), in_e(c, 0), c.in_shape(0).numel());
}

// ---- slice / slice_grad / concat ----
// `full` is the un-sliced shape; a value is viewed as (outer, size along axis, inner).

struct AxisView {
  int64_t outer, size, inner;
};

AxisView axis_view(const Shape& s, int64_t axis_attr) {
  const int axis = s.norm(static_cast<int>(axis_attr));
  return {s.prod(0, axis), s.size(axis), s.prod(axis + 1, s.rank())};
}

// slice: x (outer, size, inner) -> y (outer, end - start, inner)
void slice_kernel(const KernelCall& c) {
  check_elem_size(c);
  const Elem* x = in_e(c, 0);
  Elem* y = out_e(c, 0);
  const AxisView v = axis_view(c.in_shape(0), c.attrs().axes[0]);
  const int64_t start = c.attrs().ints[0], end = c.attrs().ints[1];
  const int64_t lo_blk = (end - start) * v.inner, in_blk = v.size * v.inner, s0 = start * v.inner;
  cpu::parallel_for(v.outer * lo_blk, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi;) {
      const int64_t o = p / lo_blk, r = p % lo_blk, n = std::min(lo_blk - r, hi - p);
      copy_elems(y + p, x + o * in_blk + s0 + r, n);
      p += n;
    }
  });
}

// slice_grad: dy (outer, end - start, inner) -> y (outer, size, inner), zero outside the range
void slice_grad_kernel(const KernelCall& c) {
  check_elem_size(c);
  const Elem* dy = in_e(c, 0);
  Elem* y = out_e(c, 0);
  const AxisView v = axis_view(c.out_shape(0), c.attrs().axes[0]);
  const int64_t start = c.attrs().ints[0], end = c.attrs().ints[1];
  const int64_t blk = v.size * v.inner, s0 = start * v.inner, s1 = end * v.inner;
  const int64_t dy_blk = s1 - s0;
  cpu::parallel_for(v.outer * blk, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi;) {
      const int64_t o = p / blk, r = p % blk;
      int64_t n;
      if (r < s0) {
        n = std::min(s0 - r, hi - p);
        zero_elems(y + p, n);
      } else if (r < s1) {
        n = std::min(s1 - r, hi - p);
        copy_elems(y + p, dy + o * dy_blk + (r - s0), n);
      } else {
        n = std::min(blk - r, hi - p);
        zero_elems(y + p, n);
      }
      p += n;
    }
  });
}

// concat: x_i (outer, size_i, inner) -> y (outer, sum_i size_i, inner)
void concat_kernel(const KernelCall& c) {
  check_elem_size(c);
  Elem* y = out_e(c, 0);
  const AxisView v = axis_view(c.out_shape(0), c.attrs().axes[0]);
  const int64_t blk = v.size * v.inner;
  const int m = static_cast<int>(c.n.inputs.size());
  // Input i fills [begin[i], begin[i + 1]) of each output block.
  std::vector<int64_t> begin(m + 1, 0);
  const int axis = c.out_shape(0).norm(static_cast<int>(c.attrs().axes[0]));
  for (int i = 0; i < m; ++i) begin[i + 1] = begin[i] + c.in_shape(i).size(axis) * v.inner;
  cpu::parallel_for(v.outer * blk, 1, [&](int64_t lo, int64_t hi) {
    int i = 0;
    for (int64_t p = lo; p < hi;) {
      const int64_t o = p / blk, r = p % blk;
      if (r < begin[i]) i = 0;  // wrapped into the next output block
      while (r >= begin[i + 1]) ++i;
      const int64_t in_blk = begin[i + 1] - begin[i];
      const int64_t n = std::min(begin[i + 1] - r, hi - p);
      copy_elems(y + p, in_e(c, i) + o * in_blk + (r - begin[i]), n);
      p += n;
    }
  });
}

// zigzag: dim seq_dim reordered (ops/zigzag.h); rows of `inner` elements move whole.
void zigzag_kernel(const KernelCall& c) {
  check_elem_size(c);
  const AxisView v = axis_view(c.in_shape(0), c.attrs().seq_dim);
  zigzag_reorder(in_e(c, 0), out_e(c, 0), v.outer, v.size, v.inner, sizeof(Elem),
                 c.attrs().seq_zigzag, c.attrs().inverse);
}

}  // namespace

void register_shape_kernels(KernelTable& t) {
  t[static_cast<int>(OpKind::kTranspose)] = transpose_kernel;
  t[static_cast<int>(OpKind::kReshape)] = reshape_kernel;
  t[static_cast<int>(OpKind::kSlice)] = slice_kernel;
  t[static_cast<int>(OpKind::kSliceGrad)] = slice_grad_kernel;
  t[static_cast<int>(OpKind::kConcat)] = concat_kernel;
  t[static_cast<int>(OpKind::kZigzag)] = zigzag_kernel;
}

}  // namespace meshflow
