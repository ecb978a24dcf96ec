#include "meshflow/engine/trainer.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/comm/transport.h"
#include "meshflow/data/fashion_mnist.h"
#include "meshflow/data/text.h"
#include "meshflow/engine/faults.h"
#include "meshflow/io/safetensors.h"
#include "meshflow/models/from_config.h"
#include "meshflow/models/hf_weights.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/verify.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/parallel/configured.h"
#include "meshflow/parallel/seq_balance.h"

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
    o.crop_padding = d.crop_padding;
    o.flip = d.flip;
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

Status check_dataset_fits(const Dataset& data, const Graph& g, const DataConfig& d,
                          const std::string& model_source, bool language_model) {
  MF_ASSIGN_OR_RETURN(const Batch one, data.train_batch(BatchIndex{}, 1));
  for (const auto& [name, t] : one.tensors) {
    const ValueId v = g.find(name);
    if (v == kNoValue)
      return Status::invalid("data.dataset \"" + d.dataset + "\" provides '" + name +
                             "', which model " + model_source + " does not take; use " +
                             (language_model ? "\"fortunes\" for a language model"
                                             : "\"fashion_mnist\" for a classifier"));
    const Shape& want = g.shape(v);
    if (language_model || want.rank() != t.shape().rank()) continue;  // sequences: seq_len decides
    for (int k = 1; k < want.rank(); ++k)
      if (want.size(k) != t.shape().size(k))
        return Status::invalid(
            "data.dataset \"" + d.dataset + "\" feeds '" + name + "' with " +
            std::to_string(t.shape().size(k)) + " " + want.name(k) + " per example, but model " +
            model_source + " takes " + std::to_string(want.size(k)) +
            " (a ResNet takes image_size x image_size x num_channels: 28 x 28 x 1 for "
            "Fashion-MNIST; an MLP input_dim 784)");
  }
  // Every value the data feeds has a row of each embedding table it indexes
  // and a logit of each loss it is the target of (the kernels would stop the
  // run on the first that has none). A table indexed by anything else (a
  // position) is the model's own business.
  const int64_t classes = data.classes();
  std::vector<ValueId> fed;
  for (const std::string& name : data.input_names()) fed.push_back(g.find(name));
  auto is_fed = [&](ValueId v) { return std::find(fed.begin(), fed.end(), v) != fed.end(); };
  for (const Node& n : g.nodes()) {
    if (n.phase != Phase::kForward || n.inputs.size() < 2 || !is_fed(n.inputs[1])) continue;
    int64_t width = -1;
    if (n.kind == OpKind::kEmbedding) width = g.shape(n.inputs[0]).size(0);
    if (n.kind == OpKind::kCrossEntropy) {
      const Shape& logits = g.shape(n.inputs[0]);
      width = logits.size(logits.rank() - 1);
    }
    if (width < 0 || width >= classes) continue;
    return Status::invalid(
        "model " + model_source + " has " + std::to_string(width) +
        (language_model ? " tokens in its vocabulary (" : " classes (") + "'" + n.name +
        "'), but data.dataset \"" + d.dataset + "\" feeds " +
        (language_model ? "byte tokens 0.." : "labels 0..") + std::to_string(classes - 1) +
        "; set the model's " +
        (language_model ? "vocab_size" : "num_classes (an MLP) or num_labels (a ResNet)") +
        " to at least " + std::to_string(classes));
  }
  return Status::ok();
}

namespace {
// Microseconds since a process-wide origin (the trace's clock; every rank thread shares it).
double trace_now_us() {
  static const std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin)
      .count();
}

double flops_of(const Graph& g, const std::vector<NodeId>& order) {
  double f = 0;
  for (NodeId id : order) f += op_cost(g, g.node(id)).flops;
  return f;
}
}  // namespace

Result<std::unique_ptr<Trainer>> Trainer::create(const RunConfig& rc,
                                                 std::shared_ptr<Communicator> comm,
                                                 const PartitionOptions* partition) {
  MF_ASSIGN_OR_RETURN(const Job job, resolve_job(rc, comm ? comm->size() : 1));
  if (job.pipeline)
    return Status::invalid("parallel.pipeline with " + std::to_string(job.pipeline->stages) +
                           " stages runs on the pipeline engine; build the engine the job calls "
                           "for with make_engine (engine/job.h)");
  return create(job, std::move(comm), partition);
}

Result<std::unique_ptr<Trainer>> Trainer::create(const Job& job, std::shared_ptr<Communicator> comm,
                                                 const PartitionOptions* partition) {
  MF_CHECK(!job.pipeline) << "Trainer::create: a pipelined job (make_engine builds its engine)";
  std::unique_ptr<Trainer> t(new Trainer());
  t->rc_ = job.rc;
  t->seq_zigzag_ = job.seq_zigzag;
  t->describe_ = job.describe();
  t->comm_ = comm;
  t->rank_ = comm ? comm->rank() : 0;
  t->world_ = comm ? comm->size() : 1;
  MF_CHECK_EQ(t->world_, job.world) << "Trainer::create: the job was resolved for another world";
  t->micro_batch_ = job.micro_batch_rows;
  const TrainConfig& tc = job.rc.train;
  // The machine's threads are shared among the ranks running on it.
  const int threads = tc.threads > 0 ? tc.threads : omp_get_num_procs();
  set_compute_threads(std::max(1, threads / ranks_on_this_machine(comm.get())));
  if (partition || job.partitioned) {
    MF_RETURN_IF_ERROR(t->init_partitioned(job.mesh, job.reshard_cost, partition));
  } else {
    MF_RETURN_IF_ERROR(t->init_one_rank());
  }
  return t;
}

// One rank, nothing split: the training graph as it is.
Status Trainer::init_one_rank() {
  MF_ASSIGN_OR_RETURN(model_, build_training_graph(rc_, micro_batch_));
  return init_executor(model_.graph, nullptr);
}

// What both paths share once the program is built: the data, the executor,
// the gradient buckets (accumulation over micro-batches and the gradient
// reductions of a partitioned program, overlapped with the backward).
Status Trainer::init_executor(const Graph& program, const MeshComms* comms) {
  const TrainConfig& tc = rc_.train;
  const Graph& g = model_.graph;
  language_model_ = g.find("tokens") != kNoValue;
  num_params_ = count_parameters(g);
  MF_ASSIGN_OR_RETURN(data_, make_dataset(rc_.data, language_model_, tc.seq_len, tc.seed));
  MF_RETURN_IF_ERROR(check_dataset_fits(*data_, g, rc_.data, rc_.model_source, language_model_));
  ExecutorOptions eo;
  eo.seed = tc.seed;
  // The gradient all_reduces run in the buckets, not as the executor's nodes.
  const std::vector<GradientSync> syncs = gradient_syncs(program);
  for (const GradientSync& s : syncs)
    eo.run_elsewhere.insert(eo.run_elsewhere.end(), s.reduce.begin(), s.reduce.end());
  eo.offload = rc_.offload;
  MF_RETURN_IF_ERROR(
      Executor::check_fits_in_memory(program, eo.offload).with_context(rc_.model_source));
  MF_RETURN_IF_ERROR(check_offload(program, eo.offload));
  executor_ = std::make_unique<Executor>(program, eo);
  executor_->set_mesh_comms(comms);
  if (tc.micro_batches > 1 || !eo.run_elsewhere.empty()) {
    buckets_ = std::make_unique<GradientBuckets>(
        program, executor_->forward_backward_order(), syncs, comms,
        static_cast<int64_t>(tc.bucket_mib * (1 << 20)), tc.overlap_comm);
    executor_->add_grad_accumulator_bytes(buckets_->bytes());
  }
  flops_per_micro_ = flops_of(program, executor_->forward_backward_order());
  flops_optimizer_ = flops_of(program, executor_->optimizer_order());
  return Status::ok();
}

Result<ModelGraph> build_training_graph(const RunConfig& rc, int64_t micro_batch,
                                        int64_t seq_zigzag) {
  Result<ModelGraph> m = build_model_from_json(rc.model, micro_batch, rc.train.seq_len);
  if (!m.is_ok()) return m.status().with_context(rc.model_source);
  ModelGraph model = std::move(m).value();
  if (seq_zigzag > 1) {
    Result<SeqBalance> sb = balance_sequence(model.graph, seq_zigzag);
    if (!sb.is_ok()) return sb.status().with_context("parallel.ring_order \"zigzag\"");
    model.seq_zigzag = sb->ranks;
    model.zigzag_inputs = sb->inputs;
  }
  append_backward(model.graph);
  MF_RETURN_IF_ERROR(
      apply_recompute(model.graph, rc.train.recompute).with_context("train.recompute"));
  append_optimizer(model.graph, rc.optimizer);
  MF_RETURN_IF_ERROR(verify(model.graph).with_context("training graph"));
  return model;
}

Tensor feed_block(const ModelGraph& m, const std::string& name, const Tensor& whole,
                  const Mesh& mesh, const Layout& layout, int rank) {
  const auto it = m.zigzag_inputs.find(name);
  if (it == m.zigzag_inputs.end()) return local_block(whole, mesh, layout, rank);
  return local_block(zigzag_tensor(whole, it->second, m.seq_zigzag), mesh, layout, rank);
}

// The SPMD path: the whole graph, annotated and lowered for this rank.
Status Trainer::init_partitioned(const Mesh& mesh, const ReshardCostModel& cost,
                                 const PartitionOptions* given) {
  const StrategyConfig& pc = rc_.parallel;
  MF_ASSIGN_OR_RETURN(model_, build_training_graph(rc_, micro_batch_, seq_zigzag_));
  Graph& g = model_.graph;

  PartitionOptions o = given ? *given : partition_options(pc, mesh);
  if (!given) o.cost = cost;
  if (given) {
    Result<Annotation> a = annotate(g, mesh, o);
    if (!a.is_ok()) return a.status().with_context("parallel");
    annotation_ = std::move(*a);
  } else {
    MF_ASSIGN_OR_RETURN(annotation_, annotate_config(g, mesh, pc, rc_.model_source, &o.cost));
  }
  MF_ASSIGN_OR_RETURN(LocalProgram p, lower(g, annotation_, rank_, o.cost));
  program_ = std::make_unique<LocalProgram>(std::move(p));
  for (const Node& n : g.nodes())
    if (n.kind == OpKind::kCrossEntropy) count_targets_ = g.value(n.inputs[1]).name;

  std::shared_ptr<Communicator> world = comm_;
  if (!world) {
    self_comm_ = Communicator::world(make_local_transports(1)[0]);
    world = self_comm_;
  }
  MF_ASSIGN_OR_RETURN(MeshComms mc, MeshComms::make(world, mesh));
  mesh_comms_ = std::make_unique<MeshComms>(std::move(mc));
  return init_executor(program_->graph, mesh_comms_.get());
}

Result<std::map<std::string, Tensor>> Trainer::gather_parameters() {
  std::map<std::string, Tensor> out;
  const Graph& pg = program_graph();
  for (ValueId v : pg.model_values()) {
    Tensor& local = executor_->storage(v);
    if (!program_) {
      out.emplace(pg.value(v).name, local);
      continue;
    }
    const ValueId gv = program_->global_of[v];
    const Layout& l = program_->layout[v];
    const Mesh& mesh = program_->mesh;
    Tensor whole(model_.graph.shape(gv), DType::F32);
    std::vector<float> all(static_cast<size_t>(local.numel()) * mesh.num_ranks());
    Communicator& world = *(comm_ ? comm_ : self_comm_);
    MF_RETURN_IF_ERROR(world.all_gather(local.data<float>(), local.numel(), all.data()));
    for (int r = 0; r < mesh.num_ranks(); ++r) {
      Tensor block(local.shape(), DType::F32);
      block.copy_from(all.data() + static_cast<size_t>(r) * local.numel());
      place_block(block, mesh, l, r, &whole);
    }
    out.emplace(pg.value(v).name, std::move(whole));
  }
  return out;
}

// The batch is whole; a partitioned program's rank feeds its block of each input.
void Trainer::feed_batch(const Batch& b) {
  if (!program_) {
    for (const auto& [name, tensor] : b.tensors) throw_if_error(executor_->feed(name, tensor));
    return;
  }
  for (const auto& [name, tensor] : b.tensors) {
    const ValueId gv = model_.graph.find(name);
    MF_CHECK_NE(gv, kNoValue) << name;
    const Layout& l = annotation_.produced(model_.graph, gv);
    throw_if_error(
        executor_->feed(name, feed_block(model_, name, tensor, program_->mesh, l, rank_)));
    if (name == count_targets_) {
      const int32_t* t = tensor.data<int32_t>();
      int64_t valid = 0;
      for (int64_t i = 0; i < tensor.numel(); ++i) valid += t[i] >= 0;
      executor_->feed_scalar("loss_count", static_cast<float>(valid));
    }
  }
}

StepResult Trainer::step() {
  const TrainConfig& tc = rc_.train;
  const Graph& g = program_graph();
  Executor& ex = *executor_;
  const int m = tc.micro_batches;
  auto t0 = std::chrono::steady_clock::now();
  StepResult r;
  r.lr = rc_.schedule.at(step_);
  double loss_sum = 0;
  for (int micro = 0; micro < m; ++micro) {
    feed_micro_batch(micro);
    if (buckets_)
      run_traced(
          ex.forward_backward_order(), [&](NodeId id) { buckets_->on_node(ex, id, micro, m); },
          micro);
    else
      run_traced(ex.forward_backward_order(), {}, micro);
    loss_sum += ex.scalar(g.loss);
  }
  if (buckets_) {
    const double wait0 = trace_ ? trace_now_us() : 0;
    throw_if_error(buckets_->finish(ex));
    if (trace_) trace_span("gradient all-reduce (wait)", "collective", wait0, -1);
    r.comm_wait_seconds = buckets_->last_wait_seconds();
  }
  ex.feed_scalar("lr", r.lr);
  ex.feed_scalar("step", static_cast<float>(step_ + 1));
  // The gradient norm first (every node up to the clip coefficient), then,
  // when the loss and the norm are finite, the updates: a non-finite step
  // changes no weight.
  if (norm_order_.empty() && update_order_.empty()) split_optimizer_order();
  run_traced(norm_order_, {}, -1);
  r.grad_norm = ex.scalar(g.outputs.at("grad_norm"));
  r.loss = static_cast<float>(loss_sum / m);
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
    std::string first;  // this rank's first parameter with a non-finite gradient
    for (NodeId id : norm_order_) {
      const Node& n = g.node(id);
      const size_t at = n.name.rfind("sumsq.");
      if (n.kind == OpKind::kSumSquares && at != std::string::npos &&
          !std::isfinite(ex.scalar(n.outputs[0]))) {
        first = n.name.substr(at + 6);
        break;
      }
    }
    r.nonfinite = nonfinite_message(step_ + 1, r.loss, r.grad_norm, first);
    if (!rc_.train.skip_nonfinite) {
      // The run ends: find where the first non-finite value came from (every
      // rank does, the norm being global, so their collectives match).
      const std::string node = first_nonfinite_node();
      ex.unbind_all();
      throw StatusError(Status::failed_precondition(
          r.nonfinite + (node.empty() ? "" : "; the first non-finite value: " + node) +
          nonfinite_advice()));
    }
    r.skipped = true;
  } else {
    run_traced(update_order_, {}, -1);
  }
  ex.unbind_all();
  ++step_;
  r.step = step_;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.items = static_cast<int64_t>(tc.batch_size) * (language_model_ ? tc.seq_len : 1);
  r.flops = flops_per_micro_ * m + flops_optimizer_;
  return r;
}

EvalResult Trainer::evaluate() {
  const Graph& g = program_graph();
  Executor& ex = *executor_;
  EvalResult e;
  double loss_sum = 0, correct = 0;
  int64_t batches = 0;
  const bool has_correct = g.outputs.count("correct") > 0;
  const int64_t per_batch =
      static_cast<int64_t>(micro_batch_) * (language_model_ ? rc_.train.seq_len : 1);
  ex.feed_scalar_i32("rng_offset", -1);  // evaluation: dropout off
  // train.eval_batches whole batches, run as this plan's micro-batches (the
  // same examples and mean whatever the micro-batching or data parallelism).
  for (EvalIterator it =
           data_->eval_as_micro_batches(rc_.train.batch_size, micro_batch_, rc_.train.eval_batches);
       !it.done();) {
    feed_batch(it.next());
    ex.run(ex.eval_order());
    loss_sum += ex.scalar(g.loss);
    if (has_correct) correct += ex.scalar(g.outputs.at("correct"));
    ++batches;
  }
  e.items = batches * per_batch;
  e.loss = batches ? static_cast<float>(loss_sum / batches) : 0.f;
  if (has_correct && !language_model_ && e.items > 0)
    e.accuracy = static_cast<float>(correct / e.items);
  return e;
}

// One rank writes its weights; a partitioned program's shards are gathered
// (every rank takes part) and rank 0 writes.
Status Trainer::save_checkpoint(const std::string& path) {
  if (!program_) return rank_ == 0 ? save_parameters(*executor_, path) : Status::ok();
  MF_ASSIGN_OR_RETURN(auto whole, gather_parameters());
  if (rank_ != 0) return Status::ok();
  NamedTensors named;
  for (auto& [name, t] : whole) named.emplace_back(name, std::move(t));
  return write_safetensors(path, named);
}

Result<SafetensorsFile> read_weights(const std::string& path, const RunConfig& rc,
                                     const Graph& global, bool* converted) {
  MF_ASSIGN_OR_RETURN(SafetensorsFile f, read_safetensors(path));
  MF_RETURN_IF_ERROR(check_finite_weights(f, path));
  *converted = false;
  Result<ModelConfig> model = parse_model_config(rc.model);
  if (!model.is_ok() || !is_hf_state_dict(*model, f.tensors)) return f;
  std::map<std::string, Shape> shapes;
  for (ValueId v : global.parameters()) shapes.emplace(global.value(v).name, global.shape(v));
  Result<std::map<std::string, Tensor>> ours = from_hf_state_dict(*model, f.tensors, shapes);
  if (!ours.is_ok()) return ours.status().with_context("'" + path + "'");
  f.tensors = std::move(ours).value();
  *converted = true;
  return f;
}

Status Trainer::load_checkpoint(const std::string& path) {
  bool hf = false;
  MF_ASSIGN_OR_RETURN(SafetensorsFile f, read_weights(path, rc_, model_.graph, &hf));
  if (!program_ && !hf) return load_parameters(*executor_, path).status();
  const Graph& pg = program_graph();
  // Check everything before changing anything.
  for (ValueId v : pg.model_values()) {
    const std::string& name = pg.value(v).name;
    auto it = f.tensors.find(name);
    const Shape& want = program_ ? model_.graph.shape(program_->global_of[v]) : pg.shape(v);
    if (it == f.tensors.end())
      return Status::not_found("checkpoint '" + path + "': parameter '" + name + "' is missing");
    if (!it->second.shape().same_sizes(want) || it->second.dtype() != DType::F32)
      return Status::invalid("checkpoint '" + path + "': parameter '" + name + "' has shape " +
                             it->second.shape().to_string() + " in the file but " +
                             want.to_string() + " in the model");
  }
  for (ValueId v : pg.model_values()) {
    const Tensor& whole = f.tensors.at(pg.value(v).name);
    if (!program_) {
      executor_->storage(v).copy_from(whole.raw());
      continue;
    }
    Tensor block = local_block(whole, program_->mesh, program_->layout[v], rank_);
    executor_->storage(v).copy_from(block.raw());
  }
  return Status::ok();
}

void Trainer::feed_micro_batch(int micro) {
  const TrainConfig& tc = rc_.train;
  const Graph& g = program_graph();
  Executor& ex = *executor_;
  const int m = tc.micro_batches;
  // The backward seed averages over micro-batches (the program's loss is
  // already the mean over the global micro-batch).
  ex.feed_scalar("loss_scale",
                 nan_injected(rank_, step_, micro) ? std::nanf("") : 1.f / static_cast<float>(m));
  BatchIndex at;
  at.seed = tc.seed;
  at.step = step_;
  at.micro = micro;
  at.micro_batches = m;
  feed_batch(value_or_throw(data_->train_batch(at, micro_batch_, Shard{0, 1})));
  // Dropout: one stream per micro-batch; a rank's block draws its global
  // elements of it, so the masks are those of one device.
  const int32_t rng[2] = {static_cast<int32_t>(step_ * m + micro), 0};
  if (g.find("rng_offset") != kNoValue) throw_if_error(ex.feed_data("rng_offset", rng, sizeof rng));
}

std::string Trainer::first_nonfinite_node() {
  Executor& ex = *executor_;
  const Graph& g = program_graph();
  const TrainConfig& tc = rc_.train;
  const int m = tc.micro_batches;
  // Every micro-batch is replayed, in order, as the step ran it (its batch,
  // its dropout stream, its seed), whether or not an earlier one was found
  // non-finite: every rank replays the same nodes, so a partitioned
  // program's collectives match whichever rank finds what. The first
  // micro-batch that produces a non-finite value names it: the gradients
  // accumulate over the micro-batches, so a later one can poison them alone.
  std::string found;
  for (int micro = 0; micro < m; ++micro) {
    feed_micro_batch(micro);
    ex.run(ex.forward_backward_order(), [&](NodeId id) {
      if (!found.empty()) return;
      const Node& n = g.node(id);
      for (ValueId v : n.outputs) {
        if (g.value(v).dtype != DType::F32) continue;
        const float* p = ex.data_f(v);
        const int64_t count = g.shape(v).numel();
        for (int64_t i = 0; i < count; ++i)
          if (!std::isfinite(p[i])) {
            found = "node '" + n.name + "' (" + std::string(op_name(n.kind)) + ", " +
                    (n.phase == Phase::kForward    ? std::string("forward")
                     : n.phase == Phase::kBackward ? std::string("backward")
                                                   : std::string(phase_name(n.phase))) +
                    ") of micro-batch " + std::to_string(micro) + " on rank " +
                    std::to_string(rank_);
            return;
          }
      }
    });
  }
  return found;
}

// The optimizer's nodes before and after the clip coefficient (the norm).
void Trainer::split_optimizer_order() {
  const Graph& g = program_graph();
  bool past = false;
  for (NodeId id : executor_->optimizer_order()) {
    (past ? update_order_ : norm_order_).push_back(id);
    if (g.node(id).kind == OpKind::kClipCoef) past = true;
  }
  if (!past) std::swap(norm_order_, update_order_);  // no norm: all of it is the update
}

// ---- Full-state checkpoints ----

std::vector<StateBlock> Trainer::state_blocks() {
  const Graph& pg = program_graph();
  const std::vector<ValueId> buf = pg.buffers();
  const std::set<ValueId> buffers(buf.begin(), buf.end());
  std::vector<StateBlock> out;
  for (ValueId v : persistent_values(pg)) {
    Tensor* storage = &executor_->storage(v);
    const std::string kind = state_kind(pg, v, buffers);
    if (!program_) {
      out.push_back(state_block(pg.value(v).name, kind, pg.shape(v), Mesh::line(1, "dp"),
                                Layout::Replicated(1), 0, storage));
      continue;
    }
    const ValueId gv = program_->global_of[v];
    MF_CHECK_GE(gv, 0) << "checkpoint: '" << pg.value(v).name << "' has no global value";
    // Weights grouping: a grouped optimizer state is on its owner alone.
    const WeightGroups& wg = annotation_.groups;
    const int sole_axis = kind == "optimizer" && wg.owner_of(gv) >= 0 ? wg.axis : -1;
    out.push_back(state_block(model_.graph.value(gv).name, kind, model_.graph.shape(gv),
                              program_->mesh, program_->layout[v], rank_, storage, sole_axis));
  }
  return out;
}

Status Trainer::save_state(const std::string& root, int keep) {
  Communicator* world = comm_ ? comm_.get() : nullptr;
  return meshflow::save_state(world, root, step_, state_blocks(),
                              state_info(rc_, step_, world_, describe_), keep);
}

Result<std::unique_ptr<BackgroundSave>> Trainer::start_save_state(const std::string& root,
                                                                  int keep) {
  Communicator* world = comm_ ? comm_.get() : nullptr;
  return BackgroundSave::start(world, root, step_, state_blocks(),
                               state_info(rc_, step_, world_, describe_), keep);
}

Status Trainer::load_state(const std::string& path) {
  Communicator* world = comm_ ? comm_.get() : nullptr;
  MF_ASSIGN_OR_RETURN(CheckpointManifest m,
                      meshflow::load_state(world, path, state_blocks(), state_names(model_.graph)));
  step_ = static_cast<int>(m.step);
  return Status::ok();
}

// ---- Trace hook (meshflow train --trace) ----

void Trainer::set_trace(TraceWriter* trace) {
  trace_ = trace;
  if (trace_) trace_track_ = trace_->track(rank_, "rank " + std::to_string(rank_), 0, "compute");
}

void Trainer::trace_span(const std::string& name, const char* category, double start_us,
                         int micro) {
  std::vector<std::pair<std::string, std::string>> args;
  if (micro >= 0) args.push_back({"micro_batch", std::to_string(micro)});
  trace_->span(trace_track_, name, category, start_us, trace_now_us() - start_us, std::move(args));
}

// Consecutive nodes of one phase make one span ("forward mb=0", "backward
// mb=0", "optimizer"); each collective node gets its own span named after it.
void Trainer::run_traced(const std::vector<NodeId>& order,
                         const std::function<void(NodeId)>& after_node, int micro) {
  Executor& ex = *executor_;
  if (!trace_) {
    ex.run(order, after_node);
    return;
  }
  const Graph& g = ex.graph();
  const std::string mb = micro >= 0 ? " mb=" + std::to_string(micro) : "";
  double seg_start = trace_now_us(), prev_end = seg_start;
  Phase seg_phase = Phase::kForward;
  bool open = false;
  auto flush = [&](double end) {
    if (!open) return;
    const char* phase = seg_phase == Phase::kForward     ? "forward"
                        : seg_phase == Phase::kBackward  ? "backward"
                        : seg_phase == Phase::kOptimizer ? "optimizer"
                                                         : "metric";
    std::vector<std::pair<std::string, std::string>> args;
    if (micro >= 0) args.push_back({"micro_batch", std::to_string(micro)});
    trace_->span(trace_track_, phase + mb, phase, seg_start, end - seg_start, std::move(args));
    open = false;
  };
  ex.run(order, [&](NodeId id) {
    if (after_node) after_node(id);
    const double t = trace_now_us();
    const Node& n = g.node(id);
    if (is_collective(n.kind)) {
      flush(prev_end);
      trace_->span(trace_track_, std::string(op_name(n.kind)) + " " + n.name, "collective",
                   prev_end, t - prev_end, {{"node", n.name}});
    } else if (!open || n.phase != seg_phase) {
      flush(prev_end);
      seg_start = prev_end;
      seg_phase = n.phase;
      open = true;
    }
    prev_end = t;
  });
  flush(prev_end);
}

}  // namespace meshflow
