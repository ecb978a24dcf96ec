// OpenBLAS runs the kernels this CPU supports, never silently its generic
// fallback (kernels/cpu/blas_core.h): on a virtual machine that hides the
// CPU model, a process started without OPENBLAS_CORETYPE restarts itself
// with it; the test binaries do as `meshflow` does.
#include "meshflow/kernels/cpu/blas_core.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>

#include "cli_run.h"
#include "scoped_env.h"

namespace meshflow {
namespace {

TEST(BlasCore, RunsTheKernelsThisCpuSupports) {
  const cpu::BlasCore here = cpu::blas_core();
  EXPECT_FALSE(here.running.empty());
  // This binary: restarted with the variable where OpenBLAS fell back (or
  // the caller set one on purpose).
  if (here.falls_back()) {
    EXPECT_NE(std::getenv("OPENBLAS_CORETYPE"), nullptr) << here.running;
  }
  // `meshflow` started without the variable names the kernels it ran.
  testing::ScopedEnv none("OPENBLAS_CORETYPE", nullptr);
  const testing::CliRun r = testing::run_cli("bench --calibrate --quick");
  ASSERT_EQ(r.code, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m,
                                std::regex("OpenBLAS (\\S+) kernels \\(the CPU runs ([^;]+);")))
      << r.output;
  const cpu::BlasCore ran{m[1], m[2] == "no AVX2" ? std::string() : std::string(m[2])};
  EXPECT_EQ(ran.supported, here.supported);
  EXPECT_FALSE(ran.falls_back()) << "OpenBLAS ran its " << ran.running
                                 << " kernels on a CPU that runs " << ran.supported;
  // The falling back itself, as BlasCore tells it.
  EXPECT_TRUE((cpu::BlasCore{"Prescott", "SkylakeX"}.falls_back()));
  EXPECT_TRUE((cpu::BlasCore{"Nehalem", "Haswell"}.falls_back()));
  EXPECT_FALSE((cpu::BlasCore{"Haswell", "SkylakeX"}.falls_back()));  // OpenBLAS's own choice
  EXPECT_FALSE((cpu::BlasCore{"Prescott", ""}.falls_back()));         // nothing better to run
}

}  // namespace
}  // namespace meshflow
