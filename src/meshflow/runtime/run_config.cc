#include "meshflow/runtime/run_config.h"

#include <filesystem>
#include <limits>
#include <sstream>

namespace meshflow {

namespace fs = std::filesystem;

std::string resolve_path(const std::string& path, const std::string& base_dir) {
  if (path.empty() || fs::path(path).is_absolute()) return path;
  fs::path candidate = fs::path(base_dir) / path;
  std::error_code ec;  // a name too long or unreadable is not found here; the reader says why
  if (!base_dir.empty() && fs::exists(candidate, ec)) return candidate.string();
  return path;
}

namespace {

// 0.001, 3e-05: a number as a user would write it.
std::string number_text(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

Status parse_offload(const json& j, OffloadOptions* o, const std::string& base_dir) {
  JsonObjectReader r(j, "offload");
  std::string optimizer = "none", params = "none";
  r.choice("optimizer", &optimizer, {"none", "disk", "cpu"});
  r.choice("params", &params, {"none", "disk", "cpu"});
  r.string("dir", &o->dir);
  r.integer("prefetch", &o->lookahead, 0, 4096);
  MF_RETURN_IF_ERROR(r.finish());
  for (const auto& [key, value] : {std::pair{"optimizer", optimizer}, std::pair{"params", params}})
    if (value == "cpu")
      return Status::invalid(std::string("offload.") + key +
                             " \"cpu\": on this CPU backend it already lives in host memory; "
                             "\"disk\" puts it in a memory-mapped file in offload.dir "
                             "(ZeRO-Infinity's NVMe offload)");
  o->optimizer = optimizer == "disk";
  o->params = params == "disk";
  if (o->active() && o->dir.empty())
    return Status::invalid("offload." + std::string(o->optimizer ? "optimizer" : "params") +
                           " \"disk\" needs offload.dir: an existing directory on the disk to use");
  if (!o->active() && !o->dir.empty())
    return Status::invalid(
        "offload.dir is set but nothing is offloaded: set offload.optimizer and/or "
        "offload.params to \"disk\"");
  if (!o->dir.empty()) o->dir = resolve_path(o->dir, base_dir);
  return Status::ok();
}

Status parse_data(const json& j, DataConfig* d, const std::string& base_dir) {
  JsonObjectReader r(j, "data");
  r.required("dataset");
  r.choice("dataset", &d->dataset, {"fashion_mnist", "fortunes"});
  r.string("path", &d->path);
  r.number("eval_fraction", &d->eval_fraction, 0.0, 0.5);
  json augment;
  r.object("augment", &augment);
  MF_RETURN_IF_ERROR(r.finish());
  if (!augment.is_null()) {
    JsonObjectReader a(augment, "data.augment");
    a.integer("crop_padding", &d->crop_padding, 0, 13);
    a.boolean("flip", &d->flip);
    MF_RETURN_IF_ERROR(a.finish());
    if (d->dataset != "fashion_mnist")
      return Status::invalid("data.augment transforms images; data.dataset \"" + d->dataset +
                             "\" has none (use it with \"fashion_mnist\")");
  }
  d->path = resolve_path(d->path, base_dir);
  return Status::ok();
}

Status parse_train(const json& j, TrainConfig* t) {
  JsonObjectReader r(j, "train");
  r.integer("steps", &t->steps, 1);
  r.integer("batch_size", &t->batch_size, 1);
  r.integer("micro_batches", &t->micro_batches, 1);
  r.integer("seq_len", &t->seq_len, 1);
  int64_t seed = static_cast<int64_t>(t->seed);
  r.integer("seed", &seed, 0);
  t->seed = static_cast<uint64_t>(seed);
  r.integer("log_every", &t->log_every, 1);
  r.integer("eval_every", &t->eval_every, 0);
  r.integer("eval_batches", &t->eval_batches, 1);
  r.integer("threads", &t->threads, 0, 1024);
  r.string("checkpoint", &t->checkpoint);
  r.integer("save_every", &t->save_every, 0);
  r.integer("keep_checkpoints", &t->keep_checkpoints, 0);
  r.boolean("async_save", &t->async_save);
  std::string nonfinite = "stop";
  r.choice("on_nonfinite", &nonfinite, {"stop", "skip"});
  t->skip_nonfinite = nonfinite == "skip";
  r.number("bucket_mib", &t->bucket_mib, 1.0 / 1024, 4096);
  r.boolean("overlap_comm", &t->overlap_comm);
  std::string recompute = "none";
  r.choice("recompute", &recompute, {"none", "full", "selective", "ops"});
  r.ignore({"recompute_ops", "recompute_layers"});
  MF_RETURN_IF_ERROR(r.finish());
  t->recompute.mode = recompute == "full"        ? RecomputePolicy::kFull
                      : recompute == "selective" ? RecomputePolicy::kSelective
                      : recompute == "ops"       ? RecomputePolicy::kOps
                                                 : RecomputePolicy::kNone;
  if (j.contains("recompute_layers")) {
    const json& layers = j.at("recompute_layers");
    const std::string want =
        "a list of block numbers or cell names, like [0, 1] or [\"encoder.stages.*\"]";
    if (!layers.is_array())
      return Status::invalid("train.recompute_layers must be " + want + ", got " +
                             json_type_name(layers));
    for (const json& l : layers) {
      if (l.is_string()) {
        t->recompute_cells.push_back(l.get<std::string>());
      } else if (l.is_number_integer() && l.get<int64_t>() >= 0 &&
                 l.get<int64_t>() <= std::numeric_limits<int>::max()) {
        t->recompute.layers.push_back(static_cast<int>(l.get<int64_t>()));
      } else {
        return Status::invalid(
            "train.recompute_layers entries must be block numbers >= 0 or "
            "cell names, got " +
            l.dump());
      }
    }
  }
  if (j.contains("recompute_ops")) {
    const json& ops = j.at("recompute_ops");
    if (!ops.is_array())
      return Status::invalid(
          "train.recompute_ops must be a list of node names or globs like "
          "[\"h.*.mlp.*\"], got " +
          json_type_name(ops));
    for (const json& o : ops) {
      if (!o.is_string())
        return Status::invalid("train.recompute_ops entries must be strings, got " +
                               json_type_name(o));
      t->recompute.op_names.push_back(o.get<std::string>());
    }
  }
  if ((t->recompute.mode == RecomputePolicy::kOps) != !t->recompute.op_names.empty())
    return Status::invalid(
        "train.recompute \"ops\" goes with train.recompute_ops (a list of node names); give both "
        "or neither");
  if (t->batch_size % t->micro_batches != 0)
    return Status::invalid(
        "train.batch_size=" + std::to_string(t->batch_size) +
        " is not divisible by train.micro_batches=" + std::to_string(t->micro_batches) +
        "; use a micro_batches that divides the batch");
  return Status::ok();
}

}  // namespace

Status parse_optimizer(const json& j, OptimizerConfig* o, LrSchedule* s, int steps) {
  JsonObjectReader r(j, "optimizer");
  std::string type = "adamw", schedule = "cosine";
  r.choice("type", &type, {"adamw", "sgd"});
  using Bound = JsonObjectReader::Bound;
  r.number("lr", &o->lr, 0.0, 10.0, Bound::kExclusive);
  float min_lr = 0.f;
  r.number("min_lr", &min_lr, 0.0, 10.0);
  int warmup = 0;
  r.integer("warmup_steps", &warmup, 0);
  r.choice("schedule", &schedule, {"cosine", "constant", "linear"});
  r.number("weight_decay", &o->weight_decay, 0.0, 10.0);
  // eps divides (AdamW's sqrt(v) + eps): 0 makes 0/0 = NaN in the weights.
  r.number("eps", &o->eps, 0.0, 1.0, Bound::kExclusive);
  // momentum 1 never forgets a gradient: the update grows without bound.
  r.number("momentum", &o->momentum, 0.0, 1.0, Bound::kInclusive, Bound::kExclusive);
  r.boolean("nesterov", &o->nesterov);
  r.number("grad_clip", &o->grad_clip, 0.0, 1e9);
  if (r.has("betas")) {
    const json& b = j.at("betas");
    if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number() ||
        b[0].get<double>() < 0 || b[0].get<double>() >= 1 || b[1].get<double>() < 0 ||
        b[1].get<double>() >= 1)
      r.fail("optimizer.betas must be an array of two numbers in [0, 1), e.g. [0.9, 0.999], got " +
             b.dump());
    else {
      o->beta1 = b[0].get<float>();
      o->beta2 = b[1].get<float>();
    }
  }
  r.ignore({"betas"});
  MF_RETURN_IF_ERROR(r.finish());
  if (min_lr > o->lr)
    return Status::invalid("optimizer.min_lr=" + number_text(min_lr) + " must be <= optimizer.lr=" +
                           number_text(o->lr) + " (the schedule decays from lr to min_lr)");
  if (static_cast<double>(o->lr) * o->weight_decay >= 1.0)
    return Status::invalid("optimizer.weight_decay=" + number_text(o->weight_decay) +
                           " times optimizer.lr=" + number_text(o->lr) +
                           " must be < 1 (each step scales the weights by 1 - lr * "
                           "weight_decay); lower one of them");
  if (type == "sgd" && r.has("betas"))
    return Status::invalid("optimizer.betas applies to adamw only (optimizer.type is \"sgd\")");
  o->kind = type == "sgd" ? OptimizerKind::kSgd : OptimizerKind::kAdamW;
  s->lr = o->lr;
  s->min_lr = min_lr;
  s->warmup_steps = warmup;
  s->total_steps = steps;
  s->kind = schedule == "constant" ? LrSchedule::Kind::kConstant
            : schedule == "linear" ? LrSchedule::Kind::kLinear
                                   : LrSchedule::Kind::kCosine;
  return Status::ok();
}

Result<RunConfig> parse_run_config(const json& doc, const std::string& base_dir) {
  RunConfig rc;
  JsonObjectReader r(doc, "config");
  r.required("model");
  r.required("data");
  json data = json::object(), train = json::object(), optim = json::object(),
       offload = json::object();
  r.object("data", &data);
  r.object("train", &train);
  r.object("optimizer", &optim);
  r.object("offload", &offload);
  // "plan": the planner's metadata in a `meshflow plan --out` file (cluster, prediction).
  r.ignore({"model", "description", "parallel", "plan"});
  MF_RETURN_IF_ERROR(r.finish());
  if (doc.contains("parallel")) {
    MF_ASSIGN_OR_RETURN(rc.parallel, parse_strategy_config(doc.at("parallel"), "parallel"));
    rc.has_parallel = true;
  }

  const json& m = doc.at("model");
  if (m.is_string()) {
    std::string p = resolve_path(m.get<std::string>(), base_dir);
    Result<json> model = read_json_file(p);
    if (!model.is_ok()) return model.status().with_context("config.model");
    rc.model = *model;
    rc.model_source = p;
  } else if (m.is_object()) {
    rc.model = m;
    rc.model_source = "config.model";
  } else {
    return Status::invalid(
        "config.model must be a model object or the path of a model JSON file, got " +
        json_type_name(m));
  }
  MF_RETURN_IF_ERROR(parse_data(data, &rc.data, base_dir));
  MF_RETURN_IF_ERROR(parse_train(train, &rc.train));
  MF_RETURN_IF_ERROR(parse_optimizer(optim, &rc.optimizer, &rc.schedule, rc.train.steps));
  MF_RETURN_IF_ERROR(parse_offload(offload, &rc.offload, base_dir));
  rc.document = doc;
  rc.document["model"] = rc.model;
  return rc;
}

Result<RunConfig> load_run_config(const std::string& path,
                                  const std::vector<std::string>& overrides) {
  MF_ASSIGN_OR_RETURN(json doc, read_json_file(path));
  for (const std::string& o : overrides) MF_RETURN_IF_ERROR(apply_override(doc, o));
  std::string base = fs::path(path).parent_path().string();
  Result<RunConfig> rc = parse_run_config(doc, base);
  if (!rc.is_ok()) return rc.status().with_context(path);
  return rc;
}

}  // namespace meshflow
