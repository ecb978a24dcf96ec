// safetensors: read and write the Hugging Face tensor file format, and save /
// load all parameters of an Executor as a checkpoint.
//
// The format: an 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// then the raw little-endian data; offsets are relative to the end of the header.
//
// Invariants: files are written atomically (path + ".tmp", fsync, rename), so a
// crash leaves either the old file or the new one, never a truncated one. A file
// is validated completely (offsets in range, sizes match shapes, no overlaps)
// before any tensor is returned or any parameter is overwritten.
//
//   MF_RETURN_IF_ERROR(write_safetensors("w.safetensors", {{"w", t}}, {{"step", "10"}}));
//   MF_ASSIGN_OR_RETURN(SafetensorsFile f, read_safetensors("w.safetensors"));
//   Tensor& w = f.tensors.at("w");          // dims named "" (the file has no dim names)
//
//   MF_RETURN_IF_ERROR(save_parameters(ex, "ckpt.safetensors"));
//   MF_RETURN_IF_ERROR(load_parameters(ex, "ckpt.safetensors"));  // checks names and shapes
//
// dtypes: F32 and I32 are read and written as they are; BF16 and F16 are read
// and converted to F32 (for loading real model weights). Others are an error.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "meshflow/core/status.h"
#include "meshflow/core/tensor.h"
#include "meshflow/ir/graph.h"

namespace meshflow {

// What holds a graph's parameters and optimizer state while it trains: the
// runtime's Executor (runtime/executor.h) is one. Checkpoints read and write
// through it, so this file does not depend on the runtime above it.
class ParameterStore {
 public:
  virtual ~ParameterStore() = default;
  virtual const Graph& graph() const = 0;
  virtual Tensor& storage(ValueId v) = 0;  // the value's persistent tensor
};

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;        // F32 or I32; dims have empty names
  std::map<std::string, std::string> metadata;  // the "__metadata__" object
};

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// What write_safetensors wrote: the file's size and CRC-32 (zlib's), and
// where each tensor's data starts in the file (absolute byte offsets, in the
// order given).
struct SafetensorsWritten {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
  std::vector<uint64_t> offsets;
  std::vector<uint32_t>
      tensor_crc32;  // each tensor's data's CRC-32 (one pass: the file's combines them)
};

// Writes `tensors` (F32 or I32, unique non-empty names, not "__metadata__") in
// the given order. Atomic: writes path + ".tmp", fsyncs it, renames it over path.
// written (may be null): filled on success.
Status write_safetensors(const std::string& path, const NamedTensors& tensors,
                         const std::map<std::string, std::string>& metadata = {},
                         SafetensorsWritten* written = nullptr);

// zlib's CRC-32 of `n` bytes, continuing from `crc` (0 to start).
uint32_t crc32_of(const void* data, size_t n, uint32_t crc = 0);

// Reads and validates a whole file. Errors name the file and what is wrong.
Result<SafetensorsFile> read_safetensors(const std::string& path);
// Checkpoint loaders: every F32 tensor finite (a NaN or Inf weight is a corrupt
// file or a diverged run's, refused before training instead of a NaN loss).
Status check_finite_weights(const SafetensorsFile& file, const std::string& path);

// The dtype names this reader accepts, for error messages: "F32, I32, BF16, F16".
std::string safetensors_supported_dtypes();

struct CheckpointOptions {
  // Also save / require the optimizer state values (g.states(): AdamW moments,
  // step counters), so a run can resume exactly.
  bool optimizer_state = false;
};

// Saves every parameter of the executor's graph under its value name.
Status save_parameters(ParameterStore& ex, const std::string& path,
                       const std::map<std::string, std::string>& metadata = {},
                       CheckpointOptions options = {});

// Loads a checkpoint written by save_parameters (or any file with the same
// names and shapes). Every parameter must be present with the model's sizes,
// and every tensor in the file must match a parameter; otherwise nothing is
// changed and the error names the tensor:
//   "checkpoint 'x.safetensors': parameter 'h.0.ln_1.weight' has shape [256] in
//    the file but [512] in the model"
// On success returns the file's metadata.
Result<std::map<std::string, std::string>> load_parameters(ParameterStore& ex,
                                                           const std::string& path,
                                                           CheckpointOptions options = {});

}  // namespace meshflow
