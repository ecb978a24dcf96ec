#include "meshflow/parallel/configured.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <vector>

namespace meshflow {

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// Up to three candidates closest to `key`, quoted: "'a', 'b' or 'c'".
std::string closest(const std::string& key, const std::set<std::string>& candidates) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const std::string& c : candidates) scored.emplace_back(edit_distance(key, c), c);
  std::sort(scored.begin(), scored.end());
  std::string s;
  const size_t n = std::min<size_t>(3, scored.size());
  for (size_t i = 0; i < n; ++i)
    s += (i == 0 ? "" : i + 1 == n ? " or " : ", ") + ("'" + scored[i].second + "'");
  return s;
}

bool from_preset(const StrategyConfig& pc, const std::string& key) {
  if (pc.preset.empty()) return false;
  for (const auto& [k, text] : preset_strategies(pc.preset, pc.mesh))
    if (k == key) return true;
  return false;
}

}  // namespace

std::string layer_glob(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size();) {
    if (std::isdigit(static_cast<unsigned char>(name[i]))) {
      while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
      out += '*';
    } else {
      out += name[i++];
    }
  }
  return out;
}

PartitionOptions partition_options(const StrategyConfig& pc, const Mesh& mesh) {
  PartitionOptions o;
  o.rules = pc.rules;
  o.strategies = pc.strategies;
  o.zero_stage = pc.zero;
  o.zero_axis = mesh.axis_index("dp");
  if (const int cp = mesh.axis_index("cp"); cp >= 0 && mesh.size(cp) > 1) o.zero_also_axes = {cp};
  o.weight_groups = pc.zero_style == "group";
  return o;
}

Status check_config_names(const Graph& g, const StrategyConfig& pc) {
  for (const auto& [key, text] : pc.strategies) {
    if (from_preset(pc, key)) continue;
    bool found = false;
    for (const Node& n : g.nodes())
      if (n.name == key || glob_match(key, n.name)) {
        found = true;
        break;
      }
    if (found) continue;
    std::set<std::string> names;
    for (const Node& n : g.nodes())
      if (!n.inputs.empty() && n.phase == Phase::kForward) names.insert(layer_glob(n.name));
    return Status::invalid("parallel.strategies.\"" + key + "\" matches no node of the graph" +
                           (names.empty() ? "" : "; did you mean " + closest(key, names)) +
                           "? (`meshflow graph CONFIG --phase forward` lists the node names)");
  }
  if (pc.preset.empty()) {
    std::set<std::string> dims;
    for (ValueId v = 0; v < g.num_values(); ++v) {
      const Shape& s = g.shape(v);
      for (int d = 0; d < s.rank(); ++d) dims.insert(s.name(d));
    }
    for (const auto& [dim, axis] : pc.rules.rules)
      if (!dims.count(dim))
        return Status::invalid("parallel.rules." + dim +
                               ": no value of the graph has a dim named '" + dim +
                               "'; did you mean " + closest(dim, dims) + "?");
  }
  return Status::ok();
}

Status check_axes_used(const Graph& g, const Annotation& a, const StrategyConfig& pc,
                       const std::string& model) {
  const Mesh& mesh = a.mesh;
  for (int axis = 0; axis < mesh.num_axes(); ++axis) {
    if (mesh.size(axis) == 1) continue;
    bool used = false;
    for (NodeId id = 0; id < g.num_nodes() && !used; ++id) {
      const Node& n = g.node(id);
      if (n.phase != Phase::kForward || n.inputs.empty()) continue;
      const ShardingStrategy& st = a.node[id];
      for (const std::vector<Layout>* ls : {&st.inputs, &st.outputs})
        for (const Layout& l : *ls)
          if (l.num_axes() > axis && l.at(axis).is_shard()) used = true;
    }
    if (used) continue;
    const std::string ax = mesh.axis_name(axis) + "=" + std::to_string(mesh.size(axis));
    std::string why;
    if (!pc.preset.empty()) {
      std::string dims;
      for (const auto& [dim, rule_axis] : pc.rules.rules)
        if (rule_axis == mesh.axis_name(axis)) dims += (dims.empty() ? "" : ", ") + dim;
      why = "preset \"" + pc.preset + "\" splits " + (dims.empty() ? "nothing" : dims) +
            " over it, and " + model + " has no such dim that the axis divides; ";
    }
    return Status::invalid(
        "parallel.mesh axis " + ax + " splits no computation: every rank along it would compute " +
        "the same values (replicated); " + why + "split a dim over it (\"rules\": {\"batch\": \"" +
        mesh.axis_name(axis) + "\"}, a preset, or split tuples naming " + mesh.axis_name(axis) +
        ") or leave the axis out of parallel.mesh");
  }
  return Status::ok();
}

Result<Annotation> annotate_config(const Graph& g, const Mesh& mesh, const StrategyConfig& pc,
                                   const std::string& model, const ReshardCostModel* cost) {
  MF_RETURN_IF_ERROR(check_config_names(g, pc));
  PartitionOptions o = partition_options(pc, mesh);
  if (cost) o.cost = *cost;
  Result<Annotation> a = annotate(g, mesh, o);
  if (!a.is_ok()) return a.status().with_context("parallel");
  MF_RETURN_IF_ERROR(check_axes_used(g, *a, pc, model));
  return a;
}

}  // namespace meshflow
