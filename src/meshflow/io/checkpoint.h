// Sharded, full-state checkpoints: a directory per save, each rank writing the
// blocks it holds (no rank gathers the model), one manifest saying which file
// and offset holds which block of every tensor.
//
//   ROOT/step-00000020/manifest.json           the step, the plan, every tensor's blocks
//   ROOT/step-00000020/rank-00000.safetensors  rank 0's blocks (a valid safetensors file)
//   ROOT/step-00000020/rank-00000.json         rank 0's fragment of the manifest
//
// Saving, collectively (the engine runs the barriers between the steps):
//   rank 0:     MF_RETURN_IF_ERROR(prepare_checkpoint(root, step));
//   every rank: MF_RETURN_IF_ERROR(write_checkpoint_shard(root, step, rank, blocks));
//   rank 0:     MF_RETURN_IF_ERROR(commit_checkpoint(root, step, world, info, keep));
// Loading (any plan, any number of ranks: each rank reads the blocks it needs):
//   MF_ASSIGN_OR_RETURN(CheckpointManifest m, open_checkpoint(dir_or_root));
//   CheckpointReader reader(m);
//   MF_RETURN_IF_ERROR(reader.read(name, global_shape, my_ranges, &my_block));
//
// Atomicity: a save is staged in ROOT/.step-00000020.partial and renamed to
// its final name by rank 0 after the manifest (written last) is complete, so
// a crash at any point leaves the previous checkpoints as they were and no
// directory that open_checkpoint takes for complete. Older checkpoints are
// removed (beyond `keep`) only after the new one is in place.
//
// Integrity: the manifest records each file's size and CRC-32 and each
// block's CRC-32; a reader checks the size of every file it opens and the
// CRC of every block it reads, so a truncated or corrupted shard is an error
// naming the file and the tensor, never a wrong load.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "meshflow/core/shape.h"
#include "meshflow/core/status.h"
#include "meshflow/core/tensor.h"

namespace meshflow {

// Per dim, the half-open global index range [first, second) of a block.
using IndexRanges = std::vector<std::pair<int64_t, int64_t>>;

// One block of a tensor that a rank holds and writes.
struct CheckpointBlock {
  std::string name;              // the (global) tensor's name
  std::string kind;              // "parameter", "buffer" or "optimizer"
  Shape global;                  // the tensor's global shape (dims named)
  IndexRanges ranges;            // the block (one range per dim of `global`)
  const Tensor* data = nullptr;  // F32 or I32, the block's sizes
};

// ROOT/step-00000020: where the checkpoint of `step` under `root` lives.
std::string checkpoint_dir(const std::string& root, int64_t step);

// Rank 0, before the others write: creates `root` and an empty staging
// directory for `step` (removing a stale one left by a crashed save).
// Errors name the directory (unwritable, a file in the way, disk full).
Status prepare_checkpoint(const std::string& root, int64_t step);

// Every rank, after prepare_checkpoint: writes its blocks (names unique) to
// rank-RRRRR.safetensors in the staging directory, then its fragment of the
// manifest, rank-RRRRR.json (each block's name, kind, dtype, global shape,
// dim names, ranges, byte offset and CRC-32; the file's size and CRC-32).
Status write_checkpoint_shard(const std::string& root, int64_t step, int rank,
                              const std::vector<CheckpointBlock>& blocks);

// Rank 0, after every rank's write_checkpoint_shard: merges the `world`
// fragments into manifest.json with `info` (the engine's: plan, config, data
// cursor, ...), checks that the blocks of each tensor tile it exactly (no gap,
// no overlap, one shape and kind), renames the staging directory to
// checkpoint_dir(root, step), then removes the oldest complete checkpoints
// beyond `keep` (0 keeps all). A checkpoint already at that name is replaced.
Status commit_checkpoint(const std::string& root, int64_t step, int world,
                         const nlohmann::json& info, int keep);

struct CheckpointTensor {
  std::string kind;
  DType dtype = DType::F32;
  Shape global;  // dims named as the model names them
  struct Block {
    std::string file;  // in the checkpoint directory
    uint64_t offset = 0;
    IndexRanges ranges;
    uint32_t crc32 = 0;
  };
  std::vector<Block> blocks;
};

struct CheckpointManifest {
  std::string dir;  // the checkpoint directory (step-...)
  int64_t step = 0;
  nlohmann::json info;                                         // as commit_checkpoint got it
  std::map<std::string, CheckpointTensor> tensors;             // by name
  std::map<std::string, std::pair<uint64_t, uint32_t>> files;  // name -> (bytes, CRC-32)
};

// `path`: a checkpoint directory (holding manifest.json), or a root whose
// latest complete checkpoint (the highest step-* with a manifest) is opened.
// The manifest is validated whole (format, version, every block inside its
// tensor and in a listed file). Errors name the path and what is wrong.
Result<CheckpointManifest> open_checkpoint(const std::string& path);

// The checkpoint directories under `root`, complete ones only, oldest first.
std::vector<std::string> list_checkpoints(const std::string& root);

// Reads blocks of a checkpoint's tensors, each from the files that hold the
// parts it needs (not whole files, not other ranks' blocks it does not need).
class CheckpointReader {
 public:
  explicit CheckpointReader(CheckpointManifest m) : m_(std::move(m)) {}
  const CheckpointManifest& manifest() const { return m_; }
  // Fills *dst, the block `ranges` of tensor `name` (its sizes and dtype),
  // from every checkpoint block that overlaps it. Errors: no tensor of that
  // name; another global shape (sizes) or dtype; a file missing or not of
  // its recorded size; a block whose CRC-32 does not match (corrupt); a part
  // of the block no checkpoint block covers.
  Status read(const std::string& name, const Shape& global, const IndexRanges& ranges, Tensor* dst);
  // The whole tensor (every block read).
  Result<Tensor> read_whole(const std::string& name);

 private:
  Status check_file(const std::string& file);
  CheckpointManifest m_;
  std::map<std::string, bool> checked_;  // files whose size was checked
};

}  // namespace meshflow
