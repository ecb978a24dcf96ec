// The cost model against published runs: prices every run of
// ../shared/reference/public_runs.json (LLM pre-training throughput
// reported by Megatron-LM, llm-foundry, TorchTitan, BLOOM, ... with model
// shape, hardware and parallel configuration) with its own degrees pinned, and
// prints predicted vs published iteration time, the error statistics and the
// rank agreement (Kendall tau) inside groups of runs that share a model shape
// and a GPU.
//
//   public_runs [--file ../shared/reference/public_runs.json]
//               [--clusters configs/clusters] [--only GROUP_SUBSTRING] [--verbose]
//
// A measurement harness: nothing is fitted or set per row. The constants are
// CostConstants' defaults (one fitted scalar, from Megatron-LM 2021 Table 1)
// or megatron2021_constants() for the pre-FlashAttention Megatron-DeepSpeed
// stacks; the clusters are the shipped datasheet files. Where the source left
// a field out, a documented rule below fills it and the row lists it under
// "inferred". --verbose adds each run's predicted breakdown, memory and the
// source of the published figure.
//
// bench/public_runs.sh builds it and runs it from the repository root.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "meshflow/config/json_reader.h"
#include "meshflow/core/file_io.h"
#include "meshflow/models/from_config.h"
#include "meshflow/plan/cluster.h"
#include "meshflow/plan/cost_model.h"
#include "meshflow/plan/emit.h"
#include "meshflow/plan/model_dims.h"
#include "meshflow/plan/plan.h"
#include "meshflow/plan/prediction_band.h"
#include "meshflow/plan/search.h"

using namespace meshflow;
using namespace meshflow::plan;

namespace {

// ---------------------------------------------------------------- helpers

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool has(const std::string& hay, const char* needle) {
  return lower(hay).find(lower(needle)) != std::string::npos;
}

// o[key] as an integer when it is one (null, absent, strings like "all GPUs": nothing).
std::optional<int64_t> get_int(const json& o, const char* key) {
  if (!o.is_object() || !o.contains(key)) return std::nullopt;
  const json& v = o.at(key);
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d == std::floor(d)) return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

std::optional<double> get_num(const json& o, const char* key) {
  if (!o.is_object() || !o.contains(key) || !o.at(key).is_number()) return std::nullopt;
  return o.at(key).get<double>();
}

std::string get_str(const json& o, const char* key) {
  if (!o.is_object() || !o.contains(key) || !o.at(key).is_string()) return "";
  return o.at(key).get<std::string>();
}

std::optional<bool> get_bool(const json& o, const char* key) {
  if (!o.is_object() || !o.contains(key) || !o.at(key).is_boolean()) return std::nullopt;
  return o.at(key).get<bool>();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Kendall's tau-b of two paired samples (ties counted on either side); NaN
// when one side is all ties.
double kendall_tau_b(const std::vector<double>& x, const std::vector<double>& y) {
  long long concordant = 0, discordant = 0, tie_x = 0, tie_y = 0;
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t j = i + 1; j < x.size(); ++j) {
      const double dx = x[i] - x[j], dy = y[i] - y[j];
      if (dx == 0 && dy == 0) continue;
      if (dx == 0) {
        ++tie_x;
      } else if (dy == 0) {
        ++tie_y;
      } else if ((dx > 0) == (dy > 0)) {
        ++concordant;
      } else {
        ++discordant;
      }
    }
  const double denom =
      std::sqrt(double(concordant + discordant + tie_x) * double(concordant + discordant + tie_y));
  return denom > 0 ? double(concordant - discordant) / denom : std::nan("");
}

// ---------------------------------------------------------------- mapping

struct Mapped {
  int id = -1;
  std::string group, name;
  int64_t gpus = 0;
  std::vector<std::string> skip;  // reasons, first one counts
  std::vector<std::string> inferred;
  // What is priced.
  ModelConfig model;
  std::string model_key;  // the shape, for Kendall groups
  std::string cluster_file;
  int64_t gpus_per_node = 8;
  std::optional<double> inter_node_bytes_per_s;  // stated by the source, per GPU
  std::optional<double> power_limit_w;           // stated by the source, per GPU
  int64_t nvlink_island = 0;                     // GPUs per NVLink island (0: the node)
  // Full recompute of some blocks, how many not stated: the fewest that fit.
  bool fewest_blocks_that_fit = false;
  bool fp8 = false;                                  // the blocks' linears in FP8
  Fp8Scaling fp8_scaling = Fp8Scaling::kTensorwise;  // torchao's rowwise recipe where stated
  bool te_attention = false;  // Transformer Engine's attention kernel (Megatron-Core)
  Plan plan;
  CostConstants k;
  std::string stack;                // "default" | "megatron2021"
  bool fsdp_shard_grad_op = false;  // stated FSDP SHARD_GRAD_OP (map_zero)
  // Neither tp, pp nor dp stated: the plan is the best the planner finds for
  // the framework (map_plan's rules), the other choices searched too.
  bool search_layout = false;
  std::string framework;
  int64_t global_batch = 0, seq = 0;
  double published_s = 0;
  std::string published_how;
  // The peak memory per GPU the source reports (GiB), where it gives one:
  // TorchTitan's logged peak (peak_memory_gib), BigScience's chronicles'
  // "peak GPU mem" column ("59GB", read as GiB).
  std::optional<double> published_mem_gib;
};

// measured.also's peak memory per GPU in GiB, where the run states one.
std::optional<double> published_memory_gib(const json& run) {
  const json& m = run.at("measured");
  if (!m.contains("also") || !m.at("also").is_object()) return std::nullopt;
  const json& also = m.at("also");
  if (also.contains("peak_memory_gib") && also.at("peak_memory_gib").is_number())
    return also.at("peak_memory_gib").get<double>();
  if (also.contains("peak_gpu_mem") && also.at("peak_gpu_mem").is_string()) {
    const std::string v = also.at("peak_gpu_mem").get<std::string>();
    char* end = nullptr;
    const double gb = std::strtod(v.c_str(), &end);
    if (end != v.c_str() && gb > 0 && std::string(end) == "GB") return gb;
  }
  return std::nullopt;
}

// GPU -> cluster file (configs/clusters/). A GPU without a file is skipped.
// An H100 or A100 whose memory the source leaves open (or states two ways) is
// taken as the 80 GB part, recorded as inferred.
void map_gpu(const json& hw, Mapped* m) {
  const std::string g = get_str(hw, "gpu");
  // Blackwell: the rack-scale parts as NVL72 NVLink domains of 18 trays of 4
  // (configs/clusters/gb*_nvl72.json), the 8-GPU boards as DGX/HGX B200.
  if (has(g, "gb200") || has(g, "gb300")) {
    m->cluster_file = has(g, "gb200") ? "gb200_nvl72.json" : "gb300_nvl72.json";
    return;
  }
  if (has(g, "b200")) {
    m->cluster_file = "b200_sxm.json";
    return;
  }
  if (has(g, "h200")) {
    m->cluster_file = "h200_sxm.json";
    return;
  }
  if (has(g, "h100")) {
    if (has(g, "96gb")) {
      m->cluster_file = "h100_96gb.json";
    } else {
      m->cluster_file = "h100_sxm.json";
      if (!has(g, "80gb") || has(g, "assum") || has(g, "inferred"))
        m->inferred.push_back("gpu=H100-80GB");
    }
    return;
  }
  if (has(g, "a100")) {
    const bool g40 = has(g, "40gb"), g80 = has(g, "80gb");
    if (g40 && !g80) {
      m->cluster_file = "a100_40gb.json";
    } else {
      m->cluster_file = "dgx_a100_80gb.json";
      if (!g80 || g40) m->inferred.push_back("gpu=A100-80GB");
    }
    return;
  }
  m->skip.push_back("no cluster file for GPU '" + g + "'");
}

// The inter-node bandwidth per GPU, one direction, where the source states
// the fabric (hardware.interconnect): "<rate> ... per GPU", "<rate> inter-node"
// or "node-to-node" (per node, shared by its GPUs), "<n> OPA links/node"
// (Omni-Path 100 Gb/s each) or "<n>x ConnectX-6" (HDR InfiniBand, 200 Gb/s
// each). Unstated: the cluster file's figure.
std::optional<double> stated_inter_node(const json& hw, int64_t gpus_per_node) {
  const std::string s = lower(get_str(hw, "interconnect"));
  if (s.empty()) return std::nullopt;
  const double per_node = 1.0 / static_cast<double>(gpus_per_node);
  std::smatch m;
  if (std::regex_search(s, m, std::regex(R"((\d+)\s*opa links?/node)")))
    return std::stod(m[1]) * 100e9 / 8 * per_node;
  // Jean Zay's A100 nodes, named without the count by BLOOM's prequel runs:
  // 4 Omni-Path links, as BLOOM's main-run README states for the same nodes.
  if (has(s, "omni-path") && has(s, "jean zay")) return 4 * 100e9 / 8 * per_node;
  if (std::regex_search(s, m, std::regex(R"((\d+)x connectx-6)")))
    return std::stod(m[1]) * 200e9 / 8 * per_node;
  if (!std::regex_search(s, m, std::regex(R"(([\d.]+)\s*(gbps|gb/s|tbps|tb/s))")))
    return std::nullopt;
  const double bytes = std::stod(m[1]) * (m[2].str()[0] == 't' ? 1e12 : 1e9) / 8;
  if (has(s, "per gpu")) return bytes;
  if (has(s, "inter-node") || has(s, "node-to-node") || has(s, "roce")) return bytes * per_node;
  return std::nullopt;
}

// GPUs per NVLink island where the source's node has more than one island.
// BLOOM's README describes Jean Zay's 8-GPU A100 nodes as "8 GPUs per node
// Using NVLink 4 inter-gpu connects": NV4, four NVLinks to each peer, which
// on an A100's 12 links is three peers, a fully connected island of four
// (an NVSwitch board connects every pair over its switches: NV12). The
// islands of a node then meet over PCIe.
int64_t stated_nvlink_island(const json& hw) {
  const std::string s = lower(get_str(hw, "interconnect"));
  if (has(s, "jean zay") && has(get_str(hw, "gpu"), "a100")) return 4;
  return 0;
}

// The GPUs' power limit where the source states one (hardware.gpu: "... 500W
// power limit"): priced as the cluster file's device.power_limit_w.
std::optional<double> stated_power_limit(const json& hw) {
  std::smatch m;
  const std::string g = lower(get_str(hw, "gpu"));
  if (std::regex_search(g, m, std::regex(R"((\d+)\s*w power limit)"))) return std::stod(m[1]);
  return std::nullopt;
}

// FP8 (Transformer Engine, torchao Float8 linears, llm-foundry amp_fp8): the
// blocks' linears priced in FP8 (TrainingJob::fp8).
bool is_fp8(const json& par) {
  const std::string p = get_str(par, "precision"), t = get_str(par, "techniques");
  if (has(p, "fp8") || has(p, "float8")) return true;
  if ((has(t, "fp8") || has(t, "float8")) && !has(t, "quantization=none")) return true;
  return false;
}

// The model: LLaMA-style (RoPE, RMSNorm, SwiGLU, GQA) when the run says SwiGLU
// or Llama; otherwise GPT-style (learned positions, LayerNorm, GeLU MLP), which
// also stands for MPT, BLOOM (ALiBi: no position table, a negligible
// difference), OPT (ReLU) and GPT-NeoX. Shapes as given; a null kv_heads is
// the head count (MHA) and a null GPT ffn 4 x hidden (both recorded).
// Embeddings tied unless the run says "untied" (LLaMA: untied).
Result<ModelConfig> map_model(const json& md, Mapped* m) {
  const std::string family = get_str(md, "family"), mlp = get_str(md, "mlp");
  const std::string notes = get_str(md, "notes");
  const int64_t layers = get_int(md, "layers").value_or(0);
  const int64_t hidden = get_int(md, "hidden").value_or(0);
  const int64_t heads = get_int(md, "heads").value_or(0);
  const int64_t vocab = get_int(md, "vocab").value_or(0);
  const int64_t seq = get_int(md, "seq_len").value_or(0);
  std::optional<int64_t> kv = get_int(md, "kv_heads"), ffn = get_int(md, "ffn");
  const bool llama = has(mlp, "swiglu") || has(family, "llama");
  if (!kv) {
    kv = heads;
    m->inferred.push_back("kv=heads");
  }
  if (!ffn) {
    if (llama) return Status::invalid("LLaMA-style model without ffn");
    ffn = 4 * hidden;
    m->inferred.push_back("ffn=4h");
  }
  const bool untied = has(family, "untied") || has(notes, "untied");
  json j;
  if (llama) {
    j = {{"model_type", "llama"},       {"num_hidden_layers", layers},
         {"hidden_size", hidden},       {"num_attention_heads", heads},
         {"num_key_value_heads", *kv},  {"intermediate_size", *ffn},
         {"vocab_size", vocab},         {"max_position_embeddings", seq},
         {"tie_word_embeddings", false}};
  } else {
    j = {{"model_type", "gpt2"}, {"n_layer", layers},
         {"n_embd", hidden},     {"n_head", heads},
         {"n_positions", seq},   {"vocab_size", vocab},
         {"n_inner", *ffn},      {"tie_word_embeddings", !untied}};
    if (*kv != heads) return Status::invalid("GPT-style model with GQA");
  }
  char key[160];
  std::snprintf(key, sizeof key, "%s L%lld h%lld a%lld kv%lld f%lld V%lld s%lld",
                llama ? "llama" : "gpt", (long long)layers, (long long)hidden, (long long)heads,
                (long long)*kv, (long long)*ffn, (long long)vocab, (long long)seq);
  m->model_key = key;
  return parse_model_config(j);
}

// Megatron-LM's num_floating_point_operations (model FLOPs of one step, no
// recompute, attention over the full s x s): the convention the Megatron-LM
// README rows state.
double megatron_model_flops(const json& md, int64_t batch) {
  const double L = get_int(md, "layers").value_or(0), h = get_int(md, "hidden").value_or(0);
  const double a = get_int(md, "heads").value_or(1), s = get_int(md, "seq_len").value_or(0);
  const double V = get_int(md, "vocab").value_or(0);
  const double kv = get_int(md, "kv_heads").value_or(static_cast<int64_t>(a));
  const double f = get_int(md, "ffn").value_or(static_cast<int64_t>(4 * h));
  const double gated = has(get_str(md, "mlp"), "swiglu") ? 1.5 : 1.0;
  return 12.0 * batch * s * L * h * h * ((1 + kv / a + s / h) + f / h * gated + V / (2 * L * h));
}

// The published iteration time, in order of preference:
//   1. measured.derived.iteration_s (computed by the compiler of the file from
//      the source's own figures);
//   2. measured.kind iteration_s: the value;
//   3. tokens/s (total or per GPU), samples/s: global_batch (x seq) over it;
//      also from measured.also when the primary figure is a FLOP rate;
//   4. MFU or TFLOP/s per GPU only under a convention the run names that we
//      can recompute: Megatron-LM model FLOPs (num_floating_point_operations)
//      against the peak the convention states (989 or 312 TFLOP/s).
//   Otherwise (convention not stated or not verified) the run is skipped.
std::optional<double> published_iteration_s(const json& run, Mapped* m) {
  const json& ms = run.at("measured");
  const json& md = run.at("model");
  const double gb = double(m->global_batch), seq = double(m->seq), gpus = double(m->gpus);
  if (ms.contains("derived")) {
    if (auto v = get_num(ms.at("derived"), "iteration_s")) {
      m->published_how = "derived.iteration_s";
      return *v;
    }
  }
  const std::string kind = get_str(ms, "kind");
  const std::optional<double> value = get_num(ms, "value");
  if (!value || *value <= 0) return std::nullopt;
  auto from_rate = [&](const std::string& k, double v) -> std::optional<double> {
    if (k == "iteration_s") return v;
    if (k == "tokens_per_s_per_gpu") return gb * seq / (v * gpus);
    if (k == "tokens_per_s" || k == "tokens_per_s_total") return gb * seq / v;
    if (k == "samples_per_s") return gb / v;
    return std::nullopt;
  };
  if (auto t = from_rate(kind, *value)) {
    m->published_how = kind;
    return t;
  }
  if (ms.contains("also") && ms.at("also").is_object()) {
    for (const char* k : {"tokens_per_s_per_gpu", "tokens_per_s_total", "samples_per_s"}) {
      if (auto v = get_num(ms.at("also"), k); v && *v > 0) {
        m->published_how = std::string("also.") + k;
        return from_rate(k, *v);
      }
    }
  }
  const std::string conv = get_str(ms, "flops_convention");
  const bool megatron_model = has(conv, "megatron") && has(conv, "model flops");
  if (megatron_model && (kind == "mfu" || kind == "tflops_per_gpu")) {
    double tflops = *value;
    if (kind == "mfu") {
      const double peak = has(conv, "989") ? 989 : has(conv, "312") ? 312 : 0;
      if (peak == 0) return std::nullopt;
      tflops = *value * peak;
    }
    m->published_how = kind + " via Megatron model FLOPs";
    return megatron_model_flops(md, m->global_batch) / (tflops * 1e12 * gpus);
  }
  return std::nullopt;
}

int map_zero(const json& par, Mapped* m) {
  const std::string z = lower(get_str(par, "zero_or_fsdp"));
  if (z.empty()) {
    // Megatron-LM's --overlap-param-gather needs --use-distributed-optimizer (ZeRO-1).
    if (has(get_str(par, "comm_overlap"), "overlap-param-gather")) {
      m->inferred.push_back("zero1(overlap-param-gather)");
      return 1;
    }
    m->inferred.push_back("zero0");
    return 0;
  }
  if (has(z, "hsdp")) {
    // Sharded within a node, replicated across: no such plan; priced as
    // ZeRO-3 over all the replicas (its gathers then cross nodes).
    m->inferred.push_back("hsdp~zero3");
    return 3;
  }
  if (has(z, "full_shard") || has(z, "fully_shard") || has(z, "full shard") || has(z, "zero-3") ||
      has(z, "megatron-fsdp"))
    return 3;
  if (has(z, "shard_grad_op")) {
    m->fsdp_shard_grad_op = true;  // FSDP's per-unit gathers (CostConstants)
    return 2;
  }
  if (has(z, "zero2") || has(z, "zero-2")) return 2;
  if (has(z, "zero-1") || has(z, "zero1") || has(z, "distributed optimizer")) return 1;
  if (has(z, "ddp")) return 0;
  m->inferred.push_back("zero0");
  return 0;
}

Recompute map_recompute(const json& par, Mapped* m) {
  const std::string r = lower(get_str(par, "recompute"));
  if (r.empty() || has(r, "not stated in table")) {
    m->inferred.push_back("rc=none");
    return Recompute::kNone;
  }
  const bool assumed = has(r, "assumed") || has(r, "implied") || has(r, "inferred");
  if (r.rfind("full", 0) == 0) {
    if (assumed) m->inferred.push_back("rc=full");
    return Recompute::kFull;
  }
  if (r.rfind("selective", 0) == 0) {
    // FMS's full-block AC on a fraction of the blocks, the fraction not
    // stated: whole blocks recompute, the fewest that let the step fit
    // (Plan::recompute_layers, chosen in main once the cluster is known), as
    // a user sets the fraction: recompute costs time, so no more than fits.
    // TorchTitan's op-level SAC is priced as itself (map_run).
    if (has(r, "fraction") && has(r, "full-block")) {
      m->fewest_blocks_that_fit = true;
      return Recompute::kFull;
    }
    return Recompute::kSelective;
  }
  if (r.rfind("none", 0) == 0) return Recompute::kNone;
  m->inferred.push_back("rc=none");
  return Recompute::kNone;
}

// Megatron-Core/-Bridge and TorchTitan run sequence parallelism with tp > 1
// (map_plan's sp rule).
bool runs_sequence_parallel(const std::string& framework) {
  return has(framework, "megatron-core") || has(framework, "megatron-bridge") ||
         has(framework, "torchtitan");
}

// DeepSpeed's partition_balanced over unit weights, the embedding and the
// tied head embedding counted as a layer at each end: every stage takes
// ceil((L + 2) / pp) items while they last (a short last stage where they do
// not divide). The blocks per stage, model order.
std::vector<int64_t> deepspeed_embedding_split(int64_t layers, int64_t pp) {
  const int64_t items = layers + 2, per = (items + pp - 1) / pp;
  std::vector<int64_t> blocks;
  for (int64_t s = 0, left = items; s < pp; ++s) {
    const int64_t take = std::min(per, left);
    left -= take;
    blocks.push_back(take - (s == 0 ? 1 : 0) - (s == pp - 1 ? 1 : 0));
  }
  return blocks;
}

// The Plan. Rules for what the source leaves null (each recorded):
//   tp and pp both: the layout is searched (Mapped::search_layout): the
//       plan the run's framework runs that the planner prices fastest, as
//       `meshflow plan --emit` would pick it, on the assumption that the
//       team that published the run tuned its layout (the Megatron-LM
//       strong-scaling rows, whose README gives no layout). One of them: 1.
//   cp: 1 (a stated cp > 1 is ring attention for TorchTitan and Megatron-Core
//       and -Bridge).  dp: gpus / (tp pp cp) (checked against a stated dp).
//   vp: 1; vp > 1 -> the interleaved schedule, else 1F1B (Megatron, DeepSpeed
//       and TorchTitan's default non-interleaved pipeline).
//   sp: Megatron-Core/-Bridge and TorchTitan use sequence parallelism with
//       tp > 1 (Megatron's --tp-comm-overlap requires it; TorchTitan's TP plan
//       shards the norms over the sequence): on; others (Megatron-DeepSpeed
//       2022, metaseq): off.
//   micro_batch, in order: stated; TorchTitan's local_batch_per_dp_rank (no
//       gradient accumulation: one micro-batch of it with pp = 1; with pp > 1
//       its pipeline_parallel_microbatch_size default 1, or at 9dec370 its
//       pipeline_parallel_microbatches default pp: local / pp); global / (dp x
//       grad_accum) when both known; 1 when pp > 1 (Megatron's default
//       --micro-batch-size, the most common pipeline setting); global / dp
//       (one micro-batch, no accumulation) when pp = 1.
//   num_micro_batches: global / (dp x micro_batch) (an invalid plan when not whole).
//   recompute: map_recompute; zero: map_zero.
void map_plan(const json& run, Mapped* m) {
  const json& par = run.at("parallel");
  Plan& p = m->plan;
  std::optional<int64_t> tp = get_int(par, "tp"), pp = get_int(par, "pp");
  if (!tp && !pp && !get_int(par, "dp")) {
    m->search_layout = true;
    m->inferred.push_back("layout=searched");
  } else if (!tp || !pp) {
    m->inferred.push_back("tp/pp=1");
  }
  if (!tp) tp = 1;
  if (!pp) pp = 1;
  p.tp = *tp;
  p.pp = *pp;
  if (auto cp = get_int(par, "cp")) {
    p.cp = *cp;
  } else {
    p.cp = 1;
    m->inferred.push_back("cp=1");
  }
  // Context parallelism is ring attention in TorchTitan (torch's
  // context_parallel: the K/V shards passed round, what `--emit torchtitan`
  // requires) and in Megatron-Core (--cp-comm-type's default p2p), not
  // Ulysses' all-to-all to head shards.
  const std::string framework = get_str(par, "framework");
  if (p.cp > 1 && (has(framework, "torchtitan") || has(framework, "megatron-core") ||
                   has(framework, "megatron-bridge"))) {
    p.ring = true;
    m->inferred.push_back("cp=ring");
  }
  const int64_t model_par = p.tp * p.pp * p.cp;
  if (auto dp = get_int(par, "dp")) {
    p.dp = *dp;
  } else {
    p.dp = m->gpus / std::max<int64_t>(model_par, 1);
    m->inferred.push_back("dp");
  }
  if (auto vp = get_int(par, "vpp")) {
    p.vp = std::max<int64_t>(*vp, 1);
  } else {
    p.vp = 1;
    if (p.pp > 1 && has(get_str(par, "techniques"), "interleaved")) {
      p.vp = 2;
      m->inferred.push_back("vp=2");
    }
  }
  p.schedule = p.pp > 1 && p.vp > 1 ? ScheduleKind::kInterleaved : ScheduleKind::k1F1B;
  const std::string fw = get_str(par, "framework");
  // Layers the pipeline's chunks do not divide: the framework's own uneven
  // split, one entry per chunk in model order (else the plan is invalid).
  const int64_t layers = get_int(run.at("model"), "layers").value_or(0);
  const int64_t chunks = p.pp * p.vp;
  // DeepSpeed's PipelineModule with partition_method 'type:transformer|embedding'
  // (Megatron-DeepSpeed's --pp-partition-method, BLOOM's): the embedding and
  // the tied embedding at the head count as layers when the stages are
  // balanced, so the first and last stages hold one block fewer.
  // BigScience's topology runs used it from the chronicle's "Rebalancing
  // layers" section on ("I implemented and enabled --pp-partition-method
  // 'type:transformer|embedding'"), and the day before for the 106-layer
  // table of its "Re-do" section, whose header reads "regex
  // partition_method='type:transformer|embed'" (the rows of that section
  // whose blocks and two embeddings divide the stages; its 78-layer rows at
  // pp = 6 do not); the main run states it.
  const std::string source = get_str(run, "source");
  const bool embedding_slots =
      has(get_str(par, "pp_partition"), "type:transformer|embedding") ||
      (has(fw, "deepspeed") && (has(source, "section 'Rebalancing layers'") ||
                                (has(source, "section 'Re-do', row dated 2022-02-27") && p.pp > 1 &&
                                 (layers + 2) % p.pp == 0)));
  const std::vector<int64_t> ds_split = p.pp > 1 && p.vp == 1 && embedding_slots
                                            ? deepspeed_embedding_split(layers, p.pp)
                                            : std::vector<int64_t>{};
  if (!ds_split.empty() && *std::min_element(ds_split.begin(), ds_split.end()) >= 1) {
    p.layers_per_stage = ds_split;
    m->inferred.push_back("split=ds-emb");
  } else if (p.pp > 1 && layers >= chunks && layers % chunks != 0) {
    if (has(fw, "torchtitan")) {
      // generate_split_points (torchtitan's pipelining utils): the first
      // chunk floor(L / S) layers, the middle ones one more while the
      // remainder lasts, the last what is left.
      const int64_t base = layers / chunks;
      int64_t extra = layers % chunks, used = base;
      p.layers_per_stage = {base};
      for (int64_t c = 1; c + 1 < chunks; ++c) {
        const int64_t n = base + (extra > 0 ? 1 : 0);
        extra -= extra > 0 ? 1 : 0;
        p.layers_per_stage.push_back(n);
        used += n;
      }
      p.layers_per_stage.push_back(layers - used);
      m->inferred.push_back("split=torchtitan");
    } else if ((has(fw, "megatron-core") || has(fw, "megatron-bridge")) &&
               !embedding_and_loss_split(layers, chunks).empty()) {
      // account_for_embedding_in_pipeline_split and _loss_ (Megatron-Bridge's
      // performance recipes).
      p.layers_per_stage = embedding_and_loss_split(layers, chunks);
      m->inferred.push_back("split=emb+loss");
    }
  }
  if (auto sp = get_bool(par, "sequence_parallel")) {
    p.sp = *sp && p.tp > 1;
  } else {
    p.sp = p.tp > 1 && runs_sequence_parallel(fw);
    if (p.tp > 1) m->inferred.push_back(p.sp ? "sp=on" : "sp=off");
  }
  const int64_t gb = m->global_batch;
  if (auto mb = get_int(par, "micro_batch")) {
    p.micro_batch = *mb;
  } else if (auto lb = get_int(par, "local_batch_per_dp_rank")) {
    // TorchTitan under pipelines: its pipeline_parallel_microbatch_size,
    // default 1, since April 2025 (#1073); before it (the Dec 2024 benchmarks
    // at 9dec370), experimental.pipeline_parallel_microbatches, default the
    // pipeline degree: local batch / pp sequences a micro-batch.
    const bool titan_2024 = has(get_str(run, "source"), "torchtitan 9dec370");
    if (p.pp > 1 && titan_2024 && *lb % p.pp == 0) {
      p.micro_batch = *lb / p.pp;
      m->inferred.push_back("mb=local/pp");
    } else {
      p.micro_batch = p.pp > 1 ? 1 : *lb;
      m->inferred.push_back(p.pp > 1 ? "mb=1(pp)" : "mb=local");
    }
  } else if (auto ga = get_int(par, "grad_accum"); ga && p.dp > 0 && gb % (p.dp * *ga) == 0) {
    p.micro_batch = gb / (p.dp * *ga);
    m->inferred.push_back("mb=gb/(dp*ga)");
  } else if (p.pp > 1) {
    p.micro_batch = 1;
    m->inferred.push_back("mb=1");
  } else {
    p.micro_batch = std::max<int64_t>(gb / std::max<int64_t>(p.dp, 1), 1);
    m->inferred.push_back("mb=gb/dp");
  }
  const int64_t per_replica = p.dp * p.micro_batch;
  p.num_micro_batches = per_replica > 0 && gb % per_replica == 0 ? gb / per_replica : 0;
  p.recompute = map_recompute(par, m);
  p.zero = map_zero(par, m);
}

Mapped map_run(const json& run) {
  Mapped m;
  m.id = get_int(run, "id").value_or(-1);
  m.group = get_str(run, "group");
  m.name = get_str(run.at("model"), "name");
  const json& hw = run.at("hardware");
  const json& par = run.at("parallel");
  if (auto g = get_int(hw, "num_gpus")) {
    m.gpus = *g;
  } else {
    m.skip.push_back("GPU count not stated");
  }
  map_gpu(hw, &m);
  if (is_fp8(par)) {
    m.fp8 = true;
    // torchao's rowwise recipe ("quantization=float8 rowwise"); tensorwise
    // otherwise (Transformer Engine, torchao's default before its recipes).
    const bool rowwise =
        has(get_str(par, "techniques"), "rowwise") || has(get_str(par, "precision"), "rowwise");
    if (rowwise) m.fp8_scaling = Fp8Scaling::kRowwise;
    m.inferred.push_back(rowwise ? "fp8(rowwise)" : "fp8");
  }
  if (auto n = get_int(hw, "gpus_per_node")) {
    m.gpus_per_node = *n;
  } else {
    m.gpus_per_node = 8;
    m.inferred.push_back("gpn=8");
  }
  m.power_limit_w = stated_power_limit(hw);
  if (m.power_limit_w) m.inferred.push_back("power=" + std::to_string(int(*m.power_limit_w)) + "W");
  m.nvlink_island = stated_nvlink_island(hw);
  if (m.nvlink_island > 0)
    m.inferred.push_back("nvlink=" + std::to_string(m.nvlink_island) + "gpu-islands");
  m.inter_node_bytes_per_s = stated_inter_node(hw, m.gpus_per_node);
  if (m.inter_node_bytes_per_s) {
    char note[64];
    std::snprintf(note, sizeof note, "net=%.3gGB/s/gpu", *m.inter_node_bytes_per_s / 1e9);
    m.inferred.push_back(note);
  }
  if (auto gb = get_int(par, "global_batch")) {
    m.global_batch = *gb;
  } else {
    m.skip.push_back("global batch not stated");
  }
  m.seq = get_int(run.at("model"), "seq_len").value_or(0);
  m.published_mem_gib = published_memory_gib(run);
  if (m.skip.empty()) {
    if (auto t = published_iteration_s(run, &m)) {
      m.published_s = *t;
    } else {
      m.skip.push_back("published figure not convertible (FLOP convention not stated)");
    }
  }
  if (!m.skip.empty()) return m;
  Result<ModelConfig> model = map_model(run.at("model"), &m);
  if (!model.is_ok()) {
    m.skip.push_back("model not mappable: " + model.status().message());
    return m;
  }
  m.model = *model;
  map_plan(run, &m);
  // Pre-FlashAttention Megatron-DeepSpeed stacks (BLOOM 2022, MT-NLG 2021,
  // GPT-NeoX, metaseq): materialized attention scores and gradients reduced
  // after the pipeline flush (megatron2021_constants). Everything else ran
  // FlashAttention (llm-foundry flash/triton, SDPA flash, Transformer Engine)
  // with overlapped gradient reduction: the defaults.
  const std::string fw = get_str(par, "framework");
  m.framework = fw;
  if (has(fw, "deepspeed") || has(fw, "gpt-neox") || has(fw, "metaseq")) {
    m.k = megatron2021_constants();
    m.stack = "megatron2021";
  } else {
    m.k = CostConstants{};
    m.stack = "default";
  }
  // llm-foundry's benchmark tables ran submit_benchmarks.py's default
  // --attn_impl triton (flash_attn_triton: FlashAttention-1's algorithm in the
  // Triton of 2022) until the Jan 2024 large-scale sweep (sweep.py at
  // 5e85bd62d) passed --attn_impl flash (the flash-attn package, v2).
  if (m.group == "llm_foundry_mpt" && !has(get_str(run, "source"), "large scale")) {
    m.k.fused_attention = "flash1";
    m.stack += "+flash1";
    m.inferred.push_back("attn=triton(flash1)");
  }
  // TorchTitan: the constants `meshflow plan --emit torchtitan` prices it
  // with (f32 reduction, recompute inside the FSDP unit, its op-level SAC,
  // FSDP2 under pipelines as ZeRO-1).
  if (has(fw, "torchtitan")) {
    apply_stack_constants(EmitTarget::kTorchTitan, true, &m.k);
    m.stack += "+torchtitan";
    // Under pipelines its FSDP2 neither reshards after the forward nor
    // reduces before the step's last backward: ZeRO-1, as `--emit torchtitan`
    // writes and prices it (a fully_shard row with pp > 1).
    if (m.plan.pp > 1 && m.plan.zero == 3) {
      m.plan.zero = 1;
      m.inferred.push_back("fsdp2+pp=zero1");
    }
    // Its rows without torch.compile ran the model's ops eagerly.
    const std::string techniques = get_str(par, "techniques") + " " + fw;
    if (!has(techniques, "torch.compile")) {
      set_eager(&m.k);
      m.stack += "+eager";
    } else if (has(get_str(run, "source"), "torchtitan 9dec370")) {
      // Compiled blocks, the loss eager: TorchTitan's train.py of Dec 2024
      // left it uncompiled ("TODO: compiling loss function causes CUDA
      // errors"); its components/loss.py of 2025 compiles it with the model.
      m.k.loss_bytes_per_logit = CostConstants::kEagerLossBytesPerLogit;
      m.k.allocator_reserved_ratio = CostConstants::kReservedRatioEagerLoss;
      m.stack += "+eager-loss";
    }
  } else if (has(fw, "fsdp") || has(fw, "llm-foundry")) {
    // PyTorch FSDP (Composer, metaseq): the activation checkpoint inside each
    // sharded unit recomputes with the weights its pre-backward unshard
    // gathered, so full recompute adds no ZeRO-3 gather.
    m.k.zero3_gather_for_recompute = false;
    m.stack += "+fsdp-recompute";
  }
  // FSDP's SHARD_GRAD_OP gathers each unit's weights before its forward and
  // reduce-scatters its gradients after its backward (ZeRO-2 by unit).
  if (m.fsdp_shard_grad_op) {
    m.k.fsdp_shard_grad_op = true;
    m.stack += "+fsdp-unit";
  }
  // Gradients reduced in f32, as the run states: Composer's FSDP mixed
  // precision "DEFAULT" (reduce_dtype float32, "PURE" reduces in bf16),
  // TorchTitan's "fp32 reduce default".
  const std::string precision = get_str(par, "precision");
  if (has(precision, "mode default") || has(precision, "fp32 reduce")) {
    m.k.grad_reduce_bytes = 4;
    m.stack += "+f32-reduce";
  }
  // Gradients accumulated in f32 where the run states it (BLOOM's runs with
  // DeepSpeed's BF16_Optimizer): 4 bytes per gradient held.
  if (has(precision, "fp32 grad accumulation")) {
    m.k.grad_accumulation_bytes = 4;
    m.stack += "+f32-grads";
    // DeepSpeed's 2022 BF16_Optimizer (deepspeed/runtime/bf16_optimizer.py
    // as BigScience ran it): its bf16 gradients kept beside the f32 ones, and
    // a whole f32 copy of the weights, only the moments sharded.
    if (has(fw, "deepspeed")) {
      m.k.grad_copy_bytes = 2;
      m.k.whole_master_weights = true;
      m.k.hp_grad_pass_bytes = CostConstants::kBf16OptimizerHpGradPass;
      m.stack += "+bf16-optimizer";
    }
  } else if (has(fw, "deepspeed") && (m.plan.zero == 1 || m.plan.zero == 2)) {
    // DeepSpeed's ZeRO-1/2 optimizer (stage_1_and_2.py): the step's f32
    // gradient partition and the contiguous reduce bucket (reduce_bucket_size,
    // 5e8 elements by default), as `meshflow plan --emit deepspeed` prices it.
    apply_stack_constants(EmitTarget::kDeepSpeed, false, &m.k);
    m.stack += "+ds-zero-buffers";
  }
  // BigScience's BLOOM-176B jobs on Jean Zay launched every kernel
  // synchronously: tr11-176B-ml.slurm exports CUDA_LAUNCH_BLOCKING=1 ("do not
  // remove or the training will hang and nodes will be lost w/o this
  // workaround"), which chronicles-prequel.md adopted after jobs of 320 GPUs
  // hung without it, before the 48-node (384-GPU) benchmarks.
  if (has(get_str(run, "source"), "tr11-176B-ml")) {
    set_launch_blocking(&m.k);
    m.inferred.push_back("launch=blocking");
  }
  // Megatron-LM's tensor-parallel layers run the backward's collectives under
  // the weight-gradient GEMMs (Megatron-Core; Megatron-LM since 2022), as
  // `--emit megatron` prices it; not the 2021 forks of Megatron-DeepSpeed.
  if (has(fw, "megatron-core") || has(fw, "megatron-bridge")) {
    m.k.tp_backward_overlap = true;
    m.stack += "+tp-bwd-overlap";
    // Transformer Engine's attention, as `--emit megatron` prices it on the
    // run's device (apply_stack_attention, once the cluster is read: cuDNN's
    // fused kernel where the file prices it).
    m.te_attention = true;
    m.stack += "+te-attn";
    // Its interleaved schedule's p2p under the other chunks' compute
    // (overlap_p2p_comm, Megatron-LM's default there), as `--emit megatron`
    // prices it.
    m.k.overlap_p2p_interleaved = true;
    if (m.plan.schedule == ScheduleKind::kInterleaved) m.stack += "+p2p-overlap";
    // Transformer Engine's FP8 weights cast on a step's first micro-batch and
    // cached for the rest (Megatron-Core's set_is_first_microbatch).
    m.k.fp8_weight_cache = true;
    // Its sequence-parallel all-gathers quantized first (LayerNormLinear's
    // quantized ln_out, grad_output_preprocess's FP8 gather).
    m.k.fp8_tp_all_gather = true;
  }
  // Megatron-LM's --overlap-param-gather: the distributed optimizer's gather
  // under the next step's first forward.
  if (has(get_str(par, "comm_overlap"), "overlap-param-gather")) {
    m.k.overlap_param_gather = true;
    m.stack += "+param-gather-overlap";
  }
  // Stated tensor-parallel overlap: Megatron-LM's --tp-comm-overlap, TorchTitan's AsyncTP;
  // and Megatron-Bridge's Llama-3 recipes, which its performance scripts build
  // on (src/megatron/bridge/recipes/llama/llama3.py: the 70B pretrain config's
  // CommOverlapConfig(tp_comm_overlap=True, userbuffers_..._h100_h8192_tp4...)).
  // Likewise a run whose configs "follow NeMo performance scripts" (Megatron-LM's
  // Llama FP8 table): those scripts give Llama 3 70B and 405B, not 8B, a
  // userbuffers tp_comm_overlap_cfg for the GPU and dtype (NeMo
  // scripts/performance/llm/pretrain_llama31_*.py: ub_cfg["h100"]["fp8"]).
  const bool nemo_perf_scripts = has(get_str(run, "notes"), "NeMo performance scripts");
  if (has(get_str(par, "comm_overlap"), "tp-comm-overlap") ||
      has(get_str(par, "techniques"), "asynctp") || has(get_str(par, "techniques"), "async tp") ||
      ((has(fw, "megatron-bridge") || nemo_perf_scripts) && m.plan.tp > 1)) {
    m.k.tp_comm_overlap = true;
    m.stack += "+tp-overlap";
    if (has(fw, "torchtitan")) {
      m.k.tp_comm_overlap_backward = false;
      m.stack += "(fwd)";
    }
  }
  return m;
}

// The plan of a run that states no layout (Mapped::search_layout): the
// fastest plan that fits and that the run's framework runs as planned (the
// filter `meshflow plan --emit` searches with), cp 1 and sequence
// parallelism as map_plan sets them, on the run's GPUs and global batch.
Result<Plan> searched_layout(const CostModel& cm, const Mapped& m) {
  MF_ASSIGN_OR_RETURN(const TransformerDims dims, transformer_dims(m.model));
  std::optional<EmitTarget> target;
  if (has(m.framework, "megatron")) {
    target = EmitTarget::kMegatron;
  } else if (has(m.framework, "torchtitan")) {
    target = EmitTarget::kTorchTitan;
  } else if (has(m.framework, "deepspeed")) {
    target = EmitTarget::kDeepSpeed;
  }
  const bool sp = runs_sequence_parallel(m.framework);
  SearchOptions o;
  o.top_k = 0;
  o.fixed.cp = 1;
  o.fixed.ops = false;
  o.reject = [&](const Plan& p) -> std::string {
    if (target) {
      Status s = emit_check(p, dims, *target);
      if (!s.is_ok()) return s.message();
    }
    if (p.tp > 1 && p.sp != sp) return "sequence parallelism as the framework runs it";
    return "";
  };
  MF_ASSIGN_OR_RETURN(const SearchResult r, search_plans(cm, m.gpus, o));
  return r.plans.front().plan;
}

// ---------------------------------------------------------------- results

struct Priced {
  Mapped m;
  double predicted_s = 0, err = 0, params_b = 0;
  std::optional<double> mem_err;  // predicted / published peak memory - 1
  // The same with the device memory the plan leaves unused (its reserve for
  // the allocator, NCCL and the CUDA context) added: the device's view.
  std::optional<double> mem_err_device;
  bool fits = true;
  StepCost cost;
};

std::string bucket_of(int64_t gpus) {
  if (gpus <= 64) return "<=64";
  if (gpus <= 256) return "65-256";
  if (gpus <= 1024) return "257-1024";
  return ">1024";
}

struct Stats {
  int n = 0, within10 = 0;
  double mae = 0, med = 0;
};

Stats stats_of(const std::vector<double>& errs) {
  Stats s;
  s.n = static_cast<int>(errs.size());
  for (double e : errs) {
    s.mae += std::abs(e);
    if (std::abs(e) <= 0.10) ++s.within10;
  }
  if (s.n) s.mae /= s.n;
  s.med = median(errs);
  return s;
}

void print_stats_row(const std::string& label, const Stats& s) {
  std::printf("  %-38s %4d  %6.1f%%  %+7.1f%%  %5.0f%%\n", label.c_str(), s.n, 100 * s.mae,
              100 * s.med, s.n ? 100.0 * s.within10 / s.n : 0.0);
}

// What repeated measurements allow (main's "repeated configurations"): for
// each set of runs with identical priced inputs, one predicted time v; the
// least sum of |v / published - 1| over the set (v at the median weighted by
// 1 / published) and the fewest runs outside +-10% (v where most of the
// intervals [published / 1.1, published / 0.9] overlap).
struct RepeatFloor {
  int runs = 0, sets = 0;  // runs in sets of two or more, and those sets
  double median_spread = 0, max_spread = 0;
  double least_abs_err_sum = 0;  // over every run (singletons add 0)
  int least_outside = 0;
};

RepeatFloor repeat_floor(const std::map<std::string, std::vector<double>>& sets) {
  RepeatFloor f;
  std::vector<double> spreads;
  for (const auto& [key, pub] : sets) {
    if (pub.size() < 2) continue;
    ++f.sets;
    f.runs += static_cast<int>(pub.size());
    const auto [lo, hi] = std::minmax_element(pub.begin(), pub.end());
    spreads.push_back(*hi / *lo - 1);
    // sum |v - p| / p is convex and piecewise linear in v: its least is at a p.
    double best = 1e300;
    for (double v : pub) {
      double sum = 0;
      for (double p : pub) sum += std::abs(v / p - 1);
      best = std::min(best, sum);
    }
    f.least_abs_err_sum += best;
    int most_inside = 0;
    for (double v0 : pub) {
      for (double v : {v0 * 0.9, v0 * 1.1}) {  // the intervals' ends
        int inside = 0;
        for (double p : pub) inside += std::abs(v / p - 1) <= 0.10 + 1e-12;
        most_inside = std::max(most_inside, inside);
      }
    }
    f.least_outside += static_cast<int>(pub.size()) - most_inside;
  }
  if (!spreads.empty()) {
    f.median_spread = median(spreads);
    f.max_spread = *std::max_element(spreads.begin(), spreads.end());
  }
  return f;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string file = "../shared/reference/public_runs.json";  // from the repository root
  std::string clusters = "configs/clusters";
  std::string only, write_bands;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--file") {
      file = next();
    } else if (a == "--clusters") {
      clusters = next();
    } else if (a == "--only") {
      only = next();
    } else if (a == "--verbose" || a == "-v") {
      verbose = true;
    } else if (a == "--write-bands") {
      write_bands = next();
    } else {
      std::fprintf(
          stderr,
          "usage: public_runs [--file RUNS.json] [--clusters DIR] [--only GROUP_SUBSTRING] "
          "[--verbose] [--write-bands FILE]\n");
      return 2;
    }
  }
  Result<json> doc = read_json_file(file);
  if (!doc.is_ok()) {
    std::fprintf(stderr, "%s\n", doc.status().message().c_str());
    return 1;
  }
  const json& runs = (*doc)["runs"];

  std::map<std::string, Cluster> cluster_cache;
  std::vector<Priced> priced;
  std::map<std::string, int> skipped;  // reason -> count
  std::vector<std::pair<Mapped, std::string>> invalid;
  int considered = 0;

  std::printf("%4s %-24s %7s %5s %-48s %9s %9s %8s  %s\n", "id", "group", "params", "gpus", "plan",
              "pub s", "pred s", "error", "inferred / notes");
  for (const json& run : runs) {
    const std::string group = get_str(run, "group");
    if (!only.empty() && group.find(only) == std::string::npos) continue;
    ++considered;
    Mapped m = map_run(run);
    if (!m.skip.empty()) {
      ++skipped[m.skip[0]];
      std::printf("%4d %-24.24s %7s %5lld %-48s %9s %9s %8s  skipped: %s\n", m.id, m.group.c_str(),
                  "", (long long)m.gpus, "", "", "", "", join(m.skip, "; ").c_str());
      continue;
    }
    // The cluster: the GPU's file, with the run's GPUs per node, sized to its GPUs.
    auto it = cluster_cache.find(m.cluster_file);
    if (it == cluster_cache.end()) {
      Result<Cluster> c = load_cluster(clusters + "/" + m.cluster_file);
      if (!c.is_ok()) {
        std::fprintf(stderr, "%s\n", c.status().message().c_str());
        return 1;
      }
      it = cluster_cache.emplace(m.cluster_file, *c).first;
    }
    Cluster node = it->second;
    node.nodes = 1;
    node.devices_per_node = static_cast<int>(m.gpus_per_node);
    if (m.inter_node_bytes_per_s) node.inter_node.bandwidth_bytes_per_s = *m.inter_node_bytes_per_s;
    if (m.nvlink_island > 0 && m.nvlink_island < m.gpus_per_node) {
      // Between the islands: each GPU's PCIe link, the file's host link.
      if (node.host.link_bandwidth_bytes_per_s <= 0) {
        std::fprintf(stderr,
                     "%s/%s: run %d's nodes are NVLink islands joined over PCIe; the file has no "
                     "host.link_bandwidth_bytes_per_s\n",
                     clusters.c_str(), m.cluster_file.c_str(), m.id);
        return 1;
      }
      node.devices_per_island = static_cast<int>(m.nvlink_island);
      node.between_islands = {node.host.link_bandwidth_bytes_per_s, node.inter_node.latency_s, 1.0};
    }
    if (m.power_limit_w) {
      if (node.device.rated_power_w <= 0) {
        std::fprintf(stderr,
                     "%s/%s: run %d states a %g W power limit; the file has no rated_power_w\n",
                     clusters.c_str(), m.cluster_file.c_str(), m.id, *m.power_limit_w);
        return 1;
      }
      node.device.power_limit_w = std::min(*m.power_limit_w, node.device.rated_power_w);
    }
    Result<Cluster> cluster = with_devices(node, m.gpus);
    if (!cluster.is_ok()) {
      invalid.emplace_back(m, "cluster: " + cluster.status().message());
      std::printf("%4d %-24.24s %7s %5lld %-48s %9.3f %9s %8s  INVALID: %s\n", m.id,
                  m.group.c_str(), "", (long long)m.gpus, plan_label(m.plan).c_str(), m.published_s,
                  "", "", invalid.back().second.c_str());
      continue;
    }
    TrainingJob job{m.model, m.global_batch, m.seq};
    job.fp8 = m.fp8;
    job.fp8_scaling = m.fp8_scaling;
    CostConstants k = m.k;
    if (m.te_attention) apply_stack_attention(EmitTarget::kMegatron, *cluster, &k);
    CostModel cm(job, *cluster, k);
    if (m.search_layout) {
      Result<Plan> searched = searched_layout(cm, m);
      if (!searched.is_ok()) {
        invalid.emplace_back(m, "layout search: " + searched.status().message());
        std::printf("%4d %-24.24s %6.1fB %5lld %-48s %9.3f %9s %8s  INVALID: %s\n", m.id,
                    m.group.c_str(), cm.num_parameters() / 1e9, (long long)m.gpus, "",
                    m.published_s, "", "", invalid.back().second.c_str());
        continue;
      }
      m.plan = *searched;
      // map_plan's notes on the placeholder's degrees, batch split, recompute
      // and ZeRO no longer apply: the search chose them.
      std::vector<std::string> kept;
      for (const std::string& n : m.inferred)
        if (n != "dp" && n.rfind("mb=", 0) != 0 && n.rfind("rc=", 0) != 0 &&
            n.rfind("zero", 0) != 0 && n.rfind("sp=", 0) != 0)
          kept.push_back(n);
      m.inferred = std::move(kept);
    }
    if (m.fewest_blocks_that_fit && cm.invalid_reason(m.plan).empty() &&
        m.plan.num_micro_batches > 0) {
      // The fewest of each chunk's first blocks that fit (memory falls as
      // more recompute: a bisection); all of them where none fewer fits.
      Plan q = m.plan;
      int64_t lo = 1, hi = cm.dims().layers / std::max<int64_t>(q.pp * q.vp, 1) - 1, n = 0;
      while (lo <= hi) {
        q.recompute_layers = (lo + hi) / 2;
        Result<StepCost> c = cm.price(q);
        if (c.is_ok() && c->fits) {
          n = q.recompute_layers;
          hi = q.recompute_layers - 1;
        } else {
          lo = q.recompute_layers + 1;
        }
      }
      m.plan.recompute_layers = n;
      m.inferred.push_back(n > 0 ? "rc=" + std::to_string(n) + "-blocks(fewest-that-fit)"
                                 : "rc=all-blocks(none-fewer-fit)");
    }
    std::string why = cm.invalid_reason(m.plan);
    if (m.plan.num_micro_batches == 0)
      why = "global batch " + std::to_string(m.global_batch) +
            " is not a multiple of dp x mb = " + std::to_string(m.plan.dp * m.plan.micro_batch);
    Result<StepCost> cost = why.empty() ? cm.price(m.plan) : Result<StepCost>(Status::invalid(why));
    if (!cost.is_ok()) {
      invalid.emplace_back(m, cost.status().message());
      std::printf("%4d %-24.24s %6.1fB %5lld %-48s %9.3f %9s %8s  INVALID: %s\n", m.id,
                  m.group.c_str(), cm.num_parameters() / 1e9, (long long)m.gpus,
                  plan_label(m.plan).c_str(), m.published_s, "", "", invalid.back().second.c_str());
      continue;
    }
    Priced r;
    r.m = m;
    r.cost = *cost;
    r.predicted_s = cost->step_time_s;
    r.err = r.predicted_s / m.published_s - 1;
    r.params_b = cm.num_parameters() / 1e9;
    r.fits = cost->fits;
    if (m.published_mem_gib) {
      const double gib = double(1ull << 30);
      const double reserve = double(cluster->device.memory_bytes) - cost->usable_memory;
      // The peak the stack reports: TorchTitan's is the allocator's reserved
      // peak (CostConstants::allocator_reserved_ratio); the others, the
      // tensors' (ratio 1).
      r.mem_err = cost->reserved_memory / gib / *m.published_mem_gib - 1;
      r.mem_err_device = (cost->memory.total + reserve) / gib / *m.published_mem_gib - 1;
    }
    std::vector<std::string> notes = m.inferred;
    if (m.stack != "default") notes.insert(notes.begin(), m.stack);
    if (!r.fits) notes.insert(notes.begin(), "OOM-predicted");
    std::printf("%4d %-24.24s %6.1fB %5lld %-48s %9.3f %9.3f %+7.1f%%  %s\n", m.id, m.group.c_str(),
                r.params_b, (long long)m.gpus, plan_label(m.plan).c_str(), m.published_s,
                r.predicted_s, 100 * r.err, join(notes, ",").c_str());
    if (verbose) {
      char published_mem[96] = "";
      if (m.published_mem_gib)
        std::snprintf(published_mem, sizeof published_mem, " (published %.1f)",
                      *m.published_mem_gib);
      if (cost->reserved_memory > cost->memory.total)
        std::snprintf(published_mem + std::strlen(published_mem),
                      sizeof published_mem - std::strlen(published_mem), ", reserved %.1f",
                      cost->reserved_memory / double(1ull << 30));
      const StepCost& c = *cost;
      std::printf(
          "      %s on %s (%d/node): compute %.3f recompute %.3f tp %.3f cp %.3f pp %.3f bubble "
          "%.3f "
          "dp %.3f opt %.3f s; mem %.1f/%.1f GiB%s [params %.1f grads %.1f opt %.1f act %.1f "
          "temp %.1f]; published from %s\n",
          m.model_key.c_str(), m.cluster_file.c_str(), (int)m.gpus_per_node, c.compute_s,
          c.recompute_s, c.tp_comm_s, c.cp_comm_s, c.pp_comm_s, c.bubble_s, c.dp_comm_s,
          c.optimizer_s, c.memory.total / double(1ull << 30), c.usable_memory / double(1ull << 30),
          published_mem, c.memory.params / double(1ull << 30), c.memory.grads / double(1ull << 30),
          c.memory.optimizer / double(1ull << 30), c.memory.activations / double(1ull << 30),
          c.memory.temporaries / double(1ull << 30), m.published_how.c_str());
    }
    priced.push_back(std::move(r));
  }

  // ---------------------------------------------------------------- summary
  int total_skipped = 0;
  for (const auto& [reason, n] : skipped) total_skipped += n;
  std::printf("\n== Summary (%d runs considered) ==\n", considered);
  std::printf("priced %zu, skipped %d, invalid %zu\n", priced.size(), total_skipped,
              invalid.size());
  for (const auto& [reason, n] : skipped) std::printf("  skipped %3d: %s\n", n, reason.c_str());
  for (const auto& [m, why] : invalid) std::printf("  invalid run %d: %s\n", m.id, why.c_str());
  if (priced.empty()) return 0;

  std::vector<double> errs;
  std::map<std::string, std::vector<double>> by_group, by_bucket, by_gpu;
  for (const Priced& r : priced) {
    errs.push_back(r.err);
    by_gpu[r.m.cluster_file].push_back(r.err);
    by_group[r.m.group].push_back(r.err);
    by_bucket[bucket_of(r.m.gpus)].push_back(r.err);
  }
  const Stats all = stats_of(errs);
  std::printf("\nerror = predicted / published iteration time - 1\n");
  std::printf("  %-38s %4s  %7s  %8s  %6s\n", "", "n", "MAE", "median", "<=10%");
  print_stats_row("all priced runs", all);
  std::printf("by group:\n");
  for (const auto& [g, e] : by_group) print_stats_row(g, stats_of(e));
  std::printf("by cluster file (GPU):\n");
  for (const auto& [g, e] : by_gpu) print_stats_row(g, stats_of(e));
  std::printf("by GPU count:\n");
  for (const char* b : {"<=64", "65-256", "257-1024", ">1024"})
    if (by_bucket.count(b)) print_stats_row(b, stats_of(by_bucket[b]));

  // Kendall tau inside each (model shape, GPU) group of >= 3 priced runs.
  std::map<std::string, std::vector<const Priced*>> shape_groups;
  for (const Priced& r : priced)
    shape_groups[r.m.model_key + " @ " + r.m.cluster_file].push_back(&r);
  std::printf(
      "\nKendall tau-b of predicted vs published iteration time, per model shape + GPU "
      "(>= 3 runs):\n");
  double tau_sum = 0;
  int tau_n = 0;
  for (const auto& [key, rs] : shape_groups) {
    if (rs.size() < 3) continue;
    std::vector<double> x, y;
    for (const Priced* r : rs) x.push_back(r->predicted_s), y.push_back(r->m.published_s);
    const double tau = kendall_tau_b(x, y);
    std::set<std::string> groups;
    for (const Priced* r : rs) groups.insert(r->m.group);
    if (std::isnan(tau)) {
      std::printf("  %-62s n=%2zu  tau   n/a  (%s)\n", key.c_str(), rs.size(),
                  join(std::vector<std::string>(groups.begin(), groups.end()), ",").c_str());
      continue;
    }
    tau_sum += tau;
    ++tau_n;
    std::printf("  %-62s n=%2zu  tau %+5.2f  (%s)\n", key.c_str(), rs.size(), tau,
                join(std::vector<std::string>(groups.begin(), groups.end()), ",").c_str());
  }
  if (tau_n) std::printf("  mean tau over %d groups: %+.3f\n", tau_n, tau_sum / tau_n);

  std::vector<const Priced*> worst;
  for (const Priced& r : priced) worst.push_back(&r);
  std::sort(worst.begin(), worst.end(),
            [](const Priced* a, const Priced* b) { return std::abs(a->err) > std::abs(b->err); });
  std::printf("\n10 worst runs:\n");
  for (size_t i = 0; i < worst.size() && i < 10; ++i) {
    const Priced& r = *worst[i];
    const StepCost& c = r.cost;
    std::printf(
        "  %4d %-24.24s %-30.30s s=%-6lld %-18s %5lld gpus %-48s pub %8.3f pred %8.3f %+7.1f%%  "
        "[compute %.2f rc "
        "%.2f tp %.2f cp %.2f pp %.2f bubble %.2f dp %.2f opt %.2f%s] %s\n",
        r.m.id, r.m.group.c_str(), r.m.name.c_str(), (long long)r.m.seq, r.m.cluster_file.c_str(),
        (long long)r.m.gpus, plan_label(r.m.plan).c_str(), r.m.published_s, r.predicted_s,
        100 * r.err, c.compute_s, c.recompute_s, c.tp_comm_s, c.cp_comm_s, c.pp_comm_s, c.bubble_s,
        c.dp_comm_s, c.optimizer_s, r.fits ? "" : " OOM", join(r.m.inferred, ",").c_str());
  }
  // Repeated measurements: runs whose priced inputs are identical (model
  // shape, cluster file and fabric, plan, stack, batch) get one prediction
  // from any model, so their published spread bounds what any model reaches.
  std::map<std::string, std::vector<double>> repeats;
  std::vector<std::string> set_of;  // per priced run, its set's key
  for (const Priced& r : priced) {
    char net[32] = "", power[16] = "";
    if (r.m.inter_node_bytes_per_s)
      std::snprintf(net, sizeof net, "%.4g", *r.m.inter_node_bytes_per_s);
    if (r.m.power_limit_w) std::snprintf(power, sizeof power, "%.0fW", *r.m.power_limit_w);
    set_of.push_back(r.m.model_key + "|" + r.m.cluster_file + "|" + net + "|" + power + "|" +
                     std::to_string(r.m.gpus_per_node) + "|" + plan_label(r.m.plan) + "|" +
                     r.m.stack + "|" + std::to_string(r.m.global_batch) + "|" +
                     std::to_string(r.m.seq));
    repeats[set_of.back()].push_back(r.m.published_s);
  }
  const RepeatFloor floor = repeat_floor(repeats);
  // The rank agreement a model could reach: one prediction per set, each the
  // median of its set's published figures (an ordering any model may give;
  // the ceiling is at least this), in the same shape groups as above.
  double reach_sum = 0;
  int reach_n = 0;
  for (const auto& [key, rs] : shape_groups) {
    if (rs.size() < 3) continue;
    std::vector<double> x, y;
    for (const Priced* r : rs) {
      std::vector<double> pub = repeats[set_of[size_t(r - priced.data())]];
      std::nth_element(pub.begin(), pub.begin() + pub.size() / 2, pub.end());
      x.push_back(pub[pub.size() / 2]), y.push_back(r->m.published_s);
    }
    const double tau = kendall_tau_b(x, y);
    if (!std::isnan(tau)) reach_sum += tau, ++reach_n;
  }
  std::printf(
      "\nrepeated configurations: %d runs in %d sets of identical inputs; published spread "
      "(max / min - 1) median %.1f%%, largest %.1f%%\n"
      "  best any model can reach on this set (one prediction per set): MAE >= %.1f%%, "
      "within +-10%% <= %d/%zu; a mean tau of %+.3f is reachable (each set at its "
      "published median)\n",
      floor.runs, floor.sets, 100 * floor.median_spread, 100 * floor.max_spread,
      100 * floor.least_abs_err_sum / priced.size(), int(priced.size()) - floor.least_outside,
      priced.size(), reach_n ? reach_sum / reach_n : 0.0);
  // Peak memory where the source reports it: the planner's memory.total per
  // GPU against the logged peak (an allocator's or the device's view; the
  // sources do not say which, so the comparison is a check, not a fit).
  std::vector<double> mem_errs, mem_device;
  std::map<std::string, std::vector<double>> mem_by_group, device_by_group;
  for (const Priced& r : priced) {
    if (!r.mem_err) continue;
    mem_errs.push_back(*r.mem_err), mem_by_group[r.m.group].push_back(*r.mem_err);
    mem_device.push_back(*r.mem_err_device);
    device_by_group[r.m.group].push_back(*r.mem_err_device);
  }
  if (!mem_errs.empty()) {
    std::printf("\npeak memory per GPU, predicted / published - 1 (runs that report it):\n");
    std::printf("  %-38s %4s  %7s  %8s  %6s\n", "", "n", "MAE", "median", "<=10%");
    print_stats_row("all with a published peak", stats_of(mem_errs));
    for (const auto& [g, e] : mem_by_group) print_stats_row(g, stats_of(e));
    std::printf("with the plan's unused reserve (allocator, NCCL, context) added:\n");
    print_stats_row("all with a published peak", stats_of(mem_device));
    for (const auto& [g, e] : device_by_group) print_stats_row(g, stats_of(e));
  }
  std::printf("\nwithin +-10%%: %d/%d (%.0f%%); MAE %.1f%%; signed median %+.1f%%\n", all.within10,
              all.n, 100.0 * all.within10 / all.n, 100 * all.mae, 100 * all.med);
  if (!mem_errs.empty()) {
    const Stats ms = stats_of(mem_errs);
    std::printf("peak memory: %d/%d within +-10%% (%.0f%%); MAE %.1f%%; signed median %+.1f%%\n",
                ms.within10, ms.n, 100.0 * ms.within10 / ms.n, 100 * ms.mae, 100 * ms.med);
  }
  if (!write_bands.empty()) {
    // Each cluster file's spread of published / predicted, by GPU-count range
    // (plan/prediction_band.h), for `meshflow plan` to print with a prediction.
    std::map<std::string, std::vector<std::pair<int64_t, double>>> samples;
    for (const Priced& r : priced) {
      std::string name = r.m.cluster_file;
      if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0)
        name.resize(name.size() - 5);
      samples[name].push_back({r.m.gpus, r.m.published_s / r.predicted_s});
    }
    PredictionBands bands;
    bands.source = "bench/public_runs --write-bands: " + std::to_string(priced.size()) +
                   " priced runs of " + file;
    for (const auto& [name, s] : samples) {
      std::vector<BandEntry> b = make_bands(s);
      if (!b.empty()) bands.by_cluster[name] = b;
    }
    Status s = write_file_atomic(write_bands, prediction_bands_to_json(bands).dump(2) + "\n",
                                 "--write-bands");
    if (!s.is_ok()) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      return 1;
    }
    std::printf("wrote %s\n", write_bands.c_str());
  }
  return 0;
}
