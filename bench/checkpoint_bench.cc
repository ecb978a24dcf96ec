// Full-state checkpoint save and load time (issue 14): a byte-level GPT of
// about 100M parameters (14 layers, hidden 768) with AdamW's state, on 1, 2
// and 4 in-process ranks (ZeRO-3 over dp, so every rank holds and writes its
// share; and data parallel, where rank 0 writes everything), beside the time
// one thread takes to write and fsync the same bytes (the disk's floor).
// A synchronous save (save_state) stalls the step loop for the save time
// printed here; a background one (train.async_save, BackgroundSave) for the
// copy of the rank's blocks only ("bg stall"), while the next step runs
// beside the writer ("step" alone, "step+bg" with the write in flight, the
// commit waited for at its end).
//
//   checkpoint_bench [--dir /var/tmp/meshflow_ckpt_bench] [--layers 14] [--hidden 768]
//
// Prints one line per plan: ranks, plan, parameters, bytes written by the
// busiest rank and by all, save and load seconds (the best of two), GB/s,
// and the ratio of the save time to the single-writer floor (the best of
// two) for the busiest rank's bytes.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/comm/local_world.h"
#include "meshflow/config/json_reader.h"
#include "meshflow/engine/job.h"
#include "meshflow/engine/state_checkpoint.h"
#include "meshflow/io/checkpoint.h"
#include "meshflow/kernels/cpu/blas_core.h"

using namespace meshflow;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One thread writing `bytes` in 8 MiB writes and fsyncing: the floor.
double raw_write_s(const std::string& path, uint64_t bytes) {
  std::vector<char> buf(8 << 20, 1);
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return -1;
  for (uint64_t done = 0; done < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), bytes - done));
    if (::write(fd, buf.data(), n) != static_cast<ssize_t>(n)) break;
    done += n;
  }
  ::fsync(fd);
  ::close(fd);
  const double s = seconds_since(t0);
  fs::remove(path);
  return s;
}

struct Case {
  int ranks;
  const char* plan;
  json parallel;
};

}  // namespace

int main(int argc, char** argv) {
  meshflow::cpu::use_supported_blas_kernels(argv);  // kernels/cpu/blas_core.h
  std::string dir = "/var/tmp/meshflow_ckpt_bench";
  int layers = 14, hidden = 768;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--dir") dir = argv[i + 1];
    if (k == "--layers") layers = std::atoi(argv[i + 1]);
    if (k == "--hidden") hidden = std::atoi(argv[i + 1]);
  }
  const json model = {{"model_type", "gpt2"},       {"n_layer", layers}, {"n_embd", hidden},
                      {"n_head", hidden / 64},      {"n_positions", 64}, {"vocab_size", 256},
                      {"tie_word_embeddings", true}};
  const std::vector<Case> cases = {
      {1, "one rank", nullptr},
      {2, "dp2 (rank 0 writes)", {{"mode", "data"}}},
      {2, "dp2 zero3", {{"mode", "semi"}, {"mesh", "dp=2"}, {"preset", "dp"}, {"zero", 3}}},
      {4, "dp4 zero3", {{"mode", "semi"}, {"mesh", "dp=4"}, {"preset", "dp"}, {"zero", 3}}},
  };
  std::printf("%-5s %-20s %8s %12s %12s %8s %8s %8s %10s %9s %7s %8s\n", "ranks", "plan", "params",
              "busiest MB", "all MB", "save s", "load s", "GB/s", "save/floor", "bg stall", "step",
              "step+bg");
  for (const Case& c : cases) {
    json doc = {{"model", model},
                {"data", {{"dataset", "fortunes"}}},
                {"train", {{"steps", 2}, {"batch_size", 4}, {"seq_len", 16}, {"eval_batches", 1}}},
                {"optimizer", {{"type", "adamw"}, {"lr", 1e-4}}}};
    if (!c.parallel.is_null()) doc["parallel"] = c.parallel;
    const RunConfig rc = value_or_throw(parse_run_config(doc, ""));
    const Job job = value_or_throw(resolve_job(rc, c.ranks));
    fs::remove_all(dir);
    std::vector<double> save_s(static_cast<size_t>(c.ranks)), load_s(save_s), stall_s(save_s),
        step_s(save_s), step_bg_s(save_s);
    int64_t params = 0;
    auto body = [&](std::shared_ptr<Communicator> comm) -> Status {
      const int r = comm ? comm->rank() : 0;
      MF_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, make_engine(job, comm, nullptr, false));
      e->step();
      params = e->num_parameters();
      if (comm) MF_RETURN_IF_ERROR(comm->barrier());
      // The best of two saves and two loads (the page cache's writeback
      // makes single runs of a shared disk noisy).
      double best_save = 1e300, best_load = 1e300;
      for (int rep = 0; rep < 2; ++rep) {
        auto t0 = Clock::now();
        MF_RETURN_IF_ERROR(e->save_state(dir, 1));
        best_save = std::min(best_save, seconds_since(t0));
        if (comm) MF_RETURN_IF_ERROR(comm->barrier());
        t0 = Clock::now();
        MF_RETURN_IF_ERROR(e->load_state(dir));
        best_load = std::min(best_load, seconds_since(t0));
        if (comm) MF_RETURN_IF_ERROR(comm->barrier());
      }
      save_s[static_cast<size_t>(r)] = best_save;
      load_s[static_cast<size_t>(r)] = best_load;
      // In the background: the stall, then a step beside the writer (and
      // the commit), against a step alone.
      auto t0 = Clock::now();
      e->step();
      step_s[static_cast<size_t>(r)] = seconds_since(t0);
      if (comm) MF_RETURN_IF_ERROR(comm->barrier());
      t0 = Clock::now();
      MF_ASSIGN_OR_RETURN(std::unique_ptr<BackgroundSave> bg, e->start_save_state(dir, 1));
      stall_s[static_cast<size_t>(r)] = seconds_since(t0);
      const auto t1 = Clock::now();
      e->step();
      MF_ASSIGN_OR_RETURN(const bool committed, bg->poll(true));
      if (!committed) return Status::internal("the background save did not commit");
      step_bg_s[static_cast<size_t>(r)] = seconds_since(t1);
      return Status::ok();
    };
    Status s = c.ranks == 1 ? body(nullptr)
                            : run_local_ranks(c.ranks, [&](const std::shared_ptr<Transport>& t) {
                                return body(Communicator::world(t));
                              });
    if (!s.is_ok()) {
      std::printf("%-5d %-20s failed: %s\n", c.ranks, c.plan, s.message().c_str());
      continue;
    }
    const CheckpointManifest m = value_or_throw(open_checkpoint(dir));
    uint64_t all = 0, busiest = 0;
    for (const auto& [name, f] : m.files) all += f.first, busiest = std::max(busiest, f.first);
    const double save = *std::max_element(save_s.begin(), save_s.end());
    const double load = *std::max_element(load_s.begin(), load_s.end());
    const double floor =
        std::min(raw_write_s(dir + ".raw", busiest), raw_write_s(dir + ".raw", busiest));
    auto worst = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
    std::printf("%-5d %-20s %7.1fM %12.1f %12.1f %8.2f %8.2f %8.2f %10.2f %9.3f %7.2f %8.2f\n",
                c.ranks, c.plan, double(params) / 1e6, double(busiest) / 1e6, double(all) / 1e6,
                save, load, double(all) / save / 1e9, save / floor, worst(stall_s), worst(step_s),
                worst(step_bg_s));
    std::fflush(stdout);
  }
  fs::remove_all(dir);
  return 0;
}
