#include "meshflow/engine/pipeline_trainer.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/autodiff/recompute.h"
#include "meshflow/comm/transport.h"
#include "meshflow/engine/faults.h"
#include "meshflow/io/safetensors.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/parallel/reshard_exec.h"
#include "meshflow/runtime/grad_buckets.h"

namespace meshflow {

namespace {

using Clock = std::chrono::steady_clock;

// Channels are keyed by (peer stage, kind); outgoing ones by (peer + kOutgoing, kind).
constexpr int kOutgoing = 1 << 16;

// Microseconds since a process-wide origin (shared by every rank's thread).
double now_us() {
  static const Clock::time_point origin = Clock::now();
  return std::chrono::duration<double, std::micro>(Clock::now() - origin).count();
}

int64_t value_bytes(const Graph& g, ValueId v) {
  return g.shape(v).numel() * static_cast<int64_t>(dtype_size(g.value(v).dtype));
}

// One direction of one kind of message to one peer, on its own 2-rank group
// (sender = group rank 0). The sender thread sends queued messages in order.
class Channel {
 public:
  explicit Channel(std::shared_ptr<Communicator> comm, bool sender) : comm_(std::move(comm)) {
    if (sender) thread_ = std::thread([this] { loop(); });
  }
  ~Channel() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void push(std::vector<float> msg) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(msg));
      ++pending_;
    }
    cv_.notify_all();
  }
  // Waits until every queued message is sent; the first send error.
  Status flush() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return pending_ == 0; });
    return status_;
  }
  Status recv(float* data, int64_t count) { return comm_->recv(data, count, 0); }
  struct Sent {
    int micro, chunk;
    double start_us, end_us;
  };
  std::vector<Sent> take_sent() {
    std::lock_guard<std::mutex> lk(mu_);
    return std::exchange(sent_, {});
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::vector<float> msg = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      const double t0 = now_us();
      Status s = status_.is_ok() ? comm_->send(msg.data(), static_cast<int64_t>(msg.size()), 1)
                                 : Status::ok();
      const double t1 = now_us();
      lk.lock();
      if (status_.is_ok() && !s.is_ok()) status_ = s;
      sent_.push_back({static_cast<int>(msg[0]), static_cast<int>(msg[1]), t0, t1});
      --pending_;
      cv_.notify_all();
    }
  }
  std::shared_ptr<Communicator> comm_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::vector<float>> queue_;
  std::vector<Sent> sent_;
  int pending_ = 0;
  bool stop_ = false;
  Status status_;
};

// A stashed tensor's bytes (not zero-filled: a copy overwrites them).
struct StashBuffer {
  std::unique_ptr<char[]> bytes;
  int64_t size = 0;
  char* data() const { return bytes.get(); }
};

// One stashed tensor per entry of ChunkProgram::stash (or weight_stash).
struct Stash {
  std::vector<StashBuffer> data;
  std::vector<char> live;
};

// Freed stash buffers by size, reused by the next micro-batch's stash: a
// step allocates its peak stash once, not once per micro-batch (fresh pages
// to fault in and free again each time).
class StashPool {
 public:
  StashBuffer take(int64_t size) {
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      StashBuffer b = std::move(it->second.back());
      it->second.pop_back();
      return b;
    }
    return StashBuffer{std::make_unique_for_overwrite<char[]>(static_cast<size_t>(size)), size};
  }
  void give(StashBuffer b) {
    if (b.bytes) free_[b.size].push_back(std::move(b));
  }

 private:
  std::unordered_map<int64_t, std::vector<StashBuffer>> free_;
};

}  // namespace

struct PipelineTrainer::Impl {
  RunConfig rc;
  ModelGraph model;  // the full training graph (for FLOPs and messages)
  PipelineSplit split;
  std::unique_ptr<Dataset> data;
  std::shared_ptr<Communicator> world, pp;
  int p = 1, m = 1;
  int micro_rows = 0;  // rows of one micro-batch (the global graph's)
  bool language_model = true;
  double flops_per_micro = 0, flops_optimizer = 0;
  int64_t num_params = 0;
  int threads_per_rank = 1;
  int step = 0;
  TraceWriter* trace = nullptr;
  // Each stage is the partitioned program of the whole model on its sub-mesh
  // (data mode: the plan "batch on dp"); world rank = stage * S + sub_rank.
  Mesh submesh = Mesh::line(1, "dp");
  int sub_rank = 0, sub_size = 1;
  Annotation annotation;
  std::unique_ptr<LocalProgram> program;
  std::shared_ptr<Communicator> stage_comm;
  std::unique_ptr<MeshComms> mesh_comms;
  std::string count_targets;  // the cross-entropy's targets input (loss_count)
  int track_compute = -1, track_send = -1;

  struct Local {
    const ChunkProgram* program = nullptr;
    std::unique_ptr<Executor> ex;
    std::unique_ptr<GradientBuckets> buckets;
    std::vector<NodeId> sum_squares, update;     // the program's, without what buckets runs
    std::vector<NodeId> eval_forward;            // forward without state updates (evaluation)
    std::vector<int> stash_index, weight_index;  // value id -> entry, -1
    std::vector<char> in_place, copied;          // per stash entry (stash_in_place), and not
    std::map<int, Stash> stash, weight_stash;    // by micro-batch
    int live_micro = 0;
  };
  std::vector<Local> locals;  // this rank's chunks, in chunk order
  std::vector<int> local_of;  // chunk -> index in locals, -1
  std::map<std::pair<int, int>, std::unique_ptr<Channel>> channels;  // (peer stage, kind)
  std::map<int, Batch> batches;  // this step's micro-batches, by index
  // Messages between two chunks of this rank (zb-v's chunks p-1 and p), by
  // (receiving chunk, micro-batch, 0 activation | 1 gradient): held until the
  // consumer runs, since in between the receiving chunk may run other
  // micro-batches, whose backward restores their own inputs into the arena.
  std::map<std::tuple<int, int, int>, std::vector<float>> handoff;
  std::vector<float> buffer;
  int64_t stash_bytes = 0;
  double stash_copy_us = 0;  // save's and run_backward's copies (stash_copy_seconds)
  StashPool pool;
  int stash_entries = 0;
  double loss_sum = 0;
  // Set while a non-finite step is replayed to find where it began: this
  // rank's earliest non-finite node output, by (micro-batch, forward before
  // backward, chunk in dataflow order), and what it was.
  bool watch = false;
  float found_key = std::numeric_limits<float>::infinity();
  std::string found;

  // The replay's finding agreed over every rank: the smallest key's (ties:
  // the lowest rank's), sent from its rank as characters.
  std::string earliest_found() {
    if (!world || world->size() == 1) return found;
    float best[1] = {-found_key};
    throw_if_error(world->all_reduce(best, 1, ReduceOp::kMax));
    if (!std::isfinite(best[0])) return "";
    float owner[1] = {found_key == -best[0] ? -static_cast<float>(world->rank())
                                            : -std::numeric_limits<float>::infinity()};
    throw_if_error(world->all_reduce(owner, 1, ReduceOp::kMax));
    const int root = static_cast<int>(-owner[0]);
    std::vector<float> text(256, 0.f);
    if (world->rank() == root)
      for (size_t i = 0; i < found.size() && i + 1 < text.size(); ++i)
        text[i] = static_cast<float>(static_cast<unsigned char>(found[i]));
    throw_if_error(world->broadcast(text.data(), static_cast<int64_t>(text.size()), root));
    std::string s;
    for (float ch : text) {
      if (ch == 0.f) break;
      s += static_cast<char>(static_cast<int>(ch));
    }
    return s;
  }

  // The replay's check of node `id` of chunk c (micro-batch mb, backward or not).
  void check_finite(Local& l, NodeId id, int c, int mb, bool backward, int C) {
    const float key =
        static_cast<float>((mb * 2 + (backward ? 1 : 0)) * C + (backward ? C - 1 - c : c));
    if (key >= found_key) return;
    const Graph& g = l.program->graph;
    const Node& n = g.node(id);
    for (ValueId v : n.outputs) {
      if (g.value(v).dtype != DType::F32) continue;
      const float* p = l.ex->data_f(v);
      const int64_t count = g.shape(v).numel();
      for (int64_t i = 0; i < count; ++i)
        if (!std::isfinite(p[i])) {
          found_key = key;
          found = "node '" + n.name + "' (" + std::string(op_name(n.kind)) + ", " +
                  (backward ? "backward" : "forward") + ") of micro-batch " + std::to_string(mb) +
                  " in pipeline chunk " + std::to_string(c) + " on rank " +
                  std::to_string(world ? world->rank() : 0);
          return;
        }
    }
  }

  Local& local(int chunk) {
    MF_CHECK_GE(local_of[chunk], 0) << "chunk " << chunk << " is not on this rank";
    return locals[local_of[chunk]];
  }
  void span(const std::string& name, const char* category, double t0, int micro, int chunk) {
    if (!trace) return;
    trace->span(track_compute, name, category, t0, now_us() - t0,
                {{"micro_batch", std::to_string(micro)}, {"chunk", std::to_string(chunk)}});
  }
  const Batch& batch(int micro) {
    auto it = batches.find(micro);
    if (it != batches.end()) return it->second;
    BatchIndex at;
    at.seed = rc.train.seed;
    at.step = step;
    at.micro = micro;
    at.micro_batches = m;
    return batches[micro] = value_or_throw(data->train_batch(at, micro_rows, Shard{0, 1}));
  }
  void feed_inputs(Local& l, int micro) {
    feed_batch(l, batch(micro), static_cast<int32_t>(step * m + micro));
  }
  // rng: the dropout stream of this micro-batch; -1 turns dropout off (evaluation).
  void feed_batch(Local& l, const Batch& b, int32_t rng_stream) {
    const Graph& g = l.program->graph;
    for (const auto& [name, t] : b.tensors) {
      if (g.find(name) == kNoValue) continue;
      // The micro-batch is whole; this rank feeds its block.
      const Layout& layout = annotation.produced(model.graph, model.graph.find(name));
      throw_if_error(l.ex->feed(name, feed_block(model, name, t, submesh, layout, sub_rank)));
    }
    if (g.find("loss_count") != kNoValue) {
      // A loss whose rows are sharded divides by the whole micro-batch's valid targets.
      const Tensor& t = b.get(count_targets);
      const int32_t* tp = t.data<int32_t>();
      int64_t valid = 0;
      for (int64_t i = 0; i < t.numel(); ++i) valid += tp[i] >= 0;
      l.ex->feed_scalar("loss_count", static_cast<float>(valid));
    }
    if (g.find("rng_offset") != kNoValue) {
      const int32_t rng[2] = {rng_stream, 0};
      throw_if_error(l.ex->feed_data("rng_offset", rng, sizeof rng));
    }
  }

  // Messages: [micro, chunk, payload of each value in order].
  std::vector<float> pack(Local& l, const std::vector<ValueId>& values, int micro, int chunk) {
    const Graph& g = l.program->graph;
    int64_t n = 2;
    for (ValueId v : values) n += value_bytes(g, v) / 4;
    std::vector<float> msg(n);
    msg[0] = static_cast<float>(micro);
    msg[1] = static_cast<float>(chunk);
    int64_t at = 2;
    for (ValueId v : values) {
      std::memcpy(msg.data() + at, l.ex->data(v), value_bytes(g, v));
      at += value_bytes(g, v) / 4;
    }
    return msg;
  }
  void unpack(Local& l, const std::vector<ValueId>& values, const float* msg) {
    const Graph& g = l.program->graph;
    int64_t at = 2;
    for (ValueId v : values) {
      std::memcpy(l.ex->data(v), msg + at, value_bytes(g, v));
      at += value_bytes(g, v) / 4;
    }
  }
  void receive(Local& l, const std::vector<ValueId>& values, int micro, int chunk, int peer,
               int kind, const char* what) {
    const Graph& g = l.program->graph;
    int64_t n = 2;
    for (ValueId v : values) n += value_bytes(g, v) / 4;
    buffer.resize(n);
    const double t0 = now_us();
    throw_if_error(channels.at({peer, kind})->recv(buffer.data(), n));
    if (trace)
      trace->span(track_compute, std::string(what) + " mb=" + std::to_string(micro), "recv", t0,
                  now_us() - t0,
                  {{"micro_batch", std::to_string(micro)}, {"from_stage", std::to_string(peer)}});
    MF_CHECK(static_cast<int>(buffer[0]) == micro && static_cast<int>(buffer[1]) == chunk)
        << what << " for mb=" << micro << " chunk=" << chunk << " received mb=" << buffer[0]
        << " chunk=" << buffer[1];
    unpack(l, values, buffer.data());
  }

  // F's stash entries written in place: each bound to a buffer of the
  // micro-batch's stash before the forward writes it (ChunkProgram::stash_in_place).
  void bind_stash(Local& l, int micro) {
    const Graph& g = l.program->graph;
    const std::vector<ValueId>& values = l.program->stash;
    Stash& s = l.stash[micro];
    s.data.resize(values.size());
    s.live.assign(values.size(), 0);
    for (size_t i = 0; i < values.size(); ++i) {
      if (!l.in_place[i]) continue;
      const int64_t b = value_bytes(g, values[i]);
      pool.give(std::move(s.data[i]));
      s.data[i] = pool.take(b);
      l.ex->bind(values[i], s.data[i].data());
      s.live[i] = 1;
      stash_bytes += b;
    }
  }
  // Back to the arena: the next run of this executor writes those values there.
  void unbind_stash(Local& l) {
    for (size_t i = 0; i < l.program->stash.size(); ++i)
      if (l.in_place[i]) l.ex->bind(l.program->stash[i], nullptr);
  }

  // Copies `values` (those flagged in keep; all when keep is null) out of the
  // arena into the micro-batch's stash; the stash's other entries stay.
  void save(Local& l, std::map<int, Stash>& where, const std::vector<ValueId>& values,
            const std::vector<char>* keep, int micro) {
    const double t0 = now_us();
    const Graph& g = l.program->graph;
    Stash& s = where[micro];
    if (s.data.size() != values.size()) {
      s.data.resize(values.size());
      s.live.assign(values.size(), 0);
    }
    for (size_t i = 0; i < values.size(); ++i) {
      if (keep && !(*keep)[i]) continue;
      const int64_t b = value_bytes(g, values[i]);
      pool.give(std::move(s.data[i]));
      s.data[i] = pool.take(b);
      std::memcpy(s.data[i].data(), l.ex->data(values[i]), b);
      s.live[i] = 1;
      stash_bytes += b;
    }
    stash_copy_us += now_us() - t0;
  }
  // Frees the entries not flagged in keep (all when keep is null).
  void release(std::map<int, Stash>& where, const std::vector<char>* keep, int micro) {
    auto it = where.find(micro);
    if (it == where.end()) return;
    Stash& s = it->second;
    bool any = false;
    for (size_t i = 0; i < s.data.size(); ++i) {
      if (s.live[i] && (!keep || !(*keep)[i])) {
        stash_bytes -= s.data[i].size;
        pool.give(std::move(s.data[i]));
        s.data[i] = StashBuffer{};
        s.live[i] = 0;
      }
      any = any || s.live[i];
    }
    if (!any) where.erase(it);
  }

  // Runs nodes one by one, first copying back each stashed input it reads.
  void run_backward(Local& l, const std::vector<NodeId>& nodes, int micro) {
    Executor& ex = *l.ex;
    const Graph& g = l.program->graph;
    Stash* fwd = l.stash.count(micro) ? &l.stash[micro] : nullptr;
    Stash* bwd = l.weight_stash.count(micro) ? &l.weight_stash[micro] : nullptr;
    std::vector<char> restored_f(fwd ? fwd->data.size() : 0, 0),
        restored_w(bwd ? bwd->data.size() : 0, 0);
    // A copy back, timed (stash_copy_seconds).
    auto copy_in = [&](ValueId v, const StashBuffer& b) {
      const double t0 = now_us();
      std::memcpy(ex.data(v), b.data(), b.size);
      stash_copy_us += now_us() - t0;
    };
    std::vector<NodeId> one(1);
    for (NodeId id : nodes) {
      for (ValueId v : g.node(id).inputs) {
        const int wi = l.weight_index[v], fi = l.stash_index[v];
        if (wi >= 0 && bwd && bwd->live[wi] && !restored_w[wi]) {
          copy_in(v, bwd->data[wi]);
          restored_w[wi] = 1;
        } else if (fi >= 0 && !(wi >= 0 && bwd && bwd->live[wi])) {
          MF_CHECK(fwd && fwd->live[fi]) << "stash of '" << g.value(v).name << "' for mb " << micro
                                         << " was freed before its backward";
          if (!restored_f[fi]) {
            if (l.in_place[fi])
              ex.bind(v, fwd->data[fi].data());
            else
              copy_in(v, fwd->data[fi]);
            restored_f[fi] = 1;
          }
        }
      }
      one[0] = id;
      ex.run(one, [&](NodeId n) {
        l.buckets->on_node(ex, n, micro, m);
        if (watch)
          check_finite(l, n, l.program->chunk, micro, true, static_cast<int>(split.chunks.size()));
      });
    }
    unbind_stash(l);
  }

  Tensor& param(Local& l, const std::string& name) {
    const ValueId v = l.program->graph.find(name);
    MF_CHECK_NE(v, kNoValue) << "chunk " << l.program->chunk << " has no parameter " << name;
    return l.ex->storage(v);
  }
  // Tied parameters: the owner chunk's updated values replace the copies
  // (same order on every rank of the pipeline: one message per copy).
  void sync_tied(const Schedule& s, int stage) {
    for (const PipelineSplit::Tied& t : split.tied) {
      const int owner_rank = s.rank_of_chunk(t.owner);
      for (int c : t.copies) {
        const int copy_rank = s.rank_of_chunk(c);
        Tensor* src = stage == owner_rank ? &param(local(t.owner), t.name) : nullptr;
        Tensor* dst = stage == copy_rank ? &param(local(c), t.name) : nullptr;
        if (src && dst)
          dst->copy_from(src->raw());
        else if (src)
          throw_if_error(pp->send(src->data<float>(), src->numel(), copy_rank));
        else if (dst)
          throw_if_error(pp->recv(dst->data<float>(), dst->numel(), owner_rank));
      }
    }
  }

  void note_stash(int chunk_local) {
    StashStats& st = *stats;
    st.peak_bytes = std::max(st.peak_bytes, stash_bytes);
    st.peak_entries = std::max(st.peak_entries, stash_entries);
    st.peak_per_chunk[chunk_local] =
        std::max(st.peak_per_chunk[chunk_local], locals[chunk_local].live_micro);
  }
  StashStats* stats = nullptr;

  void take_handoff(Local& l, int chunk, int micro, int kind) {
    auto it = handoff.find({chunk, micro, kind});
    MF_CHECK(it != handoff.end()) << (kind ? "gradient" : "activation") << " for mb=" << micro
                                  << " chunk=" << chunk
                                  << " from this rank's other chunk is missing";
    unpack(l, kind ? l.program->grad_in : l.program->act_in, it->second.data());
    handoff.erase(it);
  }

  void run_action(const Action& a, const Schedule& s) {
    const int c = a.chunk, mb = a.micro, C = s.num_chunks();
    switch (a.kind) {
      case ActionKind::kRecvAct: {
        Local& l = local(c);
        receive(l, l.program->act_in, mb, c, a.peer, 0, "recv_act");
        break;
      }
      case ActionKind::kRecvGrad: {
        Local& l = local(c);
        receive(l, l.program->grad_in, mb, c, a.peer, 1, "recv_grad");
        break;
      }
      case ActionKind::kSendAct:
      case ActionKind::kSendGrad: {
        const bool act = a.kind == ActionKind::kSendAct;
        Local& l = local(c);
        channels.at({a.peer, act ? 0 : 1})
            ->push(
                pack(l, act ? l.program->act_out : l.program->grad_out, mb, act ? c + 1 : c - 1));
        break;
      }
      case ActionKind::kForward: {
        Local& l = local(c);
        const double t0 = now_us();
        if (c > 0 && s.rank_of_chunk(c - 1) == s.rank_of_chunk(c)) take_handoff(l, c, mb, 0);
        feed_inputs(l, mb);
        bind_stash(l, mb);
        if (watch)
          l.ex->run(l.program->forward, [&](NodeId n) { check_finite(l, n, c, mb, false, C); });
        else
          l.ex->run(l.program->forward);
        if (l.program->loss != kNoValue) loss_sum += l.ex->scalar(l.program->loss);
        save(l, l.stash, l.program->stash, &l.copied, mb);
        unbind_stash(l);
        ++l.live_micro;
        ++stash_entries;
        note_stash(local_of[c]);
        // The next chunk on this rank (one stage, several chunks): its input, held.
        if (c + 1 < C && s.rank_of_chunk(c + 1) == s.rank_of_chunk(c))
          handoff[{c + 1, mb, 0}] = pack(l, l.program->act_out, mb, c + 1);
        span("F mb=" + std::to_string(mb) + " c=" + std::to_string(c), "forward", t0, mb, c);
        break;
      }
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput: {
        Local& l = local(c);
        const bool split = a.kind == ActionKind::kBackwardInput;
        const double t0 = now_us();
        if (c + 1 < C && s.rank_of_chunk(c + 1) == s.rank_of_chunk(c)) take_handoff(l, c, mb, 1);
        run_backward(l, split ? l.program->backward_input : l.program->backward, mb);
        if (split) {
          save(l, l.weight_stash, l.program->weight_stash, nullptr, mb);
          release(l.stash, &l.program->stash_for_weight, mb);
        } else {
          release(l.stash, nullptr, mb);
          --l.live_micro;
          --stash_entries;
        }
        if (c > 0 && s.rank_of_chunk(c - 1) == s.rank_of_chunk(c))
          handoff[{c - 1, mb, 1}] = pack(l, l.program->grad_out, mb, c - 1);
        note_stash(local_of[c]);
        span(std::string(split ? "Bi" : "B") + " mb=" + std::to_string(mb) +
                 " c=" + std::to_string(c),
             "backward", t0, mb, c);
        break;
      }
      case ActionKind::kBackwardWeight: {
        Local& l = local(c);
        const double t0 = now_us();
        run_backward(l, l.program->backward_weight, mb);
        release(l.stash, nullptr, mb);
        release(l.weight_stash, nullptr, mb);
        --l.live_micro;
        --stash_entries;
        span("W mb=" + std::to_string(mb) + " c=" + std::to_string(c), "weight_grad", t0, mb, c);
        break;
      }
    }
  }
};

PipelineTrainer::PipelineTrainer() : impl_(new Impl) {}
PipelineTrainer::~PipelineTrainer() = default;

const ChunkProgram& PipelineTrainer::chunk_program(int local) const {
  return *impl_->locals.at(local).program;
}
Executor& PipelineTrainer::executor(int local) {
  return *impl_->locals.at(local).ex;
}

void PipelineTrainer::set_trace(TraceWriter* trace) {
  Impl& im = *impl_;
  im.trace = trace;
  if (!trace) return;
  const int w = im.world ? im.world->rank() : 0;
  const std::string name = "rank " + std::to_string(w) + " (stage " + std::to_string(stage_) +
                           ", dp " + std::to_string(dp_rank_) + ")";
  im.track_compute = trace->track(w, name, 0, "compute");
  im.track_send = trace->track(w, name, 1, "send");
}

std::vector<std::pair<std::string, const Tensor*>> PipelineTrainer::parameters() {
  std::vector<std::pair<std::string, const Tensor*>> out;
  for (auto& l : impl_->locals)
    for (ValueId p : l.program->graph.model_values())
      out.push_back({l.program->graph.value(p).name, &l.ex->storage(p)});
  return out;
}

int64_t PipelineTrainer::num_parameters() const {
  return impl_->num_params;
}
bool PipelineTrainer::is_language_model() const {
  return impl_->language_model;
}
// Every stage's ranks run the partitioned program: the job's FLOPs.
double PipelineTrainer::flops_scale() const {
  return 1.0;
}
const Mesh& PipelineTrainer::stage_mesh() const {
  return impl_->submesh;
}

// Each stage all-gathers its shards over its sub-mesh (every rank of the
// stage takes part); the stage's sub-mesh rank 0 then sends the whole
// parameters (chunk order, graph order within a chunk, one message per stage)
// to world rank 0, which knows every chunk's parameter list from the split.
Result<std::map<std::string, Tensor>> PipelineTrainer::gather_parameters() {
  Impl& im = *impl_;
  const Graph& g = im.model.graph;
  std::map<std::string, Tensor> out;
  std::vector<std::pair<std::string, Tensor>> whole;
  for (auto& [name, local] : parameters()) {
    const ValueId gv = g.find(name);
    MF_CHECK_NE(gv, kNoValue) << name;
    const Layout& layout = im.annotation.produced(g, gv);
    std::vector<float> all(static_cast<size_t>(local->numel()) * im.sub_size);
    MF_RETURN_IF_ERROR(im.stage_comm->all_gather(local->data<float>(), local->numel(), all.data()));
    if (im.sub_rank != 0) continue;
    Tensor w(g.shape(gv), DType::F32);
    for (int r = 0; r < im.sub_size; ++r) {
      Tensor block(local->shape(), DType::F32);
      block.copy_from(all.data() + static_cast<size_t>(r) * local->numel());
      place_block(block, im.submesh, layout, r, &w);
    }
    whole.emplace_back(name, std::move(w));
  }
  if (im.sub_rank != 0) return out;
  const int me = im.world ? im.world->rank() : 0;
  if (me != 0) {
    std::vector<float> msg;
    for (auto& [name, t] : whole)
      msg.insert(msg.end(), t.data<float>(), t.data<float>() + t.numel());
    MF_RETURN_IF_ERROR(im.world->send(msg.data(), static_cast<int64_t>(msg.size()), 0));
    return out;
  }
  for (auto& [name, t] : whole) out.emplace(name, std::move(t));
  for (int s = 1; s < im.p; ++s) {
    std::vector<std::pair<std::string, Shape>> expect;
    int64_t n = 0;
    for (int c = 0; c < schedule_.num_chunks(); ++c) {
      if (schedule_.rank_of_chunk(c) != s) continue;
      const Graph& cg = im.split.chunks[c].graph;
      for (ValueId v : cg.model_values()) {
        const Shape& shape = g.shape(g.find(cg.value(v).name));
        expect.push_back({cg.value(v).name, shape});
        n += shape.numel();
      }
    }
    std::vector<float> msg(n);
    MF_RETURN_IF_ERROR(im.world->recv(msg.data(), n, s * im.sub_size));
    int64_t at = 0;
    for (auto& [name, shape] : expect) {
      Tensor t(shape, DType::F32);
      t.copy_from(msg.data() + at);
      at += shape.numel();
      out.emplace(name, std::move(t));
    }
  }
  return out;
}

// Evaluation runs on the plan: every eval batch flows forward through the
// chunks (activations to the next stage as in training, dropout off, nothing
// stashed); the last chunk's loss is summed and shared over the pipeline.
EvalResult PipelineTrainer::evaluate() {
  Impl& im = *impl_;
  const int C = schedule_.num_chunks();
  double loss_sum = 0, correct = 0;
  int64_t batches = 0;
  for (EvalIterator it = im.data->eval_as_micro_batches(im.rc.train.batch_size, im.micro_rows,
                                                        im.rc.train.eval_batches);
       !it.done(); ++batches) {
    const int b = static_cast<int>(it.index());
    const Batch batch = it.next();
    for (int c = 0; c < C; ++c) {
      if (schedule_.rank_of_chunk(c) != stage_) continue;
      Impl::Local& l = im.local(c);
      if (c > 0 && schedule_.rank_of_chunk(c - 1) != stage_)
        im.receive(l, l.program->act_in, b, c, schedule_.rank_of_chunk(c - 1), 0, "recv_act");
      im.feed_batch(l, batch, -1);
      l.ex->run(l.eval_forward);  // the forward without state updates
      if (l.program->loss != kNoValue) loss_sum += l.ex->scalar(l.program->loss);
      if (l.program->correct != kNoValue) {  // a classifier's argmax hits
        l.ex->run(l.program->metric);
        correct += l.ex->scalar(l.program->correct);
      }
      if (c + 1 < C) {
        const int next = schedule_.rank_of_chunk(c + 1);
        std::vector<float> msg = im.pack(l, l.program->act_out, b, c + 1);
        if (next == stage_)
          im.unpack(im.local(c + 1), im.local(c + 1).program->act_in, msg.data());
        else
          im.channels.at({next + kOutgoing, 0})->push(std::move(msg));
      }
    }
  }
  for (auto& [key, ch] : im.channels) {
    throw_if_error(ch->flush());
    if (key.first >= kOutgoing) ch->take_sent();  // not part of a step's trace
  }
  float sums[2] = {static_cast<float>(loss_sum), static_cast<float>(correct)};
  if (im.pp && im.p > 1) throw_if_error(im.pp->all_reduce(sums, 2, ReduceOp::kSum));
  EvalResult e;
  e.items = batches * im.micro_rows * (im.language_model ? im.rc.train.seq_len : 1);
  e.loss = batches ? sums[0] / static_cast<float>(batches) : 0.f;
  if (!im.language_model && e.items > 0) e.accuracy = sums[1] / static_cast<float>(e.items);
  return e;
}

Status PipelineTrainer::save_checkpoint(const std::string& path) {
  MF_ASSIGN_OR_RETURN(auto whole, gather_parameters());
  if ((impl_->world ? impl_->world->rank() : 0) != 0) return Status::ok();
  NamedTensors named;
  for (auto& [name, t] : whole) named.emplace_back(name, std::move(t));
  return write_safetensors(path, named);
}

Status PipelineTrainer::load_checkpoint(const std::string& path) {
  bool hf = false;
  MF_ASSIGN_OR_RETURN(SafetensorsFile f, read_weights(path, impl_->rc, impl_->model.graph, &hf));
  std::vector<std::pair<std::string, Tensor*>> params;
  for (auto& l : impl_->locals)
    for (ValueId p : l.program->graph.model_values())
      params.push_back({l.program->graph.value(p).name, &l.ex->storage(p)});
  Impl& im = *impl_;
  const Graph& g = im.model.graph;
  for (auto& [name, t] : params) {  // check everything before changing anything
    auto it = f.tensors.find(name);
    const Shape& want = g.shape(g.find(name));
    if (it == f.tensors.end())
      return Status::not_found("checkpoint '" + path + "': parameter '" + name + "' is missing");
    if (!it->second.shape().same_sizes(want) || it->second.dtype() != DType::F32)
      return Status::invalid("checkpoint '" + path + "': parameter '" + name + "' has shape " +
                             it->second.shape().to_string() + " in the file but " +
                             want.to_string() + " in the model");
  }
  for (auto& [name, t] : params) {
    const Tensor& whole = f.tensors.at(name);
    const Layout& layout = im.annotation.produced(g, g.find(name));
    t->copy_from(local_block(whole, im.submesh, layout, im.sub_rank).raw());
  }
  return Status::ok();
}

std::vector<StateBlock> PipelineTrainer::state_blocks() {
  Impl& im = *impl_;
  const Graph& pg = im.program->graph;     // the stage's program on its sub-mesh
  const Graph& g = im.model.graph;         // the whole training graph
  std::map<std::string, int> first_chunk;  // the chunks in order: the first holder writes
  for (const ChunkProgram& c : im.split.chunks)
    for (ValueId v : persistent_values(c.graph))
      first_chunk.emplace(c.graph.value(v).name, c.chunk);
  std::vector<StateBlock> out;
  for (auto& l : im.locals) {
    const Graph& cg = l.program->graph;
    const std::vector<ValueId> buf = cg.buffers();
    const std::set<ValueId> buffers(buf.begin(), buf.end());
    for (ValueId v : persistent_values(cg)) {
      const std::string& name = cg.value(v).name;
      const ValueId pv = pg.find(name);
      MF_CHECK_NE(pv, kNoValue) << "checkpoint: chunk value '" << name << "' not in the program";
      const ValueId gv = im.program->global_of[pv];
      MF_CHECK_GE(gv, 0) << "checkpoint: '" << name << "' has no global value";
      StateBlock b =
          state_block(g.value(gv).name, state_kind(cg, v, buffers), g.shape(gv), im.submesh,
                      im.program->layout[pv], im.sub_rank, &l.ex->storage(v));
      b.write = b.write && first_chunk.at(name) == l.program->chunk;
      out.push_back(std::move(b));
    }
  }
  return out;
}

Status PipelineTrainer::save_state(const std::string& root, int keep) {
  Impl& im = *impl_;
  const int world = im.world ? im.world->size() : 1;
  return meshflow::save_state(im.world.get(), root, im.step, state_blocks(),
                              state_info(im.rc, im.step, world, describe_), keep);
}

Result<std::unique_ptr<BackgroundSave>> PipelineTrainer::start_save_state(const std::string& root,
                                                                          int keep) {
  Impl& im = *impl_;
  const int world = im.world ? im.world->size() : 1;
  return BackgroundSave::start(im.world.get(), root, im.step, state_blocks(),
                               state_info(im.rc, im.step, world, describe_), keep);
}

Status PipelineTrainer::load_state(const std::string& path) {
  Impl& im = *impl_;
  MF_ASSIGN_OR_RETURN(
      CheckpointManifest m,
      meshflow::load_state(im.world.get(), path, state_blocks(), state_names(im.model.graph)));
  im.step = static_cast<int>(m.step);
  return Status::ok();
}

int PipelineTrainer::steps_done() const {
  return impl_->step;
}

std::vector<double> PipelineTrainer::seconds_by_kind() const {
  std::vector<double> sum;
  for (const auto& l : impl_->locals) {
    const std::vector<double>& s = l.ex->seconds_by_kind();
    if (sum.size() < s.size()) sum.resize(s.size(), 0.0);
    for (size_t k = 0; k < s.size(); ++k) sum[k] += s[k];
  }
  return sum;
}

double PipelineTrainer::stash_copy_seconds() const {
  return impl_->stash_copy_us * 1e-6;
}

double PipelineTrainer::grad_accumulate_seconds() const {
  double s = 0;
  for (const auto& l : impl_->locals)
    if (l.buckets) s += l.buckets->accumulate_seconds();
  return s;
}

void PipelineTrainer::set_profiling(bool on) {
  for (auto& l : impl_->locals) l.ex->set_profiling(on);
}

MemoryStats PipelineTrainer::memory() const {
  MemoryStats m;
  for (const auto& l : impl_->locals) {
    MemoryStats s = l.ex->memory();
    m.params += s.params;
    m.grads += s.grads;
    m.optimizer += s.optimizer;
    m.inputs += s.inputs;
    m.arena += s.arena;
  }
  return m;
}

Result<std::unique_ptr<PipelineTrainer>> PipelineTrainer::create(
    const RunConfig& rc, const PipelineConfig& pc, std::shared_ptr<Communicator> world,
    TraceWriter* trace) {
  MF_ASSIGN_OR_RETURN(Job job, resolve_job(rc, world ? world->size() : 1, &pc));
  if (!job.pipeline) job.pipeline = pc;  // one stage: a pipeline of one all the same
  return create(job, std::move(world), trace);
}

Result<std::unique_ptr<PipelineTrainer>> PipelineTrainer::create(
    const Job& job, std::shared_ptr<Communicator> world, TraceWriter* trace) {
  MF_CHECK(job.pipeline.has_value()) << "PipelineTrainer::create: the job has no pipeline";
  const PipelineConfig& pc = *job.pipeline;
  std::unique_ptr<PipelineTrainer> t(new PipelineTrainer());
  Impl& im = *t->impl_;
  im.rc = job.rc;
  t->describe_ = job.describe();
  const RunConfig& rc = im.rc;
  im.world = world;
  t->pc_ = pc;
  const int world_size = world ? world->size() : 1, me = world ? world->rank() : 0;
  MF_CHECK_EQ(world_size, job.world) << "PipelineTrainer::create: the job was resolved for "
                                        "another world";
  im.p = pc.stages;
  // Every stage runs the partitioned program on its sub-mesh (the job's
  // mesh); a data-mode pipeline's replicas, and one rank, run the plan
  // "batch on dp" there.
  im.submesh = job.mesh;
  if (!job.partitioned) {
    use_data_parallel_plan(&im.rc.parallel, im.submesh);
    im.rc.has_parallel = true;
  }
  im.sub_size = im.submesh.num_ranks();
  MF_CHECK_EQ(im.sub_size * pc.stages, world_size) << "stage mesh " << im.submesh.to_string();
  t->stage_ = me / im.sub_size;
  im.sub_rank = me % im.sub_size;
  const int dp_axis = im.submesh.axis_index("dp");
  t->dp_rank_ = dp_axis >= 0 ? im.submesh.coords(im.sub_rank)[dp_axis] : 0;
  im.m = pc.micro_batches;
  const TrainConfig& tc = rc.train;
  MF_ASSIGN_OR_RETURN(t->schedule_,
                      make_schedule({pc.schedule, pc.stages, pc.micro_batches, pc.virtual_stages}));
  im.micro_rows = job.micro_batch_rows;
  const int threads = tc.threads > 0 ? tc.threads : omp_get_num_procs();
  im.threads_per_rank = std::max(1, threads / ranks_on_this_machine(world.get()));
  set_compute_threads(im.threads_per_rank);

  // The training graph Trainer builds, partitioned for this rank's
  // coordinate in the stage sub-mesh, then its split into chunks.
  Result<ModelGraph> m = build_training_graph(rc, im.micro_rows, job.seq_zigzag);
  if (!m.is_ok()) return m.status();
  im.model = std::move(m).value();
  Graph& g = im.model.graph;
  im.language_model = g.find("tokens") != kNoValue;
  im.num_params = count_parameters(g);
  const ReshardCostModel& cost = job.reshard_cost;
  MF_ASSIGN_OR_RETURN(im.annotation,
                      annotate_config(g, im.submesh, rc.parallel, rc.model_source, &cost));
  im.annotation.one_norm_reduction = false;  // the split exchanges the norm per parameter
  MF_ASSIGN_OR_RETURN(LocalProgram lp, lower(g, im.annotation, im.sub_rank, cost));
  im.program = std::make_unique<LocalProgram>(std::move(lp));
  for (const Node& n : g.nodes())
    if (n.kind == OpKind::kCrossEntropy) im.count_targets = g.value(n.inputs[1]).name;
  MF_ASSIGN_OR_RETURN(im.split, split_pipeline(im.program->graph, pc.stages * pc.virtual_stages,
                                               pc.layers_per_stage));
  if (pc.schedule == ScheduleKind::kZbV) {
    // zb-v's order is made for the chunks' F, Bi and W times: their FLOPs,
    // summed over the chunks (only the ratios matter; the same on every rank:
    // each holds the whole split).
    SimCosts c;
    c.forward = c.backward_input = c.backward_weight = 0;
    for (const ChunkProgram& cp : im.split.chunks) {
      const Graph& cg = cp.graph;
      for (NodeId n : cp.forward) c.forward += op_cost(cg, cg.node(n)).flops;
      for (NodeId n : cp.backward_input) c.backward_input += op_cost(cg, cg.node(n)).flops;
      for (NodeId n : cp.backward_weight) c.backward_weight += op_cost(cg, cg.node(n)).flops;
    }
    c.backward = c.backward_input + c.backward_weight;
    MF_ASSIGN_OR_RETURN(t->schedule_, make_schedule({pc.schedule, pc.stages, pc.micro_batches,
                                                     pc.virtual_stages, c}));
  }
  for (const Node& n : g.nodes()) {
    if (n.phase == Phase::kForward || n.phase == Phase::kBackward)
      im.flops_per_micro += op_cost(g, n).flops;
    if (n.phase == Phase::kOptimizer) im.flops_optimizer += op_cost(g, n).flops;
  }
  MF_ASSIGN_OR_RETURN(im.data, make_dataset(rc.data, im.language_model, tc.seq_len, tc.seed));
  MF_RETURN_IF_ERROR(check_dataset_fits(*im.data, g, rc.data, rc.model_source, im.language_model));

  // Groups: this stage's sub-mesh (its communicators per mesh axis), this
  // rank's pipeline (the ranks with the same sub-mesh coordinate, which
  // exchange their shards), and one 2-rank group per (sender, receiver, kind)
  // between neighbouring stages.
  const int p = pc.stages, s = t->stage_;
  auto rank_at = [&](int stage) { return stage * im.sub_size + im.sub_rank; };
  {
    std::shared_ptr<Communicator> w = world;
    if (!w) w = Communicator::world(make_local_transports(1)[0]);
    std::vector<int> stage_ranks;
    for (int i = 0; i < im.sub_size; ++i) stage_ranks.push_back(s * im.sub_size + i);
    MF_ASSIGN_OR_RETURN(im.stage_comm, w->split(stage_ranks));
    MF_ASSIGN_OR_RETURN(MeshComms mc, MeshComms::make(im.stage_comm, im.submesh));
    im.mesh_comms = std::make_unique<MeshComms>(std::move(mc));
    if (world && world_size > 1 && p > 1) {
      std::vector<int> pp_ranks;
      for (int i = 0; i < p; ++i) pp_ranks.push_back(rank_at(i));
      MF_ASSIGN_OR_RETURN(im.pp, world->split(pp_ranks));
    }
  }
  if (world && world_size > 1 && p > 1) {
    for (int kind = 0; kind < 2; ++kind)
      for (int src = 0; src < p; ++src)
        for (int dst = 0; dst < p; ++dst) {
          const bool neighbours = dst == (src + 1) % p || dst == (src + p - 1) % p;
          if (dst == src || !neighbours || (s != src && s != dst)) continue;
          MF_ASSIGN_OR_RETURN(auto comm, world->split({rank_at(src), rank_at(dst)}));
          // Keyed by (peer, kind); this rank sends on it when it is src.
          const int peer = s == src ? dst : src;
          auto ch = std::make_unique<Channel>(comm, s == src);
          if (s == src)
            im.channels[{peer + kOutgoing, kind}] = std::move(ch);  // outgoing
          else
            im.channels[{peer, kind}] = std::move(ch);  // incoming
        }
  }

  // This rank's chunks and their executors.
  const int C = t->schedule_.num_chunks();
  im.local_of.assign(C, -1);
  for (int c = 0; c < C; ++c) {
    if (t->schedule_.rank_of_chunk(c) != s) continue;
    t->local_chunks_.push_back(c);
    im.local_of[c] = static_cast<int>(im.locals.size());
    Impl::Local l;
    l.program = &im.split.chunks[c];
    ExecutorOptions eo;
    eo.seed = tc.seed;
    eo.fetch = l.program->keep_alive();
    const std::vector<GradientSync> syncs = gradient_syncs(l.program->graph);
    for (const GradientSync& sync : syncs)  // run by the buckets
      eo.run_elsewhere.insert(eo.run_elsewhere.end(), sync.reduce.begin(), sync.reduce.end());
    eo.offload = rc.offload;
    MF_RETURN_IF_ERROR(Executor::check_fits_in_memory(l.program->graph, eo.offload));
    MF_RETURN_IF_ERROR(check_offload(l.program->graph, eo.offload));
    l.ex = std::make_unique<Executor>(l.program->graph, eo);
    l.ex->set_mesh_comms(im.mesh_comms.get());
    std::vector<NodeId> order = l.program->forward;
    order.insert(order.end(), l.program->backward.begin(), l.program->backward.end());
    // Accumulation over micro-batches, and the chunk's gradient all_reduces
    // (over dp, or tp for replicated weights) in buckets overlapped with the backward.
    l.buckets = std::make_unique<GradientBuckets>(
        l.program->graph, order, syncs, im.mesh_comms.get(),
        static_cast<int64_t>(tc.bucket_mib * (1 << 20)), tc.overlap_comm);
    l.ex->add_grad_accumulator_bytes(l.buckets->bytes());
    for (NodeId id : l.program->forward)
      if (op_def(l.program->graph.node(id).kind).mutates == 0) l.eval_forward.push_back(id);
    l.sum_squares = l.buckets->without_replaced(l.program->sum_squares);
    l.update = l.buckets->without_replaced(l.program->update);
    const int nv = l.program->graph.num_values();
    l.stash_index.assign(nv, -1);
    l.weight_index.assign(nv, -1);
    for (size_t i = 0; i < l.program->stash.size(); ++i)
      l.stash_index[l.program->stash[i]] = static_cast<int>(i);
    for (size_t i = 0; i < l.program->weight_stash.size(); ++i)
      l.weight_index[l.program->weight_stash[i]] = static_cast<int>(i);
    l.in_place = l.program->stash_in_place();
    l.copied.assign(l.in_place.size(), 0);
    for (size_t i = 0; i < l.in_place.size(); ++i) {
      l.copied[i] = !l.in_place[i];
      MF_CHECK(!l.in_place[i] || l.ex->in_arena(l.program->stash[i]))
          << "chunk " << l.program->chunk << ": stash entry '"
          << l.program->graph.value(l.program->stash[i]).name << "' is not in the arena";
    }
    t->stash_stats_.bytes_per_micro_batch +=
        l.program->stash_bytes() +
        (t->schedule_.split_backward() ? l.program->weight_hold_bytes() : 0);
    im.locals.push_back(std::move(l));
  }
  t->stash_stats_.peak_per_chunk.assign(im.locals.size(), 0);
  im.stats = &t->stash_stats_;
  t->set_trace(trace);
  return t;
}

StepResult PipelineTrainer::step() {
  Impl& im = *impl_;
  const auto t0 = Clock::now();
  StepResult r;
  r.lr = im.rc.schedule.at(im.step);
  im.loss_sum = 0;
  im.batches.clear();
  const int me = im.world ? im.world->rank() : 0;
  for (auto& l : im.locals)
    l.ex->feed_scalar("loss_scale",
                      nan_injected(me, im.step) ? std::nanf("") : 1.f / static_cast<float>(im.m));

  // The schedule. Sends go to the outgoing channel (peer + kOutgoing).
  auto run_schedule = [&] {
    for (const Action& a : schedule_.ranks[stage_]) {
      if (a.kind == ActionKind::kSendAct || a.kind == ActionKind::kSendGrad) {
        Action out = a;
        out.peer += kOutgoing;
        im.run_action(out, schedule_);
      } else {
        im.run_action(a, schedule_);
      }
    }
    for (auto& [key, ch] : im.channels) {
      throw_if_error(ch->flush());
      if (im.trace && key.first >= kOutgoing)
        for (const auto& sent : ch->take_sent())
          im.trace->span(im.track_send,
                         std::string(key.second == 0 ? "send_act" : "send_grad") +
                             " mb=" + std::to_string(sent.micro),
                         "send", sent.start_us, sent.end_us - sent.start_us,
                         {{"micro_batch", std::to_string(sent.micro)},
                          {"to_stage", std::to_string(key.first - kOutgoing)}});
    }
  };
  run_schedule();

  // Gradients: data-parallel all-reduce per chunk, then the global norm.
  double tc0 = now_us();
  for (auto& l : im.locals) {
    throw_if_error(l.buckets->finish(*l.ex));
    r.comm_wait_seconds += l.buckets->last_wait_seconds();
  }
  std::vector<float> squares(im.split.norm_order.size(), 0.f);
  std::map<std::string, int> norm_index;
  for (size_t i = 0; i < im.split.norm_order.size(); ++i)
    norm_index[im.split.norm_order[i]] = static_cast<int>(i);
  for (auto& l : im.locals) {
    l.ex->run(l.sum_squares);
    for (const auto& [name, v] : l.program->norm_out)
      squares[norm_index.at(name)] = l.ex->scalar(v);
  }
  if (im.pp && im.p > 1)
    throw_if_error(
        im.pp->all_reduce(squares.data(), static_cast<int64_t>(squares.size()), ReduceOp::kSum));
  if (im.trace) im.trace->span(im.track_compute, "grad sync", "collective", tc0, now_us() - tc0);
  // Loss: the rank of the last chunk has it (the last stage; rank 0 under
  // zb-v's V); every rank gets the replicas' mean. With the squares, every
  // rank can tell a non-finite step before any update.
  const bool has_loss = stage_ == schedule_.rank_of_chunk(schedule_.num_chunks() - 1);
  float loss[1] = {has_loss ? static_cast<float>(im.loss_sum / im.m) : 0.f};
  if (im.pp && im.p > 1) throw_if_error(im.pp->all_reduce(loss, 1, ReduceOp::kSum));
  r.loss = loss[0];
  double sumsq = 0;
  std::string first;  // the first parameter (norm order) whose gradient is not finite
  for (size_t i = 0; i < squares.size(); ++i) {
    sumsq += squares[i];
    if (first.empty() && !std::isfinite(squares[i])) first = im.split.norm_order[i];
  }
  const bool finite = std::isfinite(r.loss) && std::isfinite(sumsq);
  if (!finite) {
    r.grad_norm = static_cast<float>(std::sqrt(sumsq));
    r.nonfinite = nonfinite_message(im.step + 1, r.loss, r.grad_norm, first);
    if (!im.rc.train.skip_nonfinite) {
      // The run ends: replay the step (every rank does, as every rank saw
      // the non-finite norm) watching each node's outputs, and name the
      // earliest non-finite one over the ranks.
      TraceWriter* trace = im.trace;
      im.trace = nullptr;
      im.watch = true;
      run_schedule();
      for (auto& l : im.locals) throw_if_error(l.buckets->finish(*l.ex));
      im.watch = false;
      im.trace = trace;
      const std::string node = im.earliest_found();
      for (auto& l : im.locals) l.ex->unbind_all();
      throw StatusError(Status::failed_precondition(
          r.nonfinite + (node.empty() ? "" : "; the first non-finite value: " + node) +
          nonfinite_advice()));
    }
    r.skipped = true;
  }
  const double to0 = now_us();
  for (auto& l : im.locals) {
    for (const auto& [name, v] : l.program->norm_in)
      *static_cast<float*>(l.ex->data(v)) = squares[norm_index.at(name)];
    l.ex->feed_scalar("lr", r.lr);
    l.ex->feed_scalar("step", static_cast<float>(im.step + 1));
    if (finite) l.ex->run(l.update);
    if (finite && l.program->graph.outputs.count("grad_norm"))
      r.grad_norm = l.ex->scalar(l.program->graph.outputs.at("grad_norm"));
    l.ex->unbind_all();
  }
  if (im.trace) im.trace->span(im.track_compute, "optimizer", "optimizer", to0, now_us() - to0);
  if (!im.split.tied.empty() && finite) {
    const double tt0 = now_us();
    im.sync_tied(schedule_, stage_);
    if (im.trace)
      im.trace->span(im.track_compute, "tied embedding sync", "collective", tt0, now_us() - tt0);
  }

  ++im.step;
  r.step = im.step;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.items =
      static_cast<int64_t>(im.rc.train.batch_size) * (im.language_model ? im.rc.train.seq_len : 1);
  r.flops = im.flops_per_micro * im.m + im.flops_optimizer;  // one replica's step
  return r;
}

}  // namespace meshflow
