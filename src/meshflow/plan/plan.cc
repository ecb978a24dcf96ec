#include "meshflow/plan/plan.h"

#include <algorithm>

namespace meshflow::plan {

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

Result<Recompute> parse_recompute(const std::string& s) {
  for (Recompute x : {Recompute::kNone, Recompute::kSelective, Recompute::kFull})
    if (s == recompute_name(x)) return x;
  return Status::invalid("recompute must be one of none, selective, full, got '" + s + "'");
}

const char* offload_name(Offload o) {
  switch (o) {
    case Offload::kNone:
      return "none";
    case Offload::kHost:
      return "host";
    case Offload::kNvme:
      return "nvme";
  }
  return "?";
}

Result<Offload> parse_offload(const std::string& s) {
  for (Offload x : {Offload::kNone, Offload::kHost, Offload::kNvme})
    if (s == offload_name(x)) return x;
  return Status::invalid("offload must be one of none, host, nvme, got '" + s + "'");
}

std::vector<int64_t> embedding_and_loss_split(int64_t layers, int64_t chunks) {
  if (chunks < 2 || (layers + 2) % chunks != 0 || (layers + 2) / chunks < 2) return {};
  std::vector<int64_t> split(static_cast<size_t>(chunks), (layers + 2) / chunks);
  split.front() -= 1;
  split.back() -= 1;
  return split;
}

std::string plan_label(const Plan& p) {
  std::string s = "dp=" + std::to_string(p.dp) + " tp=" + std::to_string(p.tp);
  if (p.sp) s += "+sp";
  if (p.ops) s += "+ops";
  s += " pp=" + std::to_string(p.pp);
  if (p.cp > 1) s += " cp=" + std::to_string(p.cp) + (p.ring ? "ring" : "");
  if (p.vp > 1) s += " vp=" + std::to_string(p.vp);
  if (!p.layers_per_stage.empty()) {
    s += " stages=";
    for (size_t i = 0; i < p.layers_per_stage.size(); ++i)
      s += (i ? "/" : "") + std::to_string(p.layers_per_stage[i]);
  }
  s += " mb=" + std::to_string(p.micro_batch) + "x" + std::to_string(p.num_micro_batches);
  s += " " + std::string(schedule_name(p.schedule)) + " " + recompute_name(p.recompute);
  if (p.recompute == Recompute::kFull && p.recompute_layers > 0)
    s += ":" + std::to_string(p.recompute_layers);
  s += " zero" + std::to_string(p.zero);
  if (p.group) s += " group";
  if (p.offload != Offload::kNone) s += " offload=" + std::string(offload_name(p.offload));
  return s;
}

std::vector<int64_t> chunk_blocks(const Plan& p, int64_t layers) {
  if (!p.layers_per_stage.empty()) return p.layers_per_stage;
  const int64_t chunks = std::max<int64_t>(1, p.pp * p.vp);
  std::vector<int64_t> sizes;
  for (int64_t c = 0; c < chunks; ++c)
    sizes.push_back(layers / chunks + (c < layers % chunks ? 1 : 0));
  return sizes;
}

std::vector<int64_t> first_blocks_of_chunks(const std::vector<int64_t>& chunks, int64_t n) {
  std::vector<int64_t> blocks;
  int64_t first = 0;
  for (int64_t size : chunks) {
    for (int64_t k = 0; k < std::min(n, size); ++k) blocks.push_back(first + k);
    first += size;
  }
  return blocks;
}

std::optional<int64_t> first_blocks_count(const std::vector<int64_t>& chunks,
                                          std::vector<int64_t> blocks) {
  if (chunks.empty() || blocks.empty()) return std::nullopt;
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  const int64_t n =
      std::count_if(blocks.begin(), blocks.end(), [&](int64_t b) { return b < chunks[0]; });
  if (n == 0 || blocks != first_blocks_of_chunks(chunks, n)) return std::nullopt;
  return n;
}

std::string plan_mesh(const Plan& p) {
  std::string s = "dp=" + std::to_string(p.dp);
  if (p.tp > 1) s += ",tp=" + std::to_string(p.tp);
  if (p.pp > 1) s += ",pp=" + std::to_string(p.pp);
  if (p.cp > 1) s += ",cp=" + std::to_string(p.cp);
  return s;
}

}  // namespace meshflow::plan
