#include "meshflow/kernels/cpu/halo.h"

#include <algorithm>
#include <cstring>

#include "meshflow/comm/mesh_comms.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/window.h"

namespace meshflow::cpu {

namespace {

void check(const Status& s, const char* what) {
  if (!s.is_ok()) throw StatusError(s.with_context(what));
}

// s viewed as [outer, L, inner] around dim d.
struct Lines {
  int64_t outer, L, inner;
  Lines(const Shape& s, int d)
      : outer(s.prod(0, d)), L(s.size(d)), inner(s.prod(d + 1, s.rank())) {}
};

// rows [from, from + k) of every line of x -> packed.
void pack(const float* x, const Lines& l, int64_t from, int64_t k, float* out) {
  for (int64_t o = 0; o < l.outer; ++o)
    std::memcpy(out + o * k * l.inner, x + (o * l.L + from) * l.inner, sizeof(float) * k * l.inner);
}

Communicator& axis_comm(const KernelCall& c, int axis) {
  if (c.comms == nullptr)
    throw StatusError(Status::failed_precondition(
        node_label(c.n) + ": a spatially split window needs the mesh's communicators"));
  return c.comms->axis(axis);
}

}  // namespace

void halo_grow(Communicator& comm, const float* x, const Shape& s, int d, int64_t lo, int64_t hi,
               float fill, float* out) {
  const Lines l(s, d);
  const int64_t G = l.L + lo + hi;
  // To the next member: my last lo rows (its lo halo); to the previous: my first hi.
  std::vector<float> to_prev(l.outer * hi * l.inner), to_next(l.outer * lo * l.inner),
      from_prev(to_next.size(), fill), from_next(to_prev.size(), fill);
  pack(x, l, 0, hi, to_prev.data());
  pack(x, l, l.L - lo, lo, to_next.data());
  check(comm.neighbor_exchange(to_prev.data(), static_cast<int64_t>(to_prev.size()), to_next.data(),
                               static_cast<int64_t>(to_next.size()), from_prev.data(),
                               from_next.data(), DType::F32),
        "halo exchange");
  for (int64_t o = 0; o < l.outer; ++o) {
    float* row = out + o * G * l.inner;
    std::memcpy(row, from_prev.data() + o * lo * l.inner, sizeof(float) * lo * l.inner);
    std::memcpy(row + lo * l.inner, x + o * l.L * l.inner, sizeof(float) * l.L * l.inner);
    std::memcpy(row + (lo + l.L) * l.inner, from_next.data() + o * hi * l.inner,
                sizeof(float) * hi * l.inner);
  }
}

void halo_shrink(Communicator& comm, const float* g, const Shape& s, int d, int64_t lo, int64_t hi,
                 float* out) {
  const Lines l(s, d);
  const Shape grown = s.with_size(d, l.L + lo + hi);
  const Lines lg(grown, d);
  // My first lo rows belong to the previous member's last lo; my last hi to
  // the next member's first hi.
  std::vector<float> to_prev(l.outer * lo * l.inner), to_next(l.outer * hi * l.inner),
      from_prev(to_next.size(), 0.f), from_next(to_prev.size(), 0.f);
  pack(g, lg, 0, lo, to_prev.data());
  pack(g, lg, lo + l.L, hi, to_next.data());
  check(comm.neighbor_exchange(to_prev.data(), static_cast<int64_t>(to_prev.size()), to_next.data(),
                               static_cast<int64_t>(to_next.size()), from_prev.data(),
                               from_next.data(), DType::F32),
        "halo exchange (gradient)");
  for (int64_t o = 0; o < l.outer; ++o) {
    float* row = out + o * l.L * l.inner;
    std::memcpy(row, g + (o * lg.L + lo) * l.inner, sizeof(float) * l.L * l.inner);
    const float* fp = from_prev.data() + o * hi * l.inner;  // the previous member's last hi rows
    for (int64_t i = 0; i < hi * l.inner; ++i) row[i] += fp[i];
    const float* fn = from_next.data() + o * lo * l.inner;  // the next member's first lo rows
    float* tail = row + (l.L - lo) * l.inner;
    for (int64_t i = 0; i < lo * l.inner; ++i) tail[i] += fn[i];
  }
}

HaloInput::HaloInput(const KernelCall& c, const float* x, const Shape& s,
                     std::array<int64_t, 2> kernel, float fill)
    : data(x), in_shape_(s), in_attrs_(c.attrs()) {
  for (int d = 0; d < 2; ++d) {
    if (in_attrs_.halo_axis[d] < 0) continue;
    if (!grown_) grown_ = true, grown_shape_ = in_shape_, grown_attrs_ = in_attrs_;
    const WindowHalo h = window_halo(grown_attrs_, d, kernel[d]);
    const Shape grown = grown_shape_.with_size(2 + d, grown_shape_.size(2 + d) + h.lo + h.hi);
    buf_[d].resize(grown.numel());
    halo_grow(axis_comm(c, in_attrs_.halo_axis[d]), data, grown_shape_, 2 + d, h.lo, h.hi, fill,
              buf_[d].data());
    data = buf_[d].data();
    grown_shape_ = grown;
    grown_attrs_.padding[d] = 0;
    grown_attrs_.halo_axis[d] = -1;
  }
}

HaloOutput::HaloOutput(const KernelCall& c, float* out, const Shape& s,
                       std::array<int64_t, 2> kernel)
    : data(out), c_(c), out_(out), s_(s) {
  for (int d = 0; d < 2; ++d) {
    if (c.attrs().halo_axis[d] < 0) continue;
    if (!grown_) grown_ = true, grown_shape_ = s_, grown_attrs_ = c.attrs();
    const WindowHalo h = window_halo(grown_attrs_, d, kernel[d]);
    lo_[d] = h.lo, hi_[d] = h.hi;
    grown_shape_ = grown_shape_.with_size(2 + d, grown_shape_.size(2 + d) + h.lo + h.hi);
    grown_attrs_.padding[d] = 0;
    grown_attrs_.halo_axis[d] = -1;
  }
  if (grown_shape_.numel() != s.numel() && grown_) {
    buf_[1].resize(grown_shape_.numel());
    data = buf_[1].data();
  }
}

void HaloOutput::fold() {
  if (data == out_) return;
  const std::array<int, 2>& axis = c_.attrs().halo_axis;
  // Width first (it was grown last), then height.
  const float* cur = data;
  if (axis[1] >= 0) {
    const Shape to = grown_shape_.with_size(3, s_.size(3));
    float* dst = axis[0] >= 0 ? (buf_[0].resize(to.numel()), buf_[0].data()) : out_;
    halo_shrink(axis_comm(c_, axis[1]), cur, to, 3, lo_[1], hi_[1], dst);
    cur = dst;
  }
  if (axis[0] >= 0) halo_shrink(axis_comm(c_, axis[0]), cur, s_, 2, lo_[0], hi_[0], out_);
}

}  // namespace meshflow::cpu
