// verify(): the invariants of a Graph that need the op table (each node's
// input count and output types against its op's shape rule, no read after an
// in-place update). It lives in the ops layer, above the graph data structure,
// because it consults op_def().
//
//   MF_RETURN_IF_ERROR(verify(g));
//   debug_verify(g, "recompute");  // end of a pass: checked in debug builds
#pragma once

#include "meshflow/core/status.h"
#include "meshflow/ir/graph.h"

namespace meshflow {

// Checks the graph's invariants (ir/graph.h): inputs defined before use, output types match
// the op's shape rule, no read of a source after an op mutated it (except by a
// later in-place writer of it: weights grouping's broadcast), names unique for
// sources. Returns the first violation, naming the node.
Status verify(const Graph& g);

// Run at the end of every pass: in debug builds, verify(g) and stop with the
// pass's name on a violation; in release builds, nothing (callers that take a
// graph from outside verify it explicitly).
void debug_verify(const Graph& g, const char* pass);

}  // namespace meshflow
