// Graph: the static SSA dataflow graph everything in meshflow transforms.
//
// A Graph holds Values (each produced by exactly one Node, with a named Shape
// and a DType) and Nodes (an OpKind, input and output ValueIds, Attrs). Nodes
// are stored in a valid execution order: every input of node i is produced by
// a node before i. Source nodes (Parameter, Input, State) have no inputs.
//
// A training graph is forward + backward + optimizer in one graph; each node
// carries its Phase so passes and the executor can select parts of it.
// Optimizer update nodes mutate their state inputs in place (OpDef::mutates);
// the verifier checks nothing reads a mutated source after the mutation (a
// transient updated in place, like a ZeRO shard copy, is written through).
//
//   Graph g;  Builder b(g);                        // ops/builder.h
//   ValueId x = b.input("x", Shape{{"batch",8},{"hidden",4}});
//   ValueId w = b.parameter("w", Shape{{"hidden",4},{"out",2}}, Init::normal(0.02f));
//   ValueId y = b.matmul(x, w);
//   verify(g).is_ok();  print(g) -> text     // verify: ops/verify.h
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "meshflow/core/dtype.h"
#include "meshflow/core/shape.h"
#include "meshflow/core/status.h"
#include "meshflow/ir/op_kind.h"

namespace meshflow {

using ValueId = int32_t;
using NodeId = int32_t;
constexpr ValueId kNoValue = -1;

enum class Phase : uint8_t { kForward, kBackward, kOptimizer, kMetric };
std::string_view phase_name(Phase p);

// How a parameter is initialized (seeded per parameter name, so the same model
// config and seed give the same weights on every rank and every backend).
struct Init {
  enum class Kind : uint8_t { kZeros, kOnes, kNormal, kUniform } kind = Kind::kZeros;
  float scale = 0.f;  // std for kNormal, bound for kUniform (-scale, scale)
  static Init zeros() { return {Kind::kZeros, 0.f}; }
  static Init ones() { return {Kind::kOnes, 0.f}; }
  static Init normal(float std) { return {Kind::kNormal, std}; }
  static Init uniform(float bound) { return {Kind::kUniform, bound}; }
};

// Per-node attributes. One flat struct: each op reads the few fields it needs;
// ops/*.cc documents which beside each OpDef.
struct Attrs {
  // matmul: a is [batch.., M.., K..] (or [batch.., K.., M..] if trans_a),
  //         b is [batch.., K.., N..] (or [batch.., N.., K..] if trans_b).
  bool trans_a = false;
  bool trans_b = false;
  int contract = 1;           // number of K dims
  int batch_dims = 0;         // number of leading batch dims shared by a and b
  std::vector<int64_t> axes;  // transpose perm, reduce axes, slice/concat axis (axes[0])
  std::vector<int64_t> ints;  // slice [start, end)
  Shape shape;                // reshape / broadcast_to / sum_to / slice_grad target shape
  float alpha = 1.f;          // scale factor; attention softmax scale (0 = 1/sqrt(head_dim))
  float eps = 1e-5f;          // norm epsilon; optimizer epsilon
  float p = 0.f;              // dropout probability
  float beta1 = 0.9f, beta2 = 0.999f, weight_decay = 0.f, momentum = 0.f;  // optimizers
  float max_norm = 0.f;                                                    // clip_coef
  float theta = 10000.f;                                                   // rope base
  uint64_t seed = 0;                                                       // dropout stream
  bool causal = true;                                                      // attention
  bool keepdims = false;                                                   // reductions
  bool inverse = false;   // rope: rotate by -angle (its own gradient)
  bool nesterov = false;  // sgd
  // conv2d, pooling and their gradients (ops/conv.cc, ops/pool.cc): per
  // spatial dim (height, width); kernel: the pooling window.
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1}, kernel{1, 1};
  int64_t groups = 1;
  // Set by the partitioner when a spatial dim is split (a kHalo factor,
  // ops/sharding_rule.h): the mesh axis whose neighbours hold the adjacent
  // rows; this block's windows read `padding` rows from the previous block
  // and window - stride - padding (at least 0) from the next, exchanged by
  // the kernel (zeros, or -inf for max pooling, at the ends of the axis).
  std::array<int, 2> halo_axis{-1, -1};
  Init init;  // parameter
  // Collectives (ops/collective.cc): the mesh axis whose group they run over
  // and that group's size. The tensor dims are in axes.
  int mesh_axis = -1;
  int group_size = 1;
  // Set by the partitioner where a kernel needs its place in the global tensor
  // (parameter init, dropout, rope, vocab-parallel embedding): the global
  // sizes of the node's sharded tensor and this rank's block start per dim.
  // Empty: the tensor is the whole tensor.
  std::vector<int64_t> global_dims, global_offset;
  // Set by the sequence balance pass (parallel/seq_balance.h): the sequence
  // runs in zigzag order over seq_zigzag ranks (ops/zigzag.h), and dim
  // seq_dim of the node's tensor is that sequence (attention: dim 2 of q and
  // k; rope: 1; dropout: its "seq" dim; zigzag: the dim it reorders). 0: the
  // natural order.
  int64_t seq_zigzag = 0;
  int seq_dim = -1;
};

struct Value {
  std::string name;
  Shape shape;
  DType dtype = DType::F32;
  NodeId producer = -1;
  int output_index = 0;
};

struct Node {
  OpKind kind = OpKind::kInput;
  std::string name;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  Attrs attrs;
  Phase phase = Phase::kForward;
  int layer = -1;  // transformer block index, -1 outside blocks (pipeline split, recompute)
};

class Graph {
 public:
  // Appends a node whose outputs have the given (already inferred) types.
  // Returns the node id. Used by Builder; passes use it to emit new nodes.
  NodeId add_node(Node node, const std::vector<Value>& output_types);

  const Node& node(NodeId id) const { return nodes_[id]; }
  Node& mutable_node(NodeId id) { return nodes_[id]; }
  const Value& value(ValueId id) const { return values_[id]; }
  Value& mutable_value(ValueId id) { return values_[id]; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Value>& values() const { return values_; }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  int num_values() const { return static_cast<int>(values_.size()); }
  const Node& producer(ValueId v) const { return nodes_[values_[v].producer]; }
  const Shape& shape(ValueId v) const { return values_[v].shape; }

  // Value ids of all Parameter / Input / State nodes' outputs, in graph order.
  std::vector<ValueId> parameters() const;
  std::vector<ValueId> inputs() const;
  std::vector<ValueId> states() const;
  // Model buffers (torch's register_buffer): State values a forward node
  // reads, such as batch norm's running statistics. A checkpoint of the model
  // holds them with its parameters; the optimizer's state only its updates read.
  std::vector<ValueId> buffers() const;
  // parameters() then buffers(): what a checkpoint of the model holds.
  std::vector<ValueId> model_values() const;
  // Finds the output of a source node by value name; kNoValue if absent.
  ValueId find(const std::string& value_name) const;

  // Named roles set by model builders and autodiff.
  ValueId loss = kNoValue;                   // scalar training loss
  std::map<ValueId, ValueId> grad_of_param;  // parameter -> its gradient
  std::map<std::string, ValueId> outputs;    // extra named outputs (metrics, logits)

 private:
  std::vector<Node> nodes_;
  std::vector<Value> values_;
};

// Human-readable text, one node a line:
//   %5:[batch=8,out=2] = matmul(%1, %3) "fc1" {fwd}
std::string print(const Graph& g);
std::string print_node(const Graph& g, const Node& n);

}  // namespace meshflow
