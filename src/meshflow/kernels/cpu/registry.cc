#include "meshflow/core/check.h"
#include "meshflow/kernels/kernel.h"

namespace meshflow {

namespace {
KernelTable build_table() {
  KernelTable t(kNumOpKinds, nullptr);
  register_matmul_kernels(t);
  register_elementwise_kernels(t);
  register_activation_kernels(t);
  register_softmax_kernels(t);
  register_norm_kernels(t);
  register_embedding_kernels(t);
  register_shape_kernels(t);
  register_reduce_kernels(t);
  register_conv_kernels(t);
  register_pool_kernels(t);
  register_batch_norm_kernels(t);
  register_attention_kernels(t);
  register_optimizer_kernels(t);
  register_collective_kernels(t);
  return t;
}
}  // namespace

KernelFn cpu_kernel(OpKind kind) {
  static const KernelTable table = build_table();
  KernelFn k = table[static_cast<int>(kind)];
  MF_CHECK(k != nullptr) << "op '" << op_name(kind) << "' has no CPU kernel";
  return k;
}

bool has_cpu_kernel(OpKind kind) {
  static const KernelTable table = build_table();
  return table[static_cast<int>(kind)] != nullptr;
}

}  // namespace meshflow
