// The collective checks of collective_checks.h.
#include "collective_checks.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/comm/local_world.h"

namespace meshflow::mpitest {
namespace {

// Integer-valued inputs in [-8, 8]: sums over a few ranks are exact in f32 in
// any order, so the expected result does not depend on the algorithm.
float val(int rank, int64_t i, int seed) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13 + seed * 3) % 17) - 8);
}

std::vector<float> inputs(int rank, int64_t n, int seed, int64_t first = 0) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = val(rank, first + i, seed);
  return v;
}

float reduce_at(int n, int64_t i, int seed, ReduceOp op) {
  float acc = val(0, i, seed);
  for (int r = 1; r < n; ++r) {
    acc = op == ReduceOp::kSum ? acc + val(r, i, seed) : std::max(acc, val(r, i, seed));
  }
  return acc;
}

void expect_equal(Checker& c, const std::string& what, const float* got,
                  const std::vector<float>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) {
      c.fail(what + ": element " + std::to_string(i) + " of " + std::to_string(want.size()) +
             " is " + std::to_string(got[i]) + ", expected " + std::to_string(want[i]));
      return;
    }
  }
  c.pass();
}

const char* name(ReduceOp op) {
  return op == ReduceOp::kSum ? "sum" : "max";
}

struct Group {
  std::string name;
  std::shared_ptr<Communicator> comm;  // null on ranks outside the group
};

// The groups every test runs on. Only members call split (communicator.h).
std::vector<Group> make_groups(Checker& c, const std::shared_ptr<Transport>& t) {
  std::vector<Group> groups;
  auto world = Communicator::world(t);
  const int n = world->size(), me = world->rank();
  groups.push_back({"world", world});
  auto add = [&](const std::string& label, const std::vector<int>& members) {
    Group g{label, nullptr};
    if (std::find(members.begin(), members.end(), me) != members.end()) {
      Result<std::shared_ptr<Communicator>> r = world->split(members);
      if (c.ok("split " + label, r.status())) g.comm = *r;
    }
    groups.push_back(g);
  };
  std::vector<int> reversed(n);
  for (int r = 0; r < n; ++r) reversed[r] = n - 1 - r;
  add("world reversed", reversed);
  if (n >= 3) {
    std::vector<int> most(n - 1);
    for (int r = 0; r < n - 1; ++r) most[r] = r;
    add("ranks 0.." + std::to_string(n - 2), most);
  }
  if (n % 2 == 0) {  // a 2 x n/2 mesh: rows along the fast axis, columns across
    const int w = n / 2;
    std::vector<int> row, col;
    for (int j = 0; j < w; ++j) row.push_back((me / w) * w + j);
    for (int k = 0; k < 2; ++k) col.push_back(k * w + me % w);
    add("mesh row " + std::to_string(me / w), row);
    add("mesh column " + std::to_string(me % w), col);
  }
  return groups;
}

void check_all_reduce(Checker& c, const std::string& g, Communicator& comm) {
  const int64_t counts[] = {1, 2, 3, 7, 17, 1000, 16384, 16385, 65537, 262147, (1 << 20) + 5};
  int seed = 1;
  for (int64_t n : counts) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      ++seed;
      std::vector<float> buf = inputs(comm.rank(), n, seed), want(n);
      for (int64_t i = 0; i < n; ++i) want[i] = reduce_at(comm.size(), i, seed, op);
      std::string what = g + ": all_reduce " + name(op) + " of " + std::to_string(n);
      if (c.ok(what, comm.all_reduce(buf.data(), n, op))) expect_equal(c, what, buf.data(), want);
    }
  }
}

void check_all_gather(Checker& c, const std::string& g, Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  for (int64_t count : {int64_t{1}, int64_t{3}, int64_t{1000}, int64_t{65537}, int64_t{300007}}) {
    const int seed = 40 + static_cast<int>(count % 7);
    std::vector<float> in = inputs(me, count, seed), out(count * n, -99.f), want;
    for (int r = 0; r < n; ++r) {
      std::vector<float> part = inputs(r, count, seed);
      want.insert(want.end(), part.begin(), part.end());
    }
    std::string what = g + ": all_gather of " + std::to_string(count) + " per rank";
    if (c.ok(what, comm.all_gather(in.data(), count, out.data())))
      expect_equal(c, what, out.data(), want);
  }
  // all_gather_v with uneven counts, rank 1 contributing nothing.
  for (int64_t base : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
    std::vector<int64_t> counts(n);
    for (int r = 0; r < n; ++r) counts[r] = r == 1 ? 0 : base + 5 * r;
    std::vector<float> in = inputs(me, counts[me], 50), want;
    for (int r = 0; r < n; ++r) {
      std::vector<float> part = inputs(r, counts[r], 50);
      want.insert(want.end(), part.begin(), part.end());
    }
    std::vector<float> out(want.size(), -99.f);
    std::string what = g + ": all_gather_v around " + std::to_string(base) + " per rank";
    if (c.ok(what, comm.all_gather_v(in.data(), counts, out.data())))
      expect_equal(c, what, out.data(), want);
  }
}

void check_reduce_scatter(Checker& c, const std::string& g, Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  for (int64_t count : {int64_t{1}, int64_t{3}, int64_t{1000}, int64_t{65537}, int64_t{300007}}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      const int seed = 60 + static_cast<int>(count % 5);
      std::vector<float> in = inputs(me, count * n, seed), out(count, -99.f), want(count);
      for (int64_t i = 0; i < count; ++i) want[i] = reduce_at(n, me * count + i, seed, op);
      std::string what =
          g + ": reduce_scatter " + name(op) + " of " + std::to_string(count) + " per rank";
      if (c.ok(what, comm.reduce_scatter(in.data(), count, out.data(), op)))
        expect_equal(c, what, out.data(), want);
    }
  }
  for (int64_t base : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
    std::vector<int64_t> counts(n);
    int64_t total = 0, mine = 0;
    for (int r = 0; r < n; ++r) {
      counts[r] = r == n - 1 ? 0 : base + 3 * r;
      if (r < me) mine += counts[r];
      total += counts[r];
    }
    std::vector<float> in = inputs(me, total, 70), out(std::max<int64_t>(counts[me], 1), -99.f);
    std::vector<float> want(counts[me]);
    for (int64_t i = 0; i < counts[me]; ++i) want[i] = reduce_at(n, mine + i, 70, ReduceOp::kSum);
    std::string what = g + ": reduce_scatter_v around " + std::to_string(base) + " per rank";
    if (c.ok(what, comm.reduce_scatter_v(in.data(), counts, out.data(), ReduceOp::kSum)))
      expect_equal(c, what, out.data(), want);
  }
}

void check_all_to_all(Checker& c, const std::string& g, Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{70001}}) {
    // Block b of rank r's input is val(r, b * count + i); rank me receives block me of each.
    std::vector<float> in = inputs(me, count * n, 80), out(count * n, -99.f), want;
    for (int r = 0; r < n; ++r) {
      std::vector<float> part = inputs(r, count, 80, me * count);
      want.insert(want.end(), part.begin(), part.end());
    }
    std::string what = g + ": all_to_all of " + std::to_string(count) + " per rank";
    if (c.ok(what, comm.all_to_all(in.data(), count, out.data())))
      expect_equal(c, what, out.data(), want);
  }
}

void check_broadcast(Checker& c, const std::string& g, Communicator& comm) {
  for (int64_t count :
       {int64_t{1}, int64_t{1000}, int64_t{16384}, int64_t{16385}, int64_t{300007}}) {
    for (int root = 0; root < comm.size(); ++root) {
      std::vector<float> want = inputs(root, count, 90 + root);
      std::vector<float> buf = comm.rank() == root ? want : std::vector<float>(count, -99.f);
      std::string what =
          g + ": broadcast of " + std::to_string(count) + " from " + std::to_string(root);
      if (c.ok(what, comm.broadcast(buf.data(), count, root)))
        expect_equal(c, what, buf.data(), want);
    }
  }
}

// Ranks 2k and 2k+1 of the group exchange both ways; messages arrive in order.
void check_send_recv(Checker& c, const std::string& g, Communicator& comm) {
  const int me = comm.rank(), peer = me ^ 1;
  if (peer >= comm.size()) return;
  for (int64_t count : {int64_t{1}, int64_t{1000}, int64_t{300007}}) {
    std::vector<float> out = inputs(me, count, 100), in(count, -99.f);
    std::string what = g + ": send/recv of " + std::to_string(count);
    Status s1, s2;
    if (me % 2 == 0) {
      s1 = comm.send(out.data(), count, peer);
      s2 = comm.recv(in.data(), count, peer);
    } else {
      s1 = comm.recv(in.data(), count, peer);
      s2 = comm.send(out.data(), count, peer);
    }
    if (c.ok(what, s1) && c.ok(what, s2))
      expect_equal(c, what, in.data(), inputs(peer, count, 100));
  }
}

// Several async collectives in flight at once, waited for at the end.
void check_async(Checker& c, const std::string& g, Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  const int64_t counts[] = {1000, 70001, 300007};
  std::vector<std::vector<float>> bufs;
  std::vector<Work> works;
  for (int k = 0; k < 3; ++k) bufs.push_back(inputs(me, counts[k], 110 + k));
  for (int k = 0; k < 3; ++k)
    works.push_back(comm.all_reduce_async(bufs[k].data(), counts[k], ReduceOp::kSum));
  const int64_t gc = 5003;
  std::vector<float> gin = inputs(me, gc, 120), gout(gc * n, -99.f);
  works.push_back(comm.all_gather_async(gin.data(), gc, gout.data()));
  std::vector<float> rin = inputs(me, gc * n, 130), rout(gc, -99.f);
  works.push_back(comm.reduce_scatter_async(rin.data(), gc, rout.data(), ReduceOp::kMax));
  for (size_t k = 0; k < works.size(); ++k) {
    c.ok(g + ": async collective " + std::to_string(k), works[k].wait());
  }
  for (int k = 0; k < 3; ++k) {
    std::vector<float> want(counts[k]);
    for (int64_t i = 0; i < counts[k]; ++i) want[i] = reduce_at(n, i, 110 + k, ReduceOp::kSum);
    expect_equal(c, g + ": all_reduce_async " + std::to_string(k), bufs[k].data(), want);
  }
  std::vector<float> gwant;
  for (int r = 0; r < n; ++r) {
    std::vector<float> part = inputs(r, gc, 120);
    gwant.insert(gwant.end(), part.begin(), part.end());
  }
  expect_equal(c, g + ": all_gather_async", gout.data(), gwant);
  std::vector<float> rwant(gc);
  for (int64_t i = 0; i < gc; ++i) rwant[i] = reduce_at(n, me * gc + i, 130, ReduceOp::kMax);
  expect_equal(c, g + ": reduce_scatter_async", rout.data(), rwant);
}

// Ring shifts as ring attention issues them (two in flight, the second
// posted before the first is waited for; sizes inline and chunked): each
// rank receives rank - 1's buffer.
void check_ring_shift(Checker& c, const std::string& g, Communicator& comm) {
  const int n = comm.size(), me = comm.rank(), prev = (me + n - 1) % n;
  for (int64_t count : {int64_t{0}, int64_t{1000}, int64_t{300007}}) {
    std::vector<float> a = inputs(me, count, 140), b = inputs(me, count, 150);
    std::vector<float> ga(count, -99.f), gb(count, -99.f);
    const std::string what = g + ": ring_shift_async of " + std::to_string(count);
    Work wa = comm.ring_shift_async(a.data(), ga.data(), count, DType::F32);
    Work wb = comm.ring_shift_async(b.data(), gb.data(), count, DType::F32);
    if (c.ok(what + " (second)", wb.wait()))
      expect_equal(c, what, gb.data(), inputs(prev, count, 150));
    if (c.ok(what + " (first)", wa.wait()))
      expect_equal(c, what, ga.data(), inputs(prev, count, 140));
  }
}

// ---- bit identity with the local backend -------------------------------------------------------

// Random floats with full mantissas and a rank-dependent scale, so the sum
// depends on the order of the additions.
std::vector<float> random_floats(int rank, int seed, int64_t n) {
  uint64_t s = 0x9e3779b97f4a7c15ULL * (rank + 1) + 0xbf58476d1ce4e5b9ULL * seed;
  std::vector<float> v(n);
  const float scale = 1.0f + 0.37f * rank;
  for (int64_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    v[i] = scale * (static_cast<float>(s >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f);
  }
  return v;
}

// The sequence of reductions compared across backends; returns every result.
Result<std::vector<std::vector<float>>> reductions(const std::shared_ptr<Transport>& t) {
  auto world = Communicator::world(t);
  const int n = world->size(), me = world->rank();
  std::vector<std::vector<float>> results;
  for (int64_t count : {int64_t{1000}, int64_t{300007}}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      std::vector<float> buf =
          random_floats(me, static_cast<int>(count) + (op == ReduceOp::kMax), count);
      MF_RETURN_IF_ERROR(world->all_reduce(buf.data(), count, op));
      results.push_back(std::move(buf));
    }
  }
  const int64_t per = 100003;
  std::vector<float> in = random_floats(me, 7, per * n), out(per);
  MF_RETURN_IF_ERROR(world->reduce_scatter(in.data(), per, out.data(), ReduceOp::kSum));
  results.push_back(std::move(out));
  std::vector<int> reversed(n);
  for (int r = 0; r < n; ++r) reversed[r] = n - 1 - r;
  MF_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> rev, world->split(reversed));
  std::vector<float> buf = random_floats(me, 9, 262147);
  MF_RETURN_IF_ERROR(rev->all_reduce_async(buf.data(), 262147, ReduceOp::kSum).wait());
  results.push_back(std::move(buf));
  return results;
}

void compare_bits(Checker& c, const std::string& what, const std::vector<float>& a,
                  const std::vector<float>& b) {
  if (a.size() != b.size()) {
    c.fail(what + ": " + std::to_string(a.size()) + " vs " + std::to_string(b.size()) + " floats");
    return;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    if (x != y) {
      char msg[160];
      std::snprintf(msg, sizeof msg, ": element %zu of %zu differs: %.9g (0x%08x) vs %.9g (0x%08x)",
                    i, a.size(), a[i], x, b[i], y);
      c.fail(what + msg);
      return;
    }
  }
  c.pass();
}

}  // namespace

Status transport_barrier(Transport& t) {
  static uint64_t round = 0;
  const uint64_t tag = 0xfffffffe'00000000ULL | (round++ & 0xffffffffULL);
  const int n = t.size(), me = t.rank();
  for (int k = 1; k < n; k <<= 1) {
    MF_RETURN_IF_ERROR(t.send_recv((me + k) % n, nullptr, 0, (me - k + n) % n, nullptr, 0, tag));
  }
  return Status::ok();
}

void run_collective_checks(Checker& c, const std::shared_ptr<Transport>& t) {
  for (const Group& g : make_groups(c, t)) {
    if (!g.comm) continue;
    Communicator& comm = *g.comm;
    check_all_reduce(c, g.name, comm);
    check_all_gather(c, g.name, comm);
    check_reduce_scatter(c, g.name, comm);
    check_all_to_all(c, g.name, comm);
    check_broadcast(c, g.name, comm);
    check_send_recv(c, g.name, comm);
    for (int i = 0; i < 3; ++i) c.ok(g.name + ": barrier", comm.barrier());
    check_async(c, g.name, comm);
    check_ring_shift(c, g.name, comm);
  }
}

void check_bits_match_local(Checker& c, const std::shared_ptr<Transport>& t) {
  Result<std::vector<std::vector<float>>> mpi1 = reductions(t);
  Result<std::vector<std::vector<float>>> mpi2 = reductions(t);
  if (!c.ok("reductions over mpi", mpi1.status()) || !c.ok("reductions over mpi", mpi2.status()))
    return;
  std::vector<std::vector<float>> local;
  Status s = run_local_ranks(t->size(), [&](const std::shared_ptr<Transport>& lt) -> Status {
    MF_ASSIGN_OR_RETURN(std::vector<std::vector<float>> r, reductions(lt));
    if (lt->rank() == t->rank()) local = std::move(r);
    return Status::ok();
  });
  if (!c.ok("reductions over local", s)) return;
  const char* names[] = {"all_reduce sum 1000",
                         "all_reduce max 1000",
                         "all_reduce sum 300007",
                         "all_reduce max 300007",
                         "reduce_scatter sum 100003/rank",
                         "reversed all_reduce_async sum 262147"};
  for (size_t k = 0; k < mpi1->size(); ++k) {
    compare_bits(c, std::string("mpi vs local: ") + names[k], (*mpi1)[k], local[k]);
    compare_bits(c, std::string("mpi run 1 vs run 2: ") + names[k], (*mpi1)[k], (*mpi2)[k]);
  }
}

}  // namespace meshflow::mpitest
