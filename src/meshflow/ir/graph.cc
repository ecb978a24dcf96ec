#include "meshflow/ir/graph.h"

#include <set>
#include <sstream>

#include "meshflow/core/check.h"
#include "meshflow/ops/op_def.h"

namespace meshflow {

std::string_view phase_name(Phase p) {
  switch (p) {
    case Phase::kForward:
      return "fwd";
    case Phase::kBackward:
      return "bwd";
    case Phase::kOptimizer:
      return "opt";
    case Phase::kMetric:
      return "metric";
  }
  return "?";
}

NodeId Graph::add_node(Node node, const std::vector<Value>& output_types) {
  NodeId id = static_cast<NodeId>(nodes_.size());
  node.outputs.clear();
  for (size_t i = 0; i < output_types.size(); ++i) {
    Value v = output_types[i];
    v.producer = id;
    v.output_index = static_cast<int>(i);
    if (v.name.empty()) v.name = i == 0 ? node.name : node.name + ":" + std::to_string(i);
    node.outputs.push_back(static_cast<ValueId>(values_.size()));
    values_.push_back(std::move(v));
  }
  nodes_.push_back(std::move(node));
  return id;
}

namespace {
std::vector<ValueId> outputs_of(const std::vector<Node>& nodes, OpKind kind) {
  std::vector<ValueId> r;
  for (const Node& n : nodes)
    if (n.kind == kind) r.push_back(n.outputs[0]);
  return r;
}
}  // namespace

std::vector<ValueId> Graph::parameters() const {
  return outputs_of(nodes_, OpKind::kParameter);
}
std::vector<ValueId> Graph::inputs() const {
  return outputs_of(nodes_, OpKind::kInput);
}
std::vector<ValueId> Graph::states() const {
  return outputs_of(nodes_, OpKind::kState);
}

ValueId Graph::find(const std::string& value_name) const {
  for (const Node& n : nodes_) {
    if (n.kind != OpKind::kParameter && n.kind != OpKind::kInput && n.kind != OpKind::kState)
      continue;
    if (values_[n.outputs[0]].name == value_name) return n.outputs[0];
  }
  return kNoValue;
}

Status verify(const Graph& g) {
  std::vector<char> defined(g.num_values(), 0);
  std::vector<char> mutated(g.num_values(), 0);
  std::set<std::string> source_names;
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    const OpDef& def = op_def(n.kind);
    std::string where = "node " + std::to_string(id) + " " + node_label(n);
    if (def.num_inputs >= 0 && static_cast<int>(n.inputs.size()) != def.num_inputs)
      return Status::internal(where + ": has " + std::to_string(n.inputs.size()) +
                              " inputs, op takes " + std::to_string(def.num_inputs));
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      ValueId v = n.inputs[i];
      if (v < 0 || v >= g.num_values() || !defined[v])
        return Status::internal(where + ": input " + std::to_string(i) + " (%" + std::to_string(v) +
                                ") is not defined before use");
      if (mutated[v])
        return Status::internal(where + ": reads %" + std::to_string(v) + " '" + g.value(v).name +
                                "' after an optimizer op updated it");
    }
    for (ValueId v : n.outputs) {
      if (g.value(v).producer != id) return Status::internal(where + ": output producer mismatch");
      defined[v] = 1;
    }
    if (n.inputs.empty() && !n.outputs.empty()) {
      const std::string& name = g.value(n.outputs[0]).name;
      if (!source_names.insert(name).second)
        return Status::internal(where + ": duplicate source name '" + name + "'");
    }
    if (def.infer && !n.outputs.empty()) {
      std::vector<Value> expect;
      Status s = def.infer(g, n, &expect);
      if (!s.is_ok()) return s.with_context(where);
      if (expect.size() != n.outputs.size())
        return Status::internal(where + ": output count differs from its shape rule");
      for (size_t i = 0; i < expect.size(); ++i) {
        const Value& got = g.value(n.outputs[i]);
        if (!expect[i].shape.same_sizes(got.shape) || expect[i].dtype != got.dtype)
          return Status::internal(where + ": output " + std::to_string(i) + " is " +
                                  got.shape.to_string() + " but its shape rule gives " +
                                  expect[i].shape.to_string());
      }
    }
    // A mutated source (parameter, state) is not read again: every reader
    // means the value of this step. A transient updated in place (a ZeRO
    // shard copy) is written through: its later readers read the new value.
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if ((def.mutates & (1u << i)) && g.producer(n.inputs[i]).inputs.empty())
        mutated[n.inputs[i]] = 1;
  }
  if (g.loss != kNoValue && g.shape(g.loss).numel() != 1)
    return Status::internal("loss value must be a scalar, got " + g.shape(g.loss).to_string());
  return Status::ok();
}

void debug_verify(const Graph& g, const char* pass) {
#ifndef NDEBUG
  Status s = verify(g);
  MF_CHECK(s.is_ok()) << "graph invalid after pass '" << pass << "': " << s.message();
#else
  (void)g;
  (void)pass;
#endif
}

std::string print_node(const Graph& g, const Node& n) {
  std::ostringstream os;
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    if (i) os << ", ";
    const Value& v = g.value(n.outputs[i]);
    os << "%" << n.outputs[i] << ":" << dtype_name(v.dtype) << v.shape.to_string();
  }
  if (!n.outputs.empty()) os << " = ";
  os << op_name(n.kind) << "(";
  for (size_t i = 0; i < n.inputs.size(); ++i) os << (i ? ", %" : "%") << n.inputs[i];
  os << ") \"" << n.name << "\" {" << phase_name(n.phase);
  if (n.layer >= 0) os << ", layer " << n.layer;
  os << "}";
  return os.str();
}

std::string print(const Graph& g) {
  std::ostringstream os;
  for (const Node& n : g.nodes()) os << print_node(g, n) << "\n";
  return os.str();
}

}  // namespace meshflow
