// Mesh: an N-d grid of ranks with named, ordered axes, e.g. {dp: 2, tp: 4}.
// Ranks are numbered row-major over the axes (the last axis varies fastest),
// so on {dp: 2, tp: 4} rank 5 has coordinates (dp=1, tp=1) and its tp group
// (the ranks along tp through it) is [4, 5, 6, 7].
//
//   Mesh m = value_or_throw(Mesh::parse("dp=2,tp=4"));   // or "{dp: 2, tp: 4}"
//   m.num_ranks() == 8;  m.coords(5) == {1, 1};  m.axis_group(m.axis_index("tp"), 5)
//   auto tp = value_or_throw(world->split(m.axis_group(1, world->rank())));
//
// Invariant: at least one axis, every size >= 1, names non-empty and unique;
// product of sizes = number of ranks. Immutable value: ==, hash, to_string().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "meshflow/core/status.h"

namespace meshflow {

struct MeshAxis {
  std::string name;
  int size = 1;
  bool operator==(const MeshAxis&) const = default;
};

class Mesh {
 public:
  // Checks the invariant; errors name the axis and its size.
  static Result<Mesh> make(std::vector<MeshAxis> axes);
  // "dp=2,tp=4" or "{dp: 2, tp: 4}" (spaces anywhere).
  static Result<Mesh> parse(const std::string& text);
  // A 1-D mesh {name: n}.
  static Mesh line(int n, const std::string& name = "x");

  int num_axes() const { return static_cast<int>(axes_.size()); }
  const std::vector<MeshAxis>& axes() const { return axes_; }
  int size(int axis) const { return axes_[axis].size; }
  const std::string& axis_name(int axis) const { return axes_[axis].name; }
  // Index of the axis with this name, or -1.
  int axis_index(const std::string& name) const;
  int num_ranks() const;

  // REQUIRES: 0 <= rank < num_ranks().
  std::vector<int> coords(int rank) const;
  // REQUIRES: coords.size() == num_axes(), each in range.
  int rank_of(const std::vector<int>& coords) const;
  // The ranks that share every coordinate of `rank` but `axis`, ordered by
  // their coordinate on `axis` (group rank = coordinate): the list to give
  // Communicator::split for a collective along that axis.
  std::vector<int> axis_group(int axis, int rank) const;

  std::string to_string() const;  // "{dp: 2, tp: 4}"
  size_t hash() const;
  bool operator==(const Mesh&) const = default;

 private:
  explicit Mesh(std::vector<MeshAxis> axes) : axes_(std::move(axes)) {}
  std::vector<MeshAxis> axes_;
};

}  // namespace meshflow

template <>
struct std::hash<meshflow::Mesh> {
  size_t operator()(const meshflow::Mesh& m) const { return m.hash(); }
};
