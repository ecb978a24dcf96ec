#include "meshflow/plan/prediction_band.h"

#include <algorithm>
#include <cmath>

#include "meshflow/config/json_reader.h"

namespace meshflow::plan {

namespace {

// Linear interpolation between order statistics (numpy's default).
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double at = q * double(v.size() - 1);
  const size_t i = static_cast<size_t>(std::floor(at));
  const size_t j = std::min(i + 1, v.size() - 1);
  return v[i] + (at - double(i)) * (v[j] - v[i]);
}

}  // namespace

std::vector<BandEntry> band_ranges() {
  std::vector<BandEntry> r(4);
  r[0].min_gpus = 1, r[0].max_gpus = 64;
  r[1].min_gpus = 65, r[1].max_gpus = 256;
  r[2].min_gpus = 257, r[2].max_gpus = 1024;
  r[3].min_gpus = 1025, r[3].max_gpus = int64_t{1} << 40;
  return r;
}

std::vector<BandEntry> make_bands(const std::vector<std::pair<int64_t, double>>& samples,
                                  int min_runs) {
  std::vector<BandEntry> out;
  for (BandEntry b : band_ranges()) {
    std::vector<double> ratios;
    for (const auto& [gpus, ratio] : samples)
      if (gpus >= b.min_gpus && gpus <= b.max_gpus && ratio > 0 && std::isfinite(ratio))
        ratios.push_back(ratio);
    if (static_cast<int>(ratios.size()) < std::max(1, min_runs)) continue;
    b.runs = static_cast<int>(ratios.size());
    b.lo = quantile(ratios, 0.1);
    b.hi = quantile(ratios, 0.9);
    out.push_back(b);
  }
  return out;
}

Result<PredictionBands> parse_prediction_bands(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object())
    return Status::invalid(where + " must be an object, got " + json_type_name(j));
  PredictionBands b;
  JsonObjectReader r(j, where);
  r.string("source", &b.source);
  r.ignore({"clusters"});
  MF_RETURN_IF_ERROR(r.finish());
  if (!j.contains("clusters") || !j.at("clusters").is_object())
    return Status::invalid(where + ".clusters must be an object of cluster names to bands");
  for (const auto& [name, list] : j.at("clusters").items()) {
    const std::string w = where + ".clusters." + name;
    if (!list.is_array()) return Status::invalid(w + " must be a list of bands");
    for (const nlohmann::json& e : list) {
      BandEntry be;
      float lo = 1, hi = 1;
      JsonObjectReader er(e, w + "[]");
      for (const char* k : {"min_gpus", "max_gpus", "runs", "lo", "hi"}) er.required(k);
      er.integer("min_gpus", &be.min_gpus, 1);
      er.integer("max_gpus", &be.max_gpus, 1);
      er.integer("runs", &be.runs, 1);
      er.number("lo", &lo, 1e-6, 1e6);
      er.number("hi", &hi, 1e-6, 1e6);
      MF_RETURN_IF_ERROR(er.finish());
      be.lo = lo, be.hi = hi;
      if (be.min_gpus > be.max_gpus || be.lo > be.hi)
        return Status::invalid(w + ": a band needs min_gpus <= max_gpus and lo <= hi");
      b.by_cluster[name].push_back(be);
    }
  }
  return b;
}

Result<PredictionBands> load_prediction_bands(const std::string& path) {
  MF_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(path));
  return parse_prediction_bands(j, path);
}

nlohmann::json prediction_bands_to_json(const PredictionBands& b) {
  nlohmann::json clusters = nlohmann::json::object();
  for (const auto& [name, list] : b.by_cluster) {
    nlohmann::json a = nlohmann::json::array();
    for (const BandEntry& e : list)
      a.push_back({{"min_gpus", e.min_gpus},
                   {"max_gpus", e.max_gpus},
                   {"runs", e.runs},
                   {"lo", std::round(e.lo * 1000) / 1000},
                   {"hi", std::round(e.hi * 1000) / 1000}});
    clusters[name] = a;
  }
  return {{"source", b.source}, {"clusters", clusters}};
}

const BandEntry* find_band(const PredictionBands& b, const std::string& cluster, int64_t gpus) {
  auto it = b.by_cluster.find(cluster);
  if (it == b.by_cluster.end()) return nullptr;
  for (const BandEntry& e : it->second)
    if (gpus >= e.min_gpus && gpus <= e.max_gpus) return &e;
  return nullptr;
}

}  // namespace meshflow::plan
