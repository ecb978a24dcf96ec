// Weights grouping (MindSpore's optimizer "weights grouping", PyTorch's
// ZeroRedundancyOptimizer, Lightning's "ddp_sharded"): ZeRO stage 1 by whole
// parameters. The gradients are all-reduced as in plain data parallel; each
// parameter is owned by one coordinate of the data-parallel mesh axis, only
// its owner keeps its optimizer state and runs its update, and the owner
// broadcasts the updated weight to the others (parallel/partition.cc lowers
// it so). The groups are balanced by size with LPT (largest parameter first,
// to the least-loaded group): the largest group sets every rank's optimizer
// memory and time, (N-1)/N of both saved with an even split.
//
// Invariant: every parameter with an optimizer update is in exactly one
// group, and every group owns at least one parameter (else the grouping
// "cannot balance": an error). Deterministic: ties go to the parameter first
// in graph order and to the lower coordinate.
//
//   std::vector<int> owner = balance_groups({40, 30, 20, 10}, 2);  // {0, 1, 1, 0}
//   WeightGroups wg = value_or_throw(group_weights(g, mesh, dp_axis, local_bytes));
//   int root = wg.owner_of(param);  // its coordinate on dp; -1: not grouped
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "meshflow/core/mesh.h"
#include "meshflow/core/status.h"
#include "meshflow/ir/graph.h"

namespace meshflow {

// LPT: item i (of bytes[i]) -> its group in [0, groups). Items by size,
// largest first (equal sizes in index order), each to the group with the
// fewest bytes so far (ties: the lower group). REQUIRES: groups >= 1.
std::vector<int> balance_groups(const std::vector<int64_t>& bytes, int groups);

struct WeightGroups {
  int axis = -1;  // the mesh axis the groups are spread over; -1: no grouping
  int groups = 0;
  // Per grouped parameter, in the graph order of its update: the parameter,
  // its bytes on one rank (its stored layout's block), its owner, the update
  // node and the optimizer state values the update mutates.
  struct Member {
    ValueId param = kNoValue;
    int64_t bytes = 0;
    int owner = -1;
    NodeId update = -1;
    std::vector<ValueId> states;
  };
  std::vector<Member> members;
  std::vector<int64_t> group_bytes;  // per coordinate: its parameters' bytes
  std::vector<int> group_params;     // per coordinate: how many parameters it owns

  bool on() const { return axis >= 0; }
  // The owner of a grouped parameter or of one of its optimizer states; -1 otherwise.
  int owner_of(ValueId v) const;
  // The largest group's bytes over an even split's (1: perfectly balanced).
  double imbalance() const;
  // "weights groups over dp (4): 0: 5 parameters 12.0 KiB | 1: ... ; largest 1.02 x even"
  std::string summary(const Mesh& mesh) const;

 private:
  friend Result<WeightGroups> group_weights(const Graph&, const Mesh&, int,
                                            const std::function<int64_t(ValueId)>&);
  std::map<ValueId, int> owner_;  // parameters and their optimizer states
};

// The groups of `g`'s optimizer updates over mesh axis `axis`, balanced by
// `local_bytes(param)` (a parameter's bytes on one rank). Errors (a user's
// plan): no such axis, an axis of size 1 (one group: nothing to split), fewer
// parameters than groups (some rank would own nothing).
Result<WeightGroups> group_weights(const Graph& g, const Mesh& mesh, int axis,
                                   const std::function<int64_t(ValueId)>& local_bytes);

}  // namespace meshflow
