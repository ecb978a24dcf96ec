// Raw MPI collectives (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block)
// on this machine: the reference for meshflow's mpi backend, which runs its
// own ring algorithms over MPI point-to-point (bench/comm_compare.sh).
//
//   mpirun -np 4 build/bench/mpi_allreduce_raw [--min-bytes 1024] [--max-bytes 268435456]
//
// f32 sum, 1 KiB .. 256 MiB in steps of 4x, out of place. SIZE is the whole
// buffer as in nccl-tests: the all_reduce buffer, the all_gather output, the
// reduce_scatter input. algbw = SIZE / time; busbw (nccl-tests) = algbw x
// 2(n-1)/n for all_reduce and x (n-1)/n for all_gather and reduce_scatter.
// The time of a size is the slowest rank's mean over the timed iterations.
// Output: `OP SIZE_BYTES TIME_US ALGBW_GBPS BUSBW_GBPS`, one line per op and size.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

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

// Enough iterations for a stable mean, at most about 0.5 GiB moved per size.
int iterations(size_t bytes) {
  size_t it = (size_t{512} << 20) / bytes;
  return static_cast<int>(it < 3 ? 3 : it > 200 ? 200 : it);
}

enum class Op { kAllReduce, kAllGather, kReduceScatter };
const char* op_name(Op op) {
  return op == Op::kAllReduce   ? "all_reduce"
         : op == Op::kAllGather ? "all_gather"
                                : "reduce_scatter";
}

// Mean seconds per call of `op` on `bytes` (the whole buffer), slowest rank.
double time_op(Op op, size_t bytes, int n, std::vector<float>& a, std::vector<float>& b) {
  const int count = static_cast<int>(bytes / sizeof(float));
  auto run = [&] {
    switch (op) {
      case Op::kAllReduce:
        MPI_CHECK(MPI_Allreduce(a.data(), b.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
        break;
      case Op::kAllGather:
        MPI_CHECK(MPI_Allgather(a.data(), count / n, MPI_FLOAT, b.data(), count / n, MPI_FLOAT,
                                MPI_COMM_WORLD));
        break;
      case Op::kReduceScatter:
        MPI_CHECK(MPI_Reduce_scatter_block(a.data(), b.data(), count / n, MPI_FLOAT, MPI_SUM,
                                           MPI_COMM_WORLD));
        break;
    }
  };
  const int iters = iterations(bytes);
  for (int i = 0; i < std::max(1, iters / 10); ++i) run();  // warm-up
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  double t0 = MPI_Wtime();
  for (int i = 0; i < iters; ++i) run();
  double elapsed = MPI_Wtime() - t0, slowest = 0;
  MPI_CHECK(MPI_Allreduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return slowest / iters;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_CHECK(MPI_Init(&argc, &argv));
  int rank = 0, n = 1;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &n));
  size_t min_bytes = 1 << 10, max_bytes = size_t{256} << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--min-bytes") == 0)
      min_bytes = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--max-bytes") == 0)
      max_bytes = std::strtoull(argv[i + 1], nullptr, 10);
  }
  if (rank == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_CHECK(MPI_Get_library_version(version, &len));
    std::string v(version, len);
    std::printf(
        "# raw MPI collectives (%s), %d ranks, f32 sum; busbw: all_reduce x 2(n-1)/n, "
        "all_gather and reduce_scatter x (n-1)/n\n",
        v.substr(0, v.find(',')).c_str(), n);
    std::printf("# op size_bytes time_us algbw_GBps busbw_GBps\n");
    std::fflush(stdout);
  }
  std::vector<float> a(max_bytes / sizeof(float), 1.0f), b(max_bytes / sizeof(float));
  for (Op op : {Op::kAllReduce, Op::kAllGather, Op::kReduceScatter}) {
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
      // Whole floats per rank for all_gather and reduce_scatter.
      const size_t unit = sizeof(float) * (op == Op::kAllReduce ? 1 : n);
      const size_t sz = bytes / unit * unit;
      double t = time_op(op, sz, n, a, b);
      if (rank == 0) {
        double algbw = static_cast<double>(sz) / t / 1e9;
        double factor = op == Op::kAllReduce ? 2.0 * (n - 1) / n : double(n - 1) / n;
        std::printf("%s %zu %.2f %.3f %.3f\n", op_name(op), sz, t * 1e6, algbw, algbw * factor);
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
