// run_local_ranks: one thread per rank; the first failure aborts the transport.
#include "meshflow/comm/local_world.h"

#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

namespace meshflow {

Status run_local_ranks(int world_size, const RankFn& fn, const LocalTransportOptions& options,
                       std::vector<Status>* per_rank) {
  if (world_size < 1)
    return Status::invalid("run_local_ranks: the number of ranks must be >= 1, got " +
                           std::to_string(world_size));
  std::vector<std::shared_ptr<Transport>> transports = make_local_transports(world_size, options);
  std::vector<Status> results(world_size);
  std::mutex mu;
  Status first;  // the first failure to come back, in time

  auto run_rank = [&](int r) {
    const std::shared_ptr<Transport>& t = transports[r];
    Status s;
    try {
      s = fn(t);
    } catch (const StatusError& e) {
      s = e.status();
    } catch (const std::exception& e) {
      s = Status::internal(std::string("uncaught exception: ") + e.what());
    } catch (...) {
      s = Status::internal("uncaught exception of unknown type");
    }
    results[r] = s;
    if (s.is_ok()) return;
    std::lock_guard<std::mutex> lk(mu);
    if (first.is_ok()) first = Status(s.code(), "rank " + std::to_string(r) + ": " + s.message());
    t->abort(s.message());  // a no-op when some rank already aborted
  };

  std::vector<std::thread> threads;
  threads.reserve(world_size - 1);
  for (int r = 1; r < world_size; ++r) threads.emplace_back(run_rank, r);
  run_rank(0);
  for (std::thread& th : threads) th.join();

  // The root cause is the rank that aborted the transport (the others only
  // saw "rank R failed"); its own error says more than its abort reason
  // (e.g. a communicator destroyed on that rank's error path).
  Status health = transports[0]->health();
  int culprit = -1;
  if (!health.is_ok()) std::sscanf(health.message().c_str(), "rank %d failed:", &culprit);
  if (per_rank != nullptr) *per_rank = results;
  if (culprit >= 0 && culprit < world_size && !results[culprit].is_ok())
    return Status(results[culprit].code(),
                  "rank " + std::to_string(culprit) + ": " + results[culprit].message());
  if (!health.is_ok()) return health;
  return first;
}

}  // namespace meshflow
