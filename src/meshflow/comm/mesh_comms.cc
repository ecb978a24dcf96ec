#include "meshflow/comm/mesh_comms.h"

#include <algorithm>
#include <cstring>
#include <string>

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
  c.mesh_ = mesh;
  return c;
}

Result<std::shared_ptr<Communicator>> MeshComms::over(std::vector<int> axes) const {
  for (int a : axes)
    if (a < 0 || a >= mesh_.num_axes())
      return Status::invalid("mesh axis " + std::to_string(a) + " is not an axis of " +
                             mesh_.to_string());
  const std::vector<int> mine = mesh_.coords(world_->rank());
  std::vector<int> group;
  for (int r = 0; r < mesh_.num_ranks(); ++r) {
    const std::vector<int> c = mesh_.coords(r);
    bool same = true;
    for (int a = 0; a < mesh_.num_axes() && same; ++a)
      same = std::find(axes.begin(), axes.end(), a) != axes.end() || c[a] == mine[a];
    if (same) group.push_back(r);
  }
  return world_->split(group);
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

}  // namespace meshflow
