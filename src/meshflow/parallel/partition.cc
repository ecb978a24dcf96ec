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

}  // namespace

Result<Annotation> annotate(const Graph& g, const Mesh& mesh, const PartitionOptions& o) {
  MF_RETURN_IF_ERROR(o.rules.check(mesh));
  if (o.zero_stage < 0 || o.zero_stage > 3)
    return Status::invalid("zero stage " + std::to_string(o.zero_stage) +
                           " is not one of 0, 1, 2, 3");
  if (o.zero_stage > 0 && (o.zero_axis < 0 || o.zero_axis >= mesh.num_axes()))
    return Status::invalid("ZeRO needs the data-parallel mesh axis; the mesh " + mesh.to_string() +
                           " has axes 0.." + std::to_string(mesh.num_axes() - 1));
  const int na = mesh.num_axes();
  std::vector<Layout> desired(g.num_values(), Layout::Replicated(na));
  if (!o.rules.rules.empty()) {
    for (ValueId v = 0; v < g.num_values(); ++v) {
      auto l = apply_rules(o.rules, mesh, g.shape(v));
      if (!l.is_ok())
        return l.status().with_context(node_label(g.producer(v)) + ": value '" + g.value(v).name +
                                       "'");
      desired[v] = *l;
    }
  }
  CostCache cost(mesh, o.cost);

  // User split tuples, resolved per node.
  std::map<NodeId, ShardingStrategy> user;
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (n.inputs.empty() || n.name.empty()) continue;
    for (const auto& [pattern, text] : o.strategies) {
      if (pattern != n.name && !glob_match(pattern, n.name)) continue;
      MF_ASSIGN_OR_RETURN(ShardingStrategy st, strategy_from_splits(g, id, mesh, text));
      user[id] = std::move(st);
      break;
    }
  }

  // Sharding propagation's first principle (../shared/seeds/003): a weight
  // without a layout of its own takes the one its configured consumer reads.
  std::map<ValueId, Layout> from_user;
  for (const auto& [id, st] : user) {
    const Node& n = g.node(id);
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (g.producer(n.inputs[i]).kind == OpKind::kParameter && !from_user.count(n.inputs[i]))
        from_user[n.inputs[i]] = st.inputs[i];
  }
  // Stored layouts of the sources. Optimizer state follows its parameter
  // (the update mutates both in place, so they must be split alike).
  std::vector<Layout> stored(g.num_values(), Layout::Replicated(na));
  std::vector<char> is_param(g.num_values(), 0);
  for (const Node& n : g.nodes()) {
    if (!n.inputs.empty()) continue;
    const ValueId v = n.outputs[0];
    const NodeId id = g.value(v).producer;
    Layout l = desired[v];
    if (o.rules.rules.empty() && from_user.count(v)) l = from_user[v];
    if (auto it = o.source_layouts.find(v); it != o.source_layouts.end()) {
      l = it->second;
    } else if (auto f = o.fixed.find(id); f != o.fixed.end() && !f->second.outputs.empty()) {
      l = f->second.outputs[0];
    }
    if (l.num_axes() != na)
      return Status::invalid(node_label(n) + ": layout " + l.to_string() + " has " +
                             std::to_string(l.num_axes()) + " entries, the mesh " +
                             mesh.to_string() + " has " + std::to_string(na) + " axes");
    MF_RETURN_IF_ERROR(validate(l, mesh, g.shape(v)).with_context(node_label(n)));
    if (n.kind == OpKind::kParameter) {
      is_param[v] = 1;
      if (o.zero_stage >= 3) l = zero_shard(l, g.shape(v), mesh, o.zero_axis);
    }
    stored[v] = l;
  }
  // The layout an update runs in: its parameter's, split over the ZeRO axis from stage 1.
  auto update_layout = [&](const Node& n) {
    const ValueId p = n.inputs[0];
    return o.zero_stage >= 1 ? zero_shard(stored[p], g.shape(p), mesh, o.zero_axis) : stored[p];
  };
  for (const Node& n : g.nodes()) {
    if (!is_update(n.kind)) continue;
    const Layout l = update_layout(n);
    for (size_t i = 1; i < n.inputs.size(); ++i)
      if ((op_def(n.kind).mutates >> i) & 1u) stored[n.inputs[i]] = l;
  }

  // Where optimizer updates will read their (non-source) inputs: the gradients.
  std::map<ValueId, Layout> update_reads;
  for (const Node& n : g.nodes())
    if (is_update(n.kind))
      for (size_t i = 0; i < n.inputs.size(); ++i)
        if (!g.producer(n.inputs[i]).inputs.empty()) update_reads[n.inputs[i]] = update_layout(n);

  Annotation a;
  a.mesh = mesh;
  a.zero_stage = o.zero_stage;
  a.node.resize(g.num_nodes());
  a.why.resize(g.num_nodes());
  auto current = [&](ValueId v) -> const Layout& { return a.produced(g, v); };
  // Reshards asked for so far, by (value, layout, phase): a later consumer
  // reading the same value in the same layout shares them.
  std::set<std::tuple<ValueId, std::string, Phase>> requested;
  auto note_requests = [&](NodeId id) {
    const Node& n = g.node(id);
    for (size_t i = 0; i < n.inputs.size() && i < a.node[id].inputs.size(); ++i)
      if (!(a.node[id].inputs[i] == current(n.inputs[i])))
        requested.insert({n.inputs[i], a.node[id].inputs[i].to_string(), n.phase});
  };
  for (NodeId id = 0; id < g.num_nodes(); note_requests(id), ++id) {
    const Node& n = g.node(id);
    ShardingStrategy& st = a.node[id];
    if (n.inputs.empty()) {
      st.outputs = {stored[n.outputs[0]]};
      a.why[id] = "source";
      continue;
    }
    if (is_update(n.kind)) {
      const Layout l = update_layout(n);
      for (ValueId v : n.inputs)
        st.inputs.push_back(
            g.shape(v).numel() == 1 && g.shape(v).rank() == 0 ? Layout::Replicated(na) : l);
      MF_RETURN_IF_ERROR(validate_strategy(g, n, mesh, st.inputs, st.outputs));
      a.why[id] = "optimizer";
      continue;
    }
    if (auto f = o.fixed.find(id); f != o.fixed.end()) {
      MF_RETURN_IF_ERROR(validate_strategy(g, n, mesh, f->second.inputs, f->second.outputs));
      st = f->second;
      a.why[id] = "fixed";
      continue;
    }
    if (auto u = user.find(id); u != user.end()) {
      st = u->second;
      a.why[id] = "user";
      continue;
    }
    // In the backward, a Partial input the node is linear in stays Partial:
    // the reduction is deferred to where a value must be whole (three partial
    // gradient sums added first cost one all_reduce, not three). Not in the
    // forward: a Partial activation would be reduced again for the backward.
    if (n.phase != Phase::kForward) {
      bool partial_in = false;
      std::vector<Layout> ins;
      for (ValueId v : n.inputs) {
        ins.push_back(current(v));
        partial_in |= ins.back().has_partial();
      }
      if (partial_in) {
        auto outs = derive_output_layouts(g, n, mesh, ins);
        if (outs.is_ok()) {
          st.inputs = std::move(ins);
          st.outputs = std::move(*outs);
          a.why[id] = "deferred reduction";
          continue;
        }
      }
    }
    // The rules' wish: every input in its dim-name layout.
    if (!o.rules.rules.empty()) {
      std::vector<Layout> ins;
      for (ValueId v : n.inputs) ins.push_back(desired[v]);
      auto outs = derive_output_layouts(g, n, mesh, ins);
      if (outs.is_ok()) {
        st.inputs = std::move(ins);
        st.outputs = std::move(*outs);
        a.why[id] = "rules";
        continue;
      }
    }
    // Propagation: the strategy with the least reshard cost from where the
    // inputs are, plus from where the outputs land to where the rules want them.
    // The layout an output would like to keep: its like-shaped input's (made
    // whole where that input is Partial).
    std::optional<Layout> wish;
    auto stay_with = [&](const Node& n, ValueId out) -> const Layout* {
      for (ValueId v : n.inputs) {
        if (!(g.shape(v) == g.shape(out))) continue;
        Layout l = current(v);
        for (int ax = 0; ax < na; ++ax)
          if (l.at(ax).is_partial()) l = l.with(ax, Placement::Replicate());
        wish = l;
        return &*wish;
      }
      return nullptr;
    };
    std::vector<ShardingStrategy> cands;
    {
      std::vector<Layout> ins;
      for (ValueId v : n.inputs) ins.push_back(current(v));
      auto outs = derive_output_layouts(g, n, mesh, ins);
      if (outs.is_ok()) cands.push_back({std::move(ins), std::move(*outs)});
    }
    for (ShardingStrategy& s : enumerate_strategies(g, n, mesh)) cands.push_back(std::move(s));
    double best = kInf;
    int best_i = -1;
    bool best_partial = true;
    for (size_t c = 0; c < cands.size(); ++c) {
      double total = 0;
      for (size_t i = 0; i < n.inputs.size() && total <= best; ++i) {
        // Free when an optimizer update will read the value there anyway, or
        // an earlier consumer in this phase already asked for it there (the
        // lowering makes each reshard once per phase and shares it).
        auto later = update_reads.find(n.inputs[i]);
        if (later != update_reads.end() && later->second == cands[c].inputs[i] &&
            n.phase == Phase::kOptimizer)
          continue;
        if (requested.count({n.inputs[i], cands[c].inputs[i].to_string(), n.phase})) continue;
        total += cost(g.shape(n.inputs[i]), current(n.inputs[i]), cands[c].inputs[i]);
      }
      if (!o.rules.rules.empty()) {
        for (size_t i = 0; i < n.outputs.size() && total < best; ++i)
          total += cost(g.shape(n.outputs[i]), cands[c].outputs[i], desired[n.outputs[i]]);
      } else {
        // No rules: an output wishes to stay where its like-named whole input
        // is (a residual stream keeps its layout), so a reduce_scatter that
        // must be undone by an all_gather later is priced as such.
        for (size_t i = 0; i < n.outputs.size() && total < best; ++i)
          if (const Layout* w = stay_with(n, n.outputs[i]))
            total += cost(g.shape(n.outputs[i]), cands[c].outputs[i], *w);
      }
      // Ties: in the forward, prefer whole outputs (a Partial activation
      // carried along would need its reduction where it is read).
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
      return Status::invalid(node_label(n) + ": no strategy on the mesh " + mesh.to_string() +
                             " can be reached from its inputs' layouts");
    st = std::move(cands[best_i]);
    a.why[id] = "propagated";
  }
  return a;
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

  void set_offsets(Attrs& at, const Shape& global, const Layout& l) {
    if (l.is_replicated() || !l.has_partial()) {
      bool sharded = false;
      for (int d = 0; d < global.rank(); ++d) sharded |= l.shard_count(d, mesh_) > 1;
      if (!sharded) return;
    }
    at.global_dims.clear();
    at.global_offset.clear();
    auto ranges = local_ranges(global, mesh_, l, rank_);
    for (int d = 0; d < global.rank(); ++d) {
      at.global_dims.push_back(global.size(d));
      at.global_offset.push_back(ranges[d].first);
    }
  }

  // Emits a reshard plan's steps on `cur` (a local value of global v) for
  // `consumer`: one node per step, in the consumer's phase and layer.
  Result<ValueId> emit_steps(ValueId v, ValueId cur, const ReshardPlan& plan,
                             const Node& consumer) {
    for (const ReshardStep& st : plan.steps) {
      Node c;
      c.kind = op_of(st.kind);
      c.name = g_.value(v).name + "/" + std::string(op_name(c.kind)) + "(" +
               mesh_.axis_name(st.mesh_axis) + ")";
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
      MF_ASSIGN_OR_RETURN(Shape out, local(g_.shape(v), st.after));
      const NodeId id = add(c, {out_value(out, g_.value(v).dtype)}, v, {st.after});
      cur = p_.graph.node(id).outputs[0];
      if (st.is_collective())
        p_.collectives.push_back({id, c.kind, g_.value(v).name, consumer.name, consumer.phase,
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
        MF_ASSIGN_OR_RETURN(ReshardPlan plan, plan_reshard(g_.shape(v), mesh_, shard, dst, cost_));
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
    MF_ASSIGN_OR_RETURN(ReshardPlan plan, plan_reshard(g_.shape(v), mesh_, src, dst, cost_));
    MF_ASSIGN_OR_RETURN(ValueId cur, emit_steps(v, p_.local_of[v], plan, consumer));
    cache_[key] = cur;
    return cur;
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

  Status lower_node(NodeId id) {
    const Node& n = g_.node(id);
    const ShardingStrategy& st = a_.node[id];
    Node ln = n;
    ln.inputs.clear();
    if (n.inputs.empty()) {  // a source: local storage; a shard knows where it sits
      const ValueId v = n.outputs[0];
      const Layout& l = st.outputs[0];
      MF_ASSIGN_OR_RETURN(Shape s, local(g_.shape(v), l));
      ln.attrs.shape = s;
      set_offsets(ln.attrs, g_.shape(v), l);
      Value out = out_value(s, g_.value(v).dtype);
      out.name = g_.value(v).name;
      const NodeId lid = add(ln, {out}, v, {l});
      p_.local_of[v] = p_.graph.node(lid).outputs[0];
      return Status::ok();
    }
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      MF_ASSIGN_OR_RETURN(ValueId lv, get(n.inputs[i], st.inputs[i], n));
      ln.inputs.push_back(lv);
    }
    std::vector<Value> outs;
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const ValueId v = n.outputs[i];
      MF_ASSIGN_OR_RETURN(Shape s, local(g_.shape(v), st.outputs[i]));
      Value out = out_value(s, g_.value(v).dtype);
      out.name = g_.value(v).name;
      outs.push_back(out);
    }
    // attrs.shape is always an output's target shape (reshape, broadcast_to,
    // sum_to, slice_grad, embedding_grad): its local one.
    if (n.attrs.shape.rank() > 0 && !outs.empty()) ln.attrs.shape = outs[0].shape;
    switch (n.kind) {
      case OpKind::kDropout:
      case OpKind::kDropoutGrad:
      case OpKind::kRope:
        set_offsets(ln.attrs, g_.shape(n.outputs[0]), st.outputs[0]);
        break;
      case OpKind::kEmbedding:  // vocab-parallel: the table's row offset
        set_offsets(ln.attrs, g_.shape(n.inputs[0]), st.inputs[0]);
        break;
      case OpKind::kEmbeddingGrad:
        set_offsets(ln.attrs, g_.shape(n.outputs[0]), st.outputs[0]);
        break;
      case OpKind::kCrossEntropy:
      case OpKind::kCrossEntropyGrad: {
        const Shape& logits = g_.shape(n.inputs[0]);
        bool rows_sharded = false;
        for (int d = 0; d + 1 < logits.rank(); ++d)
          rows_sharded |= st.inputs[0].shard_count(d, mesh_) > 1;
        if (rows_sharded) ln.inputs.push_back(loss_count());
        // Vocab-parallel: the kernel reduces over the axes splitting V.
        ln.attrs.ints.clear();
        for (int ax : st.inputs[0].shard_axes(logits.rank() - 1)) ln.attrs.ints.push_back(ax);
        if (!ln.attrs.ints.empty()) set_offsets(ln.attrs, logits, st.inputs[0]);
        break;
      }
      default:
        break;
    }
    // The update of a parameter stored whole but updated as a shard (ZeRO-1/2):
    // update a sliced copy, then gather it back into the parameter.
    const bool write_back = is_update(n.kind) && a_.produced(g_, n.inputs[0]) != st.inputs[0];
    const NodeId lid = add(ln, outs, outs.empty() ? kNoValue : n.outputs[0], st.outputs);
    for (size_t i = 0; i < n.outputs.size(); ++i)
      p_.local_of[n.outputs[i]] = p_.graph.node(lid).outputs[i];
    if (write_back) {
      // The updated shard is the value get() produced for input 0: bring it
      // back to the parameter's layout and assign.
      const ValueId param = n.inputs[0];
      const ValueId shard = ln.inputs[0];
      const Layout& whole = a_.produced(g_, param);
      // Treat the updated shard as a fresh value in st.inputs[0] and reshard it.
      MF_ASSIGN_OR_RETURN(ReshardPlan plan,
                          plan_reshard(g_.shape(param), mesh_, st.inputs[0], whole, cost_));
      MF_ASSIGN_OR_RETURN(ValueId cur, emit_steps(param, shard, plan, n));
      Node as;
      as.kind = OpKind::kAssign;
      as.name = g_.value(param).name + "/assign";
      as.inputs = {p_.local_of[param], cur};
      as.phase = n.phase;
      as.layer = n.layer;
      add(as, {}, kNoValue, {});
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
  const Mesh& mesh_;
  int rank_;
  const ReshardCostModel& cost_;
  LocalProgram p_;
  std::map<std::tuple<ValueId, std::string, int>, ValueId> cache_;
  std::map<ValueId, ValueId> grad_as_accumulated_;
  ValueId count_ = kNoValue;
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
