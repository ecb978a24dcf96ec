// The environment every test binary starts in, set before main (each
// variable only where the caller has not set it):
// - MESHFLOW_LOCAL_CLUSTER: the shipped calibration, so tests plan local runs
//   on the same numbers on every machine instead of measuring the one they
//   run on (plan::load_local_cluster; PlanAuto.LocalClusterIsThisMachines
//   tests the measuring with the variable unset).
// - OPENBLAS_CORETYPE: OpenBLAS's kernels for this CPU where it fell back to
//   its generic ones (kernels/cpu/blas_core.h: the binary restarts with it,
//   as `meshflow` does).
#include <cstdlib>
#include <string>

#include "meshflow/kernels/cpu/blas_core.h"

namespace {

const bool kEnvironmentSet = [] {
  meshflow::cpu::use_supported_blas_kernels();
  const char* src = std::getenv("MESHFLOW_SOURCE_DIR");
  const std::string root = src && *src ? src : MESHFLOW_SOURCE_DIR_DEFAULT;
  ::setenv("MESHFLOW_LOCAL_CLUSTER", (root + "/configs/clusters/local_cpu.json").c_str(), 0);
  return true;
}();

}  // namespace
