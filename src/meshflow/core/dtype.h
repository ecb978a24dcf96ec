// DType: element types of graph values. f32 is what the CPU kernels compute in
// today; bf16/f16 are reserved for the GPU backend and for the planner, which
// prices 16-bit training at cluster scale.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace meshflow {

enum class DType : uint8_t { F32, BF16, F16, I32 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::I32:
      return 4;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::I32:
      return "i32";
  }
  return "?";
}

}  // namespace meshflow
