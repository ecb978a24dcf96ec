// How sure a prediction is: the spread of the cost model's errors on
// published runs (bench/public_runs, ../shared/reference/public_runs.json),
// per cluster file and GPU-count range, as the 10th and 90th percentiles of
// published / predicted step time. `bench/public_runs --write-bands FILE`
// writes them (configs/clusters/prediction_bands.json); `meshflow plan`
// prints a prediction's band from the file beside its --cluster:
//
//   step time 12.39 s, published runs say 11.3..15.8 s (p10..p90 of 103 runs
//   on dgx_a100_80gb at 257-1024 GPUs)
//
// A band is the calibration's spread, not a guarantee: it carries the
// model's bias (published runs were mostly slower than predicted) and only
// the stacks those runs used.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "meshflow/core/status.h"

namespace meshflow::plan {

struct BandEntry {
  int64_t min_gpus = 1, max_gpus = 1;  // the range of GPU counts it covers
  int runs = 0;
  double lo = 1, hi = 1;  // p10 and p90 of published / predicted
};

struct PredictionBands {
  std::string source;  // what measured it
  std::map<std::string, std::vector<BandEntry>> by_cluster;
};

// The GPU-count ranges: 1-64, 65-256, 257-1024, 1025 and up.
std::vector<BandEntry> band_ranges();
// Bands of (gpus, published / predicted) samples over band_ranges(); a range
// with fewer than `min_runs` samples has none.
std::vector<BandEntry> make_bands(const std::vector<std::pair<int64_t, double>>& samples,
                                  int min_runs = 5);

Result<PredictionBands> parse_prediction_bands(const nlohmann::json& j, const std::string& where);
Result<PredictionBands> load_prediction_bands(const std::string& path);
nlohmann::json prediction_bands_to_json(const PredictionBands& b);
// The band of `cluster` at `gpus`, or nullptr.
const BandEntry* find_band(const PredictionBands& b, const std::string& cluster, int64_t gpus);

}  // namespace meshflow::plan
