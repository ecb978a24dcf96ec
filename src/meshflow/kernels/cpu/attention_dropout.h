// The dropout mask as a pure function, shared by the dropout / dropout_grad
// kernels and by anything that must reproduce the mask (tests, other backends).
// Element i of a dropout with attrs (p, seed), run at rng offset `offset`, is
// kept iff uniform01(dropout_stream(seed, offset), i) >= p.
//
//   const uint64_t s = dropout_stream(node.attrs.seed, rng_offset);
//   float y = dropout_keep(s, i, p) ? x[i] / (1 - p) : 0.f;
#pragma once

#include <cstdint>

#include "meshflow/core/random.h"

namespace meshflow {

// One stream per (seed, offset), mixed like stream_seed(): a fresh mask each
// step (the offset advances), the same mask when a step's forward is recomputed.
inline uint64_t dropout_stream(uint64_t seed, int32_t offset) {
  const uint64_t off = static_cast<uint64_t>(static_cast<uint32_t>(offset));
  return mix64(mix64(seed) ^ mix64(off ^ 0xd1b54a32d192ed03ULL));
}

inline bool dropout_keep(uint64_t stream, uint64_t i, float p) {
  return uniform01(stream, i) >= p;
}

}  // namespace meshflow
