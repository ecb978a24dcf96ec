#include "meshflow/core/tensor.h"

#include <cstdlib>

namespace meshflow {

std::shared_ptr<void> aligned_buffer(size_t bytes) {
  size_t n = (bytes + 63) / 64 * 64;
  if (n == 0) n = 64;
  void* p = std::aligned_alloc(64, n);
  MF_CHECK(p != nullptr) << "out of memory allocating " << n << " bytes";
  std::memset(p, 0, n);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

Tensor::Tensor(Shape shape, DType dtype)
    : shape_(std::move(shape)), dtype_(dtype), buf_(aligned_buffer(nbytes())) {}

Tensor Tensor::scalar(float v) {
  Tensor t(Shape{}, DType::F32);
  *t.data<float>() = v;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t(shape_, dtype_);
  if (defined()) std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

}  // namespace meshflow
