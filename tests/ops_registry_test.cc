#include <gtest/gtest.h>

#include "meshflow/kernels/kernel.h"
#include "meshflow/ops/op_def.h"

namespace meshflow {
namespace {

TEST(OpRegistry, EveryOpHasAShapeRuleAndACpuKernel) {
  for (int i = 0; i < kNumOpKinds; ++i) {
    auto k = static_cast<OpKind>(i);
    EXPECT_TRUE(op_registered(k)) << op_name(k) << " has no OpDef";
    if (!is_source(k)) {
      EXPECT_TRUE(has_cpu_kernel(k)) << op_name(k) << " has no CPU kernel";
    }
  }
}

}  // namespace
}  // namespace meshflow
