// Communicator on the local transport, the nccl-tests way: every collective
// on the world group and on the rows and columns of 2-D meshes, world sizes
// 1..8, 1 element to 4 MiB, sizes that do not divide; each rank fills its
// inputs from its own world rank and checks its own result exactly (the
// inputs are small integers, so every float sum is exact in any order).
// Then: async overlap, bit-for-bit determinism and the documented reduction
// order, a failed rank that stops everyone, timeouts, and user errors.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>

#include "meshflow/comm/communicator.h"
#include "meshflow/comm/local_world.h"

namespace meshflow {
namespace {

using Clock = std::chrono::steady_clock;

::testing::AssertionResult HasSubstr(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Rank r's input element i: a(i) + b(r), integers in [-515, 515]. a has a
// long prime period (misplaced offsets show), b differs for ranks 0..10
// (misplaced ranks show); sums of up to 8 are exact.
float a_of(int64_t i) {
  return static_cast<float>((i * 7) % 1021) - 510.f;
}
float b_of(int r) {
  return static_cast<float>((r * 4) % 11) - 5.f;
}
float input(int world_rank, int64_t i) {
  return a_of(i) + b_of(world_rank);
}

std::vector<float> inputs(int world_rank, int64_t n, int64_t first = 0) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = input(world_rank, first + i);
  return v;
}

// First mismatch of got[i] against want(i), as a Status naming the rank.
template <class Want>
Status check(const Communicator& c, const std::string& what, const float* got, int64_t n,
             Want want) {
  for (int64_t i = 0; i < n; ++i) {
    float w = want(i);
    if (std::memcmp(&got[i], &w, sizeof(float)) != 0)
      return Status::internal("world rank " + std::to_string(c.transport().rank()) + ", " + what +
                              ": element " + std::to_string(i) + " of " + std::to_string(n) +
                              " is " + std::to_string(got[i]) + ", want " + std::to_string(w));
  }
  return Status::ok();
}

// Every collective of `c` on buffers of about `total` elements.
Status check_collectives(Communicator& c, int64_t total) {
  const int n = c.size(), me = c.rank();
  const int w = c.world_ranks()[me];
  const std::vector<int>& members = c.world_ranks();
  float sum_b = 0, max_b = -1e9f;
  for (int r : members) {
    sum_b += b_of(r);
    max_b = std::max(max_b, b_of(r));
  }
  const std::string at = " of " + std::to_string(total);

  // all_reduce, sum and max
  std::vector<float> x = inputs(w, total);
  MF_RETURN_IF_ERROR(c.all_reduce(x.data(), total, ReduceOp::kSum));
  MF_RETURN_IF_ERROR(check(c, "all_reduce sum" + at, x.data(), total,
                           [&](int64_t i) { return n * a_of(i) + sum_b; }));
  x = inputs(w, total);
  MF_RETURN_IF_ERROR(c.all_reduce(x.data(), total, ReduceOp::kMax));
  MF_RETURN_IF_ERROR(
      check(c, "all_reduce max" + at, x.data(), total, [&](int64_t i) { return a_of(i) + max_b; }));

  // broadcast, from a root that changes with the size
  const int root = static_cast<int>(total % n);
  x = inputs(w, total);
  MF_RETURN_IF_ERROR(c.broadcast(x.data(), total, root));
  MF_RETURN_IF_ERROR(check(c, "broadcast" + at, x.data(), total,
                           [&](int64_t i) { return input(members[root], i); }));

  // all_gather, reduce_scatter, all_to_all with total / n per rank
  const int64_t per = std::max<int64_t>(1, total / n);
  std::vector<float> in = inputs(w, per), out(per * n, -1.f);
  MF_RETURN_IF_ERROR(c.all_gather(in.data(), per, out.data()));
  MF_RETURN_IF_ERROR(check(c, "all_gather" + at, out.data(), per * n,
                           [&](int64_t i) { return input(members[i / per], i % per); }));
  in = inputs(w, per * n);
  out.assign(per, -1.f);
  MF_RETURN_IF_ERROR(c.reduce_scatter(in.data(), per, out.data(), ReduceOp::kSum));
  MF_RETURN_IF_ERROR(check(c, "reduce_scatter sum" + at, out.data(), per,
                           [&](int64_t i) { return n * a_of(me * per + i) + sum_b; }));
  MF_RETURN_IF_ERROR(c.reduce_scatter(in.data(), per, out.data(), ReduceOp::kMax));
  MF_RETURN_IF_ERROR(check(c, "reduce_scatter max" + at, out.data(), per,
                           [&](int64_t i) { return a_of(me * per + i) + max_b; }));
  out.assign(per * n, -1.f);
  MF_RETURN_IF_ERROR(c.all_to_all(in.data(), per, out.data()));
  MF_RETURN_IF_ERROR(check(c, "all_to_all" + at, out.data(), per * n,
                           [&](int64_t i) { return input(members[i / per], me * per + i % per); }));

  // the _v forms: uneven counts, some of them empty
  std::vector<int64_t> counts(n), offsets(n);
  int64_t sum_counts = 0;
  for (int k = 0; k < n; ++k) {
    counts[k] = k % 3 == 1 ? 0 : per + k;
    offsets[k] = sum_counts;
    sum_counts += counts[k];
  }
  in = inputs(w, counts[me], 1000);
  out.assign(sum_counts, -1.f);
  MF_RETURN_IF_ERROR(c.all_gather_v(in.data(), counts, out.data()));
  MF_RETURN_IF_ERROR(check(c, "all_gather_v" + at, out.data(), sum_counts, [&](int64_t i) {
    int k = 0;
    while (i >= offsets[k] + counts[k]) ++k;
    return input(members[k], 1000 + i - offsets[k]);
  }));
  in = inputs(w, sum_counts);
  out.assign(counts[me], -1.f);
  MF_RETURN_IF_ERROR(c.reduce_scatter_v(in.data(), counts, out.data(), ReduceOp::kSum));
  MF_RETURN_IF_ERROR(check(c, "reduce_scatter_v" + at, out.data(), counts[me],
                           [&](int64_t i) { return n * a_of(offsets[me] + i) + sum_b; }));
  return c.barrier();
}

const int64_t kSizes[] = {1, 2, 7, 1000, 16384, 16385, 300001, (1 << 20) + 3};

class CommWorld : public ::testing::TestWithParam<int> {};

TEST_P(CommWorld, EveryCollectiveEverySize) {
  const int n = GetParam();
  Status s = run_local_ranks(n, [&](const std::shared_ptr<Transport>& t) -> Status {
    auto c = Communicator::world(t);
    for (int64_t total : kSizes) MF_RETURN_IF_ERROR(check_collectives(*c, total));
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
}

TEST_P(CommWorld, PointToPointInOrder) {
  const int n = GetParam();
  if (n == 1) GTEST_SKIP() << "needs two ranks";
  Status s = run_local_ranks(n, [&](const std::shared_ptr<Transport>& t) -> Status {
    auto c = Communicator::world(t);
    // Rank 0 sends three messages to every rank; each echoes the sum back.
    if (c->rank() == 0) {
      for (int peer = 1; peer < n; ++peer)
        for (int m = 0; m < 3; ++m) {
          std::vector<float> msg(5 + m, static_cast<float>(peer * 10 + m));
          MF_RETURN_IF_ERROR(c->send(msg.data(), 5 + m, peer));
        }
      for (int peer = 1; peer < n; ++peer) {
        float got = 0;
        MF_RETURN_IF_ERROR(c->recv(&got, 1, peer));
        float want = (peer * 10) * 5.f + (peer * 10 + 1) * 6.f + (peer * 10 + 2) * 7.f;
        if (got != want) return Status::internal("echo from " + std::to_string(peer));
      }
    } else {
      float total = 0;
      for (int m = 0; m < 3; ++m) {
        std::vector<float> msg(5 + m);
        MF_RETURN_IF_ERROR(c->recv(msg.data(), 5 + m, 0));
        for (float v : msg) {
          if (v != c->rank() * 10 + m) return Status::internal("message out of order");
          total += v;
        }
      }
      MF_RETURN_IF_ERROR(c->send(&total, 1, 0));
    }
    return c->barrier();
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
}

// Ring attention's pattern: a k/v shift posted, compute, a second shift
// posted before the first is waited for, and waits in either order; every
// rank receives rank - 1's buffers, over the world and over a sub-group.
TEST_P(CommWorld, RingShiftsInFlightTogether) {
  const int n = GetParam();
  Status s = run_local_ranks(n, [&](const std::shared_ptr<Transport>& t) -> Status {
    auto world = Communicator::world(t);
    std::vector<int> reversed(n);
    for (int r = 0; r < n; ++r) reversed[r] = n - 1 - r;
    MF_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> rev, world->split(reversed));
    for (const std::shared_ptr<Communicator>& c : {world, rev}) {
      const int me = c->rank(), prev = c->world_ranks()[(me + n - 1) % n];
      for (int64_t count : {int64_t{0}, int64_t{7}, int64_t{300007}}) {
        std::vector<float> a = inputs(t->rank(), count), b = inputs(t->rank(), count, 1);
        std::vector<float> ga(count, -99.f), gb(count, -99.f);
        Work wa = c->ring_shift_async(a.data(), ga.data(), count, DType::F32);
        double acc = 0;
        for (int i = 0; i < 100000; ++i) acc += std::sqrt(static_cast<double>(i));
        if (acc <= 0) return Status::internal("compute");
        Work wb = c->ring_shift_async(b.data(), gb.data(), count, DType::F32);
        MF_RETURN_IF_ERROR(count % 2 ? wa.wait() : wb.wait());
        MF_RETURN_IF_ERROR(count % 2 ? wb.wait() : wa.wait());
        MF_RETURN_IF_ERROR(wa.wait());  // a second wait returns the same status
        MF_RETURN_IF_ERROR(
            check(*c, "ring shift a", ga.data(), count, [&](int64_t i) { return input(prev, i); }));
        MF_RETURN_IF_ERROR(check(*c, "ring shift b", gb.data(), count,
                                 [&](int64_t i) { return input(prev, i + 1); }));
      }
    }
    return world->barrier();
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommWorld, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

// Rows and columns of an R x C mesh as sub-groups; the two groups of each rank
// also run at the same time (async on the row, blocking on the column), so
// their messages would cross if the tags did not keep groups apart.
void check_mesh(int rows, int cols) {
  Status s = run_local_ranks(rows * cols, [&](const std::shared_ptr<Transport>& t) -> Status {
    auto world = Communicator::world(t);
    const int r = world->rank() / cols, col = world->rank() % cols;
    std::vector<int> row_members, col_members;
    for (int j = 0; j < cols; ++j) row_members.push_back(r * cols + j);
    for (int i = 0; i < rows; ++i) col_members.push_back(i * cols + col);
    MF_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> row, world->split(row_members));
    MF_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> column, world->split(col_members));
    if (row->size() != cols || row->rank() != col || column->rank() != r)
      return Status::internal("wrong sub-group ranks");
    if (row->group_id() == column->group_id() || row->group_id() == world->group_id())
      return Status::internal("group ids collide");
    for (int64_t total : {int64_t{1}, int64_t{7}, int64_t{16385}, int64_t{300001}}) {
      MF_RETURN_IF_ERROR(check_collectives(*row, total));
      MF_RETURN_IF_ERROR(check_collectives(*column, total));
    }
    for (int64_t total : {int64_t{5}, int64_t{70001}}) {
      std::vector<float> x = inputs(t->rank(), total), y = inputs(t->rank(), total);
      Work w = row->all_reduce_async(x.data(), total, ReduceOp::kSum);
      MF_RETURN_IF_ERROR(column->all_reduce(y.data(), total, ReduceOp::kSum));
      MF_RETURN_IF_ERROR(w.wait());
      float row_b = 0, col_b = 0;
      for (int m : row_members) row_b += b_of(m);
      for (int m : col_members) col_b += b_of(m);
      MF_RETURN_IF_ERROR(check(*row, "concurrent row all_reduce", x.data(), total,
                               [&](int64_t i) { return cols * a_of(i) + row_b; }));
      MF_RETURN_IF_ERROR(check(*column, "concurrent column all_reduce", y.data(), total,
                               [&](int64_t i) { return rows * a_of(i) + col_b; }));
    }
    return world->barrier();
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
}

// ---- typed collectives: every dtype the graph has ----------------------------------------------

TEST(CommDTypes, HalfConversionsRoundToNearestEven) {
  // Every f16 pattern that is a number survives f16 -> f32 -> f16.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
    if (!nan) {
      ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << std::hex << h;
    }
  }
  EXPECT_EQ(f32_to_f16(65504.f), 0x7bffu);           // the largest finite f16
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00u);           // halfway to 65536: to even, i.e. infinity
  EXPECT_EQ(f32_to_f16(1e-8f), 0u);                  // below half the smallest subnormal 2^-24
  EXPECT_EQ(f32_to_f16(4e-8f), 1u);                  // above it: the smallest subnormal
  EXPECT_EQ(f32_to_f16(1.f + 1.f / 2048), 0x3c00u);  // a tie to the even mantissa (1.0)
  EXPECT_EQ(f32_to_f16(1.f + 3.f / 2048), 0x3c02u);  // a tie to the even mantissa (up)
  EXPECT_EQ(f32_to_bf16(1.f + 1.f / 256), 0x3f80u);  // bf16 ties to even too
  EXPECT_EQ(f32_to_bf16(1.f + 3.f / 256), 0x3f82u);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
}

TEST(CommDTypes, EveryCollectiveMovesAndReducesEveryDType) {
  for (int n : {2, 3}) {
    SCOPED_TRACE("ranks " + std::to_string(n));
    Status s = run_local_ranks(n, [&](const std::shared_ptr<Transport>& t) -> Status {
      auto comm = Communicator::world(t);
      const int r = t->rank();
      // i64 sums beyond f32's 24 bits are exact; i32 max.
      std::vector<int64_t> big = {(int64_t{1} << 40) + r, -(int64_t{1} << 50) * (r + 1), 7};
      MF_RETURN_IF_ERROR(comm->all_reduce(big.data(), 3, DType::I64, ReduceOp::kSum));
      const int64_t ranks_sum = int64_t{n} * (n - 1) / 2;
      EXPECT_EQ(big[0], int64_t{n} * (int64_t{1} << 40) + ranks_sum);
      EXPECT_EQ(big[1], -(int64_t{1} << 50) * (int64_t{n} * (n + 1) / 2));
      EXPECT_EQ(big[2], 7 * n);
      std::vector<int32_t> mx = {r, -r, 100000000 + r};
      MF_RETURN_IF_ERROR(comm->all_reduce(mx.data(), 3, DType::I32, ReduceOp::kMax));
      EXPECT_EQ(mx, (std::vector<int32_t>{n - 1, 0, 100000000 + n - 1}));
      // bf16 and f16 reduce in f32 and round once: small integers stay exact.
      for (DType dt : {DType::BF16, DType::F16}) {
        std::vector<uint16_t> h(5);
        for (int i = 0; i < 5; ++i)
          h[i] = dt == DType::BF16 ? f32_to_bf16(float(i + r)) : f32_to_f16(float(i + r));
        MF_RETURN_IF_ERROR(comm->all_reduce(h.data(), 5, dt, ReduceOp::kSum));
        for (int i = 0; i < 5; ++i)
          EXPECT_EQ(dt == DType::BF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]),
                    float(n * i + ranks_sum));
        // reduce_scatter: rank q gets the sum of block q (2 elements per rank).
        std::vector<uint16_t> in(2 * n), out(2);
        for (int i = 0; i < 2 * n; ++i)
          in[i] = dt == DType::BF16 ? f32_to_bf16(float(i)) : f32_to_f16(float(i));
        MF_RETURN_IF_ERROR(comm->reduce_scatter(in.data(), 2, out.data(), dt, ReduceOp::kSum));
        for (int i = 0; i < 2; ++i)
          EXPECT_EQ(dt == DType::BF16 ? bf16_to_f32(out[i]) : f16_to_f32(out[i]),
                    float(n * (2 * r + i)));
      }
      // An odd count of 2-byte elements (not whole f32 words) moves bit for bit.
      std::vector<uint16_t> mine = {uint16_t(0x7c01 + r), uint16_t(0x8000 | r), uint16_t(r)};
      std::vector<uint16_t> all(3 * n);
      MF_RETURN_IF_ERROR(comm->all_gather(mine.data(), 3, all.data(), DType::F16));
      for (int q = 0; q < n; ++q) {
        EXPECT_EQ(all[3 * q], 0x7c01 + q);  // a NaN pattern, kept
        EXPECT_EQ(all[3 * q + 1], 0x8000 | q);
        EXPECT_EQ(all[3 * q + 2], q);
      }
      std::vector<uint16_t> a2a(3 * n), got(3 * n);
      for (int q = 0; q < n; ++q)
        for (int i = 0; i < 3; ++i) a2a[3 * q + i] = uint16_t(100 * r + 10 * q + i);
      MF_RETURN_IF_ERROR(comm->all_to_all(a2a.data(), 3, got.data(), DType::BF16));
      for (int q = 0; q < n; ++q)
        for (int i = 0; i < 3; ++i) EXPECT_EQ(got[3 * q + i], 100 * q + 10 * r + i);
      std::vector<int64_t> ids(3 * n), back(3 * n);
      for (int q = 0; q < 3 * n; ++q) ids[q] = (int64_t{1} << 45) * r + q;
      MF_RETURN_IF_ERROR(comm->all_to_all(ids.data(), 3, back.data(), DType::I64));
      for (int q = 0; q < n; ++q)
        for (int i = 0; i < 3; ++i) EXPECT_EQ(back[3 * q + i], (int64_t{1} << 45) * q + 3 * r + i);
      // i32 reduce_scatter exact beyond 2^24.
      std::vector<int32_t> iin(n), iout(1);
      for (int q = 0; q < n; ++q) iin[q] = (1 << 25) + q * 1000 + r;
      MF_RETURN_IF_ERROR(
          comm->reduce_scatter(iin.data(), 1, iout.data(), DType::I32, ReduceOp::kSum));
      EXPECT_EQ(iout[0], n * ((1 << 25) + r * 1000) + int32_t(ranks_sum));
      std::vector<uint16_t> b = {uint16_t(r == 1 ? 0xabcd : 0), 0, 0};
      MF_RETURN_IF_ERROR(comm->broadcast(b.data(), 3, DType::BF16, /*root=*/1));
      EXPECT_EQ(b[0], 0xabcd);
      if (r == 0) {
        const std::vector<uint16_t> msg = {1, 2, 3};
        MF_RETURN_IF_ERROR(comm->send(msg.data(), 3, DType::F16, 1));
      } else if (r == 1) {
        std::vector<uint16_t> msg(3);
        MF_RETURN_IF_ERROR(comm->recv(msg.data(), 3, DType::F16, 0));
        EXPECT_EQ(msg, (std::vector<uint16_t>{1, 2, 3}));
      }
      return Status::ok();
    });
    ASSERT_TRUE(s.is_ok()) << s.message();
  }
}

TEST(CommMesh, Rows2Cols2) {
  check_mesh(2, 2);
}
TEST(CommMesh, Rows2Cols3) {
  check_mesh(2, 3);
}
TEST(CommMesh, Rows4Cols2) {
  check_mesh(4, 2);
}

TEST(CommMesh, SplittingTheSameMembersTwiceGivesTwoGroups) {
  Status s = run_local_ranks(2, [&](const std::shared_ptr<Transport>& t) -> Status {
    auto world = Communicator::world(t);
    MF_ASSIGN_OR_RETURN(auto a, world->split({1, 0}));
    MF_ASSIGN_OR_RETURN(auto b, world->split({1, 0}));
    if (a->group_id() == b->group_id()) return Status::internal("same group id twice");
    if (a->rank() != 1 - t->rank()) return Status::internal("split order not honoured");
    std::vector<float> x(3, 1.f + t->rank()), y(3, 10.f);
    Work wa = a->all_reduce_async(x.data(), 3, ReduceOp::kSum);
    MF_RETURN_IF_ERROR(b->all_reduce(y.data(), 3, ReduceOp::kMax));
    MF_RETURN_IF_ERROR(wa.wait());
    if (x[2] != 3.f || y[2] != 10.f) return Status::internal("wrong values");
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
}

TEST(CommMesh, TwoWorldGroupsOfOneTransportKeepApart) {
  Status s = run_local_ranks(3, [&](const std::shared_ptr<Transport>& t) -> Status {
    auto a = Communicator::world(t);
    auto b = Communicator::world(t);
    if (a->group_id() == b->group_id()) return Status::internal("same group id twice");
    std::vector<float> x(100, 1.f), y(100, 1.f + t->rank());
    Work wa = a->all_reduce_async(x.data(), 100, ReduceOp::kSum);
    MF_RETURN_IF_ERROR(b->all_reduce(y.data(), 100, ReduceOp::kMax));
    MF_RETURN_IF_ERROR(wa.wait());
    if (x[99] != 3.f || y[99] != 3.f) return Status::internal("the two groups' messages crossed");
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
}

// Several async all_reduces (tree and ring sizes) plus an async all_gather and
// reduce_scatter in flight while the rank computes; then a blocking one, which
// runs after them.
TEST(CommAsync, OverlappedCollectivesAllComplete) {
  const int n = 4;
  const std::vector<int64_t> sizes = {3, 4096, 70001, 262147, 17, 1 << 20};
  Status s = run_local_ranks(n, [&](const std::shared_ptr<Transport>& t) -> Status {
    auto c = Communicator::world(t);
    const int w = t->rank();
    float sum_b = 0;
    for (int r = 0; r < n; ++r) sum_b += b_of(r);
    std::vector<std::vector<float>> bufs;
    for (int64_t sz : sizes) bufs.push_back(inputs(w, sz));
    std::vector<Work> works;
    for (size_t k = 0; k < sizes.size(); ++k)
      works.push_back(c->all_reduce_async(bufs[k].data(), sizes[k], ReduceOp::kSum));
    std::vector<float> ag_in = inputs(w, 1001), ag_out(1001 * n);
    std::vector<float> rs_in = inputs(w, 5003 * n), rs_out(5003);
    works.push_back(c->all_gather_async(ag_in.data(), 1001, ag_out.data()));
    works.push_back(c->reduce_scatter_async(rs_in.data(), 5003, rs_out.data(), ReduceOp::kSum));
    // Compute while the communication runs.
    double acc = 0;
    for (int i = 0; i < 2000000; ++i) acc += std::sqrt(static_cast<double>(i));
    if (acc <= 0) return Status::internal("compute");
    std::vector<float> last = inputs(w, 1000);
    MF_RETURN_IF_ERROR(c->all_reduce(last.data(), 1000, ReduceOp::kMax));
    for (const Work& wk : works) {
      if (!wk.ready()) return Status::internal("a blocking call ran before the async work");
      MF_RETURN_IF_ERROR(wk.wait());
    }
    for (size_t k = 0; k < sizes.size(); ++k)
      MF_RETURN_IF_ERROR(check(*c, "async all_reduce " + std::to_string(sizes[k]), bufs[k].data(),
                               sizes[k], [&](int64_t i) { return n * a_of(i) + sum_b; }));
    MF_RETURN_IF_ERROR(check(*c, "async all_gather", ag_out.data(), 1001 * n, [&](int64_t i) {
      return input(static_cast<int>(i / 1001), i % 1001);
    }));
    MF_RETURN_IF_ERROR(check(*c, "async reduce_scatter", rs_out.data(), 5003,
                             [&](int64_t i) { return n * a_of(w * 5003 + i) + sum_b; }));
    float max_b = b_of(0);
    for (int r = 1; r < n; ++r) max_b = std::max(max_b, b_of(r));
    return check(*c, "blocking all_reduce after async", last.data(), 1000,
                 [&](int64_t i) { return a_of(i) + max_b; });
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
}

// ---- determinism -------------------------------------------------------------------------------

std::vector<float> random_inputs(int rank, int64_t n) {
  std::mt19937 gen(1234 + rank);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// The documented order: ring chunks fold x[c+1] + x[c+2] + ... + x[c]; small
// messages fold up a binomial tree to rank 0.
std::vector<float> reference_sum(int n, int64_t count) {
  std::vector<std::vector<float>> x;
  for (int r = 0; r < n; ++r) x.push_back(random_inputs(r, count));
  std::vector<float> out(count);
  if (count <= 16 * 1024) {
    std::vector<std::vector<float>> part = x;
    for (int mask = 1; mask < n; mask <<= 1)
      for (int r = 0; r + mask < n; r += 2 * mask)
        for (int64_t i = 0; i < count; ++i) part[r][i] = part[r + mask][i] + part[r][i];
    return part[0];
  }
  int64_t first = 0;
  for (int c = 0; c < n; ++c) {
    const int64_t len = count / n + (c < count % n ? 1 : 0);
    for (int64_t i = first; i < first + len; ++i) {
      float acc = x[(c + 1) % n][i];
      for (int k = 2; k <= n; ++k) acc = acc + x[(c + k) % n][i];
      out[i] = acc;
    }
    first += len;
  }
  return out;
}

TEST(CommDeterminism, SameBitsEveryRunEveryRankInTheDocumentedOrder) {
  for (int n : {3, 4}) {
    for (int64_t count : {int64_t{1000}, int64_t{300001}}) {
      std::vector<std::vector<float>> runs[2];
      for (auto& results : runs) {
        results.assign(n, {});
        Status s = run_local_ranks(n, [&](const std::shared_ptr<Transport>& t) -> Status {
          auto c = Communicator::world(t);
          std::vector<float> x = random_inputs(t->rank(), count);
          MF_RETURN_IF_ERROR(c->all_reduce(x.data(), count, ReduceOp::kSum));
          results[t->rank()] = std::move(x);
          return Status::ok();
        });
        ASSERT_TRUE(s.is_ok()) << s.message();
      }
      std::vector<float> want = reference_sum(n, count);
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(std::memcmp(runs[0][r].data(), runs[1][r].data(), count * sizeof(float)), 0)
            << "n=" << n << " count=" << count << " rank " << r << ": runs differ";
        ASSERT_EQ(std::memcmp(runs[0][r].data(), want.data(), count * sizeof(float)), 0)
            << "n=" << n << " count=" << count << " rank " << r << ": not the documented order";
      }
    }
  }
}

// ---- failures ----------------------------------------------------------------------------------

TEST(CommFailure, ThrowingRankStopsEveryBlockedRank) {
  const int n = 4;
  std::vector<Status> per_rank;
  auto t0 = Clock::now();
  Status s = run_local_ranks(
      n,
      [&](const std::shared_ptr<Transport>& t) -> Status {
        auto c = Communicator::world(t);
        std::vector<float> x(300001, 1.f);
        if (t->rank() == 2) {
          MF_RETURN_IF_ERROR(c->all_reduce(x.data(), 300001, ReduceOp::kSum));
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          throw std::runtime_error("out of memory in the backward pass");
        }
        for (int step = 0; step < 1000; ++step)
          MF_RETURN_IF_ERROR(c->all_reduce(x.data(), 300001, ReduceOp::kSum));
        return Status::ok();
      },
      {}, &per_rank);
  EXPECT_LT(seconds_since(t0), 5.0);
  ASSERT_FALSE(s.is_ok());
  EXPECT_TRUE(HasSubstr(s.message(), "rank 2: uncaught exception: out of memory"));
  for (int r : {0, 1, 3}) {
    ASSERT_FALSE(per_rank[r].is_ok());
    EXPECT_EQ(per_rank[r].code(), StatusCode::kUnavailable);
    EXPECT_TRUE(
        HasSubstr(per_rank[r].message(), "rank 2 failed: uncaught exception: out of memory"));
    EXPECT_TRUE(HasSubstr(per_rank[r].message(), "all_reduce(300001 floats, sum)"));
  }
}

TEST(CommFailure, AbortWakesAsyncAndFutureCalls) {
  const int n = 3;
  std::vector<Status> per_rank;
  auto t0 = Clock::now();
  Status s = run_local_ranks(
      n,
      [&](const std::shared_ptr<Transport>& t) -> Status {
        auto c = Communicator::world(t);
        if (t->rank() == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          t->abort("disk full");
          return Status::internal("cannot write the checkpoint");
        }
        std::vector<float> x(1000, 1.f);
        Work w = c->all_reduce_async(x.data(), 1000, ReduceOp::kSum);
        Status first = w.wait();
        if (first.is_ok()) return Status::internal("the async all_reduce succeeded");
        Status later = c->barrier();  // a future call fails at once too
        if (later.is_ok() || !HasSubstr(later.message(), "rank 1 failed: disk full"))
          return Status::internal("barrier after abort: " + later.message());
        return first;
      },
      {}, &per_rank);
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_EQ(s.message(), "rank 1: cannot write the checkpoint");  // its own error, not a symptom
  for (int r : {0, 2}) {
    EXPECT_TRUE(HasSubstr(per_rank[r].message(), "all_reduce_async")) << per_rank[r].message();
    EXPECT_TRUE(HasSubstr(per_rank[r].message(), "rank 1 failed: disk full"));
  }
}

// Rank 1 returns an error with a collective queued that the others never
// issue: its communicator's destructor must stop the job at once instead of
// draining that collective until the timeout.
TEST(CommFailure, ErrorWithAsyncWorkInFlightStopsEveryoneAtOnce) {
  const int n = 3;
  std::vector<Status> per_rank;
  auto t0 = Clock::now();
  Status s = run_local_ranks(
      n,
      [&](const std::shared_ptr<Transport>& t) -> Status {
        std::vector<float> x(70001, 1.f), y(70001, 1.f);  // outlive the communicator
        auto c = Communicator::world(t);
        Work first = c->all_reduce_async(x.data(), 70001, ReduceOp::kSum);
        if (t->rank() == 1) {
          c->all_reduce_async(y.data(), 70001, ReduceOp::kSum);  // nobody else issues it
          return Status::failed_precondition("loss is NaN at step 3");
        }
        MF_RETURN_IF_ERROR(first.wait());
        return c->barrier();
      },
      {}, &per_rank);
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_EQ(s.message(), "rank 1: loss is NaN at step 3");
  for (int r : {0, 2})
    EXPECT_TRUE(HasSubstr(per_rank[r].message(),
                          "rank 1 failed: communicator of group [0,1,2] destroyed with"))
        << per_rank[r].message();
}

// Two local ranks whose calls time out after 0.2 s; the run ends well within
// 3 s (no hang). per_rank: each rank's status.
Status run_two_timing_out(const RankFn& fn, std::vector<Status>* per_rank) {
  LocalTransportOptions opt;
  opt.timeout_s = 0.2;
  auto t0 = Clock::now();
  Status s = run_local_ranks(2, fn, opt, per_rank);
  EXPECT_LT(seconds_since(t0), 3.0);
  return s;
}

TEST(CommFailure, BlockedCallsTimeOutNamingCallPeerAndTag) {
  std::vector<Status> per_rank;
  Status s = run_two_timing_out(
      [&](const std::shared_ptr<Transport>& t) -> Status {
        if (t->rank() == 0) {
          char b[4];
          return t->recv(1, 0x2a, b, 4);  // rank 1 never sends
        }
        return Status::ok();
      },
      &per_rank);
  EXPECT_TRUE(HasSubstr(s.message(), "rank 0: recv from rank 1 (tag 0x2a) timed out after 0.2 s"))
      << s.message();
  EXPECT_TRUE(HasSubstr(s.message(), "MESHFLOW_COMM_TIMEOUT_S"));

  // A send nobody receives, and a collective that only one rank calls.
  LocalTransportOptions opt;
  opt.timeout_s = 0.2;
  auto ts = make_local_transports(3, opt);
  char b[4] = {};
  Status send = ts[1]->send(2, 7, b, 4);
  EXPECT_TRUE(HasSubstr(send.message(), "send to rank 2 (tag 0x7) timed out")) << send.message();
  auto c = Communicator::world(ts[0]);
  float x[100] = {};
  Status ar = c->all_reduce(x, 100, ReduceOp::kSum);
  EXPECT_TRUE(HasSubstr(ar.message(), "all_reduce(100 floats, sum) in group [0,1,2] on rank 0: "));
  EXPECT_TRUE(HasSubstr(ar.message(), "timed out"));
}

// A ring shift whose peer never shifts: the wait fails after the timeout
// naming the call; one whose peer aborts: at once, naming the failed rank.
// A shift's Work dropped unwaited withdraws its send (nothing is left
// pointing at the freed buffer; the peer's receive times out).
TEST(CommFailure, RingShiftWaitsEndOnTimeoutAndAbort) {
  std::vector<Status> per_rank;
  Status s = run_two_timing_out(
      [&](const std::shared_ptr<Transport>& t) -> Status {
        auto c = Communicator::world(t);
        std::vector<float> out(1000, 1.f), in(1000);
        if (t->rank() == 1) return Status::ok();  // never shifts
        return c->ring_shift_async(out.data(), in.data(), 1000, DType::F32).wait();
      },
      &per_rank);
  EXPECT_TRUE(
      HasSubstr(per_rank[0].message(), "ring_shift_async(1000 f32) in group [0,1] on rank 0"))
      << per_rank[0].message();
  EXPECT_TRUE(HasSubstr(per_rank[0].message(), "timed out after 0.2 s")) << per_rank[0].message();

  auto t0 = Clock::now();
  s = run_local_ranks(
      3,
      [&](const std::shared_ptr<Transport>& t) -> Status {
        auto c = Communicator::world(t);
        std::vector<float> out(70001, 1.f), in(70001);
        if (t->rank() == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          t->abort("out of memory");
          return Status::internal("out of memory");
        }
        return c->ring_shift_async(out.data(), in.data(), 70001, DType::F32).wait();
      },
      {}, &per_rank);
  EXPECT_LT(seconds_since(t0), 5.0);
  for (int r : {0, 1})
    EXPECT_TRUE(HasSubstr(per_rank[r].message(), "rank 2 failed: out of memory"))
        << per_rank[r].message();

  s = run_two_timing_out(
      [&](const std::shared_ptr<Transport>& t) -> Status {
        auto c = Communicator::world(t);
        std::vector<float> in(64);
        if (t->rank() == 0) {
          auto out = std::make_unique<std::vector<float>>(64, 3.f);
          (void)c->ring_shift_async(out->data(), in.data(), 64, DType::F32);  // dropped
          out.reset();
          return Status::ok();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        std::vector<float> out(64, 4.f);
        return c->ring_shift_async(out.data(), in.data(), 64, DType::F32).wait();
      },
      &per_rank);
  EXPECT_TRUE(per_rank[0].is_ok()) << per_rank[0].message();
  EXPECT_TRUE(HasSubstr(per_rank[1].message(), "recv from rank 0")) << per_rank[1].message();
  EXPECT_TRUE(HasSubstr(per_rank[1].message(), "timed out")) << per_rank[1].message();

  // A Work that outlives its communicator and every other owner of the
  // transport: waiting on it still answers (its peer never shifted), and
  // dropping it withdraws the send on the transport it keeps alive.
  LocalTransportOptions opt;
  opt.timeout_s = 0.2;
  auto ts = make_local_transports(2, opt);
  auto c = Communicator::world(ts[0]);
  std::vector<float> out(8, 1.f), in(8);
  Work w = c->ring_shift_async(out.data(), in.data(), 8, DType::F32);
  Work unwaited = c->ring_shift_async(out.data(), in.data(), 8, DType::F32);
  c.reset();
  ts.clear();
  EXPECT_TRUE(HasSubstr(w.wait().message(), "timed out")) << w.wait().message();
  unwaited = Work();
}

TEST(CommFailure, TimeoutFromEnvironment) {
  const char* old = std::getenv("MESHFLOW_COMM_TIMEOUT_S");
  std::string saved = old ? old : "";
  setenv("MESHFLOW_COMM_TIMEOUT_S", "0.15", 1);
  EXPECT_DOUBLE_EQ(comm_timeout_s(), 0.15);
  auto ts = make_local_transports(2);
  auto t0 = Clock::now();
  char b[1];
  Status s = ts[0]->recv(1, 1, b, 1);
  EXPECT_LT(seconds_since(t0), 2.0);
  EXPECT_TRUE(HasSubstr(s.message(), "timed out after 0.15 s")) << s.message();
  setenv("MESHFLOW_COMM_TIMEOUT_S", "soon", 1);
  EXPECT_DOUBLE_EQ(comm_timeout_s(), 30.0);
  if (old)
    setenv("MESHFLOW_COMM_TIMEOUT_S", saved.c_str(), 1);
  else
    unsetenv("MESHFLOW_COMM_TIMEOUT_S");
}

// ---- user errors -------------------------------------------------------------------------------

TEST(CommErrors, SizeMismatchFailsBothEnds) {
  std::vector<Status> per_rank;
  Status s = run_local_ranks(
      2,
      [&](const std::shared_ptr<Transport>& t) -> Status {
        auto c = Communicator::world(t);
        std::vector<float> x(8, 1.f);
        return t->rank() == 0 ? c->send(x.data(), 4, 1) : c->recv(x.data(), 8, 0);
      },
      {}, &per_rank);
  EXPECT_TRUE(
      HasSubstr(per_rank[0].message(), "size mismatch: sent 16 bytes, the receiver expected 32"))
      << per_rank[0].message();
  EXPECT_TRUE(HasSubstr(per_rank[1].message(), "got a message of 16 bytes, expected 32"))
      << per_rank[1].message();
}

TEST(CommErrors, BadArgumentsNameWhatIsValid) {
  Status s = run_local_ranks(3, [&](const std::shared_ptr<Transport>& t) -> Status {
    auto c = Communicator::world(t);
    auto expect = [&](const Status& st, const std::string& part) -> Status {
      if (st.is_ok() || !HasSubstr(st.message(), part))
        return Status::internal("want an error containing '" + part + "', got '" + st.message() +
                                "'");
      return Status::ok();
    };
    float x[6] = {};
    MF_RETURN_IF_ERROR(expect(c->split({0, 7}).status(), "rank 7 is not in [0, 3)"));
    MF_RETURN_IF_ERROR(expect(c->split({1, 1}).status(), "rank 1 is listed twice"));
    MF_RETURN_IF_ERROR(expect(c->split({}).status(), "the list is empty"));
    if (t->rank() == 2)
      MF_RETURN_IF_ERROR(expect(c->split({0, 1}).status(), "which is not a member"));
    MF_RETURN_IF_ERROR(expect(c->broadcast(x, 6, 3), "root must be in [0, 3)"));
    MF_RETURN_IF_ERROR(expect(c->all_reduce(x, -1, ReduceOp::kSum), "count must be >= 0, got -1"));
    MF_RETURN_IF_ERROR(expect(c->all_gather_v(x, {1, 2}, x), "2 counts for a group of 3 ranks"));
    MF_RETURN_IF_ERROR(
        expect(c->reduce_scatter_v(x, {1, -2, 1}, x, ReduceOp::kSum), "count of rank 1 is -2"));
    MF_RETURN_IF_ERROR(expect(c->all_to_all(x, 2, x), "in and out overlap"));
    MF_RETURN_IF_ERROR(expect(c->send(x, 1, t->rank()), "the peer must be another rank in [0, 3)"));
    MF_RETURN_IF_ERROR(
        expect(c->all_reduce_async(nullptr, 4, ReduceOp::kSum).wait(), "null buffer"));
    MF_RETURN_IF_ERROR(expect(t->send(t->rank(), 0, x, 4), "the peer must be another rank"));
    MF_RETURN_IF_ERROR(
        expect(t->start_send(t->rank(), 0, x, 4).status(), "the peer must be another rank"));
    MF_RETURN_IF_ERROR(expect(t->start_send((t->rank() + 1) % 3, 0, nullptr, 4).status(),
                              "null buffer for 4 bytes"));
    MF_RETURN_IF_ERROR(expect(c->ring_shift_async(x, x + 3, -1, DType::F32).wait(),
                              "ring_shift_async(-1 f32): count must be >= 0"));
    const Status null_shift = c->ring_shift_async(nullptr, x, 3, DType::F32).wait();
    MF_RETURN_IF_ERROR(expect(null_shift, "null buffer for 12 bytes"));
    MF_RETURN_IF_ERROR(expect(null_shift, "ring_shift_async(3 f32) in group [0,1,2]"));
    // The typed forms check before they pad or convert.
    MF_RETURN_IF_ERROR(
        expect(c->all_gather(nullptr, 3, x, DType::F16), "all_gather(3 f16): null buffer"));
    MF_RETURN_IF_ERROR(expect(c->all_reduce(static_cast<void*>(x), -2, DType::BF16, ReduceOp::kSum),
                              "count must be >= 0, got -2"));
    MF_RETURN_IF_ERROR(expect(c->send(static_cast<const void*>(x), 1, DType::I64, t->rank()),
                              "the peer must be another rank in [0, 3)"));
    return c->barrier();  // still usable: nothing was sent
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
  EXPECT_TRUE(HasSubstr(run_local_ranks(0, nullptr).message(), "must be >= 1, got 0"));
}

}  // namespace
}  // namespace meshflow
