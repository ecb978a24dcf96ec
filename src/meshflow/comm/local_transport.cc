// The `local` transport: N ranks as threads of one process.
//
// Every ordered pair (src, dst) has a mailbox: a FIFO of the sends that src
// has posted to dst and dst has not taken yet, under one mutex and condvar.
// A send lives on the sender's stack; the sender posts a pointer to it and
// waits. The receiver takes the first posted send with its tag (FIFO per
// pair and tag), copies straight out of the sender's buffer outside the lock
// (one copy per message; the data lands in the receiver's cache, where the
// reduction that follows reads it), then marks it done and wakes the sender.
// send_recv posts its send before it blocks on its receive, so a ring step
// that every rank takes at once cannot deadlock.
//
// Failure: abort() records "rank R failed: reason" once, for all ranks, and
// wakes every mailbox; waiters withdraw their posted sends and return it. A
// send that a receiver is copying is never withdrawn: its owner waits for the
// copy to finish (it is a memcpy, it does finish) so no buffer is read after
// its owner returned. The same rule applies to a wait that times out.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "meshflow/comm/transport.h"
#include "meshflow/core/check.h"

namespace meshflow {

double comm_timeout_s() {
  const char* env = std::getenv("MESHFLOW_COMM_TIMEOUT_S");
  if (env != nullptr && *env != '\0') {
    char* end = nullptr;
    double v = std::strtod(env, &end);
    if (end != env && *end == '\0' && v > 0) return v;
    std::fprintf(stderr, "meshflow: ignoring MESHFLOW_COMM_TIMEOUT_S='%s' (want seconds > 0)\n",
                 env);
  }
  return 30.0;
}

namespace {

using Clock = std::chrono::steady_clock;

std::string tag_str(uint64_t tag) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(tag));
  return buf;
}

// A posted send; owned by the sending thread's stack until it leaves the mailbox
// and its state is kDone.
struct PostedSend {
  enum State { kPosted, kCopying, kDone };
  uint64_t tag = 0;
  const void* data = nullptr;
  size_t bytes = 0;
  State state = kPosted;
  size_t recv_bytes = 0;  // what the receiver asked for (set when taken)
};

// Sends from one rank to another, not yet taken by the receiver.
struct Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<PostedSend*> posted;
  std::atomic<uint64_t> version{0};  // bumped (under mu) on every change, for spinning waiters

  void changed() {
    version.fetch_add(1, std::memory_order_release);
    cv.notify_all();
  }
};

struct World {
  World(int n, double timeout, double spin)
      : size(n), timeout_s(timeout), spin_s(spin), boxes(static_cast<size_t>(n) * n) {}
  Mailbox& box(int src, int dst) { return boxes[static_cast<size_t>(src) * size + dst]; }

  const int size;
  const double timeout_s;
  const double spin_s;  // how long a waiter polls (yielding) before it sleeps on the condvar
  std::vector<Mailbox> boxes;
  std::atomic<bool> failed{false};
  mutable std::mutex failure_mu;
  std::string failure;  // "rank R failed: reason", set once
};

class LocalTransport final : public Transport {
 public:
  LocalTransport(std::shared_ptr<World> w, int rank) : w_(std::move(w)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return w_->size; }
  std::string backend() const override { return "local"; }

  Status send(int peer, uint64_t tag, const void* data, size_t bytes) override {
    MF_RETURN_IF_ERROR(check_peer("send to", peer, data, bytes));
    MF_RETURN_IF_ERROR(health());
    PostedSend s;
    s.tag = tag;
    s.data = data;
    s.bytes = bytes;
    post(peer, &s);
    return wait_send(peer, &s, Clock::now() + timeout(), /*give_up=*/false, "send");
  }

  Status recv(int peer, uint64_t tag, void* data, size_t bytes) override {
    MF_RETURN_IF_ERROR(check_peer("recv from", peer, data, bytes));
    MF_RETURN_IF_ERROR(health());
    return take(peer, tag, data, bytes, Clock::now() + timeout(), "recv");
  }

  Status send_recv(int send_peer, const void* send_data, size_t send_bytes, int recv_peer,
                   void* recv_data, size_t recv_bytes, uint64_t tag) override {
    MF_RETURN_IF_ERROR(check_peer("send_recv to", send_peer, send_data, send_bytes));
    MF_RETURN_IF_ERROR(check_peer("send_recv from", recv_peer, recv_data, recv_bytes));
    MF_RETURN_IF_ERROR(health());
    const Clock::time_point deadline = Clock::now() + timeout();
    PostedSend s;
    s.tag = tag;
    s.data = send_data;
    s.bytes = send_bytes;
    post(send_peer, &s);
    Status r = take(recv_peer, tag, recv_data, recv_bytes, deadline, "send_recv");
    // On a failed receive the send is withdrawn if nobody is copying it yet.
    Status w = wait_send(send_peer, &s, deadline, /*give_up=*/!r.is_ok(), "send_recv");
    return r.is_ok() ? w : r;
  }

  // The send's PostedSend waits in the peer's mailbox; the receiver copies
  // it on its own thread whenever it gets there, so nothing runs here
  // meanwhile.
  class LocalPendingSend final : public PendingSend {
   public:
    LocalPendingSend(LocalTransport* t, int peer) : t_(t), peer_(peer) {}
    ~LocalPendingSend() override {
      if (!finished_) (void)finish(/*give_up=*/true);
    }
    Status finish(bool give_up) override {
      if (finished_) return Status::ok();
      finished_ = true;
      return t_->wait_send(peer_, &s_, Clock::now() + t_->timeout(), give_up, "start_send");
    }
    PostedSend s_;

   private:
    LocalTransport* t_;
    int peer_;
    bool finished_ = false;
  };

  Result<std::unique_ptr<PendingSend>> start_send(int peer, uint64_t tag, const void* data,
                                                  size_t bytes) override {
    MF_RETURN_IF_ERROR(check_peer("start_send to", peer, data, bytes));
    MF_RETURN_IF_ERROR(health());
    auto p = std::make_unique<LocalPendingSend>(this, peer);
    p->s_.tag = tag;
    p->s_.data = data;
    p->s_.bytes = bytes;
    post(peer, &p->s_);
    return std::unique_ptr<PendingSend>(std::move(p));
  }

  void abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lk(w_->failure_mu);
      if (!w_->failed.load()) {
        w_->failure = "rank " + std::to_string(rank_) + " failed: " + reason;
        w_->failed.store(true);
      }
    }
    // Taking each mailbox lock before notifying: a waiter either sees `failed`
    // or is already inside wait() and gets this notification.
    for (Mailbox& b : w_->boxes) {
      std::lock_guard<std::mutex> lk(b.mu);
      b.changed();
    }
  }

  Status health() const override {
    if (!w_->failed.load(std::memory_order_acquire)) return Status::ok();
    std::lock_guard<std::mutex> lk(w_->failure_mu);
    return Status::unavailable(w_->failure);
  }

 private:
  std::chrono::nanoseconds timeout() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double>(w_->timeout_s));
  }

  Status check_peer(const char* what, int peer, const void* data, size_t bytes) const {
    if (peer < 0 || peer >= w_->size || peer == rank_)
      return Status::invalid(std::string(what) + " rank " + std::to_string(peer) + " on rank " +
                             std::to_string(rank_) + ": the peer must be another rank in [0, " +
                             std::to_string(w_->size) + ")");
    if (data == nullptr && bytes > 0)
      return Status::invalid(std::string(what) + " rank " + std::to_string(peer) +
                             ": null buffer for " + std::to_string(bytes) + " bytes");
    return Status::ok();
  }

  std::string where(const char* call, const char* dir, int peer, uint64_t tag) const {
    return std::string(call) + " " + dir + " rank " + std::to_string(peer) + " (tag " +
           tag_str(tag) + ")";
  }

  Status timed_out(const char* call, const char* dir, int peer, uint64_t tag,
                   const char* why) const {
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%g", w_->timeout_s);
    return Status::unavailable(where(call, dir, peer, tag) + " timed out after " + secs +
                               " s: " + why + " (MESHFLOW_COMM_TIMEOUT_S sets the limit)");
  }

  // Waits (lk held on entry and exit) until the mailbox changes or the
  // deadline passes. Polls first for spin_s, yielding the core between
  // looks: a handoff then costs no sleep and wake-up (~5 us instead of
  // ~50 us here), and a peer that needs this core to make progress gets it.
  std::cv_status wait_change(std::unique_lock<std::mutex>& lk, Mailbox& b,
                             Clock::time_point deadline) {
    if (w_->spin_s > 0) {
      const uint64_t seen = b.version.load(std::memory_order_acquire);
      lk.unlock();
      const Clock::time_point spin_end =
          Clock::now() +
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(w_->spin_s));
      bool moved = false;
      for (int i = 0; !moved; ++i) {
        moved = b.version.load(std::memory_order_acquire) != seen;
        if (!moved && (i & 63) == 63 && Clock::now() >= std::min(spin_end, deadline)) break;
        std::this_thread::yield();
      }
      lk.lock();
      // Changes happen under the lock, so one missed above shows here, and
      // any later one notifies the condvar we are about to sleep on.
      if (moved || b.version.load(std::memory_order_relaxed) != seen)
        return std::cv_status::no_timeout;
    }
    if (deadline == Clock::time_point::max()) {
      b.cv.wait(lk);
      return std::cv_status::no_timeout;
    }
    return b.cv.wait_until(lk, deadline);
  }

  void post(int peer, PostedSend* s) {
    Mailbox& b = w_->box(rank_, peer);
    std::lock_guard<std::mutex> lk(b.mu);
    b.posted.push_back(s);
    b.changed();
  }

  // Waits until the receiver has copied `s` (or withdraws it on failure,
  // timeout, or give_up while nobody has taken it yet).
  Status wait_send(int peer, PostedSend* s, Clock::time_point deadline, bool give_up,
                   const char* call) {
    Mailbox& b = w_->box(rank_, peer);
    std::unique_lock<std::mutex> lk(b.mu);
    bool expired = false;
    while (s->state != PostedSend::kDone) {
      if (s->state == PostedSend::kPosted && (give_up || expired || w_->failed.load())) {
        b.posted.erase(std::find(b.posted.begin(), b.posted.end(), s));
        lk.unlock();
        if (w_->failed.load()) return health();
        if (give_up) return Status::unavailable(where(call, "to", peer, s->tag) + ": withdrawn");
        return timed_out(call, "to", peer, s->tag, "the peer never received it");
      }
      if (s->state == PostedSend::kCopying) {
        wait_change(lk, b, Clock::time_point::max());  // a memcpy in progress: it finishes
      } else if (wait_change(lk, b, deadline) == std::cv_status::timeout) {
        expired = true;
      }
    }
    if (s->recv_bytes != s->bytes)
      return Status::invalid(where(call, "to", peer, s->tag) + ": size mismatch: sent " +
                             std::to_string(s->bytes) + " bytes, the receiver expected " +
                             std::to_string(s->recv_bytes));
    return Status::ok();
  }

  // Takes the first send from `peer` with `tag` and copies it into `data`.
  Status take(int peer, uint64_t tag, void* data, size_t bytes, Clock::time_point deadline,
              const char* call) {
    Mailbox& b = w_->box(peer, rank_);
    std::unique_lock<std::mutex> lk(b.mu);
    PostedSend* s = nullptr;
    while (true) {
      for (auto it = b.posted.begin(); it != b.posted.end(); ++it) {
        if ((*it)->tag == tag) {
          s = *it;
          b.posted.erase(it);
          break;
        }
      }
      if (s != nullptr) break;
      if (w_->failed.load()) {
        lk.unlock();
        return health();
      }
      if (wait_change(lk, b, deadline) == std::cv_status::timeout) {
        // One last look: the send may have arrived with the timeout.
        bool arrived = std::any_of(b.posted.begin(), b.posted.end(),
                                   [&](const PostedSend* p) { return p->tag == tag; });
        if (!arrived) {
          lk.unlock();
          if (w_->failed.load()) return health();
          return timed_out(call, "from", peer, tag, "the peer never sent it");
        }
      }
    }
    s->state = PostedSend::kCopying;
    s->recv_bytes = bytes;
    const size_t sent = s->bytes;
    lk.unlock();
    if (sent == bytes && bytes > 0) std::memcpy(data, s->data, bytes);
    lk.lock();
    s->state = PostedSend::kDone;  // after this `s` may be gone
    b.changed();
    lk.unlock();
    if (sent != bytes)
      return Status::invalid(where(call, "from", peer, tag) + ": size mismatch: got a message of " +
                             std::to_string(sent) + " bytes, expected " + std::to_string(bytes));
    return Status::ok();
  }

  std::shared_ptr<World> w_;
  const int rank_;
};

}  // namespace

std::vector<std::shared_ptr<Transport>> make_local_transports(
    int world_size, const LocalTransportOptions& options) {
  MF_CHECK_GE(world_size, 1) << "make_local_transports needs at least one rank";
  const double spin_s = options.spin_us * 1e-6;
  auto world = std::make_shared<World>(
      world_size, options.timeout_s > 0 ? options.timeout_s : comm_timeout_s(), spin_s);
  std::vector<std::shared_ptr<Transport>> out;
  out.reserve(world_size);
  for (int r = 0; r < world_size; ++r) out.push_back(std::make_shared<LocalTransport>(world, r));
  return out;
}

}  // namespace meshflow
