#include "meshflow/parallel/strategy.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <set>

#include "meshflow/config/json_reader.h"
#include "meshflow/ops/op_def.h"

namespace meshflow {
namespace {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string or_list(const std::vector<std::string>& items) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) s += i + 1 == items.size() ? " or " : ", ";
    s += items[i];
  }
  return s;
}

std::string axes_text(const std::vector<int>& axes, const Mesh& mesh) {
  std::string s;
  for (int a : axes) s += (s.empty() ? "" : "*") + mesh.axis_name(a);
  return s.empty() ? "1" : s;
}

std::string dim_text(const Shape& s, int d) {
  return "dim " + std::to_string(d) + " (" + s.name(d) + "=" + std::to_string(s.size(d)) + ")";
}

}  // namespace

// ---- 1. split tuples ----

Result<std::vector<std::vector<std::string>>> parse_split_tuples(const std::string& text) {
  const std::string where = "split tuples \"" + text + "\": ";
  size_t i = 0;
  auto skip = [&] {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  };
  auto open = [&](char c) { return c == '(' || c == '['; };
  auto close = [&](char c) { return c == ')' || c == ']'; };
  auto at = [&] { return i < text.size() ? std::string("'") + text[i] + "'" : "the end"; };
  auto expect_open = [&](const std::string& what) -> Status {
    skip();
    if (i >= text.size() || !open(text[i]))
      return Status::invalid(where + "expected '(' to open " + what + " at " + at() +
                             "; write e.g. ((dp, 1), (1, tp))");
    ++i;
    return Status::ok();
  };
  std::vector<std::vector<std::string>> out;
  MF_RETURN_IF_ERROR(expect_open("the list of per-input tuples"));
  while (true) {
    skip();
    if (i < text.size() && close(text[i])) {
      ++i;
      break;
    }
    MF_RETURN_IF_ERROR(expect_open("the tuple of input " + std::to_string(out.size())));
    std::vector<std::string> tuple;
    while (true) {
      skip();
      if (i < text.size() && close(text[i])) {
        ++i;
        break;
      }
      size_t b = i;
      while (i < text.size() && text[i] != ',' && !open(text[i]) && !close(text[i])) ++i;
      std::string e = trim(text.substr(b, i - b));
      {  // "dp * tp" is fine; "dp 1" is a missing comma.
        std::string packed;
        for (size_t k = 0; k < e.size(); ++k) {
          if (std::isspace(static_cast<unsigned char>(e[k]))) {
            size_t a = packed.empty() ? 0 : packed.size() - 1, z = k;
            while (z < e.size() && std::isspace(static_cast<unsigned char>(e[z]))) ++z;
            if (!(packed.size() && packed[a] == '*') && !(z < e.size() && e[z] == '*'))
              return Status::invalid(where + "expected ',' or ')' inside entry '" + e + "'");
            k = z - 1;
            continue;
          }
          packed += e[k];
        }
        e = packed;
      }
      if (e.empty())
        return Status::invalid(where + "empty entry " + std::to_string(tuple.size()) +
                               " in the tuple of input " + std::to_string(out.size()));
      tuple.push_back(e);
      skip();
      if (i < text.size() && text[i] == ',') {
        ++i;
      } else if (!(i < text.size() && close(text[i]))) {
        return Status::invalid(where + "expected ',' or ')' after entry '" + e + "' at " + at());
      }
    }
    out.push_back(std::move(tuple));
    skip();
    if (i < text.size() && text[i] == ',') {
      ++i;
    } else if (!(i < text.size() && close(text[i]))) {
      return Status::invalid(where + "expected ',' or ')' after the tuple of input " +
                             std::to_string(out.size() - 1) + " at " + at());
    }
  }
  skip();
  if (i != text.size())
    return Status::invalid(where + "unexpected text after the closing ')': '" + text.substr(i) +
                           "'");
  return out;
}

std::string mesh_split_counts(const Mesh& mesh) {
  std::set<int64_t> counts;
  const int n = mesh.num_axes();
  for (int mask = 0; mask < (1 << n); ++mask) {
    int64_t p = 1;
    for (int a = 0; a < n; ++a)
      if (mask & (1 << a)) p *= mesh.size(a);
    counts.insert(p);
  }
  std::vector<std::string> items;
  for (int64_t c : counts) items.push_back(std::to_string(c));
  return or_list(items);
}

Result<std::vector<int>> split_entry_axes(const std::string& entry_in, const Mesh& mesh) {
  const std::string entry = trim(entry_in);
  if (all_digits(entry)) {
    if (entry.size() > 9) return Status::invalid("split '" + entry + "' is too large");
    const int64_t n = std::stoll(entry);
    if (n == 0) return Status::invalid("split 0 ways: a split count is >= 1 (1 = not split)");
    if (n == 1) return std::vector<int>{};
    std::vector<std::vector<int>> found;
    const int na = mesh.num_axes();
    for (int mask = 1; mask < (1 << na); ++mask) {
      int64_t p = 1;
      std::vector<int> axes;
      bool trivial = false;
      for (int a = 0; a < na; ++a) {
        if (!(mask & (1 << a))) continue;
        if (mesh.size(a) == 1) trivial = true;
        p *= mesh.size(a);
        axes.push_back(a);
      }
      if (!trivial && p == n) found.push_back(axes);
    }
    if (found.empty())
      return Status::invalid("split " + entry + " ways, but the mesh " + mesh.to_string() +
                             " splits only " + mesh_split_counts(mesh) + " ways");
    if (found.size() > 1) {
      std::vector<std::string> names;
      for (const auto& f : found) names.push_back(axes_text(f, mesh));
      return Status::invalid("split " + entry + " ways is ambiguous on the mesh " +
                             mesh.to_string() + ": it could be " + or_list(names) +
                             "; name the mesh axes instead");
    }
    return found[0];
  }
  std::vector<int> axes;
  size_t b = 0;
  while (true) {
    size_t e = entry.find('*', b);
    std::string part = trim(entry.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (part != "1") {
      int a = mesh.axis_index(part);
      if (a < 0) {
        std::vector<std::string> names;
        for (const MeshAxis& ax : mesh.axes()) names.push_back(ax.name);
        return Status::invalid("split '" + entry + "': '" + part + "' is not an axis of the mesh " +
                               mesh.to_string() + " (axes: " + or_list(names) +
                               ", a product like " + names.front() + "*" + names.back() +
                               ", or a split count)");
      }
      if (std::find(axes.begin(), axes.end(), a) != axes.end())
        return Status::invalid("split '" + entry + "' names mesh axis " + part + " twice");
      axes.push_back(a);
    }
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return axes;
}

Result<ShardingStrategy> strategy_from_splits(const Graph& g, NodeId id, const Mesh& mesh,
                                              const std::string& text) {
  const Node& n = g.node(id);
  const std::string label = node_label(n);
  auto tuples = parse_split_tuples(text);
  if (!tuples.is_ok()) return tuples.status().with_context(label);
  if (tuples->size() != n.inputs.size())
    return Status::invalid(label + ": " + std::to_string(tuples->size()) + " split tuples in \"" +
                           text + "\" for " + std::to_string(n.inputs.size()) +
                           " inputs; give one tuple per input");
  ShardingStrategy st;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const Shape& s = g.shape(n.inputs[i]);
    const auto& tuple = (*tuples)[i];
    const std::string in = "input " + std::to_string(i);
    if (static_cast<int>(tuple.size()) != s.rank())
      return Status::invalid(label + ": " + in + " " + s.to_string() + " has " +
                             std::to_string(s.rank()) + " dims but its split tuple has " +
                             std::to_string(tuple.size()) + " entries");
    std::vector<Placement> p(mesh.num_axes(), Placement::Replicate());
    std::vector<int> used_by(mesh.num_axes(), -1);
    for (int d = 0; d < s.rank(); ++d) {
      auto axes = split_entry_axes(tuple[d], mesh);
      if (!axes.is_ok())
        return Status::invalid(label + ": " + in + " " + dim_text(s, d) + " " +
                               axes.status().message());
      int64_t count = 1;
      for (size_t k = 0; k < axes->size(); ++k) {
        int a = (*axes)[k];
        if (used_by[a] >= 0)
          return Status::invalid(label + ": " + in + ": mesh axis " + mesh.axis_name(a) +
                                 " splits both dim " + std::to_string(used_by[a]) + " and dim " +
                                 std::to_string(d) + "; a mesh axis splits at most one dim");
        used_by[a] = d;
        count *= mesh.size(a);
        p[a] = Placement::Shard(d, static_cast<int>(k));
      }
      if (s.size(d) % count != 0)
        return Status::invalid(label + ": " + in + " " + dim_text(s, d) + " cannot be split " +
                               std::to_string(count) + " ways (" + axes_text(*axes, mesh) +
                               "); valid splits of " + s.name(d) + ": " + valid_splits(s.size(d)));
    }
    auto l = Layout::make(p);
    if (!l.is_ok()) return l.status().with_context(label + ": " + in);
    st.inputs.push_back(std::move(*l));
  }
  MF_ASSIGN_OR_RETURN(st.outputs, derive_output_layouts(g, n, mesh, st.inputs));
  MF_RETURN_IF_ERROR(validate_strategy(g, n, mesh, st.inputs, st.outputs));
  // A mesh axis of size 1 named in a tuple ("tp" on tp=1) splits nothing.
  for (Layout& l : st.inputs) l = canonical(l, mesh);
  for (Layout& l : st.outputs) l = canonical(l, mesh);
  return st;
}

// ---- 2. dim-name rules ----

Result<DimRules> DimRules::from_json(const nlohmann::json& j) {
  if (!j.is_object())
    return Status::invalid("rules must be an object like {\"batch\": \"dp\"}, got " +
                           json_type_name(j));
  DimRules r;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_string())
      return Status::invalid("rules." + it.key() + " must be a mesh axis name (a string), got " +
                             json_type_name(it.value()));
    r.rules.emplace_back(it.key(), it.value().get<std::string>());
  }
  return r;
}

Result<DimRules> DimRules::parse(const std::string& text_in) {
  std::string text = trim(text_in);
  if (!text.empty() && text.front() == '{') {
    auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) return from_json(j);
    if (text.back() != '}')
      return Status::invalid("rules \"" + text_in + "\": '{' without a closing '}'");
    text = text.substr(1, text.size() - 2);
  }
  DimRules r;
  size_t b = 0;
  while (b <= text.size()) {
    size_t e = text.find(',', b);
    std::string item = trim(text.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (!item.empty()) {
      size_t c = item.find_first_of(":=");
      std::string dim = c == std::string::npos ? "" : trim(item.substr(0, c));
      std::string axis = c == std::string::npos ? "" : trim(item.substr(c + 1));
      if (dim.empty() || axis.empty())
        return Status::invalid("rules \"" + text_in + "\": '" + item +
                               "' is not 'dim: axis' (e.g. batch: dp)");
      r.rules.emplace_back(dim, axis);
    }
    if (e == std::string::npos) break;
    b = e + 1;
  }
  std::set<std::string> seen;
  for (const auto& [dim, axis] : r.rules)
    if (!seen.insert(dim).second)
      return Status::invalid("rules \"" + text_in + "\": dim '" + dim + "' has two rules");
  return r;
}

const std::string* DimRules::axis_of(const std::string& dim) const {
  for (const auto& [d, a] : rules)
    if (d == dim) return &a;
  return nullptr;
}

namespace {
std::vector<std::string> rule_axes(const std::string& text);
std::vector<std::string> rule_alternatives(const std::string& text);
// Every axis a rule names, over all its alternatives.
std::vector<std::string> all_rule_axes(const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& alt : rule_alternatives(text))
    for (const std::string& name : rule_axes(alt)) out.push_back(name);
  return out;
}
}  // namespace

std::vector<std::string> DimRules::axes_in(const std::string& text) {
  return all_rule_axes(text);
}

Status DimRules::check(const Mesh& mesh) const {
  for (const auto& [dim, axis] : rules) {
    for (const std::string& name : all_rule_axes(axis)) {
      if (name.empty())
        return Status::invalid("rule " + dim + ": \"" + axis +
                               "\" has an empty axis name; write mesh axes, a product \"cp*tp\" "
                               "(major first) or alternatives \"cp*tp|cp\" (the first that "
                               "applies), over the mesh " +
                               mesh.to_string());
      if (mesh.axis_index(name) < 0)
        return Status::invalid("rule " + dim + ": " + axis + ": '" + name +
                               "' is not an axis of the mesh " + mesh.to_string());
    }
  }
  return Status::ok();
}

std::string DimRules::to_string() const {
  std::string s = "{";
  for (size_t i = 0; i < rules.size(); ++i)
    s += (i ? ", " : "") + rules[i].first + ": " + rules[i].second;
  return s + "}";
}

void use_data_parallel_plan(StrategyConfig* c, const Mesh& mesh) {
  c->mode = "semi";
  c->preset = "dp";
  c->mesh = mesh;
  c->has_mesh = true;
  c->rules = preset_rules("dp", mesh);
}

DimRules preset_rules(const std::string& preset, const Mesh& mesh) {
  // Rule order is priority: a dim earlier in the list takes a mesh axis first.
  std::vector<std::pair<std::string, std::string>> all;
  if (preset == "dp") all = {{"batch", "dp"}};
  if (preset == "megatron")
    all = {{"batch", "dp"}, {"heads", "tp"}, {"kv_heads", "tp"}, {"ffn", "tp"}, {"vocab", "tp"}};
  if (preset == "megatron-sp")
    all = {{"batch", "dp"}, {"heads", "tp"}, {"kv_heads", "tp"},
           {"ffn", "tp"},   {"vocab", "tp"}, {"seq", "tp"}};
  if (preset == "ulysses") all = {{"batch", "dp"}, {"seq", "cp"}};
  // Ring attention: the sequence stays split over cp through attention too
  // (k/v blocks go round the cp ring in the kernel); Megatron's tp beside it.
  // "ring-sp": the same with Megatron's sequence parallelism beside it
  // (Megatron-Core's --sequence-parallel with --cp-comm-type p2p, TorchTitan's
  // tp with cp): norms, dropout and residuals on sequence shards over cp*tp
  // (cp major), the values with a heads dim on cp alone, since tp splits
  // their heads.
  if (preset == "ring" || preset == "ring-sp")
    all = {{"batch", "dp"},
           {"heads", "tp"},
           {"kv_heads", "tp"},
           {"ffn", "tp"},
           {"vocab", "tp"},
           {"seq", preset == "ring-sp" && mesh.axis_index("tp") >= 0 ? "cp*tp|cp" : "cp"}};
  // Megatron with context parallel (Megatron-LM's --context-parallel-size):
  // the sequence is split over cp as well (under sp over cp, then tp; on
  // cp alone where tp splits the heads, the attention core's all_to_all
  // then moves it to heads).
  if (mesh.axis_index("cp") >= 0 && (preset == "megatron" || preset == "megatron-sp")) {
    if (preset == "megatron-sp") all.pop_back();
    all.emplace_back("seq",
                     preset == "megatron-sp" && mesh.axis_index("tp") >= 0 ? "cp*tp|cp" : "cp");
  }
  DimRules r;
  r.may_stay_whole = {"vocab"};
  // A rule naming an axis the mesh lacks is left out (every axis of every
  // alternative: "cp*tp|cp" needs both).
  for (auto& [dim, axis] : all) {
    bool present = true;
    for (const std::string& name : all_rule_axes(axis)) present &= mesh.axis_index(name) >= 0;
    if (present) r.rules.emplace_back(dim, axis);
  }
  return r;
}

std::vector<std::pair<std::string, std::string>> preset_strategies(const std::string& preset,
                                                                   const Mesh& mesh) {
  if (mesh.axis_index("cp") < 0) return {};
  if (preset != "ulysses" && preset != "megatron" && preset != "megatron-sp") return {};
  // Ulysses: attention runs on all positions of a slice of the heads; the
  // planner's all_to_all moves q, k, v from sequence shards to head shards and
  // back. With Megatron's tp the heads are already split over tp: cp splits them further.
  const std::string heads = preset != "ulysses" && mesh.axis_index("tp") >= 0 ? "tp*cp" : "cp";
  const std::string b = mesh.axis_index("dp") >= 0 ? "dp" : "1";
  const std::string qkv = "(" + b + ", " + heads + ", 1, 1)", lse = "(" + b + ", " + heads + ", 1)";
  return {{"*attn.core", "(" + qkv + ", " + qkv + ", " + qkv + ")"},
          {"*attn.core.grad.*",
           "(" + qkv + ", " + qkv + ", " + qkv + ", " + qkv + ", " + qkv + ", " + lse + ")"}};
}

namespace {
// `text` cut at each `sep`, each piece trimmed ("a | b" -> {"a", "b"}).
std::vector<std::string> split_trimmed(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t b = 0;
  while (true) {
    size_t e = text.find(sep, b);
    out.push_back(trim(text.substr(b, e == std::string::npos ? std::string::npos : e - b)));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return out;
}

// "cp*tp|cp" -> {"cp*tp", "cp"}: alternatives, first that applies wins.
std::vector<std::string> rule_alternatives(const std::string& text) {
  return split_trimmed(text, '|');
}

// "dp" -> {"dp"}; "rep*dp" -> {"rep", "dp"} (major first).
std::vector<std::string> rule_axes(const std::string& text) {
  return split_trimmed(text, '*');
}
}  // namespace

Result<Layout> apply_rules(const DimRules& rules, const Mesh& mesh, const Shape& shape) {
  std::vector<Placement> p(mesh.num_axes(), Placement::Replicate());
  std::vector<bool> used(mesh.num_axes(), false);
  // Rules in their order (the first rule naming a dim of the shape takes its
  // axes). A rule may name several axes, major first: {batch: "rep*dp"}.
  for (const auto& [dim_name, axis_name] : rules.rules) {
    int d = -1;
    for (int k = 0; k < shape.rank() && d < 0; ++k)
      if (shape.name(k) == dim_name) d = k;
    if (d < 0) continue;
    // The first alternative ("cp*tp|cp") whose axes no earlier rule took
    // and that splits something.
    std::vector<int> axes;
    int64_t ways = 1;
    std::string over;  // the alternative taken
    for (const std::string& alt : rule_alternatives(axis_name)) {
      over = alt;
      axes.clear();
      ways = 1;
      bool taken = false;
      for (const std::string& name : rule_axes(alt)) {
        const int a = mesh.axis_index(name);
        if (a < 0)
          return Status::invalid("rule " + shape.name(d) + ": " + axis_name + ": '" + name +
                                 "' is not an axis of the mesh " + mesh.to_string());
        if (mesh.size(a) == 1) continue;  // splits nothing (tp=1: the dim stays whole)
        taken |= used[a];
        axes.push_back(a);
        ways *= mesh.size(a);
      }
      if (!taken && !axes.empty()) break;
      axes.clear();
    }
    if (axes.empty()) continue;  // an earlier rule took an axis, or no split
    if (shape.size(d) % ways != 0 &&
        std::find(rules.may_stay_whole.begin(), rules.may_stay_whole.end(), dim_name) !=
            rules.may_stay_whole.end())
      continue;
    if (shape.size(d) % ways != 0)
      return Status::invalid(shape.to_string() + " " + dim_text(shape, d) + " cannot be split " +
                             std::to_string(ways) + " ways over mesh axis " + over + " (rule " +
                             shape.name(d) + ": " + axis_name + "); valid splits of " +
                             shape.name(d) + ": " + valid_splits(shape.size(d)));
    for (size_t k = 0; k < axes.size(); ++k) {
      used[axes[k]] = true;
      p[axes[k]] =
          axes.size() == 1 ? Placement::Shard(d) : Placement::Shard(d, static_cast<int>(k));
    }
  }
  return Layout::make(p);
}

bool RulesReport::needs(NodeId id) const {
  return std::find(needs_reshard.begin(), needs_reshard.end(), id) != needs_reshard.end();
}

Result<RulesReport> apply_rules(const Graph& g, const Mesh& mesh, const DimRules& rules) {
  MF_RETURN_IF_ERROR(rules.check(mesh));
  RulesReport rep;
  rep.layouts.reserve(g.num_values());
  for (ValueId v = 0; v < g.num_values(); ++v) {
    auto l = apply_rules(rules, mesh, g.shape(v));
    if (!l.is_ok())
      return l.status().with_context(node_label(g.producer(v)) + ": value '" + g.value(v).name +
                                     "'");
    rep.layouts.push_back(std::move(*l));
  }
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (n.inputs.empty()) continue;  // sources take whatever layout they are given
    std::vector<Layout> in, out;
    for (ValueId v : n.inputs) in.push_back(rep.layouts[v]);
    for (ValueId v : n.outputs) out.push_back(rep.layouts[v]);
    Status s = validate_strategy(g, n, mesh, in, out);
    if (!s.is_ok()) {
      rep.needs_reshard.push_back(id);
      rep.reasons.push_back(s.message());
    }
  }
  return rep;
}

// ---- 3. config ----

const std::string* StrategyConfig::strategy_for(const std::string& name) const {
  const std::string* best = nullptr;
  size_t best_len = 0;
  for (const auto& [pat, text] : strategies) {
    if (pat == name) return &text;
    // Among globs, the longest (most specific) pattern wins; ties: the first.
    if (glob_match(pat, name) && (best == nullptr || pat.size() > best_len)) {
      best = &text;
      best_len = pat.size();
    }
  }
  return best;
}

Result<StrategyConfig> parse_strategy_config(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object())
    return Status::invalid(where + " must be an object, got " + json_type_name(j));
  StrategyConfig c;
  JsonObjectReader r(j, where);
  r.choice("mode", &c.mode, {"data", "semi", "hybrid", "auto"});
  r.choice("preset", &c.preset,
           {"", "dp", "megatron", "megatron-sp", "ulysses", "ring", "ring-sp"});
  r.choice("search", &c.search, {"propagate", "full"});
  r.integer("zero", &c.zero, 0, 3);
  r.choice("zero_style", &c.zero_style, {"shard", "group"});
  r.choice("ring_order", &c.ring_order, {"zigzag", "contiguous"});
  c.ring_order_set = j.contains("ring_order");
  r.ignore({"mesh", "rules", "strategies", "pipeline", "recompute_layers"});
  r.choice("recompute", &c.recompute, {"", "none", "full", "selective"});
  MF_RETURN_IF_ERROR(r.finish());
  if (j.contains("recompute_layers")) {
    const json& l = j.at("recompute_layers");
    const std::string want = "a list of block numbers >= 0 (as a plan writes them)";
    if (!l.is_array())
      return Status::invalid(where + ".recompute_layers must be " + want + ", got " +
                             json_type_name(l));
    for (const json& b : l) {
      if (!b.is_number_integer() || b.get<int64_t>() < 0 || b.get<int64_t>() > INT32_MAX)
        return Status::invalid(where + ".recompute_layers must be " + want + ", got " + b.dump());
      c.recompute_layers.push_back(b.get<int>());
    }
    if (c.recompute != "full")
      return Status::invalid(where + ".recompute_layers recomputes those blocks whole: it needs " +
                             where + ".recompute \"full\"");
  }

  if (j.contains("mesh")) {
    const json& m = j.at("mesh");
    const std::string path = where + ".mesh";
    if (m.is_string()) {
      auto mesh = Mesh::parse(m.get<std::string>());
      if (!mesh.is_ok()) return mesh.status().with_context(path);
      c.mesh = std::move(*mesh);
    } else if (m.is_object()) {
      // nlohmann::json reads object keys sorted; give a string ("tp=2,dp=4")
      // to order the axes otherwise.
      std::vector<MeshAxis> axes;
      for (auto it = m.begin(); it != m.end(); ++it) {
        const json& v = it.value();
        if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 20))
          return Status::invalid(path + "." + it.key() +
                                 " must be an integer >= 1 (the axis size), got " +
                                 (v.is_number() ? v.dump() : json_type_name(v)));
        axes.push_back({it.key(), static_cast<int>(v.get<int64_t>())});
      }
      auto mesh = Mesh::make(std::move(axes));
      if (!mesh.is_ok()) return mesh.status().with_context(path);
      c.mesh = std::move(*mesh);
    } else {
      return Status::invalid(path + " must be an object like {\"dp\": 2, \"tp\": 2} or a string " +
                             "like \"dp=2,tp=2\", got " + json_type_name(m));
    }
    c.has_mesh = true;
  }
  if (j.contains("rules")) {
    const json& rj = j.at("rules");
    const std::string path = where + ".rules";
    Result<DimRules> rules =
        rj.is_string() ? DimRules::parse(rj.get<std::string>()) : DimRules::from_json(rj);
    if (!rules.is_ok()) return Status::invalid(where + "." + rules.status().message());
    c.rules = std::move(*rules);
    Status s = c.rules.check(c.mesh);
    if (!s.is_ok()) return s.with_context(path);
  }
  if (j.contains("strategies")) {
    const json& sj = j.at("strategies");
    const std::string path = where + ".strategies";
    if (!sj.is_object())
      return Status::invalid(path + " must be an object {\"<node name or glob>\": " +
                             "\"((dp, 1), (1, tp))\"}, got " + json_type_name(sj));
    for (auto it = sj.begin(); it != sj.end(); ++it) {
      const std::string key = path + "." + it.key();
      if (!it.value().is_string())
        return Status::invalid(key + " must be a string of split tuples like " +
                               "\"((dp, 1), (1, tp))\", got " + json_type_name(it.value()));
      const std::string text = it.value().get<std::string>();
      auto tuples = parse_split_tuples(text);
      if (!tuples.is_ok()) return tuples.status().with_context(key);
      for (size_t i = 0; i < tuples->size(); ++i)
        for (size_t d = 0; d < (*tuples)[i].size(); ++d) {
          auto axes = split_entry_axes((*tuples)[i][d], c.mesh);
          if (!axes.is_ok())
            return Status::invalid(key + ": input " + std::to_string(i) + " dim " +
                                   std::to_string(d) + " " + axes.status().message());
        }
      c.strategies.emplace_back(it.key(), text);
    }
  }
  if (j.contains("pipeline")) {
    if (!j.at("pipeline").is_object())
      return Status::invalid(where + ".pipeline must be an object like {\"stages\": 2, " +
                             "\"schedule\": \"1f1b\", \"micro_batches\": 8}, got " +
                             json_type_name(j.at("pipeline")));
    c.pipeline = j.at("pipeline");
  }
  if (!c.preset.empty()) {
    if (!c.rules.rules.empty())
      return Status::invalid(where + ".preset \"" + c.preset + "\" gives the rules; leave out " +
                             where + ".rules (or the preset)");
    c.rules = preset_rules(c.preset, c.mesh);
    for (auto& st : preset_strategies(c.preset, c.mesh)) c.strategies.push_back(st);
  }
  if (c.zero_style == "group" && c.zero != 1)
    return Status::invalid(
        where + ".zero_style \"group\" (weights grouping: whole parameters' optimizer state " +
        "and update on one data-parallel rank each) is a form of ZeRO stage 1, but " + where +
        ".zero is " + std::to_string(c.zero) + "; use \"zero\": 1 with it, or \"zero_style\": " +
        "\"shard\" (the default) for stages 2 and 3");
  if (c.zero > 0 && c.mesh.axis_index("dp") < 0)
    return Status::invalid(where + ".zero shards over the data-parallel axis, but the mesh " +
                           c.mesh.to_string() + " has no axis named dp");
  if (c.mode == "data") {
    if (!c.rules.rules.empty())
      return Status::invalid(where + ".rules is not used in mode \"data\"; use \"semi\" or " +
                             "\"hybrid\"");
    if (!c.strategies.empty())
      return Status::invalid(where + ".strategies is not used in mode \"data\"; use \"semi\" " +
                             "or \"hybrid\"");
  }
  return c;
}

}  // namespace meshflow
