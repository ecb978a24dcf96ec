#include "meshflow/cli/bench_command.h"

#include <cstdio>

#include "meshflow/cli/errors.h"
#include "meshflow/core/file_io.h"
#include "meshflow/plan/calibrate.h"
#include "meshflow/plan/cluster.h"

namespace meshflow::cli {

int run_bench(const BenchOptions& o) {
  if (!o.calibrate) {
    std::fprintf(stderr,
                 "meshflow: error: bench needs a measurement to run; valid: --calibrate "
                 "[--out FILE] [--quick]\n");
    return 2;
  }
  if (o.ranks < 2) {
    std::fprintf(stderr, "meshflow: error: bench --ranks must be >= 2, got %d\n", o.ranks);
    return 2;
  }
  if (!o.out.empty()) {  // before measuring, not after
    Status s = check_output_file(o.out, "--out");
    if (!s.is_ok()) return report(s);
  }
  plan::CalibrationOptions opt;
  opt.quick = o.quick;
  opt.ranks = o.ranks;
  Result<plan::Calibration> cal = plan::calibrate(opt);
  if (!cal.is_ok()) {
    std::fprintf(stderr, "meshflow: error: calibration failed: %s\n",
                 cal.status().message().c_str());
    return 1;
  }
  std::printf("%s", plan::format_calibration(*cal).c_str());
  if (cal->others_busy > plan::kDisturbedShare)
    std::fprintf(stderr,
                 "meshflow: warning: other processes used %.0f%% of the CPU while this "
                 "measured; the figures are a share of the machine, not the machine\n",
                 100 * cal->others_busy);
  const std::string text =
      plan::format_cluster_json(plan::cluster_from_calibration(*cal, "local_cpu"));
  if (o.out.empty()) {
    std::printf("cluster JSON (write it with --out FILE):\n%s", text.c_str());
    return 0;
  }
  Status s = write_file_atomic(o.out, text, "--out");
  if (!s.is_ok()) return report(s);
  std::printf("wrote %s\n", o.out.c_str());
  return 0;
}

}  // namespace meshflow::cli
