// Ring attention kernels (kernels/cpu/ring_attention.h). Per step the block
// math is the flash-attention recurrence of kernels/cpu/attention.cc written
// for one (query block, key block) pair whose rows carry global positions.
//
// Legend: B batch, H query heads, Hkv kv heads (H = rep * Hkv), T local
// queries, S local keys (= T), D head dim. q, out, dq: [B,H,T,D];
// k, v, dk, dv: [B,Hkv,S,D]; lse [B,H,T]. A k/v block travels as one buffer
// [k | v] (2 * B*Hkv*S*D floats), a dk/dv accumulator likewise.
//
// Under causal masking a block's rows are cut into runs of consecutive true
// positions (ops/zigzag.h: one run for contiguous blocks, two for the zigzag
// order) and each (query run, key run) pair is computed on its own: a pair
// wholly in the future is skipped, so in zigzag order every rank does the
// same half of each block's work.
#include "meshflow/kernels/cpu/ring_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "meshflow/comm/mesh_comms.h"
#include "meshflow/core/check.h"
#include "meshflow/kernels/cpu/gemm.h"
#include "meshflow/kernels/cpu/parallel.h"
#include "meshflow/kernels/cpu/vmath.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/zigzag.h"

namespace meshflow::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct RingDims {
  int64_t B, H, Hkv, T, S, D, rep;
  float scale;
  bool causal;
  int64_t q_elems() const { return B * H * T * D; }
  int64_t kv_elems() const { return B * Hkv * S * D; }
};

RingDims ring_dims(const Shape& q, const Shape& k, const Attrs& at) {
  RingDims d{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), 0, 0.f, at.causal};
  d.rep = d.H / d.Hkv;
  d.scale = at.alpha == 0.f ? 1.f / std::sqrt(static_cast<float>(d.D)) : at.alpha;
  return d;
}

void check(const Status& s, const Node& n) {
  if (!s.is_ok()) throw StatusError(s.with_context(node_label(n) + " (ring attention)"));
}

// The ring's communicator and this rank's place on it; one rank without a
// ring (a whole sequence in zigzag order). Tg: the sequence's global length.
struct RingPlace {
  Communicator* comm;
  int n, r;
  int64_t Tg;
};

RingPlace ring_place(const KernelCall& c, int64_t T, int64_t S) {
  MF_CHECK_EQ(T, S) << node_label(c.n)
                    << ": ring attention and the zigzag order need as many keys as queries";
  if (c.attrs().mesh_axis < 0) return {nullptr, 1, 0, T};
  if (c.comms == nullptr)
    throw StatusError(Status::failed_precondition(
        node_label(c.n) + ": ring attention needs the mesh's communicators"));
  Communicator& comm = c.comms->axis(c.attrs().mesh_axis);
  RingPlace p{&comm, comm.size(), comm.rank(), T * comm.size()};
  const auto& off = c.attrs().global_offset;
  MF_CHECK(off.size() >= 3 && off[2] == p.r * T)
      << node_label(c.n) << ": ring block offset " << (off.size() >= 3 ? off[2] : -1)
      << " is not rank " << p.r << " x " << T;
  return p;
}

// The runs of consecutive true positions in block `src`'s rows; without the
// causal mask positions do not matter: the block is one run.
std::vector<PositionRun> block_runs(const RingDims& d, const RingPlace& rp, const Attrs& at,
                                    int src) {
  if (!d.causal) return {{0, d.T, 0}};
  return position_runs(src * d.T, d.T, rp.Tg, at.seq_zigzag);
}

// Do the runs' true positions increase along the block's rows? (A rank's
// block in zigzag order: chunk r before chunk 2n-1-r. Not a whole zigzag
// sequence on one rank.)
bool increasing(const std::vector<PositionRun>& runs) {
  for (size_t i = 1; i < runs.size(); ++i)
    if (runs[i].pos0 < runs[i - 1].pos0 + runs[i - 1].rows) return false;
  return true;
}

// One GEMM block of a step: query rows [row0, row0 + rows) of the rank's
// block against keys [key0, key0 + cols) of the visiting block; row t of the
// rank's block sees the first seen[t] of those keys.
struct StepWork {
  int64_t row0 = 0, rows = 0, key0 = 0, cols = 0;
  std::vector<int64_t> seen;
};

// A step's work as few GEMMs of useful size: where the visiting block's true
// positions increase along its rows, one per query run (ops/zigzag.h
// ring_step_blocks: the run's rows that see any key against the keys its
// last row sees; forward_block and backward_block cut it into tiles of
// kRingTileRows rows, and the pairs the mask hides inside a tile are computed
// and dropped, as the one-rank kernel does on its diagonal blocks); otherwise (a whole
// zigzag sequence on one rank) one per (query run, key run) pair.
std::vector<StepWork> step_work(const RingDims& d, const RingPlace& rp, const Attrs& at, int src) {
  const std::vector<PositionRun> q = block_runs(d, rp, at, rp.r), k = block_runs(d, rp, at, src);
  auto seen_of = [&](const PositionRun& kr, int64_t t_pos) {
    return d.causal ? std::clamp<int64_t>(t_pos - kr.pos0 + 1, 0, kr.rows) : kr.rows;
  };
  std::vector<StepWork> out;
  if (increasing(k)) {
    std::vector<int64_t> seen(d.T, 0);
    for (const PositionRun& qr : q)
      for (int64_t i = 0; i < qr.rows; ++i)
        for (const PositionRun& kr : k) seen[qr.row0 + i] += seen_of(kr, qr.pos0 + i);
    for (const RingBlock& b : ring_step_blocks(d.T, rp.Tg, at.seq_zigzag, rp.r, src, d.causal))
      out.push_back({b.row0, b.rows, 0, b.cols, seen});
    return out;
  }
  for (const PositionRun& kr : k)
    for (const PositionRun& qr : q) {
      if (d.causal && kr.pos0 > qr.pos0 + qr.rows - 1) continue;  // wholly in the future
      StepWork w{qr.row0, qr.rows, kr.row0, kr.rows, std::vector<int64_t>(d.T, 0)};
      for (int64_t i = 0; i < qr.rows; ++i) w.seen[qr.row0 + i] = seen_of(kr, qr.pos0 + i);
      out.push_back(std::move(w));
    }
  return out;
}

// The ring kernels' buffers, per thread (each in-process rank runs its own)
// and reused from call to call, not initialized: the k/v blocks and
// accumulators in flight and the transposed keys. Fresh vectors were
// zero-filled and page-faulted in on every call: 40% of the forward
// kernel's time on 2 ranks (2026-11-27, gpt_bytes_small at cp=2: step 252
// -> 215 ms); uninitialized ones freed after each call still ran 244-288 ms
// against 217-223 kept. Kept for the run, they add nothing to the process's
// peak: the executor's arena is laid out once, so a call's buffers sat on
// top of all of it anyway.
enum Slot { kKv0, kKv1, kMine, kSent, kGot, kKt, kVt, kSlots };
float* scratch(Slot slot, int64_t n) {
  thread_local std::vector<float> bufs[kSlots];
  std::vector<float>& b = bufs[slot];
  if (static_cast<int64_t>(b.size()) < n) b.resize(static_cast<size_t>(n));
  return b.data();
}

// w's keys of every kv head of x ([B,Hkv,S,D]) transposed: [B*Hkv][D][cols]
// (kernels/cpu/gemm.h transpose_to: the score GEMMs run NN), in `slot`.
const float* transposed(const RingDims& d, const float* x, const StepWork& w, Slot slot) {
  float* xt = scratch(slot, d.B * d.Hkv * d.D * w.cols);
  cpu::parallel_for(d.B * d.Hkv, w.cols * d.D, [&](int64_t lo, int64_t hi) {
    for (int64_t bg = lo; bg < hi; ++bg)
      transpose_to(x + (bg * d.S + w.key0) * d.D, w.cols, d.D, xt + bg * d.D * w.cols);
  });
  return xt;
}

// The keys rows [i0, i0 + rows) of w see: the most any of them sees (a
// row's keys are a prefix of the block's, ops/zigzag.h ring_step_blocks).
int64_t tile_keys(const StepWork& w, int64_t i0, int64_t rows) {
  int64_t keys = 0;
  for (int64_t i = i0; i < i0 + rows; ++i) keys = std::max(keys, w.seen[w.row0 + i]);
  return std::min(keys, w.cols);
}

// Merges w's keys of the block (k, v) into w's query rows: their running
// max m, sum l and unnormalized out acc (rows of [B,H,T]). In tiles of
// kRingTileRows query rows, each against the keys its rows see: a tile's
// scores stay in cache between the two GEMMs, and the causal triangle is
// computed to the tile's edge (the cost model prices the same tiles).
void forward_block(const RingDims& d, const float* q, const float* k, const float* v,
                   const StepWork& w, float* m, float* l, float* acc) {
  const int64_t nq = w.rows, nk = w.cols, r0 = w.row0;
  const float* kt = transposed(d, k, w, kKt);
  cpu::parallel_for(d.B * d.H, 4 * nq * nk * d.D, [&](int64_t lo, int64_t hi) {
    std::vector<float> s(std::min(nq, kRingTileRows) * nk);
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t bg = (bh / d.H) * d.Hkv + (bh % d.H) / d.rep;
      const float* vp = v + (bg * d.S + w.key0) * d.D;
      for (int64_t i0 = 0; i0 < nq; i0 += kRingTileRows) {
        const int64_t rows = std::min(kRingTileRows, nq - i0), keys = tile_keys(w, i0, rows);
        if (keys == 0) continue;
        const float* qp = q + (bh * d.T + r0 + i0) * d.D;
        float* ap = acc + (bh * d.T + r0 + i0) * d.D;
        small_sgemm(false, false, rows, keys, d.D, d.scale, qp, d.D, kt + bg * d.D * nk, nk, 0.f,
                    s.data(), keys);
        for (int64_t i = 0; i < rows; ++i) {
          float* row = s.data() + i * keys;
          const int64_t seen = std::min(keys, w.seen[r0 + i0 + i]);
          std::fill(row + seen, row + keys, 0.f);
          if (seen == 0) continue;
          float bm = row[0];
#pragma omp simd reduction(max : bm)
          for (int64_t j = 1; j < seen; ++j) bm = std::max(bm, row[j]);
          const int64_t t = bh * d.T + r0 + i0 + i;
          const float mn = std::max(m[t], bm);
          const float corr = m[t] == kNegInf ? 0.f : std::exp(m[t] - mn);
          float sum = 0.f;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < seen; ++j) {
            const float e = exp_approx(row[j] - mn);
            row[j] = e;
            sum += e;
          }
          l[t] = l[t] * corr + sum;
          m[t] = mn;
          for (int64_t j = 0; j < d.D; ++j) ap[i * d.D + j] *= corr;
        }
        small_sgemm(false, false, rows, d.D, keys, 1.f, s.data(), keys, vp, d.D, 1.f, ap, d.D);
      }
    }
  });
}

// Adds w's share of the block (k, v) with w's query rows to dq and to the
// block's accumulators dk, dv, in the forward's tiles:
//   P = exp(scale*QK^T - lse) (masked); dV += P^T dO; dS = P*(dO V^T - Di);
//   dQ += scale*dS K; dK += scale*dS^T Q.   di = rowsum(dO * O) per query row.
void backward_block(const RingDims& d, const float* dout, const float* q, const float* lse,
                    const float* di, const float* k, const float* v, const StepWork& w, float* dq,
                    float* dk, float* dv) {
  const int64_t nq = w.rows, nk = w.cols, r0 = w.row0;
  const float *kt = transposed(d, k, w, kKt), *vt = transposed(d, v, w, kVt);
  cpu::parallel_for(d.B * d.Hkv, 10 * d.rep * nq * nk * d.D, [&](int64_t lo, int64_t hi) {
    const int64_t tile = std::min(nq, kRingTileRows);
    std::vector<float> p(tile * nk), ds(tile * nk);
    for (int64_t bg = lo; bg < hi; ++bg) {
      const int64_t koff = (bg * d.S + w.key0) * d.D;
      const float* kp = k + koff;
      float* dkp = dk + koff;
      float* dvp = dv + koff;
      for (int64_t hh = 0; hh < d.rep; ++hh) {
        const int64_t bh = (bg / d.Hkv) * d.H + (bg % d.Hkv) * d.rep + hh;
        for (int64_t i0 = 0; i0 < nq; i0 += kRingTileRows) {
          const int64_t rows = std::min(kRingTileRows, nq - i0), keys = tile_keys(w, i0, rows);
          if (keys == 0) continue;
          const int64_t t0 = bh * d.T + r0 + i0, off = t0 * d.D;
          small_sgemm(false, false, rows, keys, d.D, d.scale, q + off, d.D, kt + bg * d.D * nk, nk,
                      0.f, p.data(), keys);
          small_sgemm(false, false, rows, keys, d.D, 1.f, dout + off, d.D, vt + bg * d.D * nk, nk,
                      0.f, ds.data(), keys);
          for (int64_t i = 0; i < rows; ++i) {
            float* pr = p.data() + i * keys;
            float* sr = ds.data() + i * keys;
            const float lv = lse[t0 + i], dr = di[t0 + i];
            const int64_t seen = lv == kNegInf ? 0 : std::min(keys, w.seen[r0 + i0 + i]);
#pragma omp simd
            for (int64_t j = 0; j < seen; ++j) {
              const float pj = exp_approx(pr[j] - lv);
              pr[j] = pj;
              sr[j] = d.scale * pj * (sr[j] - dr);
            }
            std::fill(pr + seen, pr + keys, 0.f);
            std::fill(sr + seen, sr + keys, 0.f);
          }
          small_sgemm(true, false, keys, d.D, rows, 1.f, p.data(), keys, dout + off, d.D, 1.f, dvp,
                      d.D);
          small_sgemm(false, false, rows, d.D, keys, 1.f, ds.data(), keys, kp, d.D, 1.f, dq + off,
                      d.D);
          small_sgemm(true, false, keys, d.D, rows, 1.f, ds.data(), keys, q + off, d.D, 1.f, dkp,
                      d.D);
        }
      }
    }
  });
}

}  // namespace

void ring_attention(const KernelCall& c) {
  const RingDims d = ring_dims(c.in_shape(0), c.in_shape(1), c.attrs());
  const RingPlace rp = ring_place(c, d.T, d.S);
  const int64_t nkv = d.kv_elems(), rows = d.B * d.H * d.T;
  std::vector<float> m(rows, kNegInf), l(rows, 0.f);
  float* out = c.out_f(0);
  float* lse = c.out_f(1);
  std::fill(out, out + d.q_elems(), 0.f);
  // Per-thread buffers: they outlive the shifts on every path.
  float* kv[2] = {scratch(kKv0, 2 * nkv), scratch(kKv1, 2 * nkv)};
  std::memcpy(kv[0], c.in_f(1), nkv * sizeof(float));
  std::memcpy(kv[0] + nkv, c.in_f(2), nkv * sizeof(float));
  for (int s = 0, cur = 0; s < rp.n; ++s, cur ^= 1) {
    Work next;
    if (s + 1 < rp.n) next = rp.comm->ring_shift_async(kv[cur], kv[cur ^ 1], 2 * nkv, DType::F32);
    for (const StepWork& w : step_work(d, rp, c.attrs(), (rp.r - s + rp.n) % rp.n))
      forward_block(d, c.in_f(0), kv[cur], kv[cur] + nkv, w, m.data(), l.data(), out);
    check(next.wait(), c.n);
  }
  for (int64_t t = 0; t < rows; ++t) {
    const float inv = l[t] > 0.f ? 1.f / l[t] : 0.f;
    for (int64_t j = 0; j < d.D; ++j) out[t * d.D + j] *= inv;
    lse[t] = l[t] > 0.f ? m[t] + std::log(l[t]) : kNegInf;
  }
}

void ring_attention_grad(const KernelCall& c) {
  const RingDims d = ring_dims(c.in_shape(1), c.in_shape(2), c.attrs());
  const RingPlace rp = ring_place(c, d.T, d.S);
  const int64_t nkv = d.kv_elems(), rows = d.B * d.H * d.T;
  const float* dout = c.in_f(0);
  const float* q = c.in_f(1);
  const float* out = c.in_f(4);
  const float* lse = c.in_f(5);
  float* dq = c.out_f(0);
  std::fill(dq, dq + d.q_elems(), 0.f);
  std::vector<float> di(rows);
  for (int64_t t = 0; t < rows; ++t) {
    float acc = 0.f;
    for (int64_t j = 0; j < d.D; ++j) acc += dout[t * d.D + j] * out[t * d.D + j];
    di[t] = acc;
  }
  if (rp.n == 1) {  // one rank: the block's own k/v, no ring
    std::fill(c.out_f(1), c.out_f(1) + nkv, 0.f);
    std::fill(c.out_f(2), c.out_f(2) + nkv, 0.f);
    for (const StepWork& w : step_work(d, rp, c.attrs(), 0))
      backward_block(d, dout, q, lse, di.data(), c.in_f(2), c.in_f(3), w, dq, c.out_f(1),
                     c.out_f(2));
    return;
  }
  // Per-thread buffers: they outlive every Work below. mine: this step's share;
  // sent: the accumulator in flight to rank + 1; got: the one arriving from rank - 1.
  float* kv[2] = {scratch(kKv0, 2 * nkv), scratch(kKv1, 2 * nkv)};
  float *mine = scratch(kMine, 2 * nkv), *sent = scratch(kSent, 2 * nkv);
  float* got = scratch(kGot, 2 * nkv);
  std::memcpy(kv[0], c.in_f(2), nkv * sizeof(float));
  std::memcpy(kv[0] + nkv, c.in_f(3), nkv * sizeof(float));
  Work grads;  // the accumulator's shift issued at the previous step
  for (int s = 0, cur = 0; s < rp.n; ++s, cur ^= 1) {
    Work next;
    if (s + 1 < rp.n) next = rp.comm->ring_shift_async(kv[cur], kv[cur ^ 1], 2 * nkv, DType::F32);
    std::fill(mine, mine + 2 * nkv, 0.f);
    for (const StepWork& w : step_work(d, rp, c.attrs(), (rp.r - s + rp.n) % rp.n))
      backward_block(d, dout, q, lse, di.data(), kv[cur], kv[cur] + nkv, w, dq, mine, mine + nkv);
    if (s > 0) {
      check(grads.wait(), c.n);
      for (int64_t i = 0; i < 2 * nkv; ++i) mine[i] += got[i];
    }
    std::swap(mine, sent);  // the old `sent` has arrived: it is free
    grads = rp.comm->ring_shift_async(sent, got, 2 * nkv, DType::F32);
    check(next.wait(), c.n);
  }
  check(grads.wait(), c.n);  // the n-th shift brings this rank's own block home
  std::memcpy(c.out_f(1), got, nkv * sizeof(float));
  std::memcpy(c.out_f(2), got + nkv, nkv * sizeof(float));
}

}  // namespace meshflow::cpu
