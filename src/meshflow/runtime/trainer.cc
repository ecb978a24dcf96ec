#include "meshflow/runtime/trainer.h"

#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/data/fashion_mnist.h"
#include "meshflow/data/text.h"
#include "meshflow/io/safetensors.h"
#include "meshflow/models/from_config.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/optim/optimizer.h"

namespace meshflow {

void set_compute_threads(int threads) {
  int n = threads > 0 ? threads : omp_get_num_procs();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int ranks_on_this_machine(const Communicator* comm) {
  if (!comm) return 1;
  if (comm->transport().backend() == "local") return comm->size();
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  return local ? std::max(1, std::atoi(local)) : 1;
}

Result<ModelGraph> build_model_from_json(const json& model, int64_t batch, int64_t seq) {
  MF_ASSIGN_OR_RETURN(ModelConfig cfg, parse_model_config(model));
  return build_model(cfg, batch, seq);
}

Result<std::unique_ptr<Dataset>> make_dataset(const DataConfig& d, bool language_model, int seq_len,
                                              uint64_t seed) {
  if (d.dataset == "fashion_mnist") {
    if (language_model)
      return Status::invalid(
          "data.dataset \"fashion_mnist\" feeds images and labels, but the model is a "
          "language model; use \"fortunes\"");
    FashionMnistOptions o;
    if (!d.path.empty()) o.dir = d.path;
    MF_ASSIGN_OR_RETURN(FashionMnist ds, FashionMnist::load(o));
    return std::unique_ptr<Dataset>(new FashionMnist(std::move(ds)));
  }
  if (!language_model)
    return Status::invalid(
        "data.dataset \"fortunes\" feeds byte tokens, but the model is a classifier; use "
        "\"fashion_mnist\"");
  TextOptions o;
  if (!d.path.empty()) o.dir = d.path;
  o.seq_len = seq_len;
  o.eval_fraction = d.eval_fraction;
  o.split_seed = seed;
  MF_ASSIGN_OR_RETURN(TextDataset ds, TextDataset::from_fortunes(o));
  return std::unique_ptr<Dataset>(new TextDataset(std::move(ds)));
}

namespace {
double flops_of(const Graph& g, const std::vector<NodeId>& order) {
  double f = 0;
  for (NodeId id : order) f += op_cost(g, g.node(id)).flops;
  return f;
}
}  // namespace

Result<std::unique_ptr<Trainer>> Trainer::create(const RunConfig& rc,
                                                 std::shared_ptr<Communicator> comm) {
  std::unique_ptr<Trainer> t(new Trainer());
  t->rc_ = rc;
  t->comm_ = comm;
  t->rank_ = comm ? comm->rank() : 0;
  t->world_ = comm ? comm->size() : 1;
  const TrainConfig& tc = rc.train;
  // The machine's threads are shared among the ranks running on it.
  const int threads = tc.threads > 0 ? tc.threads : omp_get_num_procs();
  set_compute_threads(std::max(1, threads / ranks_on_this_machine(comm.get())));
  if (tc.batch_size % (tc.micro_batches * t->world_) != 0)
    return Status::invalid("train.batch_size=" + std::to_string(tc.batch_size) +
                           " does not split into " + std::to_string(tc.micro_batches) +
                           " micro-batches on " + std::to_string(t->world_) +
                           " ranks; use a multiple of micro_batches x ranks = " +
                           std::to_string(tc.micro_batches * t->world_));
  t->global_micro_batch_ = tc.batch_size / tc.micro_batches;
  t->micro_batch_ = t->global_micro_batch_ / t->world_;

  Result<ModelGraph> m = build_model_from_json(rc.model, t->micro_batch_, tc.seq_len);
  if (!m.is_ok()) return m.status().with_context(rc.model_source);
  t->model_ = std::move(m).value();
  Graph& g = t->model_.graph;
  t->language_model_ = g.find("tokens") != kNoValue;
  t->num_params_ = count_parameters(g);
  append_backward(g);
  append_optimizer(g, rc.optimizer);
  Status v = verify(g);
  if (!v.is_ok()) return Status::internal("training graph failed verification: " + v.message());

  MF_ASSIGN_OR_RETURN(t->data_, make_dataset(rc.data, t->language_model_, tc.seq_len, tc.seed));
  for (const std::string& name : t->data_->input_names())
    if (g.find(name) == kNoValue)
      return Status::invalid("data.dataset \"" + rc.data.dataset + "\" provides '" + name +
                             "', which model " + rc.model_source + " does not take; use " +
                             (t->language_model_ ? "\"fortunes\" for a language model"
                                                 : "\"fashion_mnist\" for a classifier"));
  ExecutorOptions eo;
  eo.seed = tc.seed;
  t->executor_ = std::make_unique<Executor>(g, eo);
  if (tc.micro_batches > 1 || t->world_ > 1) {
    t->buckets_ = std::make_unique<GradientBuckets>(g, t->executor_->forward_backward_order(), comm,
                                                    static_cast<int64_t>(tc.bucket_mib * (1 << 20)),
                                                    tc.overlap_comm);
    t->executor_->add_grad_accumulator_bytes(t->buckets_->bytes());
  }
  t->flops_per_micro_ = flops_of(g, t->executor_->forward_backward_order());
  t->flops_optimizer_ = flops_of(g, t->executor_->optimizer_order());
  return t;
}

float Trainer::all_reduce_mean(float v) {
  if (world_ == 1) return v;
  throw_if_error(comm_->all_reduce(&v, 1, ReduceOp::kSum));
  return v / static_cast<float>(world_);
}

void Trainer::feed_batch(const Batch& b) {
  for (const auto& [name, tensor] : b.tensors) throw_if_error(executor_->feed(name, tensor));
}

StepResult Trainer::step() {
  const TrainConfig& tc = rc_.train;
  const Graph& g = model_.graph;
  Executor& ex = *executor_;
  const int m = tc.micro_batches;
  auto t0 = std::chrono::steady_clock::now();
  StepResult r;
  r.lr = rc_.schedule.at(step_);
  double loss_sum = 0;
  // The backward seed averages over micro-batches and ranks, so the summed
  // (all-reduced) gradient is the gradient of the global batch's mean loss.
  ex.feed_scalar("loss_scale", 1.f / static_cast<float>(m * world_));
  const Shard shard{rank_, world_};
  for (int micro = 0; micro < m; ++micro) {
    BatchIndex at;
    at.seed = tc.seed;
    at.step = step_;
    at.micro = micro;
    at.micro_batches = m;
    feed_batch(value_or_throw(data_->train_batch(at, global_micro_batch_, shard)));
    // Dropout: one stream per micro-batch; this rank's rows draw their global
    // elements of it, so the masks are those of one device.
    const int32_t rng[2] = {static_cast<int32_t>(step_ * m + micro), rank_};
    if (g.find("rng_offset") != kNoValue)
      throw_if_error(ex.feed_data("rng_offset", rng, sizeof rng));
    if (buckets_)
      ex.run(ex.forward_backward_order(), [&](NodeId id) { buckets_->on_node(ex, id, micro, m); });
    else
      ex.run(ex.forward_backward_order());
    loss_sum += ex.scalar(g.loss);
  }
  if (buckets_) {
    throw_if_error(buckets_->finish(ex));
    r.comm_wait_seconds = buckets_->last_wait_seconds();
  }
  ex.feed_scalar("lr", r.lr);
  ex.feed_scalar("step", static_cast<float>(step_ + 1));
  ex.run(ex.optimizer_order());
  r.grad_norm = ex.scalar(g.outputs.at("grad_norm"));
  ex.unbind_all();
  ++step_;
  r.step = step_;
  r.loss = all_reduce_mean(static_cast<float>(loss_sum / m));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.items = static_cast<int64_t>(tc.batch_size) * (language_model_ ? tc.seq_len : 1);
  r.flops = flops_per_micro_ * m + flops_optimizer_;
  return r;
}

EvalResult Trainer::evaluate() {
  const Graph& g = model_.graph;
  Executor& ex = *executor_;
  EvalResult e;
  double loss_sum = 0, correct = 0;
  int64_t batches = 0;
  const bool has_correct = g.outputs.count("correct") > 0;
  const int64_t per_batch =
      static_cast<int64_t>(global_micro_batch_) * (language_model_ ? rc_.train.seq_len : 1);
  ex.feed_scalar_i32("rng_offset", -1);  // evaluation: dropout off
  for (EvalIterator it = data_->eval(global_micro_batch_, {rank_, world_}, rc_.train.eval_batches);
       !it.done();) {
    feed_batch(it.next());
    ex.run(ex.eval_order());
    loss_sum += ex.scalar(g.loss);
    if (has_correct) correct += ex.scalar(g.outputs.at("correct"));
    ++batches;
  }
  if (world_ > 1) {
    // Every rank evaluated its slice of the same batches: sum and average.
    float sums[2] = {static_cast<float>(loss_sum), static_cast<float>(correct)};
    throw_if_error(comm_->all_reduce(sums, 2, ReduceOp::kSum));
    loss_sum = sums[0] / world_;
    correct = sums[1];
  }
  e.items = batches * per_batch;
  e.loss = batches ? static_cast<float>(loss_sum / batches) : 0.f;
  if (has_correct && !language_model_ && e.items > 0)
    e.accuracy = static_cast<float>(correct / e.items);
  return e;
}

// Every rank holds the same weights: rank 0 writes.
Status Trainer::save_checkpoint(const std::string& path) {
  return rank_ == 0 ? save_parameters(*executor_, path) : Status::ok();
}
Status Trainer::load_checkpoint(const std::string& path) {
  return load_parameters(*executor_, path).status();
}

}  // namespace meshflow
