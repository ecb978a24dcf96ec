// How every meshflow command reports a failure: one line
// "meshflow: error: ..." on stderr and an exit code, 2 for the user's input
// (a bad config, a missing or unusable file, an invalid option), 1 for a
// failure while running. No exception escapes a command: guard() turns each
// into such a line (a std::filesystem error names a path the user gave, so it
// is exit 2; anything else unexpected is exit 1).
//
//   int run_plan(const PlanOptions& o) {
//     return guard([&] { return plan_impl(o); });
//   }
#pragma once

#include <functional>
#include <string>

#include "meshflow/core/status.h"

namespace meshflow::cli {

// Prints "meshflow: error: <message>" as one line (newlines become "; ") and
// returns `code`.
int print_error(const std::string& message, int code);

// 2 for the user's mistakes (kInvalidArgument, kNotFound), else 1.
int exit_code_of(const Status& s);

// print_error(s.message(), exit_code_of(s)).
int report(const Status& s);

// Runs a command; an exception becomes one error line and its exit code.
int guard(const std::function<int()>& command);

}  // namespace meshflow::cli
