// CPU kernels of the attention family (ops/attention.cc): fused attention and
// its backward, dropout / dropout_grad, rope.
//
// Attention is flash-attention style: a task is one (batch, head, block of
// kBlockQ query rows); it computes the block's scores against the keys it can
// see with one GEMM into a per-thread kBlockQ x S workspace, takes the softmax
// in place (max-subtracted, saving lse = m + log(sum)), and multiplies by V
// with a second GEMM. Memory per query row is linear in S; the [T, S] matrix
// of a head is never formed. The backward recomputes P = exp(scale*QK^T - lse)
// block by block and runs one task per (batch, kv head), looping over the
// query heads of its group, so dk and dv of a kv head have one writer
// (deterministic, no atomics).
//
// Legend: B batch, H query heads, Hkv kv heads (H = rep * Hkv), T queries,
// S keys, D head dim. q, out, dq: [B,H,T,D]; k, v, dk, dv: [B,Hkv,S,D]; lse [B,H,T].
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "meshflow/core/check.h"
#include "meshflow/kernels/cpu/attention_dropout.h"
#include "meshflow/kernels/cpu/gemm.h"
#include "meshflow/kernels/cpu/parallel.h"
#include "meshflow/kernels/cpu/ring_attention.h"
#include "meshflow/kernels/kernel.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/zigzag.h"

namespace meshflow {

namespace {

constexpr int64_t kBlockQ = 64;  // query rows per task (GEMM M)

// exp(x) in f32 that vectorizes under `omp simd` (glibc's expf does not without
// -ffast-math). Cephes polynomial on x - n*ln2, |error| < 2 ulp; x <= 88.
// Inputs below -87.3 return exp(-87.3) ~ 1e-38, which is 0 for every use here.
inline float exp_f32(float x) {
  x = std::max(x, -87.3f);
  const float kShift = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + kShift) - kShift;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.f;
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  return y * std::bit_cast<float>(e);
}

struct AttnDims {
  int64_t B, H, Hkv, T, S, D;
  int64_t rep;  // query heads per kv head
  float scale;
  bool causal;

  // Keys query row i attends: j < keys_seen(i). Causal aligns the last query
  // with the last key (j <= i + S - T); a row may see none when T > S.
  int64_t keys_seen(int64_t i) const {
    return causal ? std::clamp<int64_t>(i + S - T + 1, 0, S) : S;
  }
  int64_t q_blocks() const { return (T + kBlockQ - 1) / kBlockQ; }
};

AttnDims attn_dims(const Shape& q, const Shape& k, const Attrs& at) {
  AttnDims d;
  d.B = q.size(0);
  d.H = q.size(1);
  d.T = q.size(2);
  d.D = q.size(3);
  d.Hkv = k.size(1);
  d.S = k.size(2);
  d.rep = d.H / d.Hkv;
  d.scale = at.alpha == 0.f ? 1.f / std::sqrt(static_cast<float>(d.D)) : at.alpha;
  d.causal = at.causal;
  return d;
}

// Small per-head blocks: OpenBLAS directly (kernels/cpu/gemm.h).
constexpr auto gemm = cpu::small_sgemm;
using cpu::transpose_to;

// max(x[0..n)), n >= 1. Written as a ternary: GCC vectorizes this reduction
// but not one over std::max.
inline float row_max(const float* x, int64_t n) {
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < n; ++j) m = m > x[j] ? m : x[j];
  return m;
}

// Softmax of each row of the scaled scores s[rows, ncols] in place over the
// first keys_seen(i0 + r) columns (the rest are set to 0). Writes lse[r] and
// inv_sum[r] (0 for a row that sees no key).
void softmax_rows(const AttnDims& d, int64_t i0, int64_t rows, int64_t ncols, float* s, float* lse,
                  float* inv_sum) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ncols;
    const int64_t n = d.keys_seen(i0 + r);
    std::fill(row + n, row + ncols, 0.f);
    if (n == 0) {
      lse[r] = -std::numeric_limits<float>::infinity();
      inv_sum[r] = 0.f;
      continue;
    }
    const float m = row_max(row, n);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      const float e = exp_f32(row[j] - m);
      row[j] = e;
      sum += e;
    }
    lse[r] = m + std::log(sum);
    inv_sum[r] = 1.f / sum;
  }
}

// attention(q, k, v) -> out, lse.
void attention_kernel(const KernelCall& c) {
  // A sequence split over a ring, or one in zigzag order (its causal mask reads true positions).
  if (c.attrs().mesh_axis >= 0 || c.attrs().seq_zigzag > 1) return cpu::ring_attention(c);
  const AttnDims d = attn_dims(c.in_shape(0), c.in_shape(1), c.attrs());
  const float* q = c.in_f(0);
  const float* k = c.in_f(1);
  const float* v = c.in_f(2);
  float* out = c.out_f(0);
  float* lse = c.out_f(1);
  const int64_t nqb = d.q_blocks();
  const int64_t tasks = d.B * d.H * nqb;
  cpu::parallel_for(tasks, 4 * kBlockQ * d.S * d.D, [&](int64_t lo, int64_t hi) {
    // Per-thread workspace: scores of one block, K^T of the kv head in use.
    std::vector<float> scores(kBlockQ * d.S), inv_sum(kBlockQ), kt(d.D * d.S);
    int64_t kt_of = -1;  // which (b, kv head) kt holds; consecutive tasks share it
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t bh = task / nqb, qb = task % nqb;  // bh = b * H + h
      const int64_t b = bh / d.H, h = bh % d.H, g = h / d.rep;
      const int64_t i0 = qb * kBlockQ, rows = std::min(kBlockQ, d.T - i0);
      const int64_t ncols = d.keys_seen(i0 + rows - 1);   // keys the block's last row sees
      const float* qp = q + (bh * d.T + i0) * d.D;        // [rows, D]
      const float* kp = k + (b * d.Hkv + g) * d.S * d.D;  // [S, D]
      const float* vp = v + (b * d.Hkv + g) * d.S * d.D;  // [S, D]
      float* op = out + (bh * d.T + i0) * d.D;            // [rows, D]
      float* lp = lse + bh * d.T + i0;                    // [rows]
      if (ncols == 0) {  // causal with T > S: no row of this block sees a key
        std::fill(op, op + rows * d.D, 0.f);
        std::fill(lp, lp + rows, -std::numeric_limits<float>::infinity());
        continue;
      }
      if (kt_of != b * d.Hkv + g) {
        transpose_to(kp, d.S, d.D, kt.data());
        kt_of = b * d.Hkv + g;
      }
      float* s = scores.data();  // [rows, ncols]
      gemm(false, false, rows, ncols, d.D, d.scale, qp, d.D, kt.data(), d.S, 0.f, s, ncols);
      softmax_rows(d, i0, rows, ncols, s, lp, inv_sum.data());
      gemm(false, false, rows, d.D, ncols, 1.f, s, ncols, vp, d.D, 0.f, op, d.D);
      for (int64_t r = 0; r < rows; ++r) {
        const float inv = inv_sum[r];
        float* orow = op + r * d.D;
#pragma omp simd
        for (int64_t j = 0; j < d.D; ++j) orow[j] *= inv;
      }
    }
  });
}

// attention_grad(dout, q, k, v, out, lse) -> dq, dk, dv.
//   Di = rowsum(dO * O);  P = exp(scale * Q K^T - lse) (masked);  dV += P^T dO;
//   dP = dO V^T;  dS = P * (dP - Di);  dQ = scale * dS K;  dK += scale * dS^T Q.
void attention_grad_kernel(const KernelCall& c) {
  if (c.attrs().mesh_axis >= 0 || c.attrs().seq_zigzag > 1) return cpu::ring_attention_grad(c);
  const AttnDims d = attn_dims(c.in_shape(1), c.in_shape(2), c.attrs());
  const float* dout = c.in_f(0);
  const float* q = c.in_f(1);
  const float* k = c.in_f(2);
  const float* v = c.in_f(3);
  const float* out = c.in_f(4);
  const float* lse = c.in_f(5);
  float* dq = c.out_f(0);
  float* dk = c.out_f(1);
  float* dv = c.out_f(2);
  const int64_t nqb = d.q_blocks();
  const int64_t tasks = d.B * d.Hkv;
  cpu::parallel_for(tasks, 10 * d.rep * d.T * d.S * d.D, [&](int64_t lo, int64_t hi) {
    std::vector<float> p_buf(kBlockQ * d.S), ds_buf(kBlockQ * d.S), di(kBlockQ);
    std::vector<float> kt(d.D * d.S), vt(d.D * d.S);
    for (int64_t task = lo; task < hi; ++task) {  // task = b * Hkv + g
      const int64_t b = task / d.Hkv;
      const float* kp = k + task * d.S * d.D;  // [S, D]
      const float* vp = v + task * d.S * d.D;
      float* dkp = dk + task * d.S * d.D;
      float* dvp = dv + task * d.S * d.D;
      std::fill(dkp, dkp + d.S * d.D, 0.f);
      std::fill(dvp, dvp + d.S * d.D, 0.f);
      transpose_to(kp, d.S, d.D, kt.data());
      transpose_to(vp, d.S, d.D, vt.data());
      for (int64_t hh = 0; hh < d.rep; ++hh) {
        const int64_t bh = b * d.H + (task % d.Hkv) * d.rep + hh;
        for (int64_t qb = 0; qb < nqb; ++qb) {
          const int64_t i0 = qb * kBlockQ, rows = std::min(kBlockQ, d.T - i0);
          const int64_t ncols = d.keys_seen(i0 + rows - 1);
          const int64_t off = (bh * d.T + i0) * d.D;
          const float* qp = q + off;  // [rows, D]
          const float* dop = dout + off;
          const float* op = out + off;
          const float* lp = lse + bh * d.T + i0;
          float* dqp = dq + off;
          if (ncols == 0) {
            std::fill(dqp, dqp + rows * d.D, 0.f);
            continue;
          }
          for (int64_t r = 0; r < rows; ++r) {
            float acc = 0.f;
#pragma omp simd reduction(+ : acc)
            for (int64_t j = 0; j < d.D; ++j) acc += dop[r * d.D + j] * op[r * d.D + j];
            di[r] = acc;
          }
          float* p = p_buf.data();  // [rows, ncols]
          float* ds = ds_buf.data();
          gemm(false, false, rows, ncols, d.D, d.scale, qp, d.D, kt.data(), d.S, 0.f, p, ncols);
          for (int64_t r = 0; r < rows; ++r) {
            float* row = p + r * ncols;
            const int64_t n = d.keys_seen(i0 + r);
            const float l = lp[r];
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) row[j] = exp_f32(row[j] - l);
            std::fill(row + n, row + ncols, 0.f);
          }
          gemm(true, false, ncols, d.D, rows, 1.f, p, ncols, dop, d.D, 1.f, dvp, d.D);
          gemm(false, false, rows, ncols, d.D, 1.f, dop, d.D, vt.data(), d.S, 0.f, ds, ncols);
          for (int64_t r = 0; r < rows; ++r) {
            const float* prow = p + r * ncols;
            float* srow = ds + r * ncols;
            const float dr = di[r];
#pragma omp simd
            for (int64_t j = 0; j < ncols; ++j) srow[j] = d.scale * prow[j] * (srow[j] - dr);
          }
          gemm(false, false, rows, d.D, ncols, 1.f, ds, ncols, kp, d.D, 0.f, dqp, d.D);
          gemm(true, false, ncols, d.D, rows, 1.f, ds, ncols, qp, d.D, 1.f, dkp, d.D);
        }
      }
    }
  });
}

// dropout(x, rng_offset) and dropout_grad(dy, rng_offset): the same masked scale.
void dropout_kernel(const KernelCall& c) {
  const float* x = c.in_f(0);
  const int32_t offset = c.in_i(1)[0];
  const uint64_t base =
      static_cast<uint64_t>(c.in_i(1)[1]) * static_cast<uint64_t>(c.out_shape(0).numel());
  float* y = c.out_f(0);
  const int64_t n = c.out_shape(0).numel();
  const float p = c.attrs().p;
  if (p == 0.f || offset < 0) {  // a negative offset is evaluation: dropout off
    std::memcpy(y, x, n * sizeof(float));
    return;
  }
  const uint64_t stream = dropout_stream(c.attrs().seed, offset);
  const float scale = 1.f / (1.f - p);
  const int64_t zn = c.attrs().seq_zigzag;
  if (!c.attrs().global_dims.empty() || zn > 1) {
    // A shard (parallel/partition.h): each element draws its global index's
    // number, so the mask is the single-device one. In zigzag order
    // (ops/zigzag.h) the index is the one of the row's true position.
    const Shape& s = c.out_shape(0);
    const int r = s.rank();
    std::vector<int64_t> gd = c.attrs().global_dims, off = c.attrs().global_offset;
    if (gd.empty()) {
      gd = s.sizes();
      off.assign(r, 0);
    }
    const int sd = zn > 1 ? c.attrs().seq_dim : -1;
    MF_CHECK(sd < r - 1) << node_label(c.n) << ": the zigzag sequence dim " << sd
                         << " must not be the last";
    const int64_t row = s.size(r - 1), rows = n / row;
    cpu::parallel_for(rows, row * 4, [=, &s, &gd, &off](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        int64_t rem = i, gbase = 0, stride = gd[r - 1];
        for (int d = r - 2; d >= 0; --d) {
          const int64_t at = rem % s.size(d) + off[d];
          gbase += (d == sd ? zigzag_position(at, gd[d], zn) : at) * stride;
          rem /= s.size(d);
          stride *= gd[d];
        }
        gbase += off[r - 1];
        for (int64_t k = 0; k < row; ++k)
          y[i * row + k] = dropout_keep(stream, base + gbase + k, p) ? x[i * row + k] * scale : 0.f;
      }
    });
    return;
  }
  // Captured by value: GCC vectorizes the counter hash (AVX-512 64-bit multiplies) only when
  // the pointers are not reloaded through the closure each iteration.
  cpu::parallel_for(n, 4, [=](int64_t lo, int64_t hi) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) y[i] = dropout_keep(stream, base + i, p) ? x[i] * scale : 0.f;
  });
}

// rope(x [B,T,H,D]): pairs (i, i + D/2) rotate by t * theta^(-2i/D) (by minus that if inverse).
// The angles are computed in f32 the way Hugging Face LLaMA computes them.
void rope_kernel(const KernelCall& c) {
  const Shape& sx = c.in_shape(0);
  const int64_t B = sx.size(0), T = sx.size(1), H = sx.size(2), D = sx.size(3), half = D / 2;
  const float* x = c.in_f(0);
  float* y = c.out_f(0);
  const float theta = c.attrs().theta;
  const float sign = c.attrs().inverse ? -1.f : 1.f;
  // A sequence shard (parallel/partition.h) starts at its global position; in
  // zigzag order (ops/zigzag.h) a row's angle is that of its true position.
  const int64_t t0 = c.attrs().global_offset.empty() ? 0 : c.attrs().global_offset[1];
  const int64_t Tg = c.attrs().global_dims.empty() ? T : c.attrs().global_dims[1];
  std::vector<float> cos_t(T * half), sin_t(T * half);  // [T, D/2]
  for (int64_t i = 0; i < half; ++i) {
    const float inv_freq = 1.f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(D));
    for (int64_t t = 0; t < T; ++t) {
      const float a =
          static_cast<float>(zigzag_position(t + t0, Tg, c.attrs().seq_zigzag)) * inv_freq;
      cos_t[t * half + i] = std::cos(a);
      sin_t[t * half + i] = sign * std::sin(a);
    }
  }
  cpu::parallel_for(B * T, 3 * H * D, [&](int64_t lo, int64_t hi) {
    for (int64_t bt = lo; bt < hi; ++bt) {
      const float* cs = cos_t.data() + (bt % T) * half;
      const float* sn = sin_t.data() + (bt % T) * half;
      for (int64_t h = 0; h < H; ++h) {
        const float* xr = x + (bt * H + h) * D;
        float* yr = y + (bt * H + h) * D;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = xr[i], x2 = xr[i + half];
          yr[i] = x1 * cs[i] - x2 * sn[i];
          yr[i + half] = x2 * cs[i] + x1 * sn[i];
        }
      }
    }
  });
}

}  // namespace

void register_attention_kernels(KernelTable& t) {
  t[static_cast<int>(OpKind::kAttention)] = attention_kernel;
  t[static_cast<int>(OpKind::kAttentionGrad)] = attention_grad_kernel;
  t[static_cast<int>(OpKind::kDropout)] = dropout_kernel;
  t[static_cast<int>(OpKind::kDropoutGrad)] = dropout_kernel;
  t[static_cast<int>(OpKind::kRope)] = rope_kernel;
}

}  // namespace meshflow
