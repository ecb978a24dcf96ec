// Builder: the way model code (and autodiff) writes a Graph. Each call infers
// the output shape through the op's OpDef and appends one node; a shape that
// does not fit throws StatusError naming the node and the sizes.
//
//   Graph g;  Builder b(g);
//   auto scope = b.scope("h.0.mlp");          // names nodes "h.0.mlp/fc1", ...
//   ValueId h = b.gelu(b.bias_add(b.matmul(x, w1, {}, "fc1"), b1));
//
// Node names are scope + "." + name (or the op name plus a counter).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "meshflow/ir/graph.h"

namespace meshflow {

struct MatMulOpts {
  bool trans_a = false;
  bool trans_b = false;
  int contract = 1;
  int batch_dims = 0;
};

// conv2d's attributes, per spatial dim (height, width), as torch.nn.Conv2d.
struct Conv2dOpts {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};  // zeros on both sides
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
};

// Pooling windows, per spatial dim, as torch.nn.MaxPool2d / AvgPool2d
// (stride {0, 0}: the kernel size; floor mode; avg pooling counts the padding).
struct Pool2dOpts {
  std::array<int64_t, 2> kernel{2, 2};
  std::array<int64_t, 2> stride{0, 0};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};  // max pooling only
};

class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}
  Graph& graph() { return g_; }

  // RAII scope: nodes created inside are named "<scope>.<name>".
  class Scope {
   public:
    Scope(Builder* b, std::string saved, int saved_layer)
        : b_(b), saved_(std::move(saved)), saved_layer_(saved_layer) {}
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope() {
      b_->prefix_ = saved_;
      b_->layer_ = saved_layer_;
    }

   private:
    Builder* b_;
    std::string saved_;
    int saved_layer_;
  };
  [[nodiscard]] Scope scope(const std::string& name, int layer = -2);
  void set_phase(Phase p) { phase_ = p; }
  Phase phase() const { return phase_; }
  void set_layer(int layer) { layer_ = layer; }
  int layer() const { return layer_; }
  std::string qualify(const std::string& name) const;

  // Generic: any op. Returns the outputs.
  std::vector<ValueId> op(OpKind kind, std::vector<ValueId> inputs, Attrs attrs = {},
                          const std::string& name = "");
  ValueId op1(OpKind kind, std::vector<ValueId> inputs, Attrs attrs = {},
              const std::string& name = "") {
    return op(kind, std::move(inputs), std::move(attrs), name)[0];
  }

  // Sources. Names are global (not scoped unless the caller qualifies them).
  ValueId parameter(const std::string& name, Shape shape, Init init);
  ValueId input(const std::string& name, Shape shape, DType dtype = DType::F32);
  ValueId state(const std::string& name, Shape shape, Init init = Init::zeros());
  // The graph's i32 input "rng_offset" [2] for dropout: (stream offset, shard).
  // Element 0 picks the random stream (the trainer feeds step * micro_batches +
  // micro); element 1 is this rank's index along the leading (batch) dim, so
  // element i of a local tensor of n elements draws global element shard*n + i
  // and data-parallel ranks reproduce the one-device mask exactly. A negative
  // offset turns dropout off (evaluation).
  ValueId rng_offset();

  ValueId matmul(ValueId a, ValueId b, MatMulOpts o = {}, const std::string& name = "");
  // x [batch, channels, height, width], w [out_channels, channels / groups, kh, kw]
  //   -> [batch, out_channels, out_height, out_width] (ops/conv.cc).
  ValueId conv2d(ValueId x, ValueId w, Conv2dOpts o = {}, const std::string& name = "");
  // x [batch, channels, height, width] -> [batch, channels, out_height, out_width] (ops/pool.cc).
  ValueId max_pool2d(ValueId x, Pool2dOpts o = {}, const std::string& name = "");
  // Batch norm over every dim of x but dim 1 (channels), as torch's
  // BatchNorm{1,2}d in training mode; in evaluation (rng_offset < 0) on the
  // running statistics. Also adds the forward-phase node that updates
  // running_mean / running_var (states [C]) with `momentum` (ops/batch_norm.cc).
  ValueId batch_norm(ValueId x, ValueId gamma, ValueId beta, ValueId running_mean,
                     ValueId running_var, float eps = 1e-5f, float momentum = 0.1f,
                     const std::string& name = "");
  ValueId avg_pool2d(ValueId x, Pool2dOpts o = {}, const std::string& name = "");
  ValueId add(ValueId a, ValueId b, const std::string& name = "");
  ValueId sub(ValueId a, ValueId b, const std::string& name = "");
  ValueId mul(ValueId a, ValueId b, const std::string& name = "");
  ValueId div(ValueId a, ValueId b, const std::string& name = "");
  ValueId scale(ValueId x, float alpha, const std::string& name = "");
  ValueId bias_add(ValueId x, ValueId bias, const std::string& name = "");
  ValueId sum_to(ValueId x, const Shape& target, const std::string& name = "");
  ValueId broadcast_to(ValueId x, const Shape& target, const std::string& name = "");

  ValueId relu(ValueId x, const std::string& name = "");
  ValueId gelu(ValueId x, const std::string& name = "");
  ValueId silu(ValueId x, const std::string& name = "");
  ValueId softmax(ValueId x, const std::string& name = "");
  ValueId log_softmax(ValueId x, const std::string& name = "");
  // Mean over all positions of -log softmax(logits)[target]; targets i32.
  ValueId cross_entropy(ValueId logits, ValueId targets, const std::string& name = "");
  // Number of positions whose argmax equals the target (metric phase).
  ValueId correct_count(ValueId logits, ValueId targets, const std::string& name = "");

  ValueId layer_norm(ValueId x, ValueId gamma, ValueId beta, float eps = 1e-5f,
                     const std::string& name = "");
  ValueId rms_norm(ValueId x, ValueId gamma, float eps = 1e-6f, const std::string& name = "");
  ValueId embedding(ValueId table, ValueId ids, const std::string& name = "");

  ValueId transpose(ValueId x, std::vector<int64_t> perm, const std::string& name = "");
  ValueId reshape(ValueId x, Shape target, const std::string& name = "");
  ValueId slice(ValueId x, int axis, int64_t start, int64_t end, const std::string& name = "");
  ValueId concat(std::vector<ValueId> xs, int axis, const std::string& name = "");

  ValueId reduce_sum(ValueId x, std::vector<int64_t> axes, bool keepdims = false,
                     const std::string& name = "");
  ValueId reduce_mean(ValueId x, std::vector<int64_t> axes, bool keepdims = false,
                      const std::string& name = "");
  ValueId reduce_max(ValueId x, std::vector<int64_t> axes, bool keepdims = false,
                     const std::string& name = "");

  // q: [batch, heads, seq, head_dim]; k, v: [batch, kv_heads, seq, head_dim]
  // (kv_heads divides heads: grouped-query attention). scale 0 = 1/sqrt(head_dim).
  ValueId attention(ValueId q, ValueId k, ValueId v, bool causal = true, float scale = 0.f,
                    const std::string& name = "");
  ValueId dropout(ValueId x, float p, uint64_t seed, const std::string& name = "");
  // x: [batch, seq, heads, head_dim]; rotates pairs (i, i + head_dim/2) by pos*theta^(-2i/d).
  ValueId rope(ValueId x, float theta = 10000.f, const std::string& name = "");

  // Collectives over the group of mesh axis `axis` (of `group` ranks), for
  // per-rank programs written by hand (hybrid parallel, like shard_map);
  // ops/collective.cc has their semantics and gradients.
  ValueId all_reduce(ValueId x, int axis, int group, const std::string& name = "");
  ValueId all_gather(ValueId x, int dim, int axis, int group, const std::string& name = "");
  ValueId reduce_scatter(ValueId x, int dim, int axis, int group, const std::string& name = "");
  ValueId all_to_all(ValueId x, int gather_dim, int split_dim, int axis, int group,
                     const std::string& name = "");
  // x := member `root`'s x on every member, in place (root: a coordinate on the axis).
  void broadcast(ValueId x, int root, int axis, int group, const std::string& name = "");

 private:
  friend class Scope;
  Graph& g_;
  std::string prefix_;
  Phase phase_ = Phase::kForward;
  int layer_ = -1;
  int counter_ = 0;
};

}  // namespace meshflow
