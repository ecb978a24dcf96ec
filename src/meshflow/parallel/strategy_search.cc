#include "meshflow/parallel/strategy_search.h"

#include <Cbc_C_Interface.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

#include "meshflow/core/dtype.h"
#include "meshflow/core/glob.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/parallel/collective_cost.h"

namespace meshflow {

namespace {

// The ILP's objective is in microseconds: CBC's tolerances are absolute
// (1e-6 and up), and step-time terms in seconds are as small as that.
constexpr double kScale = 1e6;
// A pair of layouts the reshard planner cannot connect (priced out).
constexpr double kUnreachableS = 1e3;

double default_node_time(const Graph& g, const Node& n) {
  const OpCost c = op_cost(g, n);
  return std::max(c.flops / 1e12, c.bytes / 1e11);
}

// Does strategy `s` split any operand over mesh axis `a`?
bool uses_axis(const ShardingStrategy& s, int a) {
  for (const Layout& l : s.inputs)
    if (!l.at(a).is_replicate()) return true;
  for (const Layout& l : s.outputs)
    if (!l.at(a).is_replicate()) return true;
  return false;
}

// How many ways `s` divides the node's work: the product of the sizes of the
// mesh axes it splits (an axis that splits nothing repeats the work).
double split_degree(const ShardingStrategy& s, const Mesh& mesh) {
  double d = 1;
  for (int a = 0; a < mesh.num_axes(); ++a)
    if (mesh.size(a) > 1 && uses_axis(s, a)) d *= double(mesh.size(a));
  return d;
}

// The layout the gradient of input `i` comes out in: the input's layout,
// Partial on every axis the strategy splits while the input is whole there
// (a column-parallel matmul's dx over tp; a weight's gradient over the batch
// split).
Layout gradient_layout(const ShardingStrategy& s, int i, const Mesh& mesh) {
  Layout l = s.inputs[i];
  for (int a = 0; a < mesh.num_axes(); ++a)
    if (mesh.size(a) > 1 && l.at(a).is_replicate() && uses_axis(s, a))
      l = l.with(a, Placement::Partial());
  return l;
}

// Where an output's gradient is wanted: the output's layout, whole where it
// was a Partial sum (the gradient of a sum is the same for every addend).
Layout whole(Layout l) {
  for (int a = 0; a < l.num_axes(); ++a)
    if (l.at(a).is_partial()) l = l.with(a, Placement::Replicate());
  return l;
}

double local_bytes(const Graph& g, ValueId v, const Layout& l, const Mesh& mesh,
                   double bytes_per_element = 0) {
  double n = double(g.shape(v).numel()) *
             (bytes_per_element > 0 ? bytes_per_element : double(dtype_size(g.value(v).dtype)));
  for (int a = 0; a < l.num_axes(); ++a)
    if (l.at(a).is_shard()) n /= double(mesh.size(a));
  return n;
}

bool differentiable(const Graph& g, ValueId v) {
  const DType t = g.value(v).dtype;
  return t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

// The decision of one class.
struct Class {
  std::string pattern;
  std::vector<NodeId> nodes;
  std::vector<ShardingStrategy> st;
  std::vector<double> cost;     // compute + gradient reductions + same-class edges (s)
  std::vector<double> compute;  // compute alone (s)
  std::vector<double> reduce;   // gradient reductions alone (s)
  std::vector<double> ring;     // ring attention's exposed shifts alone (s)
  std::vector<double> mem;      // bytes
};

// Pairwise costs between two classes u < v: cost[s * nt + t].
struct Edge {
  int u = 0, v = 0;
  std::vector<double> cost;
  int nt = 0;
  double at(int s, int t) const { return cost[size_t(s) * nt + t]; }
};

std::string tied_pattern(const Node& n) {
  if (n.layer < 0) return "";
  const std::string token = "." + std::to_string(n.layer) + ".";
  const size_t at = n.name.find(token);
  if (at == std::string::npos) return "";
  return n.name.substr(0, at) + ".*." + n.name.substr(at + token.size());
}

std::string signature(const Graph& g, const Node& n) {
  std::string s = std::string(op_name(n.kind)) + "(";
  for (ValueId v : n.inputs) s += g.shape(v).to_string() + ";";
  s += ")->";
  for (ValueId v : n.outputs) s += g.shape(v).to_string() + ";";
  return s;
}

class Search {
 public:
  Search(const Graph& g, const Mesh& mesh, const StrategySearchOptions& o)
      : g_(g), mesh_(mesh), o_(o) {
    if (!o_.node_time_s) o_.node_time_s = default_node_time;
    for (const std::string& a : o_.folded_axes)
      if (mesh_.axis_index(a) >= 0) folded_.insert(mesh_.axis_index(a));
  }

  Result<StrategySearch> run() {
    const auto t0 = std::chrono::steady_clock::now();
    MF_RETURN_IF_ERROR(make_classes());
    price_classes();
    std::vector<int> pick;
    StrategySearch r;
    MF_RETURN_IF_ERROR(solve(&pick, &r));
    finish(pick, &r);
    r.solve_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

 private:
  // ---- classes: the forward nodes, tied across identical blocks ----
  Status make_classes() {
    class_of_.assign(g_.num_nodes(), -1);
    std::map<std::string, int> by_pattern;
    std::map<std::string, std::string> sig_of;
    for (NodeId id = 0; id < NodeId(g_.num_nodes()); ++id) {
      const Node& n = g_.node(id);
      if (n.phase != Phase::kForward || n.inputs.empty()) continue;
      std::string pat = o_.tie_layers ? tied_pattern(n) : "";
      const std::string sig = signature(g_, n);
      if (!pat.empty()) {
        auto s = sig_of.find(pat);
        if (s == sig_of.end())
          sig_of[pat] = sig;
        else if (s->second != sig)
          pat.clear();  // a block that differs decides for itself (its exact name wins)
      }
      if (pat.empty()) pat = n.name;
      auto it = by_pattern.find(pat);
      if (it == by_pattern.end()) {
        Class c;
        c.pattern = pat;
        MF_ASSIGN_OR_RETURN(c.st, candidates(n));
        it = by_pattern.emplace(pat, int(classes_.size())).first;
        classes_.push_back(std::move(c));
      }
      classes_[it->second].nodes.push_back(id);
      class_of_[id] = it->second;
    }
    return Status::ok();
  }

  Result<std::vector<ShardingStrategy>> candidates(const Node& n) const {
    std::vector<ShardingStrategy> out;
    std::vector<std::string> seen;
    // Ring attention (a split sequence through attention) only over the
    // axes the caller runs in zigzag order (StrategySearchOptions::ring_axes).
    const ShardingRule rule = sharding_rule(g_, n);
    const int qi = n.kind == OpKind::kAttentionGrad ? 1 : 0;
    const bool attention = n.kind == OpKind::kAttention || n.kind == OpKind::kAttentionGrad;
    const int ring = attention ? rule.input_factor(qi, 2) : -1;
    for (ShardingStrategy s : enumerate_strategies(g_, n, mesh_)) {
      if (ring >= 0 && rule.factors[ring].ring && ring_axis(s.inputs[qi]) == -2) continue;
      for (Layout& l : s.inputs) l = canonical(l, mesh_);
      for (Layout& l : s.outputs) l = canonical(l, mesh_);
      bool partial_in = false;
      for (const Layout& l : s.inputs) partial_in |= l.has_partial();
      if (partial_in) continue;
      const std::string key = s.to_string();
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
      seen.push_back(key);
      out.push_back(std::move(s));
    }
    if (out.empty())
      return Status::invalid("strategy search: " + node_label(n) +
                             " has no valid strategy on the mesh " + mesh_.to_string());
    return out;
  }

  // The mesh axis a layout of attention's query splits its sequence over (a
  // ring), -1 if none, -2 if one not in ring_axes.
  int ring_axis(const Layout& q) const {
    int axis = -1;
    for (int a : q.shard_axes(2)) {
      if (mesh_.size(a) == 1) continue;
      const std::string& name = mesh_.axis_name(a);
      if (std::find(o_.ring_axes.begin(), o_.ring_axes.end(), name) == o_.ring_axes.end())
        return -2;
      axis = a;
    }
    return axis;
  }

  // Ring attention's shifts that its compute does not hide (ops/attention.cc
  // attention_collectives): the forward passes the k/v block on n - 1 times
  // under compute_fwd; the backward passes k/v n - 1 times and the dk/dv
  // accumulator n times under compute_bwd, the last shift after its last step.
  double ring_exposed_s(const Node& n, const ShardingStrategy& s, double compute_fwd,
                        double compute_bwd) const {
    if (n.kind != OpKind::kAttention) return 0;
    const int a = ring_axis(s.inputs[0]);
    if (a < 0) return 0;
    const double kv = 2 * local_bytes(g_, n.inputs[1], s.inputs[1], mesh_);
    const int64_t ranks = mesh_.size(a);
    const double shift = collective_time_s(Collective::kSendRecv, ranks, kv, o_.cost.link(a));
    const double fwd = double(ranks - 1) * shift, bwd = double(2 * ranks - 2) * shift;
    return std::max(0.0, fwd - compute_fwd) + std::max(0.0, bwd - compute_bwd) + shift;
  }

  // ---- costs ----
  // `param_grad`: a parameter's gradient reduced to its stored layout; its
  // steps over the folded axes cost folded_scale of theirs.
  double reshard_s(ValueId v, const Layout& from, const Layout& to, bool param_grad = false) {
    if (from == to) return 0;
    const Shape& shape = g_.shape(v);
    if (shape.rank() == 0) return 0;
    const DType dtype = g_.value(v).dtype;
    // Looked up without building a key (the search asks millions of times).
    size_t h = (from.hash() * 31 + to.hash()) * 31 + size_t(dtype);
    for (const Dim& d : shape.dims()) h = h * 0x100000001b3ull ^ size_t(d.size);
    std::vector<ReshardEntry>& bucket = reshard_cache_[h];
    for (const ReshardEntry& e : bucket)
      if (e.dtype == dtype && e.from == from && e.to == to && *e.shape == shape)
        return param_grad ? e.folded_s : e.cost_s;
    ReshardCostModel cost = o_.cost;
    cost.bytes_per_element = int64_t(dtype_size(dtype));
    Result<ReshardPlan> p = plan_reshard(shape, mesh_, from, to, cost);
    const double s = p.is_ok() ? p->cost_s : kUnreachableS;
    double folded = s;
    if (p.is_ok() && !folded_.empty()) {
      folded = 0;
      for (const ReshardStep& st : p->steps)
        folded += st.cost_s * (folded_.count(st.mesh_axis) ? o_.folded_scale : 1.0);
    }
    bucket.push_back({&shape, from, to, dtype, s, folded});
    return param_grad ? folded : s;
  }

  void price_classes() {
    // Forward node -> its gradient nodes' time ("<name>.grad.*").
    std::unordered_map<std::string, NodeId> fwd_by_name;
    for (NodeId id = 0; id < NodeId(g_.num_nodes()); ++id)
      if (class_of_[id] >= 0) fwd_by_name[g_.node(id).name] = id;
    // Values the backward reads: the activations a micro-batch keeps.
    std::vector<char> read_back(static_cast<size_t>(g_.num_values()), 0);
    for (const Node& n : g_.nodes())
      if (n.phase == Phase::kBackward)
        for (ValueId v : n.inputs) read_back[static_cast<size_t>(v)] = 1;
    // Forward work and its gradient nodes' apart (ring attention hides its
    // shifts under each).
    std::vector<double> work(g_.num_nodes(), 0), grad_work(g_.num_nodes(), 0);
    for (NodeId id = 0; id < NodeId(g_.num_nodes()); ++id) {
      const Node& n = g_.node(id);
      if (class_of_[id] >= 0) {
        work[id] += o_.node_time_s(g_, n);
        continue;
      }
      if (n.phase != Phase::kBackward) continue;
      const size_t at = n.name.find(".grad.");
      if (at == std::string::npos) continue;
      auto f = fwd_by_name.find(n.name.substr(0, at));
      if (f != fwd_by_name.end()) grad_work[f->second] += o_.node_time_s(g_, n);
    }
    // Where each source value is stored: its first forward reader.
    std::map<ValueId, std::pair<NodeId, int>> first_reader;
    for (NodeId id = 0; id < NodeId(g_.num_nodes()); ++id) {
      if (class_of_[id] < 0) continue;
      const Node& n = g_.node(id);
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const ValueId v = n.inputs[i];
        if (!g_.producer(v).inputs.empty()) continue;
        first_reader.emplace(v, std::make_pair(id, int(i)));
      }
    }
    for (Class& c : classes_) {
      const size_t ns = c.st.size();
      c.cost.assign(ns, 0);
      c.compute.assign(ns, 0);
      c.reduce.assign(ns, 0);
      c.ring.assign(ns, 0);
      c.mem.assign(ns, 0);
      for (NodeId id : c.nodes) {
        const Node& n = g_.node(id);
        for (size_t s = 0; s < ns; ++s) {
          const ShardingStrategy& st = c.st[s];
          const double split = split_degree(st, mesh_);
          c.compute[s] += (work[id] + grad_work[id]) / split;
          c.ring[s] += ring_exposed_s(n, st, work[id] / split, grad_work[id] / split);
          for (size_t k = 0; k < n.outputs.size(); ++k)
            if (read_back[static_cast<size_t>(n.outputs[k])])
              c.mem[s] +=
                  local_bytes(g_, n.outputs[k], whole(st.outputs[k]), mesh_, o_.activation_bytes);
        }
        for (size_t i = 0; i < n.inputs.size(); ++i) add_input_costs(c, id, int(i), first_reader);
      }
      for (size_t s = 0; s < ns; ++s) c.cost[s] += c.compute[s] + c.reduce[s] + c.ring[s];
    }
  }

  // The costs of node n's input i: a parameter's storage and gradient
  // reduction (first reader), or an edge to the class that decides where the
  // value is (its producer, or a source's first reader).
  void add_input_costs(Class& c, NodeId id, int i,
                       const std::map<ValueId, std::pair<NodeId, int>>& first_reader) {
    const Node& n = g_.node(id);
    const ValueId v = n.inputs[i];
    const Node& prod = g_.producer(v);
    const bool source = prod.inputs.empty();
    const bool grad = differentiable(g_, v);
    const int cv = class_of_[id];
    if (source) {
      const auto& fr = first_reader.at(v);
      if (fr.first == id && fr.second == i) {
        if (prod.kind != OpKind::kParameter) return;  // fed data: each rank gets its block
        for (size_t s = 0; s < c.st.size(); ++s) {
          c.mem[s] += o_.state_copies * local_bytes(g_, v, c.st[s].inputs[i], mesh_);
          if (grad)
            c.reduce[s] +=
                reshard_s(v, gradient_layout(c.st[s], i, mesh_), c.st[s].inputs[i], true);
        }
        return;
      }
      const int cu = class_of_[fr.first];
      const int iu = fr.second;
      add_edge(cu, cv, [&](const ShardingStrategy& su, const ShardingStrategy& sv) {
        double t = reshard_s(v, su.inputs[iu], sv.inputs[i]);
        if (grad && prod.kind == OpKind::kParameter)
          t += reshard_s(v, gradient_layout(sv, i, mesh_), su.inputs[iu], true);
        return t;
      });
      return;
    }
    const int cu = class_of_[g_.value(v).producer];
    if (cu < 0) return;  // produced outside the forward (not searched)
    const int k = g_.value(v).output_index;
    add_edge(cu, cv, [&](const ShardingStrategy& su, const ShardingStrategy& sv) {
      double t = reshard_s(v, su.outputs[k], sv.inputs[i]);
      if (grad) t += reshard_s(v, gradient_layout(sv, i, mesh_), whole(su.outputs[k]));
      return t;
    });
  }

  template <typename F>
  void add_edge(int cu, int cv, F cost) {
    Class& a = classes_[cu];
    Class& b = classes_[cv];
    if (cu == cv) {  // tied blocks: the two ends decide alike
      for (size_t s = 0; s < a.st.size(); ++s) a.cost[s] += cost(a.st[s], a.st[s]);
      return;
    }
    if (a.st.size() == 1 || b.st.size() == 1) {  // one end fixed: a cost of the other
      for (size_t s = 0; s < a.st.size(); ++s)
        for (size_t t = 0; t < b.st.size(); ++t) {
          const double x = cost(a.st[s], b.st[t]);
          if (a.st.size() == 1)
            b.cost[t] += x;
          else
            a.cost[s] += x;
        }
      return;
    }
    const bool flip = cu > cv;
    const int lo = flip ? cv : cu, hi = flip ? cu : cv;
    auto it = edge_of_.find({lo, hi});
    if (it == edge_of_.end()) {
      Edge e;
      e.u = lo, e.v = hi;
      e.nt = int(classes_[hi].st.size());
      e.cost.assign(classes_[lo].st.size() * classes_[hi].st.size(), 0);
      it = edge_of_.emplace(std::make_pair(lo, hi), int(edges_.size())).first;
      edges_.push_back(std::move(e));
    }
    Edge& e = edges_[it->second];
    for (size_t s = 0; s < a.st.size(); ++s)
      for (size_t t = 0; t < b.st.size(); ++t) {
        const double x = cost(a.st[s], b.st[t]);
        e.cost[flip ? t * e.nt + s : s * e.nt + t] += x;
      }
  }

  // ---- the integer program ----
  double evaluate(const std::vector<int>& pick) const {
    double t = 0;
    for (size_t c = 0; c < classes_.size(); ++c) t += classes_[c].cost[pick[c]];
    for (const Edge& e : edges_) t += e.at(pick[e.u], pick[e.v]);
    return t;
  }

  // Each class in turn takes its cheapest strategy given those already taken.
  std::vector<int> greedy() const {
    std::vector<std::vector<int>> adj(classes_.size());
    for (size_t k = 0; k < edges_.size(); ++k) {
      adj[edges_[k].u].push_back(int(k));
      adj[edges_[k].v].push_back(int(k));
    }
    std::vector<int> pick(classes_.size(), -1);
    for (size_t c = 0; c < classes_.size(); ++c) {
      double best = std::numeric_limits<double>::infinity();
      for (size_t s = 0; s < classes_[c].st.size(); ++s) {
        double x = classes_[c].cost[s];
        for (int k : adj[c]) {
          const Edge& e = edges_[k];
          const int other = e.u == int(c) ? e.v : e.u;
          if (pick[other] < 0) continue;
          x += e.u == int(c) ? e.at(int(s), pick[other]) : e.at(pick[other], int(s));
        }
        if (x < best) best = x, pick[c] = int(s);
      }
    }
    return pick;
  }

  double memory_of(const std::vector<int>& pick) const {
    double m = 0;
    for (size_t c = 0; c < classes_.size(); ++c) m += classes_[c].mem[pick[c]];
    return m;
  }

  Status solve(std::vector<int>* pick, StrategySearch* r) {
    const double budget = o_.memory_budget_bytes;
    double least_mem = 0;
    for (const Class& c : classes_) least_mem += *std::min_element(c.mem.begin(), c.mem.end());
    if (budget > 0 && least_mem > budget) {
      char buf[160];
      std::snprintf(buf, sizeof buf,
                    "strategy search: no strategy fits %.3g GiB per device; the least memory any "
                    "assignment on mesh %s needs is %.3g GiB",
                    budget / double(1 << 30), mesh_.to_string().c_str(),
                    least_mem / double(1 << 30));
      return Status::invalid(buf);
    }
    // CLP asserts (aborting the process) on objective coefficients past 1e25:
    // a price that large, or not finite, comes from cluster figures no
    // machine has; say so rather than hand it to the solver.
    constexpr double kMostTermS = 1e9;  // ~32 years (1e15 in the objective's units)
    auto out_of_range = [&](double x, const std::string& what) {
      char buf[320];
      std::snprintf(buf, sizeof buf,
                    "strategy search: %s is priced at %.3g s (finite and at most %.0e s is "
                    "a step's range): the cluster's figures are out of range (its links' "
                    "latency and bandwidth, the device's peak and memory bandwidth)",
                    what.c_str(), x, kMostTermS);
      return Status::invalid(buf);
    };
    for (const Class& c : classes_)
      for (size_t s = 0; s < c.cost.size(); ++s)
        if (!(std::isfinite(c.cost[s]) && std::abs(c.cost[s]) <= kMostTermS))
          return out_of_range(c.cost[s], "node '" + c.pattern + "' under " + c.st[s].to_string());
    for (const Edge& e : edges_)
      for (double x : e.cost)
        if (!(std::isfinite(x) && std::abs(x) <= kMostTermS))
          return out_of_range(x, "a redistribution between '" + classes_[e.u].pattern + "' and '" +
                                     classes_[e.v].pattern + "'");
    // Columns: x per strategy of every class with a choice, then y per edge.
    std::vector<int> x0(classes_.size(), -1);
    int cols = 0;
    for (size_t c = 0; c < classes_.size(); ++c)
      if (classes_[c].st.size() > 1) x0[c] = cols, cols += int(classes_[c].st.size());
    std::vector<int> y0(edges_.size());
    for (size_t k = 0; k < edges_.size(); ++k) y0[k] = cols, cols += int(edges_[k].cost.size());
    r->columns = cols;
    std::vector<int> start = greedy();
    const bool need_memory_row = budget > 0;
    const bool start_fits = budget <= 0 || memory_of(start) <= budget;
    if (cols == 0 || (edges_.empty() && budget <= 0)) {
      // Nothing couples the choices: each class's cheapest is optimal.
      *pick = start;
      r->optimal = true;
      r->bound_s = evaluate(start);
      return Status::ok();
    }
    // One CBC model at a time in the process: the planner's threads may
    // search at once, and CBC's C interface is not documented as reentrant.
    // (Declared before the model: it is freed before the lock goes.)
    static std::mutex cbc_mutex;
    std::lock_guard<std::mutex> cbc_lock(cbc_mutex);
    std::unique_ptr<Cbc_Model, void (*)(Cbc_Model*)> m(Cbc_newModel(), Cbc_deleteModel);
    Cbc_setLogLevel(m.get(), 0);
    Cbc_setObjSense(m.get(), 1);
    if (o_.time_limit_s > 0) Cbc_setMaximumSeconds(m.get(), o_.time_limit_s);
    for (size_t c = 0; c < classes_.size(); ++c)
      for (size_t s = 0; x0[c] >= 0 && s < classes_[c].st.size(); ++s)
        Cbc_addCol(m.get(), "", 0, 1, classes_[c].cost[s] * kScale, 1, 0, nullptr, nullptr);
    for (const Edge& e : edges_)
      for (double x : e.cost) Cbc_addCol(m.get(), "", 0, 1, x * kScale, 0, 0, nullptr, nullptr);
    std::vector<int> idx;
    std::vector<double> val;
    auto row = [&](char sense, double rhs) {
      Cbc_addRow(m.get(), "", int(idx.size()), idx.data(), val.data(), sense, rhs);
      idx.clear(), val.clear();
      ++r->rows;
    };
    for (size_t c = 0; c < classes_.size(); ++c) {
      if (x0[c] < 0) continue;
      for (size_t s = 0; s < classes_[c].st.size(); ++s)
        idx.push_back(x0[c] + int(s)), val.push_back(1);
      row('E', 1);
    }
    for (size_t k = 0; k < edges_.size(); ++k) {
      const Edge& e = edges_[k];
      const int ns = int(classes_[e.u].st.size());
      for (int s = 0; s < ns; ++s) {
        for (int t = 0; t < e.nt; ++t) idx.push_back(y0[k] + s * e.nt + t), val.push_back(1);
        idx.push_back(x0[e.u] + s), val.push_back(-1);
        row('E', 0);
      }
      for (int t = 0; t < e.nt; ++t) {
        for (int s = 0; s < ns; ++s) idx.push_back(y0[k] + s * e.nt + t), val.push_back(1);
        idx.push_back(x0[e.v] + t), val.push_back(-1);
        row('E', 0);
      }
    }
    double fixed_mem = 0;
    for (size_t c = 0; c < classes_.size(); ++c) {
      if (x0[c] < 0) {
        fixed_mem += classes_[c].mem[0];
        continue;
      }
      if (!need_memory_row) continue;
      for (size_t s = 0; s < classes_[c].st.size(); ++s)
        idx.push_back(x0[c] + int(s)), val.push_back(classes_[c].mem[s] / double(1 << 20));
    }
    if (need_memory_row) row('L', (budget - fixed_mem) / double(1 << 20));
    if (start_fits) {  // the greedy assignment is feasible: start from it
      std::vector<int> si;
      std::vector<double> sv;
      for (size_t c = 0; c < classes_.size(); ++c)
        for (size_t s = 0; x0[c] >= 0 && s < classes_[c].st.size(); ++s)
          si.push_back(x0[c] + int(s)), sv.push_back(int(s) == start[c] ? 1 : 0);
      for (size_t k = 0; k < edges_.size(); ++k)
        for (int s = 0; s < int(classes_[edges_[k].u].st.size()); ++s)
          for (int t = 0; t < edges_[k].nt; ++t)
            si.push_back(y0[k] + s * edges_[k].nt + t),
                sv.push_back(s == start[edges_[k].u] && t == start[edges_[k].v] ? 1 : 0);
      Cbc_setMIPStartI(m.get(), int(si.size()), si.data(), sv.data());
    }
    Cbc_solve(m.get());
    const double* sol = Cbc_getColSolution(m.get());
    const bool have = sol != nullptr && Cbc_numberSavedSolutions(m.get()) > 0;
    if (!have && !start_fits)
      return Status::invalid("strategy search: the solver found no assignment within " +
                             std::to_string(budget / double(1 << 30)) +
                             " GiB per device in its time limit");
    *pick = start;
    if (have) {
      for (size_t c = 0; c < classes_.size(); ++c) {
        if (x0[c] < 0) {
          (*pick)[c] = 0;
          continue;
        }
        int best = 0;
        for (size_t s = 1; s < classes_[c].st.size(); ++s)
          if (sol[x0[c] + int(s)] > sol[x0[c] + best]) best = int(s);
        (*pick)[c] = best;
      }
      if (start_fits && evaluate(*pick) > evaluate(start)) *pick = start;
    }
    r->optimal = Cbc_isProvenOptimal(m.get()) != 0;
    // Cbc_C_Interface.h: secondary status 4 is "stopped on time" (2 is on gap).
    r->timed_out = !r->optimal && Cbc_secondaryStatus(m.get()) == 4;
    double fixed_cost = 0;  // the classes without a choice are not columns
    for (size_t c = 0; c < classes_.size(); ++c)
      if (x0[c] < 0) fixed_cost += classes_[c].cost[0];
    r->bound_s = Cbc_getBestPossibleObjValue(m.get()) / kScale + fixed_cost;
    return Status::ok();
  }

  // The config keys that name exactly a class's nodes: a block pattern
  // "h.*.ln_1" becomes "h.?.ln_1" (and "h.??.ln_1" past block 9), since '*'
  // would also match gradient nodes ("h.1.attn.k_proj.grad.acc_h.1.ln_1");
  // if even those match another node, the exact names.
  std::vector<std::string> config_keys(const Class& c) const {
    const size_t star = c.pattern.find(".*.");
    if (star == std::string::npos) return {c.pattern};
    std::vector<std::string> keys;
    for (NodeId id : c.nodes) {
      const std::string digits(std::to_string(g_.node(id).layer).size(), '?');
      std::string k = c.pattern.substr(0, star + 1) + digits + c.pattern.substr(star + 2);
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(std::move(k));
    }
    size_t matched = 0;
    for (const Node& n : g_.nodes())
      for (const std::string& k : keys)
        if (glob_match(k, n.name)) {
          ++matched;
          break;
        }
    if (matched == c.nodes.size()) return keys;
    keys.clear();
    for (NodeId id : c.nodes) keys.push_back(g_.node(id).name);
    return keys;
  }

  // ---- the answer ----
  void finish(const std::vector<int>& pick, StrategySearch* r) {
    r->objective_s = evaluate(pick);
    if (r->optimal) r->bound_s = r->objective_s;
    r->bound_s = std::min(r->bound_s, r->objective_s);
    r->gap = r->objective_s > 0 ? (r->objective_s - r->bound_s) / r->objective_s : 0;
    if (r->gap < 1e-6) r->gap = 0;
    r->memory_bytes = memory_of(pick);
    r->classes = int(classes_.size());
    std::vector<std::vector<int>> adj(classes_.size());
    for (size_t k = 0; k < edges_.size(); ++k) {
      adj[edges_[k].u].push_back(int(k));
      adj[edges_[k].v].push_back(int(k));
    }
    for (size_t c = 0; c < classes_.size(); ++c) {
      const Class& cl = classes_[c];
      r->nodes += int(cl.nodes.size());
      auto with = [&](int s) {  // this class's cost at s, every other class as picked
        double x = cl.cost[s];
        for (int k : adj[c]) {
          const Edge& e = edges_[k];
          x += e.u == int(c) ? e.at(s, pick[e.v]) : e.at(pick[e.u], s);
        }
        return x;
      };
      StrategyDecision d;
      d.pattern = cl.pattern;
      d.nodes = cl.nodes;
      const int s = pick[c];
      d.strategy = cl.st[s];
      const Node& n = g_.node(cl.nodes[0]);
      d.splits = splits_text(g_, n, d.strategy, mesh_, o_.batch_axes);
      d.candidates = int(cl.st.size());
      d.chosen = s;
      d.compute_s = cl.compute[s];
      d.grad_reduce_s = cl.reduce[s];
      d.ring_s = cl.ring[s];
      d.comm_in_s = with(s) - cl.compute[s] - cl.reduce[s] - cl.ring[s];
      if (n.kind == OpKind::kAttention && ring_axis(d.strategy.inputs[0]) >= 0) r->ring = true;
      double best = std::numeric_limits<double>::infinity();
      for (int t = 0; t < int(cl.st.size()); ++t) {
        if (t == s) continue;
        const double x = with(t);
        if (x < best) best = x, d.runner_up = splits_text(g_, n, cl.st[t], mesh_, o_.batch_axes);
      }
      if (!d.runner_up.empty()) d.runner_up_extra_s = best - with(s);
      for (std::string& key : config_keys(cl)) r->strategies.emplace_back(std::move(key), d.splits);
      r->decisions.push_back(std::move(d));
    }
    struct Costs {
      std::vector<std::vector<double>> node;
      std::vector<Edge> edges;
    };
    auto costs = std::make_shared<Costs>();
    for (const Class& c : classes_) costs->node.push_back(c.cost);
    costs->edges = edges_;
    r->cost_of = [costs](const std::vector<int>& pick) {
      double t = 0;
      for (size_t c = 0; c < costs->node.size(); ++c) t += costs->node[c].at(pick.at(c));
      for (const Edge& e : costs->edges) t += e.at(pick.at(e.u), pick.at(e.v));
      return t;
    };
  }

  const Graph& g_;
  const Mesh& mesh_;
  StrategySearchOptions o_;
  std::vector<Class> classes_;
  std::vector<int> class_of_;
  std::vector<Edge> edges_;
  std::map<std::pair<int, int>, int> edge_of_;
  // The reshard planner's answers, by a hash of (shape, from, to, dtype).
  struct ReshardEntry {
    const Shape* shape;  // in g_
    Layout from, to;
    DType dtype;
    double cost_s;
    double folded_s;  // as a parameter's gradient reduction (folded_axes)
  };
  std::unordered_map<size_t, std::vector<ReshardEntry>> reshard_cache_;
  std::set<int> folded_;  // mesh axis indices of o_.folded_axes
};

}  // namespace

std::string StrategySearch::summary() const {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%d classes (%d nodes), %d columns, %d rows: %s, %.2f s", classes,
                nodes, columns, rows,
                optimal     ? "optimal"
                : timed_out ? "time limit, best found"
                            : "best found",
                solve_time_s);
  std::string s = buf;
  if (!optimal) {
    std::snprintf(buf, sizeof buf, " (gap %.2f%%)", 100 * gap);
    s += buf;
  }
  return s;
}

std::string splits_text(const Graph& g, const Node& n, const ShardingStrategy& s, const Mesh& mesh,
                        const std::vector<std::string>& batch_axes) {
  std::string out = "(";
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const Shape& shape = g.shape(n.inputs[i]);
    if (i > 0) out += ", ";
    out += "(";
    for (int d = 0; d < shape.rank(); ++d) {
      std::string e;
      if (shape.name(d) == "batch")
        for (const std::string& b : batch_axes) e += (e.empty() ? "" : "*") + b;
      if (i < s.inputs.size())
        for (int a : s.inputs[i].shard_axes(d))
          if (mesh.size(a) > 1) e += (e.empty() ? "" : "*") + mesh.axis_name(a);
      out += (d > 0 ? ", " : "") + (e.empty() ? std::string("1") : e);
    }
    if (shape.rank() == 1) out += ",";
    out += ")";
  }
  return out + ")";
}

Result<StrategySearch> search_strategies(const Graph& g, const Mesh& mesh,
                                         const StrategySearchOptions& options) {
  for (const std::string& b : options.batch_axes)
    for (int a = 0; a < mesh.num_axes(); ++a)
      if (mesh.axis_name(a) == b && mesh.size(a) > 1)
        return Status::invalid("strategy search: batch axis '" + b +
                               "' is split before the search and must not be a searched axis of " +
                               mesh.to_string());
  return Search(g, mesh, options).run();
}

}  // namespace meshflow
