// PLACEHOLDER: being written. Registers nothing yet.
#include "meshflow/ops/op_def.h"
namespace meshflow {
void register_attention_ops(OpTable& t) { (void)t; }
}  // namespace meshflow
