#include "meshflow/runtime/progress.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "meshflow/core/file_io.h"

namespace meshflow {

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

ProgressReporter::ProgressReporter(bool quiet, FILE* console)
    : quiet_(quiet), tty_(isatty(fileno(console)) != 0), console_(console) {}

Status ProgressReporter::open_metrics(const std::string& path, bool append) {
  MF_RETURN_IF_ERROR(check_output_file(path, "--metrics", OutputTarget::kStream));
  metrics_path_ = path;
  errno = 0;
  metrics_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
  if (!metrics_)
    return Status::invalid("--metrics '" + path + "': cannot open it for writing" +
                           (errno ? std::string(": ") + std::strerror(errno) : std::string()));
  return Status::ok();
}

Status ProgressReporter::write_metrics(const std::string& line) {
  if (!metrics_.is_open() || !metrics_error_.is_ok()) return metrics_error_;
  errno = 0;
  metrics_ << line << "\n";
  metrics_.flush();
  if (!metrics_)
    metrics_error_ =
        Status::unavailable("--metrics '" + metrics_path_ + "': cannot write" +
                            (errno ? std::string(": ") + std::strerror(errno) : std::string()));
  return metrics_error_;
}

Status ProgressReporter::step(const StepReport& r) {
  Status written;
  if (metrics_.is_open()) {
    nlohmann::json j;
    j["step"] = r.step;
    j["loss"] = r.loss;
    j["lr"] = r.lr;
    j[r.items_are_tokens ? "tokens_per_s" : "samples_per_s"] = r.items_per_s;
    j["gflops"] = r.gflops;
    j["peak_bytes"] = r.peak_bytes;
    j["grad_norm"] = r.grad_norm;
    if (r.comm_wait_fraction >= 0) j["comm_wait_fraction"] = r.comm_wait_fraction;
    written = write_metrics(j.dump());
  }
  if (quiet_) return written;
  const char* unit = r.items_are_tokens ? "tok/s" : "samples/s";
  if (tty_) {
    const int width = 24;
    int filled = r.total_steps > 0 ? width * r.step / r.total_steps : width;
    std::string bar(filled, '#');
    bar.resize(width, '.');
    std::fprintf(console_,
                 "\r[%s] step %d/%d  loss %.4f  lr %.2e  %.0f %s  %.1f GFLOP/s  peak %s \x1b[K",
                 bar.c_str(), r.step, r.total_steps, r.loss, r.lr, r.items_per_s, unit, r.gflops,
                 format_bytes(r.peak_bytes).c_str());
    std::fflush(console_);
    bar_open_ = true;
  } else {
    std::fprintf(console_, "step %d/%d loss %.4f lr %.3e %s %.0f gflops %.2f peak_bytes %lld\n",
                 r.step, r.total_steps, r.loss, r.lr, unit, r.items_per_s, r.gflops,
                 static_cast<long long>(r.peak_bytes));
  }
  return written;
}

Status ProgressReporter::eval(const EvalReport& r) {
  Status written;
  if (metrics_.is_open()) {
    nlohmann::json e;
    e["step"] = r.step;
    e["loss"] = r.loss;
    if (r.accuracy) e["accuracy"] = *r.accuracy;
    written = write_metrics(nlohmann::json{{"eval", e}}.dump());
  }
  if (quiet_) return written;
  if (bar_open_) std::fputc('\n', console_);
  bar_open_ = false;
  if (r.accuracy)
    std::fprintf(console_, "eval @ step %d: loss %.4f  accuracy %.2f%%\n", r.step, r.loss,
                 100.f * *r.accuracy);
  else
    std::fprintf(console_, "eval @ step %d: loss %.4f\n", r.step, r.loss);
  return written;
}

void ProgressReporter::message(const std::string& line) {
  if (quiet_) return;
  if (bar_open_) std::fputc('\n', console_);
  bar_open_ = false;
  std::fprintf(console_, "%s\n", line.c_str());
}

Status ProgressReporter::finish() {
  if (bar_open_ && !quiet_) std::fputc('\n', console_);
  bar_open_ = false;
  if (metrics_.is_open() && metrics_error_.is_ok()) {
    errno = 0;
    metrics_.close();
    if (metrics_.fail())
      metrics_error_ =
          Status::unavailable("--metrics '" + metrics_path_ + "': cannot write" +
                              (errno ? std::string(": ") + std::strerror(errno) : std::string()));
  }
  return metrics_error_;
}

}  // namespace meshflow
