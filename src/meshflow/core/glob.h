// Shell-style name matching, as strategy keys, recompute_ops and cell names
// (parallel.pipeline.stage_of, train.recompute_layers) use it:
//
//   glob_match("h.*.mlp.*", "h.3.mlp.c_fc")   // true
#pragma once

#include <string>

namespace meshflow {

// '*' any run (also empty), '?' exactly one character; everything else itself.
bool glob_match(const std::string& pattern, const std::string& name);

}  // namespace meshflow
