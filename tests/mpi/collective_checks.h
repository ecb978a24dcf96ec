// Collective checks for the mpi test program (mpi_main.cc), the nccl-tests
// way: inputs are seeded by group rank, every rank computes what it must
// receive and checks only its own result.
//
//   Checker c(t->rank());
//   run_collective_checks(c, t);             // every collective, world and sub-groups
//   check_bits_match_local(c, t);            // the same inputs under the local backend
//   return c.report("meshflow_mpi_test");    // 0 when every check passed
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "meshflow/core/status.h"
#include "meshflow/comm/transport.h"

namespace meshflow::mpitest {

// Counts passed and failed checks of one rank; prints each failure at once.
class Checker {
 public:
  explicit Checker(int rank) : rank_(rank) {}
  void pass() { ++passed_; }
  void fail(const std::string& what) {
    ++failed_;
    std::fprintf(stderr, "meshflow_mpi_test: rank %d: FAIL: %s\n", rank_, what.c_str());
    std::fflush(stderr);
  }
  // Records a failure when s is not ok; returns s.is_ok().
  bool ok(const std::string& what, const Status& s) {
    if (s.is_ok()) return true;
    fail(what + ": " + s.message());
    return false;
  }
  // Prints the summary line; the process exit status.
  int report(const std::string& name) const {
    std::fprintf(stderr, "%s: rank %d: %d checks passed, %d failed\n", name.c_str(), rank_, passed_,
                 failed_);
    return failed_ == 0 ? 0 : 1;
  }

 private:
  int rank_;
  int passed_ = 0, failed_ = 0;
};

// All ranks wait for each other, on the transport alone (dissemination).
Status transport_barrier(Transport& t);

// Every collective of Communicator over `t`: world, the world in reverse
// order, a group of all but the last rank, and the rows and columns of a
// 2 x n/2 mesh (even n); 1 element to 4 MiB, sizes that do not divide.
void run_collective_checks(Checker& c, const std::shared_ptr<Transport>& t);

// The same all_reduce / reduce_scatter inputs (random floats, seeded by
// rank) run under the mpi transport and, in this process, under the local
// backend with t->size() threads: this rank's results must be bit-identical,
// and identical again on a second run.
void check_bits_match_local(Checker& c, const std::shared_ptr<Transport>& t);

}  // namespace meshflow::mpitest
