#include "meshflow/plan/auto_plan.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>

#include "meshflow/core/file_io.h"
#include "meshflow/core/random.h"
#include "meshflow/models/from_config.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/parallel/strategy_search.h"
#include "meshflow/plan/calibrate.h"

namespace meshflow::plan {

namespace {

std::string str(int64_t x) {
  return std::to_string(x);
}

bool faster(const StepCost& a, const StepCost& b) {
  if (a.step_time_s != b.step_time_s) return a.step_time_s < b.step_time_s;
  return a.memory.total < b.memory.total;
}

// How local plans are priced (auto mode and the plan check alike): the
// config's model, batch and optimizer on this machine shared among `ranks`
// ranks, with meshflow's CPU constants and the config's gradient bucket size.
struct LocalPricing {
  ModelConfig model;
  Cluster cluster;
  std::unique_ptr<const CostModel> cm;
};

Result<LocalPricing> local_pricing(const RunConfig& rc, int ranks, const Cluster& local,
                                   const char* what,
                                   std::shared_ptr<const StrategySearch> fixed = nullptr) {
  LocalPricing lp;
  MF_ASSIGN_OR_RETURN(lp.model, parse_model_config(rc.model));
  MF_ASSIGN_OR_RETURN(lp.cluster, share_machine(local, ranks));
  TrainingJob job{lp.model, rc.train.batch_size, rc.train.seq_len};
  job.optimizer_states = optimizer_state_values(rc.optimizer);
  CostConstants k = meshflow_cpu_constants();
  k.grad_bucket_bytes = double(static_cast<int64_t>(rc.train.bucket_mib * (1 << 20)));  // as run
  auto cm = std::make_unique<CostModel>(job, lp.cluster, k);
  // Every plan priced with the strategy its run annotates (a few dozen
  // plans: the sweep's reuse across micro-batches saves nothing here).
  cm->set_exact_strategies(true);
  if (fixed) cm->fix_strategies(std::move(fixed));
  lp.cm = std::move(cm);
  if (!lp.cm->status().is_ok()) return lp.cm->status().with_context(what);
  return lp;
}

}  // namespace

Result<LocalAutoPlan> plan_local_run(const RunConfig& rc, int ranks, const Cluster& local) {
  if (ranks < 1) return Status::invalid("auto parallel: --ranks must be >= 1, got " + str(ranks));
  MF_ASSIGN_OR_RETURN(const LocalPricing lp, local_pricing(rc, ranks, local, "auto parallel"));
  const ModelConfig& model = lp.model;
  const Cluster& cluster = lp.cluster;
  const CostModel& cm = *lp.cm;
  const TrainConfig& tc = rc.train;
  const TransformerDims& d = cm.dims();
  const int64_t m = std::max(1, tc.micro_batches);

  // A recompute policy the config already sets is pinned; "ops" is priced as none.
  std::vector<Recompute> policies = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  if (tc.recompute.mode == RecomputePolicy::kFull) policies = {Recompute::kFull};
  if (tc.recompute.mode == RecomputePolicy::kSelective) policies = {Recompute::kSelective};
  if (tc.recompute.mode == RecomputePolicy::kOps) policies = {Recompute::kNone};

  LocalAutoPlan out;
  out.time_shared_cores = cluster.shared_cores;
  std::string first_invalid;
  auto consider = [&](const Plan& p) {
    const std::string why = cm.invalid_reason(p);
    if (!why.empty()) {
      if (first_invalid.empty()) first_invalid = plan_label(p) + ": " + why;
      return;
    }
    Result<StepCost> c = cm.price(p);
    if (!c.is_ok()) {
      if (first_invalid.empty()) first_invalid = c.status().message();
      return;
    }
    out.candidates.push_back(*c);
    // A pipeline also with its stages chosen by time and memory together
    // (CostModel::stage_split) where that differs from the runtime's split:
    // fewer blocks where the embedding, the head or the micro-batches in
    // flight weigh, a plan where the balanced split does not fit.
    if (p.pp > 1 && p.vp == 1 && p.layers_per_stage.empty()) {
      Result<std::vector<int64_t>> split = cm.stage_split(p);
      if (!split.is_ok() || split->empty()) return;
      Plan q = p;
      q.layers_per_stage = *split;
      Result<StepCost> u = cm.price(q);
      if (u.is_ok() && (u->step_time_s != c->step_time_s || u->memory.total != c->memory.total))
        out.candidates.push_back(*u);
    }
  };
  // Pipelines for the language models and the ResNets (the pipeline
  // trainer's schedules, the runtime's balanced split of the blocks or of the
  // residual layers, no ZeRO on the stages). Context parallel without
  // pipelines (their stages run dp x tp): a language model's sequence over
  // ranks, a ResNet's image height (the stem's split, propagated; the
  // Megatron-like layout alone, ring attention being a sequence's).
  const bool lm = is_language_model(model);
  const bool resnet = std::holds_alternative<ResNetConfig>(model);
  const int64_t max_pp = lm || resnet ? std::min<int64_t>(ranks, cm.pipeline_layers()) : 1;
  for (int64_t pp = 1; pp <= max_pp; ++pp) {
    if (ranks % pp != 0) continue;
    for (int64_t tp = 1; tp <= ranks / pp; ++tp) {
      if ((ranks / pp) % tp != 0) continue;
      if (d.kv_heads % tp != 0) {  // the partitioner splits kv heads with the query heads
        if (first_invalid.empty())
          first_invalid = "tp=" + str(tp) + " does not divide kv_heads=" + str(d.kv_heads);
        continue;
      }
      for (int64_t cp = 1; cp <= ((lm || resnet) && pp == 1 ? ranks / tp : 1); ++cp) {
        if ((ranks / (pp * tp)) % cp != 0) continue;
        const int64_t dp = ranks / (pp * tp * cp);
        // Micro-batches: the config's; a pipeline's at least pp of them
        // (pp, 2pp, 4pp when the config leaves them at 1).
        std::vector<int64_t> counts = {m};
        if (pp > 1)
          counts = m > 1 ? std::vector<int64_t>{m} : std::vector<int64_t>{pp, 2 * pp, 4 * pp};
        for (int64_t mb : counts) {
          if (mb < pp) continue;
          if (tc.batch_size % (dp * mb) != 0) {
            if (first_invalid.empty())
              first_invalid = "dp=" + str(dp) + ": batch_size " + str(tc.batch_size) +
                              " does not split into " + str(mb) + " micro-batches x " + str(dp) +
                              " replicas";
            continue;
          }
          const std::vector<ScheduleKind> schedules =
              pp > 1 ? std::vector<ScheduleKind>{ScheduleKind::k1F1B, ScheduleKind::kZbH1}
                     : std::vector<ScheduleKind>{ScheduleKind::k1F1B};
          // Layouts on tp and cp: Megatron (with cp: Ulysses' all_to_all to
          // heads), Megatron-SP, the per-operator search's, ring attention,
          // ring attention beside Megatron-SP.
          for (int layout = 0; layout <= (tp * cp > 1 ? 4 : 0); ++layout)
            for (ScheduleKind schedule : schedules)
              for (Recompute rcp : policies)
                for (int zero = 0; zero <= (dp > 1 && pp == 1 ? 3 : 0); ++zero) {
                  if ((layout == 1 && tp == 1) || (layout >= 3 && cp == 1) ||
                      (layout == 4 && tp == 1) || (resnet && cp > 1 && layout != 0))
                    continue;
                  Plan p;
                  p.dp = dp, p.tp = tp, p.pp = pp, p.cp = cp;
                  p.sp = layout == 1 || layout == 4, p.ops = layout == 2, p.ring = layout >= 3;
                  p.schedule = schedule;
                  p.micro_batch = tc.batch_size / (dp * mb);
                  p.num_micro_batches = mb;
                  p.recompute = rcp;
                  p.zero = zero;
                  consider(p);
                }
        }
      }
    }
  }
  if (out.candidates.empty())
    return Status::invalid("auto parallel: no dp x tp x cp plan of " + str(ranks) +
                           " ranks is valid (" + str(d.heads) + " heads, ffn " + str(d.ffn) +
                           ", batch " + str(tc.batch_size) + "): " + first_invalid);
  const StepCost* best = nullptr;
  const StepCost* least_memory = nullptr;
  for (const StepCost& c : out.candidates) {
    if (!least_memory || c.memory.total < least_memory->memory.total) least_memory = &c;
    if (c.fits && (!best || faster(c, *best))) best = &c;
  }
  if (!best) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%.2f GiB per rank, %.2f GiB usable",
                  least_memory->memory.total / (1 << 30), least_memory->usable_memory / (1 << 30));
    return Status::invalid("auto parallel: no plan on " + str(ranks) +
                           " local ranks fits memory; the smallest (" +
                           plan_label(least_memory->plan) + ") needs " + buf);
  }
  // Plans predicted within the local model's spread of the fastest are not
  // told apart: among them, the one that synchronizes least (the smallest
  // tp x cp, then the fewest stages, then no ZeRO), whose cost the model is
  // surest of.
  const StepCost* fastest = best;
  out.spread = local_plan_spread(fastest->plan, cluster);
  auto syncs = [](const StepCost& c) {
    return std::make_tuple(c.plan.tp * c.plan.cp, c.plan.pp, c.plan.zero > 0, c.step_time_s);
  };
  for (const StepCost& c : out.candidates) {
    if (!c.fits || c.step_time_s > fastest->step_time_s * (1 + out.spread)) continue;
    if (syncs(c) < syncs(*best)) best = &c;
  }
  out.best = *best;
  out.fastest = *fastest;
  MF_ASSIGN_OR_RETURN(out.best_stages, cm.memory_by_stage(best->plan));
  MF_ASSIGN_OR_RETURN(out.parallel, parallel_section(best->plan, model));
  return out;
}

Result<LocalAutoPlan> price_local_plan(const RunConfig& rc, int ranks, const Cluster& local,
                                       const Plan& p) {
  // Split tuples of the user's own: priced as written, not searched.
  const bool own = p.ops && p.searched && p.searched->fixed;
  MF_ASSIGN_OR_RETURN(const LocalPricing lp,
                      local_pricing(rc, ranks, local, "plan check", own ? p.searched : nullptr));
  const CostModel& cm = *lp.cm;
  Result<StepCost> priced = cm.price(p);
  if (!priced.is_ok()) return priced.status().with_context("plan check");
  LocalAutoPlan out;
  out.time_shared_cores = lp.cluster.shared_cores;
  out.best = *priced;
  MF_ASSIGN_OR_RETURN(out.best_stages, cm.memory_by_stage(p));
  MF_ASSIGN_OR_RETURN(out.parallel, parallel_section(out.best.plan, lp.model));
  // The others auto mode would price (none when it finds no valid plan).
  Result<LocalAutoPlan> searched = plan_local_run(rc, ranks, local);
  if (searched.is_ok()) out.candidates = std::move(searched->candidates);
  // p among them, as priced here (the strategy search's plans hold their
  // own search's answer: equal but for that pointer).
  bool listed = false;
  for (StepCost& c : out.candidates) {
    if (own) break;  // (the search's plan at the same degrees is another plan)
    Plan a = c.plan, b = out.best.plan;
    a.searched = b.searched = nullptr;
    if (a == b) c = out.best, listed = true;
  }
  if (!listed) out.candidates.push_back(out.best);
  out.fastest = out.best;
  for (const StepCost& c : out.candidates)
    if (c.fits && (!out.fastest.fits || faster(c, out.fastest))) out.fastest = c;
  out.spread = local_plan_spread(out.fastest.plan, lp.cluster);
  return out;
}

double local_plan_spread(const Plan& p, const Cluster& shared) {
  return (p.pp > 1 || p.cp > 1) && shared.shared_cores > 0 ? kTimeSharedSyncSpread
                                                           : kLocalPlanSpread;
}

namespace {

// Tensor parallelism for a model without attention heads (the MLP): Megatron's
// MLP split, each pair of layers column- then row-parallel: the outputs of the
// 1st, 3rd, ... hidden layers ("hidden", "hidden2", ...) split over tp, so the
// layer after each reads a split input and its output is one all_reduce.
nlohmann::json mlp_tensor_rules(const MlpConfig& m) {
  nlohmann::json rules = {{"batch", "dp"}};
  for (size_t i = 0; i < m.hidden.size(); i += 2)
    rules[i == 0 ? "hidden" : "hidden" + std::to_string(i)] = "tp";
  return rules;
}

// A ResNet's plan (ops/conv.cc, ops/window.h): tp splits the channels inside
// each residual layer ("mid": the first convolution column-parallel, the
// next one's input channels a reduction, one all_reduce per layer, like
// Megatron's MLP); cp splits the image's height (the stem convolution's split
// tuple, propagated as far as the sizes allow: halo exchanges between
// neighbours, then the batch once the maps are too small).
nlohmann::json resnet_section(const Plan& p, nlohmann::json par) {
  par["mode"] = p.cp > 1 ? "auto" : "semi";
  nlohmann::json rules = {{"batch", "dp"}};
  if (p.tp > 1) rules["mid"] = "tp";
  par["rules"] = rules;
  if (p.cp > 1) {
    par["search"] = "propagate";
    par["strategies"] = {{"embedder.embedder.convolution", "((dp,1,cp,1),(1,1,1,1))"}};
  }
  return par;
}

}  // namespace

Result<nlohmann::json> parallel_section(const Plan& p, const ModelConfig& model) {
  const MlpConfig* mlp = std::get_if<MlpConfig>(&model);
  const bool resnet = std::holds_alternative<ResNetConfig>(model);
  if (mlp && (p.cp > 1 || p.pp > 1 || p.sp))
    return Status::invalid("plan " + plan_label(p) +
                           ": the mlp has no sequence (cp, sp) and no transformer blocks (pp)");
  if (resnet && p.sp)
    return Status::invalid("plan " + plan_label(p) +
                           ": a resnet has no sequence for sp; the planner splits it by batch "
                           "(dp), channels (tp), height (cp) and residual layers (pp)");
  nlohmann::json par;
  const bool spmd = p.tp > 1 || p.cp > 1 || p.zero > 0;
  par["mode"] = spmd ? "semi" : "data";
  par["mesh"] = plan_mesh(p);
  if (p.ops) {
    if (!p.searched)
      return Status::invalid("plan " + plan_label(p) +
                             ": its per-operator strategies are not searched yet (price the plan "
                             "with CostModel::price first)");
    par["rules"] = {{"batch", "dp"}};
    if (p.searched->fixed && !p.searched->rules.empty()) {  // the user's own
      par["rules"] = nlohmann::json::object();
      for (const auto& [dim, axes] : p.searched->rules) par["rules"][dim] = axes;
    }
    nlohmann::json strategies = nlohmann::json::object();
    for (const auto& [key, splits] : p.searched->strategies) strategies[key] = splits;
    par["strategies"] = strategies;
    // Its attention may run as a ring over cp: in zigzag order, as searched.
    if (p.cp > 1 && !resnet && !mlp) par["ring_order"] = "zigzag";
  } else if (spmd && resnet)
    par = resnet_section(p, std::move(par));
  else if (spmd && mlp && p.tp > 1)
    par["rules"] = mlp_tensor_rules(*mlp);
  else if (spmd)
    par["preset"] = p.cp > 1 && p.ring ? (p.sp && p.tp > 1 ? "ring-sp" : "ring")
                    : p.tp > 1         ? (p.sp ? "megatron-sp" : "megatron")
                    : p.cp > 1         ? "ulysses"
                                       : "dp";
  if (p.zero > 0) par["zero"] = p.zero;
  if (p.group) par["zero_style"] = "group";
  if (p.pp > 1) {
    par["pipeline"] = {{"stages", p.pp},
                       {"schedule", std::string(schedule_name(p.schedule))},
                       {"micro_batches", p.num_micro_batches},
                       {"virtual_stages", p.vp}};
    if (!p.layers_per_stage.empty()) par["pipeline"]["layers_per_stage"] = p.layers_per_stage;
  }
  par["recompute"] = recompute_name(p.recompute);
  if (p.recompute == Recompute::kFull && p.recompute_layers > 0) {
    // The first recompute_layers blocks of each pipeline chunk, by number,
    // over the chunks the planner priced (written out: the runtime's own
    // balanced split weighs blocks by cost, and could place them otherwise).
    if (resnet && p.pp == 1) {
      // A ResNet's first residual layers (blocks 0 .. N-1).
      std::vector<int64_t> first;
      for (int64_t b = 0; b < p.recompute_layers; ++b) first.push_back(b);
      par["recompute_layers"] = first;
      return par;
    }
    if (resnet || mlp)
      return Status::invalid("plan " + plan_label(p) +
                             ": recompute of some blocks is priced for transformer blocks and "
                             "a resnet's first residual layers without pipelines");
    MF_ASSIGN_OR_RETURN(const TransformerDims d, transformer_dims(model));
    const std::vector<int64_t> sizes = chunk_blocks(p, d.layers);
    par["recompute_layers"] = first_blocks_of_chunks(sizes, p.recompute_layers);
    if (p.pp > 1) par["pipeline"]["layers_per_stage"] = sizes;
  }
  return par;
}

Result<nlohmann::json> auto_parallel_section(const RunConfig& rc, int ranks, const Cluster& local) {
  MF_ASSIGN_OR_RETURN(LocalAutoPlan a, plan_local_run(rc, ranks, local));
  return a.parallel;
}

std::string local_cluster_cache_path() {
  std::string dir;
  if (const char* d = std::getenv("MESHFLOW_CACHE_DIR"); d && *d) {
    dir = d;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    dir = std::string(x) + "/meshflow";
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    dir = std::string(h) + "/.cache/meshflow";
  } else {
    return "";
  }
  // One file per kind of machine.
  char name[48];
  std::snprintf(name, sizeof name, "local_cpu-%016llx.json",
                static_cast<unsigned long long>(fnv1a(this_machine_device_name())));
  return dir + "/" + name;
}

Result<Cluster> load_local_cluster(const std::string& path) {
  namespace fs = std::filesystem;
  if (!path.empty()) return load_cluster(path);
  if (const char* env = std::getenv("MESHFLOW_LOCAL_CLUSTER"); env && *env)
    return load_cluster(env);
  // One measurement per process, whatever happens to the cache file.
  static std::mutex mu;
  static std::optional<Cluster> measured;
  std::lock_guard<std::mutex> lock(mu);
  if (measured) return *measured;
  const std::string here_name = this_machine_device_name();
  const std::string software = calibration_software();
  const std::string cache = local_cluster_cache_path();
  std::error_code ec;
  std::string stale;  // a cached calibration of this machine by other software
  if (!cache.empty() && fs::exists(cache, ec)) {
    Result<Cluster> c = load_cluster(cache);  // a bad cache file is measured again
    if (c.is_ok() && c->device.name == here_name) {
      if (c->calibrated_with == software) return c;
      stale = "the cached " + cache + " was measured with " +
              (c->calibrated_with.empty() ? std::string("an unrecorded build")
                                          : "\"" + c->calibrated_with + "\"") +
              ", this build is \"" + software + "\"";
    }
  }
  const std::string rel = "configs/clusters/local_cpu.json";
  std::string shipped;
  if (fs::exists(rel, ec)) {
    shipped = rel;
  } else if (const fs::path src(__FILE__); src.is_absolute()) {
    // The source tree: this file is <root>/src/meshflow/plan/auto_plan.cc.
    const fs::path p = src.parent_path().parent_path().parent_path().parent_path() / rel;
    if (fs::exists(p, ec)) shipped = p.string();
  }
  std::string other = "no " + rel + " here";
  if (!shipped.empty()) {
    MF_ASSIGN_OR_RETURN(Cluster c, load_cluster(shipped));
    // (A shipped file that does not say what measured it is taken as this
    // build's.)
    if (c.device.name == here_name && (c.calibrated_with.empty() || c.calibrated_with == software))
      return c;
    other = shipped + " was measured on " + c.device.name;
    if (c.device.name == here_name)
      other = shipped + " was measured with \"" + c.calibrated_with + "\"";
  }
  if (!stale.empty()) other = stale;
  Result<Calibration> cal = calibrate();
  if (!cal.is_ok())
    return cal.status().with_context("measuring this machine (" + other +
                                     "; name a cluster file with $MESHFLOW_LOCAL_CLUSTER)");
  Cluster c = cluster_from_calibration(*cal, "local_cpu");
  std::string where =
      "not cached: no cache directory ($MESHFLOW_CACHE_DIR, $XDG_CACHE_HOME, $HOME)";
  if (cal->others_busy > kDisturbedShare) {  // it measured part of the machine
    char busy[160];
    std::snprintf(busy, sizeof busy,
                  "not cached: other processes used %.0f%% of the CPU meanwhile, so it is "
                  "measured again next time",
                  100 * cal->others_busy);
    where = busy;
  } else if (!cache.empty()) {
    fs::create_directories(fs::path(cache).parent_path(), ec);
    const Status s = write_file_atomic(cache, format_cluster_json(c), "cluster cache");
    where = s.is_ok() ? "cached in " + cache : "not cached: " + s.message();
  }
  char took[32];
  std::snprintf(took, sizeof took, "%.1f s", cal->wall_s);
  std::fprintf(stderr,
               "meshflow: %s; this machine is %s: measured it for the planner (%s), %s "
               "($MESHFLOW_LOCAL_CLUSTER=FILE names another)\n",
               other.c_str(), here_name.c_str(), took, where.c_str());
  measured = c;
  return c;
}

}  // namespace meshflow::plan
