// Kernel interface: one function per OpKind per backend. The executor hands a
// kernel the node (for attrs and shapes) and raw pointers to its input and
// output buffers; outputs never alias inputs, except the inputs an optimizer op
// mutates in place (OpDef::mutates).
//
// CPU kernels (kernels/cpu/*.cc) are registered per op family, like OpDefs.
// They parallelize with OpenMP and call BLAS (cblas_sgemm) for contractions.
#pragma once

#include <vector>

#include "meshflow/ir/graph.h"

namespace meshflow {

class MeshComms;  // comm/mesh_comms.h

struct KernelCall {
  const Graph& g;
  const Node& n;
  std::vector<void*> in;
  std::vector<void*> out;
  const MeshComms* comms = nullptr;  // collectives: this rank's mesh groups (null: one device)

  const float* in_f(int i) const { return static_cast<const float*>(in[i]); }
  const int32_t* in_i(int i) const { return static_cast<const int32_t*>(in[i]); }
  float* in_mut_f(int i) const { return static_cast<float*>(in[i]); }  // mutated inputs only
  float* out_f(int i) const { return static_cast<float*>(out[i]); }
  const Shape& in_shape(int i) const { return g.shape(n.inputs[i]); }
  const Shape& out_shape(int i) const { return g.shape(n.outputs[i]); }
  const Attrs& attrs() const { return n.attrs; }
};

using KernelFn = void (*)(const KernelCall& call);
using KernelTable = std::vector<KernelFn>;

// The CPU kernel of an op; nullptr for source ops (they have storage, not kernels).
KernelFn cpu_kernel(OpKind kind);
bool has_cpu_kernel(OpKind kind);

void register_matmul_kernels(KernelTable& t);
void register_elementwise_kernels(KernelTable& t);
void register_activation_kernels(KernelTable& t);
void register_softmax_kernels(KernelTable& t);
void register_norm_kernels(KernelTable& t);
void register_embedding_kernels(KernelTable& t);
void register_shape_kernels(KernelTable& t);
void register_reduce_kernels(KernelTable& t);
void register_conv_kernels(KernelTable& t);
void register_pool_kernels(KernelTable& t);
void register_batch_norm_kernels(KernelTable& t);
void register_attention_kernels(KernelTable& t);
void register_optimizer_kernels(KernelTable& t);
void register_collective_kernels(KernelTable& t);

}  // namespace meshflow
