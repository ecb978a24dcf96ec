// PLACEHOLDER: being written. Registers nothing yet.
#include "meshflow/kernels/kernel.h"
namespace meshflow {
void register_activation_kernels(KernelTable& t) { (void)t; }
}  // namespace meshflow
