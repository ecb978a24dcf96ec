// OpKind: the one enum of operators. An op is data, not a class: its shape
// rule, gradient rule, cost and sharding rule live in one OpDef
// table entry (ops/op_def.h), and its CPU kernel in kernels/cpu/.
//
// X(enum name, printed name). Keep families together; the printed name is what
// `meshflow explain`, the graph printer and tests show.
#pragma once

#include <cstdint>
#include <string_view>

#define MESHFLOW_OP_KINDS(X)                        \
  /* sources: no inputs */                          \
  X(Parameter, "parameter")                         \
  X(Input, "input")                                 \
  X(State, "state")                                 \
  /* contraction */                                 \
  X(MatMul, "matmul")                               \
  /* element-wise with broadcasting */              \
  X(Add, "add")                                     \
  X(Sub, "sub")                                     \
  X(Mul, "mul")                                     \
  X(Div, "div")                                     \
  X(Scale, "scale")                                 \
  X(BiasAdd, "bias_add")                            \
  X(SumTo, "sum_to")                                \
  X(BroadcastTo, "broadcast_to")                    \
  /* activations */                                 \
  X(Relu, "relu")                                   \
  X(ReluGrad, "relu_grad")                          \
  X(Gelu, "gelu")                                   \
  X(GeluGrad, "gelu_grad")                          \
  X(Silu, "silu")                                   \
  X(SiluGrad, "silu_grad")                          \
  /* softmax family and loss */                     \
  X(Softmax, "softmax")                             \
  X(SoftmaxGrad, "softmax_grad")                    \
  X(LogSoftmax, "log_softmax")                      \
  X(LogSoftmaxGrad, "log_softmax_grad")             \
  X(CrossEntropy, "cross_entropy")                  \
  X(CrossEntropyGrad, "cross_entropy_grad")         \
  /* normalization */                               \
  X(LayerNorm, "layer_norm")                        \
  X(LayerNormGrad, "layer_norm_grad")               \
  X(RmsNorm, "rms_norm")                            \
  X(RmsNormGrad, "rms_norm_grad")                   \
  X(BatchNorm, "batch_norm")                        \
  X(BatchNormGrad, "batch_norm_grad")               \
  X(BatchNormUpdate, "batch_norm_update")           \
  /* embedding */                                   \
  X(Embedding, "embedding")                         \
  X(EmbeddingGrad, "embedding_grad")                \
  /* layout of data */                              \
  X(Transpose, "transpose")                         \
  X(Reshape, "reshape")                             \
  X(Slice, "slice")                                 \
  X(SliceGrad, "slice_grad")                        \
  X(Concat, "concat")                               \
  /* reductions */                                  \
  X(ReduceSum, "reduce_sum")                        \
  X(ReduceMean, "reduce_mean")                      \
  X(ReduceMax, "reduce_max")                        \
  X(ReduceMaxGrad, "reduce_max_grad")               \
  /* attention and friends */                       \
  X(Conv2d, "conv2d")                               \
  X(Conv2dGradInput, "conv2d_grad_input")           \
  X(Conv2dGradWeight, "conv2d_grad_weight")         \
  X(MaxPool2d, "max_pool2d")                        \
  X(MaxPool2dGrad, "max_pool2d_grad")               \
  X(AvgPool2d, "avg_pool2d")                        \
  X(AvgPool2dGrad, "avg_pool2d_grad")               \
                                                    \
  X(Attention, "attention")                         \
  X(AttentionGrad, "attention_grad")                \
  X(Dropout, "dropout")                             \
  X(DropoutGrad, "dropout_grad")                    \
  X(Rope, "rope")                                   \
  X(Zigzag, "zigzag")                               \
  /* optimizer */                                   \
  X(SumSquares, "sum_squares")                      \
  X(ClipCoef, "clip_coef")                          \
  X(SgdUpdate, "sgd_update")                        \
  X(AdamWUpdate, "adamw_update")                    \
  /* metrics */                                     \
  X(CorrectCount, "correct_count")                  \
  /* collectives (parallel/partition.h) */          \
  X(AllGather, "all_gather")                        \
  X(ReduceScatter, "reduce_scatter")                \
  X(AllReduce, "all_reduce")                        \
  X(AllToAll, "all_to_all")                         \
  X(Broadcast, "broadcast")                         \
  X(ShardSlice, "shard_slice")                      \
  X(NeighborExchange, "neighbor_exchange")          \
  X(NeighborExchangeGrad, "neighbor_exchange_grad") \
  X(PartialMask, "partial_mask")                    \
  X(Assign, "assign")

namespace meshflow {

enum class OpKind : uint8_t {
#define MESHFLOW_X(e, s) k##e,
  MESHFLOW_OP_KINDS(MESHFLOW_X)
#undef MESHFLOW_X
      kCount
};

constexpr int kNumOpKinds = static_cast<int>(OpKind::kCount);

constexpr std::string_view op_name(OpKind k) {
  switch (k) {
#define MESHFLOW_X(e, s) \
  case OpKind::k##e:     \
    return s;
    MESHFLOW_OP_KINDS(MESHFLOW_X)
#undef MESHFLOW_X
    case OpKind::kCount:
      break;
  }
  return "?";
}

}  // namespace meshflow
