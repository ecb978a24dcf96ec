#include "meshflow/cli/checkpoint_command.h"

#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include "meshflow/cli/errors.h"
#include "meshflow/core/file_io.h"
#include "meshflow/io/checkpoint.h"
#include "meshflow/io/safetensors.h"
#include "meshflow/models/from_config.h"
#include "meshflow/models/hf_weights.h"

namespace meshflow::cli {

namespace {

namespace fs = std::filesystem;

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

// The whole file's CRC-32, read in pieces; -1 when it cannot be read.
int64_t file_crc(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  std::vector<char> buf(1 << 20);
  uint32_t crc = 0;
  ssize_t n;
  while ((n = ::read(fd, buf.data(), buf.size())) > 0)
    crc = crc32_of(buf.data(), static_cast<size_t>(n), crc);
  ::close(fd);
  return n < 0 ? -1 : int64_t{crc};
}

}  // namespace

int run_checkpoint_inspect(const CheckpointOptions& o) {
  return guard([&] {
    Result<CheckpointManifest> m = open_checkpoint(o.path);
    if (!m.is_ok()) return report(m.status());
    // The files first: a damaged checkpoint is one error line naming them.
    std::string damaged;
    int bad = 0;
    for (const auto& [name, f] : m->files) {
      const std::string path = (fs::path(m->dir) / name).string();
      std::error_code ec;
      const auto size = fs::file_size(path, ec);
      std::string problem;
      if (ec)
        problem = "is missing";
      else if (size != f.first)
        problem =
            "has " + std::to_string(size) + " bytes, the manifest says " + std::to_string(f.first);
      else if (o.verify && file_crc(path) != int64_t{f.second})
        problem = "is corrupt (CRC-32 does not match the manifest)";
      if (!problem.empty()) {
        damaged += std::string(bad ? "; " : "") + "'" + name + "' " + problem;
        ++bad;
      }
    }
    if (bad)
      return print_error("checkpoint " + m->dir + ": " + std::to_string(bad) + " of " +
                             std::to_string(m->files.size()) + " files are damaged: " + damaged,
                         2);
    if (o.json) {
      Result<std::string> text = read_regular_file((fs::path(m->dir) / "manifest.json").string());
      if (!text.is_ok()) return report(text.status());
      std::printf("%s\n", text->c_str());
      return 0;
    }
    std::printf("checkpoint %s: step %lld\n", m->dir.c_str(), static_cast<long long>(m->step));
    if (m->info.is_object())
      for (const char* k : {"model_source", "plan", "world"})
        if (m->info.contains(k)) std::printf("  %-12s %s\n", k, m->info[k].dump().c_str());
    double bytes = 0;
    for (const auto& [name, f] : m->files) bytes += double(f.first);
    std::printf("  files        %zu, %s\n", m->files.size(), mib(bytes).c_str());
    std::map<std::string, std::pair<int, double>> by_kind;
    for (const auto& [name, t] : m->tensors) {
      by_kind[t.kind].first += 1;
      by_kind[t.kind].second += double(t.global.numel());
    }
    for (const auto& [kind, c] : by_kind)
      std::printf("  %-12s %d tensors, %.0f elements\n", kind.c_str(), c.first, c.second);
    for (const auto& [name, t] : m->tensors)
      std::printf("    %-40s %-9s %-28s %zu block%s\n", name.c_str(), t.kind.c_str(),
                  t.global.to_string().c_str(), t.blocks.size(), t.blocks.size() == 1 ? "" : "s");
    if (o.verify) std::printf("  verified     every file's size and CRC-32\n");
    return 0;
  });
}

int run_checkpoint_export(const CheckpointOptions& o) {
  return guard([&] {
    Status s = check_output_file(o.to, "--to");
    if (!s.is_ok()) return report(s);
    Result<CheckpointManifest> m = open_checkpoint(o.path);
    if (!m.is_ok()) return report(m.status());
    CheckpointReader reader(*m);
    NamedTensors out;
    for (const auto& [name, t] : m->tensors) {
      if (t.kind != "parameter" && t.kind != "buffer") continue;  // the model, not the optimizer
      Result<Tensor> whole = reader.read_whole(name);
      if (!whole.is_ok()) return report(whole.status());
      out.emplace_back(name, *whole);
    }
    if (o.hf) {  // transformers' names and layouts, from the model the manifest records
      if (!m->info.is_object() || !m->info.contains("model"))
        return report(Status::invalid("checkpoint " + m->dir + ": the manifest records no model"));
      Result<ModelConfig> model = parse_model_config(m->info["model"]);
      if (!model.is_ok()) return report(model.status());
      const std::map<std::string, Tensor> ours(out.begin(), out.end());
      Result<NamedTensors> hf = to_hf_state_dict(*model, ours);
      if (!hf.is_ok()) return report(hf.status());
      out = std::move(hf).value();
    }
    s = write_safetensors(o.to, out,
                          {{"format", "pt"}, {"meshflow_step", std::to_string(m->step)}});
    if (!s.is_ok()) return report(s);
    std::fprintf(stderr, "meshflow: wrote %zu tensors of %s (step %lld) to %s\n", out.size(),
                 m->dir.c_str(), static_cast<long long>(m->step), o.to.c_str());
    return 0;
  });
}

void add_checkpoint_commands(CLI::App& app) {
  CLI::App* c = app.add_subcommand("checkpoint", "Inspect or export a full-state checkpoint");
  c->require_subcommand(1);
  auto io = std::make_shared<CheckpointOptions>();
  CLI::App* i = c->add_subcommand("inspect", "Print what a checkpoint holds, check its files");
  i->add_option("dir", io->path, "Checkpoint directory (or a directory of them: the latest)")
      ->required();
  i->add_flag("--verify", io->verify, "Read every file whole and check its CRC-32");
  i->add_flag("--json", io->json, "Print the manifest");
  i->callback([io]() { std::exit(run_checkpoint_inspect(*io)); });
  auto eo = std::make_shared<CheckpointOptions>();
  CLI::App* e = c->add_subcommand(
      "export", "Write a checkpoint's weights and buffers, whole, to one safetensors file");
  e->add_option("dir", eo->path, "Checkpoint directory (or a directory of them: the latest)")
      ->required();
  e->add_option("--to", eo->to, "The safetensors file to write")->required();
  e->add_flag("--hf", eo->hf,
              "Hugging Face transformers' names and layouts (GPT-2, LLaMA), as save_pretrained");
  e->callback([eo]() { std::exit(run_checkpoint_export(*eo)); });
}

}  // namespace meshflow::cli
