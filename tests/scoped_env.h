// An environment variable set (or unset) for a scope, its old value restored
// after, so a test that changes one leaves the next as it found it.
//
//   ScopedEnv cluster("MESHFLOW_LOCAL_CLUSTER", path.c_str());
//   ScopedEnv none("MESHFLOW_LOCAL_CLUSTER", nullptr);  // unset
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace meshflow::testing {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace meshflow::testing
