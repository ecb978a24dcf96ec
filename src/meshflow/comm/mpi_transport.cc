// The mpi Transport: blocking point-to-point over a duplicate of
// MPI_COMM_WORLD, every MPI call checked by MF_MPI_CALL (rank, call,
// file:line and MPI_Error_string). See mpi_transport.h for the wire format.
#include "meshflow/comm/mpi_transport.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace meshflow {

bool launched_by_mpirun() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

}  // namespace meshflow

#ifndef MESHFLOW_HAVE_MPI

namespace meshflow {

bool mpi_compiled() {
  return false;
}

Result<std::shared_ptr<Transport>> make_mpi_transport() {
  return Status::failed_precondition(
      "the mpi backend is not available: meshflow was built without MPI (CMake did not find "
      "it); install libopenmpi-dev (scripts/install-deps.sh) and rebuild, or use the local "
      "backend (--ranks N)");
}

}  // namespace meshflow

#else  // MESHFLOW_HAVE_MPI

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "meshflow/core/check.h"

namespace meshflow {
namespace {

// World rank of this process once MPI is up, for error messages; -1 before.
std::atomic<int> g_world_rank{-1};

std::string rank_name() {
  int r = g_world_rank.load();
  return r < 0 ? std::string("rank ?") : "rank " + std::to_string(r);
}

// The Status of one MPI call: ok, or "rank R: MPI_Send(...) failed at file:line: <MPI message>".
Status mpi_status(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) return Status::ok();
  char msg[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS || len < 0 || len > MPI_MAX_ERROR_STRING) {
    len = 0;
  }
  msg[len] = '\0';
  const char* base = std::strrchr(file, '/');
  return Status::unavailable(rank_name() + ": " + call + " failed at " + (base ? base + 1 : file) +
                             ":" + std::to_string(line) + ": " +
                             (len > 0 ? msg : "unknown MPI error " + std::to_string(rc)));
}

}  // namespace
}  // namespace meshflow

// Every MPI call goes through this: it evaluates to a Status.
#define MF_MPI_CALL(call) ::meshflow::mpi_status((call), #call, __FILE__, __LINE__)

namespace meshflow {
namespace {

// Prefix of every message; the payload follows it (inline) or comes as
// separate messages with the same MPI tag (large payloads).
struct WireHeader {
  uint64_t tag;
  uint64_t bytes;
};
constexpr size_t kHeader = sizeof(WireHeader);
// Payloads up to this size travel in the header's message (one copy each
// side, one message); larger ones go from/to the user's buffer directly.
constexpr size_t kInlineBytes = 32 << 10;
// The largest single MPI message payload (MPI counts are int);
// MESHFLOW_MPI_CHUNK_BYTES lowers it so tests cover the split path cheaply.
constexpr size_t kMaxChunkBytes = size_t{1} << 30;

// Per-thread staging buffers for headers and inline payloads: a send and a
// receive may be in flight at once (send_recv).
std::vector<char>& staging(int which) {
  thread_local std::vector<char> buf[2];
  if (buf[which].empty()) buf[which].resize(kHeader + kInlineBytes);
  return buf[which];
}

// splitmix64's finalizer: spreads (group id, sequence number) tags over the
// low bits that MPI's tag range keeps.
uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%" PRIx64, v);
  return b;
}

// A payload of `bytes` is sent as num_chunks() messages of up to `chunk` bytes.
int num_chunks(size_t bytes, size_t chunk) {
  return static_cast<int>((bytes + chunk - 1) / chunk);
}
int chunk_len(size_t bytes, size_t chunk, int i) {
  return static_cast<int>(std::min(chunk, bytes - static_cast<size_t>(i) * chunk));
}

using Clock = std::chrono::steady_clock;

// The pending MPI requests of one call.
using Requests = std::vector<MPI_Request>;

// What a wait is for, named in its timeout error; -1: no such peer.
struct Waiting {
  const char* call;
  int to;
  size_t send_bytes;
  int from;
  size_t recv_bytes;
  uint64_t tag;
};

class MpiTransport final : public Transport {
 public:
  MpiTransport(MPI_Comm comm, int rank, int size, int tag_bits, size_t chunk_bytes,
               double timeout_s)
      : comm_(comm),
        rank_(rank),
        size_(size),
        tag_mask_((uint64_t{1} << tag_bits) - 1),
        chunk_(chunk_bytes),
        timeout_s_(timeout_s) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  Status send(int peer, uint64_t tag, const void* data, size_t bytes) override {
    MF_RETURN_IF_ERROR(check_peer(peer, "send", data, bytes));
    Requests reqs;
    MF_RETURN_IF_ERROR(post_send(peer, tag, data, bytes, staging(0), reqs));
    return wait(reqs, nullptr, {"send", peer, bytes, -1, 0, tag});
  }

  Status recv(int peer, uint64_t tag, void* data, size_t bytes) override {
    MF_RETURN_IF_ERROR(check_peer(peer, "recv", data, bytes));
    Requests reqs(1);
    std::vector<char>& buf = staging(1);
    MF_RETURN_IF_ERROR(post_head_recv(peer, tag, buf, &reqs[0]));
    MPI_Status st;
    MF_RETURN_IF_ERROR(wait(reqs, &st, {"recv", -1, 0, peer, bytes, tag}));
    MF_RETURN_IF_ERROR(unpack(buf.data(), st, peer, tag, data, bytes));
    reqs.clear();
    MF_RETURN_IF_ERROR(post_payload_recv(peer, tag, data, bytes, reqs));
    return wait(reqs, nullptr, {"recv", -1, 0, peer, bytes, tag});
  }

  // Sends and receives are all non-blocking and completed together, so a
  // ring where every rank calls this at once cannot deadlock whether MPI
  // buffers or not.
  Status send_recv(int send_peer, const void* send_data, size_t send_bytes, int recv_peer,
                   void* recv_data, size_t recv_bytes, uint64_t tag) override {
    MF_RETURN_IF_ERROR(check_peer(send_peer, "send_recv (send)", send_data, send_bytes));
    MF_RETURN_IF_ERROR(check_peer(recv_peer, "send_recv (recv)", recv_data, recv_bytes));
    std::vector<char>& rbuf = staging(1);
    Requests head(1), reqs;
    MF_RETURN_IF_ERROR(post_head_recv(recv_peer, tag, rbuf, &head[0]));
    MF_RETURN_IF_ERROR(post_send(send_peer, tag, send_data, send_bytes, staging(0), reqs));
    MPI_Status st;
    Status s = wait(head, &st, {"send_recv", -1, 0, recv_peer, recv_bytes, tag});
    if (s.is_ok()) s = unpack(rbuf.data(), st, recv_peer, tag, recv_data, recv_bytes);
    if (!s.is_ok()) {
      release(reqs);  // the sends may never be received
      return s;
    }
    MF_RETURN_IF_ERROR(post_payload_recv(recv_peer, tag, recv_data, recv_bytes, reqs));
    return wait(reqs, nullptr, {"send_recv", send_peer, send_bytes, recv_peer, recv_bytes, tag});
  }

  // MPI_Isend's requests and the header they read, owned by the handle;
  // finish() completes them as wait() does (a peer that never receives is a
  // timeout, not a hang).
  class MpiPendingSend final : public PendingSend {
   public:
    MpiPendingSend(MpiTransport* t, int peer, uint64_t tag, size_t bytes)
        : t_(t), peer_(peer), tag_(tag), bytes_(bytes), head_(kHeader + kInlineBytes) {}
    ~MpiPendingSend() override {
      if (!finished_) release(reqs_);
    }
    Status finish(bool give_up) override {
      if (finished_) return Status::ok();
      finished_ = true;
      if (give_up) {
        release(reqs_);
        return Status::unavailable(rank_name() + ": start_send (" + std::to_string(bytes_) +
                                   " bytes to rank " + std::to_string(peer_) + ", tag " +
                                   hex(tag_) + "): withdrawn");
      }
      return t_->wait(reqs_, nullptr, {"start_send", peer_, bytes_, -1, 0, tag_});
    }
    std::vector<char>& head() { return head_; }
    Requests& reqs() { return reqs_; }

   private:
    MpiTransport* t_;
    int peer_;
    uint64_t tag_;
    size_t bytes_;
    std::vector<char> head_;
    Requests reqs_;
    bool finished_ = false;
  };

  Result<std::unique_ptr<PendingSend>> start_send(int peer, uint64_t tag, const void* data,
                                                  size_t bytes) override {
    MF_RETURN_IF_ERROR(check_peer(peer, "start_send", data, bytes));
    auto p = std::make_unique<MpiPendingSend>(this, peer, tag, bytes);
    MF_RETURN_IF_ERROR(post_send(peer, tag, data, bytes, p->head(), p->reqs()));
    return std::unique_ptr<PendingSend>(std::move(p));
  }

  // How long a rank that lost a peer waits for mpirun to end the job.
  static constexpr int kPeerLostGraceS = 10;

  void abort(const std::string& reason) override {
    std::fprintf(stderr, "meshflow: rank %d failed: %s\n", rank_, reason.c_str());
    std::fflush(stderr);
    bool peer_lost = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      peer_lost = failure_.message().find("stopped communicating") != std::string::npos;
    }
    if (peer_lost) {
      // A peer stopped answering: its host may be cut off. mpirun then ends
      // the job itself once it notices the lost daemon (TCP keepalive), while
      // an abort (MPI_Abort, or this process exiting non-zero) would make it
      // wait forever for the daemon it cannot reach. So give mpirun that
      // time, then exit (a rank that is alive but silent: mpirun ends the
      // rest when this one exits non-zero).
      std::this_thread::sleep_for(std::chrono::seconds(kPeerLostGraceS));
      std::_Exit(1);
    }
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);  // MPI_Abort does not return; this is in case an MPI does
  }

  Status health() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

 private:
  int mpi_tag(uint64_t tag) const { return static_cast<int>(mix64(tag) & tag_mask_); }

  Status check_peer(int peer, const char* what, const void* data, size_t bytes) const {
    if (peer < 0 || peer >= size_) {
      return Status::invalid(rank_name() + ": " + what + " to/from rank " + std::to_string(peer) +
                             ", but the MPI job has ranks 0.." + std::to_string(size_ - 1));
    }
    if (data == nullptr && bytes > 0) {
      return Status::invalid(rank_name() + ": " + what + " with rank " + std::to_string(peer) +
                             ": null buffer for " + std::to_string(bytes) + " bytes");
    }
    return Status::ok();
  }

  // Isends the header message (with the payload when it is inline) and the
  // payload chunks; appends their requests.
  Status post_send(int peer, uint64_t tag, const void* data, size_t bytes, std::vector<char>& buf,
                   Requests& reqs) {
    const int mtag = mpi_tag(tag);
    const int head = pack(buf.data(), tag, data, bytes);
    reqs.emplace_back();
    MF_RETURN_IF_ERROR(
        fail(MF_MPI_CALL(MPI_Isend(buf.data(), head, MPI_BYTE, peer, mtag, comm_, &reqs.back()))));
    if (bytes <= kInlineBytes) return Status::ok();
    const char* p = static_cast<const char*>(data);
    for (int i = 0; i < num_chunks(bytes, chunk_); ++i) {
      reqs.emplace_back();
      MF_RETURN_IF_ERROR(fail(MF_MPI_CALL(MPI_Isend(p + i * chunk_, chunk_len(bytes, chunk_, i),
                                                    MPI_BYTE, peer, mtag, comm_, &reqs.back()))));
    }
    return Status::ok();
  }

  // Irecvs the next header message from `peer` into buf (room for any inline payload).
  Status post_head_recv(int peer, uint64_t tag, std::vector<char>& buf, MPI_Request* req) {
    return fail(MF_MPI_CALL(MPI_Irecv(buf.data(), static_cast<int>(buf.size()), MPI_BYTE, peer,
                                      mpi_tag(tag), comm_, req)));
  }

  // Irecvs the payload chunks that follow a header (none when it was inline).
  Status post_payload_recv(int peer, uint64_t tag, void* data, size_t bytes, Requests& reqs) {
    if (bytes <= kInlineBytes) return Status::ok();
    char* p = static_cast<char*>(data);
    for (int i = 0; i < num_chunks(bytes, chunk_); ++i) {
      reqs.emplace_back();
      MF_RETURN_IF_ERROR(
          fail(MF_MPI_CALL(MPI_Irecv(p + i * chunk_, chunk_len(bytes, chunk_, i), MPI_BYTE, peer,
                                     mpi_tag(tag), comm_, &reqs.back()))));
    }
    return Status::ok();
  }

  // Completes every request, polling MPI so that a peer that never answers
  // is an error after the timeout, not a hang. Polls flat out for the first
  // 100 us (a ring partner is usually there), then yields the core between
  // polls, and after 5 ms sleeps 50 us between them, so a progress thread
  // that waits long does not take a core from the computation it overlaps.
  // `status` (with a single request only) receives its status.
  Status wait(Requests& reqs, MPI_Status* status, const Waiting& what) {
    if (reqs.empty()) return Status::ok();
    const Clock::time_point start = Clock::now();
    const Clock::time_point deadline = start + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(timeout_s_));
    MF_CHECK(status == nullptr || reqs.size() == 1) << "a status is kept for one request only";
    for (uint32_t polls = 0;; ++polls) {
      int done = 0;
      MF_RETURN_IF_ERROR(
          fail(MF_MPI_CALL(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done,
                                       status ? status : MPI_STATUSES_IGNORE))));
      if (done) return Status::ok();
      if (polls < 64) continue;
      const Clock::time_point now = Clock::now();
      if (now >= deadline) break;
      if (now - start < std::chrono::microseconds(100)) continue;
      if (now - start < std::chrono::milliseconds(5)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    release(reqs);
    return fail(timed_out(what));
  }

  Status timed_out(const Waiting& w) const {
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%g", timeout_s_);
    std::string what = std::string(w.call) + " (";
    if (w.to >= 0) what += std::to_string(w.send_bytes) + " bytes to rank " + std::to_string(w.to);
    if (w.to >= 0 && w.from >= 0) what += ", ";
    if (w.from >= 0) {
      what += std::to_string(w.recv_bytes) + " bytes from rank " + std::to_string(w.from);
    }
    const bool two = w.to >= 0 && w.from >= 0 && w.to != w.from;
    const std::string culprit =
        two ? "ranks " + std::to_string(w.to) + " and " + std::to_string(w.from) +
                  " (or a rank "
                  "they wait for)"
            : "rank " + std::to_string(w.from >= 0 ? w.from : w.to) + " (or a rank it waits for)";
    return Status::unavailable(rank_name() + ": " + what + ", tag " + hex(w.tag) +
                               ") timed out after " + secs + " s: " + culprit +
                               " stopped communicating, or the ranks issued different "
                               "collectives (MESHFLOW_COMM_TIMEOUT_S sets the limit)");
  }

  // Gives up on requests that will not complete (after an error): receives
  // are cancelled, and all are freed so MPI finishes or drops them alone.
  static void release(Requests& reqs) {
    for (MPI_Request& r : reqs) {
      if (r == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
    reqs.clear();
  }

  // Writes the header, and the payload when it goes inline; returns the
  // message length.
  static int pack(char* buf, uint64_t tag, const void* data, size_t bytes) {
    WireHeader h{tag, bytes};
    std::memcpy(buf, &h, kHeader);
    if (bytes > kInlineBytes) return static_cast<int>(kHeader);
    if (bytes > 0) std::memcpy(buf + kHeader, data, bytes);
    return static_cast<int>(kHeader + bytes);
  }

  // Checks a received header against what this rank expected; copies an
  // inline payload out.
  Status unpack(const char* buf, const MPI_Status& st, int peer, uint64_t tag, void* data,
                size_t bytes) {
    int got = 0;
    MF_RETURN_IF_ERROR(fail(MF_MPI_CALL(MPI_Get_count(&st, MPI_BYTE, &got))));
    WireHeader h{};
    if (got >= static_cast<int>(kHeader)) std::memcpy(&h, buf, kHeader);
    const size_t want_len = kHeader + (bytes > kInlineBytes ? 0 : bytes);
    if (got < static_cast<int>(kHeader) || h.tag != tag || h.bytes != bytes ||
        static_cast<size_t>(got) != want_len) {
      return fail(Status::internal(
          rank_name() + ": message from rank " + std::to_string(peer) +
          " does not match the receive: expected tag " + hex(tag) + " with " +
          std::to_string(bytes) + " bytes, got tag " + hex(h.tag) + " with " +
          std::to_string(h.bytes) + " bytes (" + std::to_string(got) +
          " bytes on the wire); the ranks issued collectives in different orders or sizes"));
    }
    if (bytes <= kInlineBytes && bytes > 0) std::memcpy(data, buf + kHeader, bytes);
    return Status::ok();
  }

  // Remembers the first failure for health(); passes the status through.
  Status fail(Status s) {
    if (!s.is_ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (failure_.is_ok()) failure_ = s;
    }
    return s;
  }

  MPI_Comm comm_;
  int rank_;
  int size_;
  uint64_t tag_mask_;
  size_t chunk_;      // largest payload per MPI message
  double timeout_s_;  // a wait longer than this fails (comm_timeout_s())
  mutable std::mutex mu_;
  Status failure_;
};

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

// At exit: MPI_Finalize when the process succeeded; MPI_Abort when it failed,
// because MPI_Finalize would wait for ranks that are still inside
// collectives with this one (a hang, not an error).
void finalize_at_exit(int status, void*) {
  int finalized = 0;
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
  if (status != 0) {
    std::fprintf(stderr, "meshflow: rank %d failed: exiting with status %d\n", g_world_rank.load(),
                 status);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);
  }
  Status s = MF_MPI_CALL(MPI_Finalize());
  if (!s.is_ok()) std::fprintf(stderr, "meshflow: %s\n", s.message().c_str());
}

// How many tag bits to use: the largest 2^k - 1 <= MPI_TAG_UB.
// MESHFLOW_MPI_TAG_BITS lowers it (tests use 15, the standard's minimum).
Result<int> tag_bits(MPI_Comm comm) {
  void* attr = nullptr;
  int flag = 0;
  MF_RETURN_IF_ERROR(MF_MPI_CALL(MPI_Comm_get_attr(comm, MPI_TAG_UB, &attr, &flag)));
  int ub = flag ? *static_cast<int*>(attr) : 32767;
  int bits = 0;
  while (bits < 31 && (int64_t{1} << (bits + 1)) - 1 <= ub) ++bits;
  if (const char* env = std::getenv("MESHFLOW_MPI_TAG_BITS")) {
    int want = std::atoi(env);
    if (want < 1 || want > bits) {
      return Status::invalid("MESHFLOW_MPI_TAG_BITS=" + std::string(env) + ": must be in 1.." +
                             std::to_string(bits) + " (MPI_TAG_UB is " + std::to_string(ub) + ")");
    }
    bits = want;
  }
  return bits;
}

Result<std::shared_ptr<Transport>> create() {
  int initialized = 0;
  MF_RETURN_IF_ERROR(MF_MPI_CALL(MPI_Initialized(&initialized)));
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    MF_RETURN_IF_ERROR(MF_MPI_CALL(MPI_Query_thread(&provided)));
  } else {
    MF_RETURN_IF_ERROR(
        MF_MPI_CALL(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided)));
    on_exit(finalize_at_exit, nullptr);
  }
  int rank = 0, size = 0;
  MF_RETURN_IF_ERROR(MF_MPI_CALL(MPI_Comm_rank(MPI_COMM_WORLD, &rank)));
  MF_RETURN_IF_ERROR(MF_MPI_CALL(MPI_Comm_size(MPI_COMM_WORLD, &size)));
  g_world_rank = rank;
  if (provided < MPI_THREAD_MULTIPLE) {
    return Status::failed_precondition(
        rank_name() + ": MPI provides only " + thread_level_name(provided) +
        "; meshflow needs MPI_THREAD_MULTIPLE (communicators run collectives on their own "
        "progress threads). Use an MPI built with thread support (Debian's Open MPI is)" +
        (initialized ? ", or initialize MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE)" : ""));
  }
  MPI_Comm comm;
  MF_RETURN_IF_ERROR(MF_MPI_CALL(MPI_Comm_dup(MPI_COMM_WORLD, &comm)));
  // Errors come back as codes (then Status), not as MPI's default abort.
  MF_RETURN_IF_ERROR(MF_MPI_CALL(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN)));
  MF_ASSIGN_OR_RETURN(int bits, tag_bits(comm));
  size_t chunk = kMaxChunkBytes;
  if (const char* env = std::getenv("MESHFLOW_MPI_CHUNK_BYTES")) {
    long long want = std::atoll(env);
    if (want < 1 || static_cast<size_t>(want) > kMaxChunkBytes) {
      return Status::invalid("MESHFLOW_MPI_CHUNK_BYTES=" + std::string(env) + ": must be in 1.." +
                             std::to_string(kMaxChunkBytes));
    }
    chunk = static_cast<size_t>(want);
  }
  return std::shared_ptr<Transport>(
      std::make_shared<MpiTransport>(comm, rank, size, bits, chunk, comm_timeout_s()));
}

}  // namespace

bool mpi_compiled() {
  return true;
}

Result<std::shared_ptr<Transport>> make_mpi_transport() {
  static std::mutex mu;
  static std::shared_ptr<Transport> transport;
  std::lock_guard<std::mutex> lock(mu);
  if (transport) return transport;
  MF_ASSIGN_OR_RETURN(transport, create());
  return transport;
}

}  // namespace meshflow

#endif  // MESHFLOW_HAVE_MPI
