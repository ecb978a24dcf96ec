#include "meshflow/plan/search.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <set>
#include <tuple>
#include <utility>

#include "meshflow/core/for_each_index.h"

namespace meshflow::plan {

namespace {

std::string str(int64_t x) {
  return std::to_string(x);
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(i);
      if (i != n / i) d.push_back(n / i);
    }
  std::sort(d.begin(), d.end());
  return d;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

Result<int64_t> parse_int(const std::string& key, const std::string& v, int64_t min) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE || x < min)
    return Status::invalid("--fix " + key + " must be an integer >= " + str(min) + ", got '" + v +
                           "'");
  return static_cast<int64_t>(x);
}

}  // namespace

bool FixedChoices::matches(const Plan& p) const {
  return (!dp || *dp == p.dp) && (!tp || *tp == p.tp) && (!pp || *pp == p.pp) &&
         (!cp || *cp == p.cp) && (!vp || *vp == p.vp) &&
         (!micro_batch || *micro_batch == p.micro_batch) && (!sp || *sp == p.sp) &&
         (!schedule || *schedule == p.schedule) && (!recompute || *recompute == p.recompute) &&
         (!recompute_layers || *recompute_layers == p.recompute_layers) &&
         (!zero || *zero == p.zero) && (!ops || *ops == p.ops) &&
         (!offload || *offload == p.offload) && (!group || *group == p.group) &&
         (!ring || *ring == p.ring);
}

std::string FixedChoices::to_string() const {
  std::string s;
  auto add = [&](const std::string& kv) { s += (s.empty() ? "" : ",") + kv; };
  if (dp) add("dp=" + str(*dp));
  if (tp) add("tp=" + str(*tp));
  if (pp) add("pp=" + str(*pp));
  if (cp) add("cp=" + str(*cp));
  if (sp) add(std::string("sp=") + (*sp ? "true" : "false"));
  if (vp) add("vp=" + str(*vp));
  if (micro_batch) add("micro_batch=" + str(*micro_batch));
  if (schedule) add("schedule=" + std::string(schedule_name(*schedule)));
  if (recompute) add(std::string("recompute=") + recompute_name(*recompute));
  if (recompute_layers) add("recompute_layers=" + str(*recompute_layers));
  if (zero) add("zero=" + str(*zero));
  if (ops) add(std::string("ops=") + (*ops ? "true" : "false"));
  if (offload) add(std::string("offload=") + offload_name(*offload));
  if (group) add(std::string("zero_style=") + (*group ? "group" : "shard"));
  if (ring) add(std::string("ring=") + (*ring ? "true" : "false"));
  return s;
}

Result<FixedChoices> parse_fixed(const std::string& text) {
  FixedChoices f;
  const std::string form = "give key=value items separated by commas, e.g. tp=8,pp=4";
  if (text.empty()) return Status::invalid("--fix is empty; " + form);
  std::set<std::string> seen;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    start = end + 1;
    if (item.empty()) return Status::invalid("--fix '" + text + "' has an empty item; " + form);
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      return Status::invalid("--fix takes key=value items separated by commas, got '" + item + "'");
    const std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    if (!seen.insert(key).second)
      return Status::invalid("--fix gives '" + key + "' more than once ('" + text +
                             "'); give each key once");
    if (key == "dp" || key == "tp" || key == "pp" || key == "cp" || key == "vp" ||
        key == "micro_batch") {
      MF_ASSIGN_OR_RETURN(int64_t x, parse_int(key, v, 1));
      (key == "dp"   ? f.dp
       : key == "tp" ? f.tp
       : key == "pp" ? f.pp
       : key == "cp" ? f.cp
       : key == "vp" ? f.vp
                     : f.micro_batch) = x;
    } else if (key == "recompute_layers") {
      MF_ASSIGN_OR_RETURN(f.recompute_layers, parse_int(key, v, 0));
    } else if (key == "zero") {
      MF_ASSIGN_OR_RETURN(int64_t x, parse_int(key, v, 0));
      if (x > 3) return Status::invalid("--fix zero must be 0, 1, 2 or 3, got " + v);
      f.zero = static_cast<int>(x);
    } else if (key == "sp" || key == "ops" || key == "ring") {
      if (v != "true" && v != "false" && v != "1" && v != "0")
        return Status::invalid("--fix " + key + " must be true or false, got '" + v + "'");
      (key == "sp" ? f.sp : key == "ops" ? f.ops : f.ring) = v == "true" || v == "1";
    } else if (key == "schedule") {
      Result<ScheduleKind> s = parse_schedule_kind(v);
      if (!s.is_ok()) return s.status().with_context("--fix");
      f.schedule = *s;
    } else if (key == "recompute") {
      Result<Recompute> r = parse_recompute(v);
      if (!r.is_ok()) return r.status().with_context("--fix");
      f.recompute = *r;
    } else if (key == "zero_style") {
      if (v != "shard" && v != "group")
        return Status::invalid("--fix zero_style must be shard or group, got '" + v + "'");
      f.group = v == "group";
    } else if (key == "offload") {
      Result<Offload> o = parse_offload(v);
      if (!o.is_ok()) return o.status().with_context("--fix");
      f.offload = *o;
    } else {
      return Status::invalid("--fix: unknown key '" + key +
                             "'; valid: dp, tp, pp, cp, sp, vp, micro_batch, schedule, "
                             "recompute, recompute_layers, zero, zero_style, ops, ring, "
                             "offload");
    }
  }
  return f;
}

namespace {

// Micro-batch sizes to try for a replica batch: its divisors up to
// max_micro_batch (or only the pinned size), found without factoring the
// batch, so the cost does not grow with it.
std::vector<int64_t> micro_batch_sizes(int64_t replica_batch, const SearchOptions& o) {
  std::vector<int64_t> sizes;
  if (o.fixed.micro_batch) {
    if (replica_batch % *o.fixed.micro_batch == 0) sizes.push_back(*o.fixed.micro_batch);
    return sizes;
  }
  for (int64_t mb = 1; mb <= std::min(o.max_micro_batch, replica_batch); ++mb)
    if (replica_batch % mb == 0) sizes.push_back(mb);
  return sizes;
}

// The (tp, cp) degrees of the search space on `devices` devices that `fixed`
// allows, in the sweep's order: each is a group of plans swept on its own.
std::vector<std::pair<int64_t, int64_t>> tp_cp_groups(const CostModel& cm, int64_t devices,
                                                      const SearchOptions& o) {
  const TransformerDims& d = cm.dims();
  const FixedChoices& fx = o.fixed;
  const int64_t per_node = cm.cluster().fabric_devices();  // tp stays on NVLink
  // cp: the sequence; a ResNet's image height (its seq is 1).
  const int64_t split_rows =
      std::holds_alternative<ResNetConfig>(cm.job().model)
          ? std::get<ResNetConfig>(cm.job().model).image_size / 2  // after the stride-2 stem
          : cm.job().seq;
  std::vector<std::pair<int64_t, int64_t>> groups;
  for (int64_t tp : divisors(devices)) {
    if (fx.tp ? tp != *fx.tp : (tp > per_node || d.heads % tp != 0 || d.ffn % tp != 0)) continue;
    for (int64_t cp : divisors(devices / tp)) {
      if (fx.cp ? cp != *fx.cp : (cp > o.max_cp || split_rows % cp != 0)) continue;
      groups.emplace_back(tp, cp);
    }
  }
  return groups;
}

// Calls visit(plan) for every plan of the search space on `devices` devices
// with degrees tp and cp that `fixed` allows (not yet checked against the
// model: price() does that), until visit returns false.
template <typename Visit>
void enumerate(const CostModel& cm, int64_t devices, int64_t tp, int64_t cp, const SearchOptions& o,
               const std::vector<Offload>& offloads, Visit visit) {
  const FixedChoices& fx = o.fixed;
  const int64_t gb = cm.job().global_batch;
  for (int64_t pp : divisors(devices / (tp * cp))) {
    const int64_t layers = cm.pipeline_layers();
    if (fx.pp ? pp != *fx.pp : pp > std::max<int64_t>(1, layers)) continue;
    const int64_t dp = devices / (tp * cp * pp);
    if ((fx.dp && dp != *fx.dp) || gb % dp != 0) continue;
    const int64_t replica_batch = gb / dp;
    for (int64_t mb : micro_batch_sizes(replica_batch, o)) {
      Plan p;
      p.dp = dp, p.tp = tp, p.pp = pp, p.cp = cp, p.micro_batch = mb;
      p.num_micro_batches = replica_batch / mb;
      // (kind, vp, whether the chunks take the embedding-and-loss split)
      std::vector<std::tuple<ScheduleKind, int64_t, bool>> schedules;
      if (pp == 1) {
        schedules.push_back({ScheduleKind::k1F1B, 1, false});
      } else {
        for (ScheduleKind s : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kZbH1})
          schedules.push_back({s, 1, false});
        if (2 * pp <= layers && (!cm.has_blocks() || layers % (2 * pp) == 0))
          schedules.push_back({ScheduleKind::kZbV, 2, false});
        if (p.num_micro_batches % pp == 0)
          // A transformer's chunks hold equal blocks, or (where the layers
          // do not divide but two more do) one fewer in the first and the
          // last chunk (Megatron's account-for-embedding/loss split); a
          // ResNet's are balanced by cost (chunk_costs), so any count up to
          // its layers.
          for (int64_t vp = 2; vp <= o.max_vp && pp * vp <= layers; ++vp) {
            if (!cm.has_blocks() || layers % (pp * vp) == 0)
              schedules.push_back({ScheduleKind::kInterleaved, vp, false});
            else if (!embedding_and_loss_split(layers, pp * vp).empty())
              schedules.push_back({ScheduleKind::kInterleaved, vp, true});
          }
      }
      for (const auto& [sched, vp, emb_loss] : schedules) {
        p.schedule = sched;
        p.vp = vp;
        p.layers_per_stage =
            emb_loss ? embedding_and_loss_split(layers, pp * vp) : std::vector<int64_t>{};
        // Layouts on tp: Megatron, Megatron-SP; the strategy search's
        // per-operator plan on tp and cp when pinned (ops=true; otherwise
        // it is tried on the leaders only, search_until).
        const int layouts = tp * cp == 1 ? 0 : fx.ops && *fx.ops ? 2 : tp > 1 ? 1 : 0;
        // cp over the keys (ring attention, zigzag order), with the Megatron
        // layout: where it can beat Ulysses, with fewer kv heads than
        // heads (its k/v shifts move less than Ulysses' all_to_alls of q,
        // k, v and out, and hide under the blocks' compute) or where
        // Ulysses cannot split the heads. With as many kv heads the two
        // move the same bytes; pinned (--fix ring=true), it is tried
        // anyway, and ring=false leaves it out.
        const TransformerDims& md = cm.dims();
        const bool ring_may_win = md.kv_heads < md.heads || (md.heads / tp) % cp != 0;
        // With tp, the ring also runs beside Megatron-SP (ring-sp).
        const bool try_ring = cp > 1 && cm.has_blocks() && (fx.ring ? *fx.ring : ring_may_win);
        const int rings = try_ring ? (tp > 1 ? 2 : 1) : 0;
        for (int layout = 0; layout <= layouts + rings; ++layout) {
          p.ring = layout > layouts;
          p.sp = p.ring ? layout == layouts + 2 : layout == 1;
          p.ops = !p.ring && layout == 2;
          for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
            p.recompute = rc;
            // Pinned, full recompute of that many blocks per chunk.
            p.recompute_layers =
                rc == Recompute::kFull ? fx.recompute_layers.value_or(int64_t{0}) : 0;
            const int max_zero = dp * cp > 1 ? 3 : 0;
            for (int z = 0; z <= max_zero; ++z) {
              p.zero = z;
              for (Offload off : offloads) {
                if (off != Offload::kNone && z == 0) continue;
                p.offload = off;
                // ZeRO-1 as sharding, and as weights grouping where it runs.
                const bool groups = z == 1 && dp > 1 && pp == 1 && cp == 1;
                for (int g = 0; g <= (groups ? 1 : 0); ++g) {
                  p.group = g == 1;
                  if (fx.matches(p) && !visit(p)) return;
                }
              }
              p.group = false;
            }
          }
        }
      }
    }
  }
}

bool faster(const StepCost& a, const StepCost& b) {
  if (a.step_time_s != b.step_time_s) return a.step_time_s < b.step_time_s;
  return a.memory.total < b.memory.total;
}

using Clock = std::chrono::steady_clock;

// Keeps c among the `keep` fastest of `plans` (fastest first). A plan as fast
// as a kept one only costs more memory (sorted by memory on ties): dropped.
void keep_plan(std::vector<StepCost>* plans, const StepCost& c, size_t keep) {
  if (plans->size() == keep && !faster(c, plans->back())) return;
  for (const StepCost& k : *plans)
    if (std::abs(k.step_time_s - c.step_time_s) <= 1e-9 * k.step_time_s) return;
  plans->insert(std::upper_bound(plans->begin(), plans->end(), c, faster), c);
  if (plans->size() > keep) plans->pop_back();
}

// What the sweep of one (tp, cp) group found.
struct GroupSweep {
  std::vector<StepCost> plans;  // its fastest fitting plans (keep_plan)
  int64_t evaluated = 0, valid = 0, fitting = 0;
  bool timed_out = false;
  std::string first_invalid;
  std::optional<StepCost> least_memory;  // over its valid plans that do not fit
  void note_invalid(const std::string& why) {
    if (first_invalid.empty()) first_invalid = why;
  }
  void note_unfit(const StepCost& c) {
    if (!least_memory || c.memory.total < least_memory->memory.total) least_memory = c;
  }
  // Adds what a later group found (the merge in the sweep's order).
  void absorb(const GroupSweep& later, size_t keep) {
    evaluated += later.evaluated, valid += later.valid, fitting += later.fitting;
    timed_out = timed_out || later.timed_out;
    note_invalid(later.first_invalid);
    if (later.least_memory) note_unfit(*later.least_memory);
    for (const StepCost& c : later.plans) keep_plan(&plans, c, keep);
  }
};

// search_plans with an absolute deadline (Clock::time_point::max(): none),
// shared by the retries on more devices. `suggest`: when nothing fits, say
// on how many more devices it would (false in those retries: each would
// otherwise retry on more devices again, multiplying the searches until the
// deadline).
Result<SearchResult> search_until(const CostModel& cm, int64_t devices,
                                  const SearchOptions& options, Clock::time_point deadline,
                                  bool suggest = true) {
  MF_RETURN_IF_ERROR(cm.status());
  const auto t0 = Clock::now();
  if (devices < 1 || devices > cm.cluster().total_devices())
    return Status::invalid("devices=" + str(devices) + " must be in [1, " +
                           str(cm.cluster().total_devices()) + "] (the cluster's size)");
  if (cm.job().global_batch < 1 || cm.job().global_batch > kMaxGlobalBatch)
    return Status::invalid("the global batch " + str(cm.job().global_batch) + " must be in [1, " +
                           str(kMaxGlobalBatch) + "] sequences");
  SearchResult r;
  // The sweep prices pipelines by the schedules' closed forms; the leaders
  // (kLeaders more than are returned) are then priced again by simulating
  // the runtime's schedule, and ranked by that.
  constexpr size_t kLeaders = 32;
  const size_t shown = static_cast<size_t>(std::max(0, options.top_k)) + 1;
  const size_t keep = shown + kLeaders;
  GroupSweep all;  // every group's findings, merged in the sweep's order
  // Offload only where nothing fits without it (or where pinned): a second
  // sweep over the ZeRO plans with the state on the host, then on NVMe.
  const FixedChoices& fx = options.fixed;
  const Host& host = cm.cluster().host;
  std::vector<std::vector<Offload>> sweeps = {{fx.offload.value_or(Offload::kNone)}};
  if (!fx.offload && host.link_bandwidth_bytes_per_s > 0)
    sweeps.push_back({Offload::kHost, Offload::kNvme});
  const std::vector<std::pair<int64_t, int64_t>> groups = tp_cp_groups(cm, devices, options);
  for (const std::vector<Offload>& offloads : sweeps) {
    if (r.fitting > 0 || r.timed_out) break;
    // Each (tp, cp) group is swept on its own, on the machine's cores (the
    // cost model's caches are shared and locked), and the groups' findings
    // are merged in the sweep's order: the answer is the one sweep's.
    std::vector<GroupSweep> found(groups.size());
    for_each_index(groups.size(), options.threads, [&](size_t gi) {
      GroupSweep& gs = found[gi];
      // A model priced program by program (a ResNet: no blocks to
      // extrapolate, so each recompute plan lowers programs of its own)
      // recomputes only where the same plan without recompute does not fit:
      // recompute adds backward work and saves only memory, so where the plan
      // without it fits that one is as fast or faster (exact at pp = 1; a
      // pipeline's memory-aware split of the two may differ). `fitted`: the
      // plans without recompute that fit, of the current plan's twins (the
      // sweep enumerates a plan's recompute choices one after another).
      std::vector<Plan> fitted;
      // The clock is read before every plan: a plan prices in about a
      // microsecond from the caches, but the first at a new (tp, cp,
      // micro-batch) builds and lowers its rank programs (milliseconds; read
      // every 256 plans, a 10 ms limit ran to 1.2 s on GPT-3 175B).
      if (Clock::now() >= deadline) {
        gs.timed_out = true;
        return;
      }
      enumerate(
          cm, devices, groups[gi].first, groups[gi].second, options, offloads, [&](const Plan& p) {
            if (Clock::now() >= deadline) {
              gs.timed_out = true;
              return false;
            }
            ++gs.evaluated;
            const std::string why = cm.invalid_reason(p);
            if (!why.empty()) {
              gs.note_invalid(plan_label(p) + ": " + why);
              return true;
            }
            if (!cm.has_blocks()) {
              Plan twin = p;
              twin.recompute = Recompute::kNone, twin.recompute_layers = 0;
              if (p.recompute == Recompute::kNone) {
                if (!fitted.empty()) {
                  Plan a = fitted.front(), b = p;
                  for (Plan* x : {&a, &b})
                    x->zero = 0, x->offload = Offload::kNone, x->group = false;
                  if (!(a == b)) fitted.clear();  // other twins
                }
              } else if (std::find(fitted.begin(), fitted.end(), twin) != fitted.end()) {
                return true;
              }
            }
            auto consider = [&](const Plan& q) {
              if (options.reject) {
                const std::string no = options.reject(q);
                if (!no.empty()) {
                  gs.note_invalid(no);
                  return false;
                }
              }
              Result<StepCost> c = cm.price(q, CostModel::PipelineModel::kClosedForm);
              if (!c.is_ok()) {
                gs.note_invalid(c.status().message());
                return false;
              }
              ++gs.valid;
              if (!c->fits) {
                gs.note_unfit(*c);
                return false;
              }
              ++gs.fitting;
              keep_plan(&gs.plans, *c, keep);
              return true;
            };
            if (consider(p) && !cm.has_blocks() && p.recompute == Recompute::kNone)
              fitted.push_back(p);
            // The same pipeline with its stages chosen by time and memory
            // together (uneven: fewer blocks where the embedding, the head
            // or the micro-batches in flight weigh), when that differs from
            // the balanced split (a chunk-priced pipeline's runtime split
            // balances its own cost estimate, so any split is priced; an
            // equal one is dropped by keep_plan).
            if (p.pp > 1 && p.vp == 1 && p.layers_per_stage.empty()) {
              Result<std::vector<int64_t>> split = cm.stage_split(p);
              if (split.is_ok() && !split->empty() &&
                  (cm.prices_by_chunk(p) || *std::max_element(split->begin(), split->end()) !=
                                                *std::min_element(split->begin(), split->end()))) {
                Plan q = p;
                q.layers_per_stage = *split;
                ++gs.evaluated;
                consider(q);
              }
            }
            return true;
          });
    });
    for (const GroupSweep& gs : found) all.absorb(gs, keep);
    r.evaluated = all.evaluated, r.valid = all.valid, r.fitting = all.fitting;
    r.timed_out = all.timed_out;
    r.plans = all.plans;
  }
  // The per-operator strategy search (parallel/strategy_search.h) inside the
  // tp x cp group of each leader shown (interleaved ones too: their chunks
  // are priced on the whole model's program), on the machine's cores: the
  // same mesh, schedule, batch, recompute and ZeRO with every operator's split chosen by the
  // integer program in place of the template layout (Megatron, Megatron-SP,
  // Ulysses, ring; one solve per (tp, cp, micro-batch), cached), kept when
  // faster. The template plans stay candidates, so the answer is never worse
  // than theirs.
  if (!options.no_op_search && !r.timed_out) {
    std::vector<Plan> variants;
    for (size_t i = 0; i < r.plans.size() && i < shown; ++i) {  // the leaders shown
      Plan q = r.plans[i].plan;
      if (q.tp * q.cp == 1 || q.ops) continue;
      q.ops = true, q.sp = false, q.ring = false;
      if (!options.fixed.matches(q) ||
          std::find(variants.begin(), variants.end(), q) != variants.end())
        continue;
      if (options.reject && !options.reject(q).empty()) continue;
      variants.push_back(q);
    }
    // Priced on the machine's cores (each its own solve), kept in order.
    std::vector<std::optional<Result<StepCost>>> priced(variants.size());
    for_each_index(variants.size(), options.threads,
                   [&](size_t i) { priced[i].emplace(cm.price(variants[i])); });
    for (std::optional<Result<StepCost>>& c : priced) {
      ++r.evaluated;
      if (!c->is_ok()) continue;  // (the search found no strategy: the templates stand)
      ++r.valid;
      if (!(*c)->fits) continue;
      ++r.fitting;
      auto at = std::upper_bound(r.plans.begin(), r.plans.end(), **c, faster);
      r.plans.insert(at, **c);
    }
  }
  // Full recompute of fewer blocks (Plan::recompute_layers, Megatron's
  // block method): each fitting leader that recomputes every block is priced
  // again recomputing the first N of each chunk, N the fewest that still
  // fit (memory falls and time grows with N: a bisection), kept when it
  // fits. The sweep's plans recompute all blocks or none.
  // A ResNet's leaders without pipelines likewise, its first N residual
  // layers recomputing (the largest activations: memory falls with N).
  const bool resnet = std::holds_alternative<ResNetConfig>(cm.job().model);
  if (!options.fixed.recompute_layers && !r.timed_out &&
      ((cm.has_blocks() && cm.constants().memory_model == MemoryModel::kMegatron) || resnet)) {
    std::vector<Plan> fulls;
    for (const StepCost& c : r.plans)
      if (c.plan.recompute == Recompute::kFull && c.plan.recompute_layers == 0 &&
          (!resnet || c.plan.pp == 1))
        fulls.push_back(c.plan);
    std::vector<std::optional<StepCost>> fewer(fulls.size());
    for_each_index(fulls.size(), options.threads, [&](size_t i) {
      Plan q = fulls[i];
      // The fewest blocks a chunk holds less one: the largest N priced.
      const std::vector<int64_t> chunks =
          resnet ? std::vector<int64_t>{cm.pipeline_layers()} : chunk_blocks(q, cm.dims().layers);
      int64_t lo = 1, hi = *std::min_element(chunks.begin(), chunks.end()) - 1;
      std::optional<StepCost> best;
      while (lo <= hi) {
        const int64_t mid = (lo + hi) / 2;
        q.recompute_layers = mid;
        if (options.reject && !options.reject(q).empty()) return;
        Result<StepCost> c = cm.price(q, CostModel::PipelineModel::kClosedForm);
        if (c.is_ok() && c->fits) {
          best = std::move(*c);
          hi = mid - 1;
        } else {
          lo = mid + 1;
        }
      }
      fewer[i] = std::move(best);
    });
    for (std::optional<StepCost>& c : fewer) {
      ++r.evaluated;
      if (!c) continue;
      ++r.valid, ++r.fitting;
      r.plans.insert(std::upper_bound(r.plans.begin(), r.plans.end(), *c, faster), *c);
    }
  }
  // The leaders again, each with the strategy its run annotates at its
  // micro-batch (CostModel::set_exact_strategies: the sweep reuses one per
  // degrees across micro-batches) and its pipeline simulated. A leader that
  // no longer fits goes behind those that do.
  const std::unique_ptr<CostModel> exact = cm.exact_strategies() ? nullptr : cm.exact_model();
  const CostModel& fine = exact ? *exact : cm;
  std::vector<Status> simulated(r.plans.size());
  for_each_index(r.plans.size(), options.threads, [&](size_t i) {
    StepCost& c = r.plans[i];
    Result<StepCost> sim = fine.price(c.plan, CostModel::PipelineModel::kSimulated);
    if (sim.is_ok())
      c = std::move(*sim);
    else
      simulated[i] = sim.status();
  });
  for (const Status& s : simulated) MF_RETURN_IF_ERROR(s);
  std::stable_sort(r.plans.begin(), r.plans.end(), [](const StepCost& a, const StepCost& b) {
    return a.fits != b.fits ? a.fits : faster(a, b);
  });
  if (r.plans.size() > shown) r.plans.resize(shown);
  r.search_time_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string pinned =
      options.fixed.to_string().empty() ? "" : " with --fix " + options.fixed.to_string();
  const TransformerDims& d = cm.dims();
  if (r.timed_out && r.fitting == 0) {
    char limit[32];
    std::snprintf(limit, sizeof limit, "%g", options.time_limit_s);
    return Status::invalid("no fitting plan on " + str(devices) + " devices" + pinned +
                           " among the " + str(r.evaluated) + " plans priced within the time " +
                           "limit of " + limit + " s; raise the limit or pin choices with --fix");
  }
  if (r.valid == 0) {
    std::string msg = "no valid plan on " + str(devices) + " devices" + pinned + ": ";
    if (r.evaluated == 0) {
      msg += "no dp*tp*pp*cp = " + str(devices) +
             " with tp <= " + str(cm.cluster().fabric_devices()) +
             " dividing heads=" + str(d.heads) + ", pp <= layers=" + str(cm.pipeline_layers()) +
             " and dp dividing the global batch " + str(cm.job().global_batch);
      // Which device counts near this one would factor.
      std::vector<int64_t> ok;
      for (int64_t n = std::max<int64_t>(1, devices / 2); n <= devices * 2 && ok.size() < 6; ++n) {
        if (n > cm.cluster().total_devices() && n != devices) break;
        if (cm.job().global_batch % n == 0 || devices % n == 0) {
          if (n != devices && cm.job().global_batch % (n / std::gcd(n, int64_t(8))) == 0)
            ok.push_back(n);
        }
      }
      if (!ok.empty()) {
        msg += "; device counts that factor with this batch include";
        for (int64_t n : ok) msg += " " + str(n);
      }
    } else {
      msg += all.first_invalid;
    }
    return Status::invalid(msg);
  }
  if (r.fitting == 0) {
    const StepCost& lm = *all.least_memory;
    std::string msg = "the model (" + str(cm.num_parameters()) + " parameters) does not fit on " +
                      str(devices) + " devices" + pinned + ": the plan needing the least memory (" +
                      plan_label(lm.plan) + ") needs " + gib(lm.memory.total) +
                      " per device (params " + gib(lm.memory.params) + ", grads " +
                      gib(lm.memory.grads) + ", optimizer " + gib(lm.memory.optimizer) +
                      ", activations " + gib(lm.memory.activations) + ", temporaries " +
                      gib(lm.memory.temporaries) + "); usable per device: " + gib(lm.usable_memory);
    // The smallest multiple of this device count (up to 64x) on which it fits.
    if (suggest && options.fixed.to_string().empty()) {
      for (int64_t factor = 2; factor <= 64 && Clock::now() < deadline; factor *= 2) {
        const int64_t n = devices * factor;
        Result<Cluster> bigger = with_devices(cm.cluster(), n);
        if (!bigger.is_ok()) continue;
        Cluster c = *bigger;
        if (c.total_devices() < n) c.nodes = static_cast<int>(n / c.devices_per_node);
        CostModel cm2(cm.job(), c, cm.constants());
        SearchOptions o2 = options;
        o2.top_k = 0;
        Result<SearchResult> r2 = search_until(cm2, n, o2, deadline, /*suggest=*/false);
        if (r2.is_ok() && !r2->timed_out) {
          msg += "; it fits on " + str(n) + " devices (" + plan_label(r2->plans[0].plan) + ", " +
                 gib(r2->plans[0].memory.total) + " per device)";
          break;
        }
      }
    }
    return Status::invalid(msg);
  }
  return r;
}

}  // namespace

Result<SearchResult> search_plans(const CostModel& cm, int64_t devices,
                                  const SearchOptions& options) {
  const Clock::time_point deadline =
      options.deadline ? *options.deadline
      : options.time_limit_s > 0
          ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(options.time_limit_s))
          : Clock::time_point::max();
  return search_until(cm, devices, options, deadline);
}

std::string explain_loss(const StepCost& best, const StepCost& other) {
  struct Part {
    const char* name;
    double delta;
  };
  std::vector<Part> parts = {
      {"compute", other.compute_s - best.compute_s},
      {"recompute", other.recompute_s - best.recompute_s},
      {"tensor-parallel comm", other.tp_comm_s - best.tp_comm_s},
      {"context-parallel comm", other.cp_comm_s - best.cp_comm_s},
      {"pipeline p2p", other.pp_comm_s - best.pp_comm_s},
      {"pipeline bubble", other.bubble_s - best.bubble_s},
      {"data-parallel comm (exposed)", other.dp_comm_s - best.dp_comm_s},
      {"optimizer", other.optimizer_s - best.optimizer_s},
  };
  std::sort(parts.begin(), parts.end(),
            [](const Part& a, const Part& b) { return a.delta > b.delta; });
  const double total = other.step_time_s - best.step_time_s;
  char buf[96];
  std::snprintf(buf, sizeof buf,
                "%+.1f%% step time: ", 100.0 * total / std::max(1e-30, best.step_time_s));
  std::string s = buf;
  int shown = 0;
  for (const Part& p : parts) {
    if (p.delta <= 0.002 * best.step_time_s || shown == 3) break;
    std::snprintf(buf, sizeof buf, "%s%+.1f ms %s", shown ? ", " : "", p.delta * 1e3, p.name);
    s += buf;
    ++shown;
  }
  const Part& gain = parts.back();
  if (gain.delta < -0.002 * best.step_time_s) {
    std::snprintf(buf, sizeof buf, "%s(saves %.1f ms %s)", shown ? " " : "", -gain.delta * 1e3,
                  gain.name);
    s += buf;
    ++shown;
  }
  if (shown == 0) s += "within noise of the best";
  return s;
}

}  // namespace meshflow::plan
