// Raw MPI collectives (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block)
// on this machine: the reference for meshflow's mpi backend, which runs its
// own ring algorithms over MPI point-to-point (bench/comm_compare.sh).
//
//   mpirun -np 4 build/bench/mpi_allreduce_raw [--min-bytes 1024] [--max-bytes 268435456]
//                                              [--seconds 0.25]
//
// Measured and printed as bench/comm_bench.cc (the local backend) does, so the
// tables compare line by line: f32 sum, 1 KiB .. 256 MiB in steps of 4x, out
// of place; `size` is the larger buffer of the call (all_reduce: the data;
// all_gather: the gathered output; reduce_scatter: the full input); algbw =
// size / time; busbw (nccl-tests) = algbw x 2(n-1)/n for all_reduce and
// x (n-1)/n for all_gather and reduce_scatter. One warm-up call picks the
// iteration count (about --seconds per size, 2..5000, the same on every
// rank); the time is the slowest rank's mean.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_table.h"

#ifdef MESHFLOW_HAVE_MPI
#include <mpi.h>

namespace {

// Stops the job with the call, file:line and MPI's message (llm.c's mpiCheck).
void mpi_check(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  std::fprintf(stderr, "mpi_allreduce_raw: %s failed at %s:%d: %.*s\n", call, file, line, len, msg);
  MPI_Abort(MPI_COMM_WORLD, 1);
}
#define MPI_CHECK(call) mpi_check((call), #call, __FILE__, __LINE__)

using meshflow::bench::BenchOp;

// Mean seconds per call of `op` on `bytes` (the larger buffer), slowest rank;
// the iteration count goes to *iters.
double time_op(BenchOp op, size_t bytes, int n, double seconds, std::vector<float>& a,
               std::vector<float>& b, int* iters) {
  const int count = static_cast<int>(bytes / sizeof(float));
  auto run = [&] {
    switch (op) {
      case BenchOp::kAllReduce:
        MPI_CHECK(MPI_Allreduce(a.data(), b.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
        break;
      case BenchOp::kAllGather:
        MPI_CHECK(MPI_Allgather(a.data(), count / n, MPI_FLOAT, b.data(), count / n, MPI_FLOAT,
                                MPI_COMM_WORLD));
        break;
      case BenchOp::kReduceScatter:
        MPI_CHECK(MPI_Reduce_scatter_block(a.data(), b.data(), count / n, MPI_FLOAT, MPI_SUM,
                                           MPI_COMM_WORLD));
        break;
    }
  };
  run();  // warm-up: page faults, connections
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  double t0 = MPI_Wtime();
  run();
  double warm = MPI_Wtime() - t0, slowest = 0;
  MPI_CHECK(MPI_Allreduce(&warm, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  *iters = static_cast<int>(std::clamp(seconds / std::max(slowest, 1e-7), 2.0, 5000.0));
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  t0 = MPI_Wtime();
  for (int i = 0; i < *iters; ++i) run();
  double elapsed = MPI_Wtime() - t0;
  MPI_CHECK(MPI_Allreduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return slowest / *iters;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_CHECK(MPI_Init(&argc, &argv));
  int rank = 0, n = 1;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &n));
  size_t min_bytes = 1 << 10, max_bytes = size_t{256} << 20;
  double seconds = 0.25;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--min-bytes") == 0)
      min_bytes = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--max-bytes") == 0)
      max_bytes = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[i + 1]);
  }
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_CHECK(MPI_Get_library_version(version, &len));
  const std::string v(version, len);
  std::vector<float> a(max_bytes / sizeof(float), 1.0f), b(max_bytes / sizeof(float));
  for (BenchOp op : {BenchOp::kAllReduce, BenchOp::kAllGather, BenchOp::kReduceScatter}) {
    const double bus = meshflow::bench::bus_factor(op, n);
    if (rank == 0)
      meshflow::bench::print_table_header(std::string(meshflow::bench::bench_op_name(op)) +
                                          ", raw MPI (" + v.substr(0, v.find(',')) + "), " +
                                          std::to_string(n) + " ranks");
    for (size_t size = min_bytes; size <= max_bytes; size *= 4) {
      int iters = 0;
      const double t = time_op(op, size, n, seconds, a, b, &iters);
      if (rank == 0) {
        meshflow::bench::print_table_row(static_cast<int64_t>(size), t, bus, iters);
        std::fflush(stdout);
      }
    }
  }
  MPI_CHECK(MPI_Finalize());
  return 0;
}

#else  // !MESHFLOW_HAVE_MPI

int main() {
  std::fprintf(stderr,
               "mpi_allreduce_raw: meshflow was built without MPI (install libopenmpi-dev)\n");
  return 1;
}

#endif
