#include "meshflow/ops/grad_context.h"

#include "meshflow/core/check.h"
#include "meshflow/ops/op_def.h"

namespace meshflow {

void GradContext::accumulate(int i, ValueId g) {
  ValueId x = node_->inputs[i];
  MF_CHECK(b_.graph().shape(g).same_sizes(b_.graph().shape(x)))
      << "gradient of " << node_label(*node_) << " input " << i << " has shape "
      << b_.graph().shape(g).to_string() << ", input is " << b_.graph().shape(x).to_string();
  // A gradient carries the dim names of the value it is the gradient of, so
  // layout rules ({batch: dp, ...}) apply to it as they do to the value.
  Shape named = b_.graph().shape(x);
  b_.graph().mutable_value(g).shape = named;
  if (grads_[x] == kNoValue) {
    grads_[x] = g;
  } else {
    grads_[x] = b_.add(grads_[x], g, "acc_" + b_.graph().value(x).name);
  }
}

}  // namespace meshflow
