#include "meshflow/ops/builder.h"

#include "meshflow/ops/op_def.h"

namespace meshflow {

Builder::Scope Builder::scope(const std::string& name, int layer) {
  std::string saved = prefix_;
  const int saved_layer = layer_;
  prefix_ = qualify(name);
  if (layer != -2) layer_ = layer;
  return Scope(this, std::move(saved), saved_layer);
}

std::string Builder::qualify(const std::string& name) const {
  return prefix_.empty() ? name : prefix_ + "." + name;
}

std::vector<ValueId> Builder::op(OpKind kind, std::vector<ValueId> inputs, Attrs attrs,
                                 const std::string& name) {
  Node n;
  n.kind = kind;
  n.name =
      qualify(name.empty() ? std::string(op_name(kind)) + "_" + std::to_string(counter_++) : name);
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.phase = phase_;
  n.layer = layer_;
  const OpDef& def = op_def(kind);
  for (ValueId v : n.inputs)
    if (v < 0 || v >= g_.num_values())
      throw StatusError(Status::invalid(node_label(n) + ": input is not a value of this graph"));
  std::vector<Value> outs;
  Status s = def.infer(g_, n, &outs);
  if (!s.is_ok()) throw StatusError(s);
  NodeId id = g_.add_node(std::move(n), outs);
  return g_.node(id).outputs;
}

ValueId Builder::parameter(const std::string& name, Shape shape, Init init) {
  Attrs a;
  a.shape = std::move(shape);
  a.init = init;
  Node n;
  n.kind = OpKind::kParameter;
  n.name = name;
  n.attrs = a;
  n.phase = Phase::kForward;
  n.layer = layer_;
  return g_.node(g_.add_node(std::move(n), {out_value(a.shape)})).outputs[0];
}

ValueId Builder::input(const std::string& name, Shape shape, DType dtype) {
  Attrs a;
  a.shape = shape;
  Node n;
  n.kind = OpKind::kInput;
  n.name = name;
  n.attrs = a;
  return g_.node(g_.add_node(std::move(n), {out_value(std::move(shape), dtype)})).outputs[0];
}

ValueId Builder::state(const std::string& name, Shape shape, Init init) {
  Attrs a;
  a.shape = shape;
  a.init = init;
  Node n;
  n.kind = OpKind::kState;
  n.name = name;
  n.attrs = a;
  n.phase = Phase::kOptimizer;
  return g_.node(g_.add_node(std::move(n), {out_value(std::move(shape))})).outputs[0];
}

ValueId Builder::rng_offset() {
  ValueId v = g_.find("rng_offset");
  if (v != kNoValue) return v;
  return input("rng_offset", Shape{{"rng", 2}}, DType::I32);
}

ValueId Builder::matmul(ValueId a, ValueId b, MatMulOpts o, const std::string& name) {
  Attrs at;
  at.trans_a = o.trans_a;
  at.trans_b = o.trans_b;
  at.contract = o.contract;
  at.batch_dims = o.batch_dims;
  return op1(OpKind::kMatMul, {a, b}, at, name);
}

ValueId Builder::add(ValueId a, ValueId b, const std::string& name) {
  return op1(OpKind::kAdd, {a, b}, {}, name);
}
ValueId Builder::sub(ValueId a, ValueId b, const std::string& name) {
  return op1(OpKind::kSub, {a, b}, {}, name);
}
ValueId Builder::mul(ValueId a, ValueId b, const std::string& name) {
  return op1(OpKind::kMul, {a, b}, {}, name);
}
ValueId Builder::div(ValueId a, ValueId b, const std::string& name) {
  return op1(OpKind::kDiv, {a, b}, {}, name);
}

ValueId Builder::scale(ValueId x, float alpha, const std::string& name) {
  Attrs at;
  at.alpha = alpha;
  return op1(OpKind::kScale, {x}, at, name);
}

ValueId Builder::bias_add(ValueId x, ValueId bias, const std::string& name) {
  return op1(OpKind::kBiasAdd, {x, bias}, {}, name);
}

ValueId Builder::sum_to(ValueId x, const Shape& target, const std::string& name) {
  Attrs at;
  at.shape = target;
  return op1(OpKind::kSumTo, {x}, at, name);
}

ValueId Builder::broadcast_to(ValueId x, const Shape& target, const std::string& name) {
  Attrs at;
  at.shape = target;
  return op1(OpKind::kBroadcastTo, {x}, at, name);
}

ValueId Builder::relu(ValueId x, const std::string& name) {
  return op1(OpKind::kRelu, {x}, {}, name);
}
ValueId Builder::gelu(ValueId x, const std::string& name) {
  return op1(OpKind::kGelu, {x}, {}, name);
}
ValueId Builder::silu(ValueId x, const std::string& name) {
  return op1(OpKind::kSilu, {x}, {}, name);
}
ValueId Builder::softmax(ValueId x, const std::string& name) {
  return op1(OpKind::kSoftmax, {x}, {}, name);
}
ValueId Builder::log_softmax(ValueId x, const std::string& name) {
  return op1(OpKind::kLogSoftmax, {x}, {}, name);
}

ValueId Builder::cross_entropy(ValueId logits, ValueId targets, const std::string& name) {
  return op(OpKind::kCrossEntropy, {logits, targets}, {}, name)[0];
}

ValueId Builder::correct_count(ValueId logits, ValueId targets, const std::string& name) {
  Phase saved = phase_;
  phase_ = Phase::kMetric;
  ValueId v = op1(OpKind::kCorrectCount, {logits, targets}, {}, name);
  phase_ = saved;
  return v;
}

ValueId Builder::conv2d(ValueId x, ValueId w, Conv2dOpts o, const std::string& name) {
  Attrs at;
  at.stride = o.stride;
  at.padding = o.padding;
  at.dilation = o.dilation;
  at.groups = o.groups;
  return op(OpKind::kConv2d, {x, w}, at, name)[0];
}

namespace {
Attrs pool_attrs(const Pool2dOpts& o) {
  Attrs at;
  at.kernel = o.kernel;
  at.stride = {o.stride[0] > 0 ? o.stride[0] : o.kernel[0],
               o.stride[1] > 0 ? o.stride[1] : o.kernel[1]};
  at.padding = o.padding;
  at.dilation = o.dilation;
  return at;
}
}  // namespace

ValueId Builder::max_pool2d(ValueId x, Pool2dOpts o, const std::string& name) {
  return op(OpKind::kMaxPool2d, {x}, pool_attrs(o), name)[0];
}

ValueId Builder::avg_pool2d(ValueId x, Pool2dOpts o, const std::string& name) {
  return op(OpKind::kAvgPool2d, {x}, pool_attrs(o), name)[0];
}

ValueId Builder::batch_norm(ValueId x, ValueId gamma, ValueId beta, ValueId running_mean,
                            ValueId running_var, float eps, float momentum,
                            const std::string& name) {
  Attrs at;
  at.eps = eps;
  const std::vector<ValueId> bn =
      op(OpKind::kBatchNorm, {x, gamma, beta, running_mean, running_var, rng_offset()}, at, name);
  // The running variance is unbiased: the batch variance times M / (M - 1),
  // M the elements per channel.
  const Shape& xs = g_.shape(x);
  const double m = double(xs.numel()) / double(xs.size(1));
  Attrs up;
  up.eps = eps;
  up.momentum = momentum;
  up.alpha = m > 1 ? static_cast<float>(m / (m - 1)) : 1.f;
  op(OpKind::kBatchNormUpdate, {running_mean, running_var, bn[1], bn[2]}, up,
     name.empty() ? "" : name + ".update");
  return bn[0];
}

ValueId Builder::layer_norm(ValueId x, ValueId gamma, ValueId beta, float eps,
                            const std::string& name) {
  Attrs at;
  at.eps = eps;
  return op(OpKind::kLayerNorm, {x, gamma, beta}, at, name)[0];
}

ValueId Builder::rms_norm(ValueId x, ValueId gamma, float eps, const std::string& name) {
  Attrs at;
  at.eps = eps;
  return op(OpKind::kRmsNorm, {x, gamma}, at, name)[0];
}

ValueId Builder::embedding(ValueId table, ValueId ids, const std::string& name) {
  return op1(OpKind::kEmbedding, {table, ids}, {}, name);
}

ValueId Builder::transpose(ValueId x, std::vector<int64_t> perm, const std::string& name) {
  Attrs at;
  at.axes = std::move(perm);
  return op1(OpKind::kTranspose, {x}, at, name);
}

namespace {
Attrs group_attrs(int axis, int group, std::vector<int64_t> dims) {
  Attrs at;
  at.mesh_axis = axis;
  at.group_size = group;
  at.axes = std::move(dims);
  return at;
}
}  // namespace

ValueId Builder::all_reduce(ValueId x, int axis, int group, const std::string& name) {
  return op1(OpKind::kAllReduce, {x}, group_attrs(axis, group, {}), name);
}
ValueId Builder::all_gather(ValueId x, int dim, int axis, int group, const std::string& name) {
  return op1(OpKind::kAllGather, {x}, group_attrs(axis, group, {dim}), name);
}
ValueId Builder::reduce_scatter(ValueId x, int dim, int axis, int group, const std::string& name) {
  return op1(OpKind::kReduceScatter, {x}, group_attrs(axis, group, {dim}), name);
}
ValueId Builder::all_to_all(ValueId x, int gather_dim, int split_dim, int axis, int group,
                            const std::string& name) {
  return op1(OpKind::kAllToAll, {x}, group_attrs(axis, group, {gather_dim, split_dim}), name);
}
void Builder::broadcast(ValueId x, int root, int axis, int group, const std::string& name) {
  Attrs at = group_attrs(axis, group, {});
  at.ints = {root};
  op(OpKind::kBroadcast, {x}, at, name);
}

ValueId Builder::reshape(ValueId x, Shape target, const std::string& name) {
  Attrs at;
  at.shape = std::move(target);
  return op1(OpKind::kReshape, {x}, at, name);
}

ValueId Builder::slice(ValueId x, int axis, int64_t start, int64_t end, const std::string& name) {
  Attrs at;
  at.axes = {axis};
  at.ints = {start, end};
  return op1(OpKind::kSlice, {x}, at, name);
}

ValueId Builder::concat(std::vector<ValueId> xs, int axis, const std::string& name) {
  Attrs at;
  at.axes = {axis};
  return op1(OpKind::kConcat, std::move(xs), at, name);
}

namespace {
Attrs reduce_attrs(std::vector<int64_t> axes, bool keepdims) {
  Attrs at;
  at.axes = std::move(axes);
  at.keepdims = keepdims;
  return at;
}
}  // namespace

ValueId Builder::reduce_sum(ValueId x, std::vector<int64_t> axes, bool keepdims,
                            const std::string& name) {
  return op1(OpKind::kReduceSum, {x}, reduce_attrs(std::move(axes), keepdims), name);
}
ValueId Builder::reduce_mean(ValueId x, std::vector<int64_t> axes, bool keepdims,
                             const std::string& name) {
  return op1(OpKind::kReduceMean, {x}, reduce_attrs(std::move(axes), keepdims), name);
}
ValueId Builder::reduce_max(ValueId x, std::vector<int64_t> axes, bool keepdims,
                            const std::string& name) {
  return op1(OpKind::kReduceMax, {x}, reduce_attrs(std::move(axes), keepdims), name);
}

ValueId Builder::attention(ValueId q, ValueId k, ValueId v, bool causal, float scale,
                           const std::string& name) {
  Attrs at;
  at.causal = causal;
  at.alpha = scale;
  return op(OpKind::kAttention, {q, k, v}, at, name)[0];
}

ValueId Builder::dropout(ValueId x, float p, uint64_t seed, const std::string& name) {
  Attrs at;
  at.p = p;
  at.seed = seed;
  return op1(OpKind::kDropout, {x, rng_offset()}, at, name);
}

ValueId Builder::rope(ValueId x, float theta, const std::string& name) {
  Attrs at;
  at.theta = theta;
  return op1(OpKind::kRope, {x}, at, name);
}

}  // namespace meshflow
