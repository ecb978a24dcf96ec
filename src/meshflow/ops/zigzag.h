// The zigzag order of a sequence: causal ring attention's load balance
// (parallel/seq_balance.h). A sequence of T positions split over n ranks is
// cut into 2n chunks of c = T / 2n; rank r holds chunks r and 2n-1-r, so every
// rank has as many early (cheap) as late (costly) causal query rows. Laid end
// to end, the ranks' blocks are the sequence in zigzag order; a contiguous
// split of that order gives each rank its two chunks. For n = 2, T = 8:
//
//   zigzag position  0 1 2 3 4 5 6 7
//   true position    0 1 6 7 2 3 4 5      (rank 0: chunks 0, 3; rank 1: chunks 1, 2)
//
// Ops whose result depends on a row's position (causal attention, rope,
// dropout's mask, a position table) read the true position through
// zigzag_position; the zigzag op reorders a tensor's dim either way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace meshflow {

// The true position of zigzag position p in a sequence of T over n ranks
// (T a multiple of 2n). n <= 1: the identity.
inline int64_t zigzag_position(int64_t p, int64_t T, int64_t n) {
  if (n <= 1) return p;
  const int64_t c = T / (2 * n), j = p / c;
  const int64_t chunk = j % 2 == 0 ? j / 2 : 2 * n - 1 - j / 2;
  return chunk * c + p % c;
}

// A run of a block's rows that hold consecutive true positions.
struct PositionRun {
  int64_t row0 = 0, rows = 0, pos0 = 0;
};

// The runs of the rows [offset, offset + rows) of a sequence of T in zigzag
// order over n ranks (one run when n <= 1: positions offset..).
inline std::vector<PositionRun> position_runs(int64_t offset, int64_t rows, int64_t T, int64_t n) {
  std::vector<PositionRun> runs;
  if (n <= 1) return {{0, rows, offset}};
  const int64_t c = T / (2 * n);
  for (int64_t r = 0; r < rows;) {
    const int64_t p = offset + r, len = std::min(rows - r, c - p % c);
    runs.push_back({r, len, zigzag_position(p, T, n)});
    r += len;
  }
  return runs;
}

// The GEMM blocks of one step of ring attention: the queries of block
// `q_block` against the keys of block `k_block` (blocks of T rows of a
// sequence of Tg in zigzag order over n ranks; n <= 1: contiguous). Under the
// causal mask, one block per run of the query block's true positions: the
// run's rows that see any key (row0, rows) against the keys its last row sees
// (the first `cols`: a rank's block holds increasing true positions, chunk r
// before chunk 2n-1-r, so the keys a row sees are a prefix). Runs that see
// nothing are left out. Without the mask: the whole block.
// tile_rows > 0: each block cut further into tiles of that many query rows,
// each against the keys its own last row sees, as the ring kernels compute
// them (kRingTileRows: the scores of a tile stay in cache, and the causal
// triangle inside a block is computed to a tile's edge, not the block's).
struct RingBlock {
  int64_t row0 = 0, rows = 0, cols = 0;
};
inline constexpr int64_t kRingTileRows = 64;
inline std::vector<RingBlock> ring_step_blocks(int64_t T, int64_t Tg, int64_t n, int64_t q_block,
                                               int64_t k_block, bool causal,
                                               int64_t tile_rows = 0) {
  const int64_t tile = tile_rows > 0 ? tile_rows : T;
  std::vector<RingBlock> out;
  if (!causal) {
    for (int64_t i = 0; i < T; i += tile) out.push_back({i, std::min(tile, T - i), T});
    return out;
  }
  const std::vector<PositionRun> k = position_runs(k_block * T, T, Tg, n);
  for (const PositionRun& qr : position_runs(q_block * T, T, Tg, n)) {
    const int64_t skip = std::max<int64_t>(0, k.front().pos0 - qr.pos0);
    if (skip >= qr.rows) continue;
    for (int64_t i = skip; i < qr.rows; i += tile) {
      const int64_t rows = std::min(tile, qr.rows - i), last = qr.pos0 + i + rows - 1;
      RingBlock b{qr.row0 + i, rows, 0};
      for (const PositionRun& kr : k) b.cols += std::clamp<int64_t>(last - kr.pos0 + 1, 0, kr.rows);
      out.push_back(b);
    }
  }
  return out;
}

// Reorders dim `axis` of a dense tensor viewed as (outer, size, inner) with
// elements of elem_bytes: to zigzag order (out[p] = in[true(p)]), or back
// (inverse: out[true(p)] = in[p]).
inline void zigzag_reorder(const void* in, void* out, int64_t outer, int64_t size, int64_t inner,
                           int64_t elem_bytes, int64_t n, bool inverse) {
  const int64_t row = inner * elem_bytes;
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t p = 0; p < size; ++p) {
      const int64_t t = zigzag_position(p, size, n);
      const int64_t from = inverse ? p : t, to = inverse ? t : p;
      std::memcpy(dst + (o * size + to) * row, src + (o * size + from) * row, row);
    }
}

}  // namespace meshflow
