// Offload to disk (ZeRO-Infinity's NVMe offload on this CPU backend): the
// optimizer state and, optionally, the parameters live in one memory-mapped
// file per executor instead of in RAM. While the executor runs, the values the
// next nodes read are prefetched (madvise WILLNEED: the kernel reads them
// ahead while the current node computes), and a value is released after a
// read whose next one is not close (its pages leave this process, their
// write-back to the file starts, and once written they leave the page cache),
// so only a window of the offloaded bytes is resident at a time and a model
// whose optimizer state exceeds RAM still trains. The numbers do not change:
// the same kernels read and write the same bytes, from the mapping.
//
//   OffloadOptions o{.optimizer = true, .dir = "/mnt/nvme"};
//   MF_RETURN_IF_ERROR(check_offload(g, o));      // the directory and its free space
//   MF_ASSIGN_OR_RETURN(auto file, OffloadFile::create(o.dir, bytes));
//   void* p = file->at(offset);                   // page-aligned storage of one value
//   OffloadStreamer s(file.get(), ranges);        // per value: offset and length
//   s.before(order, i); run(order[i]); s.after(order, i);
//
// The file is created with mkstemp in dir and unlinked at once: it takes disk
// space only while the run holds it, and a crash leaves nothing behind.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshflow/core/status.h"
#include "meshflow/ir/graph.h"

namespace meshflow {

struct OffloadOptions {
  bool optimizer = false;  // optimizer state (State values) on disk
  bool params = false;     // parameters on disk too (ZeRO-3 with offload)
  std::string dir;         // where the files go (an existing, writable directory)
  int lookahead = 8;       // nodes ahead whose offloaded inputs are prefetched
  bool active() const { return optimizer || params; }
  // The config key an active offload is named by in messages:
  // offload.optimizer "disk" (or offload.params).
  std::string key() const;
  // Is value v of g one this offload puts on disk?
  bool offloads(const Graph& g, ValueId v) const;
};

// Bytes offload puts on disk for g (each value rounded up to whole pages).
int64_t offload_bytes(const Graph& g, const OffloadOptions& o);

// The directory exists, is a directory, can be written, and has the bytes
// free; each failure is one line naming the directory and what would do.
Status check_offload(const Graph& g, const OffloadOptions& o);

// One unlinked, preallocated, shared mapping of `bytes` in `dir`.
class OffloadFile {
 public:
  static Result<std::unique_ptr<OffloadFile>> create(const std::string& dir, int64_t bytes);
  ~OffloadFile();
  OffloadFile(const OffloadFile&) = delete;
  OffloadFile& operator=(const OffloadFile&) = delete;

  void* at(int64_t offset) const { return base_ + offset; }
  int fd() const { return fd_; }
  int64_t size() const { return bytes_; }

 private:
  OffloadFile(int fd, char* base, int64_t bytes) : fd_(fd), base_(base), bytes_(bytes) {}
  int fd_;
  char* base_;
  int64_t bytes_;
};

// Prefetch and release of the offloaded values around each node an executor
// runs. Values are page-aligned ranges of the file.
class OffloadStreamer {
 public:
  struct Range {
    int64_t offset = -1, bytes = 0;  // offset -1: not offloaded
  };
  OffloadStreamer(OffloadFile* file, std::vector<Range> by_value, int lookahead);
  ~OffloadStreamer();

  // Called by Executor::run around order[i].
  void begin_run(const Graph& g, const std::vector<NodeId>& order);
  void before(size_t i);
  void after(size_t i);
  void end_run();  // waits for the write-back of what was released
  // After initialization (which wrote the values): every value out of RAM.
  void release_all();

  // Counters for tests and the bench.
  int64_t prefetches() const { return prefetches_; }
  int64_t releases() const { return releases_; }

 private:
  void prefetch(ValueId v);
  void release(ValueId v);
  void evict_old(size_t keep);

  OffloadFile* file_;
  std::vector<Range> ranges_;
  int lookahead_;
  std::vector<char> resident_;  // per value: prefetched or read since its last release
  // This run: each node's offloaded inputs and, per (node, input), the index
  // of that value's next read in the order (or SIZE_MAX).
  std::vector<std::vector<std::pair<ValueId, size_t>>> reads_;
  size_t prefetched_to_ = 0;           // nodes [.., prefetched_to_) have been prefetched
  std::vector<ValueId> written_back_;  // released, write-back started, still in page cache
  int64_t prefetches_ = 0, releases_ = 0;
};

}  // namespace meshflow
