// Sliding windows (conv2d, pooling) over a spatial dim split between ranks:
// how far a block's windows reach into its neighbours' blocks (the halo).
// Used by the ops' shape and sharding rules (ops/conv.cc, ops/pool.cc) and by
// the kernels that exchange the halo (kernels/cpu/halo.h).
//
// Block k of n holds input rows [k L, (k+1) L) and computes output rows
// [k L / s, (k+1) L / s) (the dim splits evenly only where H = OH x stride):
// those read rows k L - lo ... (k+1) L - 1 + hi, with
//   lo = padding,  hi = max(0, span - stride - padding),  span = dilation (kernel - 1) + 1.
#pragma once

#include <algorithm>
#include <cstdint>

#include "meshflow/ir/graph.h"

namespace meshflow {

struct WindowHalo {
  int64_t lo = 0, hi = 0;  // rows from the previous / next block
};

inline WindowHalo window_halo(int64_t kernel, int64_t stride, int64_t padding, int64_t dilation) {
  const int64_t span = dilation * (kernel - 1) + 1;
  return {padding, std::max<int64_t>(0, span - stride - padding)};
}

// Of spatial dim d (0: height, 1: width) of a node with n.attrs' geometry and
// a window of `kernel` along it.
inline WindowHalo window_halo(const Attrs& a, int d, int64_t kernel) {
  return window_halo(kernel, a.stride[d], a.padding[d], a.dilation[d]);
}

}  // namespace meshflow
