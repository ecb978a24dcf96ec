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

// Causal: key position kp is visible to query position qp iff kp <= qp.
bool pair_skipped(const RingDims& d, const PositionRun& qr, const PositionRun& kr) {
  return d.causal && kr.pos0 > qr.pos0 + qr.rows - 1;
}

// Keys of run kr visible to row i of run qr: all, or those at positions <= its own.
int64_t keys_seen(const RingDims& d, const PositionRun& qr, const PositionRun& kr, int64_t i) {
  return d.causal ? std::clamp<int64_t>(qr.pos0 + i - kr.pos0 + 1, 0, kr.rows) : kr.rows;
}

// Merges key run kr of block (k, v) into query run qr's rows: their running
// max m, sum l and unnormalized out acc (rows of [B,H,T]).
void forward_block(const RingDims& d, const float* q, const float* k, const float* v,
                   const PositionRun& qr, const PositionRun& kr, float* m, float* l, float* acc) {
  const int64_t nq = qr.rows, nk = kr.rows;
  cpu::parallel_for(d.B * d.H, 4 * nq * nk * d.D, [&](int64_t lo, int64_t hi) {
    std::vector<float> s(nq * nk);
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t bg = (bh / d.H) * d.Hkv + (bh % d.H) / d.rep;
      const float* qp = q + (bh * d.T + qr.row0) * d.D;
      const float* kp = k + (bg * d.S + kr.row0) * d.D;
      const float* vp = v + (bg * d.S + kr.row0) * d.D;
      float* ap = acc + (bh * d.T + qr.row0) * d.D;
      sgemm(false, true, nq, nk, d.D, d.scale, qp, d.D, kp, d.D, 0.f, s.data(), nk);
      for (int64_t i = 0; i < nq; ++i) {
        float* row = s.data() + i * nk;
        const int64_t seen = keys_seen(d, qr, kr, i);
        std::fill(row + seen, row + nk, 0.f);
        if (seen == 0) continue;
        float bm = row[0];
        for (int64_t j = 1; j < seen; ++j) bm = std::max(bm, row[j]);
        const int64_t t = bh * d.T + qr.row0 + i;
        const float mn = std::max(m[t], bm);
        const float corr = m[t] == kNegInf ? 0.f : std::exp(m[t] - mn);
        float sum = 0.f;
        for (int64_t j = 0; j < seen; ++j) sum += row[j] = std::exp(row[j] - mn);
        l[t] = l[t] * corr + sum;
        m[t] = mn;
        for (int64_t j = 0; j < d.D; ++j) ap[i * d.D + j] *= corr;
      }
      sgemm(false, false, nq, d.D, nk, 1.f, s.data(), nk, vp, d.D, 1.f, ap, d.D);
    }
  });
}

// Adds key run kr of block (k, v)'s share with query run qr to dq and to the
// block's accumulators dk, dv:
//   P = exp(scale*QK^T - lse) (masked); dV += P^T dO; dS = P*(dO V^T - Di);
//   dQ += scale*dS K; dK += scale*dS^T Q.   di = rowsum(dO * O) per query row.
void backward_block(const RingDims& d, const float* dout, const float* q, const float* lse,
                    const float* di, const float* k, const float* v, const PositionRun& qr,
                    const PositionRun& kr, float* dq, float* dk, float* dv) {
  const int64_t nq = qr.rows, nk = kr.rows;
  cpu::parallel_for(d.B * d.Hkv, 10 * d.rep * nq * nk * d.D, [&](int64_t lo, int64_t hi) {
    std::vector<float> p(nq * nk), ds(nq * nk);
    for (int64_t bg = lo; bg < hi; ++bg) {
      const int64_t koff = (bg * d.S + kr.row0) * d.D;
      const float* kp = k + koff;
      const float* vp = v + koff;
      float* dkp = dk + koff;
      float* dvp = dv + koff;
      for (int64_t hh = 0; hh < d.rep; ++hh) {
        const int64_t bh = (bg / d.Hkv) * d.H + (bg % d.Hkv) * d.rep + hh;
        const int64_t t0 = bh * d.T + qr.row0, off = t0 * d.D;
        sgemm(false, true, nq, nk, d.D, d.scale, q + off, d.D, kp, d.D, 0.f, p.data(), nk);
        sgemm(false, true, nq, nk, d.D, 1.f, dout + off, d.D, vp, d.D, 0.f, ds.data(), nk);
        for (int64_t i = 0; i < nq; ++i) {
          float* pr = p.data() + i * nk;
          float* sr = ds.data() + i * nk;
          const float lv = lse[t0 + i], dr = di[t0 + i];
          const int64_t seen = keys_seen(d, qr, kr, i);
          for (int64_t j = 0; j < nk; ++j) {
            const float pj = j < seen && lv != kNegInf ? std::exp(pr[j] - lv) : 0.f;
            pr[j] = pj;
            sr[j] = d.scale * pj * (sr[j] - dr);
          }
        }
        sgemm(true, false, nk, d.D, nq, 1.f, p.data(), nk, dout + off, d.D, 1.f, dvp, d.D);
        sgemm(false, false, nq, d.D, nk, 1.f, ds.data(), nk, kp, d.D, 1.f, dq + off, d.D);
        sgemm(true, false, nk, d.D, nq, 1.f, ds.data(), nk, q + off, d.D, 1.f, dkp, d.D);
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
  // Declared before any Work so they outlive the shifts on every path.
  std::vector<float> kv[2] = {std::vector<float>(2 * nkv), std::vector<float>(2 * nkv)};
  std::memcpy(kv[0].data(), c.in_f(1), nkv * sizeof(float));
  std::memcpy(kv[0].data() + nkv, c.in_f(2), nkv * sizeof(float));
  const std::vector<PositionRun> qruns = block_runs(d, rp, c.attrs(), rp.r);
  for (int s = 0, cur = 0; s < rp.n; ++s, cur ^= 1) {
    Work next;
    if (s + 1 < rp.n)
      next = rp.comm->ring_shift_async(kv[cur].data(), kv[cur ^ 1].data(), 2 * nkv, DType::F32);
    for (const PositionRun& kr : block_runs(d, rp, c.attrs(), (rp.r - s + rp.n) % rp.n))
      for (const PositionRun& qr : qruns)
        if (!pair_skipped(d, qr, kr))
          forward_block(d, c.in_f(0), kv[cur].data(), kv[cur].data() + nkv, qr, kr, m.data(),
                        l.data(), out);
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
    const std::vector<PositionRun> runs = block_runs(d, rp, c.attrs(), 0);
    std::fill(c.out_f(1), c.out_f(1) + nkv, 0.f);
    std::fill(c.out_f(2), c.out_f(2) + nkv, 0.f);
    for (const PositionRun& kr : runs)
      for (const PositionRun& qr : runs)
        if (!pair_skipped(d, qr, kr))
          backward_block(d, dout, q, lse, di.data(), c.in_f(2), c.in_f(3), qr, kr, dq, c.out_f(1),
                         c.out_f(2));
    return;
  }
  // Buffers first: they outlive every Work below. mine: this step's share;
  // sent: the accumulator in flight to rank + 1; got: the one arriving from rank - 1.
  std::vector<float> kv[2] = {std::vector<float>(2 * nkv), std::vector<float>(2 * nkv)};
  std::vector<float> mine(2 * nkv), sent(2 * nkv), got(2 * nkv);
  std::memcpy(kv[0].data(), c.in_f(2), nkv * sizeof(float));
  std::memcpy(kv[0].data() + nkv, c.in_f(3), nkv * sizeof(float));
  const std::vector<PositionRun> qruns = block_runs(d, rp, c.attrs(), rp.r);
  Work grads;  // the accumulator's shift issued at the previous step
  for (int s = 0, cur = 0; s < rp.n; ++s, cur ^= 1) {
    Work next;
    if (s + 1 < rp.n)
      next = rp.comm->ring_shift_async(kv[cur].data(), kv[cur ^ 1].data(), 2 * nkv, DType::F32);
    std::fill(mine.begin(), mine.end(), 0.f);
    for (const PositionRun& kr : block_runs(d, rp, c.attrs(), (rp.r - s + rp.n) % rp.n))
      for (const PositionRun& qr : qruns)
        if (!pair_skipped(d, qr, kr))
          backward_block(d, dout, q, lse, di.data(), kv[cur].data(), kv[cur].data() + nkv, qr, kr,
                         dq, mine.data(), mine.data() + nkv);
    if (s > 0) {
      check(grads.wait(), c.n);
      for (int64_t i = 0; i < 2 * nkv; ++i) mine[i] += got[i];
    }
    std::swap(mine, sent);  // the old `sent` has arrived: it is free
    grads = rp.comm->ring_shift_async(sent.data(), got.data(), 2 * nkv, DType::F32);
    check(next.wait(), c.n);
  }
  check(grads.wait(), c.n);  // the n-th shift brings this rank's own block home
  std::memcpy(c.out_f(1), got.data(), nkv * sizeof(float));
  std::memcpy(c.out_f(2), got.data() + nkv, nkv * sizeof(float));
}

}  // namespace meshflow::cpu
