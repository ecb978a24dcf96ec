// for_each_index (core/for_each_index.h): every index runs once on any thread
// count, and an exception on a worker reaches the caller.
#include "meshflow/core/for_each_index.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

namespace meshflow {
namespace {

TEST(ForEachIndex, EveryIndexOnceOnAnyThreadCount) {
  for (int threads : {0, 1, 2, 7, 100}) {
    for (size_t n : {size_t(0), size_t(1), size_t(5), size_t(1000)}) {
      std::vector<std::atomic<int>> hits(n);
      for_each_index(n, threads, [&](size_t i) { ++hits[i]; });
      for (size_t i = 0; i < n; ++i)
        EXPECT_EQ(hits[i].load(), 1) << "index " << i << " of " << n << ", threads " << threads;
    }
  }
}

TEST(ForEachIndex, AnExceptionOnAWorkerReachesTheCaller) {
  for (int threads : {1, 3}) {
    std::atomic<int> ran{0};
    try {
      for_each_index(64, threads, [&](size_t i) {
        ++ran;
        if (i == 5) throw std::runtime_error("index 5 failed");
      });
      ADD_FAILURE() << "no exception with " << threads << " threads";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "index 5 failed");
    }
    // On one thread the indices after it are not taken.
    if (threads == 1) {
      EXPECT_EQ(ran.load(), 6);
    }
  }
}

}  // namespace
}  // namespace meshflow
