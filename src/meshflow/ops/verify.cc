#include "meshflow/ops/verify.h"

#include <set>
#include <string>
#include <vector>

#include "meshflow/core/check.h"
#include "meshflow/ops/op_def.h"

namespace meshflow {

Status verify(const Graph& g) {
  std::vector<char> defined(g.num_values(), 0);
  std::vector<char> mutated(g.num_values(), 0);
  std::set<std::string> source_names;
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    const OpDef& def = op_def(n.kind);
    std::string where = "node " + std::to_string(id) + " " + node_label(n);
    if (def.num_inputs >= 0 && static_cast<int>(n.inputs.size()) != def.num_inputs &&
        static_cast<int>(n.inputs.size()) != def.training_inputs)
      return Status::internal(where + ": has " + std::to_string(n.inputs.size()) +
                              " inputs, op takes " + std::to_string(def.num_inputs));
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      ValueId v = n.inputs[i];
      if (v < 0 || v >= g.num_values() || !defined[v])
        return Status::internal(where + ": input " + std::to_string(i) + " (%" + std::to_string(v) +
                                ") is not defined before use");
      // A later in-place writer of the same value may read it (weights
      // grouping's broadcast overwrites the owner's updated parameter).
      if (mutated[v] && !(def.mutates & (1u << i)))
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

}  // namespace meshflow
