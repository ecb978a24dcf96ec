// Counter-based random numbers: value i of stream (seed) is a pure function of
// (seed, i), so parameter init, data shuffling and dropout masks are identical
// on every rank, every backend, and when a layer is recomputed.
//
//   float u = uniform01(stream_seed("h.0.attn.wq", 42), i);
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace meshflow {

// splitmix64 finalizer: a good 64-bit mix.
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a (64-bit) of a string.
constexpr uint64_t fnv1a(std::string_view text) {
  uint64_t h = 1469598103934665603ULL;
  for (char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return h;
}

// FNV-1a of a name, mixed with a seed: one stream per (name, seed).
constexpr uint64_t stream_seed(std::string_view name, uint64_t seed) {
  return mix64(fnv1a(name) ^ mix64(seed));
}

inline uint64_t random_bits(uint64_t stream, uint64_t i) {
  return mix64(stream ^ mix64(i));
}

// Uniform in [0, 1) with 24 bits.
inline float uniform01(uint64_t stream, uint64_t i) {
  return static_cast<float>(random_bits(stream, i) >> 40) * (1.0f / 16777216.0f);
}

// Standard normal (Box-Muller on two counter draws).
inline float normal01(uint64_t stream, uint64_t i) {
  uint64_t r = random_bits(stream, i);
  float u1 = (static_cast<float>(r >> 40) + 1.0f) * (1.0f / 16777217.0f);
  float u2 = static_cast<float>((r >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.28318530718f * u2);
}

// Sequential generator for host-side use (shuffles).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(mix64(seed)) {}
  uint64_t next() { return mix64(state_++); }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return next() % n; }

 private:
  uint64_t state_;
};

}  // namespace meshflow
