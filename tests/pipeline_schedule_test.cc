// Pipeline schedules: every schedule for p in {1,2,4}, m in 1..8, v in {1,2}
// runs in the simulator without deadlock or crossed messages, runs each
// (micro-batch, chunk) forward and backward (and weight-gradient) exactly
// once after its dependencies, and meets the textbook bubble fractions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "meshflow/pipeline/schedule.h"

namespace meshflow {
namespace {

const ScheduleKind kAll[] = {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved,
                             ScheduleKind::kZbH1, ScheduleKind::kZbV};

bool valid(ScheduleKind k, int p, int m, int v) {
  if (k == ScheduleKind::kZbV) return v == 2;
  if (v > 1 && k != ScheduleKind::kInterleaved) return false;
  return v == 1 || m % p == 0;
}

TEST(PipelineSchedule, EveryScheduleRunsAndCoversEachMicroBatchOnce) {
  int checked = 0;
  for (ScheduleKind k : kAll)
    for (int p : {1, 2, 4})
      for (int m = 1; m <= 8; ++m)
        for (int v : {1, 2}) {
          SCOPED_TRACE(std::string(schedule_name(k)) + " p=" + std::to_string(p) +
                       " m=" + std::to_string(m) + " v=" + std::to_string(v));
          Result<Schedule> s = make_schedule({k, p, m, v});
          if (!valid(k, p, m, v)) {
            EXPECT_FALSE(s.is_ok());
            continue;
          }
          ASSERT_TRUE(s.is_ok()) << s.status().message();
          Result<SimResult> r = simulate(*s);
          ASSERT_TRUE(r.is_ok()) << r.status().message();
          // Exactly one F and one B (Bi + W) per (mb, chunk), on the chunk's rank.
          std::map<std::tuple<int, int, ActionKind>, int> count;
          for (int rank = 0; rank < p; ++rank)
            for (const Action& a : s->ranks[rank])
              if (is_compute(a.kind)) {
                EXPECT_EQ(s->rank_of_chunk(a.chunk), rank);
                ++count[{a.micro, a.chunk, a.kind}];
              }
          const bool split = k == ScheduleKind::kZbH1 || k == ScheduleKind::kZbV;
          for (int c = 0; c < p * v; ++c)
            for (int mb = 0; mb < m; ++mb) {
              EXPECT_EQ((count[{mb, c, ActionKind::kForward}]), 1);
              if (split) {
                EXPECT_EQ((count[{mb, c, ActionKind::kBackwardInput}]), 1);
                EXPECT_EQ((count[{mb, c, ActionKind::kBackwardWeight}]), 1);
              } else {
                EXPECT_EQ((count[{mb, c, ActionKind::kBackward}]), 1);
              }
            }
          EXPECT_EQ(count.size(), static_cast<size_t>(p * v * m * (split ? 3 : 2)));
          ++checked;
        }
  // v=1: all but zb-v; interleaved v=2: m % p == 0; zb-v: v=2 only, every m.
  EXPECT_EQ(checked, 4 * 3 * 8 + 8 + 4 + 2 + 3 * 8);
}

// ZB-V's V: chunk c and chunk 2p-1-c on rank c, so rank 0 holds the first
// and the last chunk and rank p-1 hands chunk p-1's output to chunk p itself.
TEST(PipelineSchedule, ZbVPlacesTwoChunksPerRankInAV) {
  Schedule s = value_or_throw(make_schedule({ScheduleKind::kZbV, 4, 8, 2}));
  const int expected[8] = {0, 1, 2, 3, 3, 2, 1, 0};
  for (int c = 0; c < 8; ++c) EXPECT_EQ(s.rank_of_chunk(c), expected[c]) << "chunk " << c;
  // No message between chunks 3 and 4 (both on rank 3), and none wraps from
  // rank 3 to rank 0 as the interleaved schedule's do.
  for (int r = 0; r < 4; ++r)
    for (const Action& a : s.ranks[r]) {
      if (is_compute(a.kind)) continue;
      EXPECT_EQ(std::abs(a.peer - r), 1) << to_string(a) << " on rank " << r;
      EXPECT_FALSE(a.chunk == 3 && a.kind == ActionKind::kSendAct) << to_string(a);
    }
}

// Memory: at most 2p (mb, chunk) pairs hold activations on every rank, a
// chunk being half a stage: 1F1B's first-stage peak of p micro-batches, on
// every rank (1F1B's later stages hold fewer; ZB-V balances them).
TEST(PipelineSchedule, ZbVHoldsOneFOneBsPeakOnEveryRank) {
  for (int p : {2, 3, 4, 8})
    for (int m : {1, 2, 3, 4, 8, 16}) {
      SimResult r =
          value_or_throw(simulate(value_or_throw(make_schedule({ScheduleKind::kZbV, p, m, 2}))));
      for (int rank = 0; rank < p; ++rank)
        EXPECT_EQ(r.peak_in_flight[rank], 2 * std::min(m, p))
            << "p=" << p << " m=" << m << " rank " << rank;
    }
}

TEST(PipelineSchedule, OneFOneBKeepsAtMostPMicroBatchesInFlight) {
  for (int p : {2, 4})
    for (int m = 1; m <= 8; ++m) {
      Schedule s = value_or_throw(make_schedule({ScheduleKind::k1F1B, p, m, 1}));
      SimResult r = value_or_throw(simulate(s));
      for (int rank = 0; rank < p; ++rank)
        EXPECT_LE(r.peak_in_flight[rank], std::min(m, p - rank)) << "p=" << p << " m=" << m;
      EXPECT_EQ(r.peak_in_flight[0], std::min(m, p));
      Schedule g = value_or_throw(make_schedule({ScheduleKind::kGPipe, p, m, 1}));
      EXPECT_EQ(value_or_throw(simulate(g)).peak_in_flight[0], m);
      Schedule z = value_or_throw(make_schedule({ScheduleKind::kZbH1, p, m, 1}));
      SimResult zr = value_or_throw(simulate(z));
      for (int rank = 0; rank < p; ++rank) EXPECT_LE(zr.peak_in_flight[rank], std::min(m, p));
    }
}

TEST(PipelineSchedule, BubbleFractionsMatchTheFormulas) {
  const SimCosts unit;  // F = 1, B = 2 (Bi = W = 1)
  for (int p : {2, 4})
    for (int m : {1, 2, 4, 8}) {
      for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
        SimResult r = value_or_throw(simulate(value_or_throw(make_schedule({k, p, m, 1}))));
        EXPECT_NEAR(r.bubble_fraction, ideal_bubble_fraction({k, p, m, 1}), 1e-12)
            << schedule_name(k) << " p=" << p << " m=" << m;
        EXPECT_DOUBLE_EQ(r.makespan, 3.0 * (m + p - 1));
      }
      if (m % p == 0) {
        ScheduleOptions o{ScheduleKind::kInterleaved, p, m, 2};
        SimResult r = value_or_throw(simulate(value_or_throw(make_schedule(o))));
        EXPECT_NEAR(r.bubble_fraction, ideal_bubble_fraction(o), 1e-12) << "p=" << p << " m=" << m;
      }
      ScheduleOptions z{ScheduleKind::kZbH1, p, m, 1};
      SimResult r = value_or_throw(simulate(value_or_throw(make_schedule(z))));
      SimResult one =
          value_or_throw(simulate(value_or_throw(make_schedule({ScheduleKind::k1F1B, p, m, 1}))));
      // Bubble time (makespan minus the per-rank work 3m): (p-1) for zb-h1, 3(p-1) for 1f1b.
      if (m >= p) {
        EXPECT_DOUBLE_EQ(r.makespan - 3.0 * m, (one.makespan - 3.0 * m) / 3)
            << "p=" << p << " m=" << m;
        EXPECT_NEAR(r.bubble_fraction, ideal_bubble_fraction(z), 1e-12) << "p=" << p << " m=" << m;
      }
    }
}

// ZB-V at unit chunk costs (F = Bi = W = 1, a chunk being half a stage): for
// m >= p every rank idles only p-1 units, the forwards it waits for at the
// start (makespan 6m + p - 1), which is the formula; that is half of zb-h1's
// bubble time (p-1 stage units) and a sixth of 1F1B's, at 1F1B's memory.
TEST(PipelineSchedule, ZbVBubbleIsTheStartUpSkewAlone) {
  SimCosts chunk;  // one chunk: F = 1, Bi = W = 1
  for (int p : {2, 3, 4, 8})
    for (int m : {1, 2, 4, 8, 16, 32}) {
      ScheduleOptions o{ScheduleKind::kZbV, p, m, 2};
      SimResult r = value_or_throw(simulate(value_or_throw(make_schedule(o)), chunk));
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      EXPECT_GE(r.makespan, 6.0 * m + p - 1);  // no schedule beats the skew
      if (m < p) continue;
      EXPECT_DOUBLE_EQ(r.makespan, 6.0 * m + p - 1);
      EXPECT_NEAR(r.bubble_fraction, ideal_bubble_fraction(o, chunk), 1e-12);
      // The same model as zb-h1 at stage costs twice the chunk's.
      SimCosts stage;
      stage.forward = 2, stage.backward = 4, stage.backward_input = stage.backward_weight = 2;
      SimResult h1 = value_or_throw(
          simulate(value_or_throw(make_schedule({ScheduleKind::kZbH1, p, m, 1})), stage));
      EXPECT_DOUBLE_EQ(h1.makespan - 6.0 * m, 2 * (r.makespan - 6.0 * m));
    }
}

// Uneven times (a transformer block's W is shorter than its Bi: attention's
// core has no weights): the order is made for the chunk costs, so the bubble
// stays at most zb-h1's for the same work (a stage = two chunks) at every m,
// where an order made for equal times waits a little more every round.
TEST(PipelineSchedule, ZbVOrderFollowsTheChunkCosts) {
  for (const auto& [bi, w] : {std::pair{1.2, 0.8}, std::pair{1.0, 0.5}})
    for (int p : {2, 4})
      for (int m : {8, 16, 32}) {
        SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m) +
                     " Bi=" + std::to_string(bi) + " W=" + std::to_string(w));
        SimCosts chunk, stage;
        chunk.backward = bi + w, chunk.backward_input = bi, chunk.backward_weight = w;
        stage.forward = 2, stage.backward = 2 * (bi + w);
        stage.backward_input = 2 * bi, stage.backward_weight = 2 * w;
        const double work = 2.0 * m * (1 + bi + w);
        SimResult v = value_or_throw(
            simulate(value_or_throw(make_schedule({ScheduleKind::kZbV, p, m, 2, chunk})), chunk));
        SimResult h1 = value_or_throw(
            simulate(value_or_throw(make_schedule({ScheduleKind::kZbH1, p, m, 1})), stage));
        EXPECT_LE(v.makespan - work, h1.makespan - work + 1e-9);
        SimResult equal_order = value_or_throw(
            simulate(value_or_throw(make_schedule({ScheduleKind::kZbV, p, m, 2})), chunk));
        EXPECT_LE(v.makespan, equal_order.makespan + 1e-9);
        if (m == 32) {
          EXPECT_GT(equal_order.makespan - work, 2 * (v.makespan - work));
        }
        for (int r = 0; r < p; ++r) EXPECT_LE(v.peak_in_flight[r], 2 * p);
      }
}

// Ranks time-sharing cores (SimCosts::cores): while k of them compute, each
// runs at ranks / max(cores, k) of its priced speed.
TEST(PipelineSchedule, TimeSharedCoresRunTheListsInTimeOrder) {
  for (ScheduleKind k : kAll) {
    const int p = 4, m = 8, v = k == ScheduleKind::kZbV ? 2 : 1;
    SCOPED_TRACE(schedule_name(k));
    const Schedule s = value_or_throw(make_schedule({k, p, m, v}));
    SimCosts c;  // per chunk: F 1, B 2 (Bi 1, W 1), priced at a quarter of the machine
    const SimResult alone = value_or_throw(simulate(s, c));
    c.cores = 4;  // as many cores as ranks: each its own
    const SimResult four = value_or_throw(simulate(s, c));
    EXPECT_DOUBLE_EQ(four.makespan, alone.makespan);
    c.cores = 2;
    const SimResult two = value_or_throw(simulate(s, c));
    // The work, 3 per chunk pass, p*v*m passes at a quarter each; at most two
    // cores' worth (speed 4/2 on each of 2, or 4/k on k) runs at once.
    const double work = 3.0 * p * v * m;
    EXPECT_GE(two.makespan, work / 4 - 1e-9);
    EXPECT_LT(two.makespan, alone.makespan - 1e-9);  // the bubble's cores go to the others
    // One core: work-conserving, one pass always runs somewhere.
    c.cores = 1;
    const SimResult one = value_or_throw(simulate(s, c));
    EXPECT_NEAR(one.makespan, work / 4, 1e-9);
    for (int r = 0; r < p; ++r) EXPECT_GT(one.busy[size_t(r)], 0);
    // Stash peaks follow each rank's order, not the timing.
    EXPECT_EQ(one.peak_in_flight, alone.peak_in_flight);
  }
  // Stages of two ranks each (ranks_per_stage): pp=2 x 2 on 2 cores; a stage
  // alone runs at speed 2, both at once at speed 1.
  const Schedule s = value_or_throw(make_schedule({ScheduleKind::kGPipe, 2, 1, 1}));
  SimCosts c;
  c.cores = 2;
  c.ranks_per_stage = 2;
  // F0, F1, B1, B0 one after another, each alone: (1 + 1 + 2 + 2) / 2.
  EXPECT_NEAR(simulate(s, c)->makespan, 3.0, 1e-12);
}

TEST(PipelineSchedule, SimulatorFindsDeadlocksAndCrossedMessages) {
  Schedule s = value_or_throw(make_schedule({ScheduleKind::k1F1B, 2, 2, 1}));
  // Rank 1 waits for mb 1 before mb 0: the messages cross.
  Schedule crossed = s;
  std::swap(crossed.ranks[1][0], crossed.ranks[1][4]);  // recv_act mb 0 <-> recv_act mb 1
  Result<SimResult> r = simulate(crossed);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("crossed"), std::string::npos) << r.status().message();
  // Rank 0 receives a gradient before it sends the activation it depends on.
  Schedule dead = s;
  std::vector<Action>& r0 = dead.ranks[0];
  auto recv = std::find_if(r0.begin(), r0.end(),
                           [](const Action& a) { return a.kind == ActionKind::kRecvGrad; });
  Action moved = *recv;
  r0.erase(recv);
  r0.insert(r0.begin(), moved);
  r = simulate(dead);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("deadlock"), std::string::npos) << r.status().message();
  // A missing backward.
  Schedule missing = s;
  missing.ranks[1].pop_back();
  r = simulate(missing);
  ASSERT_FALSE(r.is_ok());
}

TEST(PipelineSchedule, ClearErrors) {
  auto msg = [](ScheduleOptions o) { return make_schedule(o).status().message(); };
  EXPECT_NE(msg({ScheduleKind::k1F1B, 0, 4, 1}).find("stages must be >= 1"), std::string::npos);
  EXPECT_NE(msg({ScheduleKind::k1F1B, 2, 0, 1}).find("micro_batches must be >= 1"),
            std::string::npos);
  EXPECT_NE(msg({ScheduleKind::kInterleaved, 2, 4, 0}).find("virtual_stages must be >= 1"),
            std::string::npos);
  std::string m = msg({ScheduleKind::kInterleaved, 4, 6, 2});
  EXPECT_NE(m.find("divisible by stages=4"), std::string::npos) << m;
  EXPECT_NE(m.find("use 4 or 8"), std::string::npos) << m;
  m = msg({ScheduleKind::k1F1B, 2, 4, 2});
  EXPECT_NE(m.find("needs schedule \"interleaved\""), std::string::npos) << m;
  m = msg({ScheduleKind::kZbV, 2, 4, 3});
  EXPECT_NE(m.find("virtual_stages must be 2 (or left out), got 3"), std::string::npos) << m;
  EXPECT_NE(parse_schedule_kind("zbv").status().message().find("\"zb-v\""), std::string::npos);
  EXPECT_EQ(value_or_throw(parse_schedule_kind("zb-v")), ScheduleKind::kZbV);
  EXPECT_NE(parse_schedule_kind("zb").status().message().find("\"zb-h1\""), std::string::npos);
  EXPECT_EQ(value_or_throw(parse_schedule_kind("zb-h1")), ScheduleKind::kZbH1);
}

}  // namespace
}  // namespace meshflow
