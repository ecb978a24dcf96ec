// Ring attention (context parallel over keys): the attention kernels' path
// when the partitioner split the query and key sequence over one mesh axis
// (ops/attention.cc sets attrs.mesh_axis to that axis, attrs.group_size to
// its size). Each rank keeps its query block; the k/v blocks go round the
// axis as a ring, so after n steps every query block has met every key block.
//
//   if (c.attrs().mesh_axis >= 0) return cpu::ring_attention(c);  // in attention_kernel
//
// Forward: at step s the rank holds the k/v block of rank (r - s) mod n. It
// starts sending that block on to rank r + 1 (Communicator::ring_shift_async)
// and, while it travels, merges the block's attention into the running
// (max, sum, unnormalized out) of each query row (online softmax). Under
// causal masking a block wholly after the rank's queries is not computed,
// only passed on. Backward: dq stays home; the dk/dv accumulator of a block
// travels with it, this rank's share added at each step, and lands at the
// block's owner after the n-th shift. Both the next k/v block and the
// previous step's dk/dv accumulator are in flight during each step's compute.
// Blocks are contiguous: rank r holds positions [r*T/n, (r+1)*T/n).
#pragma once

#include "meshflow/kernels/kernel.h"

namespace meshflow::cpu {

// attention(q, k, v) -> out, lse over the ring of attrs.mesh_axis.
void ring_attention(const KernelCall& c);
// attention_grad(dout, q, k, v, out, lse) -> dq, dk, dv over the same ring.
void ring_attention_grad(const KernelCall& c);

}  // namespace meshflow::cpu
