// Halo exchange for spatially split windows (ops/window.h): a block of an
// NCHW tensor grown by the rows its windows read from the neighbouring
// blocks, and the reverse for a gradient. The conv2d and pooling kernels use
// these when Attrs::halo_axis is set; so do the neighbor_exchange ops.
//
//   HaloInput x(c, c.in_f(0), c.in_shape(0), {kh, kw}, 0.f);  // x.data, x.shape, x.attrs
//   ... run the window kernel on x.shape with x.attrs (padding 0 where exchanged) ...
//   HaloOutput dx(c, c.out_f(0), c.out_shape(0), {kh, kw});   // dx.data: the grown block
//   ... write the gradient of the grown block into dx.data ..., then dx.fold();
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/kernels/kernel.h"

namespace meshflow::cpu {

// Grows `x` (of shape `s`) along dim `d` by `lo` elements from the previous
// member of `comm`'s line and `hi` from the next; `fill` at the line's ends.
// out has s with dim d grown by lo + hi.
void halo_grow(Communicator& comm, const float* x, const Shape& s, int d, int64_t lo, int64_t hi,
               float fill, float* out);
// The reverse: `g` (s grown along d by lo + hi) -> out (s): this block's rows
// plus the border rows its neighbours computed for it (dropped at the ends).
void halo_shrink(Communicator& comm, const float* g, const Shape& s, int d, int64_t lo, int64_t hi,
                 float* out);

// A window's input with the halo of every split spatial dim (height first,
// then width: the corners come with the second exchange). `kernel`: the
// window's size per spatial dim. Without halo_axis, data is x itself.
// (Without a halo nothing is copied: the kernels call this on every run.)
struct HaloInput {
  HaloInput(const KernelCall& c, const float* x, const Shape& s, std::array<int64_t, 2> kernel,
            float fill);
  const float* data;
  const Shape& shape() const { return grown_ ? grown_shape_ : in_shape_; }  // grown
  // The node's, with padding 0 and no halo_axis on the grown dims.
  const Attrs& attrs() const { return grown_ ? grown_attrs_ : in_attrs_; }

 private:
  const Shape& in_shape_;
  const Attrs& in_attrs_;
  bool grown_ = false;
  Shape grown_shape_;
  Attrs grown_attrs_;
  std::vector<float> buf_[2];
};

// A window's input gradient over the grown block, folded back into the
// block (`out`, of shape `s`) by fold(). Without halo_axis, data is out.
struct HaloOutput {
  HaloOutput(const KernelCall& c, float* out, const Shape& s, std::array<int64_t, 2> kernel);
  float* data;
  const Shape& shape() const { return grown_ ? grown_shape_ : s_; }  // grown
  const Attrs& attrs() const { return grown_ ? grown_attrs_ : c_.attrs(); }
  void fold();

 private:
  const KernelCall& c_;
  float* out_;
  const Shape& s_;
  bool grown_ = false;
  Shape grown_shape_;
  Attrs grown_attrs_;
  std::array<int64_t, 2> lo_{}, hi_{};
  std::vector<float> buf_[2];
};

}  // namespace meshflow::cpu
