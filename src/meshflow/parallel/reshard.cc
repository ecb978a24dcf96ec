#include "meshflow/parallel/reshard.h"

#include <queue>
#include <tuple>
#include <unordered_map>

#include "meshflow/core/check.h"

namespace meshflow {

const char* reshard_kind_name(ReshardKind k) {
  switch (k) {
    case ReshardKind::kAllGather:
      return "all_gather";
    case ReshardKind::kReduceScatter:
      return "reduce_scatter";
    case ReshardKind::kAllReduce:
      return "all_reduce";
    case ReshardKind::kAllToAll:
      return "all_to_all";
    case ReshardKind::kLocalSlice:
      return "local_slice";
    case ReshardKind::kLocalPartial:
      return "local_partial";
  }
  return "?";
}

std::string ReshardStep::to_string(const Mesh& mesh) const {
  std::string s = std::string(reshard_kind_name(kind)) + "(" + mesh.axis_name(mesh_axis);
  if (kind == ReshardKind::kAllToAll) {
    s += ", dim " + std::to_string(src_dim) + "->" + std::to_string(dst_dim);
  } else if (src_dim >= 0 || dst_dim >= 0) {
    s += ", dim " + std::to_string(src_dim >= 0 ? src_dim : dst_dim);
  }
  s += ") " + before.to_string() + " -> " + after.to_string();
  if (is_collective()) s += "  " + std::to_string(bytes_per_rank) + " B/rank";
  return s;
}

int ReshardPlan::num_collectives() const {
  int n = 0;
  for (const ReshardStep& s : steps) n += s.is_collective();
  return n;
}

std::string ReshardPlan::to_string(const Mesh& mesh) const {
  std::string s;
  for (const ReshardStep& st : steps) s += st.to_string(mesh) + "\n";
  s += "total: " + std::to_string(steps.size()) + " steps, " + std::to_string(bytes_per_rank) +
       " B/rank, " + std::to_string(cost_s * 1e6) + " us";
  return s;
}

void price_step(const Shape& shape, const Mesh& mesh, const ReshardCostModel& model,
                ReshardStep* step) {
  const int n = mesh.size(step->mesh_axis);
  auto local_bytes = [&](const Layout& l) {
    return value_or_throw(local_shape(shape, mesh, l)).numel() * model.bytes_per_element;
  };
  // The larger side per rank is the collective's full buffer (collective_cost.h).
  Collective c = Collective::kAllReduce;
  int64_t big = 0;
  switch (step->kind) {
    case ReshardKind::kAllGather:
      c = Collective::kAllGather, big = local_bytes(step->after);
      break;
    case ReshardKind::kReduceScatter:
      c = Collective::kReduceScatter, big = local_bytes(step->before);
      break;
    case ReshardKind::kAllReduce:
      c = Collective::kAllReduce, big = local_bytes(step->before);
      break;
    case ReshardKind::kAllToAll:
      c = Collective::kAllToAll, big = local_bytes(step->before);
      break;
    case ReshardKind::kLocalSlice:
    case ReshardKind::kLocalPartial:
      step->bytes_per_rank = 0;
      step->cost_s = 0;
      return;
  }
  step->bytes_per_rank = static_cast<int64_t>(collective_bytes_per_rank(c, n, double(big)) + 0.5);
  step->cost_s = collective_time_s(c, n, double(big), model.link(step->mesh_axis, c));
}

namespace {

// The one-axis moves out of `l` (before pricing and validity checks).
std::vector<ReshardStep> moves(const Layout& l, int tensor_rank) {
  std::vector<ReshardStep> out;
  auto add = [&](ReshardKind k, int axis, int src_dim, int dst_dim, Placement p) {
    out.push_back({k, axis, src_dim, dst_dim, l, l.with(axis, p)});
  };
  for (int a = 0; a < l.num_axes(); ++a) {
    const Placement& p = l.at(a);
    if (p.is_shard()) {
      // Only the minor-most shard axis of a dim holds contiguous neighbours.
      if (l.shard_axes(p.dim()).back() != a) continue;
      add(ReshardKind::kAllGather, a, p.dim(), -1, Placement::Replicate());
      for (int j = 0; j < tensor_rank; ++j) {
        if (j != p.dim()) add(ReshardKind::kAllToAll, a, p.dim(), j, Placement::Shard(j));
      }
    } else if (p.is_partial()) {
      add(ReshardKind::kAllReduce, a, -1, -1, Placement::Replicate());
      for (int j = 0; j < tensor_rank; ++j) {
        add(ReshardKind::kReduceScatter, a, -1, j, Placement::Shard(j));
      }
    } else {
      add(ReshardKind::kLocalPartial, a, -1, -1, Placement::Partial());
      for (int j = 0; j < tensor_rank; ++j) {
        add(ReshardKind::kLocalSlice, a, -1, j, Placement::Shard(j));
      }
    }
  }
  return out;
}

}  // namespace

std::vector<ReshardStep> ReshardSearch::steps_to(const Layout& l) const {
  std::vector<ReshardStep> steps;
  for (Layout at = l;;) {
    auto it = reached.find(at);
    MF_CHECK(it != reached.end()) << at.to_string() << " was not reached";
    if (!it->second.has_prev) break;
    steps.insert(steps.begin(), it->second.step);
    at = it->second.prev;
  }
  return steps;
}

ReshardSearch search_reshards(const Shape& shape, const Mesh& mesh,
                              const std::vector<ReshardStart>& starts,
                              const ReshardCostModel& model, const Layout* stop_at) {
  using Key = std::tuple<double, int, size_t>;  // cost, steps, id
  ReshardSearch out;
  std::vector<Layout> ids;
  std::unordered_map<Layout, char> done;
  std::priority_queue<Key, std::vector<Key>, std::greater<Key>> queue;
  for (size_t i = 0; i < starts.size(); ++i) {
    const ReshardStart& s = starts[i];
    auto it = out.reached.find(s.layout);
    if (it != out.reached.end() &&
        std::tie(it->second.cost_s, it->second.steps) <= std::tie(s.cost_s, s.steps))
      continue;
    ReshardSearch::Reached r;
    r.cost_s = s.cost_s, r.steps = s.steps, r.start = static_cast<int>(i);
    out.reached[s.layout] = r;
    ids.push_back(s.layout);
    queue.push({s.cost_s, s.steps, ids.size() - 1});
  }
  while (!queue.empty()) {
    auto [cost, steps, id] = queue.top();
    queue.pop();
    const Layout cur = ids[id];
    if (done[cur]) continue;
    const ReshardSearch::Reached here = out.reached.at(cur);
    // A stale queue entry (the layout was reached cheaper since) is skipped.
    if (std::tie(here.cost_s, here.steps) != std::tie(cost, steps)) continue;
    done[cur] = 1;
    if (stop_at != nullptr && cur == *stop_at) break;
    for (ReshardStep& st : moves(cur, shape.rank())) {
      // A size-1 axis moves no data: where it holds nothing now and in the
      // target (canonical layouts, core/layout.h), it is not a detour.
      const int a = st.mesh_axis;
      if (mesh.size(a) == 1 && cur.at(a).is_replicate() &&
          (stop_at == nullptr || stop_at->at(a).is_replicate()))
        continue;
      if (!divides_evenly(st.after, mesh, shape)) continue;
      price_step(shape, mesh, model, &st);
      double c = cost + st.cost_s;
      int n = steps + 1;
      auto it = out.reached.find(st.after);
      if (it != out.reached.end() &&
          (done[st.after] || std::tie(it->second.cost_s, it->second.steps) <= std::tie(c, n))) {
        continue;
      }
      ReshardSearch::Reached r;
      r.cost_s = c, r.steps = n, r.start = here.start, r.has_prev = true, r.prev = cur, r.step = st;
      out.reached[st.after] = r;
      ids.push_back(st.after);
      queue.push({c, n, ids.size() - 1});
    }
  }
  return out;
}

std::optional<ReshardPlan> ReshardPlanCache::find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = plans_.find(key);
  if (it == plans_.end()) return std::nullopt;
  return it->second;
}

void ReshardPlanCache::put(const std::string& key, const ReshardPlan& plan) {
  std::lock_guard<std::mutex> lock(mu_);
  plans_.emplace(key, plan);
}

Result<ReshardPlan> plan_reshard(const Shape& shape, const Mesh& mesh, const Layout& src,
                                 const Layout& dst, const ReshardCostModel& model) {
  MF_RETURN_IF_ERROR(validate(src, mesh, shape).with_context("reshard source"));
  MF_RETURN_IF_ERROR(validate(dst, mesh, shape).with_context("reshard target"));
  const ReshardSearch search = search_reshards(shape, mesh, {{src, 0, 0}}, model, &dst);
  if (!search.reached.count(dst)) {
    return Status::invalid("reshard " + src.to_string() + " -> " + dst.to_string() + " of " +
                           shape.to_string() + " on mesh " + mesh.to_string() +
                           ": no sequence of steps reaches the target with every intermediate "
                           "layout dividing the shape evenly");
  }
  ReshardPlan plan{src, dst, search.steps_to(dst), 0, 0};
  for (const ReshardStep& st : plan.steps) {
    plan.cost_s += st.cost_s;
    plan.bytes_per_rank += st.bytes_per_rank;
  }
  return plan;
}

}  // namespace meshflow
