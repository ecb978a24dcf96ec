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

#include "meshflow/comm/mesh_comms.h"
#include "meshflow/core/mesh.h"
#include "meshflow/core/shape.h"
#include "meshflow/core/status.h"
#include "meshflow/parallel/reshard.h"

namespace meshflow {

// Replaces *data (this rank's shard under plan.src) by its shard under plan.dst.
Status run_reshard(const ReshardPlan& plan, const Shape& shape, const Mesh& mesh,
                   const MeshComms& comms, std::vector<float>* data);

}  // namespace meshflow
