#include "meshflow/core/layout.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "meshflow/core/check.h"

namespace meshflow {

std::string Placement::to_string() const {
  switch (kind_) {
    case Kind::kReplicate:
      return "R";
    case Kind::kPartial:
      return "P";
    case Kind::kShard:
      return "S(" + std::to_string(dim_) + ")";
  }
  return "?";
}

Result<Layout> Layout::make(std::vector<Placement> p) {
  std::map<int, std::vector<int>> axes_of;  // dim -> mesh axes sharding it
  for (int a = 0; a < static_cast<int>(p.size()); ++a) {
    if (!p[a].is_shard()) continue;
    if (p[a].dim() < 0) {
      return Status::invalid("layout: mesh axis " + std::to_string(a) + " shards dim " +
                             std::to_string(p[a].dim()) + "; dims are >= 0");
    }
    axes_of[p[a].dim()].push_back(a);
  }
  for (auto& [dim, axes] : axes_of) {
    int given = 0;
    for (int a : axes) given += p[a].order() >= 0;
    if (given == 0) {
      for (size_t k = 0; k < axes.size(); ++k) p[axes[k]] = Placement::Shard(dim, k);
      continue;
    }
    std::vector<int> seen(axes.size(), 0);
    bool ok = given == static_cast<int>(axes.size());
    for (int a : axes) {
      int o = p[a].order();
      if (o < 0 || o >= static_cast<int>(axes.size()) || seen[o]++) ok = false;
    }
    if (!ok) {
      return Status::invalid("layout: dim " + std::to_string(dim) + " is sharded on " +
                             std::to_string(axes.size()) +
                             " mesh axes; their positions (S(d)#k) must be 0.." +
                             std::to_string(axes.size() - 1) + ", each once, on all or none");
    }
  }
  return Layout(std::move(p));
}

Layout Layout::Replicated(int num_axes) {
  return Layout(std::vector<Placement>(num_axes, Placement::Replicate()));
}

Result<Layout> Layout::parse(const std::string& text) {
  std::string s;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  }
  auto bad = [&](const std::string& why) {
    return Status::invalid("layout '" + text + "': " + why +
                           " (expected e.g. \"[S(0), R, P]\": one of S(dim), S(dim)#pos, R, P "
                           "per mesh axis)");
  };
  if (s.size() < 2 || s.front() != '[' || s.back() != ']') return bad("missing '[' or ']'");
  s = s.substr(1, s.size() - 2);
  std::vector<Placement> p;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(',', pos);
    std::string item = s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    if (item == "R") {
      p.push_back(Placement::Replicate());
    } else if (item == "P" || item == "P(sum)") {
      p.push_back(Placement::Partial());
    } else if (item.size() >= 4 && item[0] == 'S' && item[1] == '(') {
      size_t close = item.find(')');
      if (close == std::string::npos) return bad("unclosed 'S(' in '" + item + "'");
      std::string dim = item.substr(2, close - 2);
      std::string rest = item.substr(close + 1);
      auto is_num = [](const std::string& n) {
        return !n.empty() && n.size() < 6 &&
               std::all_of(n.begin(), n.end(), [](char c) { return std::isdigit(c) != 0; });
      };
      if (!is_num(dim)) return bad("dim '" + dim + "' in '" + item + "' is not an integer >= 0");
      int order = -1;
      if (!rest.empty()) {
        if (rest[0] != '#' || !is_num(rest.substr(1))) return bad("bad suffix in '" + item + "'");
        order = std::stoi(rest.substr(1));
      }
      p.push_back(Placement::Shard(std::stoi(dim), order));
    } else {
      return bad("unknown placement '" + item + "'");
    }
    if (end == std::string::npos) break;
    pos = end + 1;
    if (pos == s.size()) return bad("trailing ','");
  }
  auto l = make(std::move(p));
  if (!l.is_ok()) return Status::invalid("layout '" + text + "': " + l.status().message());
  return l;
}

std::vector<int> Layout::shard_axes(int dim) const {
  std::vector<int> axes;
  for (int a = 0; a < num_axes(); ++a) {
    if (p_[a].is_shard() && p_[a].dim() == dim) axes.push_back(a);
  }
  std::sort(axes.begin(), axes.end(), [&](int x, int y) { return p_[x].order() < p_[y].order(); });
  return axes;
}

int64_t Layout::shard_count(int dim, const Mesh& mesh) const {
  int64_t n = 1;
  for (int a = 0; a < num_axes(); ++a) {
    if (p_[a].is_shard() && p_[a].dim() == dim) n *= mesh.size(a);
  }
  return n;
}

bool Layout::is_replicated() const {
  return std::all_of(p_.begin(), p_.end(), [](const Placement& x) { return x.is_replicate(); });
}

bool Layout::has_partial() const {
  return std::any_of(p_.begin(), p_.end(), [](const Placement& x) { return x.is_partial(); });
}

Layout Layout::with(int axis, Placement np) const {
  MF_CHECK(axis >= 0 && axis < num_axes()) << "axis " << axis;
  std::vector<Placement> p = p_;
  const Placement old = p[axis];
  p[axis] = Placement::Replicate();
  if (old.is_shard()) {
    for (Placement& q : p) {
      if (q.is_shard() && q.dim() == old.dim() && q.order() > old.order()) {
        q = Placement::Shard(q.dim(), q.order() - 1);
      }
    }
  }
  if (np.is_shard()) {
    int count = 0;
    for (const Placement& q : p) count += q.is_shard() && q.dim() == np.dim();
    int order = np.order() < 0 ? count : std::min(np.order(), count);
    for (Placement& q : p) {
      if (q.is_shard() && q.dim() == np.dim() && q.order() >= order) {
        q = Placement::Shard(q.dim(), q.order() + 1);
      }
    }
    np = Placement::Shard(np.dim(), order);
  }
  p[axis] = np;
  return Layout(std::move(p));
}

std::string Layout::to_string() const {
  std::string s = "[";
  for (int a = 0; a < num_axes(); ++a) {
    if (a) s += ", ";
    s += p_[a].to_string();
    if (p_[a].is_shard()) {
      // Positions show only when this dim's axes are not in mesh-axis order.
      std::vector<int> axes = shard_axes(p_[a].dim());
      if (!std::is_sorted(axes.begin(), axes.end())) s += "#" + std::to_string(p_[a].order());
    }
  }
  return s + "]";
}

size_t Layout::hash() const {
  size_t h = 0xcbf29ce484222325ull;
  for (const Placement& q : p_) {
    h = (h ^ static_cast<size_t>(q.kind())) * 0x100000001b3ull;
    h = (h ^ static_cast<size_t>(q.dim() + 1)) * 0x100000001b3ull;
    h = (h ^ static_cast<size_t>(q.order() + 1)) * 0x100000001b3ull;
  }
  return h;
}

std::string valid_splits(int64_t n) {
  // The divisors in order: pairs (d, n / d) for d up to sqrt(n).
  std::vector<int64_t> low, high;
  for (int64_t d = 1; d <= n / d; ++d)
    if (n % d == 0) {
      low.push_back(d);
      if (d != n / d) high.push_back(n / d);
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  std::string s;
  for (int64_t d : low) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return s;
}

bool divides_evenly(const Layout& layout, const Mesh& mesh, const Shape& shape) {
  if (layout.num_axes() != mesh.num_axes()) return false;
  for (int a = 0; a < layout.num_axes(); ++a)
    if (layout.at(a).is_shard() && layout.at(a).dim() >= shape.rank()) return false;
  for (int d = 0; d < shape.rank(); ++d)
    if (shape.size(d) % layout.shard_count(d, mesh) != 0) return false;
  return true;
}

Status validate(const Layout& layout, const Mesh& mesh, const Shape& shape) {
  if (layout.num_axes() != mesh.num_axes()) {
    return Status::invalid("layout " + layout.to_string() + " has " +
                           std::to_string(layout.num_axes()) + " placements but mesh " +
                           mesh.to_string() + " has " + std::to_string(mesh.num_axes()) + " axes");
  }
  for (int a = 0; a < layout.num_axes(); ++a) {
    const Placement& p = layout.at(a);
    if (p.is_shard() && p.dim() >= shape.rank()) {
      return Status::invalid("layout " + layout.to_string() + ": mesh axis '" + mesh.axis_name(a) +
                             "' shards dim " + std::to_string(p.dim()) + " but shape " +
                             shape.to_string() + " has " + std::to_string(shape.rank()) + " dims");
    }
  }
  for (int d = 0; d < shape.rank(); ++d) {
    int64_t n = layout.shard_count(d, mesh);
    if (shape.size(d) % n == 0) continue;
    std::string axes;
    for (int a : layout.shard_axes(d)) {
      axes += (axes.empty() ? "" : " x ") + mesh.axis_name(a) + "=" + std::to_string(mesh.size(a));
    }
    std::string name = shape.name(d).empty() ? "" : " '" + shape.name(d) + "'";
    return Status::invalid("layout " + layout.to_string() + " on mesh " + mesh.to_string() +
                           ": dim " + std::to_string(d) + name + " of size " +
                           std::to_string(shape.size(d)) + " is split " + std::to_string(n) +
                           " ways (" + axes + ") but " + std::to_string(shape.size(d)) +
                           " is not divisible by " + std::to_string(n) + "; valid splits of dim " +
                           std::to_string(d) + ": " + valid_splits(shape.size(d)));
  }
  return Status::ok();
}

Layout canonical(const Layout& layout, const Mesh& mesh) {
  MF_CHECK_EQ(layout.num_axes(), mesh.num_axes())
      << layout.to_string() << " on " << mesh.to_string();
  Layout l = layout;
  for (int a = 0; a < mesh.num_axes(); ++a)
    if (mesh.size(a) == 1 && !l.at(a).is_replicate()) l = l.with(a, Placement::Replicate());
  return l;
}

Result<Shape> local_shape(const Shape& shape, const Mesh& mesh, const Layout& layout) {
  MF_RETURN_IF_ERROR(validate(layout, mesh, shape));
  Shape out = shape;
  for (int d = 0; d < shape.rank(); ++d) {
    out = out.with_size(d, shape.size(d) / layout.shard_count(d, mesh));
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> local_ranges(const Shape& shape, const Mesh& mesh,
                                                      const Layout& layout, int rank) {
  std::vector<int> c = mesh.coords(rank);
  std::vector<std::pair<int64_t, int64_t>> r;
  for (int d = 0; d < shape.rank(); ++d) {
    int64_t block = 0, count = 1;
    for (int a : layout.shard_axes(d)) {
      block = block * mesh.size(a) + c[a];
      count *= mesh.size(a);
    }
    MF_CHECK_EQ(shape.size(d) % count, 0) << "dim " << d << " of " << shape.to_string();
    int64_t len = shape.size(d) / count;
    r.push_back({block * len, (block + 1) * len});
  }
  return r;
}

}  // namespace meshflow
