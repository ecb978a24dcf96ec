// MeshComms: this rank's communicators, one per axis of a device mesh (the
// group along that axis through this rank), and the chunk packing the
// collectives on a non-leading dim need. Used by the reshard executor, the
// collective kernels and the gradient buckets.
//
//   auto comms = value_or_throw(MeshComms::make(Communicator::world(t), mesh));
//   comms.axis(1).all_reduce(buf, n);  // over the mesh's second axis
#pragma once

#include <memory>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/core/dtype.h"
#include "meshflow/core/mesh.h"
#include "meshflow/core/shape.h"
#include "meshflow/core/status.h"

namespace meshflow {

// One communicator per mesh axis: the group along that axis through this rank.
class MeshComms {
 public:
  // REQUIRES of the caller: world->size() == mesh.num_ranks(), world rank = mesh rank.
  static Result<MeshComms> make(std::shared_ptr<Communicator> world, const Mesh& mesh);
  Communicator& axis(int a) const { return *axes_[a]; }
  int rank() const { return world_->rank(); }
  // A new communicator over several axes at once: the ranks that share this
  // rank's coordinates on every other axis (one ring over dp x cp, say).
  // Every member must ask for the same groups in the same order.
  Result<std::shared_ptr<Communicator>> over(std::vector<int> axes) const;

 private:
  Mesh mesh_ = Mesh::line(1);
  std::shared_ptr<Communicator> world_;
  std::vector<std::shared_ptr<Communicator>> axes_;
};

// Chunk packing around one dim, shared with the collective kernels:
// pack_chunks: chunk c (contiguous) = in[.., c*m:(c+1)*m, ..] with m = shape[dim]/n.
// unpack_chunks: the inverse; chunk_shape is one chunk's shape.
void pack_chunks(const float* in, const Shape& shape, int dim, int n, float* out);
void unpack_chunks(const float* chunks, const Shape& chunk_shape, int dim, int n, float* out);
// The same for elements of any dtype.
void pack_chunks(const void* in, const Shape& shape, int dim, int n, void* out, DType dt);
void unpack_chunks(const void* chunks, const Shape& chunk_shape, int dim, int n, void* out,
                   DType dt);

}  // namespace meshflow
