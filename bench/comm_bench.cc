// Bus bandwidth of the collectives on the `local` transport, the nccl-tests
// way: `size` is the larger buffer of the call (all_reduce: the data;
// all_gather: the gathered output; reduce_scatter: the full input),
// algbw = size / time, and
//   busbw = algbw * 2(n-1)/n  (all_reduce)    algbw * (n-1)/n  (all_gather, reduce_scatter)
// so it compares with the bandwidth of one link whatever the rank count.
// The time is the slowest rank's mean over the timed iterations.
//
//   comm_bench [--ranks 2,4] [--min-bytes 1024] [--max-bytes 268435456] [--factor 4]
//              [--ops all_reduce,all_gather,reduce_scatter] [--seconds 0.25] [--spin-us 50]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "bench_table.h"
#include "meshflow/comm/communicator.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/kernels/cpu/blas_core.h"

using namespace meshflow;

namespace {

struct Options {
  std::vector<int> ranks = {2, 4};
  std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter"};
  int64_t min_bytes = 1024, max_bytes = int64_t{256} << 20, factor = 4;
  double seconds = 0.25;  // timed per size (at least 2 iterations)
  LocalTransportOptions transport;
};

template <class T>
std::vector<T> split_list(const std::string& s) {
  std::vector<T> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::stringstream is(item);
    T v;
    is >> v;
    out.push_back(v);
  }
  return out;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One call of `op` on buffers for `size` bytes.
struct Bench {
  Communicator& c;
  const std::string& op;
  std::vector<float> in, out;
  int64_t count = 0;  // per call, as the collective takes it

  Bench(Communicator& comm, const std::string& name, int64_t size) : c(comm), op(name) {
    const int64_t floats = size / static_cast<int64_t>(sizeof(float)), n = c.size();
    if (op == "all_reduce") {
      count = floats;
      in.assign(count, 0.f);
    } else if (op == "all_gather") {
      count = floats / n;
      in.assign(count, 0.f);
      out.assign(count * n, 0.f);
    } else {
      count = floats / n;
      in.assign(count * n, 0.f);
      out.assign(count, 0.f);
    }
  }
  Status run() {
    if (op == "all_reduce") return c.all_reduce(in.data(), count, ReduceOp::kSum);
    if (op == "all_gather") return c.all_gather(in.data(), count, out.data());
    return c.reduce_scatter(in.data(), count, out.data(), ReduceOp::kSum);
  }
};

Status bench_op(const Options& o, int n, const std::string& op) {
  if (op != "all_reduce" && op != "all_gather" && op != "reduce_scatter")
    return Status::invalid("unknown op '" + op + "' (all_reduce, all_gather, reduce_scatter)");
  using meshflow::bench::BenchOp;
  const double bus = meshflow::bench::bus_factor(
      op == "all_reduce" ? BenchOp::kAllReduce : BenchOp::kAllGather, n);
  meshflow::bench::print_table_header(op + ", local transport, " + std::to_string(n) + " ranks");
  return run_local_ranks(
      n,
      [&](const std::shared_ptr<Transport>& t) -> Status {
        auto c = Communicator::world(t);
        for (int64_t size = o.min_bytes; size <= o.max_bytes; size *= o.factor) {
          Bench b(*c, op, size);
          // Warm up (page faults, scratch buffers), then pick the iteration count
          // from the slowest rank's warm-up time so every rank runs the same.
          MF_RETURN_IF_ERROR(b.run());
          MF_RETURN_IF_ERROR(c->barrier());
          double t0 = now_s();
          MF_RETURN_IF_ERROR(b.run());
          float warm = static_cast<float>(now_s() - t0);
          MF_RETURN_IF_ERROR(c->all_reduce(&warm, 1, ReduceOp::kMax));
          const int iters =
              static_cast<int>(std::clamp(o.seconds / std::max(warm, 1e-7f), 2.0, 5000.0));
          MF_RETURN_IF_ERROR(c->barrier());
          t0 = now_s();
          for (int i = 0; i < iters; ++i) MF_RETURN_IF_ERROR(b.run());
          float time = static_cast<float>((now_s() - t0) / iters);
          MF_RETURN_IF_ERROR(c->all_reduce(&time, 1, ReduceOp::kMax));
          if (t->rank() == 0) {
            meshflow::bench::print_table_row(size, time, bus, iters);
            std::fflush(stdout);
          }
        }
        return Status::ok();
      },
      o.transport);
}

}  // namespace

int main(int argc, char** argv) {
  meshflow::cpu::use_supported_blas_kernels(argv);  // kernels/cpu/blas_core.h
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--ranks")
      o.ranks = split_list<int>(v);
    else if (k == "--ops")
      o.ops = split_list<std::string>(v);
    else if (k == "--min-bytes")
      o.min_bytes = std::atoll(v.c_str());
    else if (k == "--max-bytes")
      o.max_bytes = std::atoll(v.c_str());
    else if (k == "--factor")
      o.factor = std::max(2LL, std::atoll(v.c_str()));
    else if (k == "--seconds")
      o.seconds = std::atof(v.c_str());
    else if (k == "--spin-us")
      o.transport.spin_us = std::atof(v.c_str());
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  for (int n : o.ranks)
    for (const std::string& op : o.ops) {
      Status s = bench_op(o, n, op);
      if (!s.is_ok()) {
        std::fprintf(stderr, "comm_bench: %s\n", s.message().c_str());
        return 1;
      }
    }
  return 0;
}
