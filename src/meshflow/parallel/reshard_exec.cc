#include "meshflow/parallel/reshard_exec.h"

#include <algorithm>
#include <cstring>

#include "meshflow/core/check.h"

namespace meshflow {

Result<MeshComms> MeshComms::make(std::shared_ptr<Communicator> world, const Mesh& mesh) {
  if (world->size() != mesh.num_ranks()) {
    return Status::invalid("mesh " + mesh.to_string() + " has " + std::to_string(mesh.num_ranks()) +
                           " ranks but the communicator has " + std::to_string(world->size()));
  }
  MeshComms c;
  for (int a = 0; a < mesh.num_axes(); ++a) {
    MF_ASSIGN_OR_RETURN(auto sub, world->split(mesh.axis_group(a, world->rank())));
    c.axes_.push_back(std::move(sub));
  }
  c.world_ = std::move(world);
  return c;
}

namespace {

// A local buffer seen as [outer, len, inner] around one dim.
struct Around {
  int64_t outer = 1, len = 1, inner = 1;
  Around(const Shape& s, int dim) {
    outer = s.prod(0, dim);
    len = s.size(dim);
    inner = s.prod(dim + 1, s.rank());
  }
};

}  // namespace

// chunks[c] = in[:, c*m:(c+1)*m, :] (m = len/n), each chunk contiguous;
// `elem` bytes per element.
static void pack(const char* in, const Around& a, int n, char* out, size_t elem) {
  const int64_t m = a.len / n, chunk = a.outer * m * a.inner;
  for (int c = 0; c < n; ++c) {
    for (int64_t o = 0; o < a.outer; ++o) {
      std::memcpy(out + (c * chunk + o * m * a.inner) * elem,
                  in + (o * a.len + c * m) * a.inner * elem, elem * m * a.inner);
    }
  }
}

// The inverse: out[:, c*m:(c+1)*m, :] = chunks[c]; `a` describes one chunk.
static void unpack(const char* chunks, const Around& a, int n, char* out, size_t elem) {
  const int64_t m = a.len, chunk = a.outer * m * a.inner;
  for (int c = 0; c < n; ++c) {
    for (int64_t o = 0; o < a.outer; ++o) {
      std::memcpy(out + (o * n * m + c * m) * a.inner * elem,
                  chunks + (c * chunk + o * m * a.inner) * elem, elem * m * a.inner);
    }
  }
}

static void pack(const float* in, const Around& a, int n, float* out) {
  pack(reinterpret_cast<const char*>(in), a, n, reinterpret_cast<char*>(out), sizeof(float));
}
static void unpack(const float* chunks, const Around& a, int n, float* out) {
  unpack(reinterpret_cast<const char*>(chunks), a, n, reinterpret_cast<char*>(out), sizeof(float));
}

void pack_chunks(const void* in, const Shape& shape, int dim, int n, void* out, DType dt) {
  pack(static_cast<const char*>(in), Around(shape, dim), n, static_cast<char*>(out),
       dtype_size(dt));
}
void unpack_chunks(const void* chunks, const Shape& chunk_shape, int dim, int n, void* out,
                   DType dt) {
  unpack(static_cast<const char*>(chunks), Around(chunk_shape, dim), n, static_cast<char*>(out),
         dtype_size(dt));
}
void pack_chunks(const float* in, const Shape& shape, int dim, int n, float* out) {
  pack_chunks(in, shape, dim, n, out, DType::F32);
}
void unpack_chunks(const float* chunks, const Shape& chunk_shape, int dim, int n, float* out) {
  unpack_chunks(chunks, chunk_shape, dim, n, out, DType::F32);
}

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
  unpack(chunks.data(), Around(before, st.src_dim), n, data->data());
  return Status::ok();
}

// P -> S(d): split d into n blocks, member c receives the sum of block c.
Status reshard_with_reduce_scatter(const ReshardStep& st, const Shape& before, Communicator& comm,
                                   std::vector<float>* data) {
  const int n = comm.size();
  std::vector<float> packed(data->size());
  pack(data->data(), Around(before, st.dst_dim), n, packed.data());
  data->assign(packed.size() / n, 0.f);
  return comm.reduce_scatter(packed.data(), data->size(), data->data(), ReduceOp::kSum);
}

// S(i) -> S(j): send block c of dim j to member c, concatenate what arrives along i.
Status reshard_with_all_to_all(const ReshardStep& st, const Shape& before, const Shape& after,
                               Communicator& comm, std::vector<float>* data) {
  const int n = comm.size();
  std::vector<float> packed(data->size()), got(data->size());
  pack(data->data(), Around(before, st.dst_dim), n, packed.data());
  MF_RETURN_IF_ERROR(comm.all_to_all(packed.data(), data->size() / n, got.data()));
  // One received chunk: the `after` shape with dim i still at its `before` size.
  Shape chunk = after.with_size(st.src_dim, before.size(st.src_dim));
  unpack(got.data(), Around(chunk, st.src_dim), n, data->data());
  return Status::ok();
}

// R -> S(d): keep block `coord` of dim d.
void reshard_with_local_slice(const ReshardStep& st, const Shape& before, int coord, int n,
                              std::vector<float>* data) {
  Around a(before, st.dst_dim);
  const int64_t m = a.len / n;
  std::vector<float> out(a.outer * m * a.inner);
  for (int64_t o = 0; o < a.outer; ++o) {
    std::memcpy(out.data() + o * m * a.inner, data->data() + (o * a.len + coord * m) * a.inner,
                sizeof(float) * m * a.inner);
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
