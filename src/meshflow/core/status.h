// Status and Result<T>: how a user's mistake travels back to the caller.
//
// Two kinds of errors in meshflow (see STYLE.md):
//   - a user's mistake (bad config, invalid strategy, shape that does not fit)
//     is a Status whose message names the thing, the sizes and what is valid;
//   - a broken internal invariant is an MF_CHECK (check.h) that stops with file:line.
//
//   Result<int> parse(const std::string& s);
//   MF_ASSIGN_OR_RETURN(int n, parse(text));
//   if (n < 0) return Status::invalid("n must be >= 0, got " + std::to_string(n));
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace meshflow {

enum class StatusCode {
  kOk,
  kInvalidArgument,
  kNotFound,
  kFailedPrecondition,
  kInternal,
  kUnavailable
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  static Status invalid(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status failed_precondition(std::string m) {
    return {StatusCode::kFailedPrecondition, std::move(m)};
  }
  static Status internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // Prefixes context: "loading config: " + message.
  Status with_context(const std::string& ctx) const {
    return is_ok() ? *this : Status(code_, ctx + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Thrown where a Status cannot be returned (graph building deep inside model
// code); caught at the API boundary (CLI, tests) and turned back into a Status.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(Status s) : std::runtime_error(s.message()), status_(std::move(s)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

template <class T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit on purpose
  Result(Status status) : status_(std::move(status)) {}  // NOLINT
  bool is_ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

// Throws StatusError when !s.is_ok(); for code that cannot return a Status.
inline void throw_if_error(const Status& s) {
  if (!s.is_ok()) throw StatusError(s);
}
template <class T>
T value_or_throw(Result<T> r) {
  if (!r.is_ok()) throw StatusError(r.status());
  return std::move(r).value();
}

}  // namespace meshflow

#define MF_CONCAT_INNER(a, b) a##b
#define MF_CONCAT(a, b) MF_CONCAT_INNER(a, b)

#define MF_RETURN_IF_ERROR(expr)                \
  do {                                          \
    ::meshflow::Status _mf_status = (expr);     \
    if (!_mf_status.is_ok()) return _mf_status; \
  } while (0)

#define MF_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.is_ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

#define MF_ASSIGN_OR_RETURN(lhs, expr) \
  MF_ASSIGN_OR_RETURN_IMPL(MF_CONCAT(_mf_result_, __LINE__), lhs, expr)
