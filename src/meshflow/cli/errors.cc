#include "meshflow/cli/errors.h"

#include <cstdio>
#include <exception>
#include <filesystem>
#include <new>

namespace meshflow::cli {

int print_error(const std::string& message, int code) {
  std::string line;
  line.reserve(message.size());
  for (char c : message) {
    if (c == '\n') {
      line += "; ";
    } else if (c != '\r') {
      line += c;
    }
  }
  while (!line.empty() && (line.back() == ' ' || line.back() == ';')) line.pop_back();
  std::fflush(stdout);
  std::fprintf(stderr, "meshflow: error: %s\n", line.c_str());
  return code;
}

int exit_code_of(const Status& s) {
  return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kNotFound ? 2 : 1;
}

int report(const Status& s) {
  return print_error(s.message(), exit_code_of(s));
}

int guard(const std::function<int()>& command) {
  try {
    return command();
  } catch (const StatusError& e) {
    return report(e.status());
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the user gave that the OS refuses (name too long, permission denied).
    const std::string path = e.path1().empty() ? "" : " '" + e.path1().string() + "'";
    return print_error("file" + path + ": " + e.code().message(), 2);
  } catch (const std::bad_alloc&) {
    return print_error("out of memory", 1);
  } catch (const std::exception& e) {
    return print_error(e.what(), 1);
  } catch (...) {
    return print_error("unexpected failure (unknown exception)", 1);
  }
}

}  // namespace meshflow::cli
