// Activation kernels (relu, gelu-tanh, silu and their gradients): one flat
// vectorized loop each, split across threads. exp goes through exp_approx, a
// polynomial the compiler vectorizes (std::exp stays scalar without -ffast-math).
//
// gelu with s = sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), uses
//   0.5 (1 + tanh(u)) = s   and   1 - tanh(u)^2 = 4 s (1 - s),
// so gelu(x) = x s and gelu'(x) = s + 2 x s (1 - s) u'(x), with one exp per element.
#include <bit>
#include <cstdint>

#include "meshflow/kernels/cpu/parallel.h"
#include "meshflow/kernels/cpu/vmath.h"
#include "meshflow/kernels/kernel.h"

namespace meshflow {

namespace {

using cpu::exp_approx;

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

inline float gelu_sigmoid(float x) {
  const float u = kGeluK * (x + kGeluC * x * x * x);
  return 1.f / (1.f + exp_approx(-2.f * u));
}

// y[i] = F(x[i]) for i in [0, n).
template <class F>
void unary_loop(const float* x, float* y, int64_t n, int64_t cost, F f) {
  cpu::parallel_for(n, cost, [&](int64_t lo, int64_t hi) {
#pragma omp simd simdlen(16)
    for (int64_t i = lo; i < hi; ++i) y[i] = f(x[i]);
  });
}

// dx[i] = F(x[i], dy[i]).
template <class F>
void grad_loop(const float* x, const float* dy, float* dx, int64_t n, int64_t cost, F f) {
  cpu::parallel_for(n, cost, [&](int64_t lo, int64_t hi) {
#pragma omp simd simdlen(16)
    for (int64_t i = lo; i < hi; ++i) dx[i] = f(x[i], dy[i]);
  });
}

void relu_kernel(const KernelCall& c) {
  unary_loop(c.in_f(0), c.out_f(0), c.out_shape(0).numel(), 1,
             [](float x) { return x > 0.f ? x : 0.f; });
}

void relu_grad_kernel(const KernelCall& c) {
  grad_loop(c.in_f(0), c.in_f(1), c.out_f(0), c.out_shape(0).numel(), 1,
            [](float x, float dy) { return x > 0.f ? dy : 0.f; });
}

void gelu_kernel(const KernelCall& c) {
  unary_loop(c.in_f(0), c.out_f(0), c.out_shape(0).numel(), 8,
             [](float x) { return x * gelu_sigmoid(x); });
}

void gelu_grad_kernel(const KernelCall& c) {
  grad_loop(c.in_f(0), c.in_f(1), c.out_f(0), c.out_shape(0).numel(), 10, [](float x, float dy) {
    const float s = gelu_sigmoid(x);
    const float du = kGeluK * (1.f + 3.f * kGeluC * x * x);
    return dy * (s + 2.f * x * s * (1.f - s) * du);
  });
}

void silu_kernel(const KernelCall& c) {
  unary_loop(c.in_f(0), c.out_f(0), c.out_shape(0).numel(), 6,
             [](float x) { return x / (1.f + exp_approx(-x)); });
}

void silu_grad_kernel(const KernelCall& c) {
  grad_loop(c.in_f(0), c.in_f(1), c.out_f(0), c.out_shape(0).numel(), 8, [](float x, float dy) {
    const float s = 1.f / (1.f + exp_approx(-x));
    return dy * s * (1.f + x * (1.f - s));
  });
}

}  // namespace

void register_activation_kernels(KernelTable& t) {
  t[static_cast<int>(OpKind::kRelu)] = relu_kernel;
  t[static_cast<int>(OpKind::kReluGrad)] = relu_grad_kernel;
  t[static_cast<int>(OpKind::kGelu)] = gelu_kernel;
  t[static_cast<int>(OpKind::kGeluGrad)] = gelu_grad_kernel;
  t[static_cast<int>(OpKind::kSilu)] = silu_kernel;
  t[static_cast<int>(OpKind::kSiluGrad)] = silu_grad_kernel;
}

}  // namespace meshflow
