// batch_norm, its gradient and the running-statistics update: against
// double-precision references (torch's BatchNorm2d semantics: biased batch
// variance in the output, unbiased in the running variance), evaluation on
// the running statistics (and evaluation updates nothing), finite-difference
// gradients, errors, and synchronized batch norm: the batch split over 2 and
// 4 ranks by the partitioner equals one device, with the statistics'
// all_reduces recorded where explain sees them.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "grad_check.h"
#include "meshflow/autodiff/autodiff.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/comm/mesh_comms.h"
#include "meshflow/ops/builder.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/parallel/partition.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

using testing::check_gradients;
using testing::GradCase;
using testing::random_tensor;

const Shape kX{{"batch", 4}, {"channels", 3}, {"height", 3}, {"width", 2}};
const Shape kC{{"channels", 3}};

Tensor rng(int32_t offset) {
  Tensor t = Tensor::zeros(Shape{{"rng", 2}}, DType::I32);
  t.data<int32_t>()[0] = offset;
  return t;
}

// x (a parameter, so it has a gradient), gamma, beta, the running statistics,
// y = batch_norm(x), loss = sum(y * probe).
struct BnGraph {
  Graph g;
  ValueId x, gamma, beta, rm, rv, y, probe;
  explicit BnGraph(const Shape& xs = kX, float momentum = 0.1f) {
    Builder b(g);
    x = b.parameter("x", xs, Init::normal(1.f));
    const Shape c{{xs.name(1), xs.size(1)}};
    gamma = b.parameter("gamma", c, Init::normal(1.f));
    beta = b.parameter("beta", c, Init::normal(1.f));
    rm = b.state("running_mean", c);
    rv = b.state("running_var", c);
    y = b.batch_norm(x, gamma, beta, rm, rv, 1e-5f, momentum, "bn");
    probe = b.input("probe", xs);
    g.loss = b.matmul(y, probe, {false, false, xs.rank(), 0}, "loss");
    append_backward(g);
  }
};

// Naive per-channel statistics of x [N, C, S..] (biased variance).
void naive_stats(const Tensor& x, std::vector<double>* mean, std::vector<double>* var) {
  const int64_t N = x.shape().size(0), C = x.shape().size(1), S = x.numel() / (N * C);
  mean->assign(C, 0.0);
  var->assign(C, 0.0);
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s) (*mean)[c] += x.data<float>()[(n * C + c) * S + s];
    (*mean)[c] /= double(N * S);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t s = 0; s < S; ++s) {
        const double d = x.data<float>()[(n * C + c) * S + s] - (*mean)[c];
        (*var)[c] += d * d;
      }
    (*var)[c] /= double(N * S);
  }
}

TEST(OpsBatchNorm, TrainingForwardAndRunningStatisticsAsTorch) {
  BnGraph m;
  Executor ex(m.g, {.seed = 3, .fetch = {m.y}, .run_elsewhere = {}, .offload = {}});
  ASSERT_TRUE(ex.feed("probe", random_tensor(kX, 2)).is_ok());
  ASSERT_TRUE(ex.feed("rng_offset", rng(0)).is_ok());
  // Running statistics start as torch's: mean 0, variance 1.
  float* rv = static_cast<float*>(const_cast<void*>(ex.data(m.rv)));
  for (int c = 0; c < 3; ++c) rv[c] = 1.f;
  ex.feed_scalar("loss_scale", 1.f);
  ex.run(ex.forward_backward_order());
  Tensor x(kX, DType::F32), gamma(kC, DType::F32), beta(kC, DType::F32);
  x.copy_from(ex.data(m.x)), gamma.copy_from(ex.data(m.gamma)), beta.copy_from(ex.data(m.beta));
  std::vector<double> mean, var;
  naive_stats(x, &mean, &var);
  const int64_t S = 6, M = 4 * S;
  double err = 0;
  for (int64_t n = 0; n < 4; ++n)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t s = 0; s < S; ++s) {
        const int64_t i = (n * 3 + c) * S + s;
        const double want =
            (x.data<float>()[i] - mean[c]) / std::sqrt(var[c] + 1e-5) * gamma.data<float>()[c] +
            beta.data<float>()[c];
        err = std::max(err, std::fabs(ex.data_f(m.y)[i] - want));
      }
  EXPECT_LT(err, 1e-5);
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(ex.data_f(m.rm)[c], 0.1 * mean[c], 1e-6);
    EXPECT_NEAR(ex.data_f(m.rv)[c], 0.9 + 0.1 * var[c] * M / (M - 1), 1e-5);
  }
}

TEST(OpsBatchNorm, EvaluationUsesAndKeepsTheRunningStatistics) {
  BnGraph m;
  Executor ex(m.g, {.seed = 3, .fetch = {m.y}, .run_elsewhere = {}, .offload = {}});
  ASSERT_TRUE(ex.feed("probe", random_tensor(kX, 2)).is_ok());
  ASSERT_TRUE(ex.feed("rng_offset", rng(-1)).is_ok());
  float* rm = static_cast<float*>(const_cast<void*>(ex.data(m.rm)));
  float* rv = static_cast<float*>(const_cast<void*>(ex.data(m.rv)));
  for (int c = 0; c < 3; ++c) rm[c] = 0.5f * c, rv[c] = 2.f + c;
  ex.run(ex.eval_order());
  for (int c = 0; c < 3; ++c) {  // evaluation updates nothing
    EXPECT_EQ(ex.data_f(m.rm)[c], 0.5f * c);
    EXPECT_EQ(ex.data_f(m.rv)[c], 2.f + c);
  }
  const float* x = ex.data_f(m.x);
  const float* gamma = ex.data_f(m.gamma);
  const float* beta = ex.data_f(m.beta);
  for (int64_t i = 0; i < kX.numel(); ++i) {
    const int64_t c = (i / 6) % 3;
    const double want = (x[i] - 0.5 * c) / std::sqrt(2.0 + c + 1e-5) * gamma[c] + beta[c];
    EXPECT_NEAR(ex.data_f(m.y)[i], want, 1e-5) << i;
  }
}

TEST(OpsBatchNorm, FiniteDifferenceGradients) {
  for (const Shape& xs : {kX, Shape{{"batch", 5}, {"features", 4}}}) {
    GradCase c;
    const Shape ch{{xs.name(1), xs.size(1)}};
    c.params = {xs, ch, ch};
    c.inputs["rng_offset"] = rng(0);
    c.build = [&](Builder& b, const std::vector<ValueId>& p) {
      return b.batch_norm(p[0], p[1], p[2], b.state("rm", ch), b.state("rv", ch));
    };
    EXPECT_TRUE(check_gradients(c)) << xs.to_string();
  }
}

TEST(OpsBatchNorm, ErrorsNameTheSizes) {
  Graph g;
  Builder b(g);
  try {
    b.batch_norm(b.input("x", kX), b.input("g", Shape{{"c", 4}}), b.input("b", kC),
                 b.state("rm", kC), b.state("rv", kC), 1e-5f, 0.1f, "bn");
    FAIL() << "no error";
  } catch (const StatusError& e) {
    EXPECT_NE(e.status().message().find(
                  "batch_norm 'bn': gamma[c=4] must be 1-D of size 3, the channels (dim 1) of x"),
              std::string::npos)
        << e.status().message();
  }
}

// Synchronized batch norm: the batch (and width) split by the partitioner;
// each rank's kernel all-reduces its per-channel sums, so the loss, every
// gradient and the running statistics equal one device's.
TEST(OpsBatchNorm, SplitBatchEqualsOneDevice) {
  BnGraph m;
  const Tensor probe = random_tensor(kX, 2);
  Executor one(m.g, {.seed = 3, .fetch = {}, .run_elsewhere = {}, .offload = {}});
  ASSERT_TRUE(one.feed("probe", probe).is_ok());
  ASSERT_TRUE(one.feed("rng_offset", rng(0)).is_ok());
  one.feed_scalar("loss_scale", 1.f);
  one.run(one.forward_backward_order());
  const float want_loss = one.scalar(m.g.loss);
  for (const char* mesh_text : {"dp=2", "dp=2,sp=2"}) {
    SCOPED_TRACE(mesh_text);
    const Mesh mesh = value_or_throw(Mesh::parse(mesh_text));
    PartitionOptions o;
    o.rules.rules = {{"batch", "dp"}};
    if (mesh.num_axes() > 1) o.rules.rules.push_back({"width", "sp"});
    const Annotation a = value_or_throw(annotate(m.g, mesh, o));
    Status s = run_local_ranks(mesh.num_ranks(), [&](const std::shared_ptr<Transport>& t) {
      const int rank = t->rank();
      MF_ASSIGN_OR_RETURN(const LocalProgram p, lower(m.g, a, rank));
      // The statistics' all_reduces are recorded (explain and the planner see them).
      int inner = 0;
      for (const CollectiveRecord& c : p.collectives)
        inner += c.consumer.find("(in its kernel)") != std::string::npos;
      EXPECT_EQ(inner, 3 * mesh.num_axes());  // 2 forward + 1 backward per axis
      MF_ASSIGN_OR_RETURN(MeshComms comms, MeshComms::make(Communicator::world(t), mesh));
      Executor ex(p.graph, {.seed = 3, .fetch = {}, .run_elsewhere = {}, .offload = {}});
      ex.set_mesh_comms(&comms);
      const ValueId gx = m.g.find("probe");
      MF_RETURN_IF_ERROR(ex.feed("probe", local_block(probe, mesh, a.produced(m.g, gx), rank)));
      MF_RETURN_IF_ERROR(ex.feed("rng_offset", rng(0)));
      ex.feed_scalar("loss_scale", 1.f);
      ex.run(ex.forward_backward_order());
      EXPECT_NEAR(ex.scalar(p.graph.loss), want_loss, 1e-5 * std::fabs(want_loss));
      for (const char* name : {"gamma", "beta", "running_mean", "running_var", "x"}) {
        const ValueId gv = m.g.find(name);
        const ValueId target = m.g.grad_of_param.count(gv) ? m.g.grad_of_param.at(gv) : gv;
        Tensor whole(m.g.shape(target), DType::F32);
        whole.copy_from(one.data(target));
        const ValueId lv = p.local_of[target];
        const Tensor want = local_block(whole, mesh, p.layout[lv], rank);
        EXPECT_LT(testing::max_rel_diff(static_cast<const float*>(ex.data(lv)), want.data<float>(),
                                        want.numel()),
                  1e-5)
            << name << " rank " << rank;
      }
      return Status::ok();
    });
    ASSERT_TRUE(s.is_ok()) << s.message();
  }
}

}  // namespace
}  // namespace meshflow
