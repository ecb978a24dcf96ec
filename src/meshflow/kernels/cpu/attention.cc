// PLACEHOLDER: being written. Registers nothing yet.
#include "meshflow/kernels/kernel.h"
namespace meshflow {
void register_attention_kernels(KernelTable& t) { (void)t; }
}  // namespace meshflow
