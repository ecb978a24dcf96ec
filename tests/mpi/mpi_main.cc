// meshflow_mpi_test: the mpi backend's tests; runs under mpirun (tests/mpi.cmake).
//
//   mpirun -np 4 meshflow_mpi_test check          transport + collectives + bits vs local
//   mpirun -np 3 meshflow_mpi_test fail-abort 1   rank 1 calls Transport::abort mid-run
//   mpirun -np 3 meshflow_mpi_test fail-throw 1   rank 1 throws; main returns 1
//   mpirun -np 3 meshflow_mpi_test fail-kill 1    rank 1 SIGKILLs itself mid-collective
//   mpirun -np 3 meshflow_mpi_test fail-stall 1   rank 1 stops communicating (alive): the
//                                                 others time out (MESHFLOW_COMM_TIMEOUT_S)
//   mpirun -np 2 meshflow_mpi_test large          one 2.25 GiB message (split path)
//
// The nccl-tests way: inputs are seeded by rank, so every rank computes what
// it must receive and checks its own result. Failures print the rank, the
// check and the first differing element; a failing rank exits 1, which ends
// the job (mpi_transport.h).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.h"
#include "meshflow/comm/communicator.h"
#include "meshflow/comm/mpi_transport.h"
#include "meshflow/comm/transport.h"

namespace meshflow::mpitest {
namespace {

// The byte at offset i of the test message that `rank` sends for `seed`.
uint8_t pattern(int rank, uint64_t seed, size_t i) {
  return static_cast<uint8_t>((i * 131 + static_cast<size_t>(rank) * 17 + seed * 29) >> 1);
}

std::vector<uint8_t> make_message(int rank, uint64_t seed, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = pattern(rank, seed, i);
  return v;
}

void check_message(Checker& c, const std::string& what, const std::vector<uint8_t>& got, int from,
                   uint64_t seed) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != pattern(from, seed, i)) {
      c.fail(what + ": byte " + std::to_string(i) + " of " + std::to_string(got.size()) +
             " from rank " + std::to_string(from) + " is " + std::to_string(got[i]) +
             ", expected " + std::to_string(pattern(from, seed, i)));
      return;
    }
  }
  c.pass();
}

// Tags from all over the 64-bit range: group ids in the high bits, small and
// large sequence numbers.
const uint64_t kTags[] = {0,
                          1,
                          0x00000001'00000000ULL,
                          0x7fffffff'ffffffffULL,
                          0xffffffff'ffffffffULL,
                          0xdeadbeef'00000042ULL};

// Every rank sends to rank+1 and receives from rank-1 at once.
void test_ring_send_recv(Checker& c, Transport& t) {
  const int n = t.size(), r = t.rank();
  const size_t sizes[] = {0, 1, 7, 4096, 32 << 10, (32 << 10) + 1, (1 << 20) + 3, 5 << 20};
  int k = 0;
  for (size_t bytes : sizes) {
    for (uint64_t tag : {kTags[k % 6], kTags[(k + 3) % 6]}) {
      ++k;
      std::vector<uint8_t> out = make_message(r, tag + bytes, bytes), in(bytes);
      Status s =
          t.send_recv((r + 1) % n, out.data(), bytes, (r + n - 1) % n, in.data(), bytes, tag);
      std::string what = "ring send_recv " + std::to_string(bytes) + " bytes";
      if (!c.ok(what, s)) continue;
      check_message(c, what, in, (r + n - 1) % n, tag + bytes);
    }
  }
}

// Every ordered pair exchanges with blocking send/recv, pairs taken in one
// global order (so the earliest unfinished pair can always progress).
void test_pairs_send_recv(Checker& c, Transport& t) {
  const int n = t.size(), r = t.rank();
  for (size_t bytes : {size_t{10}, size_t{100} << 10}) {
    for (int a = 0; a < n; ++a) {
      for (int b = a + 1; b < n; ++b) {
        if (r != a && r != b) continue;
        const int peer = r == a ? b : a;
        const uint64_t tag = (uint64_t(a) << 40) | (uint64_t(b) << 20) | bytes;
        std::vector<uint8_t> out = make_message(r, tag, bytes), in(bytes);
        Status s1, s2;
        if (r == a) {
          s1 = t.send(peer, tag, out.data(), bytes);
          s2 = t.recv(peer, tag, in.data(), bytes);
        } else {
          s1 = t.recv(peer, tag, in.data(), bytes);
          s2 = t.send(peer, tag, out.data(), bytes);
        }
        std::string what = "send/recv " + std::to_string(a) + "<->" + std::to_string(b);
        if (c.ok(what, s1) && c.ok(what, s2)) check_message(c, what, in, peer, tag);
      }
    }
  }
}

// Messages between one pair with one tag arrive in the order sent, small and
// large (split into chunks when MESHFLOW_MPI_CHUNK_BYTES is small) mixed.
void test_in_order(Checker& c, Transport& t) {
  const int r = t.rank();
  if (t.size() < 2) return;
  const uint64_t tag = 0xabcdef'00000007ULL;
  const size_t sizes[] = {8, 50 << 10, 0, 3, 200 << 10, 16, (1 << 20) + 1, 5};
  for (int i = 0; i < 8; ++i) {
    const size_t bytes = sizes[i];
    if (r == 0) {
      std::vector<uint8_t> out = make_message(0, 1000 + i, bytes);
      c.ok("in-order send", t.send(1, tag, out.data(), bytes));
    } else if (r == 1) {
      std::vector<uint8_t> in(bytes);
      if (c.ok("in-order recv", t.recv(0, tag, in.data(), bytes))) {
        check_message(c, "in-order message " + std::to_string(i), in, 0, 1000 + i);
      }
    }
  }
}

// Four threads per rank run rings at once on their own tags, as the progress
// threads of four communicators do (MPI_THREAD_MULTIPLE).
void test_concurrent_threads(Checker& c, Transport& t) {
  const int n = t.size(), r = t.rank();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(4);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int it = 0; it < 20; ++it) {
        const size_t bytes = (it % 2 == 0) ? 100 : (256 << 10) + k;
        const uint64_t tag = (uint64_t(k + 1) << 32) | it;
        std::vector<uint8_t> out = make_message(r, tag, bytes), in(bytes);
        Status s =
            t.send_recv((r + 1) % n, out.data(), bytes, (r + n - 1) % n, in.data(), bytes, tag);
        if (!s.is_ok()) {
          errors[k] = s.message();
          return;
        }
        if (in != make_message((r + n - 1) % n, tag, bytes)) {
          errors[k] =
              "thread " + std::to_string(k) + " iteration " + std::to_string(it) + ": wrong data";
          return;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 4; ++k) {
    if (errors[k].empty()) {
      c.pass();
    } else {
      c.fail("concurrent rings: " + errors[k]);
    }
  }
}

// A receive that does not match the send (same tag, other size) is an error
// naming both, and health() reports it. Run last: it leaves rank 1 unhealthy.
void test_mismatch_detected(Checker& c, Transport& t) {
  if (t.size() < 2) return;
  const uint64_t tag = 0x5eed'00000001ULL;
  if (t.rank() == 0) {
    std::vector<uint8_t> out(100, 1);
    c.ok("mismatch send", t.send(1, tag, out.data(), out.size()));
  } else if (t.rank() == 1) {
    std::vector<uint8_t> in(64);
    Status s = t.recv(0, tag, in.data(), in.size());
    if (s.is_ok() || s.message().find("does not match") == std::string::npos ||
        s.message().find("100 bytes") == std::string::npos) {
      c.fail("a 100-byte message received as 64 bytes gave: " +
             (s.is_ok() ? std::string("ok") : s.message()));
    } else if (t.health().is_ok()) {
      c.fail("health() is ok after a mismatched receive");
    } else {
      c.pass();
    }
  }
}

int run_check(const std::shared_ptr<Transport>& tp) {
  Transport& t = *tp;
  Checker c(t.rank());
  test_ring_send_recv(c, t);
  test_pairs_send_recv(c, t);
  test_in_order(c, t);
  test_concurrent_threads(c, t);
  c.ok("barrier", transport_barrier(t));
  run_collective_checks(c, tp);
  c.ok("barrier", transport_barrier(t));
  check_bits_match_local(c, tp);
  c.ok("barrier", transport_barrier(t));
  test_mismatch_detected(c, t);
  c.ok("barrier", transport_barrier(t));
  return c.report("meshflow_mpi_test check (" + std::to_string(t.size()) + " ranks)");
}

// Rank `bad` fails after a few collectives while every rank keeps running them.
int run_failure(const std::shared_ptr<Transport>& tp, const std::string& mode, int bad) {
  Transport& t = *tp;
  auto world = Communicator::world(tp);
  std::vector<float> grad(1 << 16, 1.0f);
  if (t.rank() == bad && mode == "kill") {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::fprintf(stderr, "meshflow_mpi_test: rank killing itself with SIGKILL\n");
      raise(SIGKILL);
    }).detach();
  }
  for (int it = 0;; ++it) {
    if (t.rank() == bad && it == 5) {
      if (mode == "abort") t.abort("injected failure (test)");
      if (mode == "throw") throw std::runtime_error("injected exception (test)");
      if (mode == "stall") std::this_thread::sleep_for(std::chrono::hours(1));
    }
    Status s = world->all_reduce(grad.data(), static_cast<int64_t>(grad.size()), ReduceOp::kMax);
    if (!s.is_ok()) {
      std::fprintf(stderr, "meshflow_mpi_test: rank %d: %s\n", t.rank(), s.message().c_str());
      return 1;
    }
  }
}

// One message of 2.25 GiB from rank 0 to rank 1: more than an MPI int count.
int run_large(Transport& t) {
  Checker c(t.rank());
  if (t.size() < 2) return c.report("meshflow_mpi_test large: needs 2 ranks");
  const size_t bytes = (size_t{9} << 28);
  const uint64_t tag = 77;
  if (t.rank() == 0) {
    std::vector<uint8_t> out(bytes);
    for (size_t i = 0; i < bytes; i += 4093) out[i] = static_cast<uint8_t>(i >> 12);
    out[bytes - 1] = 0x5a;
    if (c.ok("large send", t.send(1, tag, out.data(), bytes))) c.pass();
  } else if (t.rank() == 1) {
    std::vector<uint8_t> in(bytes, 0xff);
    if (c.ok("large recv", t.recv(0, tag, in.data(), bytes))) {
      bool good = in[bytes - 1] == 0x5a;
      for (size_t i = 0; i < bytes && good; i += 4093) good = in[i] == uint8_t(i >> 12);
      good ? c.pass() : c.fail("2.25 GiB message arrived with wrong data");
    }
  }
  c.ok("barrier", transport_barrier(t));
  return c.report("meshflow_mpi_test large");
}

}  // namespace
}  // namespace meshflow::mpitest

int main(int argc, char** argv) {
  using namespace meshflow;
  const std::string mode = argc > 1 ? argv[1] : "check";
  Result<std::shared_ptr<Transport>> t = make_mpi_transport();
  if (!t.is_ok()) {
    std::fprintf(stderr, "meshflow_mpi_test: %s\n", t.status().message().c_str());
    return 1;
  }
  try {
    if (mode == "check") return mpitest::run_check(*t);
    if (mode == "large") return mpitest::run_large(**t);
    if (mode.rfind("fail-", 0) == 0 && argc > 2) {
      return mpitest::run_failure(*t, mode.substr(5), std::atoi(argv[2]));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshflow_mpi_test: exception: %s\n", e.what());
    return 1;
  }
  std::fprintf(
      stderr,
      "usage: meshflow_mpi_test check|large|fail-abort R|fail-throw R|fail-kill R|fail-stall R\n");
  return 2;
}
