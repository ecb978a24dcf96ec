#include "meshflow/plan/cluster.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <regex>
#include <sstream>
#include <thread>

#include "meshflow/comm/transport.h"
#include "meshflow/core/check.h"

namespace meshflow::plan {

const Link& Cluster::link_for_ranks(const std::vector<int64_t>& ranks) const {
  MF_CHECK(!ranks.empty());
  // (Islands count from each node's first device.)
  const int64_t island = island_devices(), fabric = fabric_devices();
  const int64_t node = ranks[0] / fabric;
  const int64_t first_island = ranks[0] % fabric / island;
  bool one_island = true;
  for (int64_t r : ranks) {
    MF_CHECK(r >= 0 && r < total_devices());
    if (r / fabric != node) return inter_node;
    one_island = one_island && r % fabric / island == first_island;
  }
  return one_island ? intra_node : between_islands;
}

const Link& Cluster::link_for_axis(int64_t size, int64_t stride) const {
  MF_CHECK(size >= 1 && stride >= 1);
  const int64_t span = (size - 1) * stride + 1;
  if (span <= island_devices()) return intra_node;
  return span <= fabric_devices() ? between_islands : inter_node;
}

Link Cluster::ring_link_for_axis(int64_t size, int64_t stride) const {
  MF_CHECK(size >= 1 && stride >= 1);
  const int64_t span = (size - 1) * stride + 1, island = island_devices(),
                fabric = fabric_devices();
  if (span <= island) return intra_node;
  const Link islands = striped_between_islands(std::clamp<int64_t>(island / stride, 1, size));
  if (span <= fabric) return islands;
  const int64_t in_node = std::clamp<int64_t>(fabric / stride, 1, size);  // members a node
  Link l = striped_inter_node(in_node);
  // The ring's hops inside a node cross its islands where its members there
  // span more than one.
  if (island < fabric && (in_node - 1) * stride + 1 > island &&
      l.effective_bandwidth() > islands.effective_bandwidth())
    l.bandwidth_bytes_per_s = islands.effective_bandwidth() / l.efficiency;
  return l;
}

namespace {

// `base` at k times its bandwidth (latency and efficiency unchanged), at most
// `cap` effective bytes per second when k > 1.
Link striped(const Link& base, int64_t k, double cap) {
  MF_CHECK(k >= 1);
  Link l = base;
  l.bandwidth_bytes_per_s *= static_cast<double>(k);
  if (k > 1 && l.effective_bandwidth() > cap) l.bandwidth_bytes_per_s = cap / l.efficiency;
  return l;
}

}  // namespace

Link Cluster::striped_inter_node(int64_t k) const {
  return striped(inter_node, k, intra_node.effective_bandwidth());
}

Link Cluster::striped_between_islands(int64_t k) const {
  return striped(between_islands, k, intra_node.effective_bandwidth());
}

double Cluster::peak_flops(DType dtype, bool allow_tf32) const {
  const PeakFlops& p = device.peak_flops;
  double v = p.f32;
  if (dtype == DType::F32 && allow_tf32) v = p.tf32;
  if (dtype == DType::BF16) v = p.bf16;
  if (dtype == DType::F16) v = p.f16;
  return v > 0 ? v : p.f32;
}

namespace {

// A table's value at `x`: interpolated linearly in log(x) between the points
// around it (ascending by key(p)), the end's value beyond either end.
template <class Point, class Key, class Value>
double log_interpolated(const std::vector<Point>& pts, double x, Key key, Value value) {
  if (x <= key(pts.front())) return value(pts.front());
  for (size_t i = 1; i < pts.size(); ++i) {
    if (x > key(pts[i])) continue;
    const double t = (std::log(x) - std::log(key(pts[i - 1]))) /
                     (std::log(key(pts[i])) - std::log(key(pts[i - 1])));
    return value(pts[i - 1]) + t * (value(pts[i]) - value(pts[i - 1]));
  }
  return value(pts.back());
}

}  // namespace

double Cluster::matmul_efficiency(double flops) const {
  const std::vector<EfficiencyPoint>& c = device.matmul_efficiency;
  if (c.empty()) return 1.0;
  return log_interpolated(
      c, flops / 1e9, [](const EfficiencyPoint& p) { return p.gflop; },
      [](const EfficiencyPoint& p) { return p.efficiency; });
}

double AttentionEfficiency::at(double keys, bool fwd) const {
  if (by_keys.empty()) return fwd ? forward : backward;
  return log_interpolated(
      by_keys, keys, [](const AttentionPoint& p) { return p.keys; },
      [fwd](const AttentionPoint& p) { return fwd ? p.forward : p.backward; });
}

double Cluster::compute_bound_time_s(double flops, double peak, double efficiency) const {
  if (flops <= 0) return 0;
  return flops / (peak * efficiency * device.compute_clock_scale());
}

double Cluster::matmul_time_s(double flops, DType dtype, bool allow_tf32) const {
  return compute_bound_time_s(flops, peak_flops(dtype, allow_tf32), matmul_efficiency(flops));
}

double Device::compute_clock_scale() const {
  if (!(power_limit_w > 0 && rated_power_w > 0) || power_limit_w >= rated_power_w) return 1.0;
  return std::cbrt(power_limit_w / rated_power_w);
}

double Device::kernel_scale(OpKind kind) const {
  if (kernel_time_scale.empty()) return 1.0;
  const auto it = kernel_time_scale.find(op_name(kind));
  return it == kernel_time_scale.end() ? 1.0 : it->second;
}

double Cluster::fp8_matmul_time_s(double flops) const {
  return compute_bound_time_s(flops, device.peak_flops.fp8,
                              matmul_efficiency(flops) * device.fp8_matmul_efficiency);
}

double ThinGrid::at(double dim_, double big_) const {
  if (empty() || dim.empty()) return 1.0;
  // The fractional index of x on axis v, in log space, clamped to its ends.
  auto locate = [](const std::vector<double>& v, double x, size_t* i, double* t) {
    *i = 0, *t = 0;
    if (v.size() == 1 || x <= v.front()) return;
    if (x >= v.back()) {
      *i = v.size() - 2, *t = 1;
      return;
    }
    while (*i + 2 < v.size() && x > v[*i + 1]) ++*i;
    *t = (std::log(x) - std::log(v[*i])) / (std::log(v[*i + 1]) - std::log(v[*i]));
  };
  size_t bi = 0, di = 0;
  double bt = 0, dt = 0;
  locate(big, big_, &bi, &bt);
  locate(dim, dim_, &di, &dt);
  auto f = [&](size_t b, size_t d) {
    return factor[std::min(b, big.size() - 1)][std::min(d, dim.size() - 1)];
  };
  const double lo = f(bi, di) + dt * (f(bi, di + 1) - f(bi, di));
  const double hi = f(bi + 1, di) + dt * (f(bi + 1, di + 1) - f(bi + 1, di));
  return std::min(1.0, lo + bt * (hi - lo));
}

double Cluster::matmul_shape_factor(double m, double n, double k) const {
  const ThinGrid& g = device.matmul_thin_efficiency;
  if (g.empty() || !(m > 0 && n > 0 && k > 0)) return 1.0;
  const double thin = std::min({m, n, k}), big = std::sqrt(m * n * k / thin);
  return thin >= big ? 1.0 : g.at(thin, big);
}

double Cluster::memory_time_s(double bytes) const {
  if (bytes <= 0) return 0;
  return bytes / (device.memory_bandwidth_bytes_per_s * device.memory_efficiency);
}

double Cluster::roofline_time_s(double flops, double bytes, DType dtype) const {
  return std::max(matmul_time_s(flops, dtype), memory_time_s(bytes));
}

double Cluster::collective_time_s(Collective c, int64_t n, double bytes, const Link& link) const {
  return meshflow::collective_time_s(c, n, bytes, link);
}

double Cluster::collective_time_s(Collective c, const std::vector<int64_t>& ranks,
                                  double bytes) const {
  return collective_time_s(c, static_cast<int64_t>(ranks.size()), bytes, link_for_ranks(ranks));
}

ReshardCostModel reshard_costs(const Cluster& c, const Mesh& mesh, std::vector<int64_t> strides,
                               int64_t bytes_per_element) {
  if (strides.empty()) {
    strides.assign(static_cast<size_t>(mesh.num_axes()), 1);
    for (int a = mesh.num_axes() - 2; a >= 0; --a) strides[a] = strides[a + 1] * mesh.size(a + 1);
  }
  MF_CHECK(static_cast<int>(strides.size()) == mesh.num_axes());
  ReshardCostModel m;
  m.bytes_per_element = bytes_per_element;
  for (int a = 0; a < mesh.num_axes(); ++a) {
    const int64_t size = mesh.size(a), stride = strides[static_cast<size_t>(a)];
    m.axes.push_back(c.link_for_axis(size, stride));
    m.ring_axes.push_back(c.ring_link_for_axis(size, stride));
  }
  return m;
}

Result<Cluster> with_devices(const Cluster& c, int64_t devices) {
  const int64_t per = c.devices_per_node;
  if (devices < 1)
    return Status::invalid("the number of devices must be >= 1, got " + std::to_string(devices));
  Cluster r = c;
  if (devices <= per) {
    r.nodes = 1;
    r.devices_per_node = static_cast<int>(devices);
    if (r.devices_per_island >= r.devices_per_node) r.devices_per_island = 0;
    r.devices_per_domain = 0;  // one (partial) node: its own fabric
    return r;
  }
  if (devices % per != 0) {
    const int64_t lo = devices / per * per;
    return Status::invalid(std::to_string(devices) + " devices do not fill whole nodes of " +
                           std::to_string(per) + " in cluster '" + c.name +
                           "'; valid: <= " + std::to_string(per) + " or a multiple of " +
                           std::to_string(per) + " (e.g. " + std::to_string(lo) + " or " +
                           std::to_string(lo + per) + ")");
  }
  if (devices / per > INT32_MAX)
    return Status::invalid("too many devices: " + std::to_string(devices));
  r.nodes = static_cast<int>(devices / per);
  return r;
}

Result<Cluster> share_machine(const Cluster& machine, int64_t ranks, int64_t cores) {
  if (machine.total_devices() != 1)
    return Status::invalid("cluster '" + machine.name + "' has " +
                           std::to_string(machine.total_devices()) +
                           " devices; sharing a machine among local ranks needs a one-device "
                           "cluster (the whole machine, as meshflow bench --calibrate writes)");
  if (ranks < 1 || ranks > 4096)
    return Status::invalid("local ranks must be in [1, 4096], got " + std::to_string(ranks));
  Cluster r = machine;
  const double share = 1.0 / static_cast<double>(ranks);
  r.nodes = 1;
  r.devices_per_node = static_cast<int>(ranks);
  PeakFlops& p = r.device.peak_flops;
  for (double* f : {&p.f32, &p.tf32, &p.bf16, &p.f16, &p.fp8}) *f *= share;
  r.device.memory_bandwidth_bytes_per_s *= share;
  r.device.memory_bytes =
      static_cast<int64_t>(static_cast<double>(machine.device.memory_bytes) * share);
  for (EfficiencyPoint& e : r.device.matmul_efficiency) e.gflop *= share;
  if (cores <= 0) cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  // A rank with one core runs its GEMMs on one thread, where a thin side
  // costs another share than on all of them.
  if (ranks >= cores && !machine.device.matmul_thin_efficiency_one_thread.empty())
    r.device.matmul_thin_efficiency = machine.device.matmul_thin_efficiency_one_thread;
  if (ranks > cores) {
    r.intra_node.latency_s = machine.time_shared_latency_s > 0
                                 ? std::max(r.intra_node.latency_s, machine.time_shared_latency_s)
                                 : r.intra_node.latency_s + LocalTransportOptions{}.spin_us * 1e-6;
    r.shared_cores = cores;
  }
  r.inter_node = r.intra_node;
  if (ranks > 1) r.name = machine.name + " x" + std::to_string(ranks) + " ranks";
  return r;
}

// ---------------------------------------------------------------- parsing

namespace {

std::string num(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

// The plausible ends of a cluster file's figures (read_number's bounds): a
// link or memory slower than 1 MB/s, a device under 1 MFLOP/s, a message step
// over a second describe no machine the planner prices.
constexpr double kLeastBandwidth = 1e6;
constexpr double kLeastFlops = 1e6;
constexpr double kMostLatencyS = 1.0;

// Reads a number key of j (in the object `where`) that must be > 0, or >= 0
// when allow_zero, and where given at least `lo` when positive and at most
// `hi`; the reader records the key as known and the first error. The bounds
// keep a figure no machine has (a link whose message step takes years, a
// device of a few FLOP/s) out of the prices, where it would only surface as
// a solver's overflow.
void read_number(JsonObjectReader& r, const json& j, const std::string& where,
                 const std::string& key, double* out, bool allow_zero, const char* unit,
                 double lo = 0, double hi = std::numeric_limits<double>::infinity()) {
  r.ignore({key.c_str()});
  if (!j.is_object() || !j.contains(key)) return;
  const json& v = j.at(key);
  std::string bound = allow_zero ? ">= 0" : "> 0";
  const std::string top = std::isfinite(hi) ? num(hi) + "]" : std::string("inf)");
  if (lo > 0)
    bound = std::string(allow_zero ? "0 or in [" : "in [") + num(lo) + ", " + top;
  else if (std::isfinite(hi))
    bound = std::string(allow_zero ? "in [0, " : "in (0, ") + top;
  if (!v.is_number())
    return r.fail(where + "." + key + " must be a number " + bound + " (" + unit + "), got " +
                  json_type_name(v));
  const double x = v.get<double>();
  const bool zero_ok = allow_zero && x == 0;
  if (!std::isfinite(x) || (allow_zero ? x < 0 : x <= 0) || (!zero_ok && (x < lo || x > hi)))
    return r.fail(where + "." + key + " must be " + bound + " (" + unit + "), got " + num(x));
  *out = x;
}

void read_efficiency(JsonObjectReader& r, const json& j, const std::string& where,
                     const std::string& key, double* out) {
  r.ignore({key.c_str()});
  if (!j.is_object() || !j.contains(key)) return;
  const json& v = j.at(key);
  if (!v.is_number())
    return r.fail(where + "." + key + " must be a number in (0, 1], got " + json_type_name(v));
  const double x = v.get<double>();
  if (!(x > 0 && x <= 1)) return r.fail(where + "." + key + " must be in (0, 1], got " + num(x));
  *out = x;
}

// "by_keys": [[keys, forward, backward], ...], keys > 0 ascending, each
// efficiency in (0, 1].
Status read_attention_table(const json& v, const std::string& p, std::vector<AttentionPoint>* out) {
  if (!v.is_array() || v.empty())
    return Status::invalid(p + " must be a non-empty array [[keys, forward, backward], ...], got " +
                           (v.is_array() ? std::string("[]") : json_type_name(v)));
  for (size_t i = 0; i < v.size(); ++i) {
    const json& e = v[i];
    const std::string at = p + "[" + std::to_string(i) + "]";
    if (!e.is_array() || e.size() != 3 || !e[0].is_number() || !e[1].is_number() ||
        !e[2].is_number())
      return Status::invalid(at + " must be [keys, forward, backward] (three numbers), got " +
                             (e.is_array() ? e.dump() : json_type_name(e)));
    const AttentionPoint pt{e[0].get<double>(), e[1].get<double>(), e[2].get<double>()};
    if (!(pt.keys > 0)) return Status::invalid(at + ": keys must be > 0, got " + num(pt.keys));
    for (const double x : {pt.forward, pt.backward})
      if (!(x > 0 && x <= 1))
        return Status::invalid(at + ": each efficiency must be in (0, 1], got " + num(x));
    if (!out->empty() && pt.keys <= out->back().keys)
      return Status::invalid(at + ": keys must increase along the table, got " + num(pt.keys) +
                             " after " + num(out->back().keys));
    out->push_back(pt);
  }
  return Status::ok();
}

// "matmul_efficiency": a number (the same at every size) or
// [[gflop_per_call, efficiency], ...] sorted by gflop_per_call.
void read_curve(JsonObjectReader& r, const json& j, const std::string& where,
                std::vector<EfficiencyPoint>* out) {
  const std::string key = "matmul_efficiency";
  const std::string p = where + "." + key;
  r.ignore({"matmul_efficiency"});
  if (!j.is_object() || !j.contains(key)) return;
  const json& v = j.at(key);
  if (v.is_number()) {
    double e = 1;
    read_efficiency(r, j, where, key, &e);
    *out = {{1.0, e}};
    return;
  }
  const std::string shape = " must be a number in (0, 1] or [[gflop_per_call, efficiency], ...]";
  if (!v.is_array() || v.empty()) return r.fail(p + shape + ", got " + json_type_name(v));
  std::vector<EfficiencyPoint> curve;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& e = v[i];
    const std::string at = p + "[" + std::to_string(i) + "]";
    if (!e.is_array() || e.size() != 2 || !e[0].is_number() || !e[1].is_number())
      return r.fail(at + " must be [gflop_per_call, efficiency] (two numbers), got " +
                    (e.is_array() ? e.dump() : json_type_name(e)));
    EfficiencyPoint pt{e[0].get<double>(), e[1].get<double>()};
    if (!(pt.gflop > 0)) return r.fail(at + ": gflop_per_call must be > 0, got " + num(pt.gflop));
    if (!(pt.efficiency > 0 && pt.efficiency <= 1))
      return r.fail(at + ": efficiency must be in (0, 1], got " + num(pt.efficiency));
    if (!curve.empty() && pt.gflop <= curve.back().gflop)
      return r.fail(at + ": gflop_per_call must increase along the curve, got " + num(pt.gflop) +
                    " after " + num(curve.back().gflop));
    curve.push_back(pt);
  }
  *out = std::move(curve);
}

// "matmul_thin_efficiency" (and "..._one_thread"): {"big": [...], "dim":
// [...], "factor": [[...], ...]}, a row of factors per big, one per dim.
void read_thin_grid(JsonObjectReader& r, const json& j, const std::string& where,
                    const std::string& key, ThinGrid* out) {
  const std::string p = where + "." + key;
  r.ignore({key.c_str()});
  if (!j.is_object() || !j.contains(key)) return;
  const json& v = j.at(key);
  const std::string shape =
      " must be {\"big\": [...], \"dim\": [...], \"factor\": [[...], ...]} (a GEMM's thin side, "
      "the geometric mean of its other two, and what it sustains of a square GEMM of its FLOPs)";
  if (!v.is_object() || !v.contains("big") || !v.contains("dim") || !v.contains("factor"))
    return r.fail(p + shape + ", got " + (v.is_object() ? v.dump() : json_type_name(v)));
  ThinGrid g;
  for (const char* axis : {"big", "dim"}) {
    const json& a = v.at(axis);
    std::vector<double>& out_axis = std::string(axis) == "big" ? g.big : g.dim;
    if (!a.is_array() || a.empty())
      return r.fail(p + "." + axis + " must be a non-empty array of numbers >= 1, got " +
                    json_type_name(a));
    for (size_t i = 0; i < a.size(); ++i) {
      const std::string at = p + "." + axis + "[" + std::to_string(i) + "]";
      if (!a[i].is_number() || !(a[i].get<double>() >= 1))
        return r.fail(at + " must be a number >= 1, got " + a[i].dump());
      if (!out_axis.empty() && a[i].get<double>() <= out_axis.back())
        return r.fail(at + " must increase along the axis, got " + a[i].dump() + " after " +
                      num(out_axis.back()));
      out_axis.push_back(a[i].get<double>());
    }
  }
  const json& f = v.at("factor");
  if (!f.is_array() || f.size() != g.big.size())
    return r.fail(p + ".factor must be " + std::to_string(g.big.size()) +
                  " rows (one per big), got " +
                  (f.is_array() ? std::to_string(f.size()) + " rows" : json_type_name(f)));
  for (size_t i = 0; i < f.size(); ++i) {
    const std::string row = p + ".factor[" + std::to_string(i) + "]";
    if (!f[i].is_array() || f[i].size() != g.dim.size())
      return r.fail(row + " must be " + std::to_string(g.dim.size()) +
                    " numbers (one per dim), got " + f[i].dump());
    std::vector<double> values;
    for (size_t k = 0; k < f[i].size(); ++k) {
      const json& x = f[i][k];
      if (!x.is_number() || !(x.get<double>() > 0 && x.get<double>() <= 1))
        return r.fail(row + "[" + std::to_string(k) + "] must be in (0, 1], got " + x.dump());
      values.push_back(x.get<double>());
    }
    g.factor.push_back(std::move(values));
  }
  *out = std::move(g);
}

Status parse_link(const json& j, const std::string& where, Link* link) {
  JsonObjectReader r(j, where);
  r.required("bandwidth_bytes_per_s");
  read_number(r, j, where, "bandwidth_bytes_per_s", &link->bandwidth_bytes_per_s, false,
              "bytes per second per device, one direction", kLeastBandwidth);
  read_number(r, j, where, "latency_s", &link->latency_s, true, "seconds per message step", 0,
              kMostLatencyS);
  read_efficiency(r, j, where, "efficiency", &link->efficiency);
  return r.finish();
}

Status parse_device(const json& j, const std::string& where, Device* d) {
  JsonObjectReader r(j, where);
  r.string("name", &d->name);
  r.required("peak_flops");
  json peak;
  r.object("peak_flops", &peak);
  r.required("memory_bytes");
  r.integer("memory_bytes", &d->memory_bytes, 1);
  r.required("memory_bandwidth_bytes_per_s");
  read_number(r, j, where, "memory_bandwidth_bytes_per_s", &d->memory_bandwidth_bytes_per_s, false,
              "bytes per second", kLeastBandwidth);
  read_curve(r, j, where, &d->matmul_efficiency);
  read_thin_grid(r, j, where, "matmul_thin_efficiency", &d->matmul_thin_efficiency);
  read_thin_grid(r, j, where, "matmul_thin_efficiency_one_thread",
                 &d->matmul_thin_efficiency_one_thread);
  read_efficiency(r, j, where, "memory_efficiency", &d->memory_efficiency);
  read_efficiency(r, j, where, "fp8_matmul_efficiency", &d->fp8_matmul_efficiency);
  read_number(r, j, where, "rated_power_w", &d->rated_power_w, false,
              "watts: the board power the compute figures hold at");
  read_number(r, j, where, "power_limit_w", &d->power_limit_w, false,
              "watts: the power limit the GPUs run at");
  json attention, kernel_scale;
  r.object("attention_efficiency", &attention);
  r.object("kernel_time_scale", &kernel_scale);
  MF_RETURN_IF_ERROR(r.finish());
  if (d->power_limit_w > 0 && d->rated_power_w <= 0)
    return Status::invalid(where +
                           ".power_limit_w needs rated_power_w: the board power the device's "
                           "compute figures were measured at (700 for an H100 or H200 SXM, 400 "
                           "for an A100 SXM)");
  if (d->power_limit_w > d->rated_power_w)
    return Status::invalid(where + ".power_limit_w must be at most rated_power_w (" +
                           num(d->rated_power_w) + " W), got " + num(d->power_limit_w) +
                           " W: a limit above it runs no faster than the figures say");
  // "kernel_time_scale": {"max_pool2d": 9.5, "batch_norm": 2.1, ...}
  if (kernel_scale.is_null()) kernel_scale = json::object();
  for (const auto& [kind, v] : kernel_scale.items()) {
    const std::string at = where + ".kernel_time_scale." + kind;
    bool known = false;
    for (int k = 0; k < kNumOpKinds && !known; ++k) known = op_name(static_cast<OpKind>(k)) == kind;
    if (!known)
      return Status::invalid(at +
                             ": not an op kind (the names of ir/op_kind.h: max_pool2d, "
                             "batch_norm, conv2d_grad_weight, ...)");
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0.01 ||
        v.get<double>() > 1000)
      return Status::invalid(at +
                             " must be a number in [0.01, 1000] (measured time over the "
                             "roofline), got " +
                             v.dump());
    d->kernel_time_scale[kind] = v.get<double>();
  }
  // "attention_efficiency": {"flash1": {"forward": 0.40, "backward": 0.30},
  //   "cudnn": {"by_keys": [[1024, 0.455, 0.230], [2048, ...], ...]}, ...}
  if (!attention.is_null()) {
    for (const auto& [kernel, e] : attention.items()) {
      const std::string at = where + ".attention_efficiency." + kernel;
      const std::string shape =
          " must be an object {\"forward\": f, \"backward\": b} or {\"by_keys\": [[keys, "
          "forward, backward], ...]}";
      if (!e.is_object()) return Status::invalid(at + shape + ", got " + json_type_name(e));
      JsonObjectReader kr(e, at);
      AttentionEfficiency ae;
      if (e.contains("by_keys")) {
        if (e.contains("forward") || e.contains("backward"))
          return Status::invalid(at +
                                 ": give either forward and backward (one figure for every "
                                 "length) or by_keys, not both");
        MF_RETURN_IF_ERROR(read_attention_table(e.at("by_keys"), at + ".by_keys", &ae.by_keys));
        kr.ignore({"by_keys"});
      } else {
        kr.required("forward");
        kr.required("backward");
        read_efficiency(kr, e, at, "forward", &ae.forward);
        read_efficiency(kr, e, at, "backward", &ae.backward);
      }
      MF_RETURN_IF_ERROR(kr.finish());
      d->attention_efficiency[kernel] = ae;
    }
  }

  const std::string pw = where + ".peak_flops";
  JsonObjectReader pr(peak, pw);
  pr.required("f32");
  const char* unit = "FLOP per second";
  read_number(pr, peak, pw, "f32", &d->peak_flops.f32, false, unit, kLeastFlops);
  read_number(pr, peak, pw, "tf32", &d->peak_flops.tf32, false, unit, kLeastFlops);
  read_number(pr, peak, pw, "bf16", &d->peak_flops.bf16, false, unit, kLeastFlops);
  read_number(pr, peak, pw, "f16", &d->peak_flops.f16, false, unit, kLeastFlops);
  read_number(pr, peak, pw, "fp8", &d->peak_flops.fp8, false, unit, kLeastFlops);
  return pr.finish();
}

}  // namespace

Result<Cluster> parse_cluster(const json& j) {
  Cluster c;
  JsonObjectReader r(j, "cluster");
  r.string("name", &c.name);
  r.string("calibrated_with", &c.calibrated_with);
  r.integer("nodes", &c.nodes, 1);
  r.required("devices_per_node");
  r.integer("devices_per_node", &c.devices_per_node, 1);
  json device, intra, inter;
  r.required("device");
  r.object("device", &device);
  r.required("intra_node");
  r.object("intra_node", &intra);
  r.object("inter_node", &inter);
  json host, islands, domain;
  r.object("host", &host);
  r.object("islands", &islands);
  r.object("nvlink_domain", &domain);
  read_number(r, j, "cluster", "time_shared_latency_s", &c.time_shared_latency_s, true,
              "seconds per message step with two ranks a core", 0, kMostLatencyS);
  MF_RETURN_IF_ERROR(r.finish());
  if (j.contains("host")) {
    JsonObjectReader h(host, "cluster.host");
    const std::string w = "cluster.host";
    read_number(h, host, w, "link_bandwidth_bytes_per_s", &c.host.link_bandwidth_bytes_per_s, true,
                "bytes per second per device, device <-> host (PCIe), one direction");
    read_number(h, host, w, "memory_bytes", &c.host.memory_bytes, true, "bytes per node");
    read_number(h, host, w, "memory_bandwidth_bytes_per_s", &c.host.memory_bandwidth_bytes_per_s,
                true, "bytes per second per node");
    read_number(h, host, w, "nvme_bandwidth_bytes_per_s", &c.host.nvme_bandwidth_bytes_per_s, true,
                "bytes per second per node");
    read_number(h, host, w, "nvme_bytes", &c.host.nvme_bytes, true, "bytes per node");
    MF_RETURN_IF_ERROR(h.finish());
  }
  MF_RETURN_IF_ERROR(parse_device(device, "cluster.device", &c.device));
  MF_RETURN_IF_ERROR(parse_link(intra, "cluster.intra_node", &c.intra_node));
  if (j.contains("inter_node")) {
    MF_RETURN_IF_ERROR(parse_link(inter, "cluster.inter_node", &c.inter_node));
  } else if (c.nodes > 1) {
    return Status::invalid("cluster.inter_node is required when cluster.nodes > 1 (nodes = " +
                           std::to_string(c.nodes) + ")");
  } else {
    c.inter_node = c.intra_node;  // one node: never used, kept sane
  }
  c.between_islands = c.intra_node;  // one island a node: never used
  if (j.contains("islands")) {
    JsonObjectReader ir(islands, "cluster.islands");
    ir.required("devices");
    ir.integer("devices", &c.devices_per_island, 1);
    json link;
    ir.required("link");
    ir.object("link", &link);
    MF_RETURN_IF_ERROR(ir.finish());
    // (A node's last island may be smaller: a file resized to part of a node.)
    if (c.devices_per_island > c.devices_per_node)
      return Status::invalid("cluster.islands.devices must be at most cluster.devices_per_node (" +
                             std::to_string(c.devices_per_node) + "), got " +
                             std::to_string(c.devices_per_island));
    c.between_islands = Link{};  // (absent keys: Link's defaults, not intra_node's)
    MF_RETURN_IF_ERROR(parse_link(link, "cluster.islands.link", &c.between_islands));
  }
  if (j.contains("nvlink_domain")) {
    JsonObjectReader dr(domain, "cluster.nvlink_domain");
    dr.required("devices");
    dr.integer("devices", &c.devices_per_domain, 1);
    MF_RETURN_IF_ERROR(dr.finish());
    const std::string per = std::to_string(c.devices_per_node);
    if (c.devices_per_domain % c.devices_per_node != 0)
      return Status::invalid(
          "cluster.nvlink_domain.devices must be a whole number of nodes (a multiple of "
          "cluster.devices_per_node = " +
          per + "), got " + std::to_string(c.devices_per_domain));
    if (j.contains("islands"))
      return Status::invalid(
          "cluster.islands and cluster.nvlink_domain describe different machines (a node split "
          "into NVLink islands; an NVLink fabric joining whole nodes): give one");
    if (c.devices_per_domain == c.devices_per_node) c.devices_per_domain = 0;  // the node's own
  }
  return c;
}

Result<Cluster> load_cluster(const std::string& path) {
  MF_ASSIGN_OR_RETURN(json j, read_json_file(path));
  Result<Cluster> c = parse_cluster(j);
  if (!c.is_ok()) return Status::invalid(path + ": " + c.status().message());
  return c;
}

namespace {

template <typename J>
J cluster_json(const Cluster& c) {
  auto link = [](const Link& l) {
    return J{{"bandwidth_bytes_per_s", l.bandwidth_bytes_per_s},
             {"latency_s", l.latency_s},
             {"efficiency", l.efficiency}};
  };
  const Device& d = c.device;
  J peak = {{"f32", d.peak_flops.f32}};
  if (d.peak_flops.tf32 > 0) peak["tf32"] = d.peak_flops.tf32;
  if (d.peak_flops.bf16 > 0) peak["bf16"] = d.peak_flops.bf16;
  if (d.peak_flops.f16 > 0) peak["f16"] = d.peak_flops.f16;
  if (d.peak_flops.fp8 > 0) peak["fp8"] = d.peak_flops.fp8;
  J dev = {{"name", d.name},
           {"peak_flops", peak},
           {"memory_bytes", d.memory_bytes},
           {"memory_bandwidth_bytes_per_s", d.memory_bandwidth_bytes_per_s},
           {"memory_efficiency", d.memory_efficiency}};
  if (d.fp8_matmul_efficiency != 1) dev["fp8_matmul_efficiency"] = d.fp8_matmul_efficiency;
  if (d.rated_power_w > 0) dev["rated_power_w"] = d.rated_power_w;
  if (d.power_limit_w > 0) dev["power_limit_w"] = d.power_limit_w;
  if (!d.kernel_time_scale.empty()) dev["kernel_time_scale"] = d.kernel_time_scale;
  if (!d.attention_efficiency.empty()) {
    J kernels = J::object();
    for (const auto& [kernel, e] : d.attention_efficiency) {
      if (e.by_keys.empty()) {
        kernels[kernel] = {{"forward", e.forward}, {"backward", e.backward}};
        continue;
      }
      J table = J::array();
      for (const AttentionPoint& p : e.by_keys) table.push_back({p.keys, p.forward, p.backward});
      kernels[kernel] = {{"by_keys", table}};
    }
    dev["attention_efficiency"] = kernels;
  }
  if (!d.matmul_efficiency.empty()) {
    J curve = J::array();
    for (const EfficiencyPoint& p : d.matmul_efficiency) curve.push_back({p.gflop, p.efficiency});
    dev["matmul_efficiency"] = curve;
  }
  auto thin = [&](const ThinGrid& g, const char* key) {
    if (g.empty()) return;
    J rows = J::array();
    for (const std::vector<double>& row : g.factor) rows.push_back(row);
    dev[key] = J{{"big", g.big}, {"dim", g.dim}, {"factor", rows}};
  };
  thin(d.matmul_thin_efficiency, "matmul_thin_efficiency");
  thin(d.matmul_thin_efficiency_one_thread, "matmul_thin_efficiency_one_thread");
  J out = {{"name", c.name},
           {"nodes", c.nodes},
           {"devices_per_node", c.devices_per_node},
           {"device", dev},
           {"intra_node", link(c.intra_node)},
           {"inter_node", link(c.inter_node)}};
  if (!c.calibrated_with.empty()) out["calibrated_with"] = c.calibrated_with;
  if (c.time_shared_latency_s > 0) out["time_shared_latency_s"] = c.time_shared_latency_s;
  if (c.devices_per_island > 0)
    out["islands"] = J{{"devices", c.devices_per_island}, {"link", link(c.between_islands)}};
  if (c.devices_per_domain > 0) out["nvlink_domain"] = J{{"devices", c.devices_per_domain}};
  const Host& h = c.host;
  if (h.link_bandwidth_bytes_per_s > 0 || h.memory_bytes > 0 || h.nvme_bytes > 0)
    out["host"] = J{{"link_bandwidth_bytes_per_s", h.link_bandwidth_bytes_per_s},
                    {"memory_bytes", h.memory_bytes},
                    {"memory_bandwidth_bytes_per_s", h.memory_bandwidth_bytes_per_s},
                    {"nvme_bandwidth_bytes_per_s", h.nvme_bandwidth_bytes_per_s},
                    {"nvme_bytes", h.nvme_bytes}};
  return out;
}

}  // namespace

json cluster_to_json(const Cluster& c) {
  return cluster_json<json>(c);
}

std::string format_cluster_json(const Cluster& c) {
  std::string text = cluster_json<nlohmann::ordered_json>(c).dump(2);
  // [\n  1.5,\n  0.9\n] -> [1.5, 0.9]: a curve point (or a grid's axis or
  // row) per line.
  static const std::regex flat(R"(\[\s*([-+.0-9eE]+(?:,\s*[-+.0-9eE]+)*)\s*\])");
  static const std::regex gaps(R"(,\s+)");
  std::string out;
  std::sregex_iterator it(text.begin(), text.end(), flat), end;
  size_t at = 0;
  for (; it != end; ++it) {
    out += text.substr(at, static_cast<size_t>(it->position()) - at);
    out += "[" + std::regex_replace(it->str(1), gaps, ", ") + "]";
    at = static_cast<size_t>(it->position() + it->length());
  }
  return out + text.substr(at) + "\n";
}

}  // namespace meshflow::plan
