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
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "meshflow/ir/graph.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/sharding_rule.h"

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

// The spatial dim d of a window op splits with a halo exchange when its input
// has stride x the output's rows (in_rows, out_rows): then f becomes the
// kHalo factor of out_rows (the blocks of input and output line up).
bool make_halo_factor(ShardingRule::Factor& f, const Attrs& a, int d, int64_t kernel,
                      int64_t in_rows, int64_t out_rows);

// Local attributes: Attrs::halo_axis of each spatial dim the window's input
// `x` (its layout on this rank) is split along.
void set_halo_axes(LocalAttrsCall& c, const Layout& x);

// The exchanges of each split spatial dim of local input `x` (grow: x's
// border rows, neighbor_exchange; fold: dx's, neighbor_exchange_grad), for
// explain and the cost model.
void add_halo_collectives(const Attrs& a, const Shape& x, std::array<int64_t, 2> kernel, bool grow,
                          bool fold, std::vector<InnerCollective>* out);

}  // namespace meshflow
