// The files a user names (run configs, model, cluster and plan JSON,
// checkpoints, metrics, traces), read and written so that no name can crash,
// hang or exhaust memory. Inputs must be regular files under a size limit (a
// device such as /dev/zero never ends, a FIFO blocks). Outputs are checked
// before the work that produces them, and an atomic write never renames over
// something that is not a regular file (a device node, a directory).
//
//   MF_ASSIGN_OR_RETURN(std::string text, read_regular_file(path));
//   MF_RETURN_IF_ERROR(check_output_file(ckpt, "--checkpoint"));   // before training
//   MF_RETURN_IF_ERROR(write_file_atomic(out, text, "--out"));
//
// Errors are Status values whose message names the path and what is valid;
// no function here throws.
#pragma once

#include <cstdint>
#include <string>

#include "meshflow/core/status.h"

namespace meshflow {

// The largest input file read_regular_file accepts by default: far above any
// config, model or cluster JSON, far below what would strain memory.
inline constexpr int64_t kMaxInputFileBytes = int64_t{64} << 20;

// The whole content of the regular file `path`, of at most max_bytes bytes.
//   not_found: "cannot open 'x.json': no such file"
//   invalid:   "'/dev/zero' is not a regular file (it is a character device)"
//   invalid:   "'big.json' is larger than the 64 MiB limit for input files"
Result<std::string> read_regular_file(const std::string& path,
                                      int64_t max_bytes = kMaxInputFileBytes);

enum class OutputTarget {
  kFile,    // a regular file or nothing yet (it may be replaced atomically)
  kStream,  // also a character device such as /dev/stdout or /dev/null (written in place)
};

// Checks, without changing anything, that `path` can be written: an existing
// target is a regular file (or, for kStream, a character device) this process
// can open for writing (opened for append, never truncated); a new one lies in
// an existing directory this process can write to. `what` names the option in
// messages ("--checkpoint", "train.checkpoint").
Status check_output_file(const std::string& path, const std::string& what,
                         OutputTarget target = OutputTarget::kFile);

// Writes `data` to path + ".tmp" and renames it over `path`, after the checks
// of check_output_file: a crash leaves the old file or the new one, and a
// device node or directory at `path` is an error, never replaced.
Status write_file_atomic(const std::string& path, const std::string& data, const std::string& what);

// "a character device", "a directory", ... for the file type bits of st_mode.
std::string file_kind_name(unsigned mode);

}  // namespace meshflow
