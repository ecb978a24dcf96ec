// Mesh and Layout: coordinates and axis groups, parse/print round trips,
// ==/hash, local shapes and index ranges (multi-axis shards in both orders),
// and the error messages a user sees.
#include <gtest/gtest.h>

#include <unordered_set>

#include "meshflow/core/layout.h"
#include "meshflow/core/mesh.h"

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

TEST(ParallelMesh, CoordsAndGroups) {
  Mesh m = M("dp=2,tp=4");
  EXPECT_EQ(m.num_ranks(), 8);
  EXPECT_EQ(m.to_string(), "{dp: 2, tp: 4}");
  EXPECT_EQ(M("{dp: 2, tp: 4}"), m);
  EXPECT_EQ(m.coords(5), (std::vector<int>{1, 1}));
  for (int r = 0; r < 8; ++r) EXPECT_EQ(m.rank_of(m.coords(r)), r);
  EXPECT_EQ(m.axis_group(1, 5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(m.axis_group(0, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.axis_index("tp"), 1);
  EXPECT_EQ(m.axis_index("pp"), -1);
  Mesh m3 = M("a=2,b=3,c=2");
  EXPECT_EQ(m3.axis_group(1, m3.rank_of({1, 2, 1})), (std::vector<int>{7, 9, 11}));
  EXPECT_NE(m.hash(), M("dp=4,tp=2").hash());
}

TEST(ParallelMesh, Errors) {
  EXPECT_TRUE(HasSubstr(Mesh::parse("dp=2,tp=0").status().message(), "'tp' has size 0"));
  EXPECT_TRUE(HasSubstr(Mesh::parse("dp=2,dp=2").status().message(), "'dp' appears twice"));
  EXPECT_TRUE(HasSubstr(Mesh::parse("dp=x").status().message(), "size of axis 'dp' is 'x'"));
  EXPECT_TRUE(HasSubstr(Mesh::parse("dp").status().message(), "expected 'name=size'"));
  EXPECT_FALSE(Mesh::parse("").is_ok());
}

TEST(ParallelLayout, ParsePrintRoundTrip) {
  for (const char* s : {"[S(0), R, P]", "[R]", "[S(1), S(1)]", "[S(0)#1, S(0)#0]", "[P, P, S(2)]",
                        "[S(0), S(1), S(0)]", "[S(1)#0, R, S(1)#2, S(1)#1]"}) {
    Layout l = L(s);
    EXPECT_EQ(l.to_string(), s);
    EXPECT_EQ(L(l.to_string()), l);
    EXPECT_EQ(L(l.to_string()).hash(), l.hash());
  }
  EXPECT_EQ(L("[ S(0) , P(sum) ]").to_string(), "[S(0), P]");
  // Explicit positions in mesh-axis order are the default order.
  EXPECT_EQ(L("[S(0)#0, S(0)#1]"), L("[S(0), S(0)]"));
  EXPECT_NE(L("[S(0)#1, S(0)#0]"), L("[S(0), S(0)]"));
  EXPECT_EQ(L("[S(0)#1, S(0)#0]").shard_axes(0), (std::vector<int>{1, 0}));
  std::unordered_set<Layout> set{L("[R, P]"), L("[P, R]"), L("[R, P]"), L("[S(0), S(0)]"),
                                 L("[S(0)#1, S(0)#0]")};
  EXPECT_EQ(set.size(), 4u);
}

TEST(ParallelLayout, ParseErrors) {
  EXPECT_TRUE(HasSubstr(Layout::parse("S(0), R").status().message(), "missing '['"));
  EXPECT_TRUE(HasSubstr(Layout::parse("[S(0), X]").status().message(), "unknown placement 'X'"));
  EXPECT_TRUE(HasSubstr(Layout::parse("[S(a)]").status().message(), "dim 'a'"));
  EXPECT_TRUE(HasSubstr(Layout::parse("[S(0), ]").status().message(), "trailing"));
  EXPECT_TRUE(HasSubstr(Layout::parse("[S(0)#1, S(0)]").status().message(),
                        "dim 0 is sharded on 2 mesh axes"));
  EXPECT_TRUE(HasSubstr(Layout::parse("[S(0)#0, S(0)#0]").status().message(), "each once"));
}

TEST(ParallelLayout, WithKeepsOrder) {
  Layout l = L("[S(0), S(0), R]");
  EXPECT_EQ(l.with(2, Placement::Shard(0)).to_string(), "[S(0), S(0), S(0)]");
  EXPECT_EQ(l.with(0, Placement::Replicate()).to_string(), "[R, S(0), R]");
  EXPECT_EQ(l.with(0, Placement::Replicate()).with(0, Placement::Shard(0)).to_string(),
            "[S(0)#1, S(0)#0, R]");
}

TEST(ParallelLayout, LocalShapeAndRanges) {
  Mesh m = M("dp=2,tp=4");
  Shape s{{"batch", 8}, {"hidden", 16}};
  EXPECT_EQ(value_or_throw(local_shape(s, m, L("[S(0), S(1)]"))).sizes(),
            (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(value_or_throw(local_shape(s, m, L("[S(1), S(1)]"))).sizes(),
            (std::vector<int64_t>{8, 2}));
  EXPECT_EQ(value_or_throw(local_shape(s, m, L("[P, R]"))).sizes(), (std::vector<int64_t>{8, 16}));
  // Rank 6 = (dp 1, tp 2). dp major: block 1*4+2 = 6 of 8; tp major: block 2*2+1 = 5 of 8.
  auto r = local_ranges(s, m, L("[S(1), S(1)]"), 6);
  EXPECT_EQ(r[0], (std::pair<int64_t, int64_t>{0, 8}));
  EXPECT_EQ(r[1], (std::pair<int64_t, int64_t>{12, 14}));
  r = local_ranges(s, m, L("[S(1)#1, S(1)#0]"), 6);
  EXPECT_EQ(r[1], (std::pair<int64_t, int64_t>{10, 12}));
  r = local_ranges(s, m, L("[S(0), S(1)]"), 6);
  EXPECT_EQ(r[0], (std::pair<int64_t, int64_t>{4, 8}));
  EXPECT_EQ(r[1], (std::pair<int64_t, int64_t>{8, 12}));
}

TEST(ParallelLayout, ValidationErrors) {
  Mesh m = M("dp=2,tp=4");
  Shape s{{"batch", 6}, {"hidden", 10}};
  Status st = local_shape(s, m, L("[R, S(1)]")).status();
  EXPECT_TRUE(HasSubstr(st.message(), "dim 1 'hidden' of size 10 is split 4 ways (tp=4)"));
  EXPECT_TRUE(HasSubstr(st.message(), "valid splits of dim 1: 1, 2, 5, 10"));
  st = validate(L("[S(0), S(0)]"), m, s);
  EXPECT_TRUE(HasSubstr(st.message(), "split 8 ways (dp=2 x tp=4)"));
  EXPECT_TRUE(HasSubstr(validate(L("[R]"), m, s).message(), "has 1 placements but mesh"));
  EXPECT_TRUE(
      HasSubstr(validate(L("[S(2), R]"), m, s).message(), "mesh axis 'dp' shards dim 2 but shape"));
  EXPECT_TRUE(validate(L("[S(0), S(1)]"), M("dp=2,tp=2"), s).is_ok());
}

}  // namespace
}  // namespace meshflow
