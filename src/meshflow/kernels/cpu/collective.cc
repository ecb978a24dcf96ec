// Collective kernels: one call into the Communicator of the node's mesh axis
// (KernelCall::comms), with the chunks packed around the tensor dim when it is
// not the leading one. A failed collective (a dead rank, a timeout) throws
// StatusError naming the node; the trainer turns it into the run's error.
#include <cstring>
#include <vector>

#include "meshflow/core/check.h"
#include "meshflow/kernels/kernel.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/parallel/reshard_exec.h"

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

void all_gather_kernel(const KernelCall& c) {
  Communicator& comm = group(c);
  const int n = comm.size(), d = static_cast<int>(c.attrs().axes[0]);
  const int64_t count = numel_in(c);
  if (c.in_shape(0).prod(0, d) == 1) {  // leading dim: the chunks are the output
    check(c, comm.all_gather(c.in_f(0), count, c.out_f(0)));
    return;
  }
  std::vector<float> chunks(count * n);
  check(c, comm.all_gather(c.in_f(0), count, chunks.data()));
  unpack_chunks(chunks.data(), c.in_shape(0), d, n, c.out_f(0));
}

void reduce_scatter_kernel(const KernelCall& c) {
  Communicator& comm = group(c);
  const int n = comm.size(), d = static_cast<int>(c.attrs().axes[0]);
  const int64_t count = numel_in(c);
  if (c.in_shape(0).prod(0, d) == 1) {
    check(c, comm.reduce_scatter(c.in_f(0), count / n, c.out_f(0), ReduceOp::kSum));
    return;
  }
  std::vector<float> packed(count);
  pack_chunks(c.in_f(0), c.in_shape(0), d, n, packed.data());
  check(c, comm.reduce_scatter(packed.data(), count / n, c.out_f(0), ReduceOp::kSum));
}

void all_reduce_kernel(const KernelCall& c) {
  Communicator& comm = group(c);
  const int64_t count = numel_in(c);
  std::memcpy(c.out_f(0), c.in_f(0), count * sizeof(float));
  check(c, comm.all_reduce(c.out_f(0), count, ReduceOp::kSum));
}

void all_to_all_kernel(const KernelCall& c) {
  Communicator& comm = group(c);
  const int n = comm.size();
  const int i = static_cast<int>(c.attrs().axes[0]), j = static_cast<int>(c.attrs().axes[1]);
  const int64_t count = numel_in(c);
  std::vector<float> packed(count), got(count);
  pack_chunks(c.in_f(0), c.in_shape(0), j, n, packed.data());
  check(c, comm.all_to_all(packed.data(), count / n, got.data()));
  // One received chunk: the output's shape with dim i at its input size.
  const Shape chunk = c.out_shape(0).with_size(i, c.in_shape(0).size(i));
  unpack_chunks(got.data(), chunk, i, n, c.out_f(0));
}

void shard_slice_kernel(const KernelCall& c) {
  const int n = c.attrs().group_size, d = static_cast<int>(c.attrs().axes[0]);
  const int coord = c.comms ? c.comms->axis(c.attrs().mesh_axis).rank() : 0;
  const Shape& s = c.in_shape(0);
  const int64_t outer = s.prod(0, d), len = s.size(d), inner = s.prod(d + 1, s.rank());
  const int64_t m = len / n;
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(c.out_f(0) + o * m * inner, c.in_f(0) + (o * len + coord * m) * inner,
                sizeof(float) * m * inner);
}

void partial_mask_kernel(const KernelCall& c) {
  const int coord = c.comms ? c.comms->axis(c.attrs().mesh_axis).rank() : 0;
  const int64_t count = numel_in(c);
  if (coord == 0)
    std::memcpy(c.out_f(0), c.in_f(0), count * sizeof(float));
  else
    std::memset(c.out_f(0), 0, count * sizeof(float));
}

void assign_kernel(const KernelCall& c) {
  std::memcpy(c.in_mut_f(0), c.in_f(1), c.in_shape(0).numel() * sizeof(float));
}

}  // namespace

void register_collective_kernels(KernelTable& t) {
  t[static_cast<int>(OpKind::kAllGather)] = all_gather_kernel;
  t[static_cast<int>(OpKind::kReduceScatter)] = reduce_scatter_kernel;
  t[static_cast<int>(OpKind::kAllReduce)] = all_reduce_kernel;
  t[static_cast<int>(OpKind::kAllToAll)] = all_to_all_kernel;
  t[static_cast<int>(OpKind::kShardSlice)] = shard_slice_kernel;
  t[static_cast<int>(OpKind::kPartialMask)] = partial_mask_kernel;
  t[static_cast<int>(OpKind::kAssign)] = assign_kernel;
}

}  // namespace meshflow
