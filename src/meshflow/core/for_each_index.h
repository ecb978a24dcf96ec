// for_each_index: f(0) .. f(n - 1) on the machine's cores, each index once,
// for independent work whose results the caller merges in index order (the
// planner's sweep of (tp, cp) groups, its leaders' pricing).
//
//   std::vector<double> t(plans.size());
//   for_each_index(plans.size(), /*threads=*/0, [&](size_t i) { t[i] = price(plans[i]); });
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace meshflow {

// Runs f(0) .. f(n - 1) on up to `threads` threads (0: one per core), each
// index once. Where a thread cannot be started, the calling thread runs the
// rest. An exception thrown by f (an internal error, out of memory) stops the
// others taking new indices and is rethrown here, on the calling thread, as it
// would be without threads.
template <typename F>
void for_each_index(size_t n, int threads, F f) {
  size_t workers =
      threads > 0 ? size_t(threads) : std::max(1u, std::thread::hardware_concurrency());
  workers = std::min({workers, n, size_t(64)});
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::exception_ptr failed;
  auto work = [&]() {
    for (size_t i = next++; i < n; i = next++) {
      try {
        f(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failed) failed = std::current_exception();
        next = n;
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t w = 1; w < workers; ++w) {
    try {
      pool.emplace_back(work);
    } catch (const std::system_error&) {
      break;
    }
  }
  work();
  for (std::thread& t : pool) t.join();
  if (failed) std::rethrow_exception(failed);
}

}  // namespace meshflow
