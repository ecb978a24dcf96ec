// Hybrid parallelism from C++: a tensor-parallel MLP written by hand as the
// program each rank runs (Megatron's MLP: W1 split by columns, W2 by rows,
// one all_reduce to sum the partial outputs), trained by meshflow's autodiff
// and AdamW on 2 in-process ranks, against the same MLP on one device.
//
//   hybrid_tp_mlp            prints the losses of both; exit 0 when every
//                            step's loss agrees within 1e-5 (relative)
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/ops/builder.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/parallel/partition.h"
#include "meshflow/parallel/reshard_exec.h"
#include "meshflow/runtime/executor.h"

using namespace meshflow;

namespace {

constexpr int64_t kBatch = 16, kHidden = 32, kFfn = 64;
constexpr int kSteps = 20;

// This rank's block of a parameter (parallel/partition.h): its initializer
// draws the whole tensor's numbers, so every split starts from the same weights.
ValueId shard_param(Builder& b, const std::string& name, const Shape& whole, const Mesh& mesh,
                    const Layout& layout, int rank) {
  return shard_parameter(b, name, whole, mesh, layout, rank, Init::normal(0.2f));
}

// loss = mean((gelu(x W1) W2 - target)^2); on tp ranks the all_reduce sums
// the row-parallel partial products.
Graph mlp(int tp, int rank) {
  Graph g;
  Builder b(g);
  const Mesh mesh = Mesh::line(tp, "tp");
  const ValueId x = b.input("x", Shape{{"batch", kBatch}, {"hidden", kHidden}});
  const ValueId target = b.input("target", Shape{{"batch", kBatch}, {"hidden", kHidden}});
  const ValueId w1 = shard_param(b, "w1", Shape{{"hidden", kHidden}, {"ffn", kFfn}}, mesh,
                                 value_or_throw(Layout::parse("[S(1)]")), rank);
  const ValueId w2 = shard_param(b, "w2", Shape{{"ffn", kFfn}, {"hidden", kHidden}}, mesh,
                                 value_or_throw(Layout::parse("[S(0)]")), rank);
  ValueId y = b.matmul(b.gelu(b.matmul(x, w1, {}, "fc1"), "gelu"), w2, {}, "fc2");
  if (tp > 1) y = b.all_reduce(y, /*mesh_axis=*/0, tp, "fc2.all_reduce");
  const ValueId d = b.sub(y, target, "error");
  g.loss = b.reduce_mean(b.mul(d, d, "square"), {0, 1}, false, "loss");
  append_backward(g);
  OptimizerConfig adam;
  adam.lr = 1e-2f;
  append_optimizer(g, adam);
  return g;
}

Tensor random_tensor(uint64_t seed) {
  Tensor t(Shape{{"batch", kBatch}, {"hidden", kHidden}}, DType::F32);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = normal(rng);
  return t;
}

// Trains `g` for kSteps on (x, target); the loss of each step.
std::vector<float> train(const Graph& g, const MeshComms* comms, const Tensor& x,
                         const Tensor& target) {
  Executor ex(g);
  if (comms) ex.set_mesh_comms(comms);
  std::vector<float> losses;
  for (int step = 0; step < kSteps; ++step) {
    throw_if_error(ex.feed("x", x));
    throw_if_error(ex.feed("target", target));
    ex.feed_scalar("loss_scale", 1.f);
    ex.feed_scalar("lr", 1e-2f);
    ex.feed_scalar("step", static_cast<float>(step + 1));
    ex.run(ex.training_order());
    losses.push_back(ex.scalar(g.loss));
  }
  return losses;
}

}  // namespace

int main() {
  const Tensor x = random_tensor(1), target = random_tensor(2);
  const std::vector<float> one = train(mlp(1, 0), nullptr, x, target);

  constexpr int kTp = 2;
  std::vector<std::vector<float>> ranks(kTp);
  const Status s = run_local_ranks(kTp, [&](const std::shared_ptr<Transport>& t) -> Status {
    MF_ASSIGN_OR_RETURN(MeshComms comms,
                        MeshComms::make(Communicator::world(t), Mesh::line(kTp, "tp")));
    ranks[t->rank()] = train(mlp(kTp, t->rank()), &comms, x, target);
    return Status::ok();
  });
  if (!s.is_ok()) {
    std::fprintf(stderr, "hybrid_tp_mlp: %s\n", s.message().c_str());
    return 1;
  }
  double worst = 0;
  std::printf("step  one device   tp=2 rank 0  tp=2 rank 1\n");
  for (int i = 0; i < kSteps; ++i) {
    std::printf("%4d  %.7f  %.7f  %.7f\n", i + 1, one[i], ranks[0][i], ranks[1][i]);
    for (int r = 0; r < kTp; ++r)
      worst = std::max(worst, std::abs(double(ranks[r][i]) - one[i]) / std::abs(double(one[i])));
  }
  const bool ok = worst <= 1e-5 && one.back() < one.front();
  std::printf("max relative difference %.2e; loss %.4f -> %.4f: %s\n", worst, one.front(),
              one.back(), ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}
