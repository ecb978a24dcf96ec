#include "meshflow/runtime/memory_plan.h"

#include <algorithm>

namespace meshflow {

namespace {
constexpr int64_t kAlign = 64;
int64_t aligned(int64_t b) {
  return (b + kAlign - 1) / kAlign * kAlign;
}
}  // namespace

MemoryPlan plan_memory(const Graph& g, const std::vector<NodeId>& order,
                       const std::vector<char>& persistent, const std::vector<char>& keep_alive) {
  const int nv = g.num_values();
  MemoryPlan plan;
  plan.offset.assign(nv, -1);
  plan.first_use.assign(nv, -1);
  plan.last_use.assign(nv, -1);
  const int end = static_cast<int>(order.size());
  for (int step = 0; step < end; ++step) {
    const Node& n = g.node(order[step]);
    for (ValueId v : n.outputs) {
      plan.first_use[v] = step;
      plan.last_use[v] = std::max(plan.last_use[v], step);
    }
    for (ValueId v : n.inputs) plan.last_use[v] = step;
  }
  struct Item {
    ValueId v;
    int64_t bytes;
  };
  std::vector<Item> items;
  for (ValueId v = 0; v < nv; ++v) {
    if (persistent[v] || plan.first_use[v] < 0) continue;
    if (keep_alive[v]) plan.last_use[v] = end;
    int64_t bytes =
        aligned(g.shape(v).numel() * static_cast<int64_t>(dtype_size(g.value(v).dtype)));
    items.push_back({v, bytes});
    plan.sum_transient_bytes += bytes;
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.bytes > b.bytes; });
  struct Placed {
    int64_t offset, bytes;
    int first, last;
  };
  std::vector<Placed> placed;
  placed.reserve(items.size());
  std::vector<const Placed*> overlapping;
  for (const Item& it : items) {
    int first = plan.first_use[it.v], last = plan.last_use[it.v];
    overlapping.clear();
    for (const Placed& p : placed)
      if (p.first <= last && first <= p.last) overlapping.push_back(&p);
    std::sort(overlapping.begin(), overlapping.end(),
              [](const Placed* a, const Placed* b) { return a->offset < b->offset; });
    int64_t best = 0;
    for (const Placed* p : overlapping) {
      if (best + it.bytes <= p->offset) break;
      best = std::max(best, p->offset + p->bytes);
    }
    plan.offset[it.v] = best;
    plan.arena_bytes = std::max(plan.arena_bytes, best + it.bytes);
    placed.push_back({best, it.bytes, first, last});
  }
  return plan;
}

}  // namespace meshflow
