// Running the real `meshflow` binary from a test, as a user does: the binary
// is MESHFLOW_BIN (environment) or the one CMake built (MESHFLOW_BIN_DEFAULT);
// the source tree is MESHFLOW_SOURCE_DIR or MESHFLOW_SOURCE_DIR_DEFAULT.
//
//   testing::CliRun r = testing::run_cli("train cfg.json --steps 1");
//   EXPECT_EQ(r.code, 2);  EXPECT_THAT(r.output, HasSubstr("train.steps"));
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace meshflow::testing {

struct CliRun {
  int code = -1;       // exit code, or 128 + signal
  std::string output;  // stdout + stderr
};

// seconds > 0: killed after that long (exit code 124, or 137 after the grace period).
inline CliRun run_cli(const std::string& args, int seconds = 0) {
  const char* bin = std::getenv("MESHFLOW_BIN");
  const std::string limit =
      seconds > 0 ? "timeout -k 5 " + std::to_string(seconds) + " " : std::string();
  const std::string cmd =
      limit + std::string(bin ? bin : MESHFLOW_BIN_DEFAULT) + " " + args + " 2>&1";
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline std::string source_dir() {
  const char* s = std::getenv("MESHFLOW_SOURCE_DIR");
  return s ? s : MESHFLOW_SOURCE_DIR_DEFAULT;
}

}  // namespace meshflow::testing
