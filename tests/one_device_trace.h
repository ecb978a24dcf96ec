// Training traces compared with one device, shared by the parallel tests
// (parallel_partition_test.cc, parallel_weight_groups_test.cc): a run's
// losses, eval loss, gathered weights and memory, on one rank or many.
//
//   const Trace single = train(rc_one_device, nullptr);
//   expect_same(single, train_ranks(rc, 4), "dp=2,tp=2");
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "grad_check.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/engine/trainer.h"
#include "meshflow/parallel/partition.h"

namespace meshflow::testing {

struct Trace {
  std::vector<float> losses;
  std::map<std::string, Tensor> weights;
  float eval_loss = 0;
  MemoryStats memory;
  std::vector<int64_t> group_bytes;  // the annotation's weight groups, when grouped
};

// rc.train.steps steps, then evaluation, the gathered weights and the memory.
inline Trace train(const RunConfig& rc, std::shared_ptr<Communicator> comm,
                   const PartitionOptions* given = nullptr) {
  Trace t;
  auto trainer = value_or_throw(Trainer::create(rc, comm, given));
  for (int s = 0; s < rc.train.steps; ++s) t.losses.push_back(trainer->step().loss);
  t.eval_loss = trainer->evaluate().loss;
  t.weights = value_or_throw(trainer->gather_parameters());
  t.memory = trainer->executor().memory();
  if (trainer->annotation()) t.group_bytes = trainer->annotation()->groups.group_bytes;
  return t;
}

inline std::vector<Trace> train_ranks(const RunConfig& rc, int ranks,
                                      const PartitionOptions* given = nullptr) {
  std::vector<Trace> per_rank(ranks);
  Status s = run_local_ranks(ranks, [&](const std::shared_ptr<Transport>& t) -> Status {
    per_rank[t->rank()] = train(rc, Communicator::world(t), given);
    return Status::ok();
  });
  EXPECT_TRUE(s.is_ok()) << s.message();
  return per_rank;
}

// Tolerance: the same sums in another order (shard sums, then ring
// reductions) differ at f32 rounding level; Adam amplifies that a little in
// parameters whose gradient is ~0. 5e-5 relative on losses, 1e-4 on weights
// (max over elements, relative to the tensor's largest magnitude).
inline void expect_same(const Trace& single, const std::vector<Trace>& ranks,
                        const std::string& what) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    const Trace& t = ranks[r];
    ASSERT_EQ(t.losses.size(), single.losses.size());
    for (size_t i = 0; i < t.losses.size(); ++i)
      EXPECT_NEAR(t.losses[i], single.losses[i], 5e-5 * std::fabs(single.losses[i]))
          << what << " rank " << r << " step " << i;
    EXPECT_NEAR(t.eval_loss, single.eval_loss, 5e-5 * single.eval_loss) << what << " rank " << r;
    for (const auto& [name, w] : single.weights) {
      ASSERT_TRUE(t.weights.count(name)) << name;
      const Tensor& got = t.weights.at(name);
      ASSERT_EQ(got.numel(), w.numel()) << name;
      EXPECT_LT(max_rel_diff(got.data<float>(), w.data<float>(), w.numel()), 1e-4)
          << what << ": " << name << " rank " << r;
    }
  }
}

}  // namespace meshflow::testing
