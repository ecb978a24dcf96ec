// What the communication benchmarks share (comm_bench, mpi_comm_bench,
// mpi_allreduce_raw): the collectives they time, the nccl-tests bus-bandwidth
// factor, and one table format so bench/comm_compare.sh can set them side by side.
//
//   print_table_header("all_reduce, local, 2 ranks");
//   print_table_row(bytes, seconds, bus_factor(BenchOp::kAllReduce, n), iters);
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace meshflow::bench {

enum class BenchOp { kAllReduce, kAllGather, kReduceScatter };

inline const char* bench_op_name(BenchOp op) {
  return op == BenchOp::kAllReduce   ? "all_reduce"
         : op == BenchOp::kAllGather ? "all_gather"
                                     : "reduce_scatter";
}

// nccl-tests: busbw = algbw * 2(n-1)/n for all_reduce, * (n-1)/n for all_gather and reduce_scatter.
inline double bus_factor(BenchOp op, int n) {
  return op == BenchOp::kAllReduce ? 2.0 * (n - 1) / n : 1.0 * (n - 1) / n;
}

inline std::string human_size(int64_t bytes) {
  char buf[32];
  if (bytes >= (int64_t{1} << 20))
    std::snprintf(buf, sizeof(buf), "%lld MiB", static_cast<long long>(bytes >> 20));
  else
    std::snprintf(buf, sizeof(buf), "%lld KiB", static_cast<long long>(bytes >> 10));
  return buf;
}

inline void print_table_header(const std::string& title) {
  std::printf("\n%s\n", title.c_str());
  std::printf("%10s %12s %12s %12s %6s\n", "size", "time_us", "algbw_GB/s", "busbw_GB/s", "iters");
}

inline void print_table_row(int64_t bytes, double seconds, double bus, int iters) {
  const double algbw = static_cast<double>(bytes) / seconds / 1e9;
  std::printf("%10s %12.1f %12.3f %12.3f %6d\n", human_size(bytes).c_str(), seconds * 1e6, algbw,
              algbw * bus, iters);
}

}  // namespace meshflow::bench
