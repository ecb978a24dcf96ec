// The conv2d kernels beside the ones cpu_kernel() returns: which library
// runs conv2d, and the im2col + SGEMM kernels (the path without oneDNN),
// which tests and bench/conv_compare call directly.
//
//   cpu::im2col_conv_kernel(OpKind::kConv2d)(call);
#pragma once

#include "meshflow/kernels/kernel.h"

namespace meshflow::cpu {

// "oneDNN" or "im2col+sgemm": what register_conv_kernels installed.
const char* conv_library();
// kConv2d, kConv2dGradInput or kConv2dGradWeight; nullptr for any other kind.
KernelFn im2col_conv_kernel(OpKind kind);

}  // namespace meshflow::cpu
