#include "meshflow/engine/faults.h"

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace meshflow {

namespace {

bool injected(const char* want, int rank, int64_t step) {
  return step >= 0 && injected_fault_step(want, rank) == step;
}

}  // namespace

}  // namespace meshflow

#include "meshflow/engine/engine.h"

namespace meshflow {

std::string nonfinite_message(int step, float loss, float grad_norm,
                              const std::string& first_param) {
  auto num = [](float x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", static_cast<double>(x));
    return std::string(buf);
  };
  std::string what = !std::isfinite(loss)   ? "the loss is " + num(loss)
                     : !first_param.empty() ? "the gradient of '" + first_param + "' is not finite"
                                            : "the gradient norm is " + num(grad_norm);
  return "step " + std::to_string(step) + ": " + what + " (loss " + num(loss) + ", gradient norm " +
         num(grad_norm) + ")";
}

std::string nonfinite_advice() {
  return "; lower optimizer.lr, set optimizer.grad_clip, or set train.on_nonfinite \"skip\" to "
         "skip such steps";
}

int64_t injected_fault_step(const char* want, int rank) {
  const char* e = std::getenv("MESHFLOW_INJECT_FAULT");
  int r = -1;
  long long s = -1;
  char kind[16] = {};
  if (e && std::sscanf(e, "%d:%lld:%15s", &r, &s, kind) == 3 && r == rank &&
      std::string(kind) == want)
    return s;
  return -1;
}

void kill_if_injected(int rank, int64_t step) {
  if (injected("save", rank, step)) std::raise(SIGKILL);
}

bool nan_injected(int rank, int64_t step) {
  return injected("nan", rank, step);
}

bool nan_injected(int rank, int64_t step, int micro) {
  if (nan_injected(rank, step)) return true;
  const std::string kind = "nan@" + std::to_string(micro);
  return injected(kind.c_str(), rank, step);
}

}  // namespace meshflow
