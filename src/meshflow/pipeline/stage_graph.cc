#include "meshflow/pipeline/stage_graph.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "meshflow/core/check.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/verify.h"

namespace meshflow {

namespace {

// Inputs fed once per step (not per micro-batch): never stashed.
bool step_constant(const std::string& name) {
  return name == "loss_scale" || name == "lr" || name == "step" || name.rfind("pp.sumsq.", 0) == 0;
}

std::string chunk_str(int c) {
  return "chunk " + std::to_string(c);
}

}  // namespace

std::vector<ValueId> ChunkProgram::keep_alive() const {
  std::vector<ValueId> v;
  for (const auto* list : {&act_out, &grad_out, &stash, &weight_stash})
    v.insert(v.end(), list->begin(), list->end());
  for (const auto& [name, id] : norm_out) v.push_back(id);
  if (correct != kNoValue) v.push_back(correct);
  return v;
}

int64_t ChunkProgram::stash_bytes() const {
  int64_t b = 0;
  for (ValueId v : stash)
    b += graph.shape(v).numel() * static_cast<int64_t>(dtype_size(graph.value(v).dtype));
  return b;
}

std::vector<char> ChunkProgram::stash_in_place() const {
  std::set<ValueId> read_elsewhere(act_out.begin(), act_out.end());
  read_elsewhere.insert(grad_out.begin(), grad_out.end());
  for (const auto& [name, v] : norm_out) read_elsewhere.insert(v);
  read_elsewhere.insert(loss);
  read_elsewhere.insert(correct);
  std::vector<char> out(stash.size(), 0);
  for (size_t i = 0; i < stash.size(); ++i) {
    const ValueId v = stash[i];
    const NodeId p = graph.value(v).producer;
    const OpKind k = p >= 0 ? graph.node(p).kind : OpKind::kInput;
    out[i] = k != OpKind::kInput && k != OpKind::kParameter && k != OpKind::kState &&
             !read_elsewhere.count(v);
  }
  return out;
}

int64_t ChunkProgram::weight_hold_bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < stash.size(); ++i)
    if (i < stash_for_weight.size() && stash_for_weight[i])
      b += graph.shape(stash[i]).numel() *
           static_cast<int64_t>(dtype_size(graph.value(stash[i]).dtype));
  for (ValueId v : weight_stash)
    b += graph.shape(v).numel() * static_cast<int64_t>(dtype_size(graph.value(v).dtype));
  return b;
}

Result<std::vector<int>> layers_per_chunk(int num_layers, int num_chunks,
                                          const std::vector<int64_t>& requested) {
  if (num_chunks < 1)
    return Status::invalid("pipeline: the number of model chunks must be >= 1, got " +
                           std::to_string(num_chunks));
  std::vector<int> out;
  if (!requested.empty()) {
    if (static_cast<int>(requested.size()) != num_chunks)
      return Status::invalid("pipeline.layers_per_stage has " + std::to_string(requested.size()) +
                             " entries, but the pipeline has " + std::to_string(num_chunks) +
                             " model chunks (stages x virtual_stages); give one entry per chunk");
    int64_t sum = 0;
    for (size_t i = 0; i < requested.size(); ++i) {
      if (requested[i] < 1)
        return Status::invalid("pipeline.layers_per_stage[" + std::to_string(i) + "] is " +
                               std::to_string(requested[i]) +
                               ": every stage needs at least one layer");
      sum += requested[i];
      out.push_back(static_cast<int>(requested[i]));
    }
    if (sum != num_layers)
      return Status::invalid("pipeline.layers_per_stage sums to " + std::to_string(sum) +
                             " layers, but the model has " + std::to_string(num_layers) +
                             " layers; the entries must add up to " + std::to_string(num_layers));
    return out;
  }
  if (num_layers < num_chunks)
    return Status::invalid("the model has " + std::to_string(num_layers) +
                           " layers, fewer than the " + std::to_string(num_chunks) +
                           " pipeline chunks (stages x virtual_stages); every chunk needs at "
                           "least one layer, so use at most " +
                           std::to_string(num_layers) + " chunks");
  for (int c = 0; c < num_chunks; ++c)
    out.push_back(num_layers / num_chunks + (c < num_layers % num_chunks ? 1 : 0));
  return out;
}

// Per-node time proxy for balancing: FLOPs plus bytes at a CPU-like machine
// balance (about 10 FLOPs per byte: SGEMM ~300 GFLOP/s over ~27 GB/s measured
// here, docs/cluster.md), so memory-bound ops count too.
constexpr double kFlopsPerByte = 10.0;

std::vector<int64_t> balanced_layers(const Graph& g, int num_chunks) {
  int num_layers = 0;
  for (const Node& n : g.nodes()) num_layers = std::max(num_layers, n.layer + 1);
  if (num_layers < num_chunks || num_chunks < 1) return {};
  // Cost of each block (forward + backward), and of what runs outside the
  // blocks before them (embedding, its gradient: chunk 0) and after them
  // (final norm, head, loss: the last chunk).
  std::vector<double> cost(num_layers, 0.0);
  double pre = 0, post = 0;
  int first_fwd = -1, first_bwd = -1;
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (n.layer < 0) continue;
    if (n.phase == Phase::kForward && first_fwd < 0) first_fwd = id;
    if (n.phase == Phase::kBackward && first_bwd < 0) first_bwd = id;
  }
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (n.inputs.empty() || n.phase == Phase::kOptimizer || n.phase == Phase::kMetric) continue;
    const OpCost c = op_cost(g, n);
    const double t = c.flops + kFlopsPerByte * c.bytes;
    if (n.layer >= 0) {
      cost[n.layer] += t;
    } else if (n.phase == Phase::kForward) {
      (id < first_fwd ? pre : post) += t;
    } else {  // the backward runs the head's gradient first, the embedding's last
      (first_bwd >= 0 && id < first_bwd ? post : pre) += t;
    }
  }
  // Contiguous split minimizing the largest chunk (linear partition, DP).
  const int L = num_layers, K = num_chunks;
  std::vector<double> prefix(L + 1, 0.0);
  for (int l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + cost[l];
  auto chunk = [&](int k, int a, int b) {  // layers [a, b) as chunk k
    return prefix[b] - prefix[a] + (k == 0 ? pre : 0.0) + (k == K - 1 ? post : 0.0);
  };
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][l]: the least max over chunks 0..k-1 covering layers [0, l).
  std::vector<std::vector<double>> best(K + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> cut(K + 1, std::vector<int>(L + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= K; ++k)
    for (int l = k; l <= L - (K - k); ++l)
      for (int a = k - 1; a < l; ++a) {
        const double v = std::max(best[k - 1][a], chunk(k - 1, a, l));
        if (v < best[k][l]) {
          best[k][l] = v;
          cut[k][l] = a;
        }
      }
  std::vector<int64_t> out(K);
  for (int k = K, l = L; k >= 1; l = cut[k][l], --k) out[k - 1] = l - cut[k][l];
  return out;
}

namespace {

constexpr int kSkip = -2, kAll = -3, kPending = -4;  // node_chunk_ beyond a chunk index

// split_pipeline(): each node is given a chunk (forward and backward by their
// block's layer, the rest with what they read or what reads them), then the
// messages between neighbouring chunks, the tied parameters and the gradient
// norm's exchange order are found, and each chunk's program is copied out.
class Splitter {
 public:
  Splitter(const Graph& g, int num_chunks) : g_(g), num_chunks_(num_chunks) {}

  Result<PipelineSplit> run(const std::vector<int64_t>& requested) {
    // No layers_per_stage: balance the blocks by their cost (not their count).
    const std::vector<int64_t> layers =
        requested.empty() ? balanced_layers(g_, num_chunks_) : requested;
    for (const Node& n : g_.nodes()) split_.num_layers = std::max(split_.num_layers, n.layer + 1);
    if (split_.num_layers == 0)
      return Status::invalid(
          "pipeline: the model has no layer-tagged blocks (node.layer), so it cannot be split "
          "into stages");
    MF_ASSIGN_OR_RETURN(per_chunk_, layers_per_chunk(split_.num_layers, num_chunks_, layers));
    for (int c = 0; c < num_chunks_; ++c)
      for (int i = 0; i < per_chunk_[c]; ++i) chunk_of_layer_.push_back(c);
    MF_RETURN_IF_ERROR(assign_chunks());
    place_pending();
    find_tied();
    MF_RETURN_IF_ERROR(find_messages());
    find_norm_order();
    int first_layer = 0;
    for (int k = 0; k < num_chunks_; ++k) {
      MF_ASSIGN_OR_RETURN(ChunkProgram cp, chunk_program(k, first_layer));
      first_layer += per_chunk_[k];
      split_.chunks.push_back(std::move(cp));
    }
    return std::move(split_);
  }

 private:
  void place(NodeId id, int c) {
    node_chunk_[id] = c;
    for (ValueId v : g_.node(id).outputs) value_chunk_[v] = c;
  }

  // Each node's chunk in graph order: forward and backward nodes by their
  // layer (outside the blocks: with the chunk of what they read), optimizer
  // nodes with the gradient they read, the clip coefficient in every chunk,
  // metrics in none; nodes that read only sources are left pending.
  Status assign_chunks() {
    const int nn = g_.num_nodes();
    node_chunk_.assign(nn, -1);
    value_chunk_.assign(g_.num_values(), -1);
    std::map<ValueId, ValueId> param_of_grad;
    for (const auto& [p, grad] : g_.grad_of_param) param_of_grad[grad] = p;
    for (NodeId id = 0; id < nn; ++id) {
      const Node& n = g_.node(id);
      if (is_source(n.kind)) continue;
      int c = -1;
      // The latest / earliest chunk among the inputs' producers (-1: none, all sources).
      int in_max = -1, in_min = -1;
      for (ValueId v : n.inputs) {
        const int vc = value_chunk_[v];
        if (vc < 0) continue;
        in_max = std::max(in_max, vc);
        in_min = in_min < 0 ? vc : std::min(in_min, vc);
      }
      if (n.phase == Phase::kMetric) {
        // With what it reads (the logits' chunk); run only by evaluation.
        c = in_max >= 0 ? in_max : kPending;
      } else if (in_max < 0 && n.kind != OpKind::kClipCoef &&
                 (n.layer < 0 || n.phase == Phase::kOptimizer)) {
        // Reads only sources (an embedding lookup, a partitioned program's
        // gather of a stored parameter shard, the loss seed): placed with its
        // readers, by place_pending().
        c = kPending;
      } else if (n.phase == Phase::kForward) {
        c = n.layer >= 0 ? chunk_of_layer_[n.layer] : std::max(0, in_max);
        if (in_max > c)
          for (ValueId v : n.inputs)
            if (value_chunk_[v] > c)
              return Status::invalid("pipeline: forward node " + node_label(n) + " (layer " +
                                     std::to_string(n.layer) + ", " + chunk_str(c) +
                                     ") reads a value made in " + chunk_str(value_chunk_[v]) +
                                     "; layers must feed forward in index order");
      } else if (n.phase == Phase::kBackward) {
        c = n.layer >= 0 ? chunk_of_layer_[n.layer] : in_min;
      } else if (n.kind == OpKind::kClipCoef) {
        c = kAll;
      } else {  // optimizer: the chunk of the gradient it reads (or of what it reads)
        for (ValueId v : n.inputs)
          if (param_of_grad.count(v)) c = value_chunk_[v];
        if (c < 0) c = in_max;
        MF_CHECK_GE(c, 0) << "optimizer node " << node_label(n) << " reads nothing of a chunk";
      }
      place(id, c);
    }
    return Status::ok();
  }

  // Pending nodes go where their readers are (resolved readers first: reverse
  // order): a forward value to its earliest reader's chunk (it flows on to
  // later ones), a backward value to the latest (it flows to earlier ones).
  // A pending node whose readers are pending too, or that has none (a ZeRO
  // write-back: slice -> update, slice -> all_gather -> assign), then goes
  // with its inputs once they are placed; repeated until nothing changes.
  void place_pending() {
    const int nn = g_.num_nodes();
    std::vector<std::vector<NodeId>> readers(g_.num_values());
    for (NodeId id = 0; id < nn; ++id)
      for (ValueId v : g_.node(id).inputs) readers[v].push_back(id);
    for (bool changed = true; changed;) {
      changed = false;
      for (NodeId id = nn - 1; id >= 0; --id) {
        if (node_chunk_[id] != kPending) continue;
        const Node& n = g_.node(id);
        int c = -1;
        for (ValueId v : n.outputs)
          for (NodeId r : readers[v]) {
            const int rc = node_chunk_[r];
            if (rc < 0) continue;
            c = c < 0 ? rc : (n.phase == Phase::kBackward ? std::max(c, rc) : std::min(c, rc));
          }
        if (c >= 0) place(id, c), changed = true;
      }
      for (NodeId id = 0; id < nn; ++id) {
        if (node_chunk_[id] != kPending) continue;
        int c = -1;
        for (ValueId v : g_.node(id).inputs) c = std::max(c, value_chunk_[v]);
        if (c >= 0) place(id, c), changed = true;
      }
    }
    for (NodeId id = 0; id < nn; ++id)
      if (node_chunk_[id] == kPending)
        place(id, g_.node(id).phase == Phase::kBackward ? num_chunks_ - 1 : 0);
  }

  // Parameters read by forward or backward nodes of two chunks (tied
  // embeddings; in a partitioned program also a ZeRO-3 shard gathered by one
  // chunk for the forward and by another for the backward): every reading
  // chunk holds a copy; the gradient's chunk owns the update.
  void find_tied() {
    std::map<ValueId, std::set<int>> param_chunks;
    for (NodeId id = 0; id < g_.num_nodes(); ++id) {
      const Node& n = g_.node(id);
      if (n.phase == Phase::kOptimizer || is_source(n.kind) || node_chunk_[id] < 0) continue;
      for (ValueId v : n.inputs)
        if (g_.producer(v).kind == OpKind::kParameter) param_chunks[v].insert(node_chunk_[id]);
    }
    for (const auto& [p, chunks] : param_chunks) {
      if (chunks.size() < 2) continue;
      auto gi = g_.grad_of_param.find(p);
      if (gi == g_.grad_of_param.end()) continue;  // not trained: the copies never change
      PipelineSplit::Tied t{g_.value(p).name, value_chunk_[gi->second], {}};
      MF_CHECK_GE(t.owner, 0) << "gradient of tied parameter '" << t.name << "' has no chunk";
      for (int c : chunks)
        if (c != t.owner) t.copies.push_back(c);
      split_.tied.push_back(std::move(t));
    }
  }

  // Messages: act_[b] goes chunk b -> b+1, grad_[b] goes chunk b+1 -> b. A
  // value that cannot flow that way (a forward node reading a later chunk's
  // value) is an error naming both.
  Status find_messages() {
    act_.assign(num_chunks_, {});
    grad_.assign(num_chunks_, {});
    for (NodeId id = 0; id < g_.num_nodes(); ++id) {
      const Node& n = g_.node(id);
      const int c = node_chunk_[id];
      if (c < 0 || n.phase == Phase::kOptimizer) continue;
      for (ValueId v : n.inputs) {
        const int vc = value_chunk_[v];
        if (vc < 0 || vc == c) continue;
        const bool fwd_value = g_.producer(v).phase == Phase::kForward;
        if (fwd_value && vc < c) {
          for (int b = vc; b < c; ++b) act_[b].insert(v);
        } else if (!fwd_value && vc > c && n.phase == Phase::kBackward) {
          for (int b = c; b < vc; ++b) grad_[b].insert(v);
        } else {
          return Status::invalid("pipeline: " + std::string(phase_name(n.phase)) + " node " +
                                 node_label(n) + " in " + chunk_str(c) + " reads " +
                                 std::string(phase_name(g_.producer(v).phase)) + " value '" +
                                 g_.value(v).name + "' of " + chunk_str(vc) +
                                 ", which cannot flow there through the pipeline");
        }
      }
    }
    return Status::ok();
  }

  // The value a reshard node reads, or kNoValue when v is not a reshard's output.
  ValueId reshard_input(ValueId v) const {
    const Node& p = g_.producer(v);
    return (is_collective(p.kind) || p.kind == OpKind::kShardSlice) && p.inputs.size() == 1
               ? p.inputs[0]
               : kNoValue;
  }

  // The clip node's inputs, in its order, give the norm exchange order.
  // (A partitioned program reduces the sums of squares, and the gradients
  // before them, with collectives: walk back to the gradient.)
  void find_norm_order() {
    for (NodeId id = 0; id < g_.num_nodes(); ++id)
      if (g_.node(id).kind == OpKind::kClipCoef) clip_id_ = id;
    if (clip_id_ < 0) return;
    // Every value a parameter's gradient (as the optimizer reads it) is resharded from.
    std::map<ValueId, ValueId> param_of_grad_chain;
    for (const auto& [p, gr] : g_.grad_of_param)
      for (ValueId v = gr; v != kNoValue; v = reshard_input(v)) param_of_grad_chain[v] = p;
    for (ValueId sq : g_.node(clip_id_).inputs) {
      ValueId v = sq;
      while (g_.producer(v).kind != OpKind::kSumSquares) {
        v = reshard_input(v);
        MF_CHECK_NE(v, kNoValue) << "pipeline split: clip input '" << g_.value(sq).name
                                 << "' is no sum of squares";
      }
      v = g_.producer(v).inputs[0];
      while (v != kNoValue && !param_of_grad_chain.count(v)) v = reshard_input(v);
      MF_CHECK_NE(v, kNoValue) << "pipeline split: clip input '" << g_.value(sq).name
                               << "' is no gradient's sum of squares";
      norm_name_[sq] = g_.value(param_of_grad_chain.at(v)).name;
      split_.norm_order.push_back(norm_name_[sq]);
    }
  }

  // Chunk k's program: its boundary inputs, a copy of each of its nodes (and
  // of the sources they read), its boundary outputs, roles, then the
  // backward's input/weight split and the stash.
  Result<ChunkProgram> chunk_program(int k, int first_layer) {
    ChunkProgram cp;
    cp.chunk = k;
    cp.first_layer = first_layer;
    cp.num_layers = per_chunk_[k];
    Graph& out = cp.graph;
    std::vector<ValueId> map(g_.num_values(), kNoValue);
    auto boundary = [&](ValueId v, const std::string& prefix, Phase phase) {
      Node in;
      in.kind = OpKind::kInput;
      in.name = prefix + std::to_string(v);
      in.phase = phase;
      in.attrs.shape = g_.shape(v);
      Value type = g_.value(v);
      type.name = in.name;
      NodeId id = out.add_node(in, {type});
      return map[v] = out.node(id).outputs[0];
    };
    if (k > 0)
      for (ValueId v : act_[k - 1]) cp.act_in.push_back(boundary(v, "pp.act.", Phase::kForward));
    for (ValueId v : grad_[k]) cp.grad_in.push_back(boundary(v, "pp.grad.", Phase::kBackward));
    for (NodeId id = 0; id < g_.num_nodes(); ++id)
      if (node_chunk_[id] == k || node_chunk_[id] == kAll) copy_node(id, k, map, cp);
    for (ValueId v : act_[k]) cp.act_out.push_back(map[v]);
    if (k > 0)
      for (ValueId v : grad_[k - 1]) cp.grad_out.push_back(map[v]);
    if (clip_id_ >= 0)
      for (ValueId sq : g_.node(clip_id_).inputs)
        if (value_chunk_[sq] == k) cp.norm_out.push_back({norm_name_.at(sq), map[sq]});
    for (ValueId v : cp.act_out) MF_CHECK_NE(v, kNoValue);
    for (ValueId v : cp.grad_out) MF_CHECK_NE(v, kNoValue);
    if (g_.loss != kNoValue && map[g_.loss] != kNoValue) out.loss = cp.loss = map[g_.loss];
    if (g_.outputs.count("correct") && map[g_.outputs.at("correct")] != kNoValue)
      out.outputs["correct"] = cp.correct = map[g_.outputs.at("correct")];
    for (const auto& [p, gr] : g_.grad_of_param)
      if (map[p] != kNoValue && map[gr] != kNoValue) out.grad_of_param[map[p]] = map[gr];
    if (g_.outputs.count("grad_norm") && map[g_.outputs.at("grad_norm")] != kNoValue)
      out.outputs["grad_norm"] = map[g_.outputs.at("grad_norm")];
    const std::vector<char> is_w = split_backward(cp);
    find_stash(cp, is_w);
    Status s = verify(out);
    if (!s.is_ok())
      return Status::internal("pipeline " + chunk_str(k) +
                              " graph failed verification: " + s.message());
    return cp;
  }

  // Copies node id into chunk k's graph (map: global value -> chunk value),
  // with the sources it reads and, for the clip node, an input per other
  // chunk's sum of squares; files it under its phase.
  void copy_node(NodeId id, int k, std::vector<ValueId>& map, ChunkProgram& cp) {
    const Node& n = g_.node(id);
    Graph& out = cp.graph;
    Node copy = n;
    for (ValueId& v : copy.inputs) {
      if (map[v] == kNoValue) {
        const Node& src = g_.producer(v);
        if (is_source(src.kind)) {
          Node s = src;
          NodeId sid = out.add_node(s, {g_.value(v)});
          map[v] = out.node(sid).outputs[0];
        } else if (n.kind == OpKind::kClipCoef) {
          const std::string pname = norm_name_.at(v);
          Node in;
          in.kind = OpKind::kInput;
          in.name = "pp.sumsq." + pname;
          in.phase = Phase::kOptimizer;
          NodeId sid = out.add_node(in, {Value{in.name, Shape{}, DType::F32}});
          map[v] = out.node(sid).outputs[0];
          cp.norm_in.push_back({pname, map[v]});
        } else {
          MF_CHECK(false) << "pipeline split: " << node_label(n) << " in " << chunk_str(k)
                          << " reads '" << g_.value(v).name << "' (made by " << node_label(src)
                          << " in " << chunk_str(node_chunk_[g_.value(v).producer])
                          << ") with no route";
        }
      }
      v = map[v];
    }
    std::vector<Value> types;
    for (ValueId v : n.outputs) types.push_back(g_.value(v));
    NodeId nid = out.add_node(copy, types);
    for (size_t i = 0; i < n.outputs.size(); ++i) map[n.outputs[i]] = out.node(nid).outputs[i];
    switch (n.phase) {
      case Phase::kForward:
        cp.forward.push_back(nid);
        break;
      case Phase::kBackward:
        cp.backward.push_back(nid);
        break;
      case Phase::kMetric:
        cp.metric.push_back(nid);
        break;
      default:  // before the clip node: the sums of squares (and what they read)
        (id < clip_id_ ? cp.sum_squares : cp.update).push_back(nid);
        break;
    }
  }

  // Bi / W: walk the backward in reverse; a node is W when nothing but W
  // nodes (and the optimizer) reads its outputs and none is sent on. Returns
  // per chunk node: is W.
  static std::vector<char> split_backward(ChunkProgram& cp) {
    const Graph& out = cp.graph;
    const std::set<ValueId> sent(cp.grad_out.begin(), cp.grad_out.end());
    std::vector<char> is_w(out.num_nodes(), 0);
    std::vector<std::vector<NodeId>> readers(out.num_values());
    for (NodeId id : cp.backward)
      for (ValueId v : out.node(id).inputs) readers[v].push_back(id);
    for (auto it = cp.backward.rbegin(); it != cp.backward.rend(); ++it) {
      bool w = true;
      for (ValueId v : out.node(*it).outputs) {
        if (sent.count(v)) w = false;
        for (NodeId r : readers[v]) w = w && is_w[r];
      }
      is_w[*it] = w;
    }
    for (NodeId id : cp.backward) (is_w[id] ? cp.backward_weight : cp.backward_input).push_back(id);
    return is_w;
  }

  // Stash: what the backward reads that the forward (or the inputs fed with
  // it) produced; and, zb, what W reads that Bi produced.
  static void find_stash(ChunkProgram& cp, const std::vector<char>& is_w) {
    const Graph& out = cp.graph;
    const std::set<ValueId> grad_in(cp.grad_in.begin(), cp.grad_in.end());
    std::map<ValueId, std::pair<bool, bool>> use;  // value -> (read by Bi, read by W)
    std::set<ValueId> weight_stash;
    for (NodeId id : cp.backward) {
      for (ValueId v : out.node(id).inputs) {
        const Node& src = out.producer(v);
        const bool fed =
            src.kind == OpKind::kInput && !step_constant(src.name) && !grad_in.count(v);
        if (fed || (!is_source(src.kind) && src.phase == Phase::kForward))
          (is_w[id] ? use[v].second : use[v].first) = true;
        const bool made_by_bi =
            !is_source(src.kind) && src.phase == Phase::kBackward && !is_w[out.value(v).producer];
        if (is_w[id] && (grad_in.count(v) || made_by_bi)) weight_stash.insert(v);
      }
    }
    for (const auto& [v, u] : use) {
      cp.stash.push_back(v);
      cp.stash_for_input.push_back(u.first);
      cp.stash_for_weight.push_back(u.second);
    }
    cp.weight_stash.assign(weight_stash.begin(), weight_stash.end());
  }

  const Graph& g_;
  const int num_chunks_;
  std::vector<int> per_chunk_;                 // layers per chunk
  std::vector<int> chunk_of_layer_;            // per layer
  std::vector<int> node_chunk_;                // per node: its chunk, or kSkip / kAll
  std::vector<int> value_chunk_;               // per value: its producer's chunk
  std::vector<std::set<ValueId>> act_, grad_;  // find_messages()
  NodeId clip_id_ = -1;
  std::map<ValueId, std::string> norm_name_;  // clip input -> parameter name
  PipelineSplit split_;
};

}  // namespace

Result<PipelineSplit> split_pipeline(const Graph& g, int num_chunks,
                                     const std::vector<int64_t>& requested) {
  return Splitter(g, num_chunks).run(requested);
}

}  // namespace meshflow
