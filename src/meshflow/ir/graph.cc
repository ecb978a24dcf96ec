#include "meshflow/ir/graph.h"

#include <set>
#include <sstream>

#include "meshflow/core/check.h"

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

std::vector<ValueId> Graph::buffers() const {
  std::vector<char> read(values_.size(), 0);
  for (const Node& n : nodes_)
    if (n.phase == Phase::kForward)
      for (ValueId v : n.inputs) read[v] = 1;
  std::vector<ValueId> out;
  for (ValueId v : states())
    if (read[v]) out.push_back(v);
  return out;
}

std::vector<ValueId> Graph::model_values() const {
  std::vector<ValueId> out = parameters();
  const std::vector<ValueId> b = buffers();
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

ValueId Graph::find(const std::string& value_name) const {
  for (const Node& n : nodes_) {
    if (n.kind != OpKind::kParameter && n.kind != OpKind::kInput && n.kind != OpKind::kState)
      continue;
    if (values_[n.outputs[0]].name == value_name) return n.outputs[0];
  }
  return kNoValue;
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
