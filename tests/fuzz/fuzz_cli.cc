// A small fuzzer of the command line: random run configs (every section,
// the "parallel" section built from random pieces, model sizes included),
// random `plan` arguments and random or truncated checkpoint files. Every case
// runs the real binary under a time limit and must end in one of two ways:
// exit 0, or exit 2 (a user's mistake) or 1 (a failure while running) with
// exactly one line "meshflow: error: ..." (with --quiet). A signal, an abort, a time-out, a failed
// CHECK or a multi-line error fails the test and prints the case to reproduce it.
//
//   MESHFLOW_FUZZ_CASES=3000 MESHFLOW_FUZZ_SEED=7 build/tests/meshflow_fuzz
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cli_run.h"
#include "meshflow/config/json_reader.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::run_cli;
using testing::source_dir;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  bool coin(double p = 0.5) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <class T>
  const T& one(const std::vector<T>& v) {
    return v[pick(static_cast<int>(v.size()))];
  }
  // A hostile value of any JSON type.
  json junk() {
    switch (pick(12)) {
      case 0:
        return nullptr;
      case 1:
        return -1;
      case 2:
        return 0;
      case 3:
        return int64_t{1} << 40;
      case 4:
        return 9223372036854775807LL;
      case 5:
        return 1e300;
      case 6:
        return -0.5;
      case 7:
        return "x";
      case 8:
        return json::array({1, "a"});
      case 9:
        return json::object({{"k", 1}});
      case 10:
        return true;
      default:
        return 3;
    }
  }
  // A small int, sometimes out of range.
  json count() { return coin(0.8) ? json(1 + pick(8)) : junk(); }

  std::string mesh() {
    static const std::vector<std::string> axes = {"dp", "tp", "cp", "pp", "sp", "ep", "", "dp"};
    std::string s;
    const int n = pick(4);
    for (int i = 0; i < n; ++i)
      s += (i ? "," : "") + one(axes) + "=" + std::to_string(coin(0.9) ? 1 + pick(4) : pick(3) - 1);
    if (coin(0.05)) s += ",,";
    return s;
  }
  std::string split_tuple() {
    static const std::vector<std::string> e = {"1", "dp", "tp", "cp", "dp*tp", "2", "4", "3", "x"};
    std::string s = "(";
    const int inputs = 1 + pick(3);
    for (int i = 0; i < inputs; ++i) {
      s += (i ? ", (" : "(");
      const int dims = 1 + pick(4);
      for (int d = 0; d < dims; ++d) s += (d ? ", " : "") + one(e);
      s += ")";
    }
    return coin(0.05) ? s : s + ")";
  }
  // Cell names to stages, valid and not: names of the three models' cells,
  // prefixes, globs, parts inside cells, unknown names; stages in and out of range.
  json stage_of() {
    static const std::vector<std::string> cells = {"embedder",
                                                   "encoder.stages.0",
                                                   "encoder.stages.1",
                                                   "encoder.*",
                                                   "pooler",
                                                   "classifier",
                                                   "h.0",
                                                   "h.*",
                                                   "wte",
                                                   "wpe",
                                                   "ln_f",
                                                   "lm_head",
                                                   "model.layers.*",
                                                   "model.*",
                                                   "*",
                                                   "layer4",
                                                   "encoder.stages.0.layers.0.layer.1",
                                                   "",
                                                   "?"};
    json s = json::object();
    for (int i = 0; i < 1 + pick(6); ++i)
      s[one(cells)] = coin(0.9) ? json(pick(3) - (coin(0.05) ? 2 : 0)) : junk();
    return s;
  }
  json parallel() {
    json p = json::object();
    if (coin(0.8))
      p["mode"] = coin(0.9) ? json(one<std::string>({"data", "semi", "auto", "hybrid"})) : junk();
    if (coin(0.8)) p["mesh"] = coin(0.9) ? json(mesh()) : junk();
    if (coin(0.4))
      p["preset"] = coin(0.9) ? json(one<std::string>({"dp", "megatron", "megatron-sp", "ulysses",
                                                       "ring", "ring-sp", "megatorn"}))
                              : junk();
    if (coin(0.3)) {
      json r = json::object();
      static const std::vector<std::string> dims = {"batch", "seq",    "heads", "ffn",
                                                    "vocab", "hidden", "fnn",   "kv_heads"};
      for (int i = 0; i < 1 + pick(3); ++i)
        r[one(dims)] = coin(0.9) ? json(one<std::string>({"dp", "tp", "cp", "dp*tp", "cp*tp|cp",
                                                          "tp|", "|", "cp*zz|tp", "zz"}))
                                 : junk();
      p["rules"] = r;
    }
    if (coin(0.3)) {
      json st = json::object();
      static const std::vector<std::string> names = {
          "h.*.mlp.c_fc", "h.*.mlp.c_proj",
          "h.0.attn.*",   "*attn.core",
          "fc*",          "nope",
          "h.*.mlp.cfc",  "embedder.embedder.convolution",
          "classifier.1", "encoder.stages.*.convolution"};
      for (int i = 0; i < 1 + pick(2); ++i)
        st[one(names)] = coin(0.9) ? json(split_tuple()) : junk();
      p["strategies"] = st;
    }
    if (coin(0.3)) p["zero"] = coin(0.8) ? json(pick(4)) : junk();
    if (coin(0.15))
      p["zero_style"] = coin(0.8) ? json(one<std::string>({"shard", "group", "grup"})) : junk();
    if (coin(0.2)) p["search"] = coin(0.8) ? json(one<std::string>({"propagate", "full"})) : junk();
    if (coin(0.3)) {
      json pl = json::object();
      if (coin(0.9)) pl["stages"] = count();
      if (coin(0.7)) pl["micro_batches"] = count();
      if (coin(0.5))
        pl["schedule"] = one<std::string>({"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"});
      if (coin(0.3)) pl["virtual_stages"] = count();
      if (coin(0.2)) pl["layers_per_stage"] = json::array({pick(3), pick(3)});
      if (coin(0.3)) pl["stage_of"] = coin(0.9) ? stage_of() : junk();
      p["pipeline"] = coin(0.95) ? pl : junk();
    }
    if (coin(0.2))
      p["recompute"] = coin(0.8) ? json(one<std::string>({"none", "full", "selective"})) : junk();
    if (coin(0.1)) p["recompute_layers"] = coin(0.7) ? json::array({pick(3), pick(3)}) : junk();
    if (coin(0.05)) p["bogus"] = 1;
    return coin(0.97) ? p : junk();
  }

  // A small run config, then a few random mutations.
  json config() {
    const bool mlp = coin(0.25), resnet = !mlp && coin(0.3);
    json j;
    if (resnet) {
      j["model"] = {{"model_type", "resnet"}, {"num_channels", 1},
                    {"embedding_size", 8},    {"hidden_sizes", {8, 16}},
                    {"depths", {1, 1}},       {"layer_type", coin() ? "basic" : "bottleneck"},
                    {"num_labels", 10},       {"image_size", 28}};
      j["data"] = {{"dataset", "fashion_mnist"}};
      j["train"] = {{"steps", 1}, {"batch_size", 8}, {"threads", 1}, {"eval_batches", 1}};
      if (coin(0.3))
        j["train"]["recompute_layers"] =
            json::array({one<std::string>({"encoder.stages.*", "embedder", "nope", "encoder"})});
      if (coin(0.3)) j["train"]["recompute"] = "full";
    } else if (mlp) {
      j["model"] = {{"type", "mlp"}, {"input_dim", 784}, {"hidden", {16}}, {"num_classes", 10}};
      j["data"] = {{"dataset", "fashion_mnist"}};
      j["train"] = {{"steps", 1}, {"batch_size", 8}, {"threads", 1}, {"eval_batches", 1}};
    } else {
      j["model"] = {{"model_type", coin() ? "gpt2" : "llama"}};
      json& m = j["model"];
      if (m["model_type"] == "gpt2")
        m.update({{"n_layer", 2},
                  {"n_embd", 32},
                  {"n_head", 4},
                  {"n_positions", 32},
                  {"vocab_size", 256}});
      else
        m.update({{"num_hidden_layers", 2},
                  {"hidden_size", 32},
                  {"num_attention_heads", 4},
                  {"num_key_value_heads", 2},
                  {"intermediate_size", 64},
                  {"max_position_embeddings", 32},
                  {"vocab_size", 256}});
      j["data"] = {{"dataset", "fortunes"}};
      j["train"] = {
          {"steps", 1}, {"batch_size", 8}, {"seq_len", 16}, {"threads", 1}, {"eval_batches", 1}};
    }
    j["optimizer"] = {{"type", "adamw"}, {"lr", 1e-3}};
    if (coin(0.7)) j["parallel"] = parallel();
    if (coin(0.15)) {  // offload: to the system's temporary directory, or somewhere missing
      json o = json::object();
      if (coin(0.8)) o["optimizer"] = one<std::string>({"none", "disk", "cpu", "nvme"});
      if (coin(0.4)) o["params"] = one<std::string>({"none", "disk"});
      if (coin(0.8))
        o["dir"] = coin(0.8) ? json(std::filesystem::temp_directory_path().string())
                   : coin()  ? json("/nonexistent/offload")
                             : junk();
      if (coin(0.2)) o["prefetch"] = coin(0.7) ? json(pick(16)) : junk();
      j["offload"] = coin(0.95) ? o : junk();
    }
    const int mutations = pick(4);
    for (int i = 0; i < mutations; ++i) {
      static const std::vector<std::pair<std::string, std::string>> keys = {
          {"train", "batch_size"},
          {"train", "micro_batches"},
          {"train", "seq_len"},
          {"train", "steps"},
          {"train", "recompute"},
          {"train", "log_every"},
          {"train", "save_every"},
          {"train", "bucket_mib"},
          {"optimizer", "lr"},
          {"optimizer", "eps"},
          {"optimizer", "betas"},
          {"optimizer", "type"},
          {"optimizer", "grad_clip"},
          {"optimizer", "weight_decay"},
          {"data", "dataset"},
          {"data", "eval_fraction"},
          {"model", "n_layer"},
          {"model", "n_embd"},
          {"model", "n_head"},
          {"model", "n_positions"},
          {"model", "vocab_size"},
          {"model", "num_hidden_layers"},
          {"model", "intermediate_size"},
          {"model", "num_key_value_heads"},
          {"model", "hidden"},
          {"model", "num_classes"},
          {"model", "model_type"},
          {"model", "input_dim"},
          {"model", "hidden_sizes"},
          {"model", "depths"},
          {"model", "layer_type"},
          {"model", "embedding_size"},
          {"model", "image_size"},
          {"model", "num_channels"},
          {"train", "recompute_layers"}};
      const auto& [sec, key] = one(keys);
      if (!j.contains(sec) || !j[sec].is_object()) continue;
      if (coin(0.1))
        j[sec].erase(key);
      else
        j[sec][key] = junk();
    }
    if (coin(0.03)) j.erase(one<std::string>({"model", "data", "train"}));
    return j;
  }

  std::string plan_args() {
    static const std::vector<std::string> models = {"gpt_bytes_small.json", "gpt3_175b.json",
                                                    "llama3_8b.json", "mlp_fashion.json",
                                                    "resnet_fashion.json"};
    static const std::vector<std::string> fixes = {"tp=8",
                                                   "tp=8,tp=4",
                                                   ",,,",
                                                   "pp=4,schedule=interleaved,vp=2",
                                                   "cp=2,sp=true",
                                                   "zero=3",
                                                   "tp=0",
                                                   "tp=x",
                                                   "=",
                                                   "recompute=full,micro_batch=1",
                                                   "recompute=full,recompute_layers=1",
                                                   "recompute_layers=-2",
                                                   "schedule=zb-v",
                                                   "dp=3",
                                                   "tp=99999999999999999999"};
    std::string a =
        source_dir() + "/configs/models/" + one(models) + " --cluster " + source_dir() +
        "/configs/clusters/" +
        one<std::string>({"dgx_a100_80gb.json", "h100_sxm.json", "local_cpu.json"}) + " --gpus " +
        one<std::string>({"1", "8", "64", "1024", "0", "-4", "7", "99999999999999999999"});
    if (coin(0.5))
      a += " --global-batch " +
           one<std::string>({"1", "16", "512", "0", "-1", "3", "9223372036854775807"});
    if (coin(0.4)) a += " --seq " + one<std::string>({"128", "2048", "0", "-5", "100000"});
    if (coin(0.4)) a += " --fix '" + one(fixes) + "'";
    if (coin(0.3)) a += " --top " + one<std::string>({"0", "1", "5", "-1", "1000"});
    if (coin(0.3))
      a += " --emit " + one<std::string>({"megatron", "deepspeed", "torchtitan", "slurm", ""});
    if (coin(0.2))
      a += " --attention " +
           one<std::string>({"fused", "flash1", "flash2", "materialized", "cudnn", "", "FLASH1"});
    if (coin(0.2)) a += " --fp8";
    if (coin(0.1))
      a += " --fp8-scaling " + one<std::string>({"rowwise", "tensorwise", "", "ROWWISE", "x"});
    if (coin(0.2))
      a += " --power-limit " + one<std::string>({"500", "700", "0", "-1", "1e9", "nan", "x"});
    if (coin(0.15)) a += " --eager";
    if (coin(0.15)) a += " --launch-blocking";
    return a;
  }

 private:
  std::mt19937_64 rng_;
};

// exit 0, or exit 2 with one line "meshflow: error: ..."; returns why not ("" = fine).
std::string judge(const CliRun& r) {
  if (r.code == 0) {
    for (const char* bad : {"terminate called", "check failed", "Segmentation", "Aborted"})
      if (r.output.find(bad) != std::string::npos)
        return std::string("exit 0 but output has ") + bad;
    return "";
  }
  if (r.code == 124 || r.code == 137 || r.code == 128 + 9) return "time-out (hang)";
  if (r.code >= 128) return "killed by signal " + std::to_string(r.code - 128);
  // 2: a user's mistake; 1: a failure while running (e.g. a finite but huge
  // weight in a corrupted checkpoint makes the first loss NaN), reported the same way.
  if (r.code != 2 && r.code != 1) return "exit code " + std::to_string(r.code);
  if (r.output.find("check failed") != std::string::npos) return "a failed CHECK";
  if (r.output.rfind("meshflow: error: ", 0) != 0)
    return "error does not start 'meshflow: error: '";
  if (r.output.find('\n') != r.output.size() - 1) return "error is not one line";
  return "";
}

class Fuzz : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("meshflow_fuzz_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Runs `args` under a 60 s limit; records a failure with the reproducer.
  CliRun check(const std::string& args, const std::string& what) {
    CliRun r = run_cli_limited(args);
    const std::string why = judge(r);
    EXPECT_EQ(why, "") << what << "\n  meshflow " << args
                       << "\n  output: " << r.output.substr(0, 2000);
    return r;
  }
  static CliRun run_cli_limited(const std::string& args) {
    return run_cli(args, env_int("MESHFLOW_FUZZ_TIMEOUT_S", 60));
  }
  fs::path dir_;
};

TEST_F(Fuzz, ConfigsNeverCrash) {
  const int cases = env_int("MESHFLOW_FUZZ_CASES", 120);
  Gen gen(env_int("MESHFLOW_FUZZ_SEED", 1));
  for (int i = 0; i < cases; ++i) {
    const json cfg = gen.config();
    const std::string path = (dir_ / "cfg.json").string();
    std::ofstream(path) << cfg.dump();
    const std::string ranks = std::to_string(gen.one<int>({1, 1, 2, 3, 4}));
    const int cmd = gen.pick(3);
    std::string args = cmd == 0   ? "train " + path + " --quiet --ranks " + ranks
                       : cmd == 1 ? "explain " + path + " --no-nodes --ranks " + ranks
                                  : "graph " + path + " --phase forward";
    // The train-time plan check and its refit of the local cluster file:
    // priced, or refused in one line for a layout it cannot read back.
    if (cmd == 0 && gen.coin(0.3)) args += " --check-plan";
    if (cmd == 0 && gen.coin(0.15))
      args += " --calibrate-from-run " +
              gen.one<std::string>(
                  {(dir_ / "refit.json").string(), "/nonexistent/dir/refit.json", dir_.string()});
    check(args, "case " + std::to_string(i) + " config " + cfg.dump());
    if (HasFailure()) return;  // one reproducer is enough
  }
}

TEST_F(Fuzz, PlanArgumentsNeverCrash) {
  const int cases = env_int("MESHFLOW_FUZZ_CASES", 120);
  Gen gen(env_int("MESHFLOW_FUZZ_SEED", 1) + 1000);
  for (int i = 0; i < cases; ++i) {
    const std::string out = (dir_ / "plan.json").string();
    const std::string args = "plan " + gen.plan_args() + (gen.coin(0.3) ? " --out " + out : "");
    check(args, "case " + std::to_string(i));
    if (HasFailure()) return;
  }
}

// Plan files (`meshflow plan --out`, then `meshflow simulate`) edited the
// way a user might: a pipeline's stage_of or layers_per_stage, its stages
// and schedule, the mesh, the job's sizes, the planner's section, removed
// keys. Every one is priced or refused in one line.
TEST_F(Fuzz, PlanFilesNeverCrash) {
  const int cases = env_int("MESHFLOW_FUZZ_CASES", 120) / 2;
  Gen gen(env_int("MESHFLOW_FUZZ_SEED", 1) + 1500);
  std::vector<json> bases;
  for (const std::string args :
       {"gpt_bytes_small.json --gpus 2 --fix pp=2", "resnet_fashion.json --gpus 4 --fix pp=2,tp=2",
        "mlp_fashion.json --gpus 2"}) {
    const std::string out = (dir_ / "base.json").string();
    const CliRun r =
        run_cli("plan " + source_dir() + "/configs/models/" + args + " --cluster " + source_dir() +
                "/configs/clusters/local_cpu.json --top 0 --out " + out);
    ASSERT_EQ(r.code, 0) << args << "\n" << r.output;
    bases.push_back(read_json_file(out).value());
  }
  int priced = 0, refused = 0;
  for (int i = 0; i < cases; ++i) {
    json f = gen.one(bases);
    json& par = f["parallel"];
    const int edits = gen.coin(0.15) ? 0 : gen.coin(0.6) ? 1 : 2 + gen.pick(2);
    for (int k = 0; k < edits; ++k) {
      switch (gen.pick(10)) {
        case 0:
          par["pipeline"]["stage_of"] = gen.coin(0.9) ? gen.stage_of() : gen.junk();
          break;
        case 1:
          par["pipeline"]["layers_per_stage"] =
              gen.coin(0.7) ? json::array({gen.pick(4), gen.pick(4)}) : gen.junk();
          break;
        case 2:
          par["pipeline"][gen.one<std::string>({"stages", "micro_batches", "virtual_stages"})] =
              gen.count();
          break;
        case 3:
          par["pipeline"]["schedule"] =
              gen.coin(0.8) ? json(gen.one<std::string>(
                                  {"1f1b", "gpipe", "zb-h1", "zb-v", "interleaved", "x"}))
                            : gen.junk();
          break;
        case 4:
          par["mesh"] = gen.coin(0.9) ? json(gen.mesh()) : gen.junk();
          break;
        case 5:
          f["train"][gen.one<std::string>({"batch_size", "seq_len", "micro_batches"})] =
              gen.count();
          break;
        case 6:
          f["plan"]
           [gen.one<std::string>({"attention", "cluster", "gpus", "stack", "fp8", "fp8_scaling"})] =
               gen.junk();
          break;
        case 7:
          f.erase(gen.one<std::string>({"plan", "model", "parallel", "train"}));
          break;
        case 8:
          par[gen.one<std::string>(
              {"zero", "recompute", "preset", "zero_style", "recompute_layers"})] = gen.junk();
          break;
        default:  // the planner's split dropped (the runtime's then), or a two-stage split
          // (An earlier edit may have made the section or its stages junk.)
          if (par.contains("pipeline") && par["pipeline"].is_object()) {
            par["pipeline"].erase("layers_per_stage");
            const auto stages = par["pipeline"].find("stages");
            if (gen.coin(0.5) && stages != par["pipeline"].end() && stages->is_number_integer() &&
                *stages == 2)
              par["pipeline"]["layers_per_stage"] = json::array({1, gen.coin() ? 1 : 2});
          }
      }
      if (!f.contains("parallel")) break;  // (par refers into f)
    }
    const std::string path = (dir_ / "plan.json").string();
    std::ofstream(path) << f.dump();
    const std::string trace = gen.coin(0.3) ? " --trace " + (dir_ / "t.json").string() : "";
    const std::string args = "simulate " + path + trace;
    ++(check(args, "case " + std::to_string(i) + " plan " + f.dump()).code == 0 ? priced : refused);
    if (HasFailure()) return;
  }
  std::printf("%d plan files priced, %d refused\n", priced, refused);
  EXPECT_GT(priced, 0);  // the edits leave some files valid
}

// Cluster files (configs/clusters/) edited the way a user might: a device
// or link figure, the efficiency curve, the thin-GEMM grid's axes and rows,
// removed keys. `meshflow plan` prices with each one or refuses it in one line.
TEST_F(Fuzz, ClusterFilesNeverCrash) {
  const int cases = env_int("MESHFLOW_FUZZ_CASES", 120) / 2;
  Gen gen(env_int("MESHFLOW_FUZZ_SEED", 1) + 2500);
  std::vector<json> bases;
  for (const char* file : {"local_cpu.json", "dgx_a100_80gb.json", "h100_sxm.json",
                           "a100_pcie_80gb.json", "gb200_nvl72.json"})
    bases.push_back(read_json_file(source_dir() + "/configs/clusters/" + file).value());
  int priced = 0, refused = 0;
  for (int i = 0; i < cases; ++i) {
    json c = gen.one(bases);
    const int edits = gen.coin(0.15) ? 0 : gen.coin(0.6) ? 1 : 2 + gen.pick(2);
    // A key can be indexed where its value is an object or absent (null); an
    // earlier edit may have made it junk.
    auto editable = [](const json& j) { return j.is_object() || j.is_null(); };
    for (int k = 0; k < edits; ++k) {
      if (!editable(c["device"])) break;
      json& dev = c["device"];
      switch (gen.pick(9)) {
        case 0:
          dev[gen.one<std::string>({"memory_bytes", "memory_bandwidth_bytes_per_s",
                                    "memory_efficiency", "fp8_matmul_efficiency", "rated_power_w",
                                    "power_limit_w"})] =
              gen.coin(0.5) ? json(gen.one<double>({0, -1, 1e-9, 1e30, 0.5, 500})) : gen.junk();
          break;
        case 1:
          if (!editable(dev["peak_flops"])) break;
          dev["peak_flops"][gen.one<std::string>({"f32", "bf16", "tf32", "fp8"})] =
              gen.coin(0.5) ? json(gen.one<double>({0, -3, 1e3, 1e20})) : gen.junk();
          break;
        case 2:
          dev["matmul_efficiency"] =
              gen.coin(0.5) ? json::array({json::array({1, gen.junk()})}) : gen.junk();
          break;
        case 3: {  // the thin-GEMM grid: an axis, a row or a value
          json& g = dev[gen.one<std::string>(
              {"matmul_thin_efficiency", "matmul_thin_efficiency_one_thread"})];
          const std::string part = gen.one<std::string>({"big", "dim", "factor"});
          if (gen.coin(0.3) || !editable(g))
            g = gen.junk();
          else if (gen.coin(0.5) && g.is_object() && g.contains(part) && g[part].is_array() &&
                   !g[part].empty())
            g[part][gen.pick(static_cast<int>(g[part].size()))] = gen.junk();
          else
            g[part] = gen.coin(0.5) ? json::array({16, 4}) : gen.junk();
          break;
        }
        case 4: {
          json& link = c[gen.one<std::string>({"intra_node", "inter_node"})];
          if (!editable(link)) break;
          link[gen.one<std::string>({"bandwidth_bytes_per_s", "latency_s", "efficiency"})] =
              gen.coin(0.5) ? json(gen.one<double>({0, -1, 2, 1e40})) : gen.junk();
          break;
        }
        case 5:
          c[gen.one<std::string>({"nodes", "devices_per_node"})] = gen.count();
          break;
        case 6: {  // NVLink islands: their size, their link, or junk
          json& isl = c["islands"];
          if (gen.coin(0.3) || !editable(isl)) {
            isl = gen.coin(0.5)
                      ? json{{"devices", gen.count()}, {"link", {{"bandwidth_bytes_per_s", 25e9}}}}
                      : gen.junk();
          } else if (gen.coin(0.5)) {
            isl["devices"] = gen.coin(0.5) ? json(gen.one<int>({0, 1, 2, 4, 9})) : gen.junk();
          } else {
            isl["link"] = gen.coin(0.5)
                              ? json{{"bandwidth_bytes_per_s", gen.one<double>({0, -1, 1e9, 1e40})}}
                              : gen.junk();
          }
          break;
        }
        case 7: {  // an NVLink domain over nodes: its size, or junk
          json& dom = c["nvlink_domain"];
          dom = gen.coin(0.6)
                    ? json{{"devices", gen.coin(0.5) ? json(gen.one<int>({0, 4, 6, 8, 72}))
                                                     : json(gen.count())}}
                    : gen.junk();
          break;
        }
        default:
          if (gen.coin(0.5) && dev.is_object())
            dev.erase(gen.one<std::string>(
                {"peak_flops", "memory_bytes", "matmul_efficiency", "matmul_thin_efficiency"}));
          else
            c.erase(gen.one<std::string>({"device", "intra_node", "inter_node", "name"}));
      }
      if (!c.contains("device")) break;  // (dev refers into c)
    }
    const std::string path = (dir_ / "cluster.json").string();
    std::ofstream(path) << c.dump();
    const std::string args = "plan " + source_dir() + "/configs/models/" +
                             gen.one<std::string>({"gpt_bytes_small.json", "llama3_8b.json"}) +
                             " --cluster " + path + " --gpus " +
                             gen.one<std::string>({"1", "2", "8"}) + " --top 0";
    ++(check(args, "case " + std::to_string(i) + " cluster " + c.dump()).code == 0 ? priced
                                                                                   : refused);
    if (HasFailure()) return;
  }
  std::printf("%d cluster files priced, %d refused\n", priced, refused);
  EXPECT_GT(priced, 0);  // the edits leave some files valid
}

TEST_F(Fuzz, CheckpointFilesNeverCrash) {
  const int cases = env_int("MESHFLOW_FUZZ_CASES", 120) / 2;
  Gen gen(env_int("MESHFLOW_FUZZ_SEED", 1) + 2000);
  // A valid checkpoint of the run config, then corrupted copies of it.
  json cfg = gen.config();
  cfg["model"] = {{"model_type", "gpt2"}, {"n_layer", 1},      {"n_embd", 16},
                  {"n_head", 2},          {"n_positions", 16}, {"vocab_size", 256}};
  cfg["data"] = {{"dataset", "fortunes"}};
  cfg["train"] = {
      {"steps", 1}, {"batch_size", 4}, {"seq_len", 8}, {"threads", 1}, {"eval_batches", 1}};
  cfg["optimizer"] = {{"type", "adamw"}, {"lr", 1e-3}};
  // Only those four: a generated section may be one the config refuses (an
  // offload.dir with nothing offloaded, seed 20261207), and this test needs
  // a run that trains.
  for (auto it = cfg.begin(); it != cfg.end();) {
    const std::string& key = it.key();
    if (key == "model" || key == "data" || key == "train" || key == "optimizer")
      ++it;
    else
      it = cfg.erase(it);
  }
  const std::string path = (dir_ / "ck.json").string(), good = (dir_ / "good.safetensors").string();
  std::ofstream(path) << cfg.dump();
  CliRun w = run_cli("train " + path + " --quiet --checkpoint " + good);
  ASSERT_EQ(w.code, 0) << w.output;
  std::string bytes;
  {
    std::ifstream f(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  ASSERT_GT(bytes.size(), 16u);
  for (int i = 0; i < cases; ++i) {
    std::string b = bytes;
    switch (gen.pick(5)) {
      case 0:
        b.resize(gen.pick(static_cast<int>(b.size())));
        break;  // truncated
      case 1:   // header length
        for (int k = 0; k < 8; ++k) b[k] = static_cast<char>(gen.pick(256));
        break;
      case 2:  // bytes inside the JSON header
        for (int k = 0; k < 4; ++k) b[8 + gen.pick(std::min<int>(200, b.size() - 8))] ^= 0x5a;
        break;
      case 3:
        b = std::string(static_cast<size_t>(gen.pick(64)), '\0');
        break;
      default:  // random bytes anywhere
        for (int k = 0; k < 16; ++k) b[gen.pick(static_cast<int>(b.size()))] = gen.pick(256);
    }
    const std::string bad = (dir_ / "bad.safetensors").string();
    std::ofstream(bad, std::ios::binary | std::ios::trunc) << b;
    check("train " + path + " --quiet --init " + bad, "case " + std::to_string(i));
    if (HasFailure()) return;
  }
}

// Full-state checkpoints (io/checkpoint.h) damaged every way: the manifest's
// fields deleted, retyped or set to hostile numbers, its text cut, shard and
// fragment files truncated, flipped or removed. Resuming, inspecting and
// exporting end with exit 0, 1 or 2 and one error line, never a crash.
TEST_F(Fuzz, CheckpointDirectoriesNeverCrash) {
  const int cases = env_int("MESHFLOW_FUZZ_CASES", 120) / 2;
  Gen gen(env_int("MESHFLOW_FUZZ_SEED", 1) + 3000);
  json cfg;
  cfg["model"] = {{"model_type", "gpt2"}, {"n_layer", 1},      {"n_embd", 16},
                  {"n_head", 2},          {"n_positions", 16}, {"vocab_size", 256}};
  cfg["data"] = {{"dataset", "fortunes"}};
  cfg["train"] = {
      {"steps", 2}, {"batch_size", 4}, {"seq_len", 8}, {"threads", 1}, {"eval_batches", 1}};
  cfg["optimizer"] = {{"type", "adamw"}, {"lr", 1e-3}};
  const std::string path = (dir_ / "ck.json").string(), good = (dir_ / "good").string();
  std::ofstream(path) << cfg.dump();
  CliRun w = run_cli("train " + path + " --quiet --steps 1 --ranks 2 --checkpoint " + good);
  ASSERT_EQ(w.code, 0) << w.output;
  const fs::path step = fs::path(good) / "step-00000001";
  const json manifest = json::parse(std::ifstream(step / "manifest.json"));
  const std::vector<json> hostile = {nullptr,
                                     -1,
                                     0,
                                     "x",
                                     1e300,
                                     json::array(),
                                     json::object(),
                                     std::numeric_limits<int64_t>::max(),
                                     true,
                                     3.5};
  int codes[3] = {0, 0, 0};
  for (int i = 0; i < cases; ++i) {
    const fs::path bad = dir_ / "bad";
    fs::remove_all(bad);
    fs::copy(good, bad, fs::copy_options::recursive);
    const fs::path bstep = bad / "step-00000001";
    json m = manifest;
    std::string text;
    switch (gen.pick(6)) {
      case 0: {  // a tensor's field or a block's field replaced
        auto& t = m["tensors"][gen.one<std::string>(
            {"wte.weight", "h.0.ln_1.weight", "h.0.attn.q_proj.weight.exp_avg"})];
        const std::string k =
            gen.one<std::string>({"kind", "dtype", "shape", "dims", "blocks", "blocks.0.file",
                                  "blocks.0.offset", "blocks.0.ranges", "blocks.0.crc32"});
        json& target =
            k.rfind("blocks.0.", 0) == 0 && t["blocks"].is_array() && !t["blocks"].empty()
                ? t["blocks"][0][k.substr(9)]
                : t[k];
        target = gen.one(hostile);
        break;
      }
      case 1:  // a top-level field replaced or removed
        if (gen.coin(0.5))
          m[gen.one<std::string>({"format", "version", "step", "files", "tensors", "info"})] =
              gen.one(hostile);
        else
          m.erase(gen.one<std::string>({"format", "version", "step", "files", "tensors"}));
        break;
      case 2:  // a file's recorded size or CRC
        for (auto& [name, f] : m["files"].items())
          if (gen.coin(0.5)) f[gen.coin(0.5) ? "bytes" : "crc32"] = gen.one(hostile);
        break;
      case 3:  // the manifest's text cut
        text = m.dump();
        text.resize(static_cast<size_t>(gen.pick(static_cast<int>(text.size()))));
        break;
      case 4: {  // a shard truncated or flipped
        const fs::path shard =
            bstep / gen.one<std::string>({"rank-00000.safetensors", "rank-00001.safetensors"});
        const auto size = fs::file_size(shard);
        if (gen.coin(0.5)) {
          fs::resize_file(shard, size / 2);
        } else {
          std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
          f.seekp(static_cast<std::streamoff>(gen.pick(static_cast<int>(size))));
          f.put(static_cast<char>(gen.pick(256)));
        }
        break;
      }
      default:  // a file removed
        fs::remove(bstep / gen.one<std::string>({"rank-00000.safetensors", "manifest.json",
                                                 "rank-00001.json", "rank-00001.safetensors"}));
    }
    if (fs::exists(bstep / "manifest.json"))
      std::ofstream(bstep / "manifest.json", std::ios::trunc) << (text.empty() ? m.dump() : text);
    const std::string what = "case " + std::to_string(i);
    for (const std::string& args :
         {"train " + path + " --quiet --ranks " + gen.one<std::string>({"1", "2"}) + " --resume " +
              bad.string(),
          "checkpoint export " + bad.string() + " --to " + (dir_ / "x.safetensors").string() +
              (gen.coin(0.5) ? " --hf" : "")}) {
      CliRun r = run_cli_limited(args);
      ++codes[r.code == 0 ? 0 : r.code == 2 ? 2 : 1];
      EXPECT_EQ(judge(r), "") << what << "\n  meshflow " << args
                              << "\n  output: " << r.output.substr(0, 2000);
    }
    if (HasFailure()) return;
  }
  // Most damage is refused (exit 2); some leaves what a command reads intact.
  std::printf("checkpoint fuzz: %d runs ended 0, %d ended 2 (refused), %d ended 1\n", codes[0],
              codes[2], codes[1]);
  EXPECT_GT(codes[2], cases / 2);
}

}  // namespace
}  // namespace meshflow
