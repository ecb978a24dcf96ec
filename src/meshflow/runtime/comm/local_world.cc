// run_local_ranks: one thread per rank; the first failure aborts the transport.
#include "meshflow/runtime/comm/local_world.h"

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
  Status first;  // the first failure, in time

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
    if (!first.is_ok()) return;
    // A rank that aborted the transport itself, before any rank returned,
    // is the root cause; the transport's failure names it.
    Status health = t->health();
    first = health.is_ok() ? Status(s.code(), "rank " + std::to_string(r) + ": " + s.message())
                           : health;
    if (health.is_ok()) t->abort(s.message());
  };

  std::vector<std::thread> threads;
  threads.reserve(world_size - 1);
  for (int r = 1; r < world_size; ++r) threads.emplace_back(run_rank, r);
  run_rank(0);
  for (std::thread& th : threads) th.join();
  if (per_rank != nullptr) *per_rank = std::move(results);
  return first;
}

}  // namespace meshflow
