// Tensor: an owning, 64-byte aligned host buffer with a named shape and dtype.
// Used for what crosses the runtime boundary: parameters, fed inputs, fetched
// outputs, checkpoints. Kernels inside the executor work on raw pointers.
//
//   Tensor t = Tensor::zeros(Shape{{"batch", 4}, {"hidden", 8}});
//   float* p = t.data<float>();
// Copies share the buffer (like a shared_ptr); use clone() for a deep copy.
#pragma once

#include <cstring>
#include <memory>

#include "meshflow/core/check.h"
#include "meshflow/core/dtype.h"
#include "meshflow/core/shape.h"

namespace meshflow {

class Tensor {
 public:
  Tensor() = default;
  Tensor(Shape shape, DType dtype);
  static Tensor zeros(Shape shape, DType dtype = DType::F32) {
    return Tensor(std::move(shape), dtype);
  }
  static Tensor scalar(float v);
  // A tensor over storage someone else owns (an offload file's mapping,
  // runtime/offload.h); buf keeps it alive, or does nothing on release.
  static Tensor external(Shape shape, DType dtype, std::shared_ptr<void> buf) {
    Tensor t;
    t.shape_ = std::move(shape);
    t.dtype_ = dtype;
    t.buf_ = std::move(buf);
    return t;
  }

  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool defined() const { return buf_ != nullptr; }

  template <class T>
  T* data() {
    return static_cast<T*>(buf_.get());
  }
  template <class T>
  const T* data() const {
    return static_cast<const T*>(buf_.get());
  }
  void* raw() { return buf_.get(); }
  const void* raw() const { return buf_.get(); }

  Tensor clone() const;
  void copy_from(const void* src) { std::memcpy(raw(), src, nbytes()); }

 private:
  Shape shape_;
  DType dtype_ = DType::F32;
  std::shared_ptr<void> buf_;
};

// 64-byte aligned allocation of at least `bytes` (rounded up to 64).
std::shared_ptr<void> aligned_buffer(size_t bytes);

}  // namespace meshflow
