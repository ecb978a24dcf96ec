#include "meshflow/data/dataset.h"

#include <algorithm>

#include "meshflow/core/check.h"
#include "meshflow/core/random.h"

namespace meshflow {

const Tensor& Batch::get(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  MF_CHECK(false) << "batch has no tensor named '" << name << "'";
  return tensors.front().second;
}

Status Dataset::check_shard(int64_t global_batch, Shard shard) const {
  if (global_batch < 1)
    return Status::invalid("data: global batch must be >= 1, got " + std::to_string(global_batch));
  if (shard.world < 1 || shard.rank < 0 || shard.rank >= shard.world)
    return Status::invalid("data: rank " + std::to_string(shard.rank) + " is not in [0, " +
                           std::to_string(shard.world) + ")");
  if (global_batch % shard.world != 0)
    return Status::invalid("data: global batch " + std::to_string(global_batch) +
                           " is not divisible by world size " + std::to_string(shard.world) +
                           " (each rank takes an equal slice of the batch)");
  return Status::ok();
}

Result<Batch> Dataset::train_batch(const BatchIndex& at, int64_t global_batch, Shard shard) const {
  MF_RETURN_IF_ERROR(check_shard(global_batch, shard));
  if (at.step < 0 || at.micro_batches < 1 || at.micro < 0 || at.micro >= at.micro_batches)
    return Status::invalid("data: batch index step=" + std::to_string(at.step) +
                           " micro=" + std::to_string(at.micro) +
                           " of micro_batches=" + std::to_string(at.micro_batches) +
                           " (need step >= 0 and 0 <= micro < micro_batches)");
  const int64_t rows = global_batch / shard.world, first = shard.rank * rows;
  const int64_t base = (at.step * at.micro_batches + at.micro) * global_batch;
  Batch b = make_batch(rows);
  for (int64_t r = 0; r < rows; ++r) fill_train_row(b, r, at.seed, base + first + r);
  return b;
}

int64_t Dataset::num_eval_batches(int64_t global_batch) const {
  return global_batch < 1 ? 0 : eval_examples() / global_batch;
}

Result<Batch> Dataset::eval_batch(int64_t index, int64_t global_batch, Shard shard) const {
  MF_RETURN_IF_ERROR(check_shard(global_batch, shard));
  if (index < 0 || index >= num_eval_batches(global_batch))
    return Status::invalid("data: eval batch " + std::to_string(index) + " is not in [0, " +
                           std::to_string(num_eval_batches(global_batch)) + ") for " +
                           std::to_string(eval_examples()) + " eval examples in batches of " +
                           std::to_string(global_batch));
  const int64_t rows = global_batch / shard.world, first = index * global_batch + shard.rank * rows;
  Batch b = make_batch(rows);
  for (int64_t r = 0; r < rows; ++r) fill_eval_row(b, r, first + r);
  return b;
}

EvalIterator Dataset::eval(int64_t global_batch, Shard shard, int64_t max_batches) const {
  Status s = check_shard(global_batch, shard);
  int64_t count = s.is_ok() ? num_eval_batches(global_batch) : 0;
  if (max_batches >= 0 && max_batches < count) count = max_batches;
  return EvalIterator(this, global_batch, shard, count, std::move(s));
}

EvalIterator Dataset::eval_as_micro_batches(int64_t batch, int64_t micro,
                                            int64_t max_batches) const {
  int64_t whole = num_eval_batches(batch);
  if (max_batches >= 0) whole = std::min(whole, max_batches);
  return eval(micro, Shard{}, micro > 0 ? whole * (batch / micro) : 0);
}

Batch EvalIterator::next() {
  MF_CHECK(!done()) << "EvalIterator::next past the end (" << count_ << " batches)";
  return value_or_throw(ds_->eval_batch(next_++, global_batch_, shard_));
}

int64_t shuffled_index(int64_t i, int64_t n, uint64_t key) {
  MF_CHECK(i >= 0 && i < n) << "shuffled_index(" << i << ", " << n << ")";
  if (n <= 1) return i;
  // Domain 2^(2h) >= n; each round maps (L, R) -> (R, L ^ F(R)), a bijection.
  int h = 1;
  while ((int64_t{1} << (2 * h)) < n) ++h;
  const uint64_t mask = (uint64_t{1} << h) - 1;
  uint64_t x = static_cast<uint64_t>(i);
  do {  // cycle walking: re-apply until the value lands in [0, n); terminates (it is a cycle)
    uint64_t left = x >> h, right = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = random_bits(key + round, right) & mask;
      const uint64_t next_right = left ^ f;
      left = right;
      right = next_right;
    }
    x = (left << h) | right;
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

}  // namespace meshflow
