// Runs a ReshardPlan on this rank's local shard with a Communicator: each step
// is one collective on the sub-group of its mesh axis (or a local copy).
// Local data is the row-major local shard (local_shape() of the layout);
// around all_gather / reduce_scatter / all_to_all on a dim that is not the
// leading one, the blocks are packed into / unpacked from contiguous chunks.
//
//   auto comms = value_or_throw(MeshComms::make(Communicator::world(t), mesh));
//   auto plan = value_or_throw(plan_reshard(shape, mesh, src, dst));
//   std::vector<float> x = my_src_shard;               // local_shape(shape, mesh, src)
//   MF_RETURN_IF_ERROR(run_reshard(plan, shape, mesh, comms, &x));  // now the dst shard
//
// Every rank of the mesh must run the same plans in the same order (SPMD).
#pragma once

#include <memory>
#include <vector>

#include "meshflow/core/shape.h"
#include "meshflow/core/status.h"
#include "meshflow/parallel/mesh.h"
#include "meshflow/parallel/reshard.h"
#include "meshflow/comm/communicator.h"

namespace meshflow {

// One communicator per mesh axis: the group along that axis through this rank.
class MeshComms {
 public:
  // REQUIRES of the caller: world->size() == mesh.num_ranks(), world rank = mesh rank.
  static Result<MeshComms> make(std::shared_ptr<Communicator> world, const Mesh& mesh);
  Communicator& axis(int a) const { return *axes_[a]; }
  int rank() const { return world_->rank(); }

 private:
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

// Replaces *data (this rank's shard under plan.src) by its shard under plan.dst.
Status run_reshard(const ReshardPlan& plan, const Shape& shape, const Mesh& mesh,
                   const MeshComms& comms, std::vector<float>* data);

}  // namespace meshflow
