#include "meshflow/core/shape.h"

#include <sstream>

namespace meshflow {

int64_t Shape::numel() const {
  return prod(0, rank());
}

int64_t Shape::prod(int begin, int end) const {
  int64_t n = 1;
  for (int i = begin; i < end; ++i) n *= dims_[i].size;
  return n;
}

std::vector<int64_t> Shape::sizes() const {
  std::vector<int64_t> s;
  s.reserve(dims_.size());
  for (const Dim& d : dims_) s.push_back(d.size);
  return s;
}

std::vector<int64_t> Shape::strides() const {
  std::vector<int64_t> st(dims_.size(), 1);
  for (int i = rank() - 2; i >= 0; --i) st[i] = st[i + 1] * dims_[i + 1].size;
  return st;
}

int Shape::index_of(const std::string& name) const {
  for (int i = 0; i < rank(); ++i)
    if (dims_[i].name == name) return i;
  return -1;
}

Shape Shape::slice(int begin, int end) const {
  return Shape(std::vector<Dim>(dims_.begin() + begin, dims_.begin() + end));
}

Shape Shape::concat(const Shape& other) const {
  std::vector<Dim> d = dims_;
  d.insert(d.end(), other.dims_.begin(), other.dims_.end());
  return Shape(std::move(d));
}

Shape Shape::with_size(int axis, int64_t size) const {
  Shape s = *this;
  s.dims_[norm(axis)].size = size;
  return s;
}

Shape Shape::with_name(int axis, std::string name) const {
  Shape s = *this;
  s.dims_[norm(axis)].name = std::move(name);
  return s;
}

bool Shape::same_sizes(const Shape& other) const {
  if (dims_.size() != other.dims_.size()) return false;
  for (size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i].size != other.dims_[i].size) return false;
  return true;
}

std::string Shape::to_string() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < rank(); ++i) {
    if (i) os << ",";
    if (!dims_[i].name.empty()) os << dims_[i].name << "=";
    os << dims_[i].size;
  }
  os << "]";
  return os.str();
}

}  // namespace meshflow
