// Ring attention's own passes on a CPU rank (kernels/cpu/ring_attention.cc),
// beyond the GEMM tiles the one-rank kernel also runs: the k/v block packed
// for the ring, every block received copied in by the receiving thread (the
// in-process transport's receiver copies), the outputs and each step's
// share zeroed, and in the backward every dk/dv accumulator that arrives
// added in and received, the rank's own copied out at the end. The CPU cost
// model prices them at the rank's memory rate (ring_attention_pass_bytes);
// without them it put a cp=4 ring 12-20% under its measured step
// (bench/plan_accuracy, cp4-ring).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "meshflow/ops/builder.h"
#include "meshflow/plan/cost_model.h"

namespace meshflow::plan {
namespace {

struct Ring {
  Graph g;
  NodeId fwd = -1, bwd = -1;
  double nq = 0, block = 0;  // q's elements; a travelling k/v block's (k and v)
};

// q [2, 4, 8, 16] against k, v [2, 2, 8, 16] (grouped-query: the block is
// not the size of q), the attention a ring over mesh axis 0 of `ranks`.
Ring ring_of(int64_t ranks, int64_t keys = 8) {
  Ring r;
  Builder b(r.g);
  const Shape qs{{"batch", 2}, {"heads", 4}, {"seq", 8}, {"head_dim", 16}};
  const Shape ks{{"batch", 2}, {"kv_heads", 2}, {"seq", keys}, {"head_dim", 16}};
  const ValueId q = b.input("q", qs), k = b.input("k", ks), v = b.input("v", ks);
  Attrs at;
  at.causal = keys == 8;
  at.mesh_axis = ranks > 1 ? 0 : -1;
  at.group_size = ranks;
  at.seq_zigzag = true;
  const std::vector<ValueId> out = b.op(OpKind::kAttention, {q, k, v}, at, "attn");
  r.fwd = r.g.value(out[0]).producer;
  const std::vector<ValueId> grads =
      b.op(OpKind::kAttentionGrad, {b.input("dout", qs), q, k, v, out[0], out[1]}, at, "attn_dx");
  r.bwd = r.g.value(grads[0]).producer;
  r.nq = double(qs.numel());
  r.block = 2.0 * double(ks.numel());
  return r;
}

TEST(PlanRingPasses, CountTheKernelsCopiesAndFills) {
  for (int64_t n : {2, 4, 8}) {
    SCOPED_TRACE("ring of " + std::to_string(n));
    const Ring r = ring_of(n);
    // Forward: the block packed (a read and a write), n - 1 blocks received
    // (a read and a write each), the output zeroed (a write); f32.
    const double fwd = r.nq + 2 * r.block + double(n - 1) * 2 * r.block;
    EXPECT_DOUBLE_EQ(ring_attention_pass_bytes(r.g, r.g.node(r.fwd)), 4 * fwd);
    // Backward: dq zeroed, the block packed and its n - 1 successors
    // received as in the forward; each of the n steps' shares zeroed; n - 1
    // arriving accumulators added in (two reads, a write); n accumulators
    // received (the last brings the rank's own home) and copied out.
    const double bwd = r.nq + 2 * r.block + double(n - 1) * 2 * r.block + double(n) * r.block +
                       double(n - 1) * 3 * r.block + double(n) * 2 * r.block + 2 * r.block;
    EXPECT_DOUBLE_EQ(ring_attention_pass_bytes(r.g, r.g.node(r.bwd)), 4 * bwd);
  }
  // Each rank more on the ring adds one received block to the forward, and
  // to the backward one received block, one zeroed share, one accumulator
  // added in and one received: 2 + 1 + 3 + 2 blocks.
  const Ring two = ring_of(2), three = ring_of(3);
  EXPECT_DOUBLE_EQ(ring_attention_pass_bytes(three.g, three.g.node(three.fwd)) -
                       ring_attention_pass_bytes(two.g, two.g.node(two.fwd)),
                   4 * 2 * two.block);
  EXPECT_DOUBLE_EQ(ring_attention_pass_bytes(three.g, three.g.node(three.bwd)) -
                       ring_attention_pass_bytes(two.g, two.g.node(two.bwd)),
                   4 * 8 * two.block);
}

TEST(PlanRingPasses, NoneWithoutARing) {
  // One rank: the blocked kernel, no ring.
  const Ring one = ring_of(1);
  EXPECT_EQ(ring_attention_pass_bytes(one.g, one.g.node(one.fwd)), 0);
  EXPECT_EQ(ring_attention_pass_bytes(one.g, one.g.node(one.bwd)), 0);
  // Keys of another length than the queries: not a ring's block.
  const Ring cross = ring_of(4, 16);
  EXPECT_EQ(ring_attention_pass_bytes(cross.g, cross.g.node(cross.fwd)), 0);
  // Not attention.
  Graph g;
  Builder b(g);
  const ValueId x = b.input("x", Shape{{"rows", 4}, {"cols", 4}});
  const ValueId y = b.add(x, x);
  EXPECT_EQ(ring_attention_pass_bytes(g, g.producer(y)), 0);
}

}  // namespace
}  // namespace meshflow::plan
