#include "meshflow/parallel/reshard_exec.h"

#include <algorithm>
#include <cstring>

#include "meshflow/core/check.h"

namespace meshflow {

namespace {

Shape local(const Shape& shape, const Mesh& mesh, const Layout& l) {
  return value_or_throw(local_shape(shape, mesh, l));
}

// S(d) -> R along the axis: gather every member's block, concatenate along d.
Status reshard_with_all_gather(const ReshardStep& st, const Shape& before, Communicator& comm,
                               std::vector<float>* data) {
  const int n = comm.size();
  std::vector<float> chunks(data->size() * n);
  MF_RETURN_IF_ERROR(comm.all_gather(data->data(), data->size(), chunks.data()));
  data->assign(chunks.size(), 0.f);
  unpack_chunks(chunks.data(), before, st.src_dim, n, data->data());
  return Status::ok();
}

// P -> S(d): split d into n blocks, member c receives the sum of block c.
Status reshard_with_reduce_scatter(const ReshardStep& st, const Shape& before, Communicator& comm,
                                   std::vector<float>* data) {
  const int n = comm.size();
  std::vector<float> packed(data->size());
  pack_chunks(data->data(), before, st.dst_dim, n, packed.data());
  data->assign(packed.size() / n, 0.f);
  return comm.reduce_scatter(packed.data(), data->size(), data->data(), ReduceOp::kSum);
}

// S(i) -> S(j): send block c of dim j to member c, concatenate what arrives along i.
Status reshard_with_all_to_all(const ReshardStep& st, const Shape& before, const Shape& after,
                               Communicator& comm, std::vector<float>* data) {
  const int n = comm.size();
  std::vector<float> packed(data->size()), got(data->size());
  pack_chunks(data->data(), before, st.dst_dim, n, packed.data());
  MF_RETURN_IF_ERROR(comm.all_to_all(packed.data(), data->size() / n, got.data()));
  // One received chunk: the `after` shape with dim i still at its `before` size.
  Shape chunk = after.with_size(st.src_dim, before.size(st.src_dim));
  unpack_chunks(got.data(), chunk, st.src_dim, n, data->data());
  return Status::ok();
}

// R -> S(d): keep block `coord` of dim d.
void reshard_with_local_slice(const ReshardStep& st, const Shape& before, int coord, int n,
                              std::vector<float>* data) {
  const int d = st.dst_dim;
  const int64_t outer = before.prod(0, d), len = before.size(d),
                inner = before.prod(d + 1, before.rank());
  const int64_t m = len / n;
  std::vector<float> out(outer * m * inner);
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(out.data() + o * m * inner, data->data() + (o * len + coord * m) * inner,
                sizeof(float) * m * inner);
  }
  *data = std::move(out);
}

}  // namespace

Status run_reshard(const ReshardPlan& plan, const Shape& shape, const Mesh& mesh,
                   const MeshComms& comms, std::vector<float>* data) {
  {
    MF_ASSIGN_OR_RETURN(Shape src_local, local_shape(shape, mesh, plan.src));
    if (static_cast<int64_t>(data->size()) != src_local.numel()) {
      return Status::invalid("reshard: local buffer has " + std::to_string(data->size()) +
                             " elements but the shard of " + shape.to_string() + " under " +
                             plan.src.to_string() + " on " + mesh.to_string() + " is " +
                             src_local.to_string() + " = " + std::to_string(src_local.numel()));
    }
  }
  const std::vector<int> coords = mesh.coords(comms.rank());
  for (const ReshardStep& st : plan.steps) {
    const Shape before = local(shape, mesh, st.before);
    const Shape after = local(shape, mesh, st.after);
    Communicator& comm = comms.axis(st.mesh_axis);
    MF_CHECK_EQ(comm.size(), mesh.size(st.mesh_axis));
    Status s;
    switch (st.kind) {
      case ReshardKind::kAllGather:
        s = reshard_with_all_gather(st, before, comm, data);
        break;
      case ReshardKind::kReduceScatter:
        s = reshard_with_reduce_scatter(st, before, comm, data);
        break;
      case ReshardKind::kAllReduce:
        s = comm.all_reduce(data->data(), data->size(), ReduceOp::kSum);
        break;
      case ReshardKind::kAllToAll:
        s = reshard_with_all_to_all(st, before, after, comm, data);
        break;
      case ReshardKind::kLocalSlice:
        reshard_with_local_slice(st, before, coords[st.mesh_axis], comm.size(), data);
        break;
      case ReshardKind::kLocalPartial:
        if (coords[st.mesh_axis] != 0) std::fill(data->begin(), data->end(), 0.f);
        break;
    }
    if (!s.is_ok()) return s.with_context("reshard step " + st.to_string(mesh));
    MF_CHECK_EQ(static_cast<int64_t>(data->size()), after.numel()) << st.to_string(mesh);
  }
  return Status::ok();
}

}  // namespace meshflow
