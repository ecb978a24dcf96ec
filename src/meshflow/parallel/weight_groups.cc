#include "meshflow/parallel/weight_groups.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "meshflow/core/check.h"
#include "meshflow/ops/op_def.h"

namespace meshflow {

namespace {

// An optimizer update of a parameter (sgd_update, adamw_update): input 0 is
// the parameter, the other mutated inputs its state.
bool is_parameter_update(const Graph& g, const Node& n) {
  return n.phase == Phase::kOptimizer && op_def(n.kind).mutates != 0 && !n.inputs.empty() &&
         g.producer(n.inputs[0]).kind == OpKind::kParameter;
}

std::string kib(int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f KiB", static_cast<double>(bytes) / 1024);
  return b;
}

}  // namespace

std::vector<int> balance_groups(const std::vector<int64_t>& bytes, int groups) {
  MF_CHECK_GE(groups, 1);
  std::vector<size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
  std::vector<int64_t> load(static_cast<size_t>(groups), 0);
  std::vector<int> owner(bytes.size(), -1);
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());  // first of equals
    owner[i] = static_cast<int>(least - load.begin());
    *least += bytes[i];
  }
  return owner;
}

int WeightGroups::owner_of(ValueId v) const {
  auto it = owner_.find(v);
  return it == owner_.end() ? -1 : it->second;
}

double WeightGroups::imbalance() const {
  if (group_bytes.empty()) return 1;
  const int64_t total = std::accumulate(group_bytes.begin(), group_bytes.end(), int64_t{0});
  const int64_t largest = *std::max_element(group_bytes.begin(), group_bytes.end());
  return total == 0 ? 1 : static_cast<double>(largest) * groups / static_cast<double>(total);
}

std::string WeightGroups::summary(const Mesh& mesh) const {
  if (!on()) return "";
  std::string s = "weights groups over " + mesh.axis_name(axis) + " (" + std::to_string(groups) +
                  ", parameter bytes per rank):";
  for (int c = 0; c < groups; ++c)
    s += std::string(c ? " |" : "") + " " + std::to_string(c) + ": " +
         std::to_string(group_params[c]) + " parameters " + kib(group_bytes[c]);
  char b[64];
  std::snprintf(b, sizeof b, "; largest %.3f x an even split", imbalance());
  return s + b;
}

Result<WeightGroups> group_weights(const Graph& g, const Mesh& mesh, int axis,
                                   const std::function<int64_t(ValueId)>& local_bytes) {
  if (axis < 0 || axis >= mesh.num_axes())
    return Status::invalid(
        "weights grouping spreads whole parameters over the data-parallel axis "
        "dp, but the mesh " +
        mesh.to_string() + " has no axis named dp");
  const int n = mesh.size(axis);
  if (n < 2)
    return Status::invalid("weights grouping over " + mesh.axis_name(axis) +
                           "=1 makes one group: nothing is split; use a mesh with " +
                           mesh.axis_name(axis) + " >= 2, or leave out \"zero_style\": \"group\"");
  WeightGroups wg;
  wg.axis = axis;
  wg.groups = n;
  std::vector<int64_t> bytes;
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& u = g.node(id);
    if (!is_parameter_update(g, u)) continue;
    WeightGroups::Member m;
    m.param = u.inputs[0];
    m.update = id;
    m.bytes = local_bytes(m.param);
    for (size_t i = 1; i < u.inputs.size(); ++i)
      if ((op_def(u.kind).mutates >> i) & 1u) m.states.push_back(u.inputs[i]);
    bytes.push_back(m.bytes);
    wg.members.push_back(std::move(m));
  }
  if (static_cast<int>(wg.members.size()) < n)
    return Status::invalid(
        "weights grouping cannot balance " + std::to_string(wg.members.size()) +
        " parameters over " + mesh.axis_name(axis) + "=" + std::to_string(n) +
        ": every data-parallel rank must own at least one whole parameter; use " +
        mesh.axis_name(axis) + " <= " + std::to_string(wg.members.size()) +
        ", or \"zero_style\": \"shard\" (ZeRO-1 slices every parameter " + std::to_string(n) +
        " ways)");
  const std::vector<int> owner = balance_groups(bytes, n);
  wg.group_bytes.assign(n, 0);
  wg.group_params.assign(n, 0);
  for (size_t i = 0; i < wg.members.size(); ++i) {
    WeightGroups::Member& m = wg.members[i];
    m.owner = owner[i];
    wg.group_bytes[m.owner] += m.bytes;
    ++wg.group_params[m.owner];
    wg.owner_[m.param] = m.owner;
    for (ValueId s : m.states) wg.owner_[s] = m.owner;
  }
  return wg;
}

}  // namespace meshflow
