#include "meshflow/pipeline/schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <tuple>

#include "meshflow/core/check.h"

namespace meshflow {

std::string_view schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved";
    case ScheduleKind::kZbH1:
      return "zb-h1";
    case ScheduleKind::kZbV:
      return "zb-v";
  }
  return "?";
}

Result<ScheduleKind> parse_schedule_kind(const std::string& name) {
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved,
                         ScheduleKind::kZbH1, ScheduleKind::kZbV})
    if (name == schedule_name(k)) return k;
  return Status::invalid("unknown pipeline schedule \"" + name +
                         "\"; valid: \"gpipe\", \"1f1b\", \"interleaved\", \"zb-h1\", \"zb-v\"");
}

int chunk_rank(const ScheduleOptions& o, int chunk) {
  const int p = o.stages;
  if (o.kind == ScheduleKind::kZbV) return chunk < p ? chunk : 2 * p - 1 - chunk;
  return chunk % p;
}

bool splits_backward(ScheduleKind k) {
  return k == ScheduleKind::kZbH1 || k == ScheduleKind::kZbV;
}

std::string_view action_name(ActionKind k) {
  switch (k) {
    case ActionKind::kForward:
      return "F";
    case ActionKind::kBackward:
      return "B";
    case ActionKind::kBackwardInput:
      return "Bi";
    case ActionKind::kBackwardWeight:
      return "W";
    case ActionKind::kSendAct:
      return "send_act";
    case ActionKind::kRecvAct:
      return "recv_act";
    case ActionKind::kSendGrad:
      return "send_grad";
    case ActionKind::kRecvGrad:
      return "recv_grad";
  }
  return "?";
}

bool is_compute(ActionKind k) {
  return k == ActionKind::kForward || k == ActionKind::kBackward ||
         k == ActionKind::kBackwardInput || k == ActionKind::kBackwardWeight;
}

std::string to_string(const Action& a) {
  std::string s = std::string(action_name(a.kind)) + "(mb=" + std::to_string(a.micro) +
                  ",c=" + std::to_string(a.chunk);
  if (a.kind == ActionKind::kSendAct || a.kind == ActionKind::kSendGrad)
    s += "->r" + std::to_string(a.peer);
  if (a.kind == ActionKind::kRecvAct || a.kind == ActionKind::kRecvGrad)
    s += "<-r" + std::to_string(a.peer);
  return s + ")";
}

namespace {

using Order = std::vector<Action>;  // compute actions of one rank

Action F(int mb, int c) {
  return {ActionKind::kForward, mb, c, -1};
}
Action B(int mb, int c) {
  return {ActionKind::kBackward, mb, c, -1};
}

Order gpipe_order(int r, int m) {
  Order o;
  for (int mb = 0; mb < m; ++mb) o.push_back(F(mb, r));
  for (int mb = 0; mb < m; ++mb) o.push_back(B(mb, r));
  return o;
}

// Warm-up forwards, then one F / one B, then the remaining B; fwd/bwd give the
// k-th forward and backward of this rank.
template <class Fwd, class Bwd>
Order one_f_one_b(int warmup, int total, Fwd fwd, Bwd bwd) {
  Order o;
  warmup = std::min(warmup, total);
  for (int k = 0; k < warmup; ++k) o.push_back(fwd(k));
  for (int k = 0; k < total - warmup; ++k) {
    o.push_back(fwd(warmup + k));
    o.push_back(bwd(k));
  }
  for (int k = total - warmup; k < total; ++k) o.push_back(bwd(k));
  return o;
}

// Megatron-LM's interleaved 1F1B (m % p == 0 when v > 1). The k-th forward of
// a rank runs local chunk (k / p) % v of micro-batch group k / (p v); the
// k-th backward walks the chunks in reverse.
Order interleaved_order(int r, int p, int m, int v) {
  auto mb_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto local_chunk = [&](int k) { return (k % (p * v)) / p; };
  return one_f_one_b((p - r - 1) * 2 + (v - 1) * p, m * v,
                     [&](int k) { return F(mb_of(k), local_chunk(k) * p + r); },
                     [&](int k) { return B(mb_of(k), (v - 1 - local_chunk(k)) * p + r); });
}

// ZB-H1 by list scheduling in unit time steps (F = Bi = W = 1, no latency).
// A rank that is free picks, in this order: its next F if 1F1B's rule allows
// it (F - Bi < p - r) and at most p micro-batches would then hold activations
// (F - W <= p); else its next BackwardInput if its inputs are there; else a
// pending W. (Of the six priority orders this one reaches the (p-1)-unit
// bubble for every m >= p tried.)
std::vector<Order> zb_h1_orders(int p, int m) {
  constexpr int kNever = 1 << 30;
  std::vector<Order> orders(p);
  std::vector<std::vector<int>> f_done(p, std::vector<int>(m, kNever)), b_done = f_done;
  std::vector<int> next_f(p, 0), next_b(p, 0), next_w(p, 0), free_at(p, 0);
  int finished = 0;
  for (int t = 0; finished < p; ++t) {
    MF_CHECK_LT(t, 16 * (m + p) + 64) << "zb-h1 list scheduling did not finish";
    for (int r = 0; r < p; ++r) {
      if (free_at[r] > t || next_w[r] == m) continue;
      const int fb = next_b[r], ff = next_f[r];
      const bool b_ready = fb < ff && f_done[r][fb] <= t && (r == p - 1 || b_done[r + 1][fb] <= t);
      const bool f_ready =
          ff < m && ff - fb < p - r && ff - next_w[r] < p && (r == 0 || f_done[r - 1][ff] <= t);
      if (f_ready) {
        orders[r].push_back(F(ff, r));
        f_done[r][ff] = t + 1;
        ++next_f[r];
      } else if (b_ready) {
        orders[r].push_back({ActionKind::kBackwardInput, fb, r, -1});
        b_done[r][fb] = t + 1;
        ++next_b[r];
      } else if (next_w[r] < next_b[r]) {
        orders[r].push_back({ActionKind::kBackwardWeight, next_w[r], r, -1});
        if (++next_w[r] == m) ++finished;
      } else {
        continue;
      }
      free_at[r] = t + 1;
    }
  }
  return orders;
}

// ZB-V by event-driven list scheduling at chunk times c (F, Bi, W). Rank r
// holds chunk r (local 0) and chunk 2p-1-r (local 1). A free rank picks, in
// this order: the next Bi of local 0, of local 1 (a Bi is on the critical
// path: it unblocks the previous chunk), the next F of local 1, of local 0
// (the second chunk first: it drains micro-batches towards the loss), each F
// only while fewer than 2p (mb, chunk) pairs hold activations on the rank
// (with `reserve`, counting a slot for the second chunk of each micro-batch
// started on the first), and else its oldest pending W. Of the 120 priority
// orders this one reaches the makespan 6m + p - 1 at equal times for every
// m >= p tried (p <= 8). Returns no orders when the ranks stall (possible at
// uneven times without `reserve`).
std::vector<Order> zb_v_orders(int p, int m, const SimCosts& c, bool reserve) {
  constexpr double kNever = 1e300;
  const int C = 2 * p;
  const double cost[3] = {c.forward, c.backward_input, c.backward_weight};  // F, Bi, W
  std::vector<Order> orders(p);
  std::vector<std::vector<double>> f_done(C, std::vector<double>(m, kNever)), b_done = f_done;
  struct RankQueue {
    int next_f[2] = {0, 0}, next_b[2] = {0, 0}, live = 0, left = 0;
    double free_at = 0;
    std::deque<std::pair<int, int>> pending_w;  // (mb, chunk), in Bi order
  };
  std::vector<RankQueue> q(p);
  for (RankQueue& rq : q) rq.left = 6 * m;
  for (double t = 0;;) {
    for (int r = 0; r < p; ++r) {
      RankQueue& rq = q[r];
      if (rq.free_at > t || rq.left == 0) continue;
      const int chunk[2] = {r, C - 1 - r};
      auto b_ready = [&](int li) {
        const int ch = chunk[li], mb = rq.next_b[li];
        return mb < rq.next_f[li] && f_done[ch][mb] <= t &&
               (ch == C - 1 || b_done[ch + 1][mb] <= t);
      };
      auto f_ready = [&](int li) {
        const int ch = chunk[li], mb = rq.next_f[li];
        const int held = rq.live + (reserve && li == 0 ? rq.next_f[0] - rq.next_f[1] : 0);
        return mb < m && held < C && (ch == 0 || f_done[ch - 1][mb] <= t);
      };
      int kind = -1;  // 0 F, 1 Bi, 2 W
      if (b_ready(0) || b_ready(1)) {
        const int li = b_ready(0) ? 0 : 1, mb = rq.next_b[li]++;
        orders[r].push_back({ActionKind::kBackwardInput, mb, chunk[li], -1});
        b_done[chunk[li]][mb] = t + cost[1];
        rq.pending_w.emplace_back(mb, chunk[li]);
        kind = 1;
      } else if (f_ready(1) || f_ready(0)) {
        const int li = f_ready(1) ? 1 : 0, mb = rq.next_f[li]++;
        orders[r].push_back(F(mb, chunk[li]));
        f_done[chunk[li]][mb] = t + cost[0];
        ++rq.live;
        kind = 0;
      } else if (!rq.pending_w.empty()) {
        const auto [mb, ch] = rq.pending_w.front();
        rq.pending_w.pop_front();
        orders[r].push_back({ActionKind::kBackwardWeight, mb, ch, -1});
        --rq.live;
        kind = 2;
      } else {
        continue;
      }
      rq.free_at = t + cost[kind];
      --rq.left;
    }
    // The next time a rank frees up; none while work is left: stalled.
    double next = kNever;
    bool left = false;
    for (const RankQueue& rq : q) {
      left = left || rq.left > 0;
      if (rq.free_at > t) next = std::min(next, rq.free_at);
    }
    if (!left) return orders;
    if (next == kNever) return {};
    t = next;
  }
}

// One chunk's F, Bi and W for ordering: as given, each > 0 (a zero W would
// make every W free), rounded to 1/64 of F so that tiny differences between
// ranks' estimates cannot give them different orders.
SimCosts zb_v_order_costs(const SimCosts& c) {
  const double bi = c.bi();
  const double w = c.bw();
  SimCosts out;
  if (!(c.forward > 0) || !std::isfinite(c.forward + bi + w)) return out;  // equal times
  auto q = [&](double x) { return std::max(1.0, std::round(64 * x / c.forward)) / 64; };
  out.forward = 1;
  out.backward_input = q(bi);
  out.backward_weight = q(w);
  out.backward = out.backward_input + out.backward_weight;
  return out;
}

// Adds the sends and receives around each compute action: a Recv right before
// the action that needs the data, a Send right after the action that makes it.
std::vector<Action> with_messages(const Order& order, int r, const Schedule& s) {
  const int last = s.num_chunks() - 1;
  std::vector<Action> out;
  for (const Action& a : order) {
    const int c = a.chunk;
    const bool fwd = a.kind == ActionKind::kForward;
    const bool bwd = a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput;
    if (fwd && c > 0 && s.rank_of_chunk(c - 1) != r)
      out.push_back({ActionKind::kRecvAct, a.micro, c, s.rank_of_chunk(c - 1)});
    if (bwd && c < last && s.rank_of_chunk(c + 1) != r)
      out.push_back({ActionKind::kRecvGrad, a.micro, c, s.rank_of_chunk(c + 1)});
    out.push_back(a);
    if (fwd && c < last && s.rank_of_chunk(c + 1) != r)
      out.push_back({ActionKind::kSendAct, a.micro, c, s.rank_of_chunk(c + 1)});
    if (bwd && c > 0 && s.rank_of_chunk(c - 1) != r)
      out.push_back({ActionKind::kSendGrad, a.micro, c, s.rank_of_chunk(c - 1)});
  }
  return out;
}

}  // namespace

Result<Schedule> make_schedule(const ScheduleOptions& o) {
  const std::string name(schedule_name(o.kind));
  const int p = o.stages, m = o.micro_batches, v = o.virtual_stages;
  if (p < 1) return Status::invalid("pipeline.stages must be >= 1, got " + std::to_string(p));
  if (m < 1)
    return Status::invalid("pipeline.micro_batches must be >= 1, got " + std::to_string(m));
  if (v < 1)
    return Status::invalid("pipeline.virtual_stages must be >= 1, got " + std::to_string(v));
  if (o.kind == ScheduleKind::kZbV && v != 2)
    return Status::invalid(
        "pipeline schedule \"zb-v\" runs two chunks per rank in a V: "
        "virtual_stages must be 2 (or left out), got " +
        std::to_string(v));
  if (v > 1 && o.kind != ScheduleKind::kInterleaved && o.kind != ScheduleKind::kZbV)
    return Status::invalid("pipeline.virtual_stages=" + std::to_string(v) + " needs schedule " +
                           "\"interleaved\" (or \"zb-v\" with 2); schedule \"" + name +
                           "\" runs one chunk per rank (virtual_stages 1)");
  if (o.kind == ScheduleKind::kInterleaved && v > 1 && m % p != 0) {
    const int below = std::max(p, m / p * p), above = (m / p + 1) * p;
    return Status::invalid(
        "pipeline schedule \"interleaved\" with virtual_stages=" + std::to_string(v) +
        " needs micro_batches divisible by stages=" + std::to_string(p) +
        ", got micro_batches=" + std::to_string(m) + "; use " + std::to_string(below) +
        (above != below ? " or " + std::to_string(above) : ""));
  }
  Schedule s;
  s.options = o;
  std::vector<Order> orders(p);
  if (o.kind == ScheduleKind::kZbH1) {
    orders = zb_h1_orders(p, m);
  } else if (o.kind == ScheduleKind::kZbV) {
    // The candidate orders (see schedule.h), each simulated at the costs;
    // the first with the least makespan is kept (equal times: the first).
    const SimCosts costs = zb_v_order_costs(o.zb_v_costs);
    SimCosts unit;
    unit.backward_input = unit.backward_weight = 1;
    double best = 0;
    int index = -1;
    for (const auto& [order_costs, reserve] :
         {std::pair{unit, false}, std::pair{costs, false}, std::pair{costs, true}}) {
      ++index;
      if (o.zb_v_order >= 0 && index != o.zb_v_order) continue;
      std::vector<Order> candidate = zb_v_orders(p, m, order_costs, reserve);
      if (candidate.empty()) continue;
      Schedule trial;
      trial.options = o;
      trial.ranks.resize(p);
      for (int r = 0; r < p; ++r) trial.ranks[r] = with_messages(candidate[r], r, trial);
      Result<SimResult> sim = simulate(trial, costs);
      MF_CHECK(sim.is_ok()) << "zb-v candidate order does not run: " << sim.status().message();
      if (orders[0].empty() || sim->makespan < best) {
        best = sim->makespan;
        orders = std::move(candidate);
        s.options.zb_v_order = index;
      }
    }
    if (orders[0].empty())
      return Status::invalid("pipeline schedule \"zb-v\": candidate order " +
                             std::to_string(o.zb_v_order) +
                             " stalls at these costs; use -1 (the best of 0, 1 and 2)");
  } else {
    for (int r = 0; r < p; ++r) {
      if (o.kind == ScheduleKind::kGPipe)
        orders[r] = gpipe_order(r, m);
      else if (o.kind == ScheduleKind::k1F1B || v == 1)
        orders[r] = one_f_one_b(
            p - r - 1, m, [&](int k) { return F(k, r); }, [&](int k) { return B(k, r); });
      else
        orders[r] = interleaved_order(r, p, m, v);
    }
  }
  s.ranks.resize(p);
  for (int r = 0; r < p; ++r) s.ranks[r] = with_messages(orders[r], r, s);
  // Every schedule made here must run: a failure is a bug in the rules above.
  Result<SimResult> check = simulate(s);
  MF_CHECK(check.is_ok()) << "schedule " << name << " p=" << p << " m=" << m << " v=" << v
                          << " does not run: " << check.status().message();
  return s;
}

namespace {

enum class Kind { kAct, kGrad };
struct Message {
  int micro, chunk;  // the chunk that receives it
  double arrival;
};

// A set of (micro-batch, chunk) pairs, each in range: a flag per pair.
class PairSet {
 public:
  void reset(int micro_batches, int chunks) {
    chunks_ = chunks;
    flags_.assign(size_t(micro_batches) * size_t(chunks), 0);
  }
  bool count(const std::pair<int, int>& k) const { return flags_[index(k)] != 0; }
  void insert(const std::pair<int, int>& k) { flags_[index(k)] = 1; }

 private:
  size_t index(const std::pair<int, int>& k) const {
    return size_t(k.first) * size_t(chunks_) + size_t(k.second);
  }
  int chunks_ = 0;
  std::vector<uint8_t> flags_;
};

struct RankState {
  PairSet f, b, w, act, grad;  // (mb, chunk) done / available
  double clock = 0, busy = 0, stash = 0, peak_stash = 0;
  int live = 0, peak = 0;
  size_t pc = 0;
};

std::string where(int r, size_t i, const Action& a) {
  return "rank " + std::to_string(r) + " action " + std::to_string(i) + " " + to_string(a);
}

// The lists of a schedule simulate() has checked, run in time order on
// time-shared cores (SimCosts::cores): an event loop that advances every
// computing rank at the shared speed until the next action ends or the next
// message arrives. Fills res's makespan, busy (wall time computing) and start.
void run_time_shared(const Schedule& s, const SimCosts& costs, SimResult* res) {
  const int p = s.options.stages;
  const int per_stage = std::max(1, costs.ranks_per_stage);
  const double ranks = double(p) * per_stage;
  const double bi = costs.bi();
  const double bw = costs.bw();
  auto cost_of = [&](ActionKind k) {
    switch (k) {
      case ActionKind::kForward:
        return costs.forward;
      case ActionKind::kBackward:
        return s.split_backward() ? bi : costs.backward;
      case ActionKind::kBackwardInput:
        return bi;
      default:
        return bw;
    }
  };
  // Arrival times on each channel, in send order (simulate() matched them).
  std::map<std::tuple<int, int, bool>, std::deque<double>> channels;
  std::vector<size_t> pc(size_t(p), 0);
  std::vector<double> left(size_t(p), -1);  // work left in the current compute action
  res->busy.assign(size_t(p), 0.0);
  double now = 0;
  for (;;) {
    // Every rank not computing runs its sends and receives due by now and
    // starts its next compute action (repeated: a send may free a receive).
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < p; ++r) {
        const std::vector<Action>& list = s.ranks[size_t(r)];
        while (left[size_t(r)] < 0 && pc[size_t(r)] < list.size()) {
          const Action& a = list[pc[size_t(r)]];
          if (is_compute(a.kind)) {
            res->start[size_t(r)][pc[size_t(r)]] = now;
            left[size_t(r)] = cost_of(a.kind);
            break;
          }
          const bool act = a.kind == ActionKind::kSendAct || a.kind == ActionKind::kRecvAct;
          if (a.kind == ActionKind::kSendAct || a.kind == ActionKind::kSendGrad) {
            channels[{r, a.peer, act}].push_back(now + costs.p2p);
          } else {
            std::deque<double>& q = channels[{a.peer, r, act}];
            if (q.empty() || q.front() > now) break;
            q.pop_front();
          }
          res->start[size_t(r)][pc[size_t(r)]] = now;
          res->finish[size_t(r)][pc[size_t(r)]] = now;
          ++pc[size_t(r)];
          moved = true;
        }
      }
    }
    int computing = 0;
    for (int r = 0; r < p; ++r) computing += left[size_t(r)] >= 0;
    // The next event: a compute action ending or a message arriving.
    const double speed = ranks / std::max(double(costs.cores), double(computing) * per_stage);
    double dt = std::numeric_limits<double>::infinity();
    for (int r = 0; r < p; ++r) {
      if (left[size_t(r)] >= 0) {
        dt = std::min(dt, left[size_t(r)] / speed);
      } else if (pc[size_t(r)] < s.ranks[size_t(r)].size()) {
        const Action& a = s.ranks[size_t(r)][pc[size_t(r)]];
        const bool act = a.kind == ActionKind::kRecvAct;
        const std::deque<double>& q = channels[{a.peer, r, act}];
        if (!q.empty()) dt = std::min(dt, q.front() - now);
      }
    }
    if (!std::isfinite(dt)) break;  // every list ran (simulate() ruled deadlocks out)
    now += dt;
    for (int r = 0; r < p; ++r) {
      if (left[size_t(r)] < 0) continue;
      res->busy[size_t(r)] += dt;
      left[size_t(r)] -= dt * speed;
      if (left[size_t(r)] <= 1e-12 * std::max(1.0, dt * speed)) {
        left[size_t(r)] = -1;
        res->finish[size_t(r)][pc[size_t(r)]] = now;
        ++pc[size_t(r)];
      }
    }
  }
  res->makespan = now;
}

}  // namespace

Result<SimResult> simulate(const Schedule& s, const SimCosts& costs) {
  const int p = s.options.stages, m = s.options.micro_batches, C = s.num_chunks();
  if (static_cast<int>(s.ranks.size()) != p)
    return Status::invalid("schedule has " + std::to_string(s.ranks.size()) +
                           " rank lists for stages=" + std::to_string(p));
  if (m < 0 || C < 0)
    return Status::invalid("schedule has micro_batches=" + std::to_string(m) +
                           " and chunks=" + std::to_string(C) + "; both must be >= 0");
  const double bi = costs.bi();
  const double bw = costs.bw();
  const bool split = s.split_backward();
  auto stash_of = [&](int chunk) {
    return static_cast<size_t>(chunk) < costs.stash_bytes.size() ? costs.stash_bytes[chunk] : 0.0;
  };
  auto hold_of = [&](int chunk) {
    return static_cast<size_t>(chunk) < costs.weight_hold_bytes.size()
               ? costs.weight_hold_bytes[chunk]
               : 0.0;
  };
  std::map<std::tuple<int, int, Kind>, std::deque<Message>> channels;  // (src, dst, kind)
  std::vector<RankState> st(p);
  for (RankState& rs : st)
    for (PairSet* set : {&rs.f, &rs.b, &rs.w, &rs.act, &rs.grad}) set->reset(m, C);
  SimResult res;
  res.start.resize(p);
  for (int r = 0; r < p; ++r) res.start[r].assign(s.ranks[r].size(), 0.0);
  res.finish = res.start;

  // Executes rank r's next action; returns false when it must wait for a message.
  auto step = [&](int r) -> Result<bool> {
    RankState& rs = st[r];
    const size_t i = rs.pc;
    const Action& a = s.ranks[r][i];
    const std::pair<int, int> key{a.micro, a.chunk};
    auto fail = [&](const std::string& why) {
      return Status::invalid(where(r, i, a) + ": " + why);
    };
    if (a.micro < 0 || a.micro >= m || a.chunk < 0 || a.chunk >= C)
      return fail("micro-batch or chunk out of range (m=" + std::to_string(m) +
                  ", chunks=" + std::to_string(C) + ")");
    if (s.rank_of_chunk(a.chunk) != r)
      return fail("chunk " + std::to_string(a.chunk) + " runs on rank " +
                  std::to_string(s.rank_of_chunk(a.chunk)));
    const bool local_prev = a.chunk > 0 && s.rank_of_chunk(a.chunk - 1) == r;
    const bool local_next = a.chunk < C - 1 && s.rank_of_chunk(a.chunk + 1) == r;
    res.start[r][i] = rs.clock;
    double cost = 0;
    switch (a.kind) {
      case ActionKind::kForward:
        if (rs.f.count(key)) return fail("repeated forward");
        if (a.chunk > 0 && !rs.act.count(key)) return fail("its input activation is not here yet");
        rs.f.insert(key);
        if (local_next) rs.act.insert({a.micro, a.chunk + 1});
        rs.peak = std::max(rs.peak, ++rs.live);
        rs.stash += stash_of(a.chunk);
        rs.peak_stash = std::max(rs.peak_stash, rs.stash);
        cost = costs.forward;
        break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        if ((a.kind == ActionKind::kBackwardInput) != split)
          return fail(split ? "this schedule splits B into Bi and W" : "Bi needs zb-h1 or zb-v");
        if (rs.b.count(key)) return fail("repeated backward");
        if (!rs.f.count(key)) return fail("backward before its forward");
        if (a.chunk < C - 1 && !rs.grad.count(key))
          return fail("its output gradient is not here yet");
        rs.b.insert(key);
        if (local_prev) rs.grad.insert({a.micro, a.chunk - 1});
        rs.stash -= stash_of(a.chunk);
        if (split)
          rs.stash += hold_of(a.chunk);
        else
          --rs.live;
        rs.peak_stash = std::max(rs.peak_stash, rs.stash);
        cost = split ? bi : costs.backward;
        break;
      case ActionKind::kBackwardWeight:
        if (!split) return fail("W needs zb-h1 or zb-v");
        if (rs.w.count(key)) return fail("repeated weight-gradient");
        if (!rs.b.count(key)) return fail("weight-gradient before its input-gradient");
        rs.w.insert(key);
        --rs.live;
        rs.stash -= hold_of(a.chunk);
        cost = bw;
        break;
      case ActionKind::kSendAct:
      case ActionKind::kSendGrad: {
        const bool act = a.kind == ActionKind::kSendAct;
        const int to_chunk = act ? a.chunk + 1 : a.chunk - 1;
        if (to_chunk < 0 || to_chunk >= C || a.peer != s.rank_of_chunk(to_chunk) || a.peer == r)
          return fail("peer must be the rank of chunk " + std::to_string(to_chunk));
        if (!(act ? rs.f : rs.b).count(key)) return fail("send before the data is computed");
        channels[{r, a.peer, act ? Kind::kAct : Kind::kGrad}].push_back(
            {a.micro, to_chunk, rs.clock + costs.p2p});
        break;
      }
      case ActionKind::kRecvAct:
      case ActionKind::kRecvGrad: {
        const bool act = a.kind == ActionKind::kRecvAct;
        const int from_chunk = act ? a.chunk - 1 : a.chunk + 1;
        if (from_chunk < 0 || from_chunk >= C || a.peer != s.rank_of_chunk(from_chunk))
          return fail("peer must be the rank of chunk " + std::to_string(from_chunk));
        auto& q = channels[{a.peer, r, act ? Kind::kAct : Kind::kGrad}];
        if (q.empty()) return false;
        const Message msg = q.front();
        if (msg.micro != a.micro || msg.chunk != a.chunk)
          return fail("crossed: the next message on this channel is for mb=" +
                      std::to_string(msg.micro) + " chunk=" + std::to_string(msg.chunk));
        q.pop_front();
        rs.clock = std::max(rs.clock, msg.arrival);
        res.start[r][i] = rs.clock;
        (act ? rs.act : rs.grad).insert(key);
        break;
      }
    }
    rs.clock += cost;
    rs.busy += cost;
    res.finish[r][i] = rs.clock;
    ++rs.pc;
    return true;
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r)
      while (st[r].pc < s.ranks[r].size()) {
        MF_ASSIGN_OR_RETURN(bool ran, step(r));
        if (!ran) break;
        progress = true;
      }
  }
  std::string blocked;
  for (int r = 0; r < p; ++r)
    if (st[r].pc < s.ranks[r].size())
      blocked += "; " + where(r, st[r].pc, s.ranks[r][st[r].pc]) + " waits";
  if (!blocked.empty()) return Status::invalid("deadlock" + blocked);
  for (const auto& [ch, q] : channels)
    if (!q.empty())
      return Status::invalid("rank " + std::to_string(std::get<0>(ch)) +
                             " sent a message to rank " + std::to_string(std::get<1>(ch)) +
                             " that is never received");
  for (int c = 0; c < C; ++c) {
    const RankState& rs = st[s.rank_of_chunk(c)];
    for (int mb = 0; mb < m; ++mb) {
      const std::pair<int, int> key{mb, c};
      const std::string what = "(mb=" + std::to_string(mb) + ", chunk=" + std::to_string(c) + ")";
      if (!rs.f.count(key)) return Status::invalid("no forward for " + what);
      if (!rs.b.count(key)) return Status::invalid("no backward for " + what);
      if (split && !rs.w.count(key)) return Status::invalid("no weight-gradient for " + what);
    }
  }
  double busy = 0;
  for (int r = 0; r < p; ++r) {
    res.makespan = std::max(res.makespan, st[r].clock);
    res.busy.push_back(st[r].busy);
    res.peak_in_flight.push_back(st[r].peak);
    res.peak_stash_bytes.push_back(st[r].peak_stash);
    busy += st[r].busy;
  }
  if (costs.cores > 0 && p * std::max(1, costs.ranks_per_stage) > costs.cores) {
    run_time_shared(s, costs, &res);
    busy = 0;
    for (double b : res.busy) busy += b;
  }
  res.bubble_fraction = res.makespan > 0 ? 1.0 - busy / (p * res.makespan) : 0.0;
  return res;
}

double ideal_bubble_fraction(const ScheduleOptions& o, const SimCosts& c) {
  const double p = o.stages, m = o.micro_batches, v = o.virtual_stages;
  switch (o.kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::k1F1B:
      return (p - 1) / (m + p - 1);
    case ScheduleKind::kInterleaved:
      return (p - 1) / (v * m + p - 1);
    case ScheduleKind::kZbH1: {
      const double bi = c.bi();
      const double w = c.bw();
      const double bubble = (p - 1) * std::max(0.0, c.forward + bi - w);
      return bubble / (m * (c.forward + bi + w) + bubble);
    }
    case ScheduleKind::kZbV: {
      const double bi = c.bi();
      const double w = c.bw();
      const double bubble = (p - 1) * c.forward;
      return bubble / (2 * m * (c.forward + bi + w) + bubble);
    }
  }
  return 0;
}

}  // namespace meshflow
