// Reshard planner and executor: textbook plans for the textbook cases; a
// property test that plans and runs random layout pairs on 1-D, 2-D and 3-D
// meshes of local ranks and checks every rank's shard exactly against the
// global tensor (small integers, so every sum is exact); no plan costs more
// than an independent route through full replication; errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include "meshflow/comm/local_world.h"
#include "meshflow/core/layout.h"
#include "meshflow/core/mesh.h"
#include "meshflow/parallel/reshard.h"
#include "meshflow/parallel/reshard_exec.h"

namespace meshflow {
namespace {

::testing::AssertionResult HasSubstr(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

Layout L(const std::string& s) {
  return value_or_throw(Layout::parse(s));
}
Mesh M(const std::string& s) {
  return value_or_throw(Mesh::parse(s));
}

std::vector<ReshardKind> kinds(const ReshardPlan& p) {
  std::vector<ReshardKind> k;
  for (const ReshardStep& s : p.steps) k.push_back(s.kind);
  return k;
}

ReshardPlan plan(const Shape& s, const Mesh& m, const std::string& a, const std::string& b) {
  return value_or_throw(plan_reshard(s, m, L(a), L(b)));
}

using K = ReshardKind;

TEST(ParallelReshard, TextbookPlans1D) {
  Mesh m = Mesh::line(4, "tp");
  Shape s{{"seq", 8}, {"hidden", 12}};
  EXPECT_EQ(kinds(plan(s, m, "[S(0)]", "[R]")), (std::vector<K>{K::kAllGather}));
  EXPECT_EQ(kinds(plan(s, m, "[P]", "[R]")), (std::vector<K>{K::kAllReduce}));
  EXPECT_EQ(kinds(plan(s, m, "[P]", "[S(1)]")), (std::vector<K>{K::kReduceScatter}));
  EXPECT_EQ(kinds(plan(s, m, "[S(0)]", "[S(1)]")), (std::vector<K>{K::kAllToAll}));
  ReshardPlan slice = plan(s, m, "[R]", "[S(1)]");
  EXPECT_EQ(kinds(slice), (std::vector<K>{K::kLocalSlice}));
  EXPECT_EQ(slice.num_collectives(), 0);
  EXPECT_EQ(slice.cost_s, 0.0);
  EXPECT_TRUE(plan(s, m, "[S(1)]", "[S(1)]").steps.empty());
  // Bytes per rank use the ring factors: all_reduce 2(n-1)/n, all_gather (n-1)/n.
  EXPECT_EQ(plan(s, m, "[P]", "[R]").bytes_per_rank, 8 * 12 * 4 * 2 * 3 / 4);
  EXPECT_EQ(plan(s, m, "[S(0)]", "[R]").bytes_per_rank, 8 * 12 * 4 * 3 / 4);
  const ReshardStep a2a = plan(s, m, "[S(0)]", "[S(1)]").steps[0];
  EXPECT_EQ(a2a.src_dim, 0);
  EXPECT_EQ(a2a.dst_dim, 1);
}

TEST(ParallelReshard, TextbookPlans2D) {
  Mesh m = M("dp=2,tp=4");
  Shape s{{"batch", 8}, {"hidden", 16}};
  ReshardPlan p = plan(s, m, "[P, S(1)]", "[R, S(1)]");  // data-parallel gradient
  EXPECT_EQ(kinds(p), (std::vector<K>{K::kAllReduce}));
  EXPECT_EQ(p.steps[0].mesh_axis, 0);
  p = plan(s, m, "[P, S(1)]", "[S(0), S(1)]");  // ZeRO: reduce_scatter
  EXPECT_EQ(kinds(p), (std::vector<K>{K::kReduceScatter}));
  // A dim on two axes: gather the minor axis (tp) first, then dp.
  p = plan(s, m, "[S(1), S(1)]", "[R, R]");
  ASSERT_EQ(kinds(p), (std::vector<K>{K::kAllGather, K::kAllGather}));
  EXPECT_EQ(p.steps[0].mesh_axis, 1);
  EXPECT_EQ(p.steps[1].mesh_axis, 0);
  // Row-parallel output under sequence parallel: reduce_scatter over tp.
  p = plan(s, m, "[S(0), P]", "[S(0), S(1)]");
  EXPECT_EQ(kinds(p), (std::vector<K>{K::kReduceScatter}));
  EXPECT_EQ(p.steps[0].mesh_axis, 1);
  EXPECT_FALSE(plan(s, m, "[S(0), S(1)]", "[R, R]").to_string(m).empty());
}

TEST(ParallelReshard, Errors) {
  Mesh m = M("dp=2,tp=4");
  Shape s{{"batch", 6}, {"hidden", 10}};
  Status st = plan_reshard(s, m, L("[S(0), R]"), L("[R, S(1)]")).status();
  EXPECT_TRUE(HasSubstr(st.message(), "reshard target"));
  EXPECT_TRUE(HasSubstr(st.message(), "dim 1 'hidden' of size 10 is split 4 ways"));
  st = plan_reshard(s, m, L("[S(0)]"), L("[R, R]")).status();
  EXPECT_TRUE(HasSubstr(st.message(), "reshard source: layout [S(0)] has 1 placements"));
}

// ---- property test -------------------------------------------------------

float global_value(int64_t i) {
  return static_cast<float>((i * 7) % 23) - 11.f;
}
float delta(int p, int64_t i) {
  return static_cast<float>((i * 3 + p * 5) % 7) - 3.f;
}

// Calls fn(local flat index, global flat index) for every element of rank's shard.
template <class Fn>
void for_each_local(const Shape& shape, const Mesh& mesh, const Layout& l, int rank, Fn fn) {
  auto ranges = local_ranges(shape, mesh, l, rank);
  std::vector<int64_t> strides = shape.strides();
  int64_t n = 1;
  for (auto& r : ranges) n *= r.second - r.first;
  for (int64_t li = 0; li < n; ++li) {
    int64_t rest = li, gi = 0;
    for (int d = shape.rank() - 1; d >= 0; --d) {
      int64_t len = ranges[d].second - ranges[d].first;
      gi += (ranges[d].first + rest % len) * strides[d];
      rest /= len;
    }
    fn(li, gi);
  }
}

// This rank's position among the ranks that differ only on l's partial axes,
// and how many there are.
std::pair<int, int> partial_index(const Mesh& mesh, const Layout& l, int rank) {
  std::vector<int> c = mesh.coords(rank);
  int p = 0, k = 1;
  for (int a = 0; a < mesh.num_axes(); ++a) {
    if (l.at(a).is_partial()) p = p * mesh.size(a) + c[a], k *= mesh.size(a);
  }
  return {p, k};
}

// Rank's source shard: the global slice, split into integer addends over partial axes.
std::vector<float> source_shard(const Shape& shape, const Mesh& mesh, const Layout& l, int rank) {
  std::vector<float> v(value_or_throw(local_shape(shape, mesh, l)).numel());
  auto [p, k] = partial_index(mesh, l, rank);
  for_each_local(shape, mesh, l, rank, [&](int64_t li, int64_t gi) {
    float x = global_value(gi);
    if (p > 0) {
      x = delta(p, gi);
    } else {
      for (int q = 1; q < k; ++q) x -= delta(q, gi);
    }
    v[li] = x;
  });
  return v;
}

Layout random_layout(const Mesh& mesh, int tensor_rank, std::mt19937& rng) {
  std::vector<int> dim_of(mesh.num_axes());
  for (int& d : dim_of) d = static_cast<int>(rng() % (tensor_rank + 2)) - 2;  // -2 R, -1 P
  std::vector<Placement> p(mesh.num_axes(), Placement::Replicate());
  for (int d = 0; d < tensor_rank; ++d) {
    std::vector<int> axes;
    for (int a = 0; a < mesh.num_axes(); ++a) {
      if (dim_of[a] == d) axes.push_back(a);
    }
    std::shuffle(axes.begin(), axes.end(), rng);
    for (size_t k = 0; k < axes.size(); ++k) p[axes[k]] = Placement::Shard(d, k);
  }
  for (int a = 0; a < mesh.num_axes(); ++a) {
    if (dim_of[a] == -1) p[a] = Placement::Partial();
  }
  return value_or_throw(Layout::make(p));
}

struct Case {
  Shape shape;
  ReshardPlan plan;
};

// An independent route to full replication: all_reduce partial axes, gather
// minor-most shard axes, until replicated; priced step by step.
double cost_via_replication(const Shape& s, const Mesh& m, Layout l) {
  double cost = 0;
  while (!l.is_replicated()) {
    for (int a = 0; a < m.num_axes(); ++a) {
      const Placement& p = l.at(a);
      ReshardStep st{K::kAllReduce, a, -1, -1, l, l.with(a, Placement::Replicate())};
      if (p.is_shard()) {
        if (l.shard_axes(p.dim()).back() != a) continue;
        st.kind = K::kAllGather, st.src_dim = p.dim();
      } else if (!p.is_partial()) {
        continue;
      }
      price_step(s, m, {}, &st);
      cost += st.cost_s;
      l = st.after;
      break;
    }
  }
  return cost;
}

void run_random_cases(const Mesh& mesh, int num_cases, uint32_t seed) {
  SCOPED_TRACE("mesh " + mesh.to_string());
  std::mt19937 rng(seed);
  std::vector<Case> cases;
  const int n = mesh.num_ranks();
  while (static_cast<int>(cases.size()) < num_cases) {
    int rank = 1 + static_cast<int>(rng() % 3);
    std::vector<Dim> dims;
    for (int d = 0; d < rank; ++d) {
      int64_t size = n;      // divides by any layout
      if (rng() % 3 == 0) {  // or only by some axes
        size = 1;
        for (int a = 0; a < mesh.num_axes(); ++a) size *= rng() % 2 ? mesh.size(a) : 1;
      }
      dims.push_back({"d" + std::to_string(d), size * (1 + static_cast<int64_t>(rng() % 2))});
    }
    Shape shape(dims);
    Layout src = random_layout(mesh, rank, rng), dst = random_layout(mesh, rank, rng);
    if (!validate(src, mesh, shape).is_ok() || !validate(dst, mesh, shape).is_ok()) continue;
    auto p = plan_reshard(shape, mesh, src, dst);
    ASSERT_TRUE(p.is_ok()) << p.status().message();
    // Steps chain from src to dst, and no plan beats... or loses to replication.
    Layout at = src;
    for (const ReshardStep& st : p->steps) {
      EXPECT_EQ(st.before, at);
      at = st.after;
    }
    EXPECT_EQ(at, dst);
    EXPECT_LE(p->cost_s, cost_via_replication(shape, mesh, src) * (1 + 1e-9) + 1e-15)
        << src.to_string() << " -> " << dst.to_string();
    cases.push_back({shape, std::move(p).value()});
  }

  std::vector<std::vector<std::vector<float>>> results(cases.size(),
                                                       std::vector<std::vector<float>>(n));
  Status st = run_local_ranks(n, [&](const std::shared_ptr<Transport>& t) -> Status {
    MF_ASSIGN_OR_RETURN(MeshComms comms, MeshComms::make(Communicator::world(t), mesh));
    for (size_t c = 0; c < cases.size(); ++c) {
      std::vector<float> x = source_shard(cases[c].shape, mesh, cases[c].plan.src, t->rank());
      MF_RETURN_IF_ERROR(run_reshard(cases[c].plan, cases[c].shape, mesh, comms, &x));
      results[c][t->rank()] = std::move(x);
    }
    return Status::ok();
  });
  ASSERT_TRUE(st.is_ok()) << st.message();
  std::map<std::string, int> counts;  // the random pairs do exercise every kind of step
  for (const Case& c : cases) {
    for (const ReshardStep& s : c.plan.steps) ++counts[reshard_kind_name(s.kind)];
  }
  std::string summary;
  for (auto& [k, v] : counts) summary += " " + k + "=" + std::to_string(v);
  std::printf("[          ] %s: %zu cases,%s\n", mesh.to_string().c_str(), cases.size(),
              summary.c_str());
  if (num_cases >= 40) {
    EXPECT_GE(counts.size(), 5u) << summary;
  }

  for (size_t c = 0; c < cases.size(); ++c) {
    const Shape& shape = cases[c].shape;
    const Layout& dst = cases[c].plan.dst;
    SCOPED_TRACE(shape.to_string() + " " + cases[c].plan.src.to_string() + " -> " +
                 dst.to_string() + "\n" + cases[c].plan.to_string(mesh));
    for (int r = 0; r < n; ++r) {
      if (partial_index(mesh, dst, r).first != 0) continue;
      // Sum the addends over r's partial group (just r when dst has no P).
      std::vector<float> sum(results[c][r].size(), 0.f);
      std::vector<int> coords = mesh.coords(r);
      int members = 0;
      for (int q = 0; q < n; ++q) {
        std::vector<int> cq = mesh.coords(q);
        bool same = true;
        for (int a = 0; a < mesh.num_axes(); ++a)
          same &= dst.at(a).is_partial() || cq[a] == coords[a];
        if (!same) continue;
        ++members;
        ASSERT_EQ(results[c][q].size(), sum.size());
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += results[c][q][i];
      }
      EXPECT_EQ(members, partial_index(mesh, dst, r).second);
      int bad = 0;
      for_each_local(shape, mesh, dst, r, [&](int64_t li, int64_t gi) {
        if (sum[li] != global_value(gi) && bad++ < 3) {
          ADD_FAILURE() << "rank " << r << " local " << li << " (global " << gi << "): got "
                        << sum[li] << ", want " << global_value(gi);
        }
      });
    }
  }
}

TEST(ParallelReshard, RandomPairs1D) {
  for (int n : {2, 3, 4, 5, 8}) run_random_cases(Mesh::line(n), 40, 100 + n);
}

TEST(ParallelReshard, RandomPairs2D) {
  for (const char* m : {"a=2,b=2", "a=2,b=3", "a=2,b=4", "a=4,b=2", "a=3,b=2"}) {
    run_random_cases(M(m), 60, 7);
  }
}

TEST(ParallelReshard, RandomPairs3D) {
  run_random_cases(M("a=2,b=2,c=2"), 150, 11);
  run_random_cases(M("a=2,b=1,c=3"), 60, 12);
  run_random_cases(M("a=2,b=2,c=2"), 100, 13);
}

}  // namespace
}  // namespace meshflow
