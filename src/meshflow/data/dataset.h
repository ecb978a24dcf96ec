// Dataset: deterministic batches for training and a fixed held-out eval set.
//
// A training micro-batch is a pure function of (seed, step, micro-batch index)
// and the global micro-batch size, so every rank, every backend and a resumed
// run see the same examples. Rank r of n gets rows [r*B/n, (r+1)*B/n) of each
// global micro-batch of B rows: the data-parallel shard of the batch dim.
//
//   FashionMnist ds = value_or_throw(FashionMnist::load({}));
//   BatchIndex at{.seed = 1, .step = 10, .micro = 0, .micro_batches = 2};
//   MF_ASSIGN_OR_RETURN(Batch b, ds.train_batch(at, /*global_batch=*/64, Shard{rank, world}));
//   for (auto& [name, t] : b.tensors) executor.feed(name, t);   // "x", "labels"
//
//   for (EvalIterator it = ds.eval(64, shard); !it.done();) { Batch e = it.next(); ... }
//
// Invariant: a global batch is the concatenation of its shards in rank order.
// Training examples are drawn by position in an endless stream: position p =
// ((step * micro_batches) + micro) * global_batch + row, and the dataset maps
// p to an example (an epoch-wise shuffle, or a random text window).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "meshflow/core/status.h"
#include "meshflow/core/tensor.h"

namespace meshflow {

// One batch (or one rank's shard of it): a tensor per model input.
struct Batch {
  std::vector<std::pair<std::string, Tensor>> tensors;
  int64_t rows = 0;
  // The tensor named `name`; MF_CHECKs that it exists.
  const Tensor& get(const std::string& name) const;
};

struct BatchIndex {
  uint64_t seed = 0;      // data order
  int64_t step = 0;       // optimizer step, from 0
  int micro = 0;          // micro-batch within the step, in [0, micro_batches)
  int micro_batches = 1;  // micro-batches per step (gradient accumulation)
};

struct Shard {
  int rank = 0;
  int world = 1;
};

class EvalIterator;

class Dataset {
 public:
  virtual ~Dataset() = default;

  // One line: what it is and its sizes.
  virtual std::string describe() const = 0;
  // Names of the tensors in every batch, in order ({"x", "labels"} or {"tokens", "targets"}).
  virtual std::vector<std::string> input_names() const = 0;
  // Distinct training examples (images, or text window starts) and eval examples.
  virtual int64_t train_examples() const = 0;
  virtual int64_t eval_examples() const = 0;
  // Its integer tensors' values are in [0, classes()): byte tokens and
  // targets (256), class labels (Fashion-MNIST's 10).
  virtual int64_t classes() const = 0;

  // This shard's rows of global micro-batch `at` of `global_batch` rows.
  // Errors: global_batch not divisible by shard.world, bad rank or indices.
  Result<Batch> train_batch(const BatchIndex& at, int64_t global_batch, Shard shard = {}) const;

  // The eval set is eval_examples() in a fixed order, cut into
  // eval_examples() / global_batch full batches (a remainder is dropped).
  int64_t num_eval_batches(int64_t global_batch) const;
  Result<Batch> eval_batch(int64_t index, int64_t global_batch, Shard shard = {}) const;
  // Iterates the first min(max_batches, num_eval_batches) eval batches (all if max_batches < 0).
  // REQUIRES: global_batch divisible by shard.world (else the iterator is empty and
  // status() says why).
  EvalIterator eval(int64_t global_batch, Shard shard = {}, int64_t max_batches = -1) const;
  // The first min(max_batches, num_eval_batches(batch)) eval batches of
  // `batch` rows (all if max_batches < 0), as micro-batches of `micro` rows:
  // the same examples in the same order, so a mean over them is the whole
  // batches' whatever the micro-batching. REQUIRES: micro divides batch.
  EvalIterator eval_as_micro_batches(int64_t batch, int64_t micro, int64_t max_batches) const;

 protected:
  // A zero-filled batch of `rows` rows.
  virtual Batch make_batch(int64_t rows) const = 0;
  // The training example at stream position `pos` (see the header comment).
  virtual void fill_train_row(Batch& b, int64_t row, uint64_t seed, int64_t pos) const = 0;
  // Eval example `index` in [0, eval_examples()).
  virtual void fill_eval_row(Batch& b, int64_t row, int64_t index) const = 0;

 private:
  Status check_shard(int64_t global_batch, Shard shard) const;
};

class EvalIterator {
 public:
  EvalIterator(const Dataset* ds, int64_t global_batch, Shard shard, int64_t count, Status status)
      : ds_(ds),
        global_batch_(global_batch),
        shard_(shard),
        count_(count),
        status_(std::move(status)) {}
  bool done() const { return next_ >= count_; }
  int64_t index() const { return next_; }
  int64_t count() const { return count_; }
  const Status& status() const { return status_; }
  Batch next();  // REQUIRES: !done()

 private:
  const Dataset* ds_;
  int64_t global_batch_;
  Shard shard_;
  int64_t count_;
  Status status_;
  int64_t next_ = 0;
};

// A bijection of [0, n) keyed by `key` (a small Feistel network with cycle
// walking): index i of a shuffled epoch without materializing the permutation.
int64_t shuffled_index(int64_t i, int64_t n, uint64_t key);

}  // namespace meshflow
