#include "meshflow/runtime/memory_plan.h"

#include <algorithm>
#include <map>

namespace meshflow {

namespace {
constexpr int64_t kAlign = 64;
int64_t aligned(int64_t b) {
  return (b + kAlign - 1) / kAlign * kAlign;
}

// Disjoint byte ranges [begin, end), touching ones merged: the bytes some set
// of placed values occupies.
class ByteRanges {
 public:
  void add(int64_t begin, int64_t end) {
    auto it = ranges_.upper_bound(begin);
    if (it != ranges_.begin()) {
      auto prev = std::prev(it);
      if (prev->second >= begin) {
        begin = prev->first;
        end = std::max(end, prev->second);
        it = ranges_.erase(prev);
      }
    }
    while (it != ranges_.end() && it->first <= end) {
      end = std::max(end, it->second);
      it = ranges_.erase(it);
    }
    ranges_.emplace_hint(it, begin, end);
  }
  // The end of an occupied range that [offset, offset + bytes) overlaps; -1 if none.
  int64_t conflict_end(int64_t offset, int64_t bytes) const {
    auto it = ranges_.upper_bound(offset);
    if (it != ranges_.begin() && std::prev(it)->second > offset) return std::prev(it)->second;
    if (it != ranges_.end() && it->first < offset + bytes) return it->second;
    return -1;
  }

 private:
  std::map<int64_t, int64_t> ranges_;  // begin -> end
};

// Placed values as rectangles (steps [first, last] x bytes [offset, offset +
// bytes)), indexed so that "the lowest offset free during steps [first,
// last]" costs O(log^2 n) per range it steps over, not a scan of every placed
// value: a segment tree over steps where node N keeps `cover` (values whose
// steps cover N's, stored at N) and `below` (the bytes of values stored at N
// or under it). The values overlapping a query are those in `below` of the
// nodes the query covers and in `cover` of the nodes it partly covers.
class PlacedIndex {
 public:
  explicit PlacedIndex(int steps) : steps_(std::max(1, steps)) {
    int size = 1;
    while (size < steps_) size *= 2;
    cover_.resize(2 * size);
    below_.resize(2 * size);
  }

  void add(int first, int last, int64_t offset, int64_t bytes) {
    add(1, 0, steps_ - 1, first, last, offset, offset + bytes);
  }

  // The lowest offset where `bytes` are free in every step of [first, last].
  int64_t lowest_fit(int first, int last, int64_t bytes) const {
    if (bytes <= 0) return 0;
    std::vector<const ByteRanges*> sets;
    collect(1, 0, steps_ - 1, first, last, &sets);
    int64_t offset = 0;
    for (bool moved = true; moved;) {
      moved = false;
      for (const ByteRanges* s : sets)
        for (int64_t end; (end = s->conflict_end(offset, bytes)) >= 0;) {
          offset = end;
          moved = true;
        }
    }
    return offset;
  }

 private:
  void add(int node, int lo, int hi, int first, int last, int64_t begin, int64_t end) {
    if (last < lo || hi < first) return;
    below_[node].add(begin, end);
    if (first <= lo && hi <= last) {
      cover_[node].add(begin, end);
      return;
    }
    const int mid = lo + (hi - lo) / 2;
    add(2 * node, lo, mid, first, last, begin, end);
    add(2 * node + 1, mid + 1, hi, first, last, begin, end);
  }

  void collect(int node, int lo, int hi, int first, int last,
               std::vector<const ByteRanges*>* sets) const {
    if (last < lo || hi < first) return;
    if (first <= lo && hi <= last) {
      sets->push_back(&below_[node]);
      return;
    }
    sets->push_back(&cover_[node]);
    const int mid = lo + (hi - lo) / 2;
    collect(2 * node, lo, mid, first, last, sets);
    collect(2 * node + 1, mid + 1, hi, first, last, sets);
  }

  int steps_;
  std::vector<ByteRanges> cover_, below_;
};

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
  // Each value goes to the lowest offset free for its whole lifetime.
  PlacedIndex placed(end + 1);  // steps 0..end (end: kept alive past the last node)
  for (const Item& it : items) {
    const int first = plan.first_use[it.v], last = plan.last_use[it.v];
    const int64_t offset = placed.lowest_fit(first, last, it.bytes);
    plan.offset[it.v] = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + it.bytes);
    if (it.bytes > 0) placed.add(first, last, offset, it.bytes);
  }
  return plan;
}

}  // namespace meshflow
