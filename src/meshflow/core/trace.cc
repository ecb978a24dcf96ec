#include "meshflow/core/trace.h"

#include <nlohmann/json.hpp>

#include "meshflow/core/file_io.h"

namespace meshflow {

int TraceWriter::track(int pid, const std::string& process_name, int tid,
                       const std::string& thread_name) {
  for (size_t i = 0; i < tracks_.size(); ++i) {
    if (tracks_[i].pid == pid && tracks_[i].tid == tid) return static_cast<int>(i);
  }
  tracks_.push_back({pid, tid, process_name, thread_name});
  return static_cast<int>(tracks_.size()) - 1;
}

void TraceWriter::span(int track, std::string name, std::string category, double start_us,
                       double dur_us, std::vector<std::pair<std::string, std::string>> args) {
  spans_.push_back(
      {track, std::move(name), std::move(category), start_us, dur_us, std::move(args)});
}

void TraceWriter::merge(const TraceWriter& other) {
  std::vector<int> remap;
  for (const Track& t : other.tracks_)
    remap.push_back(track(t.pid, t.process_name, t.tid, t.thread_name));
  for (Span s : other.spans_) {
    s.track = remap[s.track];
    spans_.push_back(std::move(s));
  }
}

std::string TraceWriter::to_json() const {
  using nlohmann::json;
  json events = json::array();
  std::vector<int> named_pids;
  for (const Track& t : tracks_) {
    bool seen = false;
    for (int p : named_pids) seen |= p == t.pid;
    if (!seen) {
      named_pids.push_back(t.pid);
      events.push_back({{"ph", "M"},
                        {"name", "process_name"},
                        {"pid", t.pid},
                        {"tid", 0},
                        {"args", {{"name", t.process_name}}}});
      events.push_back({{"ph", "M"},
                        {"name", "process_sort_index"},
                        {"pid", t.pid},
                        {"tid", 0},
                        {"args", {{"sort_index", t.pid}}}});
    }
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", t.pid},
                      {"tid", t.tid},
                      {"args", {{"name", t.thread_name}}}});
  }
  for (const Span& s : spans_) {
    const Track& t = tracks_[s.track];
    json e = {{"ph", "X"},    {"name", s.name},   {"cat", s.category}, {"pid", t.pid},
              {"tid", t.tid}, {"ts", s.start_us}, {"dur", s.dur_us}};
    if (!s.args.empty()) {
      json a = json::object();
      for (const auto& [k, v] : s.args) a[k] = v;
      e["args"] = a;
    }
    events.push_back(std::move(e));
  }
  return json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

Status TraceWriter::write(const std::string& path) const {
  return write_file_atomic(path, to_json(), "trace file");
}

}  // namespace meshflow
