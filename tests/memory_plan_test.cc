// The memory planner's indexed placement gives exactly the offsets of the
// plain greedy-by-size algorithm (each value at the lowest offset free among
// the placed values alive with it, found by scanning them all), on graphs
// with mixed sizes and nested lifetimes like a forward and backward pass.
#include "meshflow/runtime/memory_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "meshflow/core/random.h"
#include "meshflow/ops/builder.h"

namespace meshflow {
namespace {

// The quadratic reference: for every value, largest first, scan every placed
// value alive at the same time, sorted by offset, for the first gap.
std::vector<int64_t> reference_offsets(const Graph& g, const MemoryPlan& plan,
                                       const std::vector<char>& persistent) {
  struct Item {
    ValueId v;
    int64_t bytes;
  };
  std::vector<Item> items;
  for (ValueId v = 0; v < g.num_values(); ++v) {
    if (persistent[v] || plan.first_use[v] < 0) continue;
    const int64_t raw = g.shape(v).numel() * static_cast<int64_t>(dtype_size(g.value(v).dtype));
    items.push_back({v, (raw + 63) / 64 * 64});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.bytes > b.bytes; });
  struct Placed {
    int64_t offset, bytes;
    int first, last;
  };
  std::vector<Placed> placed;
  std::vector<int64_t> offset(g.num_values(), -1);
  for (const Item& it : items) {
    const int first = plan.first_use[it.v], last = plan.last_use[it.v];
    std::vector<Placed> overlapping;
    for (const Placed& p : placed)
      if (p.first <= last && first <= p.last) overlapping.push_back(p);
    std::sort(overlapping.begin(), overlapping.end(),
              [](const Placed& a, const Placed& b) { return a.offset < b.offset; });
    int64_t best = 0;
    for (const Placed& p : overlapping) {
      if (best + it.bytes <= p.offset) break;
      best = std::max(best, p.offset + p.bytes);
    }
    offset[it.v] = best;
    placed.push_back({best, it.bytes, first, last});
  }
  return offset;
}

// A forward pass of four interleaved chains of different widths, then a
// backward pass reading the forward values in reverse (nested lifetimes),
// with random extra reads.
TEST(MemoryPlanIndex, SameOffsetsAsTheGreedyScan) {
  for (uint64_t seed = 0; seed < 8; ++seed) {
    Graph g;
    Builder b(g);
    Rng rng(seed);
    const int64_t widths[] = {16, 1000, 64, 333};
    std::vector<std::vector<ValueId>> chain(4);
    for (int c = 0; c < 4; ++c)
      chain[c].push_back(b.input("x" + std::to_string(c), Shape{{"n", widths[c]}}));
    for (int i = 0; i < 300; ++i) {
      std::vector<ValueId>& ch = chain[rng.below(4)];
      const ValueId extra = ch[rng.below(ch.size())];
      ch.push_back(rng.below(2) ? b.add(ch.back(), extra) : b.mul(ch.back(), extra));
    }
    std::vector<ValueId> grads;
    for (int c = 0; c < 4; ++c) {
      ValueId grad = chain[c].back();
      for (size_t i = chain[c].size(); i-- > 1;) grad = b.mul(grad, chain[c][i - 1]);
      grads.push_back(grad);
    }
    std::vector<NodeId> order;
    for (NodeId i = 0; i < g.num_nodes(); ++i) order.push_back(i);
    std::vector<char> persistent(g.num_values(), 0), keep(g.num_values(), 0);
    for (int c = 0; c < 4; ++c) persistent[chain[c][0]] = 1;
    for (ValueId v : grads) keep[v] = 1;
    for (int i = 0; i < 10; ++i) keep[rng.below(g.num_values())] = 1;

    const MemoryPlan plan = plan_memory(g, order, persistent, keep);
    const std::vector<int64_t> want = reference_offsets(g, plan, persistent);
    int64_t arena = 0;
    for (ValueId v = 0; v < g.num_values(); ++v) {
      ASSERT_EQ(plan.offset[v], want[v]) << "value " << v << " seed " << seed;
      if (want[v] >= 0) arena = std::max(arena, want[v] + (g.shape(v).numel() * 4 + 63) / 64 * 64);
    }
    EXPECT_EQ(plan.arena_bytes, arena) << "seed " << seed;
  }
}

}  // namespace
}  // namespace meshflow
