// Collective algorithms on the point-to-point Transport (see communicator.h
// for the list and the reduction order). Nothing here knows the backend.
#include "meshflow/comm/communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "meshflow/core/check.h"

namespace meshflow {
namespace {

constexpr int64_t kSegmentFloats = 256 * 1024;        // 1 MiB: ring reduce segment
constexpr int64_t kSmallAllReduceFloats = 4 * 1024;   // x group size: tree all_reduce up to this
constexpr int64_t kSmallBroadcastFloats = 16 * 1024;  // 64 KiB: tree broadcast up to this
constexpr uint64_t kPointToPointBit = 0x80000000u;    // in the low 32 bits of a tag
constexpr uint64_t kSequenceMask = 0x7fffffffu;

// dst[i] = recv[i] op own[i]; dst may be own.
void combine(float* dst, const float* recv, const float* own, int64_t n, ReduceOp op) {
  if (op == ReduceOp::kSum) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = recv[i] + own[i];
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      float a = recv[i], b = own[i];
      dst[i] = (a > b || a != a) ? a : b;  // NaN wins
    }
  }
}

const char* op_name(ReduceOp op) {
  return op == ReduceOp::kSum ? "sum" : "max";
}

// Chunk c of a buffer: [offset[c], offset[c] + count[c]).
struct Chunks {
  std::vector<int64_t> count, offset;
  int64_t total = 0;
};

Chunks chunks_from_counts(const std::vector<int64_t>& counts) {
  Chunks ch;
  ch.count = counts;
  for (int64_t c : counts) {
    ch.offset.push_back(ch.total);
    ch.total += c;
  }
  return ch;
}

// As even as possible: the first total % n chunks one element larger.
Chunks even_chunks(int64_t total, int n) {
  std::vector<int64_t> counts(n, total / n);
  for (int64_t i = 0; i < total % n; ++i) ++counts[i];
  return chunks_from_counts(counts);
}

uint64_t fnv1a(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint32_t make_group_id(uint32_t parent, const std::vector<int>& world_ranks, int occurrence) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = fnv1a(h, parent);
  h = fnv1a(h, world_ranks.size());
  for (int r : world_ranks) h = fnv1a(h, static_cast<uint64_t>(r));
  h = fnv1a(h, static_cast<uint64_t>(occurrence));
  uint32_t id = static_cast<uint32_t>(h ^ (h >> 32));
  return id == 0 ? 1 : id;
}

std::string list_str(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += ",";
    if (i == 16) return s + "... " + std::to_string(v.size()) + " ranks]";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

// One collective's view of the group: peers by group rank, the tag, scratch.
struct Ring {
  Transport& t;
  const std::vector<int>& world;  // group rank -> world rank
  int me, n;
  uint64_t tag;
  std::vector<float>& seg;  // receive segment, reused

  int mod(int64_t i) const { return static_cast<int>(((i % n) + n) % n); }
  int next() const { return world[mod(me + 1)]; }
  int prev() const { return world[mod(me - 1)]; }
  float* segment(int64_t floats) {
    if (static_cast<int64_t>(seg.size()) < floats) seg.resize(floats);
    return seg.data();
  }

  // Sends sc floats to world rank `to` while receiving rc from `from`; an
  // empty side is skipped (both ends compute the same sizes).
  Status exchange(int to, const float* s, int64_t sc, int from, float* r, int64_t rc) {
    if (sc > 0 && rc > 0)
      return t.send_recv(to, s, sc * sizeof(float), from, r, rc * sizeof(float), tag);
    if (sc > 0) return t.send(to, tag, s, sc * sizeof(float));
    if (rc > 0) return t.recv(from, tag, r, rc * sizeof(float));
    return Status::ok();
  }
};

// Ring reduce-scatter. At step s rank `me` sends its partial of chunk
// me-s-1 and receives the partial of chunk me-s-2 from the previous rank,
// writing recv op own into dst; after n-1 steps chunk `me` is complete.
//   send_src(s, c): the partial of chunk c that is sent at step s
//   own(c):         this rank's input of chunk c
//   dst(s, c):      where the partial of chunk c received at step s goes
// Segments of one step are exchanged in order, so dst may be the buffer
// that send_src of the next step reads, and may be send_src of this step.
template <class SendSrc, class Own, class Dst>
Status ring_reduce_scatter(Ring& g, const Chunks& ch, ReduceOp op, SendSrc send_src, Own own,
                           Dst dst) {
  for (int s = 0; s + 1 < g.n; ++s) {
    const int sc = g.mod(g.me - s - 1), rc = g.mod(g.me - s - 2);
    const float* sp = send_src(s, sc);
    const float* op_own = own(rc);
    float* dp = dst(s, rc);
    const int64_t sn = ch.count[sc], rn = ch.count[rc];
    const int64_t max_n = std::max(sn, rn);
    float* seg = g.segment(std::min(rn, kSegmentFloats));
    for (int64_t b = 0; b < max_n; b += kSegmentFloats) {
      const int64_t slen = std::clamp<int64_t>(sn - b, 0, kSegmentFloats);
      const int64_t rlen = std::clamp<int64_t>(rn - b, 0, kSegmentFloats);
      MF_RETURN_IF_ERROR(g.exchange(g.next(), sp + b, slen, g.prev(), seg, rlen));
      combine(dp + b, seg, op_own + b, rlen, op);
    }
  }
  return Status::ok();
}

// Ring all-gather in place: chunk `me` of buf is this rank's; at step s it
// sends chunk me-s and receives chunk me-s-1 straight into buf.
Status ring_all_gather(Ring& g, const Chunks& ch, float* buf) {
  for (int s = 0; s + 1 < g.n; ++s) {
    const int sc = g.mod(g.me - s), rc = g.mod(g.me - s - 1);
    MF_RETURN_IF_ERROR(g.exchange(g.next(), buf + ch.offset[sc], ch.count[sc], g.prev(),
                                  buf + ch.offset[rc], ch.count[rc]));
  }
  return Status::ok();
}

// Binomial tree from `root`: in round k, ranks (relative to the root) below
// 2^k send to the rank 2^k above them.
Status tree_broadcast(Ring& g, float* data, int64_t count, int root) {
  const int v = g.mod(g.me - root);
  for (int mask = 1; mask < g.n; mask <<= 1) {
    if (v < mask) {
      if (v + mask < g.n)
        MF_RETURN_IF_ERROR(
            g.t.send(g.world[g.mod(root + v + mask)], g.tag, data, count * sizeof(float)));
    } else if (v < 2 * mask) {
      MF_RETURN_IF_ERROR(
          g.t.recv(g.world[g.mod(root + v - mask)], g.tag, data, count * sizeof(float)));
    }
  }
  return Status::ok();
}

// Segmented pipeline along the ring root -> root+1 -> ... -> root-1: a middle
// rank forwards segment j while receiving segment j+1.
Status ring_broadcast(Ring& g, float* data, int64_t count, int root) {
  const int v = g.mod(g.me - root);
  const int64_t segs = (count + kSegmentFloats - 1) / kSegmentFloats;
  auto len = [&](int64_t j) {
    return j < segs ? std::min(kSegmentFloats, count - j * kSegmentFloats) : int64_t{0};
  };
  if (v != 0) MF_RETURN_IF_ERROR(g.exchange(-1, nullptr, 0, g.prev(), data, len(0)));
  for (int64_t j = 0; j < segs; ++j) {
    const int64_t sn = v == g.n - 1 ? 0 : len(j);
    const int64_t rn = v == 0 ? 0 : len(j + 1);
    float* p = data + j * kSegmentFloats;
    MF_RETURN_IF_ERROR(g.exchange(g.next(), p, sn, g.prev(), p + kSegmentFloats, rn));
  }
  return Status::ok();
}

// Binomial-tree reduce to group rank 0 (in round k rank r+2^k sends its
// partial to r, which folds it in), then a tree broadcast of the result.
Status tree_all_reduce(Ring& g, float* data, int64_t count, ReduceOp op) {
  float* seg = g.segment(count);
  for (int mask = 1; mask < g.n; mask <<= 1) {
    if (g.me & mask) {
      MF_RETURN_IF_ERROR(g.t.send(g.world[g.me - mask], g.tag, data, count * sizeof(float)));
      break;
    }
    if (g.me + mask < g.n) {
      MF_RETURN_IF_ERROR(g.t.recv(g.world[g.me + mask], g.tag, seg, count * sizeof(float)));
      combine(data, seg, data, count, op);
    }
  }
  return tree_broadcast(g, data, count, 0);
}

Status bad_count(const std::string& what, int64_t count, const void* p) {
  if (count < 0)
    return Status::invalid(what + ": count must be >= 0, got " + std::to_string(count));
  if (count > 0 && p == nullptr) return Status::invalid(what + ": null buffer");
  return Status::ok();
}

}  // namespace

struct Communicator::Impl {
  struct Task {
    std::function<Status()> run;
    std::promise<Status> done;
  };

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Task> queue;
  int unfinished = 0;  // queued or running
  bool stopping = false;
  std::thread worker;

  // Used by one collective at a time (the caller's or the worker's).
  std::vector<float> seg, acc;
  uint32_t seq = 0;
  std::map<std::vector<int>, int> splits;  // member list -> times split off

  void drain() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return unfinished == 0; });
  }

  void loop() {
    std::unique_lock<std::mutex> lk(mu);
    while (true) {
      cv.wait(lk, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) return;  // stopping and drained
      Task task = std::move(queue.front());
      queue.pop_front();
      lk.unlock();
      Status s = task.run();
      lk.lock();
      // Both under the lock: a blocking call that drained sees the Work
      // ready, and a waiter that destroys us next sees nothing unfinished.
      --unfinished;
      task.done.set_value(std::move(s));
      cv.notify_all();
    }
  }
};

Communicator::Communicator(std::shared_ptr<Transport> t, std::vector<int> ranks, uint32_t group_id)
    : t_(std::move(t)), ranks_(std::move(ranks)), group_id_(group_id), impl_(new Impl) {
  auto it = std::find(ranks_.begin(), ranks_.end(), t_->rank());
  MF_CHECK(it != ranks_.end()) << "world rank " << t_->rank() << " is not in its group";
  rank_ = static_cast<int>(it - ranks_.begin());
}

// Work still unfinished here was abandoned (an error path, or a missing
// wait): the peers expect this rank in those collectives, and draining them
// could block until the timeout. Abort the job instead, so every rank stops
// now with a message that names this rank; the queue then fails fast.
Communicator::~Communicator() {
  int unfinished = 0;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stopping = true;
    unfinished = impl_->unfinished;
  }
  if (unfinished > 0 && t_->health().is_ok())
    t_->abort("communicator of group " + list_str(ranks_) + " destroyed with " +
              std::to_string(unfinished) +
              " async collective(s) unfinished (wait on every Work first)");
  impl_->cv.notify_all();
  if (impl_->worker.joinable()) impl_->worker.join();
}

std::shared_ptr<Communicator> Communicator::world(std::shared_ptr<Transport> t) {
  MF_CHECK(t != nullptr);
  std::vector<int> ranks(t->size());
  for (int r = 0; r < t->size(); ++r) ranks[r] = r;
  uint32_t id = make_group_id(0, ranks, t->next_world_index());
  return std::shared_ptr<Communicator>(new Communicator(std::move(t), std::move(ranks), id));
}

Result<std::shared_ptr<Communicator>> Communicator::split(const std::vector<int>& group_ranks) {
  const std::string what =
      "split " + list_str(group_ranks) + " of a group of " + std::to_string(size()) + " ranks";
  if (group_ranks.empty()) return Status::invalid(what + ": the list is empty");
  std::vector<int> world_list;
  for (int r : group_ranks) {
    if (r < 0 || r >= size())
      return Status::invalid(what + ": rank " + std::to_string(r) + " is not in [0, " +
                             std::to_string(size()) + ")");
    if (std::count(group_ranks.begin(), group_ranks.end(), r) > 1)
      return Status::invalid(what + ": rank " + std::to_string(r) + " is listed twice");
    world_list.push_back(ranks_[r]);
  }
  if (std::find(group_ranks.begin(), group_ranks.end(), rank_) == group_ranks.end())
    return Status::invalid(what + ": called on rank " + std::to_string(rank_) +
                           ", which is not a member (only members call split)");
  const int occurrence = impl_->splits[world_list]++;
  const uint32_t id = make_group_id(group_id_, world_list, occurrence);
  return std::shared_ptr<Communicator>(new Communicator(t_, std::move(world_list), id));
}

std::string Communicator::where() const {
  return " in group " + list_str(ranks_) + " on rank " + std::to_string(t_->rank());
}

uint64_t Communicator::next_tag() {
  return (static_cast<uint64_t>(group_id_) << 32) | (impl_->seq++ & kSequenceMask);
}

Status Communicator::run_now(const std::string& what,
                             const std::function<Status(uint64_t tag)>& op) {
  impl_->drain();
  Status s = t_->health();
  if (s.is_ok()) s = op(next_tag());
  if (s.is_ok()) return s;
  return s.with_context(what + where());
}

Work Communicator::run_async(const std::string& what, std::function<Status(uint64_t tag)> op) {
  const uint64_t tag = next_tag();
  std::string ctx = what + where();
  Impl::Task task;
  task.run = [this, tag, op = std::move(op), ctx = std::move(ctx)] {
    Status s = t_->health();
    if (s.is_ok()) s = op(tag);
    return s.with_context(ctx);
  };
  Work w(task.done.get_future().share());
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    if (!impl_->worker.joinable()) impl_->worker = std::thread([this] { impl_->loop(); });
    impl_->queue.push_back(std::move(task));
    ++impl_->unfinished;
  }
  impl_->cv.notify_all();
  return w;
}

namespace {

Work ready_work(Status s) {
  std::promise<Status> p;
  p.set_value(std::move(s));
  return Work(p.get_future().share());
}

Status check_counts(const std::string& what, const std::vector<int64_t>& counts, int n) {
  if (static_cast<int>(counts.size()) != n)
    return Status::invalid(what + ": " + std::to_string(counts.size()) + " counts for a group of " +
                           std::to_string(n) + " ranks");
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] < 0)
      return Status::invalid(what + ": count of rank " + std::to_string(i) + " is " +
                             std::to_string(counts[i]) + ", must be >= 0");
  return Status::ok();
}

}  // namespace

// ---- all_reduce ------------------------------------------------------------------------------

namespace {

Status all_reduce_on(Ring& g, float* data, int64_t count, ReduceOp op) {
  if (g.n == 1 || count == 0) return Status::ok();
  // The choice depends on (count, n) only, so every backend makes the same one.
  if (count <= kSmallAllReduceFloats * g.n) return tree_all_reduce(g, data, count, op);
  Chunks ch = even_chunks(count, g.n);
  auto at = [&](int, int c) { return data + ch.offset[c]; };
  MF_RETURN_IF_ERROR(ring_reduce_scatter(
      g, ch, op, at, [&](int c) { return data + ch.offset[c]; }, at));
  return ring_all_gather(g, ch, data);
}

}  // namespace

Status Communicator::all_reduce(float* data, int64_t count, ReduceOp op) {
  const std::string what = "all_reduce(" + std::to_string(count) + " floats, " + op_name(op) + ")";
  MF_RETURN_IF_ERROR(bad_count(what, count, data));
  return run_now(what, [&](uint64_t tag) {
    Ring g{*t_, ranks_, rank_, size(), tag, impl_->seg};
    return all_reduce_on(g, data, count, op);
  });
}

Work Communicator::ring_shift_async(const void* send, void* recv, int64_t count, DType dt) {
  const std::string what =
      "ring_shift_async(" + std::to_string(count) + " " + std::string(dtype_name(dt)) + ")";
  if (count < 0) return ready_work(Status::invalid(what + ": count must be >= 0" + where()));
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dt);
  if (size() == 1) {
    if (bytes > 0) std::memcpy(recv, send, bytes);
    return ready_work(Status::ok());
  }
  // In two phases on the caller's thread, not on the progress thread: the
  // send is posted now and the receive done in wait(). A progress thread
  // woken for the shift competes with the computation it overlaps for a
  // core; on a machine whose cores all run ranks it waited for one up to a
  // scheduler slice (measured 2026-11-29, gpt 4x256 at cp=2 on 2 cores: a
  // 2 MB shift took 1.6 ms median on the thread, against its 0.2 ms copy).
  const uint64_t tag = next_tag();
  const int n = size();
  Result<std::unique_ptr<Transport::PendingSend>> started =
      t_->start_send(ranks_[(rank_ + 1) % n], tag, send, bytes);
  if (!started.is_ok()) return ready_work(started.status().with_context(what + where()));
  // The Work owns the transport as long as the send: a Work dropped after its
  // communicator still withdraws the send on a live transport.
  struct Shift {
    std::shared_ptr<Transport> t;
    std::unique_ptr<Transport::PendingSend> send;
    ~Shift() { send.reset(); }
  };
  auto shift = std::make_shared<Shift>();
  shift->t = t_;
  shift->send = std::move(started).value();
  const int from = ranks_[(rank_ + n - 1) % n];
  std::string ctx = what + where();
  return Work(
      std::async(std::launch::deferred, [shift, from, recv, bytes, tag, ctx = std::move(ctx)] {
        Status r = shift->t->health();
        if (r.is_ok()) r = shift->t->recv(from, tag, recv, bytes);
        Status w = shift->send->finish(/*give_up=*/!r.is_ok());
        return (r.is_ok() ? w : r).with_context(ctx);
      }).share());
}

Work Communicator::all_reduce_async(float* data, int64_t count, ReduceOp op) {
  const std::string what =
      "all_reduce_async(" + std::to_string(count) + " floats, " + op_name(op) + ")";
  Status bad = bad_count(what, count, data);
  if (!bad.is_ok()) return ready_work(bad);
  return run_async(what, [this, data, count, op](uint64_t tag) {
    Ring g{*t_, ranks_, rank_, size(), tag, impl_->seg};
    return all_reduce_on(g, data, count, op);
  });
}

// ---- all_gather ------------------------------------------------------------------------------

namespace {

Status all_gather_chunks(Ring& g, const Chunks& ch, const float* in, float* out) {
  float* mine = out + ch.offset[g.me];
  if (in != mine && ch.count[g.me] > 0) std::memmove(mine, in, ch.count[g.me] * sizeof(float));
  if (g.n == 1) return Status::ok();
  return ring_all_gather(g, ch, out);
}

// Out-of-place ring reduce-scatter into `out`; partials live in `acc`.
Status reduce_scatter_chunks(Ring& g, const Chunks& ch, const float* in, float* out, ReduceOp op,
                             std::vector<float>& acc) {
  if (g.n == 1) {
    if (ch.count[0] > 0 && in != out) std::memmove(out, in, ch.count[0] * sizeof(float));
    return Status::ok();
  }
  const int64_t max_chunk = *std::max_element(ch.count.begin(), ch.count.end());
  if (g.n > 2 && static_cast<int64_t>(acc.size()) < max_chunk) acc.resize(max_chunk);
  float* a = acc.data();
  const int last = g.n - 2;
  return ring_reduce_scatter(
      g, ch, op, [&](int s, int c) -> const float* { return s == 0 ? in + ch.offset[c] : a; },
      [&](int c) { return in + ch.offset[c]; }, [&](int s, int) { return s == last ? out : a; });
}

}  // namespace

Status Communicator::all_gather(const float* in, int64_t count, float* out) {
  const std::string what = "all_gather(" + std::to_string(count) + " floats per rank)";
  MF_RETURN_IF_ERROR(bad_count(what, count, in));
  MF_RETURN_IF_ERROR(bad_count(what, count, out));
  return run_now(what, [&](uint64_t tag) {
    Ring g{*t_, ranks_, rank_, size(), tag, impl_->seg};
    return all_gather_chunks(g, chunks_from_counts(std::vector<int64_t>(g.n, count)), in, out);
  });
}

Work Communicator::all_gather_async(const float* in, int64_t count, float* out) {
  const std::string what = "all_gather_async(" + std::to_string(count) + " floats per rank)";
  Status bad = bad_count(what, count, in);
  if (bad.is_ok()) bad = bad_count(what, count, out);
  if (!bad.is_ok()) return ready_work(bad);
  return run_async(what, [this, in, count, out](uint64_t tag) {
    Ring g{*t_, ranks_, rank_, size(), tag, impl_->seg};
    return all_gather_chunks(g, chunks_from_counts(std::vector<int64_t>(g.n, count)), in, out);
  });
}

Status Communicator::all_gather_v(const float* in, const std::vector<int64_t>& counts, float* out) {
  const std::string what = "all_gather_v(" + std::to_string(counts.size()) + " counts)";
  MF_RETURN_IF_ERROR(check_counts(what, counts, size()));
  MF_RETURN_IF_ERROR(bad_count(what, counts[rank_], in));
  Chunks ch = chunks_from_counts(counts);
  MF_RETURN_IF_ERROR(bad_count(what, ch.total, out));
  return run_now(what, [&](uint64_t tag) {
    Ring g{*t_, ranks_, rank_, size(), tag, impl_->seg};
    return all_gather_chunks(g, ch, in, out);
  });
}

// ---- reduce_scatter --------------------------------------------------------------------------

Status Communicator::reduce_scatter(const float* in, int64_t count_per_rank, float* out,
                                    ReduceOp op) {
  const std::string what =
      "reduce_scatter(" + std::to_string(count_per_rank) + " floats per rank, " + op_name(op) + ")";
  MF_RETURN_IF_ERROR(bad_count(what, count_per_rank, in));
  MF_RETURN_IF_ERROR(bad_count(what, count_per_rank, out));
  return run_now(what, [&](uint64_t tag) {
    Ring g{*t_, ranks_, rank_, size(), tag, impl_->seg};
    return reduce_scatter_chunks(g, chunks_from_counts(std::vector<int64_t>(g.n, count_per_rank)),
                                 in, out, op, impl_->acc);
  });
}

Work Communicator::reduce_scatter_async(const float* in, int64_t count_per_rank, float* out,
                                        ReduceOp op) {
  const std::string what = "reduce_scatter_async(" + std::to_string(count_per_rank) +
                           " floats per rank, " + op_name(op) + ")";
  Status bad = bad_count(what, count_per_rank, in);
  if (bad.is_ok()) bad = bad_count(what, count_per_rank, out);
  if (!bad.is_ok()) return ready_work(bad);
  return run_async(what, [this, in, count_per_rank, out, op](uint64_t tag) {
    Ring g{*t_, ranks_, rank_, size(), tag, impl_->seg};
    return reduce_scatter_chunks(g, chunks_from_counts(std::vector<int64_t>(g.n, count_per_rank)),
                                 in, out, op, impl_->acc);
  });
}

Status Communicator::reduce_scatter_v(const float* in, const std::vector<int64_t>& counts,
                                      float* out, ReduceOp op) {
  const std::string what =
      "reduce_scatter_v(" + std::to_string(counts.size()) + " counts, " + op_name(op) + ")";
  MF_RETURN_IF_ERROR(check_counts(what, counts, size()));
  Chunks ch = chunks_from_counts(counts);
  MF_RETURN_IF_ERROR(bad_count(what, ch.total, in));
  MF_RETURN_IF_ERROR(bad_count(what, counts[rank_], out));
  return run_now(what, [&](uint64_t tag) {
    Ring g{*t_, ranks_, rank_, size(), tag, impl_->seg};
    return reduce_scatter_chunks(g, ch, in, out, op, impl_->acc);
  });
}

// ---- all_to_all, broadcast, point to point, barrier ------------------------------------------

Status Communicator::all_to_all(const float* in, int64_t count_per_rank, float* out) {
  const std::string what = "all_to_all(" + std::to_string(count_per_rank) + " floats per rank)";
  MF_RETURN_IF_ERROR(bad_count(what, count_per_rank, in));
  MF_RETURN_IF_ERROR(bad_count(what, count_per_rank, out));
  const int64_t total = count_per_rank * size();
  const auto lo = [](const float* p) { return reinterpret_cast<uintptr_t>(p); };
  const uintptr_t bytes = static_cast<uintptr_t>(total) * sizeof(float);
  if (total > 0 && lo(in) < lo(out) + bytes && lo(out) < lo(in) + bytes)
    return Status::invalid(what + ": in and out overlap; all_to_all needs separate buffers");
  return run_now(what, [&](uint64_t tag) {
    Ring g{*t_, ranks_, rank_, size(), tag, impl_->seg};
    const int64_t c = count_per_rank;
    if (c == 0) return Status::ok();
    std::memcpy(out + g.me * c, in + g.me * c, c * sizeof(float));
    for (int s = 1; s < g.n; ++s) {
      const int to = g.mod(g.me + s), from = g.mod(g.me - s);
      MF_RETURN_IF_ERROR(g.exchange(g.world[to], in + to * c, c, g.world[from], out + from * c, c));
    }
    return Status::ok();
  });
}

Status Communicator::broadcast(float* data, int64_t count, int root) {
  const std::string what =
      "broadcast(" + std::to_string(count) + " floats from rank " + std::to_string(root) + ")";
  MF_RETURN_IF_ERROR(bad_count(what, count, data));
  if (root < 0 || root >= size())
    return Status::invalid(what + ": root must be in [0, " + std::to_string(size()) + ")");
  return run_now(what, [&](uint64_t tag) {
    Ring g{*t_, ranks_, rank_, size(), tag, impl_->seg};
    if (g.n == 1 || count == 0) return Status::ok();
    if (count <= kSmallBroadcastFloats || g.n == 2) return tree_broadcast(g, data, count, root);
    return ring_broadcast(g, data, count, root);
  });
}

Status Communicator::point_to_point(bool is_send, void* data, int64_t count, DType dt, int peer) {
  const std::string what = std::string(is_send ? "send(" : "recv(") + std::to_string(count) + " " +
                           std::string(dtype_name(dt)) + (is_send ? " to" : " from") + " rank " +
                           std::to_string(peer) + ")";
  MF_RETURN_IF_ERROR(bad_count(what, count, data));
  if (peer < 0 || peer >= size() || peer == rank_)
    return Status::invalid(what + ": the peer must be another rank in [0, " +
                           std::to_string(size()) + ")");
  impl_->drain();
  const uint64_t tag = (static_cast<uint64_t>(group_id_) << 32) | kPointToPointBit;
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dt);
  const Status s =
      is_send ? t_->send(ranks_[peer], tag, data, bytes) : t_->recv(ranks_[peer], tag, data, bytes);
  return s.with_context(what + where());
}

Status Communicator::send(const float* data, int64_t count, int peer) {
  return point_to_point(true, const_cast<float*>(data), count, DType::F32, peer);
}

Status Communicator::recv(float* data, int64_t count, int peer) {
  return point_to_point(false, data, count, DType::F32, peer);
}

Status Communicator::send(const void* data, int64_t count, DType dt, int peer) {
  return point_to_point(true, const_cast<void*>(data), count, dt, peer);
}

Status Communicator::recv(void* data, int64_t count, DType dt, int peer) {
  return point_to_point(false, data, count, dt, peer);
}

Status Communicator::neighbor_exchange(const void* to_prev, int64_t n_prev, const void* to_next,
                                       int64_t n_next, void* from_prev, void* from_next, DType dt) {
  const std::string what = "neighbor_exchange(" + std::to_string(n_prev) + " back, " +
                           std::to_string(n_next) + " forward " + std::string(dtype_name(dt)) + ")";
  if (n_prev < 0 || n_next < 0) return Status::invalid(what + ": counts must be >= 0" + where());
  if (size() == 1) return Status::ok();
  return run_now(what, [&](uint64_t tag) {
    const int n = size(), me = rank_;
    // One direction: each rank sends `count` elements of `send` to rank +
    // step and receives its other neighbour's into `recv`.
    auto shift = [&](const void* send, void* recv, int64_t count, int step) -> Status {
      if (count == 0) return Status::ok();
      const size_t bytes = static_cast<size_t>(count) * dtype_size(dt);
      const int to = me + step, from = me - step;
      const bool sends = to >= 0 && to < n, receives = from >= 0 && from < n;
      if (sends && receives)
        return t_->send_recv(ranks_[to], send, bytes, ranks_[from], recv, bytes, tag);
      if (sends) return t_->send(ranks_[to], tag, send, bytes);
      return t_->recv(ranks_[from], tag, recv, bytes);
    };
    MF_RETURN_IF_ERROR(shift(to_next, from_prev, n_next, +1));
    return shift(to_prev, from_next, n_prev, -1);
  });
}

Status Communicator::barrier() {
  return run_now("barrier", [&](uint64_t tag) {
    Ring g{*t_, ranks_, rank_, size(), tag, impl_->seg};
    for (int k = 1; k < g.n; k <<= 1)
      MF_RETURN_IF_ERROR(t_->send_recv(g.world[g.mod(g.me + k)], nullptr, 0,
                                       g.world[g.mod(g.me - k)], nullptr, 0, tag));
    return Status::ok();
  });
}

}  // namespace meshflow
