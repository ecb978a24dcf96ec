#include "meshflow/autodiff/recompute.h"

#include <algorithm>
#include <map>
#include <set>

#include "meshflow/core/check.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/verify.h"

namespace meshflow {

namespace {

constexpr const char* kSuffix = "@recompute";

// A forward node the pass may clone: computed, not a source, updates nothing.
bool recomputable(const Node& n) {
  return n.phase == Phase::kForward && !is_source(n.kind) && !n.outputs.empty() &&
         op_def(n.kind).mutates == 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string join_ints(const std::set<int>& xs) {
  std::string s;
  for (int x : xs) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

// The blocks (Node::layer >= 0) that have forward ops.
std::set<int> graph_layers(const Graph& g) {
  std::set<int> layers;
  for (const Node& n : g.nodes())
    if (recomputable(n) && n.layer >= 0) layers.insert(n.layer);
  return layers;
}

// "0..5" for a contiguous set, else "0, 2, 5"; "none" when empty.
std::string describe_layers(const std::set<int>& layers) {
  if (layers.empty()) return "none (the graph has no blocks: no node has Node::layer >= 0)";
  if (*layers.rbegin() - *layers.begin() + 1 == static_cast<int>(layers.size()))
    return std::to_string(*layers.begin()) + ".." + std::to_string(*layers.rbegin());
  return join_ints(layers);
}

// The layers the policy covers: p.layers, each checked to exist, or all blocks.
Result<std::set<int>> policy_layers(const Graph& g, const RecomputePolicy& p) {
  const std::set<int> present = graph_layers(g);
  if (p.layers.empty()) return present;
  std::set<int> chosen;
  for (int l : p.layers) {
    if (!present.count(l))
      return Status::invalid("recompute: layer " + std::to_string(l) +
                             " is not a block of this graph; valid layers are " +
                             describe_layers(present));
    chosen.insert(l);
  }
  return chosen;
}

// Up to `count` forward node names closest to the pattern's literal prefix.
std::string similar_names(const Graph& g, const std::string& pattern, size_t count) {
  const std::string prefix = pattern.substr(0, pattern.find('*'));
  std::vector<std::pair<size_t, NodeId>> scored;
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (!recomputable(n)) continue;
    size_t common = 0;
    while (common < prefix.size() && common < n.name.size() && prefix[common] == n.name[common])
      ++common;
    scored.push_back({common, id});
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string s;
  for (size_t i = 0; i < scored.size() && i < count; ++i)
    s += (i ? ", " : "") + g.node(scored[i].second).name;
  if (scored.size() > count) s += ", ... (" + std::to_string(scored.size()) + " forward ops)";
  return s;
}

// kFull: every forward op of the chosen blocks.
std::vector<char> select_full(const Graph& g, const std::set<int>& layers) {
  std::vector<char> sel(g.num_nodes(), 0);
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    sel[id] = recomputable(n) && layers.count(n.layer);
  }
  return sel;
}

bool is_layout(OpKind k) {
  return k == OpKind::kTranspose || k == OpKind::kReshape || k == OpKind::kRope;
}

// kSelective: the attention core of each chosen block (see RecomputePolicy).
Result<std::vector<char>> select_attention_core(const Graph& g, const std::set<int>& layers,
                                                const std::vector<std::vector<NodeId>>& readers) {
  std::vector<char> sel(g.num_nodes(), 0);
  std::set<int> found;
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (n.kind == OpKind::kAttention && recomputable(n) && layers.count(n.layer)) {
      sel[id] = 1;
      found.insert(n.layer);
    }
  }
  if (found.size() != layers.size()) {
    std::set<int> missing;
    for (int l : layers)
      if (!found.count(l)) missing.insert(l);
    return Status::invalid(
        "recompute: selective mode recomputes the attention core, but layer(s) " +
        join_ints(missing) + " have no attention op; use \"full\" for those blocks or name ops");
  }
  // Downstream: layout ops (the "from_heads" transpose) that read only recomputed values.
  // Graph order is topological, so one forward sweep closes the set.
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (sel[id] || !recomputable(n) || n.kind == OpKind::kRope || !is_layout(n.kind) ||
        !layers.count(n.layer))
      continue;
    bool all = true;
    for (ValueId v : n.inputs) all = all && sel[g.value(v).producer];
    sel[id] = all;
  }
  // Upstream: q/k/v layout ops that only feed recomputed ops, when their input
  // is read by the backward anyway (else recomputing them would merely save
  // their input in place of their output: no memory saved, work added).
  for (NodeId id = g.num_nodes() - 1; id >= 0; --id) {
    const Node& n = g.node(id);
    if (sel[id] || !recomputable(n) || !is_layout(n.kind) || !layers.count(n.layer)) continue;
    bool only_feeds_selected = true, any_reader = false;
    for (ValueId v : n.outputs)
      for (NodeId r : readers[v]) {
        if (g.node(r).phase != Phase::kForward) continue;
        any_reader = true;
        only_feeds_selected = only_feeds_selected && sel[r];
      }
    bool inputs_kept = true;
    for (ValueId v : n.inputs) {
      bool kept = is_source(g.producer(v).kind);
      for (NodeId r : readers[v]) kept = kept || g.node(r).phase == Phase::kBackward;
      inputs_kept = inputs_kept && kept;
    }
    sel[id] = any_reader && only_feeds_selected && inputs_kept;
  }
  return sel;
}

// kOps: forward nodes matching a pattern, within the chosen blocks if any were named.
Result<std::vector<char>> select_ops(const Graph& g, const RecomputePolicy& p,
                                     const std::set<int>& layers) {
  if (p.op_names.empty())
    return Status::invalid("recompute: mode \"ops\" needs op_names (e.g. \"h.1.mlp.*\"); names: " +
                           similar_names(g, "", 6));
  std::vector<char> sel(g.num_nodes(), 0);
  for (const std::string& pattern : p.op_names) {
    bool any = false;
    for (NodeId id = 0; id < g.num_nodes(); ++id) {
      const Node& n = g.node(id);
      if (!recomputable(n) || (!p.layers.empty() && !layers.count(n.layer))) continue;
      if (recompute_name_matches(pattern, n.name)) sel[id] = any = true;
    }
    if (!any)
      return Status::invalid(
          "recompute: op name \"" + pattern + "\" matches no forward op" +
          (p.layers.empty() ? "" : " in layers " + join_ints(layers)) +
          " ('*' matches any characters, else the whole name must match); similar names: " +
          similar_names(g, pattern, 6));
  }
  return sel;
}

}  // namespace

bool recompute_name_matches(const std::string& pattern, const std::string& name) {
  // Iterative glob with backtracking to the last '*'.
  size_t p = 0, s = 0, star = std::string::npos, mark = 0;
  while (s < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = s;
    } else if (p < pattern.size() && pattern[p] == name[s]) {
      ++p;
      ++s;
    } else if (star != std::string::npos) {
      p = star + 1;
      s = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

Status apply_recompute(Graph& g, const RecomputePolicy& p) {
  MF_ASSIGN_OR_RETURN(std::set<int> layers, policy_layers(g, p));
  if (p.mode == RecomputePolicy::kNone) return Status::ok();
  bool has_backward = false;
  for (const Node& n : g.nodes()) {
    has_backward = has_backward || n.phase == Phase::kBackward;
    if (ends_with(n.name, kSuffix))
      return Status::failed_precondition("recompute: the graph already has recomputed node '" +
                                         n.name + "'; apply the pass once");
  }
  if (!has_backward)
    return Status::failed_precondition(
        "recompute: the graph has no backward phase; call append_backward first");
  if (layers.empty() && p.mode != RecomputePolicy::kOps)
    return Status::invalid(
        "recompute: full and selective recompute work per block, and this graph has no block "
        "(no node has Node::layer >= 0); name ops instead (mode \"ops\"), e.g. " +
        similar_names(g, "", 4));

  const int nn = g.num_nodes(), nv = g.num_values();
  std::vector<std::vector<NodeId>> readers(nv);
  for (NodeId id = 0; id < nn; ++id)
    for (ValueId v : g.node(id).inputs) readers[v].push_back(id);

  std::vector<char> sel;
  switch (p.mode) {
    case RecomputePolicy::kFull:
      sel = select_full(g, layers);
      break;
    case RecomputePolicy::kSelective: {
      MF_ASSIGN_OR_RETURN(sel, select_attention_core(g, layers, readers));
      break;
    }
    case RecomputePolicy::kOps: {
      MF_ASSIGN_OR_RETURN(sel, select_ops(g, p, layers));
      break;
    }
    case RecomputePolicy::kNone:
      return Status::ok();
  }

  // Which selected nodes to clone: those whose outputs the backward of their
  // own block reads, plus (within the block) the selected nodes those clones
  // read. Reads from another block keep the saved value: a block's output is
  // the next block's checkpoint. Readers come later in graph order, so one
  // reverse sweep closes the set.
  std::vector<char> cloned(nn, 0);
  for (NodeId id = nn - 1; id >= 0; --id) {
    const Node& n = g.node(id);
    if (!sel[id]) continue;
    for (ValueId v : n.outputs)
      for (NodeId r : readers[v]) {
        const Node& reader = g.node(r);
        if (reader.layer != n.layer) continue;
        if (reader.phase == Phase::kBackward || cloned[r]) cloned[id] = 1;
      }
  }
  // New value ids for the clones' outputs, after all existing values.
  std::vector<ValueId> clone_of(nv, kNoValue);
  ValueId next = nv;
  for (NodeId id = 0; id < nn; ++id)
    if (cloned[id])
      for (ValueId v : g.node(id).outputs) clone_of[v] = next++;
  if (next == nv) return Status::ok();  // nothing the backward reads was selected

  // A reader of block L (a backward node or a clone) reads the clone of a
  // value produced in block L.
  auto rewired = [&](ValueId v, int reader_layer) {
    return clone_of[v] != kNoValue && g.producer(v).layer == reader_layer ? clone_of[v] : v;
  };
  // Each block's clones run right before the first backward node that reads one.
  std::map<int, NodeId> insert_at;  // layer -> node id
  for (NodeId id = 0; id < nn; ++id) {
    const Node& n = g.node(id);
    if (n.phase != Phase::kBackward) continue;
    for (ValueId v : n.inputs)
      if (rewired(v, n.layer) != v && !insert_at.count(n.layer)) insert_at[n.layer] = id;
  }
  std::map<NodeId, std::vector<int>> blocks_before;  // node id -> layers to recompute there
  for (const auto& [layer, at] : insert_at) blocks_before[at].push_back(layer);

  Graph out;
  std::vector<ValueId> wanted_id;  // by the value id add_node gives: the id it must end with
  auto emit = [&](NodeId id, bool clone) {
    Node n = g.node(id);
    std::vector<Value> types;
    for (ValueId v : n.outputs) {
      types.push_back(g.value(v));
      if (clone) types.back().name += kSuffix;
    }
    if (clone || n.phase == Phase::kBackward)
      for (ValueId& v : n.inputs) v = rewired(v, n.layer);
    if (clone) {
      n.name += kSuffix;
      n.phase = Phase::kBackward;
      // It only trains: without the inputs evaluation reads (OpDef::training_inputs).
      const int training_inputs = op_def(n.kind).training_inputs;
      if (training_inputs >= 0) n.inputs.resize(training_inputs);
    }
    const std::vector<ValueId> old_outputs = g.node(id).outputs;
    NodeId nid = out.add_node(std::move(n), types);
    const std::vector<ValueId>& got = out.node(nid).outputs;
    wanted_id.resize(out.num_values(), kNoValue);
    for (size_t i = 0; i < got.size(); ++i)
      wanted_id[got[i]] = clone ? clone_of[old_outputs[i]] : old_outputs[i];
  };
  for (NodeId id = 0; id < nn; ++id) {
    auto it = blocks_before.find(id);
    if (it != blocks_before.end())
      for (int layer : it->second)
        for (NodeId c = 0; c < id; ++c)
          if (cloned[c] && g.node(c).layer == layer) emit(c, true);
    emit(id, false);
  }
  // Put every value at its wanted id: existing values keep theirs.
  MF_CHECK_EQ(out.num_values(), next);
  const std::vector<Value> placed = out.values();
  for (ValueId a = 0; a < out.num_values(); ++a) out.mutable_value(wanted_id[a]) = placed[a];
  for (NodeId id = 0; id < out.num_nodes(); ++id)
    for (ValueId& v : out.mutable_node(id).outputs) v = wanted_id[v];
  out.loss = g.loss;
  out.grad_of_param = g.grad_of_param;
  out.outputs = g.outputs;
  g = std::move(out);
  debug_verify(g, "recompute");
  return Status::ok();
}

double recompute_extra_flops(const Graph& g) {
  double flops = 0;
  for (const Node& n : g.nodes())
    if (ends_with(n.name, kSuffix)) flops += op_cost(g, n).flops;
  return flops;
}

int64_t saved_for_backward_bytes(const Graph& g) {
  std::vector<char> read_by_backward(g.num_values(), 0);
  for (const Node& n : g.nodes())
    if (n.phase == Phase::kBackward)
      for (ValueId v : n.inputs) read_by_backward[v] = 1;
  int64_t bytes = 0;
  for (ValueId v = 0; v < g.num_values(); ++v) {
    const Node& producer = g.producer(v);
    if (read_by_backward[v] && producer.phase == Phase::kForward && !is_source(producer.kind))
      bytes += g.shape(v).numel() * static_cast<int64_t>(dtype_size(g.value(v).dtype));
  }
  return bytes;
}

}  // namespace meshflow
