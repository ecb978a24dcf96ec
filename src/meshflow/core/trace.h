// Chrome trace (Trace Event Format) writer: spans on named tracks, loadable in
// Perfetto (ui.perfetto.dev) or chrome://tracing. Used by the runtime
// (`meshflow train --trace`) and the planner (`meshflow simulate --trace`), so a
// measured step and a predicted step look the same.
//
//   TraceWriter tw;
//   int track = tw.track(/*pid=*/rank, "rank 0", /*tid=*/0, "compute");
//   tw.span(track, "F mb=0 stage=0", "forward", start_us, dur_us, {{"micro_batch", "0"}});
//   MF_RETURN_IF_ERROR(tw.write("trace.json"));
//
// Times are microseconds from any common origin. Not thread-safe: one writer
// per thread, or merge() them at the end.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "meshflow/core/status.h"

namespace meshflow {

class TraceWriter {
 public:
  // A (process, thread) pair shown as one row; names label it in the viewer.
  // Returns an id for span().
  int track(int pid, const std::string& process_name, int tid, const std::string& thread_name);

  // One complete event ("ph": "X"). category: forward, backward, weight_grad,
  // send, recv, collective, optimizer, bubble, ...
  void span(int track, std::string name, std::string category, double start_us, double dur_us,
            std::vector<std::pair<std::string, std::string>> args = {});

  // Appends another writer's tracks and spans (track ids are remapped).
  void merge(const TraceWriter& other);

  size_t num_spans() const { return spans_.size(); }
  std::string to_json() const;
  // Atomic write (temp file + rename); the error names the path.
  Status write(const std::string& path) const;

 private:
  struct Track {
    int pid, tid;
    std::string process_name, thread_name;
  };
  struct Span {
    int track;
    std::string name, category;
    double start_us, dur_us;
    std::vector<std::pair<std::string, std::string>> args;
  };
  std::vector<Track> tracks_;
  std::vector<Span> spans_;
};

}  // namespace meshflow
