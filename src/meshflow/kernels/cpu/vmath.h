// Vectorizable math for the CPU kernels. std::exp stays scalar without
// -ffast-math; these are plain arithmetic the compiler vectorizes inside
// `#pragma omp simd` loops.
//
//   for (i ...) y[i] = exp_approx(x[i] - max);
#pragma once

#include <bit>
#include <cstdint>

namespace meshflow::cpu {

// e^x to ~1 ulp for x in [-87.3, 88.3] (Cephes expf polynomial); 0 below that
// range (and for -inf), e^88.3 above it.
inline float exp_approx(float x) {
  constexpr float kLo = -87.33654f, kHi = 88.37626f;
  float xc = x < kLo ? kLo : x;
  xc = xc > kHi ? kHi : xc;
  const float n = (xc * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round(x / ln 2)
  float r = n * -0.693359375f + xc;  // x - n ln2, ln2 split in two parts
  r = n * 2.12194440e-4f + r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + (r + 1.f);
  const float two_n = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return x < kLo ? 0.f : p * two_n;
}

}  // namespace meshflow::cpu
