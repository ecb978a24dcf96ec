// meshflow's Communicator over the mpi transport: bus bandwidth of its ring
// all_reduce / all_gather / reduce_scatter when ranks are MPI processes.
// Compared with raw MPI (mpi_allreduce_raw), the local backend (comm_bench)
// and gloo by bench/comm_compare.sh.
//
//   mpirun -np 4 build/bench/mpi_comm_bench [--min-bytes 1024] [--max-bytes 268435456]
//
// Same sizes, iterations, timing and output as mpi_allreduce_raw.cc: f32 sum,
// 1 KiB .. 256 MiB in steps of 4x; SIZE is the whole buffer (all_reduce
// buffer, all_gather output, reduce_scatter input); busbw = algbw x 2(n-1)/n
// for all_reduce, x (n-1)/n for the others; the slowest rank's mean time.
// Output: `OP SIZE_BYTES TIME_US ALGBW_GBPS BUSBW_GBPS`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "meshflow/runtime/comm/communicator.h"
#include "meshflow/runtime/comm/mpi_transport.h"

namespace {

using meshflow::Communicator;
using meshflow::ReduceOp;
using meshflow::Status;

// Stops the whole job on a failed collective, naming this rank.
void check(const Status& s, const std::shared_ptr<meshflow::Transport>& t) {
  if (!s.is_ok()) t->abort("mpi_comm_bench: " + s.message());
}

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

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Mean seconds per call, slowest rank.
double time_op(Op op, size_t bytes, Communicator& comm,
               const std::shared_ptr<meshflow::Transport>& t, std::vector<float>& a,
               std::vector<float>& b) {
  const int64_t count = static_cast<int64_t>(bytes / sizeof(float));
  const int64_t per_rank = count / comm.size();
  auto run = [&] {
    switch (op) {
      case Op::kAllReduce:
        check(comm.all_reduce(a.data(), count, ReduceOp::kSum), t);
        break;
      case Op::kAllGather:
        check(comm.all_gather(a.data(), per_rank, b.data()), t);
        break;
      case Op::kReduceScatter:
        check(comm.reduce_scatter(a.data(), per_rank, b.data(), ReduceOp::kSum), t);
        break;
    }
  };
  const int iters = iterations(bytes);
  for (int i = 0; i < std::max(1, iters / 10); ++i) run();  // warm-up
  check(comm.barrier(), t);
  const double t0 = now_s();
  for (int i = 0; i < iters; ++i) run();
  float elapsed = static_cast<float>(now_s() - t0);
  check(comm.all_reduce(&elapsed, 1, ReduceOp::kMax), t);
  return elapsed / iters;
}

}  // namespace

int main(int argc, char** argv) {
  size_t min_bytes = 1 << 10, max_bytes = size_t{256} << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--min-bytes") == 0)
      min_bytes = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--max-bytes") == 0)
      max_bytes = std::strtoull(argv[i + 1], nullptr, 10);
  }
  meshflow::Result<std::shared_ptr<meshflow::Transport>> t = meshflow::make_mpi_transport();
  if (!t.is_ok()) {
    std::fprintf(stderr, "mpi_comm_bench: %s\n", t.status().message().c_str());
    return 1;
  }
  auto comm = Communicator::world(*t);
  const int n = comm->size();
  if (comm->rank() == 0) {
    std::printf(
        "# meshflow Communicator over the mpi transport, %d ranks, f32 sum; busbw: "
        "all_reduce x 2(n-1)/n, all_gather and reduce_scatter x (n-1)/n\n",
        n);
    std::printf("# op size_bytes time_us algbw_GBps busbw_GBps\n");
    std::fflush(stdout);
  }
  std::vector<float> a(max_bytes / sizeof(float), 1.0f), b(max_bytes / sizeof(float));
  for (Op op : {Op::kAllReduce, Op::kAllGather, Op::kReduceScatter}) {
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
      const size_t unit = sizeof(float) * (op == Op::kAllReduce ? 1 : n);
      const size_t sz = bytes / unit * unit;
      std::fill(a.begin(), a.begin() + sz / sizeof(float), 1.0f);  // sums stay finite
      const double sec = time_op(op, sz, *comm, *t, a, b);
      if (comm->rank() == 0) {
        const double algbw = static_cast<double>(sz) / sec / 1e9;
        const double factor = op == Op::kAllReduce ? 2.0 * (n - 1) / n : double(n - 1) / n;
        std::printf("%s %zu %.2f %.3f %.3f\n", op_name(op), sz, sec * 1e6, algbw, algbw * factor);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
