#include "meshflow/parallel/partition.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <tuple>
#include <unordered_map>

#include "meshflow/core/check.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/verify.h"
#include "meshflow/parallel/reshape_layout.h"

namespace meshflow {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Reshard costs by (shape, src, dst); the annotator asks for the same pairs often.
class CostCache {
 public:
  CostCache(const Mesh& mesh, const ReshardCostModel& model) : mesh_(mesh), model_(model) {}
  double operator()(const Shape& shape, const Layout& src, const Layout& dst) {
    if (src == dst) return 0;
    std::string key = shape.to_string() + src.to_string() + ">" + dst.to_string();
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    auto plan = plan_reshard(shape, mesh_, src, dst, model_);
    // Ties (a reduce_scatter + all_gather moves what one all_reduce does) go
    // to fewer collectives: a nanosecond per collective.
    double c = plan.is_ok() ? plan->cost_s + 1e-9 * plan->num_collectives() : kInf;
    cache_.emplace(std::move(key), c);
    return c;
  }

 private:
  const Mesh& mesh_;
  const ReshardCostModel& model_;
  std::unordered_map<std::string, double> cache_;
};

// ZeRO: the layout a value of `shape` stored as `l` gets when it is also split
// over `axis` (on the first dim whose shard divides), or `l` when none does.
Layout zero_shard(const Layout& l, const Shape& shape, const Mesh& mesh, int axis) {
  if (axis < 0 || !l.at(axis).is_replicate() || mesh.size(axis) == 1) return l;
  for (int d = 0; d < shape.rank(); ++d) {
    const int64_t local = shape.size(d) / l.shard_count(d, mesh);
    if (local % mesh.size(axis) == 0) return l.with(axis, Placement::Shard(d));
  }
  return l;
}

bool is_update(OpKind k) {
  return op_def(k).mutates != 0;
}

// The index of the one factor of `r` named `name`, or -1 (none, or several).
int factor_named(const ShardingRule& r, const std::string& name) {
  int found = -1;
  for (size_t f = 0; f < r.factors.size(); ++f) {
    if (r.factors[f].name != name) continue;
    if (found >= 0) return -1;
    found = static_cast<int>(f);
  }
  return found;
}

// The strategy of gradient node `b` dual to forward node `f`'s strategy `fs`:
// every factor `fs` splits is split over the same mesh axes, in the same
// order, on `b`. Factors match by name: a gradient carries the dim names of
// its value (autodiff), so a matmul's gradient matmuls have the forward's loop
// dims under the same names (c_fc = x[batch,seq,hidden] w[hidden,ffn] split
// {batch: dp, ffn: tp}: dx = dy w^T contracts ffn -> Partial over tp; dw =
// x^T dy contracts batch -> the weight's layout, Partial over dp). nullopt
// when a split factor is not exactly one factor of `b`, or the layouts are not
// a valid strategy of `b`.
std::optional<ShardingStrategy> dual_strategy(const Graph& g, const Node& f,
                                              const ShardingStrategy& fs, const Node& b,
                                              const Mesh& mesh) {
  const ShardingRule rf = sharding_rule(g, f), rb = sharding_rule(g, b);
  const int na = mesh.num_axes();
  std::vector<int> factor(na, -1), order(na, 0);  // per mesh axis: b's factor it splits
  for (int ax = 0; ax < na; ++ax) {
    for (size_t i = 0; i < fs.inputs.size() && factor[ax] < 0; ++i) {
      const Placement& p = fs.inputs[i].at(ax);
      if (!p.is_shard()) continue;
      const int ff = rf.input_factor(static_cast<int>(i), p.dim());
      if (ff < 0 || factor_named(rf, rf.factors[ff].name) != ff) return std::nullopt;
      factor[ax] = factor_named(rb, rf.factors[ff].name);
      if (factor[ax] < 0) return std::nullopt;
      order[ax] = p.order();
    }
  }
  ShardingStrategy st;
  for (int j = 0; j < rb.num_inputs; ++j) {
    std::vector<Placement> p(na, Placement::Replicate());
    for (int ax = 0; ax < na; ++ax)
      if (factor[ax] >= 0 && rb.factors[factor[ax]].input_dim[j] >= 0)
        p[ax] = Placement::Shard(rb.factors[factor[ax]].input_dim[j], order[ax]);
    // (All the axes of a factor move together, so the positions stay 0..k-1.)
    Result<Layout> made = Layout::make(p);
    if (!made.is_ok() || !divides_evenly(*made, mesh, g.shape(b.inputs[j]))) return std::nullopt;
    st.inputs.push_back(std::move(*made));
  }
  auto outs = derive_output_layouts(g, b, mesh, st.inputs);
  if (!outs.is_ok()) return std::nullopt;
  // A split factor only b's outputs carry (embedding_grad's vocabulary rows,
  // the forward lookup's reduction): split there too, if b can
  // (ShardingRule::Factor::output_split), so each rank writes its block.
  std::vector<Layout> split = *outs;
  for (size_t o = 0; o < split.size(); ++o)
    for (int ax = 0; ax < na; ++ax) {
      if (factor[ax] < 0 || !split[o].at(ax).is_replicate()) continue;
      const ShardingRule::Factor& fb = rb.factors[factor[ax]];
      if (fb.output_split && fb.output_dim[o] >= 0)
        split[o] = split[o].with(ax, Placement::Shard(fb.output_dim[o], order[ax]));
    }
  st.outputs = validate_strategy(g, b, mesh, st.inputs, split).is_ok() ? split : *outs;
  return st;
}

}  // namespace

namespace {

// A strategy one source chose, and why.
struct Choice {
  ShardingStrategy strategy;
  StrategySource source = StrategySource::kPropagated;
  std::string why;
};
using Found = Result<std::optional<Choice>>;

// annotate(): the options resolved once against the graph (the rules' layouts,
// the user's split tuples, every source's stored layout), then each node in
// graph order asks the strategy sources (kSources in run()) in turn; the first that
// answers decides.
class Annotator {
 public:
  Annotator(const Graph& g, const Mesh& mesh, const PartitionOptions& o)
      : g_(g), mesh_(mesh), o_(o), na_(mesh.num_axes()), cost_(mesh, o.cost) {}

  Result<Annotation> run() {
    MF_RETURN_IF_ERROR(check_options());
    MF_RETURN_IF_ERROR(resolve_rules());
    MF_RETURN_IF_ERROR(resolve_user_strategies());
    MF_RETURN_IF_ERROR(resolve_stored_layouts());
    find_update_reads();
    a_.mesh = mesh_;
    a_.zero_stage = o_.zero_stage;
    if (o_.weight_groups) {
      // Balanced by the bytes one rank stores of each parameter.
      MF_ASSIGN_OR_RETURN(a_.groups, group_weights(g_, mesh_, o_.zero_axis, [&](ValueId p) {
                            const Result<Shape> s = local_shape(g_.shape(p), mesh_, stored_[p]);
                            return s.is_ok() ? s->numel() * int64_t{4} : int64_t{0};
                          }));
    }
    a_.node.resize(g_.num_nodes());
    a_.source.resize(g_.num_nodes());
    a_.why.resize(g_.num_nodes());
    // The strategy sources, most binding first.
    static constexpr SourceFn kSources[] = {
        &Annotator::from_stored,
        &Annotator::from_optimizer_update,
        &Annotator::from_fixed,
        &Annotator::from_user,
        &Annotator::from_user_gradient,
        &Annotator::from_update_reads,
        &Annotator::from_deferred_reduction,
        &Annotator::from_rules,
        &Annotator::from_propagation,
    };
    for (NodeId id = 0; id < g_.num_nodes(); ++id) {
      std::optional<Choice> c;
      annotating_ = id;
      for (SourceFn source : kSources) {
        MF_ASSIGN_OR_RETURN(c, (this->*source)(id, g_.node(id)));
        if (c) break;
      }
      MF_CHECK(c.has_value()) << node_label(g_.node(id)) << ": no strategy source answered";
      a_.node[id] = std::move(c->strategy);
      a_.source[id] = c->source;
      a_.why[id] = c->why.empty() ? std::string(strategy_source_name(c->source)) : c->why;
      note_requests(id);
    }
    return std::move(a_);
  }

 private:
  using SourceFn = Found (Annotator::*)(NodeId, const Node&);

  static Choice choice(std::vector<Layout> ins, std::vector<Layout> outs, StrategySource s,
                       std::string why = "") {
    return Choice{ShardingStrategy{std::move(ins), std::move(outs)}, s, std::move(why)};
  }

  const Layout& current(ValueId v) const { return a_.produced(g_, v); }

  Status check_options() const {
    MF_RETURN_IF_ERROR(o_.rules.check(mesh_));
    if (o_.zero_stage < 0 || o_.zero_stage > 3)
      return Status::invalid("zero stage " + std::to_string(o_.zero_stage) +
                             " is not one of 0, 1, 2, 3");
    if (o_.weight_groups && o_.zero_stage != 1)
      return Status::invalid("weights grouping is a form of ZeRO stage 1, but the zero stage is " +
                             std::to_string(o_.zero_stage) + "; use stage 1 with it");
    if (o_.zero_stage > 0 && (o_.zero_axis < 0 || o_.zero_axis >= na_))
      return Status::invalid("ZeRO needs the data-parallel mesh axis; the mesh " +
                             mesh_.to_string() + " has axes 0.." + std::to_string(na_ - 1));
    for (int a : o_.zero_also_axes)
      if (a < 0 || a >= na_ || a == o_.zero_axis)
        return Status::invalid("ZeRO's further axis " + std::to_string(a) +
                               " must be another axis of the mesh " + mesh_.to_string());
    return Status::ok();
  }

  // Every value's layout under the dim-name rules, and the mesh axes they
  // speak for. On the others ({batch: dp} on a dp x tp mesh says nothing about
  // tp) a value may stay split where an op put it (a user's split tuple): the
  // rules' wish there is "wherever it is", not "whole".
  Status resolve_rules() {
    desired_.assign(g_.num_values(), Layout::Replicated(na_));
    governed_.assign(na_, 0);
    if (o_.rules.rules.empty()) return Status::ok();
    for (ValueId v = 0; v < g_.num_values(); ++v) {
      auto l = apply_rules(o_.rules, mesh_, g_.shape(v));
      if (!l.is_ok())
        return l.status().with_context(node_label(g_.producer(v)) + ": value '" + g_.value(v).name +
                                       "'");
      desired_[v] = *l;
    }
    for (const auto& [dim, axes] : o_.rules.rules)
      for (const std::string& name : DimRules::axes_in(axes))
        if (const int ax = mesh_.axis_index(name); ax >= 0) {
          governed_[ax] = 1;
          if (dim == "batch") replica_axes_.push_back(ax);
        }
    return Status::ok();
  }

  // The rules' layout of a value of `shape` on the governed axes, `from`'s
  // placements (made whole where Partial) on the others, if that divides.
  Layout with_free_axes(const Layout& ruled, const Layout& from, const Shape& shape) const {
    Layout l = ruled;
    for (int ax = 0; ax < na_; ++ax) {
      if (governed_[ax]) continue;
      const Placement p = from.at(ax);
      l = l.with(ax, p.is_partial() ? Placement::Replicate() : p);
    }
    return divides_evenly(l, mesh_, shape) ? l : ruled;
  }

  // User split tuples, resolved per node as StrategyConfig::strategy_for does:
  // an exact name first, else the longest (most specific) matching glob, ties
  // to the first given. Then the layouts the configured consumers ask of the
  // weights they read.
  Status resolve_user_strategies() {
    for (NodeId id = 0; id < g_.num_nodes(); ++id) {
      const Node& n = g_.node(id);
      if (n.inputs.empty() || n.name.empty()) continue;
      const std::string* text = nullptr;
      size_t spec = 0;
      for (const auto& [pattern, t] : o_.strategies) {
        if (pattern == n.name) {
          text = &t;
          spec = std::numeric_limits<size_t>::max();
          break;
        }
        if (glob_match(pattern, n.name) && (text == nullptr || pattern.size() > spec)) {
          text = &t;
          spec = pattern.size();
        }
      }
      if (text == nullptr) continue;
      MF_ASSIGN_OR_RETURN(ShardingStrategy st, strategy_from_splits(g_, id, mesh_, *text));
      user_[id] = std::move(st);
      user_specificity_[id] = spec;
    }
    for (const auto& [id, st] : user_)
      if (g_.node(id).phase == Phase::kForward) by_name_[g_.node(id).name] = id;
    resolve_weights_from_users();
    return Status::ok();
  }

  // Sharding propagation's first principle (../shared/seeds/003), and what a
  // MindSpore shard() on an op means: a weight without a layout of its own is
  // stored in the layout its configured consumer reads it in, so its gradient,
  // its optimizer state and its update are split alike. Several configured
  // consumers reading it differently: the most specific configuration wins
  // (then the first in graph order); the others reshard, and explain says so.
  void resolve_weights_from_users() {
    for (const auto& [id, st] : user_) {
      const Node& n = g_.node(id);
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const ValueId v = n.inputs[i];
        if (g_.producer(v).kind != OpKind::kParameter) continue;
        const size_t spec = user_specificity_[id];
        auto it = from_user_.find(v);
        if (it == from_user_.end()) {
          from_user_[v] = {st.inputs[i], id, spec, ""};
          continue;
        }
        UserLayout& u = it->second;
        if (u.layout == st.inputs[i]) continue;
        std::string loser = g_.node(id).name + " reads " + st.inputs[i].to_string();
        if (spec > u.specificity) {
          loser = g_.node(u.by).name + " reads " + u.layout.to_string();
          u.layout = st.inputs[i];
          u.by = id;
          u.specificity = spec;
        }
        u.others += (u.others.empty() ? "" : "; ") + loser;
      }
    }
  }

  // Stored layouts of the sources: the caller's, a fixed one, the configured
  // consumer's, else the rules'. ZeRO-3 shards parameters over its axis.
  // Optimizer state follows its parameter (the update mutates both in place,
  // so they must be split alike).
  Status resolve_stored_layouts() {
    stored_.assign(g_.num_values(), Layout::Replicated(na_));
    source_why_.assign(g_.num_nodes(), "");
    for (const Node& n : g_.nodes()) {
      if (!n.inputs.empty()) continue;
      const ValueId v = n.outputs[0];
      const NodeId id = g_.value(v).producer;
      Layout l = desired_[v];
      if (auto it = o_.source_layouts.find(v); it != o_.source_layouts.end()) {
        l = it->second;
      } else if (auto f = o_.fixed.find(id); f != o_.fixed.end() && !f->second.outputs.empty()) {
        l = f->second.outputs[0];
      } else if (auto u = from_user_.find(v); u != from_user_.end()) {
        // The user's split of the consumer wins over the rules' wish for the weight.
        l = u->second.layout;
        source_why_[id] = "user: stored as " + g_.node(u->second.by).name + " reads it";
        if (!u->second.others.empty())
          source_why_[id] +=
              " (most specific configuration; resharded where " + u->second.others + ")";
      }
      if (l.num_axes() != na_)
        return Status::invalid(node_label(n) + ": layout " + l.to_string() + " has " +
                               std::to_string(l.num_axes()) + " entries, the mesh " +
                               mesh_.to_string() + " has " + std::to_string(na_) + " axes");
      MF_RETURN_IF_ERROR(validate(l, mesh_, g_.shape(v)).with_context(node_label(n)));
      l = canonical(l, mesh_);
      if (n.kind == OpKind::kParameter && o_.zero_stage >= 3) l = zero_layout(l, g_.shape(v));
      stored_[v] = l;
    }
    for (const Node& n : g_.nodes()) {
      if (!is_update(n.kind)) continue;
      const Layout l = update_layout(n);
      for (size_t i = 1; i < n.inputs.size(); ++i)
        if ((op_def(n.kind).mutates >> i) & 1u) stored_[n.inputs[i]] = l;
    }
    return Status::ok();
  }

  // `l` split over the ZeRO axes too (zero_axis, then zero_also_axes).
  Layout zero_layout(const Layout& l, const Shape& shape) const {
    Layout z = zero_shard(l, shape, mesh_, o_.zero_axis);
    for (int a : o_.zero_also_axes) z = zero_shard(z, shape, mesh_, a);
    return z;
  }

  // The layout an update runs in: its parameter's, split over the ZeRO axes
  // from stage 1 (weights grouping: whole, on the parameter's owner).
  Layout update_layout(const Node& n) const {
    const ValueId p = n.inputs[0];
    return o_.zero_stage >= 1 && !o_.weight_groups ? zero_layout(stored_[p], g_.shape(p))
                                                   : stored_[p];
  }

  // Where optimizer updates will read their (non-source) inputs: the gradients.
  void find_update_reads() {
    for (const auto& [param, grad] : g_.grad_of_param) param_grads_.insert(grad);
    for (const Node& n : g_.nodes())
      if (is_update(n.kind))
        for (ValueId v : n.inputs)
          if (!g_.producer(v).inputs.empty()) update_reads_[v] = update_layout(n);
  }

  // Every layout of the annotation is canonical (nothing on a size-1 mesh
  // axis): a Shard on tp=1 is not a split, a Partial on it is not a sum. The
  // reshards node `id` asks for are remembered by (value, layout, phase): a
  // later consumer reading the same value in the same layout shares them.
  void note_requests(NodeId id) {
    for (Layout& l : a_.node[id].inputs) l = canonical(l, mesh_);
    for (Layout& l : a_.node[id].outputs) l = canonical(l, mesh_);
    const Node& n = g_.node(id);
    for (size_t i = 0; i < n.inputs.size() && i < a_.node[id].inputs.size(); ++i)
      if (!(a_.node[id].inputs[i] == current(n.inputs[i])))
        requested_.insert({n.inputs[i], a_.node[id].inputs[i].to_string(), n.phase});
  }

  // Input layouts `ins` with the outputs they determine, as `source`; nullopt
  // when they are not a valid strategy of n.
  std::optional<Choice> derived(const Node& n, std::vector<Layout> ins, StrategySource source) {
    auto outs = derive_output_layouts(g_, n, mesh_, ins);
    if (!outs.is_ok()) return std::nullopt;
    split_output_only_factors(n, ins, &*outs);
    return choice(std::move(ins), std::move(*outs), source);
  }

  // A factor only the outputs carry (embedding_grad's vocabulary rows) is
  // whole when derived from the inputs. Where the rules want the output split
  // on an axis no input uses, split it there: each rank computes and holds
  // its block (Megatron's vocab-parallel embedding gradient) instead of the
  // whole table, sliced afterwards.
  void split_output_only_factors(const Node& n, const std::vector<Layout>& ins,
                                 std::vector<Layout>* outs) const {
    if (o_.rules.rules.empty()) return;
    std::vector<Layout> want = *outs;
    for (size_t i = 0; i < outs->size(); ++i)
      for (int ax = 0; ax < na_; ++ax)
        if (want[i].at(ax).is_replicate() && desired_[n.outputs[i]].at(ax).is_shard())
          want[i] = want[i].with(ax, desired_[n.outputs[i]].at(ax));
    if (!(want == *outs) && validate_strategy(g_, n, mesh_, ins, want).is_ok())
      *outs = std::move(want);
  }

  // ---- the strategy sources, in the order kSources asks them ----

  // A source (parameter, input, state): its stored layout.
  Found from_stored(NodeId id, const Node& n) {
    if (!n.inputs.empty()) return std::optional<Choice>();
    return std::optional<Choice>(
        choice({}, {stored_[n.outputs[0]]}, StrategySource::kStored, source_why_[id]));
  }

  // An optimizer update: every input in the update's layout (scalars whole).
  Found from_optimizer_update(NodeId, const Node& n) {
    if (!is_update(n.kind)) return std::optional<Choice>();
    const Layout l = update_layout(n);
    std::vector<Layout> ins;
    for (ValueId v : n.inputs)
      ins.push_back(g_.shape(v).numel() == 1 && g_.shape(v).rank() == 0 ? Layout::Replicated(na_)
                                                                        : l);
    std::vector<Layout> outs;
    MF_RETURN_IF_ERROR(validate_strategy(g_, n, mesh_, ins, outs));
    return std::optional<Choice>(
        choice(std::move(ins), std::move(outs), StrategySource::kOptimizer));
  }

  // PartitionOptions::fixed: the caller's strategy for this node.
  Found from_fixed(NodeId id, const Node& n) {
    auto f = o_.fixed.find(id);
    if (f == o_.fixed.end()) return std::optional<Choice>();
    // A reshape takes any layouts that divide its shapes: the lowering routes
    // between them (reshape_layout.h).
    MF_RETURN_IF_ERROR(n.kind == OpKind::kReshape
                           ? validate_reshape_strategy(g_, n, mesh_, f->second)
                           : validate_strategy(g_, n, mesh_, f->second.inputs, f->second.outputs));
    return std::optional<Choice>(Choice{f->second, StrategySource::kFixed, ""});
  }

  // The user's split tuple for this node.
  Found from_user(NodeId id, const Node&) {
    auto u = user_.find(id);
    if (u == user_.end()) return std::optional<Choice>();
    return std::optional<Choice>(Choice{u->second, StrategySource::kUser, ""});
  }

  // The gradient nodes of a configured forward node ("<node>.grad.*") run the
  // strategy dual to its (as a MindSpore shard() does): the weight's gradient
  // comes out in the weight's layout (Partial over the batch split), the
  // input's gradient Partial over the contraction split.
  Found from_user_gradient(NodeId, const Node& n) {
    if (n.phase != Phase::kBackward) return std::optional<Choice>();
    const size_t at = n.name.find(".grad.");
    if (at == std::string::npos) return std::optional<Choice>();
    const auto f = by_name_.find(n.name.substr(0, at));
    if (f == by_name_.end() || !user_.count(f->second)) return std::optional<Choice>();
    auto d = dual_strategy(g_, g_.node(f->second), user_.at(f->second), n, mesh_);
    if (!d) return std::optional<Choice>();
    return std::optional<Choice>(Choice{std::move(*d), StrategySource::kUserGradient,
                                        "user (gradient of " + f->first + ")"});
  }

  // In the optimizer phase a gradient is read where its update reads it
  // (sum_squares of a ZeRO shard: the reduce_scatter is shared, and the shard
  // sums of squares stay Partial until the one reduction of the norm).
  Found from_update_reads(NodeId, const Node& n) {
    if (n.phase != Phase::kOptimizer) return std::optional<Choice>();
    std::vector<Layout> ins;
    bool shared = false;
    for (ValueId v : n.inputs) {
      auto it = update_reads_.find(v);
      shared |= it != update_reads_.end();
      ins.push_back(it != update_reads_.end() ? it->second : current(v));
    }
    if (!shared) return std::optional<Choice>();
    return derived(n, std::move(ins), StrategySource::kUpdateReads);
  }

  // In the backward, a Partial input the node is linear in stays Partial: the
  // reduction is deferred to where a value must be whole (three partial
  // gradient sums added first cost one all_reduce, not three). Not in the
  // forward: a Partial activation would be reduced again for the backward.
  // Not where the outputs to reduce later hold more than twice the elements
  // of the inputs now, per replica (a deferral merges two partial sums or more; a layer
  // norm's gradient, the input's size plus two vectors, still defers):
  // embedding_grad turns a Partial [tokens, C] into a Partial [vocab, C]
  // table, for a real vocabulary far larger (BLOOM's 250,880 rows against
  // 2,048 tokens a micro-batch). The input is then made whole and each rank
  // writes its shard of the table, Megatron's VocabParallelEmbedding backward.
  Found from_deferred_reduction(NodeId, const Node& n) {
    if (n.phase == Phase::kForward) return std::optional<Choice>();
    bool partial_in = false;
    std::vector<Layout> ins;
    int64_t now = 0;
    for (ValueId v : n.inputs) {
      ins.push_back(current(v));
      if (!ins.back().has_partial()) continue;
      partial_in = true;
      now += replica_numel(v, ins.back());
    }
    if (!partial_in) return std::optional<Choice>();
    std::optional<Choice> c = derived(n, std::move(ins), StrategySource::kDeferredReduction);
    if (!c) return c;
    int64_t later = 0;
    for (size_t i = 0; i < n.outputs.size(); ++i)
      if (c->strategy.outputs[i].has_partial())
        later += replica_numel(n.outputs[i], c->strategy.outputs[i]);
    if (later > 2 * now) return std::optional<Choice>();
    return c;
  }

  // The rules' wish: every input in its dim-name layout. In the backward, a
  // choice that turns its inputs into a Partial output far larger than them
  // (more than twice their elements, as from_deferred_reduction bounds it)
  // over an axis the rules split that output on is priced against the
  // strategies that write the output in the rules' layout directly, and the
  // cheaper is taken: megatron-sp's embedding_grad, whose gradient the rules
  // split over seq and whose table over vocab, both on tp, reduce_scattered
  // a Partial [vocab, C] table every micro-batch where Megatron's
  // VocabParallelEmbedding all_gathers the [tokens, C] gradient and each
  // rank writes its rows.
  Found from_rules(NodeId, const Node& n) {
    if (o_.rules.rules.empty()) return std::optional<Choice>();
    std::vector<Layout> ins;
    for (ValueId v : n.inputs) ins.push_back(with_free_axes(desired_[v], current(v), g_.shape(v)));
    std::optional<Choice> c = derived(n, ins, StrategySource::kRules);
    if (!c) c = gathered_minor(n, ins);
    if (!c || n.phase != Phase::kBackward || !grows_partial_on_a_ruled_axis(n, *c)) return c;
    std::vector<int> sibs(n.inputs.size());
    for (size_t i = 0; i < n.inputs.size(); ++i) sibs[i] = siblings(n, i);
    double best = candidate_cost(n, c->strategy, kInf, sibs);
    for (ShardingStrategy& s : enumerate_strategies(g_, n, mesh_)) {
      // The rules' layout, or Partial where they keep the output whole (a
      // gradient summed over cp with the others, once per step).
      bool as_ruled = true;
      for (size_t i = 0; i < n.outputs.size() && as_ruled; ++i) {
        const ValueId out = n.outputs[i];
        const Layout want =
            canonical(with_free_axes(desired_[out], s.outputs[i], g_.shape(out)), mesh_);
        const Layout got = canonical(s.outputs[i], mesh_);
        for (int ax = 0; ax < na_ && as_ruled; ++ax)
          as_ruled =
              got.at(ax) == want.at(ax) || (got.at(ax).is_partial() && want.at(ax).is_replicate());
      }
      if (!as_ruled) continue;
      const double cost = candidate_cost(n, s, best, sibs);
      if (cost < best)
        best = cost,
        c = Choice{std::move(s), StrategySource::kRules,
                   "rules (the output's layout; the Partial form the rules derive costs more)"};
    }
    return c;
  }

  // Inputs the rules lay out inconsistently for n, one with a dim split over
  // several axes (ring-sp's and megatron-sp's seq over cp*tp) beside one
  // whose axis splits another dim (a weight gradient's dy, ffn over tp): the
  // first input whose minor-most axis on such a dim, gathered, makes them
  // agree. Sequence parallelism's gather over tp, keeping the cp split: the
  // weight gradient then comes out Partial over cp (summed with the
  // gradients' reduction, once per step), where the strategy priced per
  // node alone gathered the whole sequence over cp every micro-batch
  // (Llama-3 405B at tp=8 cp=2: 360 MiB per block per micro-batch).
  std::optional<Choice> gathered_minor(const Node& n, const std::vector<Layout>& ins) {
    for (size_t i = 0; i < ins.size(); ++i)
      for (int d = 0; d < g_.shape(n.inputs[i]).rank(); ++d) {
        const std::vector<int> axes = ins[i].shard_axes(d);
        if (axes.size() < 2) continue;
        std::vector<Layout> tried = ins;
        tried[i] = ins[i].with(axes.back(), Placement::Replicate());
        if (std::optional<Choice> c = derived(n, std::move(tried), StrategySource::kRules))
          return c;
      }
    return std::nullopt;
  }

  // Whether choice c leaves an output of n Partial over a mesh axis the rules
  // split that output on, with more than twice the elements of n's inputs.
  bool grows_partial_on_a_ruled_axis(const Node& n, const Choice& c) const {
    int64_t now = 0, later = 0;
    for (size_t i = 0; i < n.inputs.size(); ++i)
      now += replica_numel(n.inputs[i], c.strategy.inputs[i]);
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const Layout& want = desired_[n.outputs[i]];
      for (int ax = 0; ax < na_; ++ax) {
        if (!c.strategy.outputs[i].at(ax).is_partial() || !want.at(ax).is_shard()) continue;
        later += replica_numel(n.outputs[i], c.strategy.outputs[i]);
        break;
      }
    }
    return later > 2 * now;
  }

  // Elements of v in layout l per data-parallel replica (the whole value
  // less the split over the axes the rules put the batch on): a mesh with dp
  // (the run's, its graph built for every replica's rows) then decides as
  // one without (the planner's, one replica's rows).
  int64_t replica_numel(ValueId v, const Layout& l) const {
    int64_t n = g_.shape(v).numel();
    for (int ax : replica_axes_)
      if (l.at(ax).is_shard()) n /= mesh_.size(ax);
    return n;
  }

  // Whether v is a parameter's gradient: read by an optimizer update, or
  // the backward's gradient of a parameter (g.grad_of_param: what an update
  // reads in a graph with an optimizer phase; the planner prices graphs
  // without one, which must choose as the run's does), or added in the
  // backward into one (a tied weight's two gradients), read otherwise only in
  // the optimizer phase (the clipping norm).
  bool feeds_update(ValueId v, int depth = 0) {
    if (update_reads_.count(v) || param_grads_.count(v)) return true;
    if (depth > 4) return false;
    bool found = false;
    for (const auto& [id, k] : consumers_of(v)) {
      const Node& m = g_.node(id);
      if (m.phase == Phase::kOptimizer) continue;
      if (m.phase != Phase::kBackward || m.kind != OpKind::kAdd ||
          !feeds_update(m.outputs[0], depth + 1))
        return false;
      found = true;
    }
    return found;
  }

  const std::vector<std::pair<NodeId, size_t>>& consumers_of(ValueId v) {
    if (consumers_.empty()) {
      consumers_.resize(static_cast<size_t>(g_.num_values()));
      for (NodeId id = 0; id < g_.num_nodes(); ++id)
        for (size_t k = 0; k < g_.node(id).inputs.size(); ++k)
          consumers_[static_cast<size_t>(g_.node(id).inputs[k])].push_back({id, k});
    }
    return consumers_[static_cast<size_t>(v)];
  }

  // The layout output `out` would like to keep: its like-shaped input's (made
  // whole where that input is Partial); nullopt when no input is like-shaped.
  std::optional<Layout> stay_with(const Node& n, ValueId out) const {
    for (ValueId v : n.inputs) {
      if (!(g_.shape(v) == g_.shape(out))) continue;
      Layout l = current(v);
      for (int ax = 0; ax < na_; ++ax)
        if (l.at(ax).is_partial()) l = l.with(ax, Placement::Replicate());
      return l;
    }
    return std::nullopt;
  }

  // Nodes of n's phase still to be annotated (n included) that read n's
  // input `i` as their input `i` and are n's kind: the q, k and v
  // projections of one normed activation (and their weight gradients in the
  // backward), LLaMA's gate and up. Such siblings choose alike, so a
  // reshard of that input is made once and shared by all of them (the
  // lowering shares it per phase): each is charged its share. Charged whole
  // to the first, an all_gather the three need lost to each one's own cheaper
  // route, and megatron-sp's attention projections ran with gathered weights
  // and an all_to_all each instead of Megatron's one all_gather.
  int siblings(const Node& n, size_t i) {
    if (n.phase == Phase::kOptimizer) return 1;
    int count = 0;
    for (const auto& [id, k] : consumers_of(n.inputs[i])) {
      const Node& m = g_.node(id);
      count += k == i && m.kind == n.kind && m.phase == n.phase && id >= annotating_;
    }
    return std::max(1, count);
  }

  // What candidate `c` costs node n: reshards from where its inputs are (each
  // its share among `sibs` nodes), plus from where its outputs land to where
  // they are wanted. Stops adding once over `bound`.
  double candidate_cost(const Node& n, const ShardingStrategy& c, double bound,
                        const std::vector<int>& sibs) {
    double total = 0;
    for (size_t i = 0; i < n.inputs.size() && total <= bound; ++i) {
      // Free when an optimizer update will read the value there anyway, or an
      // earlier consumer in this phase already asked for it there (the
      // lowering makes each reshard once per phase and shares it).
      auto later = update_reads_.find(n.inputs[i]);
      if (later != update_reads_.end() && later->second == c.inputs[i] &&
          n.phase == Phase::kOptimizer)
        continue;
      if (requested_.count({n.inputs[i], c.inputs[i].to_string(), n.phase})) continue;
      total += cost_(g_.shape(n.inputs[i]), current(n.inputs[i]), c.inputs[i]) / double(sibs[i]);
    }
    if (n.kind == OpKind::kReshape && total <= bound) total += reshape_cost(n, c);
    for (size_t i = 0; i < n.outputs.size() && total < bound; ++i) {
      const ValueId out = n.outputs[i];
      const std::optional<Layout> w = stay_with(n, out);
      if (!o_.rules.rules.empty()) {
        // The rules' layout; on the axes they do not govern, where its
        // like-shaped input is (else where the candidate puts it, made whole).
        Layout want = with_free_axes(desired_[out], w ? *w : c.outputs[i], g_.shape(out));
        // A parameter's gradient left Partial where it is wanted whole is
        // summed by the step's gradient reduction (runtime/grad_buckets.h: one
        // all_reduce per bucket over the data axes, once per step, under the
        // backward), not by this node every micro-batch: Megatron's embedding
        // gradient under cp, reduced over its dp x cp group. Priced per
        // micro-batch, gathering the output gradient over dp (or cp) looked
        // cheaper than the table's sum, so every dp rank gathered the whole
        // batch's embedding gradient every micro-batch and computed the table's
        // gradient of all of it (a mesh the planner, dp = 1, never saw).
        if (n.phase == Phase::kBackward && c.outputs[i].has_partial() && feeds_update(out))
          for (int ax = 0; ax < na_; ++ax)
            if (c.outputs[i].at(ax).is_partial() && want.at(ax).is_replicate())
              want = want.with(ax, Placement::Partial());
        total += cost_(g_.shape(out), c.outputs[i], want);
      } else if (w) {
        // No rules: an output wishes to stay where its like-named whole input
        // is (a residual stream keeps its layout), so a reduce_scatter that
        // must be undone by an all_gather later is priced as such.
        total += cost_(g_.shape(out), c.outputs[i], *w);
      }
    }
    return total;
  }

  // Propagation: of the strategy that keeps the inputs where they are and
  // every strategy the op's rule enumerates, the one with the least reshard
  // cost (candidate_cost). Ties: in the forward, prefer whole outputs (a
  // Partial activation carried along would need its reduction where it is read).
  Found from_propagation(NodeId, const Node& n) {
    std::vector<ShardingStrategy> cands;
    {
      std::vector<Layout> ins;
      for (ValueId v : n.inputs) ins.push_back(current(v));
      auto outs = derive_output_layouts(g_, n, mesh_, ins);
      if (outs.is_ok()) cands.push_back({std::move(ins), std::move(*outs)});
    }
    for (ShardingStrategy& s : enumerate_strategies(g_, n, mesh_)) cands.push_back(std::move(s));
    if (n.kind == OpKind::kReshape) add_reshape_routes(n, &cands);
    std::vector<int> sibs(n.inputs.size());  // per input: the nodes sharing its reshard
    for (size_t i = 0; i < n.inputs.size(); ++i) sibs[i] = siblings(n, i);
    double best = kInf;
    int best_i = -1;
    bool best_partial = true;
    for (size_t c = 0; c < cands.size(); ++c) {
      const double total = candidate_cost(n, cands[c], best, sibs);
      bool partial = false;
      for (const Layout& l : cands[c].outputs) partial |= l.has_partial();
      partial &= n.phase == Phase::kForward;
      if (total < best || (total == best && best_partial && !partial && total < kInf)) {
        best = total;
        best_i = static_cast<int>(c);
        best_partial = partial;
      }
    }
    if (best_i < 0)
      return Status::invalid(node_label(n) + ": no strategy on the mesh " + mesh_.to_string() +
                             " can be reached from its inputs' layouts");
    return std::optional<Choice>(Choice{std::move(cands[best_i]), StrategySource::kPropagated, ""});
  }

  // A reshape may also read its input where it is and write its output in a
  // layout no per-rank reshape gives (reshape_layout.h): the lowering inserts
  // the cheapest route. Appended after the rule's strategies, so a route wins
  // only where it is strictly cheaper. Outputs tried: the rule's strategies',
  // the rules' wish, whole.
  void add_reshape_routes(const Node& n, std::vector<ShardingStrategy>* cands) const {
    const ValueId out = n.outputs[0];
    std::vector<Layout> outs = {Layout::Replicated(na_)};
    if (!o_.rules.rules.empty()) outs.push_back(desired_[out]);
    for (const ShardingStrategy& c : *cands) outs.push_back(c.outputs[0]);
    std::set<std::string> seen;
    for (const Layout& l : outs) {
      const Layout o = canonical(l, mesh_);
      if (o.has_partial() || !seen.insert(o.to_string()).second) continue;
      if (!divides_evenly(o, mesh_, g_.shape(out))) continue;
      cands->push_back({{current(n.inputs[0])}, {o}});
    }
  }

  // What reshape n's route from c.inputs[0] to c.outputs[0] costs: zero where
  // each rank reshapes its own block, else plan_reshape's (+ a nanosecond per
  // collective, as CostCache breaks ties).
  double reshape_cost(const Node& n, const ShardingStrategy& c) {
    const Shape& in = g_.shape(n.inputs[0]);
    const Shape& out = g_.shape(n.outputs[0]);
    const std::optional<Layout> local = reshape_block_layout(in, out, mesh_, c.inputs[0]);
    if (local && *local == canonical(c.outputs[0], mesh_)) return 0;
    const std::string key = in.to_string() + c.inputs[0].to_string() + ">" + out.to_string();
    auto it = routes_.find(key);
    if (it == routes_.end())
      it = routes_.emplace(key, ReshapeRoutes(in, out, mesh_, c.inputs[0], o_.cost)).first;
    const Result<ReshapePlan> plan = it->second.plan(c.outputs[0]);
    return plan.is_ok() ? plan->cost_s + 1e-9 * plan->num_collectives() : kInf;
  }

  // A weight's layout asked by its configured consumers (resolve_weights_from_users).
  struct UserLayout {
    Layout layout;
    NodeId by = -1;
    size_t specificity = 0;
    std::string others;  // the consumers that read it otherwise
  };

  const Graph& g_;
  const Mesh& mesh_;
  const PartitionOptions& o_;
  const int na_;
  CostCache cost_;
  std::vector<Layout> desired_;  // per value: the rules' layout
  std::vector<char> governed_;   // per mesh axis: the rules speak for it
  std::map<NodeId, ShardingStrategy> user_;
  std::map<NodeId, size_t> user_specificity_;  // SIZE_MAX: an exact name; else the glob's length
  std::map<std::string, NodeId> by_name_;      // configured forward nodes
  std::map<ValueId, UserLayout> from_user_;
  std::vector<Layout> stored_;  // per value: a source's stored layout
  std::vector<std::string> source_why_;
  std::map<ValueId, Layout> update_reads_;
  std::set<ValueId> param_grads_;  // g.grad_of_param's gradients
  std::set<std::tuple<ValueId, std::string, Phase>> requested_;
  std::vector<std::vector<std::pair<NodeId, size_t>>> consumers_;  // per value: (node, input)
  std::vector<int> replica_axes_;  // the mesh axes the rules split "batch" over
  NodeId annotating_ = 0;          // the node run() is choosing for
  std::unordered_map<std::string, ReshapeRoutes> routes_;  // by (shape of x, layout, shape of y)
  Annotation a_;
};

}  // namespace

std::string_view strategy_source_name(StrategySource s) {
  switch (s) {
    case StrategySource::kStored:
      return "source";
    case StrategySource::kOptimizer:
      return "optimizer";
    case StrategySource::kFixed:
      return "fixed";
    case StrategySource::kUser:
      return "user";
    case StrategySource::kUserGradient:
      return "user gradient";
    case StrategySource::kUpdateReads:
      return "where the update reads it";
    case StrategySource::kDeferredReduction:
      return "deferred reduction";
    case StrategySource::kRules:
      return "rules";
    case StrategySource::kPropagated:
      return "propagated";
  }
  return "?";
}

Result<Annotation> annotate(const Graph& g, const Mesh& mesh, const PartitionOptions& o) {
  return Annotator(g, mesh, o).run();
}

// ---- lowering ----

namespace {

OpKind op_of(ReshardKind k) {
  switch (k) {
    case ReshardKind::kAllGather:
      return OpKind::kAllGather;
    case ReshardKind::kReduceScatter:
      return OpKind::kReduceScatter;
    case ReshardKind::kAllReduce:
      return OpKind::kAllReduce;
    case ReshardKind::kAllToAll:
      return OpKind::kAllToAll;
    case ReshardKind::kLocalSlice:
      return OpKind::kShardSlice;
    case ReshardKind::kLocalPartial:
      return OpKind::kPartialMask;
  }
  return OpKind::kCount;
}

class Lowering {
 public:
  Lowering(const Graph& g, const Annotation& a, int rank, const ReshardCostModel& cost)
      : g_(g), a_(a), mesh_(a.mesh), rank_(rank), cost_(cost) {
    p_.mesh = a.mesh;
    p_.rank = rank;
    p_.local_of.assign(g.num_values(), kNoValue);
    if (a.groups.on()) {
      coord_ = a.mesh.coords(rank)[static_cast<size_t>(a.groups.axis)];
      for (const WeightGroups::Member& m : a.groups.members) member_of_update_[m.update] = &m;
    }
  }

  Result<LocalProgram> run() {
    for (NodeId id = 0; id < g_.num_nodes(); ++id) MF_RETURN_IF_ERROR(lower_node(id));
    // What the trainer reads is whole on every rank.
    Graph& lg = p_.graph;
    const Layout rep = Layout::Replicated(mesh_.num_axes());
    if (g_.loss != kNoValue) {
      MF_ASSIGN_OR_RETURN(lg.loss, get(g_.loss, rep, g_.producer(g_.loss)));
    }
    // Scalars (metrics, grad_norm) are made whole; larger outputs (logits)
    // stay where they are: a rank reads its own block.
    for (const auto& [name, v] : g_.outputs) {
      if (g_.value(v).dtype != DType::F32 || g_.shape(v).numel() != 1) {
        lg.outputs[name] = p_.local_of[v];
        continue;
      }
      MF_ASSIGN_OR_RETURN(lg.outputs[name], get(v, rep, g_.producer(v)));
    }
    for (const auto& [param, grad] : g_.grad_of_param) {
      const ValueId lgrad =
          grad_as_accumulated_.count(grad) ? grad_as_accumulated_[grad] : p_.local_of[grad];
      lg.grad_of_param[p_.local_of[param]] = lgrad;
    }
    MF_RETURN_IF_ERROR(
        verify(lg).with_context("partitioned program (rank " + std::to_string(rank_) + ")"));
    return std::move(p_);
  }

  // ZeRO-2/3: a parameter's gradient is reduce-scattered as soon as it is
  // final (in the backward), and the accumulation over micro-batches keeps
  // only the shard. Set up by the caller from the update nodes.
  std::map<ValueId, Layout> early_grad;  // global grad -> the layout the update reads it in

 private:
  int add(Node n, std::vector<Value> outs, ValueId global, const std::vector<Layout>& layouts) {
    Graph& lg = p_.graph;
    n.outputs.clear();  // the global graph's ids; add_node assigns the local ones
    // The op's own shape rule must agree with the shapes the layouts give.
    std::vector<Value> check;
    Status s = op_def(n.kind).infer(lg, n, &check);
    MF_CHECK(s.is_ok()) << "partition: " << node_label(n) << ": " << s.message();
    MF_CHECK_EQ(check.size(), outs.size()) << node_label(n);
    for (size_t i = 0; i < outs.size(); ++i)
      MF_CHECK(check[i].shape.same_sizes(outs[i].shape))
          << "partition: " << node_label(n) << " output " << i << ": layouts give "
          << outs[i].shape.to_string() << ", the op gives " << check[i].shape.to_string();
    NodeId id = lg.add_node(std::move(n), outs);
    const Node& added = lg.node(id);
    for (size_t i = 0; i < added.outputs.size(); ++i) {
      p_.global_of.push_back(i == 0 ? global : kNoValue);
      p_.layout.push_back(layouts[i]);
    }
    return id;
  }

  Result<Shape> local(const Shape& s, const Layout& l) { return local_shape(s, mesh_, l); }

  // Emits a reshard plan's steps on `cur` (a local value of global v) for
  // `consumer`: one node per step, in the consumer's phase and layer.
  Result<ValueId> emit_steps(ValueId v, ValueId cur, const ReshardPlan& plan,
                             const Node& consumer) {
    return emit_steps(g_.value(v).name, g_.shape(v), g_.value(v).dtype, v, cur, plan, consumer);
  }
  // The same for a value the lowering made (global = kNoValue), by name and global shape.
  Result<ValueId> emit_steps(const std::string& value, const Shape& shape, DType dtype,
                             ValueId global, ValueId cur, const ReshardPlan& plan,
                             const Node& consumer) {
    for (const ReshardStep& st : plan.steps) {
      Node c;
      c.kind = op_of(st.kind);
      c.name =
          value + "/" + std::string(op_name(c.kind)) + "(" + mesh_.axis_name(st.mesh_axis) + ")";
      c.inputs = {cur};
      c.attrs.mesh_axis = st.mesh_axis;
      c.attrs.group_size = mesh_.size(st.mesh_axis);
      switch (st.kind) {
        case ReshardKind::kAllGather:
          c.attrs.axes = {st.src_dim};
          break;
        case ReshardKind::kReduceScatter:
        case ReshardKind::kLocalSlice:
          c.attrs.axes = {st.dst_dim};
          break;
        case ReshardKind::kAllToAll:
          c.attrs.axes = {st.src_dim, st.dst_dim};
          break;
        default:
          break;
      }
      c.phase = consumer.phase;
      c.layer = consumer.layer;
      MF_ASSIGN_OR_RETURN(Shape out, local(shape, st.after));
      const NodeId id = add(c, {out_value(out, dtype)}, global, {st.after});
      cur = p_.graph.node(id).outputs[0];
      if (st.is_collective())
        p_.collectives.push_back({id, c.kind, value, consumer.name, consumer.phase,
                                  mesh_.axis_name(st.mesh_axis), st.before, st.after,
                                  st.bytes_per_rank});
    }
    return cur;
  }

  // The local value of global v in layout dst, reshard nodes emitted as needed
  // (one set per consumer phase: a forward all_gather is not kept alive for the backward).
  Result<ValueId> get(ValueId v, const Layout& dst, const Node& consumer) {
    // ZeRO-2/3: in the optimizer phase a gradient is its accumulated shard
    // (reduce-scattered in the backward), not the last micro-batch's sum.
    if (consumer.phase == Phase::kOptimizer) {
      if (auto acc = grad_as_accumulated_.find(v); acc != grad_as_accumulated_.end()) {
        const Layout& shard = early_grad.at(v);
        if (shard == dst) return acc->second;
        auto key = std::make_tuple(v, "acc" + dst.to_string(), static_cast<int>(Phase::kOptimizer));
        if (auto it = cache_.find(key); it != cache_.end()) return it->second;
        MF_ASSIGN_OR_RETURN(ReshardPlan plan, reshard(g_.shape(v), shard, dst));
        MF_ASSIGN_OR_RETURN(ValueId cur, emit_steps(v, acc->second, plan, consumer));
        cache_[key] = cur;
        return cur;
      }
    }
    const Layout& src = a_.produced(g_, v);
    if (src == dst) return p_.local_of[v];
    // A reduction of a Partial forward value is kept for the backward (the
    // backward would otherwise reduce the same sum again); gathers are redone.
    // Only between the training phases: metric nodes do not run in training.
    const bool training = consumer.phase == Phase::kForward || consumer.phase == Phase::kBackward;
    const Phase phase = training && src.has_partial() && g_.producer(v).phase == Phase::kForward
                            ? Phase::kForward
                            : consumer.phase;
    auto key = std::make_tuple(v, dst.to_string(), static_cast<int>(phase));
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    MF_ASSIGN_OR_RETURN(ReshardPlan plan, reshard(g_.shape(v), src, dst));
    MF_ASSIGN_OR_RETURN(ValueId cur, emit_steps(v, p_.local_of[v], plan, consumer));
    cache_[key] = cur;
    return cur;
  }

  // clip_coef reads only the sum of its inputs (the squared norms of the
  // gradients). The Partial ones (shard sums of squares of split gradients:
  // ZeRO, tensor parallel) are made Partial alike on every axis any of them is
  // Partial on (R -> P is a local mask), added locally, and reduced together:
  // one all_reduce per such mesh axis, not one per parameter. The local node
  // reads that sum and the inputs that were whole.
  Result<std::vector<ValueId>> clip_inputs(const Node& n, const ShardingStrategy& st) {
    std::vector<ValueId> ins;
    std::vector<size_t> partial;
    Layout sum_layout = Layout::Replicated(mesh_.num_axes());
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const ValueId v = n.inputs[i];
      const Layout& src = a_.produced(g_, v);
      if (src.has_partial() && st.inputs[i].is_replicated() && g_.shape(v).numel() == 1) {
        partial.push_back(i);
        for (int ax = 0; ax < mesh_.num_axes(); ++ax)
          if (src.at(ax).is_partial()) sum_layout = sum_layout.with(ax, Placement::Partial());
        continue;
      }
      MF_ASSIGN_OR_RETURN(ValueId lv, get(v, st.inputs[i], n));
      ins.push_back(lv);
    }
    if (partial.size() == 1) {
      MF_ASSIGN_OR_RETURN(ValueId lv, get(n.inputs[partial[0]], st.inputs[partial[0]], n));
      ins.push_back(lv);
    }
    if (partial.size() <= 1) return ins;
    const ValueId v0 = n.inputs[partial[0]];
    const Shape& shape = g_.shape(v0);
    const DType dtype = g_.value(v0).dtype;
    const std::string name = n.name + "/sum";
    ValueId sum = kNoValue;
    for (size_t k = 0; k < partial.size(); ++k) {
      const ValueId v = n.inputs[partial[k]];
      MF_ASSIGN_OR_RETURN(ReshardPlan mask, reshard(shape, a_.produced(g_, v), sum_layout));
      MF_ASSIGN_OR_RETURN(ValueId part,
                          emit_steps(g_.value(v).name, shape, dtype, v, p_.local_of[v], mask, n));
      if (sum == kNoValue) {
        sum = part;
        continue;
      }
      Node plus;
      plus.kind = OpKind::kAdd;
      plus.name = name + "." + std::to_string(k);
      plus.inputs = {sum, part};
      plus.phase = n.phase;
      plus.layer = n.layer;
      Value out = out_value(shape, dtype);
      out.name = plus.name;
      sum = p_.graph.node(add(plus, {out}, kNoValue, {sum_layout})).outputs[0];
    }
    MF_ASSIGN_OR_RETURN(ReshardPlan plan,
                        reshard(shape, sum_layout, Layout::Replicated(mesh_.num_axes())));
    MF_ASSIGN_OR_RETURN(ValueId reduced, emit_steps(name, shape, dtype, kNoValue, sum, plan, n));
    ins.push_back(reduced);
    return ins;
  }

  ValueId loss_count() {
    if (count_ != kNoValue) return count_;
    Node in;
    in.kind = OpKind::kInput;
    in.name = "loss_count";
    in.attrs.shape = Shape{};
    const NodeId id =
        add(in, {out_value(Shape{})}, kNoValue, {Layout::Replicated(mesh_.num_axes())});
    count_ = p_.graph.node(id).outputs[0];
    p_.added_inputs.push_back("loss_count");
    return count_;
  }

  // Parameter `param` := local value `cur` (an updated copy), in update n's phase.
  void emit_assign(ValueId param, ValueId cur, const Node& n) {
    Node as;
    as.kind = OpKind::kAssign;
    as.name = g_.value(param).name + "/assign";
    as.inputs = {p_.local_of[param], cur};
    as.phase = n.phase;
    as.layer = n.layer;
    add(as, {}, kNoValue, {});
  }

  // ---- weights grouping (parallel/weight_groups.h) ----

  // A grouped parameter's optimizer state lives on its owner only: that is
  // the memory weights grouping saves.
  bool held_here(ValueId state) const {
    const int owner = a_.groups.owner_of(state);
    return owner < 0 || owner == coord_;
  }

  // The node as without grouping, except: another group's optimizer state is
  // not stored here, another group's update not run here; after the last
  // update, every parameter comes from its owner (emit_broadcasts).
  Status lower_node(NodeId id) {
    const WeightGroups& wg = a_.groups;
    if (!wg.on()) return emit_node(id);
    const Node& n = g_.node(id);
    if (n.kind == OpKind::kState && !held_here(n.outputs[0])) return Status::ok();
    auto m = member_of_update_.find(id);
    if (m == member_of_update_.end()) return emit_node(id);
    if (m->second->owner == coord_) {
      MF_RETURN_IF_ERROR(emit_node(id));
    } else {
      // Another rank's update: its other inputs are read as the owner reads
      // them (the same reshards: collectives match by order on every rank).
      const ShardingStrategy& st = a_.node[id];
      const std::vector<ValueId>& states = m->second->states;
      for (size_t i = 0; i < n.inputs.size(); ++i)
        if (std::find(states.begin(), states.end(), n.inputs[i]) == states.end())
          MF_RETURN_IF_ERROR(get(n.inputs[i], st.inputs[i], n).status());
    }
    return id == wg.members.back().update ? emit_broadcasts() : Status::ok();
  }

  // After every owner has updated its group (in parallel: that is the
  // optimizer time saved), each parameter, in the graph order of the
  // updates, is broadcast in place from its owner over the group axis.
  // Every rank emits the same sequence.
  Status emit_broadcasts() {
    const WeightGroups& wg = a_.groups;
    const int size = mesh_.size(wg.axis);
    for (const WeightGroups::Member& m : wg.members) {
      const Node& u = g_.node(m.update);
      const ValueId local = p_.local_of[m.param];
      const Value& lv = p_.graph.value(local);
      const Layout& l = a_.produced(g_, m.param);
      Node b;
      b.kind = OpKind::kBroadcast;
      b.name = g_.value(m.param).name + "/broadcast(" + mesh_.axis_name(wg.axis) + ")";
      b.inputs = {local};
      b.attrs.mesh_axis = wg.axis;
      b.attrs.group_size = size;
      b.attrs.ints = {m.owner};
      b.phase = u.phase;
      b.layer = u.layer;
      const NodeId bid = add(b, {}, kNoValue, {});
      const double bytes = static_cast<double>(lv.shape.numel() * dtype_size(lv.dtype));
      p_.collectives.push_back(
          {bid, OpKind::kBroadcast, g_.value(m.param).name, u.name, u.phase,
           mesh_.axis_name(wg.axis), l, l,
           static_cast<int64_t>(collective_bytes_per_rank(Collective::kBroadcast, size, bytes) +
                                0.5)});
    }
    return Status::ok();
  }

  Status emit_node(NodeId id) {
    const Node& n = g_.node(id);
    const ShardingStrategy& st = a_.node[id];
    Node ln = n;
    ln.inputs.clear();
    if (n.inputs.empty()) {  // a source: local storage; a shard knows where it sits
      const ValueId v = n.outputs[0];
      const Layout& l = st.outputs[0];
      MF_ASSIGN_OR_RETURN(Shape s, local(g_.shape(v), l));
      ln.attrs.shape = s;
      set_shard_offsets(ln.attrs, g_.shape(v), l, mesh_, rank_);
      Value out = out_value(s, g_.value(v).dtype);
      out.name = g_.value(v).name;
      const NodeId lid = add(ln, {out}, v, {l});
      p_.local_of[v] = p_.graph.node(lid).outputs[0];
      return Status::ok();
    }
    if (n.kind == OpKind::kClipCoef && a_.one_norm_reduction) {
      MF_ASSIGN_OR_RETURN(ln.inputs, clip_inputs(n, st));
    } else {
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        MF_ASSIGN_OR_RETURN(ValueId lv, get(n.inputs[i], st.inputs[i], n));
        ln.inputs.push_back(lv);
      }
    }
    // A reshape whose layouts no per-rank reshape connects runs between the
    // layouts of its cheapest route (reshape_layout.h): the reshards of its
    // input here, of its output after it.
    std::optional<ReshapePlan> route;
    if (n.kind == OpKind::kReshape) {
      MF_ASSIGN_OR_RETURN(ReshapePlan plan, reshape_plan(n, st));
      if (!plan.is_local()) {
        MF_ASSIGN_OR_RETURN(ln.inputs[0], emit_steps(n.inputs[0], ln.inputs[0], plan.before, n));
        route = std::move(plan);
      }
    }
    const std::vector<Layout> out_layouts =
        route ? std::vector<Layout>{route->local_out} : st.outputs;
    std::vector<Value> outs;
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const ValueId v = n.outputs[i];
      MF_ASSIGN_OR_RETURN(Shape s, local(g_.shape(v), out_layouts[i]));
      Value out = out_value(s, g_.value(v).dtype);
      out.name = g_.value(v).name;
      outs.push_back(out);
    }
    // attrs.shape is always an output's target shape (reshape, broadcast_to,
    // sum_to, slice_grad, embedding_grad): its local one.
    if (n.attrs.shape.rank() > 0 && !outs.empty()) ln.attrs.shape = outs[0].shape;
    // The op's own local attributes (OpDef::local_attrs): offsets of the
    // shard, the mesh axes its kernel reduces over, a global target count.
    LocalAttrsCall call{g_, n, st.inputs, st.outputs, mesh_, rank_, ln.attrs};
    set_local_attrs(call);
    if (call.add_loss_count) ln.inputs.push_back(loss_count());
    // The update of a parameter stored whole but updated as a shard (ZeRO-1/2):
    // update a sliced copy, then gather it back into the parameter.
    const bool write_back = is_update(n.kind) && a_.produced(g_, n.inputs[0]) != st.inputs[0];
    const NodeId lid = add(ln, outs, outs.empty() ? kNoValue : n.outputs[0], out_layouts);
    for (size_t i = 0; i < n.outputs.size(); ++i)
      p_.local_of[n.outputs[i]] = p_.graph.node(lid).outputs[i];
    if (route) {
      MF_ASSIGN_OR_RETURN(p_.local_of[n.outputs[0]],
                          emit_steps(n.outputs[0], p_.local_of[n.outputs[0]], route->after, n));
    }
    // The collectives its kernel runs inside itself (op_def.h), recorded like
    // the inserted ones: a partial sum per rank reduced to the whole.
    for (const InnerCollective& ic : inner_collectives(p_.graph, p_.graph.node(lid))) {
      const Layout whole = Layout::Replicated(mesh_.num_axes());
      const int64_t bytes = static_cast<int64_t>(
          collective_bytes_per_rank(collective_of(ic.kind), mesh_.size(ic.mesh_axis),
                                    double(ic.elements) * sizeof(float)) +
          0.5);
      // A reduction goes from a partial sum per rank to the whole; a halo
      // exchange keeps its value split (it moves the borders between blocks).
      const Layout split = ic.dim >= 0 ? whole.with(ic.mesh_axis, Placement::Shard(ic.dim)) : whole;
      p_.collectives.push_back(
          {lid, ic.kind, n.name + " " + ic.what, n.name + " (in its kernel)", n.phase,
           mesh_.axis_name(ic.mesh_axis),
           ic.dim >= 0 ? split : whole.with(ic.mesh_axis, Placement::Partial()),
           ic.dim >= 0 ? split : whole, bytes});
    }
    if (write_back) {
      // The updated shard is the value get() produced for input 0: bring it
      // back to the parameter's layout and assign.
      const ValueId param = n.inputs[0];
      const ValueId shard = ln.inputs[0];
      const Layout& whole = a_.produced(g_, param);
      // Treat the updated shard as a fresh value in st.inputs[0] and reshard it.
      MF_ASSIGN_OR_RETURN(ReshardPlan plan, reshard(g_.shape(param), st.inputs[0], whole));
      MF_ASSIGN_OR_RETURN(ValueId cur, emit_steps(param, shard, plan, n));
      emit_assign(param, cur, n);
    }
    // ZeRO-2/3: reduce-scatter a parameter's final gradient right away.
    for (ValueId v : n.outputs) {
      auto it = early_grad.find(v);
      if (it == early_grad.end()) continue;
      // The reshard runs in the producer's phase (backward).
      MF_ASSIGN_OR_RETURN(ValueId shard, get(v, it->second, n));
      grad_as_accumulated_[v] = shard;  // get() reads it for optimizer-phase consumers
    }
    return Status::ok();
  }

  const Graph& g_;
  const Annotation& a_;
  // The reshard planner's cheapest plan, once per (shape, src, dst): a
  // program has many values of a few shapes moving between the same layouts.
  Result<ReshardPlan> reshard(const Shape& shape, const Layout& src, const Layout& dst) {
    std::string key = shape.to_string() + src.to_string() + ">" + dst.to_string();
    if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    if (cost_.plans) {
      if (std::optional<ReshardPlan> kept = cost_.plans->find(key))
        return plans_.emplace(std::move(key), std::move(*kept)).first->second;
    }
    Result<ReshardPlan> plan = plan_reshard(shape, mesh_, src, dst, cost_);
    if (plan.is_ok()) {
      if (cost_.plans) cost_.plans->put(key, *plan);
      plans_.emplace(std::move(key), *plan);
    }
    return plan;
  }
  // The same for a reshape node's route (reshape_layout.h).
  Result<ReshapePlan> reshape_plan(const Node& n, const ShardingStrategy& st) {
    const Shape& in = g_.shape(n.inputs[0]);
    const Shape& out = g_.shape(n.outputs[0]);
    std::string key = in.to_string() + st.inputs[0].to_string() + ">" + out.to_string() +
                      st.outputs[0].to_string();
    if (auto it = reshape_plans_.find(key); it != reshape_plans_.end()) return it->second;
    Result<ReshapePlan> plan = plan_reshape(in, out, mesh_, st.inputs[0], st.outputs[0], cost_);
    if (!plan.is_ok()) return plan.status().with_context(node_label(n));
    reshape_plans_.emplace(std::move(key), *plan);
    return plan;
  }

  const Mesh& mesh_;
  int rank_;
  const ReshardCostModel& cost_;
  LocalProgram p_;
  std::unordered_map<std::string, ReshardPlan> plans_;
  std::unordered_map<std::string, ReshapePlan> reshape_plans_;
  std::map<std::tuple<ValueId, std::string, int>, ValueId> cache_;
  std::map<ValueId, ValueId> grad_as_accumulated_;
  ValueId count_ = kNoValue;
  int coord_ = -1;  // weights grouping: this rank's coordinate on the group axis
  std::map<NodeId, const WeightGroups::Member*> member_of_update_;
};

}  // namespace

Result<LocalProgram> lower(const Graph& g, const Annotation& a, int rank,
                           const ReshardCostModel& cost) {
  if (static_cast<int>(a.node.size()) != g.num_nodes())
    return Status::invalid("annotation has " + std::to_string(a.node.size()) +
                           " node strategies, the graph " + std::to_string(g.num_nodes()) +
                           " nodes");
  if (rank < 0 || rank >= a.mesh.num_ranks())
    return Status::invalid("rank " + std::to_string(rank) + " is not on the mesh " +
                           a.mesh.to_string() + " (ranks 0.." +
                           std::to_string(a.mesh.num_ranks() - 1) + ")");
  Lowering l(g, a, rank, cost);
  // ZeRO-2/3: a gradient is reduce-scattered as soon as it is final (in the
  // backward), so accumulation over micro-batches keeps only the shard.
  if (a.zero_stage >= 2) {
    for (NodeId id = 0; id < g.num_nodes(); ++id) {
      const Node& n = g.node(id);
      if (!is_update(n.kind) || n.inputs.size() < 2) continue;
      const ValueId grad = n.inputs[1];
      if (g.producer(grad).phase == Phase::kBackward) l.early_grad[grad] = a.node[id].inputs[1];
    }
  }
  return l.run();
}

int runs_per_step(const CollectiveRecord& c, int micro_batches) {
  switch (c.phase) {
    case Phase::kForward:
    case Phase::kBackward:
      return micro_batches;
    case Phase::kOptimizer:
      return 1;
    case Phase::kMetric:
      return 0;
  }
  return 0;
}

// ---- blocks of whole tensors ----

namespace {
// Copies the box `ranges` between a whole tensor and a block, row by row.
void copy_box(const Shape& whole, const std::vector<std::pair<int64_t, int64_t>>& ranges,
              size_t elem, char* w, char* b, bool to_block) {
  const int r = whole.rank();
  if (r == 0) {
    to_block ? std::memcpy(b, w, elem) : std::memcpy(w, b, elem);
    return;
  }
  std::vector<int64_t> len(r), stride(r, 1);
  for (int d = 0; d < r; ++d) len[d] = ranges[d].second - ranges[d].first;
  for (int d = r - 2; d >= 0; --d) stride[d] = stride[d + 1] * whole.size(d + 1);
  int64_t rows = 1;
  for (int d = 0; d < r - 1; ++d) rows *= len[d];
  std::vector<int64_t> idx(r, 0);
  const size_t row_bytes = static_cast<size_t>(len[r - 1]) * elem;
  for (int64_t i = 0; i < rows; ++i) {
    int64_t off = ranges[r - 1].first;
    for (int d = 0; d < r - 1; ++d) off += (idx[d] + ranges[d].first) * stride[d];
    char* wp = w + off * elem;
    char* bp = b + i * row_bytes;
    to_block ? std::memcpy(bp, wp, row_bytes) : std::memcpy(wp, bp, row_bytes);
    for (int d = r - 2; d >= 0; --d) {
      if (++idx[d] < len[d]) break;
      idx[d] = 0;
    }
  }
}
}  // namespace

Tensor local_block(const Tensor& whole, const Mesh& mesh, const Layout& layout, int rank) {
  MF_CHECK(!layout.has_partial()) << "a Partial layout has no blocks";
  Shape s = value_or_throw(local_shape(whole.shape(), mesh, layout));
  Tensor out(s, whole.dtype());
  copy_box(whole.shape(), local_ranges(whole.shape(), mesh, layout, rank),
           dtype_size(whole.dtype()), const_cast<char*>(static_cast<const char*>(whole.raw())),
           static_cast<char*>(out.raw()), true);
  return out;
}

void place_block(const Tensor& block, const Mesh& mesh, const Layout& layout, int rank,
                 Tensor* whole) {
  MF_CHECK(!layout.has_partial()) << "a Partial layout has no blocks";
  copy_box(whole->shape(), local_ranges(whole->shape(), mesh, layout, rank),
           dtype_size(whole->dtype()), static_cast<char*>(whole->raw()),
           const_cast<char*>(static_cast<const char*>(block.raw())), false);
}

// ---- random strategies (property tests) ----

ValueId shard_parameter(Builder& b, const std::string& name, const Shape& whole, const Mesh& mesh,
                        const Layout& layout, int rank, Init init) {
  const Shape local = value_or_throw(local_shape(whole, mesh, layout));
  const ValueId p = b.parameter(name, local, init);
  Node& n = b.graph().mutable_node(b.graph().value(p).producer);
  for (const auto& range : local_ranges(whole, mesh, layout, rank))
    n.attrs.global_offset.push_back(range.first);
  for (int d = 0; d < whole.rank(); ++d) n.attrs.global_dims.push_back(whole.size(d));
  return p;
}

PartitionOptions random_strategies(const Graph& g, const Mesh& mesh, uint64_t seed) {
  std::mt19937_64 rng(seed);
  PartitionOptions o;
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (n.kind == OpKind::kState || is_update(n.kind)) continue;  // follow their parameter
    std::vector<ShardingStrategy> all = enumerate_strategies(g, n, mesh);
    if (all.empty()) continue;
    std::uniform_int_distribution<size_t> pick(0, all.size() - 1);
    ShardingStrategy st = all[pick(rng)];
    if (n.inputs.empty()) {
      // Inputs fed by the trainer and scalars stay whole half the time.
      o.source_layouts[n.outputs[0]] = st.outputs[0];
    } else {
      o.fixed[id] = std::move(st);
    }
  }
  return o;
}

}  // namespace meshflow
