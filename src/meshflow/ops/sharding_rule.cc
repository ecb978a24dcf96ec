#include "meshflow/ops/sharding_rule.h"

#include <algorithm>
#include <numeric>

#include "meshflow/core/check.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/ops/window.h"

namespace meshflow {

using Factor = ShardingRule::Factor;

int ShardingRule::add(std::string name, int64_t size, Factor::Kind kind) {
  Factor f;
  f.name = std::move(name);
  f.size = size;
  f.kind = kind;
  f.input_dim.assign(num_inputs, -1);
  f.output_dim.assign(num_outputs, -1);
  factors.push_back(std::move(f));
  return static_cast<int>(factors.size()) - 1;
}

ShardingRule& ShardingRule::in(int factor, int input, int dim) {
  factors[factor].input_dim[input] = dim;
  return *this;
}

ShardingRule& ShardingRule::out(int factor, int output, int dim) {
  factors[factor].output_dim[output] = dim;
  return *this;
}

int ShardingRule::input_factor(int operand, int dim) const {
  for (size_t f = 0; f < factors.size(); ++f)
    if (factors[f].input_dim[operand] == dim) return static_cast<int>(f);
  return -1;
}

int ShardingRule::output_factor(int operand, int dim) const {
  for (size_t f = 0; f < factors.size(); ++f)
    if (factors[f].output_dim[operand] == dim) return static_cast<int>(f);
  return -1;
}

std::string ShardingRule::to_string() const {
  std::string s;
  for (const Factor& f : factors) {
    if (!s.empty()) s += " ";
    s += f.name + "=" + std::to_string(f.size);
    if (f.kind == Factor::kReduction) s += "(red)";
    if (f.kind == Factor::kHalo) s += "(halo " + std::to_string(f.halo) + ")";
    if (f.kind == Factor::kNeedReplicate) s += "(rep)";
    if (f.kind == Factor::kCollective) s += "(coll)";
  }
  return s;
}

std::string ShardingStrategy::to_string() const {
  std::string s;
  for (size_t i = 0; i < inputs.size(); ++i) s += (i ? ", " : "") + inputs[i].to_string();
  s += " ->";
  for (size_t i = 0; i < outputs.size(); ++i) s += (i ? ", " : " ") + outputs[i].to_string();
  return s;
}

ShardingRule sharding_rule(const Graph& g, const Node& n) {
  const OpDef& d = op_def(n.kind);
  MF_CHECK(d.sharding != nullptr) << node_label(n) << " has no sharding rule";
  ShardingRule r = d.sharding(g, n);
  MF_CHECK(r.num_inputs == static_cast<int>(n.inputs.size()) &&
           r.num_outputs == static_cast<int>(n.outputs.size()))
      << node_label(n) << ": sharding rule operand counts";
  return r;
}

// "1, 2, 4, 8": the split counts the mesh can make (products of axis subsets)
// that divide `size`.
std::string mesh_splits(int64_t size, const Mesh& mesh) {
  std::vector<int64_t> counts = {1};
  for (int a = 0; a < mesh.num_axes(); ++a) {
    size_t k = counts.size();
    for (size_t i = 0; i < k; ++i) counts.push_back(counts[i] * mesh.size(a));
  }
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  std::string s;
  for (int64_t c : counts)
    if (size % c == 0) s += (s.empty() ? "" : ", ") + std::to_string(c);
  return s;
}

namespace {}  // namespace

Result<std::vector<Layout>> derive_output_layouts(const Graph& g, const Node& n, const Mesh& mesh,
                                                  const std::vector<Layout>& inputs) {
  const std::string label = node_label(n);
  if (inputs.size() != n.inputs.size())
    return Status::invalid(label + ": " + std::to_string(inputs.size()) + " input layouts for " +
                           std::to_string(n.inputs.size()) + " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    Status s = validate(inputs[i], mesh, g.shape(n.inputs[i]));
    if (!s.is_ok())
      return Status::invalid(label + ": input " + std::to_string(i) + ": " + s.message());
  }
  const ShardingRule r = sharding_rule(g, n);
  const int nin = r.num_inputs, nout = r.num_outputs, naxes = mesh.num_axes();
  // Per factor: the mesh axes sharding it (major first), from the first input that has it.
  std::vector<std::vector<int>> axes_of(r.factors.size());
  std::vector<int> first_input(r.factors.size(), -1);
  for (int i = 0; i < nin; ++i) {
    const Shape& sh = g.shape(n.inputs[i]);
    for (int d = 0; d < sh.rank(); ++d) {
      std::vector<int> ax = inputs[i].shard_axes(d);
      int f = r.input_factor(i, d);
      if (ax.empty()) continue;
      std::string dim =
          "dim " + std::to_string(d) + " (" + sh.name(d) + "=" + std::to_string(sh.size(d)) + ")";
      if (f < 0)
        return Status::invalid(label + ": " + dim + " of input " + std::to_string(i) +
                               " cannot be sharded (it is split or merged by the op); keep it R");
      const Factor& fa = r.factors[f];
      if (fa.kind == Factor::kNeedReplicate)
        return Status::invalid(label + ": " + dim + " of input " + std::to_string(i) +
                               " is factor " + fa.name + "=" + std::to_string(fa.size) +
                               ", which must be replicated; valid splits of " + fa.name + ": 1");
      if (first_input[f] < 0) {
        first_input[f] = i;
        axes_of[f] = ax;
      }
    }
  }
  // Every operand that has a sharded factor must be sharded the same way.
  for (size_t f = 0; f < r.factors.size(); ++f) {
    const Factor& fa = r.factors[f];
    const std::string valid = "; valid splits of " + fa.name + ": " + mesh_splits(fa.size, mesh);
    int64_t count0 = 1;
    for (int a : axes_of[f]) count0 *= mesh.size(a);
    for (int i = 0; i < nin; ++i) {
      int d = fa.input_dim[i];
      if (d < 0) continue;
      std::vector<int> ax = inputs[i].shard_axes(d);
      if (ax == axes_of[f]) continue;
      int64_t count = 1;
      for (int a : ax) count *= mesh.size(a);
      std::string head = label + ": dim " + fa.name + "=" + std::to_string(fa.size);
      if (count != count0)
        return Status::invalid(head + " is split " + std::to_string(count0) + " ways on input " +
                               std::to_string(first_input[f]) + " but " + std::to_string(count) +
                               " ways on input " + std::to_string(i) + valid);
      return Status::invalid(
          head + " is split over mesh axes " + inputs[first_input[f]].to_string() + " on input " +
          std::to_string(first_input[f]) + " but " + inputs[i].to_string() + " on input " +
          std::to_string(i) + "; the same axes in the same order are needed");
    }
    if (fa.size % count0 != 0)
      return Status::invalid(label + ": dim " + fa.name + "=" + std::to_string(fa.size) +
                             " cannot be split " + std::to_string(count0) + " ways" + valid);
    if (fa.ring && axes_of[f].size() > 1)
      return Status::invalid(label + ": " + fa.name + " is split over several mesh axes; its " +
                             "ring (k/v blocks passed between neighbours) runs on one, so " +
                             "split it over one");
    if (fa.kind == Factor::kHalo && count0 > 1) {
      if (axes_of[f].size() > 1)
        return Status::invalid(label + ": spatial dim " + fa.name +
                               " is split over several mesh axes; its halo exchange runs between "
                               "neighbours on one axis, so split it over one");
      const int64_t rows = fa.size / count0 * fa.halo_unit;
      if (rows < fa.halo) {
        int64_t most = 1;
        for (int64_t k = 1; k <= fa.size; ++k)
          if (fa.size % k == 0 && fa.size / k * fa.halo_unit >= fa.halo) most = k;
        return Status::invalid(label + ": splitting " + fa.name + " " + std::to_string(count0) +
                               " ways leaves " + std::to_string(rows) +
                               " input rows per block, fewer than the " + std::to_string(fa.halo) +
                               " rows its window reaches into a neighbour's block (the halo); "
                               "split it at most " +
                               std::to_string(most) + " ways");
      }
    }
  }
  std::vector<std::vector<Placement>> outp(nout,
                                           std::vector<Placement>(naxes, Placement::Replicate()));
  for (int a = 0; a < naxes; ++a) {
    std::vector<int> partial;
    int factor = -1;
    for (int i = 0; i < nin; ++i) {
      const Placement& p = inputs[i].at(a);
      if (p.is_partial()) partial.push_back(i);
      if (!p.is_shard()) continue;
      int f = r.input_factor(i, p.dim());
      if (factor >= 0 && f != factor)
        return Status::invalid(label + ": mesh axis " + mesh.axis_name(a) + " splits factor " +
                               r.factors[factor].name + " and factor " + r.factors[f].name +
                               " at once; one factor per mesh axis");
      factor = f;
    }
    if (!partial.empty()) {
      bool ok = factor < 0 && std::find(r.partial_inputs.begin(), r.partial_inputs.end(),
                                        partial) != r.partial_inputs.end();
      if (!ok) {
        std::string valid;
        for (const auto& set : r.partial_inputs) {
          valid += valid.empty() ? "{" : ", {";
          for (size_t k = 0; k < set.size(); ++k) valid += (k ? "," : "") + std::to_string(set[k]);
          valid += "}";
        }
        return Status::invalid(
            label + ": on mesh axis " + mesh.axis_name(a) + " the Partial inputs must be one of " +
            (valid.empty() ? std::string("none") : valid) + " with every other input R");
      }
      for (int o = 0; o < nout; ++o) outp[o][a] = Placement::Partial();
      continue;
    }
    if (factor < 0) continue;
    const Factor& fa = r.factors[factor];
    const auto& ax = axes_of[factor];
    int order = static_cast<int>(std::find(ax.begin(), ax.end(), a) - ax.begin());
    for (int o = 0; o < nout; ++o) {
      if (fa.output_dim[o] >= 0)
        outp[o][a] = Placement::Shard(fa.output_dim[o], order);
      else if (fa.kind == Factor::kReduction || fa.kind == Factor::kHalo)
        outp[o][a] = Placement::Partial();
    }
  }
  std::vector<Layout> outs;
  for (int o = 0; o < nout; ++o) {
    // Orders are given only for sharded dims; make() wants all or none per dim.
    MF_ASSIGN_OR_RETURN(Layout l, Layout::make(outp[o]));
    outs.push_back(std::move(l));
  }
  return outs;
}

namespace {

// A factor no input carries that the op can split (Factor::output_split).
bool output_only(const Factor& f) {
  return f.output_split && f.kind == Factor::kPassThrough &&
         std::all_of(f.input_dim.begin(), f.input_dim.end(), [](int d) { return d < 0; }) &&
         std::any_of(f.output_dim.begin(), f.output_dim.end(), [](int d) { return d >= 0; });
}

// derive_output_layouts, with the output-only factor split_by[a] (or -1) on
// each mesh axis a: the inputs must be whole there; the outputs that carry
// the factor are split over those axes (in axis order).
Result<std::vector<Layout>> derive_with_output_only(const Graph& g, const Node& n, const Mesh& mesh,
                                                    const std::vector<Layout>& inputs,
                                                    const std::vector<int>& split_by) {
  MF_ASSIGN_OR_RETURN(std::vector<Layout> outs, derive_output_layouts(g, n, mesh, inputs));
  if (std::all_of(split_by.begin(), split_by.end(), [](int f) { return f < 0; })) return outs;
  const ShardingRule r = sharding_rule(g, n);
  std::vector<int64_t> count(r.factors.size(), 1);
  std::vector<int> order(r.factors.size(), 0);
  std::vector<std::vector<Placement>> p(outs.size());
  for (size_t o = 0; o < outs.size(); ++o)
    for (int a = 0; a < mesh.num_axes(); ++a) p[o].push_back(outs[o].at(a));
  for (int a = 0; a < mesh.num_axes(); ++a) {
    const int f = split_by[static_cast<size_t>(a)];
    if (f < 0) continue;
    const Factor& fa = r.factors[static_cast<size_t>(f)];
    for (const Layout& l : inputs)
      if (!l.at(a).is_replicate())
        return Status::invalid(node_label(n) + ": mesh axis " + mesh.axis_name(a) +
                               " splits an input and the outputs' own dim " + fa.name +
                               "; one factor per mesh axis");
    count[static_cast<size_t>(f)] *= mesh.size(a);
    const int k = order[static_cast<size_t>(f)]++;
    for (size_t o = 0; o < outs.size(); ++o)
      if (fa.output_dim[o] >= 0)
        p[o][static_cast<size_t>(a)] = Placement::Shard(fa.output_dim[o], k);
  }
  for (size_t f = 0; f < r.factors.size(); ++f)
    if (r.factors[f].size % count[f] != 0)
      return Status::invalid(node_label(n) + ": dim " + r.factors[f].name + "=" +
                             std::to_string(r.factors[f].size) + " cannot be split " +
                             std::to_string(count[f]) + " ways; valid splits of " +
                             r.factors[f].name + ": " + mesh_splits(r.factors[f].size, mesh));
  for (size_t o = 0; o < outs.size(); ++o) {
    MF_ASSIGN_OR_RETURN(outs[o], Layout::make(p[o]));
  }
  return outs;
}

}  // namespace

Status validate_strategy(const Graph& g, const Node& n, const Mesh& mesh,
                         const std::vector<Layout>& inputs, const std::vector<Layout>& outputs) {
  MF_ASSIGN_OR_RETURN(std::vector<Layout> want, derive_output_layouts(g, n, mesh, inputs));
  // An output split where the inputs leave it whole, on a factor only the
  // outputs carry: that factor split there.
  if (outputs.size() == want.size()) {
    const ShardingRule r = sharding_rule(g, n);
    std::vector<int> split_by(static_cast<size_t>(mesh.num_axes()), -1);
    for (size_t o = 0; o < want.size(); ++o)
      for (int a = 0; a < mesh.num_axes(); ++a) {
        const Placement& given = outputs[o].at(a);
        if (!given.is_shard() || !want[o].at(a).is_replicate()) continue;
        const int f = r.output_factor(static_cast<int>(o), given.dim());
        if (f >= 0 && output_only(r.factors[static_cast<size_t>(f)]))
          split_by[static_cast<size_t>(a)] = f;
      }
    MF_ASSIGN_OR_RETURN(want, derive_with_output_only(g, n, mesh, inputs, split_by));
  }
  if (outputs.size() != want.size())
    return Status::invalid(node_label(n) + ": " + std::to_string(outputs.size()) +
                           " output layouts for " + std::to_string(want.size()) + " outputs");
  for (size_t o = 0; o < want.size(); ++o)
    if (!(outputs[o] == want[o]))
      return Status::invalid(node_label(n) + ": output " + std::to_string(o) + " " +
                             g.shape(n.outputs[o]).to_string() + " would be " +
                             want[o].to_string() + " given these inputs, not " +
                             outputs[o].to_string());
  return Status::ok();
}

std::vector<ShardingStrategy> enumerate_strategies(const Graph& g, const Node& n,
                                                   const Mesh& mesh) {
  const ShardingRule r = sharding_rule(g, n);
  std::vector<int> options = {-1};
  for (size_t f = 0; f < r.factors.size(); ++f)
    if (r.factors[f].kind != Factor::kNeedReplicate && r.factors[f].size > 1)
      options.push_back(static_cast<int>(f));
  const int naxes = mesh.num_axes();
  std::vector<int> pick(naxes, 0);
  std::vector<ShardingStrategy> out;
  while (true) {
    // A mesh axis of size 1 splits nothing: it only ever takes "no factor".
    bool trivial = false;
    for (int a = 0; a < naxes; ++a) trivial |= mesh.size(a) == 1 && options[pick[a]] >= 0;
    std::vector<int64_t> count(r.factors.size(), 1);
    for (int a = 0; a < naxes; ++a)
      if (options[pick[a]] >= 0) count[options[pick[a]]] *= mesh.size(a);
    bool ok = !trivial;
    for (size_t f = 0; f < r.factors.size(); ++f) ok = ok && r.factors[f].size % count[f] == 0;
    if (ok) {
      ShardingStrategy st;
      for (int i = 0; i < r.num_inputs && ok; ++i) {
        std::vector<Placement> p(naxes, Placement::Replicate());
        for (int a = 0; a < naxes; ++a) {
          int f = options[pick[a]];
          if (f >= 0 && r.factors[f].input_dim[i] >= 0)
            p[a] = Placement::Shard(r.factors[f].input_dim[i]);
        }
        Result<Layout> l = Layout::make(p);
        ok = l.is_ok() && validate(l.value(), mesh, g.shape(n.inputs[i])).is_ok();
        if (ok) st.inputs.push_back(l.value());
      }
      if (ok) {
        std::vector<int> split_by(static_cast<size_t>(naxes), -1);
        for (int a = 0; a < naxes; ++a) {
          const int f = options[pick[a]];
          if (f >= 0 && output_only(r.factors[static_cast<size_t>(f)]))
            split_by[static_cast<size_t>(a)] = f;
        }
        Result<std::vector<Layout>> outs = derive_with_output_only(g, n, mesh, st.inputs, split_by);
        ok = outs.is_ok();
        for (int o = 0; ok && o < r.num_outputs; ++o)
          ok = validate(outs.value()[o], mesh, g.shape(n.outputs[o])).is_ok();
        if (ok) {
          st.outputs = outs.value();
          out.push_back(std::move(st));
        }
      }
    }
    int a = naxes - 1;
    while (a >= 0 && ++pick[a] == static_cast<int>(options.size())) pick[a--] = 0;
    if (a < 0) break;
  }
  return out;
}

// ---- rule builders ----

ShardingRule broadcast_rule(const Graph& g, const Node& n, const Shape& ref) {
  ShardingRule r(static_cast<int>(n.inputs.size()), static_cast<int>(n.outputs.size()));
  for (int d = 0; d < ref.rank(); ++d) r.add(ref.name(d), ref.size(d));
  auto match = [&](const Shape& s, auto&& set) {
    int off = ref.rank() - s.rank();
    for (int d = 0; d < s.rank(); ++d) {
      int rd = d + off;
      if (rd < 0 || s.size(d) != ref.size(rd)) continue;
      set(rd, d);
    }
  };
  for (int i = 0; i < r.num_inputs; ++i)
    match(g.shape(n.inputs[i]), [&](int f, int d) { r.in(f, i, d); });
  for (int o = 0; o < r.num_outputs; ++o)
    match(g.shape(n.outputs[o]), [&](int f, int d) { r.out(f, o, d); });
  return r;
}

void set_input_factor_kind(ShardingRule& r, int input, int dim, Factor::Kind kind) {
  int f = r.input_factor(input, dim);
  if (f >= 0) r.factors[f].kind = kind;
}

std::vector<ReshapeGroup> reshape_groups(const Shape& in, const Shape& out) {
  MF_CHECK_EQ(in.numel(), out.numel()) << "reshape " << in.to_string() << " -> " << out.to_string();
  std::vector<ReshapeGroup> gs;
  int i = 0, o = 0;
  while (true) {
    while (i < in.rank() && in.size(i) == 1) ++i;
    while (o < out.rank() && out.size(o) == 1) ++o;
    if (i == in.rank() || o == out.rank()) break;
    int i1 = i + 1, o1 = o + 1;
    int64_t pi = in.size(i), po = out.size(o);
    while (pi != po) {
      if (pi < po)
        pi *= in.size(i1++);
      else
        po *= out.size(o1++);
    }
    gs.push_back({i, i1, o, o1});
    i = i1;
    o = o1;
  }
  return gs;
}

ShardingRule reshape_rule(const Shape& in, const Shape& out) {
  ShardingRule r(1, 1);
  for (const auto& [i, i1, o, o1] : reshape_groups(in, out)) {
    if (i1 == i + 1 && o1 == o + 1) {
      int f = r.add(out.name(o), out.size(o));
      r.in(f, 0, i).out(f, 0, o);
    } else {
      int64_t gsz = std::gcd(in.size(i), out.size(o));
      int f = r.add(in.name(i) + ">" + out.name(o), gsz);
      r.in(f, 0, i).out(f, 0, o);
      for (int k = i + 1; k < i1; ++k)
        if (in.size(k) > 1) r.in(r.add(in.name(k), in.size(k), Factor::kNeedReplicate), 0, k);
      for (int k = o + 1; k < o1; ++k)
        if (out.size(k) > 1) r.out(r.add(out.name(k), out.size(k), Factor::kNeedReplicate), 0, k);
    }
  }
  return r;
}

void set_shard_offsets(Attrs& attrs, const Shape& global, const Layout& l, const Mesh& mesh,
                       int rank) {
  if (l.is_replicated() || !l.has_partial()) {
    bool sharded = false;
    for (int d = 0; d < global.rank(); ++d) sharded |= l.shard_count(d, mesh) > 1;
    if (!sharded) return;
  }
  attrs.global_dims.clear();
  attrs.global_offset.clear();
  const auto ranges = local_ranges(global, mesh, l, rank);
  for (int d = 0; d < global.rank(); ++d) {
    attrs.global_dims.push_back(global.size(d));
    attrs.global_offset.push_back(ranges[d].first);
  }
}

void set_local_attrs(LocalAttrsCall& c) {
  if (const LocalAttrsFn fn = op_def(c.n.kind).local_attrs) fn(c);
}

// ---- windows (ops/window.h) ----

bool make_halo_factor(ShardingRule::Factor& f, const Attrs& a, int d, int64_t kernel,
                      int64_t in_rows, int64_t out_rows) {
  if (in_rows != out_rows * a.stride[d]) return false;
  const WindowHalo h = window_halo(a, d, kernel);
  f.kind = ShardingRule::Factor::kHalo;
  f.size = out_rows;
  f.halo = std::max(h.lo, h.hi);
  f.halo_unit = a.stride[d];
  return true;
}

void set_halo_axes(LocalAttrsCall& c, const Layout& x) {
  for (int d = 0; d < 2; ++d) {
    c.attrs.halo_axis[d] = -1;
    for (int ax : x.shard_axes(2 + d))
      if (c.mesh.size(ax) > 1) c.attrs.halo_axis[d] = ax;
  }
}

void add_halo_collectives(const Attrs& a, const Shape& x, std::array<int64_t, 2> kernel, bool grow,
                          bool fold, std::vector<InnerCollective>* out) {
  for (int d = 0; d < 2; ++d) {
    if (a.halo_axis[d] < 0) continue;
    const WindowHalo h = window_halo(a, d, kernel[d]);
    if (h.lo + h.hi == 0) continue;  // a 1x1 window: nothing to exchange
    const int64_t rows = x.numel() / x.size(2 + d) * (h.lo + h.hi);
    const std::string what = std::string(d == 0 ? "height" : "width") + " halo rows";
    if (grow) out->push_back({OpKind::kNeighborExchange, a.halo_axis[d], rows, what, 2 + d});
    if (fold) out->push_back({OpKind::kNeighborExchangeGrad, a.halo_axis[d], rows, what, 2 + d});
  }
}

}  // namespace meshflow
