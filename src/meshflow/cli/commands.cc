#include "meshflow/cli/commands.h"

#include <cmath>
#include <cstdio>
#include <exception>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/runtime/progress.h"
#include "meshflow/runtime/trainer.h"

namespace meshflow::cli {

namespace {

int user_error(const Status& s) {
  std::fprintf(stderr, "meshflow: error: %s\n", s.message().c_str());
  return 2;
}

Result<RunConfig> load(const std::string& path, std::vector<std::string> overrides) {
  return load_run_config(path, overrides);
}

int train_impl(const TrainOptions& o) {
  std::vector<std::string> overrides = o.overrides;
  if (o.steps > 0) overrides.push_back("train.steps=" + std::to_string(o.steps));
  if (o.threads >= 0) overrides.push_back("train.threads=" + std::to_string(o.threads));
  Result<RunConfig> rc = load(o.config, overrides);
  if (!rc.is_ok()) return user_error(rc.status());
  if (!o.checkpoint.empty()) rc->train.checkpoint = o.checkpoint;

  ProgressReporter progress(o.quiet);
  if (!o.metrics.empty()) {
    Status s = progress.open_metrics(o.metrics);
    if (!s.is_ok()) return user_error(s);
  }
  Result<std::unique_ptr<Trainer>> created = Trainer::create(*rc);
  if (!created.is_ok()) return user_error(created.status());
  Trainer& trainer = **created;
  trainer.executor().set_profiling(o.profile);
  if (!o.init.empty()) {
    Status s = trainer.load_checkpoint(o.init);
    if (!s.is_ok()) return user_error(s);
  }
  const TrainConfig& tc = rc->train;
  progress.message("meshflow: " + rc->model_source + ": " + std::to_string(trainer.num_parameters()) +
                   " parameters; " + std::to_string(tc.steps) + " steps of batch " +
                   std::to_string(tc.batch_size) +
                   (tc.micro_batches > 1 ? " (" + std::to_string(tc.micro_batches) + " micro-batches)" : "") +
                   "; memory planned " + format_bytes(trainer.peak_bytes()));

  double window_s = 0, window_flops = 0;
  int64_t window_items = 0;
  for (int s = 0; s < tc.steps; ++s) {
    StepResult r = trainer.step();
    window_s += r.seconds;
    window_flops += r.flops;
    window_items += r.items;
    bool last = s + 1 == tc.steps;
    if (r.step % tc.log_every == 0 || last || r.step == 1) {
      StepReport rep;
      rep.step = r.step;
      rep.total_steps = tc.steps;
      rep.loss = r.loss;
      rep.lr = r.lr;
      rep.grad_norm = r.grad_norm;
      rep.items_per_s = window_s > 0 ? window_items / window_s : 0;
      rep.items_are_tokens = trainer.is_language_model();
      rep.gflops = window_s > 0 ? window_flops / window_s / 1e9 : 0;
      rep.peak_bytes = trainer.peak_bytes();
      progress.step(rep);
      window_s = window_flops = 0;
      window_items = 0;
    }
    if (!std::isfinite(r.loss)) {
      progress.finish();
      std::fprintf(stderr, "meshflow: error: loss is %f at step %d; lower optimizer.lr or set optimizer.grad_clip\n",
                   r.loss, r.step);
      return 1;
    }
    if (tc.eval_every > 0 && r.step % tc.eval_every == 0 && !last) {
      EvalResult e = trainer.evaluate();
      progress.eval({r.step, e.loss, e.accuracy});
    }
    if (tc.save_every > 0 && !tc.checkpoint.empty() && r.step % tc.save_every == 0 && !last) {
      Status st = trainer.save_checkpoint(tc.checkpoint);
      if (!st.is_ok()) return user_error(st);
    }
  }
  EvalResult e = trainer.evaluate();
  progress.eval({trainer.steps_done(), e.loss, e.accuracy});
  if (!tc.checkpoint.empty()) {
    Status st = trainer.save_checkpoint(tc.checkpoint);
    if (!st.is_ok()) return user_error(st);
    progress.message("meshflow: wrote checkpoint " + tc.checkpoint);
  }
  progress.finish();
  if (o.profile) std::fprintf(stderr, "kernel time by op:\n%s", trainer.executor().profile_report().c_str());
  return 0;
}

}  // namespace

int run_train(const TrainOptions& o) {
  try {
    return train_impl(o);
  } catch (const StatusError& e) {
    return user_error(e.status());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshflow: error: %s\n", e.what());
    return 1;
  }
}

int run_graph(const GraphOptions& o) {
  try {
    Result<RunConfig> rc = load_run_config(o.config, o.overrides);
    if (!rc.is_ok()) return user_error(rc.status());
    const TrainConfig& tc = rc->train;
    Result<ModelGraph> m = build_model_from_json(rc->model, tc.batch_size / tc.micro_batches, tc.seq_len);
    if (!m.is_ok()) return user_error(m.status().with_context(rc->model_source));
    Graph& g = m->graph;
    append_backward(g);
    append_optimizer(g, rc->optimizer);
    Status v = verify(g);
    if (!v.is_ok()) {
      std::fprintf(stderr, "meshflow: internal error: %s\n", v.message().c_str());
      return 1;
    }
    for (const Node& n : g.nodes()) {
      bool show = o.phase == "all" || (o.phase == "forward" && n.phase == Phase::kForward) ||
                  (o.phase == "backward" && n.phase == Phase::kBackward) ||
                  (o.phase == "optimizer" && n.phase == Phase::kOptimizer);
      if (show) std::printf("%s\n", print_node(g, n).c_str());
    }
    return 0;
  } catch (const StatusError& e) {
    return user_error(e.status());
  }
}

}  // namespace meshflow::cli
