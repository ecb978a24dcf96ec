// Communicator: collectives over a group of ranks, written once on a Transport
// (transport.h) so every backend gives bit-identical results.
//
//   auto comm = Communicator::world(transport);          // all ranks
//   comm->all_reduce(grad, n, ReduceOp::kSum);           // in place
//   auto tp = comm->split({0, 1});                       // sub-group (e.g. a mesh axis)
//   Work w = comm->all_reduce_async(bucket, n, ReduceOp::kSum);  ... w.wait();
//
// Algorithms (fixed order, so results do not depend on timing or backend):
//   all_reduce      ring: reduce_scatter then all_gather (2(n-1)/n of the bytes per rank);
//                   up to 16 KiB * n: binomial-tree reduce to group rank 0, then tree
//                   broadcast (the choice depends on count and n only, never on the backend)
//   reduce_scatter  ring; chunk c ends on group rank c, folded in ring order
//                   x[c+1] + x[c+2] + ... + x[c] (indices mod n, left to right);
//                   large chunks go in 1 MiB segments so the received data is
//                   reduced while it is in cache
//   all_gather      ring; each chunk is copied once per hop, straight into `out`
//   all_to_all      pairwise exchange, n-1 steps
//   broadcast       up to 64 KiB: binomial tree; larger: segmented ring pipeline from the root
//   barrier         dissemination, ceil(log2 n) rounds of empty messages
// Sizes need not divide by the group size: chunks are split as evenly as
// possible (the first count % n chunks one element larger); the *_v forms
// take explicit per-rank counts.
//
// Matching: every message carries a tag made of the group id (the same on
// every member: a hash of the parent's id, the member list and how many
// times the parent, or for world groups the transport, made that list)
// and the group's collective sequence
// number, so collectives of different groups, or successive ones of one
// group, never match each other. Every member must issue the same
// collectives of a group in the same order (the SPMD rule).
//
// Threads: a communicator is driven by one thread at a time. Async forms run
// on the communicator's own progress thread, in issue order, and return a Work
// to wait on; the caller keeps the buffers alive and untouched until then,
// also on error paths (declare them before the communicator, which stops its
// unfinished work when it is destroyed). A
// blocking call first waits for the async work issued before it, so a group's
// collectives always run in issue order. ring_shift_async is the exception:
// it runs on the caller's thread in two phases (Transport::start_send posts
// the send at the call, wait() receives and completes it), so it needs no
// progress thread and its Work reads ready() only once waited.
// Errors (a failed rank, a timeout, a size mismatch) come back as Status,
// never a hang; after one, the communicator (and usually the job) is done.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "meshflow/comm/transport.h"
#include "meshflow/core/dtype.h"

namespace meshflow {

enum class ReduceOp { kSum, kMax };

// A pending asynchronous collective.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_future<Status> f) : f_(std::move(f)) {}
  Status wait() const { return f_.valid() ? f_.get() : Status::ok(); }
  bool ready() const {
    return !f_.valid() || f_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  std::shared_future<Status> f_;
};

class Communicator {
 public:
  // The group of all ranks of a transport. Each call makes a new group (with
  // its own tags), so every rank must make its world groups in the same order.
  static std::shared_ptr<Communicator> world(std::shared_ptr<Transport> t);
  // Wait on every Work first: destroying a communicator with async work
  // still unfinished aborts the transport (the peers could not go on).
  ~Communicator();

  int rank() const { return rank_; }  // in this group
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& world_ranks() const { return ranks_; }  // group rank -> world rank
  const Transport& transport() const { return *t_; }
  uint32_t group_id() const { return group_id_; }

  // A sub-group of this group's ranks (given as ranks of this group, in the
  // order that defines the new group's ranks). Only members call it, every
  // member with the same list; a non-member or a bad list gets an error.
  Result<std::shared_ptr<Communicator>> split(const std::vector<int>& group_ranks);

  Status all_reduce(float* data, int64_t count, ReduceOp op);
  // out has count * size() elements, rank r's input at [r*count, (r+1)*count).
  // `in` may be `out + rank() * count` (in place).
  Status all_gather(const float* in, int64_t count, float* out);
  // out has sum(counts) elements, rank r's counts[r] inputs after those of ranks < r.
  Status all_gather_v(const float* in, const std::vector<int64_t>& counts, float* out);
  // in has count_per_rank * size() elements; rank r receives the reduction of block r.
  Status reduce_scatter(const float* in, int64_t count_per_rank, float* out, ReduceOp op);
  // in has sum(counts) elements; rank r receives the reduction of its counts[r] block.
  Status reduce_scatter_v(const float* in, const std::vector<int64_t>& counts, float* out,
                          ReduceOp op);
  // in and out have count_per_rank * size() elements; block r goes to rank r.
  // REQUIRES: in and out do not overlap.
  Status all_to_all(const float* in, int64_t count_per_rank, float* out);
  Status broadcast(float* data, int64_t count, int root);
  // Point to point within the group; messages between two ranks arrive in order.
  Status send(const float* data, int64_t count, int peer);
  Status recv(float* data, int64_t count, int peer);
  Status barrier();

  // Typed forms: the same collectives for elements of any dtype
  // (core/dtype.h); counts are elements. Data movement (all_gather,
  // all_to_all, broadcast, send, recv) moves the elements' bytes. Reductions
  // add f32 as above; bf16 and f16 in f32 (converted in, reduced by the
  // algorithms above, rounded back once, to nearest even); i32 and i64
  // exactly, in 64-bit integers: every rank gathers the group's inputs
  // (all_gather, or all_to_all for reduce_scatter) and reduces them in rank
  // order (the traffic of a gather: meant for ids, counts and offsets).
  Status all_reduce(void* data, int64_t count, DType dt, ReduceOp op);
  Status all_gather(const void* in, int64_t count, void* out, DType dt);
  Status reduce_scatter(const void* in, int64_t count_per_rank, void* out, DType dt, ReduceOp op);
  Status all_to_all(const void* in, int64_t count_per_rank, void* out, DType dt);
  Status broadcast(void* data, int64_t count, DType dt, int root);
  Status send(const void* data, int64_t count, DType dt, int peer);
  Status recv(void* data, int64_t count, DType dt, int peer);
  // Halo exchange along the group as a line (no wrap-around), as a spatially
  // split convolution needs: sends to_prev (n_prev elements) to rank - 1 and
  // to_next (n_next) to rank + 1; receives rank - 1's to_next into from_prev
  // (n_next elements) and rank + 1's to_prev into from_next (n_prev). The
  // first rank receives nothing from before it, the last nothing from after:
  // those buffers are left as they are. Every rank calls it with the same
  // counts; the two directions run at once on every link.
  Status neighbor_exchange(const void* to_prev, int64_t n_prev, const void* to_next, int64_t n_next,
                           void* from_prev, void* from_next, DType dt);

  // Ring shift (ring attention's k/v blocks): sends `count` elements of `dt`
  // from `send` to rank + 1 and receives rank - 1's into `recv` (wrapping
  // around; one rank: a copy). `send` and `recv` must not overlap and stay
  // untouched until the Work is done; compute may read `send` meanwhile.
  // The send is posted now and the receive runs in wait(), on the thread
  // that waits: wait on every such Work (a Work dropped unwaited withdraws
  // its send, and the ring's next rank then times out on its receive).
  Work ring_shift_async(const void* send, void* recv, int64_t count, DType dt);

  Work all_reduce_async(float* data, int64_t count, ReduceOp op);
  Work all_gather_async(const float* in, int64_t count, float* out);
  Work reduce_scatter_async(const float* in, int64_t count_per_rank, float* out, ReduceOp op);

 private:
  struct Impl;
  Communicator(std::shared_ptr<Transport> t, std::vector<int> ranks, uint32_t group_id);
  uint64_t next_tag();
  std::string where() const;  // " in group [0,2] on rank 2", for error messages
  // send / recv of `count` elements of `dt` (bytes on the transport).
  Status point_to_point(bool is_send, void* data, int64_t count, DType dt, int peer);
  // Runs `op` on the calling thread after the pending async work.
  Status run_now(const std::string& what, const std::function<Status(uint64_t tag)>& op);
  // Queues `op` for the progress thread.
  Work run_async(const std::string& what, std::function<Status(uint64_t tag)> op);

  std::shared_ptr<Transport> t_;
  std::vector<int> ranks_;
  int rank_ = 0;
  uint32_t group_id_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshflow
