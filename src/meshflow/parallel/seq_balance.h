// Causal ring attention's load balance: the sequence in zigzag order.
//
// With contiguous blocks the ring's last rank computes every block it meets
// and the first almost none (causal masking), so a step waits on the last. In
// zigzag order (ops/zigzag.h) rank r holds chunks r and 2n-1-r of 2n, and
// every rank computes half of every block: the balance Megatron's context
// parallel and ring-flash-attention's zigzag variant use. The order is the
// data's, not the layout's: the trainer feeds each sequence input reordered,
// a contiguous split of that order gives each rank its two chunks, and the
// ops whose result depends on a row's position read its true one.
//
//   MF_ASSIGN_OR_RETURN(SeqBalance sb, balance_sequence(g, /*ranks=*/cp));  // before autodiff
//   feed(name, sb.inputs.count(name) ? zigzag_tensor(t, sb.inputs.at(name), sb.ranks) : t);
//
// The pass, on a forward graph:
//   - every Input with a dim named "seq" is a sequence input (tokens,
//     targets); its length must cut into 2 x ranks chunks;
//   - attention, rope and dropout on values derived from them get
//     attrs.seq_zigzag / seq_dim (their gradients copy the attrs);
//   - a value not derived from the data (a position table: GPT's wpe slice)
//     that meets the sequence in an element-wise op is reordered by a zigzag
//     op inserted before it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "meshflow/core/status.h"
#include "meshflow/core/tensor.h"
#include "meshflow/ir/graph.h"

namespace meshflow {

struct SeqBalance {
  int64_t ranks = 0;                  // 0: the natural order (nothing changed)
  std::map<std::string, int> inputs;  // sequence input name -> its seq dim
};

// Rewrites the forward graph g for the zigzag order over `ranks` (> 1). Errors
// name the input whose length does not cut into 2 x ranks chunks (and the
// valid lengths), a dropout whose value has no "seq" dim, and a graph that
// already has its backward.
Result<SeqBalance> balance_sequence(Graph& g, int64_t ranks);

// t with dim `dim` in zigzag order over `ranks` (a copy; f32 or i32).
Tensor zigzag_tensor(const Tensor& t, int dim, int64_t ranks);

}  // namespace meshflow
