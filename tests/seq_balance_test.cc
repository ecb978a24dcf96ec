// Causal ring attention's load balance (parallel/seq_balance.h): the zigzag
// order's map, the zigzag op, the position-dependent kernels in zigzag order
// against the natural order, the pass on a model graph and its errors, and
// the balanced ring's work per rank. That a balanced ring trains like one
// device is tests/parallel_partition_test.cc's (preset "ring").
#include "meshflow/parallel/seq_balance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "grad_check.h"
#include "meshflow/autodiff/autodiff.h"
#include "meshflow/models/gpt.h"
#include "meshflow/models/llama.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/zigzag.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

using testing::random_tensor;

TEST(Zigzag, RanksHoldMirroredChunks) {
  // n = 2, T = 8: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  std::vector<int64_t> pos;
  for (int64_t p = 0; p < 8; ++p) pos.push_back(zigzag_position(p, 8, 2));
  EXPECT_EQ(pos, (std::vector<int64_t>{0, 1, 6, 7, 2, 3, 4, 5}));
  // Every n, T: a permutation, and each rank's block is two runs r and 2n-1-r.
  for (int64_t n : {1, 2, 3, 4, 8})
    for (int64_t c : {1, 3}) {
      const int64_t T = 2 * n * c;
      std::vector<int64_t> all;
      for (int64_t p = 0; p < T; ++p) all.push_back(zigzag_position(p, T, n));
      std::sort(all.begin(), all.end());
      for (int64_t p = 0; p < T; ++p) ASSERT_EQ(all[p], p) << "n " << n << " T " << T;
      for (int64_t r = 0; r < n && n > 1; ++r) {
        const auto runs = position_runs(r * 2 * c, 2 * c, T, n);
        ASSERT_EQ(runs.size(), 2u) << "n " << n << " rank " << r;
        EXPECT_EQ(runs[0].pos0, r * c);
        EXPECT_EQ(runs[1].pos0, (2 * n - 1 - r) * c);
        EXPECT_EQ(runs[1].row0, c);
      }
    }
}

TEST(Zigzag, OpReordersAndItsInverseRestores) {
  Graph g;
  Builder b(g);
  const Shape s{{"batch", 2}, {"seq", 8}, {"hidden", 3}};
  ValueId x = b.input("x", s);
  Attrs at;
  at.seq_zigzag = 2;
  at.seq_dim = 1;
  ValueId z = b.op1(OpKind::kZigzag, {x}, at, "z");
  at.inverse = true;
  ValueId back = b.op1(OpKind::kZigzag, {z}, at, "back");
  const Tensor tx = random_tensor(s, 3);
  const auto out = testing::run_forward(g, {z, back}, {{"x", tx}});
  const Tensor want = zigzag_tensor(tx, 1, 2);
  EXPECT_EQ(out[0], std::vector<float>(want.data<float>(), want.data<float>() + want.numel()));
  EXPECT_EQ(out[1], std::vector<float>(tx.data<float>(), tx.data<float>() + tx.numel()));
  // Row 2 of the zigzag order is true position 6.
  EXPECT_EQ(out[0][(0 * 8 + 2) * 3 + 1], tx.data<float>()[(0 * 8 + 6) * 3 + 1]);
}

TEST(Zigzag, OpMatchesFiniteDifferences) {
  testing::GradCase c;
  c.params = {Shape{{"seq", 12}, {"hidden", 2}}};
  c.build = [](Builder& b, const std::vector<ValueId>& p) {
    Attrs at;
    at.seq_zigzag = 3;
    at.seq_dim = 0;
    return b.op1(OpKind::kZigzag, {p[0]}, at, "z");
  };
  EXPECT_TRUE(testing::check_gradients(c));
}

TEST(Zigzag, OpRefusesADimThatDoesNotCut) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"seq", 6}, {"hidden", 2}});
  Attrs at;
  at.seq_zigzag = 2;
  at.seq_dim = 0;
  try {
    b.op1(OpKind::kZigzag, {x}, at, "z");
    FAIL() << "expected an error";
  } catch (const StatusError& e) {
    EXPECT_NE(std::string(e.what()).find("does not cut into 2 x 2 chunks"), std::string::npos)
        << e.what();
  }
}

// The position-dependent kernels on a whole sequence in zigzag order equal
// the natural order's results, reordered: causal attention and its backward
// (GQA), rope and dropout. At 320 positions over 2 ranks each chunk of 80
// rows is more than one of the ring kernel's tiles (ops/zigzag.h
// kRingTileRows), the last one partial.
TEST(Zigzag, KernelsReadTruePositions) {
  for (const auto& [T, n] : {std::pair<int64_t, int64_t>{12, 3}, {320, 2}}) {
    SCOPED_TRACE("T " + std::to_string(T) + " over " + std::to_string(n));
    const int64_t B = 2, H = 4, Hkv = 2, D = 8;
    const Shape qs{{"batch", B}, {"heads", H}, {"seq", T}, {"head_dim", D}};
    const Shape ks{{"batch", B}, {"kv_heads", Hkv}, {"seq", T}, {"head_dim", D}};
    const Shape xs{{"batch", B}, {"seq", T}, {"heads", H}, {"head_dim", D}};
    auto build = [&](Graph& g, int64_t zigzag, std::vector<ValueId>* ys) {
      Builder b(g);
      ValueId q = b.input("q", qs), k = b.input("k", ks), v = b.input("v", ks);
      ValueId dout = b.input("dout", qs), x = b.input("x", xs);
      Attrs at;
      at.seq_zigzag = zigzag;
      at.seq_dim = 2;
      std::vector<ValueId> o = b.op(OpKind::kAttention, {q, k, v}, at, "attn");
      std::vector<ValueId> d =
          b.op(OpKind::kAttentionGrad, {dout, q, k, v, o[0], o[1]}, at, "attn_grad");
      Attrs rope;
      rope.seq_zigzag = zigzag;
      rope.seq_dim = 1;
      Attrs drop = rope;
      drop.p = 0.3f;
      drop.seed = 11;
      *ys = {o[0],
             d[0],
             d[1],
             d[2],
             b.op1(OpKind::kRope, {x}, rope, "rope"),
             b.op1(OpKind::kDropout, {x, b.rng_offset()}, drop, "drop")};
    };
    Graph natural, zig;
    std::vector<ValueId> yn, yz;
    build(natural, 0, &yn);
    build(zig, n, &yz);
    std::map<std::string, Tensor> feeds = {{"q", random_tensor(qs, 1)},
                                           {"k", random_tensor(ks, 2)},
                                           {"v", random_tensor(ks, 3)},
                                           {"dout", random_tensor(qs, 4)},
                                           {"x", random_tensor(xs, 5)}};
    Tensor rng(Shape{{"rng", 2}}, DType::I32);
    rng.data<int32_t>()[0] = 5;
    rng.data<int32_t>()[1] = 0;
    feeds["rng_offset"] = rng;
    std::map<std::string, Tensor> zfeeds = feeds;
    for (const char* name : {"q", "k", "v", "dout"})
      zfeeds[name] = zigzag_tensor(feeds[name], 2, n);
    zfeeds["x"] = zigzag_tensor(feeds["x"], 1, n);
    const auto a = testing::run_forward(natural, yn, feeds);
    const auto z = testing::run_forward(zig, yz, zfeeds);
    const int seq_dims[] = {2, 2, 2, 2, 1, 1};
    for (size_t i = 0; i < yn.size(); ++i) {
      Tensor t(natural.shape(yn[i]), DType::F32);
      t.copy_from(a[i].data());
      const Tensor want = zigzag_tensor(t, seq_dims[i], n);
      EXPECT_LT(testing::max_rel_diff(z[i].data(), want.data<float>(), want.numel()), 1e-5)
          << "output " << i;
    }
  }
}

ModelGraph gpt(int64_t seq, float dropout) {
  GptConfig c;
  c.n_layer = 1, c.n_embd = 16, c.n_head = 2, c.n_positions = 32, c.vocab_size = 64;
  c.resid_pdrop = c.embd_pdrop = dropout;
  return value_or_throw(build_gpt(c, 2, seq));
}

TEST(SeqBalance, MarksPositionOpsReordersThePositionTableAndNamesTheInputs) {
  ModelGraph m = gpt(16, 0.1f);
  const int before = m.graph.num_nodes();
  SeqBalance sb = value_or_throw(balance_sequence(m.graph, 2));
  EXPECT_EQ(sb.ranks, 2);
  EXPECT_EQ(sb.inputs, (std::map<std::string, int>{{"targets", 1}, {"tokens", 1}}));
  int zigzags = 0, marked = 0;
  for (const Node& n : m.graph.nodes()) {
    if (n.kind == OpKind::kZigzag) {
      ++zigzags;
      EXPECT_EQ(n.attrs.seq_dim, 0) << "the [seq, hidden] slice of wpe";
    }
    if (n.kind == OpKind::kAttention || n.kind == OpKind::kDropout) {
      EXPECT_EQ(n.attrs.seq_zigzag, 2) << n.name;
      EXPECT_EQ(n.attrs.seq_dim, n.kind == OpKind::kAttention ? 2 : 1) << n.name;
      ++marked;
    }
  }
  EXPECT_EQ(zigzags, 1);
  EXPECT_EQ(marked, 1 + 3);  // attention; embd_drop and two resid_drop
  EXPECT_EQ(m.graph.num_nodes(), before + 1);
  append_backward(m.graph);  // the gradients copy the attrs; the graph still differentiates
  for (const Node& n : m.graph.nodes()) {
    if (n.kind == OpKind::kAttentionGrad || n.kind == OpKind::kDropoutGrad) {
      EXPECT_EQ(n.attrs.seq_zigzag, 2) << n.name;
    }
  }
}

TEST(SeqBalance, LlamaMarksRope) {
  LlamaConfig c;
  c.num_hidden_layers = 1, c.hidden_size = 16, c.num_attention_heads = 4;
  c.num_key_value_heads = 2, c.intermediate_size = 32, c.vocab_size = 64;
  c.max_position_embeddings = 32;
  ModelGraph m = value_or_throw(build_llama(c, 2, 16));
  value_or_throw(balance_sequence(m.graph, 4));
  int ropes = 0;
  for (const Node& n : m.graph.nodes()) {
    EXPECT_NE(n.kind, OpKind::kZigzag) << "LLaMA has no position table";
    if (n.kind == OpKind::kRope) {
      EXPECT_EQ(n.attrs.seq_zigzag, 4);
      EXPECT_EQ(n.attrs.seq_dim, 1);
      ++ropes;
    }
  }
  EXPECT_EQ(ropes, 2);  // q and k
}

TEST(SeqBalance, ErrorsNameTheInputAndTheValidLengths) {
  ModelGraph m = gpt(12, 0.f);
  Result<SeqBalance> r = balance_sequence(m.graph, 4);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("input 'tokens'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("use a multiple of 8 (8 or 16)"), std::string::npos)
      << r.status().message();
  ModelGraph done = gpt(16, 0.f);
  append_backward(done.graph);
  r = balance_sequence(done.graph, 2);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("before its backward"), std::string::npos);
  // A dropout on a value without a leading seq dim cannot place its mask.
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", Shape{{"batch", 2}, {"seq", 8}});
  b.dropout(x, 0.1f, 3, "drop_last");
  r = balance_sequence(g, 2);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("drop_last"), std::string::npos) << r.status().message();
}

// The work per rank: in zigzag order every rank computes n*T*S/2 + T/2
// (query, key) pairs, the priced count, which the kernel's runs confirm;
// contiguous blocks leave the last rank (n-1)*T*S + T(T+1)/2.
TEST(SeqBalance, ZigzagRanksShareTheCausalWorkEvenly) {
  for (int64_t n : {2, 4, 8}) {
    const int64_t T = 2 * 4, Tg = n * T;  // local rows, global length
    std::vector<double> pairs(n, 0.0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t src = 0; src < n; ++src)
        for (const PositionRun& qr : position_runs(r * T, T, Tg, n))
          for (const PositionRun& kr : position_runs(src * T, T, Tg, n))
            for (int64_t i = 0; i < qr.rows; ++i)
              pairs[r] += double(std::clamp<int64_t>(qr.pos0 + i - kr.pos0 + 1, 0, kr.rows));
    Graph g;
    Builder b(g);
    const Shape qs{{"batch", 1}, {"heads", 1}, {"seq", T}, {"head_dim", 4}};
    ValueId q = b.input("q", qs), k = b.input("k", qs), v = b.input("v", qs);
    std::vector<ValueId> o = b.op(OpKind::kAttention, {q, k, v}, Attrs{}, "attn");
    Node& node = g.mutable_node(g.value(o[0]).producer);
    node.attrs.mesh_axis = 0;
    node.attrs.group_size = static_cast<int>(n);
    const double contiguous = op_def(OpKind::kAttention).cost(g, node).flops;
    node.attrs.seq_zigzag = n;
    const double zigzag = op_def(OpKind::kAttention).cost(g, node).flops;
    const double want = double(n) * T * T / 2 + T / 2.0;
    for (int64_t r = 0; r < n; ++r) EXPECT_EQ(pairs[r], want) << "n " << n << " rank " << r;
    EXPECT_DOUBLE_EQ(zigzag, (4.0 * 4 + 5.0) * want) << "n " << n;
    const double last = double(n - 1) * T * T + T * (T + 1) / 2.0;
    EXPECT_DOUBLE_EQ(contiguous, (4.0 * 4 + 5.0) * last) << "n " << n;
  }
}

}  // namespace
}  // namespace meshflow
