// Shape with named dims. Every value in a graph has one; the names (batch, seq,
// hidden, heads, head_dim, ffn, vocab, ...) are what layout rules such as
// {batch: dp, ffn: tp} attach to.
//
//   Shape s{{"batch", 16}, {"seq", 128}, {"hidden", 256}};
//   s.numel() == 16*128*256;  s.index_of("seq") == 1;  s.to_string() ==
//   "[batch=16,seq=128,hidden=256]"
//
// Invariant: sizes are >= 1 (a scalar is the rank-0 shape []). Names need not be
// unique across a graph, but are unique within one shape unless empty.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace meshflow {

struct Dim {
  std::string name;
  int64_t size = 1;
  bool operator==(const Dim&) const = default;
};

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<Dim> dims) : dims_(dims) {}
  explicit Shape(std::vector<Dim> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t size(int i) const { return dims_[norm(i)].size; }
  const std::string& name(int i) const { return dims_[norm(i)].name; }
  const Dim& dim(int i) const { return dims_[norm(i)]; }
  const std::vector<Dim>& dims() const { return dims_; }
  int64_t numel() const;
  std::vector<int64_t> sizes() const;
  // Index of the dim with this name, or -1.
  int index_of(const std::string& name) const;
  // Normalizes a possibly negative axis; -1 is the last dim.
  int norm(int axis) const { return axis < 0 ? axis + rank() : axis; }
  // Row-major strides in elements.
  std::vector<int64_t> strides() const;
  // Product of sizes of dims [begin, end).
  int64_t prod(int begin, int end) const;

  Shape slice(int begin, int end) const;  // dims [begin, end)
  Shape concat(const Shape& other) const;
  Shape with_size(int axis, int64_t size) const;
  Shape with_name(int axis, std::string name) const;
  bool same_sizes(const Shape& other) const;

  std::string to_string() const;
  bool operator==(const Shape&) const = default;

 private:
  std::vector<Dim> dims_;
};

}  // namespace meshflow
