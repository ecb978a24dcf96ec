#include "meshflow/core/mesh.h"

#include <cctype>
#include <functional>

#include "meshflow/core/check.h"

namespace meshflow {

Result<Mesh> Mesh::make(std::vector<MeshAxis> axes) {
  if (axes.empty()) return Status::invalid("mesh needs at least one axis, got none");
  for (size_t i = 0; i < axes.size(); ++i) {
    const MeshAxis& a = axes[i];
    if (a.name.empty()) return Status::invalid("mesh axis " + std::to_string(i) + " has no name");
    if (a.size < 1) {
      return Status::invalid("mesh axis '" + a.name + "' has size " + std::to_string(a.size) +
                             "; sizes must be >= 1");
    }
    for (size_t j = 0; j < i; ++j) {
      if (axes[j].name == a.name) {
        return Status::invalid("mesh axis name '" + a.name + "' appears twice (axes " +
                               std::to_string(j) + " and " + std::to_string(i) + ")");
      }
    }
  }
  return Mesh(std::move(axes));
}

Mesh Mesh::line(int n, const std::string& name) {
  return value_or_throw(make({{name, n}}));
}

Result<Mesh> Mesh::parse(const std::string& text) {
  std::string s;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  }
  if (!s.empty() && s.front() == '{') {
    if (s.back() != '}') return Status::invalid("mesh '" + text + "': missing closing '}'");
    s = s.substr(1, s.size() - 2);
  }
  std::vector<MeshAxis> axes;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(pos, end - pos);
    size_t sep = item.find_first_of("=:");
    if (sep == std::string::npos || sep == 0 || sep + 1 == item.size()) {
      return Status::invalid("mesh '" + text +
                             "': expected 'name=size' (e.g. \"dp=2,tp=4\"), got '" + item + "'");
    }
    std::string num = item.substr(sep + 1);
    for (char c : num) {
      if (!std::isdigit(static_cast<unsigned char>(c)) || num.size() > 9) {
        return Status::invalid("mesh '" + text + "': size of axis '" + item.substr(0, sep) +
                               "' is '" + num + "', not a positive integer");
      }
    }
    axes.push_back({item.substr(0, sep), std::stoi(num)});
    pos = end + 1;
  }
  auto m = make(std::move(axes));
  if (!m.is_ok()) return m.status().with_context("mesh '" + text + "'");
  return m;
}

int Mesh::axis_index(const std::string& name) const {
  for (int i = 0; i < num_axes(); ++i) {
    if (axes_[i].name == name) return i;
  }
  return -1;
}

int Mesh::num_ranks() const {
  int n = 1;
  for (const MeshAxis& a : axes_) n *= a.size;
  return n;
}

std::vector<int> Mesh::coords(int rank) const {
  MF_CHECK(rank >= 0 && rank < num_ranks()) << "rank " << rank << " on " << to_string();
  std::vector<int> c(axes_.size());
  for (int i = num_axes() - 1; i >= 0; --i) {
    c[i] = rank % axes_[i].size;
    rank /= axes_[i].size;
  }
  return c;
}

int Mesh::rank_of(const std::vector<int>& coords) const {
  MF_CHECK_EQ(static_cast<int>(coords.size()), num_axes());
  int r = 0;
  for (int i = 0; i < num_axes(); ++i) {
    MF_CHECK(coords[i] >= 0 && coords[i] < axes_[i].size) << "axis " << axes_[i].name;
    r = r * axes_[i].size + coords[i];
  }
  return r;
}

std::vector<int> Mesh::axis_group(int axis, int rank) const {
  MF_CHECK(axis >= 0 && axis < num_axes()) << "axis " << axis;
  std::vector<int> c = coords(rank);
  std::vector<int> group;
  for (int k = 0; k < axes_[axis].size; ++k) {
    c[axis] = k;
    group.push_back(rank_of(c));
  }
  return group;
}

std::string Mesh::to_string() const {
  std::string s = "{";
  for (int i = 0; i < num_axes(); ++i) {
    if (i) s += ", ";
    s += axes_[i].name + ": " + std::to_string(axes_[i].size);
  }
  return s + "}";
}

size_t Mesh::hash() const {
  size_t h = 0x9e3779b97f4a7c15ull;
  for (const MeshAxis& a : axes_) {
    h = (h * 31) ^ std::hash<std::string>()(a.name);
    h = (h * 31) ^ static_cast<size_t>(a.size);
  }
  return h;
}

}  // namespace meshflow
