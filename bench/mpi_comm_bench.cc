// meshflow's Communicator over the mpi transport: bus bandwidth of its ring
// all_reduce / all_gather / reduce_scatter when ranks are MPI processes.
// Compared with raw MPI (mpi_allreduce_raw), the local backend (comm_bench)
// and gloo by bench/comm_compare.sh.
//
//   mpirun -np 4 build/bench/mpi_comm_bench [--min-bytes 1024] [--max-bytes 268435456]
//                                           [--seconds 0.25]
//
// Measured and printed as bench/comm_bench.cc (the local backend) does: f32
// sum, 1 KiB .. 256 MiB in steps of 4x; `size` is the larger buffer of the
// call; busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for the others; one
// warm-up call picks the iteration count (about --seconds per size); the time
// is the slowest rank's mean.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "bench_table.h"
#include "meshflow/comm/communicator.h"
#include "meshflow/comm/mpi_transport.h"
#include "meshflow/kernels/cpu/blas_core.h"

using namespace meshflow::bench;

namespace {

using meshflow::Communicator;
using meshflow::ReduceOp;
using meshflow::Status;

// Stops the whole job on a failed collective, naming this rank.
void check(const Status& s, const std::shared_ptr<meshflow::Transport>& t) {
  if (!s.is_ok()) t->abort("mpi_comm_bench: " + s.message());
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Mean seconds per call, slowest rank; the iteration count goes to *iters.
double time_op(BenchOp op, size_t bytes, double seconds, Communicator& comm,
               const std::shared_ptr<meshflow::Transport>& t, std::vector<float>& a,
               std::vector<float>& b, int* iters) {
  const int64_t count = static_cast<int64_t>(bytes / sizeof(float));
  const int64_t per_rank = count / comm.size();
  auto run = [&] {
    switch (op) {
      case BenchOp::kAllReduce:
        check(comm.all_reduce(a.data(), count, ReduceOp::kSum), t);
        break;
      case BenchOp::kAllGather:
        check(comm.all_gather(a.data(), per_rank, b.data()), t);
        break;
      case BenchOp::kReduceScatter:
        check(comm.reduce_scatter(a.data(), per_rank, b.data(), ReduceOp::kSum), t);
        break;
    }
  };
  run();  // warm-up: page faults, scratch buffers
  check(comm.barrier(), t);
  double t0 = now_s();
  run();
  float warm = static_cast<float>(now_s() - t0);
  check(comm.all_reduce(&warm, 1, ReduceOp::kMax), t);
  *iters = static_cast<int>(std::clamp(seconds / std::max(warm, 1e-7f), 2.0, 5000.0));
  check(comm.barrier(), t);
  t0 = now_s();
  for (int i = 0; i < *iters; ++i) run();
  float elapsed = static_cast<float>(now_s() - t0);
  check(comm.all_reduce(&elapsed, 1, ReduceOp::kMax), t);
  return elapsed / *iters;
}

}  // namespace

int main(int argc, char** argv) {
  meshflow::cpu::use_supported_blas_kernels(argv);  // kernels/cpu/blas_core.h
  size_t min_bytes = 1 << 10, max_bytes = size_t{256} << 20;
  double seconds = 0.25;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--min-bytes") == 0)
      min_bytes = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--max-bytes") == 0)
      max_bytes = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[i + 1]);
  }
  meshflow::Result<std::shared_ptr<meshflow::Transport>> t = meshflow::make_mpi_transport();
  if (!t.is_ok()) {
    std::fprintf(stderr, "mpi_comm_bench: %s\n", t.status().message().c_str());
    return 1;
  }
  auto comm = Communicator::world(*t);
  const int n = comm->size();
  std::vector<float> a(max_bytes / sizeof(float), 0.0f), b(max_bytes / sizeof(float));
  for (BenchOp op : {BenchOp::kAllReduce, BenchOp::kAllGather, BenchOp::kReduceScatter}) {
    const double bus = bus_factor(op, n);
    if (comm->rank() == 0) {
      char title[160];
      std::snprintf(title, sizeof title, "%s, mpi transport, %d ranks", bench_op_name(op), n);
      print_table_header(title);
    }
    for (size_t size = min_bytes; size <= max_bytes; size *= 4) {
      int iters = 0;
      const double sec = time_op(op, size, seconds, *comm, *t, a, b, &iters);
      if (comm->rank() == 0) {
        print_table_row(static_cast<int64_t>(size), sec, bus, iters);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
