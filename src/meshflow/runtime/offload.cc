#include "meshflow/runtime/offload.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "meshflow/core/check.h"
#include "meshflow/core/dtype.h"

namespace meshflow {

namespace {

int64_t page_size() {
  static const int64_t kPage = sysconf(_SC_PAGE_SIZE);
  return kPage;
}

int64_t round_to_pages(int64_t bytes) {
  const int64_t p = page_size();
  return (bytes + p - 1) / p * p;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

std::string what(const OffloadOptions& o) {
  return o.optimizer && o.params ? "the optimizer state and the parameters"
         : o.optimizer           ? "the optimizer state"
                                 : "the parameters";
}

}  // namespace

std::string OffloadOptions::key() const {
  return std::string("offload.") + (optimizer ? "optimizer" : "params") + " \"disk\"";
}

bool OffloadOptions::offloads(const Graph& g, ValueId v) const {
  const OpKind k = g.producer(v).kind;
  return (optimizer && k == OpKind::kState) || (params && k == OpKind::kParameter);
}

int64_t offload_bytes(const Graph& g, const OffloadOptions& o) {
  int64_t bytes = 0;
  if (!o.active()) return 0;
  for (ValueId v = 0; v < g.num_values(); ++v)
    if (o.offloads(g, v))
      bytes +=
          round_to_pages(g.shape(v).numel() * static_cast<int64_t>(dtype_size(g.value(v).dtype)));
  return bytes;
}

Status check_offload(const Graph& g, const OffloadOptions& o) {
  if (!o.active()) return Status::ok();
  const std::string dir = "offload.dir \"" + o.dir + "\"";
  if (o.dir.empty())
    return Status::invalid("offload needs \"dir\": an existing directory on a disk with room for " +
                           what(o));
  struct stat st {};
  if (::stat(o.dir.c_str(), &st) != 0)
    return Status::invalid(dir + " does not exist (" + std::strerror(errno) +
                           "); create it or name an existing directory");
  if (!S_ISDIR(st.st_mode)) return Status::invalid(dir + " is not a directory");
  if (::access(o.dir.c_str(), W_OK | X_OK) != 0)
    return Status::invalid(dir + " cannot be written (" + std::strerror(errno) +
                           "); name a directory this user can write");
  struct statvfs fs {};
  if (::statvfs(o.dir.c_str(), &fs) != 0)
    return Status::invalid(dir + ": cannot read its free space (" + std::strerror(errno) + ")");
  const double free_bytes = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize);
  const double need = static_cast<double>(offload_bytes(g, o));
  if (need > free_bytes)
    return Status::invalid(dir + " has " + gib(free_bytes) + " free; " + what(o) +
                           " of this rank need " + gib(need) +
                           ": free space there or name a larger disk");
  return Status::ok();
}

Result<std::unique_ptr<OffloadFile>> OffloadFile::create(const std::string& dir, int64_t bytes) {
  std::string path = dir + "/meshflow-offload-XXXXXX";
  const int fd = ::mkstemp(path.data());
  if (fd < 0)
    return Status::invalid("offload.dir \"" + dir + "\": cannot create a file there (" +
                           std::strerror(errno) + ")");
  ::unlink(path.c_str());  // space held only while mapped; nothing left behind
  if (bytes > 0) {
    if (const int err = ::posix_fallocate(fd, 0, bytes); err != 0) {
      ::close(fd);
      return Status::invalid("offload.dir \"" + dir + "\": cannot reserve " +
                             gib(static_cast<double>(bytes)) + " (" + std::strerror(err) +
                             "); free space there or name a larger disk");
    }
  }
  void* base = bytes > 0 ? ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                                  MAP_SHARED, fd, 0)
                         : nullptr;
  if (base == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    return Status::invalid("offload.dir \"" + dir + "\": cannot map " +
                           gib(static_cast<double>(bytes)) + " (" + std::strerror(err) + ")");
  }
  return std::unique_ptr<OffloadFile>(new OffloadFile(fd, static_cast<char*>(base), bytes));
}

OffloadFile::~OffloadFile() {
  if (base_) ::munmap(base_, static_cast<size_t>(bytes_));
  ::close(fd_);
}

OffloadStreamer::OffloadStreamer(OffloadFile* file, std::vector<Range> by_value, int lookahead)
    : file_(file),
      ranges_(std::move(by_value)),
      lookahead_(std::max(0, lookahead)),
      resident_(ranges_.size(), 1) {}  // freshly initialized: in the page cache

OffloadStreamer::~OffloadStreamer() = default;

void OffloadStreamer::begin_run(const Graph& g, const std::vector<NodeId>& order) {
  reads_.assign(order.size(), {});
  prefetched_to_ = 0;
  std::unordered_map<ValueId, size_t> next;  // value -> its next read after the current index
  for (size_t i = order.size(); i-- > 0;) {
    std::vector<std::pair<ValueId, size_t>>& r = reads_[i];
    for (ValueId v : g.node(order[i]).inputs) {
      if (static_cast<size_t>(v) >= ranges_.size() || ranges_[v].offset < 0) continue;
      bool seen = false;
      for (const auto& [u, n] : r) seen = seen || u == v;
      if (seen) continue;
      auto it = next.find(v);
      r.emplace_back(v, it == next.end() ? std::numeric_limits<size_t>::max() : it->second);
    }
    for (const auto& [v, n] : r) next[v] = i;
  }
}

void OffloadStreamer::before(size_t i) {
  const size_t end = std::min(reads_.size(), i + static_cast<size_t>(lookahead_) + 1);
  for (size_t j = std::max(prefetched_to_, i); j < end; ++j)
    for (const auto& [v, n] : reads_[j])
      if (!resident_[v]) prefetch(v);
  prefetched_to_ = std::max(prefetched_to_, end);
}

void OffloadStreamer::after(size_t i) {
  for (const auto& [v, n] : reads_[i])
    if (n == std::numeric_limits<size_t>::max() || n > i + static_cast<size_t>(lookahead_))
      release(v);
}

void OffloadStreamer::end_run() {
  evict_old(0);
  reads_.clear();
}

void OffloadStreamer::release_all() {
  for (size_t v = 0; v < ranges_.size(); ++v)
    if (ranges_[v].offset >= 0) release(static_cast<ValueId>(v));
  evict_old(0);
}

void OffloadStreamer::prefetch(ValueId v) {
  const Range& r = ranges_[v];
  ::madvise(file_->at(r.offset), static_cast<size_t>(r.bytes), MADV_WILLNEED);
  resident_[v] = 1;
  ++prefetches_;
}

void OffloadStreamer::release(ValueId v) {
  const Range& r = ranges_[v];
  // Out of this process (a shared mapping keeps its dirty pages in the page
  // cache: nothing is lost), and its write-back to the file started.
  ::madvise(file_->at(r.offset), static_cast<size_t>(r.bytes), MADV_DONTNEED);
  ::sync_file_range(file_->fd(), r.offset, r.bytes, SYNC_FILE_RANGE_WRITE);
  resident_[v] = 0;
  written_back_.push_back(v);
  ++releases_;
  evict_old(4);
}

// Out of the page cache too, once written: the oldest released values beyond
// `keep` (those read again since stay).
void OffloadStreamer::evict_old(size_t keep) {
  while (written_back_.size() > keep) {
    const ValueId v = written_back_.front();
    written_back_.erase(written_back_.begin());
    if (resident_[v]) continue;
    const Range& r = ranges_[v];
    ::sync_file_range(
        file_->fd(), r.offset, r.bytes,
        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    ::posix_fadvise(file_->fd(), r.offset, r.bytes, POSIX_FADV_DONTNEED);
  }
}

}  // namespace meshflow
