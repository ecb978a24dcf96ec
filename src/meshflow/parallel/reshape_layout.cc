#include "meshflow/parallel/reshape_layout.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <vector>

#include "meshflow/core/check.h"
#include "meshflow/ops/op_def.h"

namespace meshflow {

namespace {

using Group = ReshapeGroup;

// One digit of a group read major to minor: a mesh axis's split, or a run of
// local extent (axis -1).
struct Digit {
  int axis;
  int64_t size;
};

// The dims of `s` in [b, e) as "heads=3 x head_dim=4".
std::string dims_text(const Shape& s, int b, int e) {
  std::string t;
  for (int d = b; d < e; ++d)
    t += (t.empty() ? "" : " x ") + s.name(d) + "=" + std::to_string(s.size(d));
  return t;
}

ReshardPlan make_plan(const Layout& src, const Layout& dst, std::vector<ReshardStep> steps) {
  ReshardPlan p{src, dst, std::move(steps), 0, 0};
  for (const ReshardStep& st : p.steps) {
    p.cost_s += st.cost_s;
    p.bytes_per_rank += st.bytes_per_rank;
  }
  return p;
}

ReshapePlan make_reshape_plan(ReshardPlan before, Layout local_in, Layout local_out,
                              ReshardPlan after) {
  ReshapePlan p{std::move(before), std::move(local_in), std::move(local_out), std::move(after)};
  p.cost_s = p.before.cost_s + p.after.cost_s;
  p.bytes_per_rank = p.before.bytes_per_rank + p.after.bytes_per_rank;
  return p;
}

}  // namespace

std::optional<Layout> reshape_block_layout(const Shape& in, const Shape& out, const Mesh& mesh,
                                           const Layout& l) {
  const Layout c = canonical(l, mesh);
  std::vector<Placement> p(mesh.num_axes(), Placement::Replicate());
  for (int a = 0; a < mesh.num_axes(); ++a)
    if (c.at(a).is_partial()) p[a] = Placement::Partial();
  for (const Group& gr : reshape_groups(in, out)) {
    std::vector<Digit> digits;
    for (int d = gr.i0; d < gr.i1; ++d) {
      for (int a : c.shard_axes(d)) digits.push_back({a, mesh.size(a)});
      const int64_t local = in.size(d) / c.shard_count(d, mesh);
      if (local == 1) continue;
      if (!digits.empty() && digits.back().axis < 0)
        digits.back().size *= local;  // adjacent local runs are one run
      else
        digits.push_back({-1, local});
    }
    // Cut the output dims from the digits: each takes its shard axes first,
    // then local extent (a run may be shared by neighbouring dims).
    size_t at = 0;
    for (int d = gr.o0; d < gr.o1; ++d) {
      int64_t need = out.size(d);
      bool took_local = false;
      int order = 0;
      while (need > 1) {
        MF_CHECK(at < digits.size());
        Digit& dg = digits[at];
        if (dg.axis >= 0) {
          if (took_local || need % dg.size != 0) return std::nullopt;
          need /= dg.size;
          p[dg.axis] = Placement::Shard(d, order++);
          ++at;
          continue;
        }
        took_local = true;
        if (dg.size >= need) {
          if (dg.size % need != 0) return std::nullopt;
          dg.size /= need;
          need = 1;
          if (dg.size == 1) ++at;
        } else {
          if (need % dg.size != 0) return std::nullopt;
          need /= dg.size;
          ++at;
        }
      }
    }
    if (at != digits.size()) return std::nullopt;
  }
  return value_or_throw(Layout::make(std::move(p)));
}

std::string ReshapePlan::to_string(const Mesh& mesh) const {
  std::string s;
  for (const ReshardStep& st : before.steps) s += st.to_string(mesh) + "\n";
  s += "reshape " + local_in.to_string() + " -> " + local_out.to_string() + "\n";
  for (const ReshardStep& st : after.steps) s += st.to_string(mesh) + "\n";
  s += "total: " + std::to_string(before.steps.size() + after.steps.size()) + " steps, " +
       std::to_string(bytes_per_rank) + " B/rank, " + std::to_string(cost_s * 1e6) + " us";
  return s;
}

ReshapeRoutes::ReshapeRoutes(const Shape& in, const Shape& out, const Mesh& mesh, const Layout& src,
                             const ReshardCostModel& model)
    : in_(in), out_(out), mesh_(mesh), src_(src) {
  x_ = search_reshards(in, mesh, {{src, 0, 0}}, model);
  // Every layout of x that reshapes locally starts the search over y at its
  // cost. Sorted, so equal costs resolve alike on every rank.
  using Start = std::tuple<double, int, std::string, Layout, Layout>;
  std::vector<Start> found;
  for (const auto& [l, r] : x_.reached)
    if (auto y = reshape_block_layout(in, out, mesh, l))
      found.emplace_back(r.cost_s, r.steps, l.to_string(), l, *y);
  std::sort(found.begin(), found.end(), [](const Start& a, const Start& b) {
    return std::tie(std::get<0>(a), std::get<1>(a), std::get<2>(a)) <
           std::tie(std::get<0>(b), std::get<1>(b), std::get<2>(b));
  });
  std::vector<ReshardStart> starts;
  for (const auto& [cost, steps, text, x, y] : found) {
    starts.push_back({y, cost, steps});
    local_in_.push_back(x);
  }
  y_ = search_reshards(out, mesh, starts, model);
}

double ReshapeRoutes::cost_s(const Layout& dst) const {
  auto it = y_.reached.find(dst);
  return it == y_.reached.end() ? std::numeric_limits<double>::infinity() : it->second.cost_s;
}

Result<ReshapePlan> ReshapeRoutes::plan(const Layout& dst) const {
  MF_RETURN_IF_ERROR(validate(dst, mesh_, out_).with_context("reshape target"));
  auto it = y_.reached.find(dst);
  if (it == y_.reached.end())
    return Status::invalid("reshape " + in_.to_string() + " " + src_.to_string() + " -> " +
                           out_.to_string() + " " + dst.to_string() + " on mesh " +
                           mesh_.to_string() + ": no route reaches the target layout");
  std::vector<ReshardStep> after = y_.steps_to(dst);
  const Layout& local_in = local_in_[it->second.start];
  const Layout local_out = after.empty() ? dst : after.front().before;
  return make_reshape_plan(make_plan(src_, local_in, x_.steps_to(local_in)), local_in, local_out,
                           make_plan(local_out, dst, std::move(after)));
}

Result<ReshapePlan> plan_reshape(const Shape& in, const Shape& out, const Mesh& mesh,
                                 const Layout& src, const Layout& dst,
                                 const ReshardCostModel& model) {
  MF_RETURN_IF_ERROR(validate(src, mesh, in).with_context("reshape source"));
  MF_RETURN_IF_ERROR(validate(dst, mesh, out).with_context("reshape target"));
  // The common case, a reshape each rank runs on its own block: no search.
  if (auto local = reshape_block_layout(in, out, mesh, src); local && *local == dst)
    return make_reshape_plan(make_plan(src, src, {}), src, dst, make_plan(dst, dst, {}));
  return ReshapeRoutes(in, out, mesh, src, model).plan(dst);
}

Status validate_reshape_strategy(const Graph& g, const Node& n, const Mesh& mesh,
                                 const ShardingStrategy& st) {
  const std::string label = node_label(n);
  if (st.inputs.size() != 1 || st.outputs.size() != 1)
    return Status::invalid(label + ": a reshape strategy has 1 input and 1 output layout, got " +
                           std::to_string(st.inputs.size()) + " and " +
                           std::to_string(st.outputs.size()));
  const Shape& in = g.shape(n.inputs[0]);
  const Shape& out = g.shape(n.outputs[0]);
  const std::vector<Group> gs = reshape_groups(in, out);
  // What the reshape does to dim d of the input (side 0) or output (side 1).
  auto role = [&](int side, int d) -> std::string {
    for (const Group& gr : gs) {
      const bool here = side == 0 ? d >= gr.i0 && d < gr.i1 : d >= gr.o0 && d < gr.o1;
      if (!here || (gr.i1 - gr.i0 == 1 && gr.o1 - gr.o0 == 1)) continue;
      const std::string other =
          side == 0 ? dims_text(out, gr.o0, gr.o1) : dims_text(in, gr.i0, gr.i1);
      const bool merged = side == 0 ? gr.i1 - gr.i0 > 1 : gr.o1 - gr.o0 > 1;
      return std::string(merged ? ", a part of " : ", made of ") + other;
    }
    return "";
  };
  for (int side = 0; side < 2; ++side) {
    const Shape& s = side == 0 ? in : out;
    const Layout& l = side == 0 ? st.inputs[0] : st.outputs[0];
    const std::string what = side == 0 ? "input " : "output ";
    if (l.num_axes() != mesh.num_axes())
      return Status::invalid(label + ": " + what + "layout " + l.to_string() + " has " +
                             std::to_string(l.num_axes()) + " placements, the mesh " +
                             mesh.to_string() + " has " + std::to_string(mesh.num_axes()) +
                             " axes");
    for (int a = 0; a < l.num_axes(); ++a)
      if (l.at(a).is_shard() && l.at(a).dim() >= s.rank())
        return Status::invalid(label + ": " + what + "layout " + l.to_string() + ": mesh axis " +
                               mesh.axis_name(a) + " splits dim " + std::to_string(l.at(a).dim()) +
                               " but " + what + s.to_string() + " has " + std::to_string(s.rank()) +
                               " dims");
    for (int d = 0; d < s.rank(); ++d) {
      const int64_t count = l.shard_count(d, mesh);
      if (s.size(d) % count == 0) continue;
      std::string axes;
      for (int a : l.shard_axes(d))
        axes +=
            (axes.empty() ? "" : " x ") + mesh.axis_name(a) + "=" + std::to_string(mesh.size(a));
      return Status::invalid(
          label + ": " + what + "dim " + std::to_string(d) + " (" + s.name(d) + "=" +
          std::to_string(s.size(d)) + role(side, d) + ") cannot be split " + std::to_string(count) +
          " ways (" + axes +
          "): no route reaches a split that does not divide it; valid splits of " + s.name(d) +
          " on mesh " + mesh.to_string() + ": " + mesh_splits(s.size(d), mesh));
    }
  }
  return Status::ok();
}

}  // namespace meshflow
