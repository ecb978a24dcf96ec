// Layout: how a tensor is spread over a Mesh. One Placement per mesh axis, in
// mesh-axis order:
//   Shard(d)   tensor dim d is split into equal blocks along this axis;
//   Replicate  every rank along this axis holds the same data;
//   Partial    the ranks along this axis hold addends: the value is their sum.
// A dim may be sharded over several mesh axes. They split it major to minor:
// by default in mesh-axis order; Shard(d, k) puts an axis at position k (0 =
// major) when another order is wanted. Rank r's block of dim d is then
// sum_k coord(axis_k) * prod(sizes of axes after k), of prod(sizes) blocks.
//
// Text (to_string / parse), one entry per mesh axis:
//   "[S(0), R, P]"       dim 0 on axis 0, replicated on axis 1, partial sum on 2
//   "[S(0), S(0)]"       dim 0 split over both axes, axis 0 major
//   "[S(0)#1, S(0)#0]"   the same dim with axis 1 major (explicit positions are
//                        printed only when the order differs from mesh-axis order)
//   "P" and "P(sum)" both read as Partial(sum).
//
//   Layout l = value_or_throw(Layout::parse("[S(0), R]"));
//   auto local = local_shape(shape, mesh, l);   // Result<Shape>; errors name dim and sizes
//
// Invariant (checked by make/parse): for every dim, the positions of its shard
// axes are 0..k-1. Whether the dims exist in a shape and divide evenly is
// checked against the shape: validate() / local_shape().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "meshflow/core/mesh.h"
#include "meshflow/core/shape.h"
#include "meshflow/core/status.h"

namespace meshflow {

class Placement {
 public:
  enum class Kind { kReplicate, kShard, kPartial };

  static Placement Replicate() { return Placement(Kind::kReplicate, -1, 0); }
  // order: position among the mesh axes sharding `dim` (0 = major); -1 means
  // "by mesh-axis order" and is resolved by Layout::make.
  static Placement Shard(int dim, int order = -1) { return Placement(Kind::kShard, dim, order); }
  static Placement Partial() { return Placement(Kind::kPartial, -1, 0); }

  Kind kind() const { return kind_; }
  bool is_replicate() const { return kind_ == Kind::kReplicate; }
  bool is_shard() const { return kind_ == Kind::kShard; }
  bool is_partial() const { return kind_ == Kind::kPartial; }
  int dim() const { return dim_; }      // REQUIRES: is_shard()
  int order() const { return order_; }  // REQUIRES: is_shard()

  std::string to_string() const;  // "R", "P", "S(1)" (order not shown)
  bool operator==(const Placement&) const = default;

 private:
  Placement(Kind k, int dim, int order) : kind_(k), dim_(dim), order_(order) {}
  Kind kind_;
  int dim_;
  int order_;
};

class Layout {
 public:
  Layout() = default;  // no mesh axes; a placeholder until assigned
  // Resolves default shard orders (mesh-axis order) and checks that each
  // dim's positions are 0..k-1 with either all or none given.
  static Result<Layout> make(std::vector<Placement> placements);
  static Result<Layout> parse(const std::string& text);
  // Replicated on a mesh with `num_axes` axes.
  static Layout Replicated(int num_axes);

  int num_axes() const { return static_cast<int>(p_.size()); }
  const std::vector<Placement>& placements() const { return p_; }
  const Placement& at(int axis) const { return p_[axis]; }
  // The mesh axes that shard `dim`, major first.
  std::vector<int> shard_axes(int dim) const;
  // Product of the sizes of the mesh axes sharding `dim`.
  int64_t shard_count(int dim, const Mesh& mesh) const;
  bool is_replicated() const;
  bool has_partial() const;

  // A copy with `axis` changed; a new Shard(d) goes minor-most on d, and the
  // old shard's position (if any) closes up. The way reshard steps edit layouts.
  Layout with(int axis, Placement p) const;

  std::string to_string() const;
  size_t hash() const;
  bool operator==(const Layout&) const = default;

 private:
  explicit Layout(std::vector<Placement> p) : p_(std::move(p)) {}
  std::vector<Placement> p_;
};

// Checks that `layout` fits `mesh` (one placement per axis) and `shape`
// (dims exist, every sharded dim divides evenly). Errors name the dim, the
// sizes, the mesh axes and the valid split counts.
Status validate(const Layout& layout, const Mesh& mesh, const Shape& shape);
// validate(...).is_ok() without building the message (the reshard planner and
// the strategy enumeration test many layouts that do not divide).
bool divides_evenly(const Layout& layout, const Mesh& mesh, const Shape& shape);

// The one spelling of `layout` on `mesh`: placements on mesh axes of size 1
// become Replicate (a split into one block or a sum of one addend is the whole
// value), the shard positions of the remaining axes closing up. Two layouts
// that place the same data on every rank have the same canonical form; the
// partitioner keeps its layouts canonical, so a size-1 axis never reads as a
// split (a vocab shard, a collective over a group of one).
Layout canonical(const Layout& layout, const Mesh& mesh);

// The per-rank shape of a global `shape` (same names, sharded dims divided).
Result<Shape> local_shape(const Shape& shape, const Mesh& mesh, const Layout& layout);

// The half-open global index range [first, second) of each dim that `rank`
// holds. REQUIRES: validate() is OK.
std::vector<std::pair<int64_t, int64_t>> local_ranges(const Shape& shape, const Mesh& mesh,
                                                      const Layout& layout, int rank);

// "1, 2, 4, 8": the divisors of n, for error messages.
std::string valid_splits(int64_t n);

}  // namespace meshflow

template <>
struct std::hash<meshflow::Layout> {
  size_t operator()(const meshflow::Layout& l) const { return l.hash(); }
};
