#include "meshflow/config/json_reader.h"

#include <sstream>

#include "meshflow/core/file_io.h"

namespace meshflow {

std::string json_type_name(const json& j) {
  if (j.is_null()) return "null";
  if (j.is_boolean()) return "boolean";
  if (j.is_number_integer() || j.is_number_unsigned()) return "integer";
  if (j.is_number_float()) return "number";
  if (j.is_string()) return "string \"" + j.get<std::string>() + "\"";
  if (j.is_array()) return "array";
  if (j.is_object()) return "object";
  return "value";
}

JsonObjectReader::JsonObjectReader(const json& j, std::string where)
    : j_(j), where_(std::move(where)) {
  if (!j_.is_object())
    error_ = Status::invalid(where_ + " must be a JSON object, got " + json_type_name(j_));
}

bool JsonObjectReader::fetch(const std::string& key, const json** v) {
  known_.insert(key);
  if (!error_.is_ok() || !j_.is_object() || !j_.contains(key)) return false;
  *v = &j_.at(key);
  return true;
}

void JsonObjectReader::fail(const std::string& message) {
  if (error_.is_ok()) error_ = Status::invalid(message);
}

void JsonObjectReader::integer(const std::string& key, int64_t* out, int64_t min, int64_t max) {
  const json* v;
  if (!fetch(key, &v)) return;
  bool integral = v->is_number_integer() || v->is_number_unsigned() ||
                  (v->is_number_float() &&
                   v->get<double>() == static_cast<double>(static_cast<int64_t>(v->get<double>())));
  if (!integral) return fail(path(key) + " must be an integer, got " + json_type_name(*v));
  int64_t x = v->is_number_float() ? static_cast<int64_t>(v->get<double>()) : v->get<int64_t>();
  if (x < min || x > max) {
    // The type's own limit is worth naming only when the value passes it.
    std::string range = max == INT64_MAX || (max == INT32_MAX && x < min)
                            ? ">= " + std::to_string(min)
                            : "in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
    return fail(path(key) + " must be " + range + ", got " + std::to_string(x));
  }
  *out = x;
}

void JsonObjectReader::integer(const std::string& key, int* out, int64_t min, int64_t max) {
  int64_t x = *out;
  integer(key, &x, min, max);
  *out = static_cast<int>(x);
}

void JsonObjectReader::number(const std::string& key, float* out, double min, double max,
                              Bound min_bound, Bound max_bound) {
  const json* v;
  if (!fetch(key, &v)) return;
  if (!v->is_number()) return fail(path(key) + " must be a number, got " + json_type_name(*v));
  const double x = v->get<double>();
  const float f = static_cast<float>(x);
  auto in_range = [&](double y) {
    const bool above = min_bound == Bound::kExclusive ? y > min : y >= min;
    const bool below = max_bound == Bound::kExclusive ? y < max : y <= max;
    return above && below;
  };
  if (!in_range(x) || !in_range(static_cast<double>(f))) {
    std::ostringstream os;
    os << path(key) << " must be in " << (min_bound == Bound::kExclusive ? "(" : "[") << min << ", "
       << max << (max_bound == Bound::kExclusive ? ")" : "]") << ", got " << x;
    return fail(os.str());
  }
  *out = f;
}

void JsonObjectReader::boolean(const std::string& key, bool* out) {
  const json* v;
  if (!fetch(key, &v)) return;
  if (!v->is_boolean())
    return fail(path(key) + " must be true or false, got " + json_type_name(*v));
  *out = v->get<bool>();
}

void JsonObjectReader::string(const std::string& key, std::string* out) {
  const json* v;
  if (!fetch(key, &v)) return;
  if (!v->is_string()) return fail(path(key) + " must be a string, got " + json_type_name(*v));
  *out = v->get<std::string>();
}

void JsonObjectReader::choice(const std::string& key, std::string* out,
                              const std::vector<std::string>& valid) {
  std::string s = *out;
  if (!has(key)) {
    known_.insert(key);
    return;  // absent: keep the default
  }
  string(key, &s);
  if (!error_.is_ok()) return;
  for (const std::string& ok : valid)
    if (s == ok) {
      *out = s;
      return;
    }
  std::string list;
  for (const std::string& ok : valid) list += (list.empty() ? "" : ", ") + ("\"" + ok + "\"");
  fail(path(key) + " must be one of " + list + ", got \"" + s + "\"");
}

void JsonObjectReader::int_list(const std::string& key, std::vector<int64_t>* out, int64_t min) {
  const json* v;
  if (!fetch(key, &v)) return;
  if (!v->is_array())
    return fail(path(key) + " must be an array of integers, got " + json_type_name(*v));
  std::vector<int64_t> r;
  for (const json& e : *v) {
    if (!e.is_number_integer())
      return fail(path(key) + " must contain only integers, got " + json_type_name(e));
    if (e.get<int64_t>() < min)
      return fail(path(key) + " entries must be >= " + std::to_string(min) + ", got " +
                  std::to_string(e.get<int64_t>()));
    r.push_back(e.get<int64_t>());
  }
  *out = std::move(r);
}

void JsonObjectReader::object(const std::string& key, json* out) {
  const json* v;
  if (!fetch(key, &v)) return;
  if (!v->is_object()) return fail(path(key) + " must be an object, got " + json_type_name(*v));
  *out = *v;
}

void JsonObjectReader::required(const std::string& key) {
  known_.insert(key);
  if (error_.is_ok() && j_.is_object() && !j_.contains(key)) fail(path(key) + " is required");
}

void JsonObjectReader::ignore(std::initializer_list<const char*> keys) {
  for (const char* k : keys) known_.insert(k);
}

Status JsonObjectReader::finish() const {
  // Unknown keys first: a misspelt key also makes its correct spelling "required".
  if (!j_.is_object()) return error_;
  for (const auto& [key, value] : j_.items()) {
    if (known_.count(key)) continue;
    std::string list;
    for (const std::string& k : known_) list += (list.empty() ? "" : ", ") + k;
    return Status::invalid(where_ + ": unknown key '" + key + "'; valid keys: " + list);
  }
  return error_;
}

Status apply_override(json& doc, const std::string& assignment) {
  size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    return Status::invalid("--set '" + assignment + "': expected key=value, e.g. train.steps=100");
  std::string key = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;
  json* node = &doc;
  size_t start = 0;
  while (true) {
    size_t dot = key.find('.', start);
    std::string part =
        key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) return Status::invalid("--set '" + assignment + "': empty key component");
    if (!node->is_object())
      return Status::invalid("--set '" + assignment + "': '" + key.substr(0, start - 1) +
                             "' is not an object");
    if (dot == std::string::npos) {
      (*node)[part] = value;
      return Status::ok();
    }
    node = &(*node)[part];
    if (node->is_null()) *node = json::object();
    start = dot + 1;
  }
}

Result<json> read_json_file(const std::string& path) {
  MF_ASSIGN_OR_RETURN(const std::string text, read_regular_file(path));
  // Nesting is bounded too: "[[[[..." would otherwise cost memory per level
  // and recursion depth in every later walk over the document.
  constexpr int kMaxDepth = 256;
  struct TooDeep {};
  auto bounded = [](int depth, json::parse_event_t, json&) {
    if (depth > kMaxDepth) throw TooDeep{};
    return true;
  };
  try {
    return json::parse(text, bounded);
  } catch (const json::exception& e) {
    return Status::invalid("'" + path + "' is not valid JSON: " + e.what());
  } catch (const TooDeep&) {
    return Status::invalid("'" + path + "' nests arrays or objects more than " +
                           std::to_string(kMaxDepth) + " levels deep");
  }
}

}  // namespace meshflow
