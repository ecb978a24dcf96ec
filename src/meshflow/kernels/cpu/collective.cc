// Collective kernels: one call into the Communicator of the node's mesh axis
// (KernelCall::comms), with the chunks packed around the tensor dim when it is
// not the leading one. A failed collective (a dead rank, a timeout) throws
// StatusError naming the node; the trainer turns it into the run's error.
#include <cstring>
#include <vector>

#include "meshflow/comm/mesh_comms.h"
#include "meshflow/core/check.h"
#include "meshflow/kernels/cpu/halo.h"
#include "meshflow/kernels/kernel.h"
#include "meshflow/ops/op_def.h"

namespace meshflow {

namespace {

Communicator& group(const KernelCall& c) {
  if (c.comms == nullptr)
    throw StatusError(Status::failed_precondition(
        node_label(c.n) +
        ": a collective needs the mesh's communicators (run the program with "
        "Executor::set_mesh_comms)"));
  Communicator& comm = c.comms->axis(c.attrs().mesh_axis);
  MF_CHECK_EQ(comm.size(), c.attrs().group_size) << node_label(c.n);
  return comm;
}

void check(const KernelCall& c, const Status& s) {
  if (!s.is_ok()) throw StatusError(s.with_context(node_label(c.n)));
}

int64_t numel_in(const KernelCall& c) {
  return c.in_shape(0).numel();
}

// The dtype the collective moves (its input's: f32 activations, i32 ids, ...).
DType dtype_in(const KernelCall& c) {
  return c.g.value(c.n.inputs[0]).dtype;
}
size_t elem(const KernelCall& c) {
  return dtype_size(dtype_in(c));
}

// ints {lo, hi}, fill alpha (ops/collective.cc).
void neighbor_exchange_kernel(const KernelCall& c) {
  const Attrs& a = c.attrs();
  cpu::halo_grow(group(c), c.in_f(0), c.in_shape(0), static_cast<int>(a.axes[0]), a.ints[0],
                 a.ints[1], a.alpha, c.out_f(0));
}

void neighbor_exchange_grad_kernel(const KernelCall& c) {
  const Attrs& a = c.attrs();
  cpu::halo_shrink(group(c), c.in_f(0), c.out_shape(0), static_cast<int>(a.axes[0]), a.ints[0],
                   a.ints[1], c.out_f(0));
}

void all_gather_kernel(const KernelCall& c) {
  Communicator& comm = group(c);
  const int n = comm.size(), d = static_cast<int>(c.attrs().axes[0]);
  const int64_t count = numel_in(c);
  const DType dt = dtype_in(c);
  if (c.in_shape(0).prod(0, d) == 1) {  // leading dim: the chunks are the output
    check(c, comm.all_gather(c.in[0], count, c.out[0], dt));
    return;
  }
  std::vector<char> chunks(count * n * elem(c));
  check(c, comm.all_gather(c.in[0], count, chunks.data(), dt));
  unpack_chunks(chunks.data(), c.in_shape(0), d, n, c.out[0], dt);
}

void reduce_scatter_kernel(const KernelCall& c) {
  Communicator& comm = group(c);
  const int n = comm.size(), d = static_cast<int>(c.attrs().axes[0]);
  const int64_t count = numel_in(c);
  const DType dt = dtype_in(c);
  if (c.in_shape(0).prod(0, d) == 1) {
    check(c, comm.reduce_scatter(c.in[0], count / n, c.out[0], dt, ReduceOp::kSum));
    return;
  }
  std::vector<char> packed(count * elem(c));
  pack_chunks(c.in[0], c.in_shape(0), d, n, packed.data(), dt);
  check(c, comm.reduce_scatter(packed.data(), count / n, c.out[0], dt, ReduceOp::kSum));
}

void all_reduce_kernel(const KernelCall& c) {
  Communicator& comm = group(c);
  const int64_t count = numel_in(c);
  std::memcpy(c.out[0], c.in[0], count * elem(c));
  check(c, comm.all_reduce(c.out[0], count, dtype_in(c), ReduceOp::kSum));
}

void all_to_all_kernel(const KernelCall& c) {
  Communicator& comm = group(c);
  const int n = comm.size();
  const int i = static_cast<int>(c.attrs().axes[0]), j = static_cast<int>(c.attrs().axes[1]);
  const int64_t count = numel_in(c);
  const DType dt = dtype_in(c);
  std::vector<char> packed(count * elem(c)), got(count * elem(c));
  pack_chunks(c.in[0], c.in_shape(0), j, n, packed.data(), dt);
  check(c, comm.all_to_all(packed.data(), count / n, got.data(), dt));
  // One received chunk: the output's shape with dim i at its input size.
  const Shape chunk = c.out_shape(0).with_size(i, c.in_shape(0).size(i));
  unpack_chunks(got.data(), chunk, i, n, c.out[0], dt);
}

// ints {root}: the root's buffer on every member, in place.
void broadcast_kernel(const KernelCall& c) {
  check(c,
        group(c).broadcast(c.in[0], numel_in(c), dtype_in(c), static_cast<int>(c.attrs().ints[0])));
}

void shard_slice_kernel(const KernelCall& c) {
  const int n = c.attrs().group_size, d = static_cast<int>(c.attrs().axes[0]);
  const int coord = c.comms ? c.comms->axis(c.attrs().mesh_axis).rank() : 0;
  const Shape& s = c.in_shape(0);
  const int64_t outer = s.prod(0, d), len = s.size(d), inner = s.prod(d + 1, s.rank());
  const int64_t m = len / n;
  const size_t e = elem(c);
  const char* in = static_cast<const char*>(c.in[0]);
  char* out = static_cast<char*>(c.out[0]);
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(out + o * m * inner * e, in + (o * len + coord * m) * inner * e, e * m * inner);
}

void partial_mask_kernel(const KernelCall& c) {
  const int coord = c.comms ? c.comms->axis(c.attrs().mesh_axis).rank() : 0;
  const size_t bytes = numel_in(c) * elem(c);
  if (coord == 0)
    std::memcpy(c.out[0], c.in[0], bytes);
  else
    std::memset(c.out[0], 0, bytes);
}

void assign_kernel(const KernelCall& c) {
  std::memcpy(c.in[0], c.in[1], c.in_shape(0).numel() * elem(c));
}

}  // namespace

void register_collective_kernels(KernelTable& t) {
  t[static_cast<int>(OpKind::kAllGather)] = all_gather_kernel;
  t[static_cast<int>(OpKind::kReduceScatter)] = reduce_scatter_kernel;
  t[static_cast<int>(OpKind::kAllReduce)] = all_reduce_kernel;
  t[static_cast<int>(OpKind::kAllToAll)] = all_to_all_kernel;
  t[static_cast<int>(OpKind::kBroadcast)] = broadcast_kernel;
  t[static_cast<int>(OpKind::kShardSlice)] = shard_slice_kernel;
  t[static_cast<int>(OpKind::kPartialMask)] = partial_mask_kernel;
  t[static_cast<int>(OpKind::kNeighborExchange)] = neighbor_exchange_kernel;
  t[static_cast<int>(OpKind::kNeighborExchangeGrad)] = neighbor_exchange_grad_kernel;
  t[static_cast<int>(OpKind::kAssign)] = assign_kernel;
}

}  // namespace meshflow
