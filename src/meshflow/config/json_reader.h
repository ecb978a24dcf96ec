// JsonObjectReader: strict reading of one JSON object of a config, so every
// mistake a user can make gets a one-line message naming the key and what is
// valid, and unknown keys are errors (a typo never silently does nothing).
//
//   JsonObjectReader r(j, "train");
//   int steps = 100;  r.integer("steps", &steps, /*min=*/1);
//   std::string kind = "cosine";  r.choice("schedule", &kind, {"cosine", "constant", "linear"});
//   MF_RETURN_IF_ERROR(r.finish());   // unknown keys first, then the first error
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "meshflow/core/status.h"

namespace meshflow {

using json = nlohmann::json;

std::string json_type_name(const json& j);

class JsonObjectReader {
 public:
  // `where` names the object in messages ("train", "model", "optimizer").
  JsonObjectReader(const json& j, std::string where);

  bool has(const std::string& key) const { return j_.is_object() && j_.contains(key); }
  // Each reader leaves *out unchanged when the key is absent (so it keeps its default),
  // and records the first error.
  void integer(const std::string& key, int64_t* out, int64_t min = INT64_MIN,
               int64_t max = INT64_MAX);
  void integer(const std::string& key, int* out, int64_t min = INT32_MIN, int64_t max = INT32_MAX);
  // Bound::kExclusive makes min (or max) itself invalid: eps in (0, 1] is
  // number("eps", &eps, 0, 1, Bound::kExclusive). The value is checked after
  // rounding to float, so 1e-50 is not a positive eps.
  enum class Bound { kInclusive, kExclusive };
  void number(const std::string& key, float* out, double min = -1e300, double max = 1e300,
              Bound min_bound = Bound::kInclusive, Bound max_bound = Bound::kInclusive);
  void boolean(const std::string& key, bool* out);
  void string(const std::string& key, std::string* out);
  void choice(const std::string& key, std::string* out, const std::vector<std::string>& valid);
  void int_list(const std::string& key, std::vector<int64_t>* out, int64_t min = 1);
  void object(const std::string& key, json* out);
  void required(const std::string& key);
  // Marks keys as known without reading them (accepted and ignored).
  void ignore(std::initializer_list<const char*> keys);
  void fail(const std::string& message);
  // An unknown key (listing the valid ones) first; else the first error.
  Status finish() const;

 private:
  bool fetch(const std::string& key, const json** v);
  std::string path(const std::string& key) const { return where_ + "." + key; }
  const json& j_;
  std::string where_;
  std::set<std::string> known_;
  Status error_;
};

// Applies "a.b.c=value" to a JSON document (value parsed as JSON when it is
// valid JSON, else taken as a string). Creates missing objects along the path.
Status apply_override(json& doc, const std::string& assignment);

// Reads and parses a JSON file; errors name the path (and line/column of a parse error).
Result<json> read_json_file(const std::string& path);

}  // namespace meshflow
