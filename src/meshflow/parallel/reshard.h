// Reshard planner: the cheapest sequence of collectives and local steps that
// moves a tensor from one Layout to another on a Mesh.
//
// It is a search, not a rule list: Dijkstra over layouts, where each edge
// changes the placement on ONE mesh axis:
//   all_gather      S(d) -> R      (axis must be d's minor-most shard axis)
//   all_to_all      S(i) -> S(j)   (axis minor-most on i; becomes minor-most on j)
//   reduce_scatter  P    -> S(d)   (axis becomes minor-most on d)
//   all_reduce      P    -> R
//   local_slice     R    -> S(d)   (free: keep this rank's block)
//   local_partial   R    -> P      (free: rank 0 of the axis keeps, others zero)
// Every intermediate layout must divide the shape evenly. Cost is
// collective_time_s (parallel/collective_cost.h: ring alpha-beta on the mesh
// axis's link) of the larger side per rank; ties go to fewer steps.
//
//   Mesh m = value_or_throw(Mesh::parse("dp=2,tp=4"));
//   auto plan = plan_reshard(shape, m, *Layout::parse("[P, S(1)]"), *Layout::parse("[R, S(1)]"));
//   plan->to_string() == "all_reduce(dp) [P, S(1)] -> [R, S(1)]  ..."
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "meshflow/core/layout.h"
#include "meshflow/core/mesh.h"
#include "meshflow/core/shape.h"
#include "meshflow/core/status.h"
#include "meshflow/parallel/collective_cost.h"

namespace meshflow {

// The links the planner prices each mesh axis's collectives on: `axes[a]`
// for mesh axis a, `default_link` beyond the vector. Each step costs
// collective_time_s (parallel/collective_cost.h), the one collective cost the
// planner uses too; plan::reshard_costs (plan/cluster.h) fills the links from a
// cluster file, so the cheapest redistribution is chosen on the real links.
//
// `ring_axes[a]` (when filled) is the link mesh axis a's ring collectives run
// at (is_ring_collective: striped over a node's ports across nodes); the
// point-to-point ones (all_to_all) run at `axes[a]`.
class ReshardPlanCache;

struct ReshardCostModel {
  std::vector<Link> axes;
  std::vector<Link> ring_axes;
  Link default_link;
  int64_t bytes_per_element = 4;
  // Optional: plans kept across the lowerings of programs on this mesh and
  // these links (the planner's rank programs; see ReshardPlanCache).
  std::shared_ptr<ReshardPlanCache> plans;
  const Link& link(int axis) const {
    return axis < static_cast<int>(axes.size()) ? axes[axis] : default_link;
  }
  const Link& link(int axis, Collective c) const {
    return is_ring_collective(c) && axis < static_cast<int>(ring_axes.size()) ? ring_axes[axis]
                                                                              : link(axis);
  }
};

enum class ReshardKind {
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kAllToAll,
  kLocalSlice,
  kLocalPartial
};
const char* reshard_kind_name(ReshardKind k);  // "all_gather", ...

struct ReshardStep {
  ReshardKind kind = ReshardKind::kLocalSlice;
  int mesh_axis = 0;
  int src_dim = -1;  // the sharded dim before (all_gather, all_to_all)
  int dst_dim = -1;  // the sharded dim after (reduce_scatter, all_to_all, local_slice)
  Layout before;
  Layout after;
  int64_t bytes_per_rank = 0;  // bytes each rank sends (ring factor applied)
  double cost_s = 0;
  bool is_collective() const {
    return kind != ReshardKind::kLocalSlice && kind != ReshardKind::kLocalPartial;
  }
  std::string to_string(const Mesh& mesh) const;  // "all_gather(tp, dim 1) [S(1)] -> [R]"
};

struct ReshardPlan {
  Layout src;
  Layout dst;
  std::vector<ReshardStep> steps;
  double cost_s = 0;
  int64_t bytes_per_rank = 0;
  int num_collectives() const;
  std::string to_string(const Mesh& mesh) const;  // one step per line, then the total
};

// Reshard plans shared by the lowerings of many programs on one mesh and its
// links: the planner lowers thousands of rank programs on a few meshes, and a
// program's weights, gradients and (at one micro-batch) activations move
// between the same layouts in each. Keyed by the lowering's (shape, from,
// to) text. Safe to share between threads.
class ReshardPlanCache {
 public:
  std::optional<ReshardPlan> find(const std::string& key) const;
  void put(const std::string& key, const ReshardPlan& plan);

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, ReshardPlan> plans_;
};

// The minimum-cost plan from `src` to `dst` for a tensor of global `shape`.
// Errors (bad layouts, non-divisible shapes, unreachable target) name the
// layouts, dims and sizes.
Result<ReshardPlan> plan_reshard(const Shape& shape, const Mesh& mesh, const Layout& src,
                                 const Layout& dst, const ReshardCostModel& model = {});

// The search plan_reshard runs, kept whole: from one or more start layouts
// (each with the cost and step count it starts at), the cheapest way to every
// layout reached. plan_reshape (parallel/reshape_layout.h) joins two searches
// at a reshape: the input's from the source, the output's seeded with where
// each reached input layout lands when reshaped locally.
struct ReshardStart {
  Layout layout;
  double cost_s = 0;
  int steps = 0;
};
struct ReshardSearch {
  struct Reached {
    double cost_s = 0;
    int steps = 0;
    int start = -1;  // index into the starts
    bool has_prev = false;
    Layout prev;
    ReshardStep step;  // prev -> this layout (has_prev)
  };
  std::unordered_map<Layout, Reached> reached;
  // The steps from its start to `l`, in order. REQUIRES: reached.count(l).
  std::vector<ReshardStep> steps_to(const Layout& l) const;
};
// Dijkstra from `starts` over the one-axis moves above (every intermediate
// layout dividing `shape`). With `stop_at`, it stops once that layout is
// settled (and moves nothing onto a size-1 mesh axis that layout leaves
// whole); without, it settles every reachable layout. REQUIRES: the starts
// are valid for shape and mesh.
ReshardSearch search_reshards(const Shape& shape, const Mesh& mesh,
                              const std::vector<ReshardStart>& starts,
                              const ReshardCostModel& model, const Layout* stop_at = nullptr);

// The cost of one step from `before` on `axis` (fills bytes_per_rank and cost_s).
// REQUIRES: before and after are valid for shape and mesh.
void price_step(const Shape& shape, const Mesh& mesh, const ReshardCostModel& model,
                ReshardStep* step);

}  // namespace meshflow
