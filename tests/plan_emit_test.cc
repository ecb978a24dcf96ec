// `meshflow plan --emit megatron|deepspeed|torchtitan` (plan/emit.h): the
// best plan written as another stack's launch config. Every name emitted is
// checked against the names that stack defines, transcribed here from its
// own source:
//   Megatron-LM  megatron/training/arguments.py (_add_network_size_args,
//                _add_distributed_args, _add_training_args,
//                _add_mixed_precision_args, _add_tokenizer_args,
//                _add_transformer_engine_args), core_r0.12;
//   DeepSpeed    deepspeed/runtime/config.py and constants.py (train_batch_size,
//                train_micro_batch_size_per_gpu, gradient_accumulation_steps,
//                zero_optimization.stage, bf16.enabled, activation_checkpointing),
//                and the AutoTP training tutorial (tensor_parallel.autotp_size);
//   TorchTitan   torchtitan/config/job_config.py (Training, Parallelism,
//                ActivationCheckpoint, Model.converters, Float8, Compile).
// Plans a stack cannot run as planned are refused, and the search under
// --emit returns only plans the stack runs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cli_run.h"
#include "meshflow/config/json_reader.h"
#include "meshflow/plan/emit.h"
#include "meshflow/plan/search.h"

namespace meshflow::plan {
namespace {

using meshflow::testing::run_cli;
using meshflow::testing::source_dir;

ModelConfig model(const std::string& name) {
  return value_or_throw(
      parse_model_config(value_or_throw(read_json_file(source_dir() + "/configs/models/" + name))));
}

const std::set<std::string> kMegatronArgs = {"--num-layers",
                                             "--hidden-size",
                                             "--ffn-hidden-size",
                                             "--num-attention-heads",
                                             "--group-query-attention",
                                             "--num-query-groups",
                                             "--seq-length",
                                             "--max-position-embeddings",
                                             "--vocab-size",
                                             "--normalization",
                                             "--position-embedding-type",
                                             "--swiglu",
                                             "--disable-bias-linear",
                                             "--untie-embeddings-and-output-weights",
                                             "--bf16",
                                             "--fp8-format",
                                             "--fp8-amax-history-len",
                                             "--fp8-amax-compute-algo",
                                             "--tensor-model-parallel-size",
                                             "--sequence-parallel",
                                             "--pipeline-model-parallel-size",
                                             "--context-parallel-size",
                                             "--cp-comm-type",
                                             "--num-layers-per-virtual-pipeline-stage",
                                             "--num-virtual-stages-per-pipeline-rank",
                                             "--account-for-embedding-in-pipeline-split",
                                             "--account-for-loss-in-pipeline-split",
                                             "--decoder-first-pipeline-num-layers",
                                             "--decoder-last-pipeline-num-layers",
                                             "--use-distributed-optimizer",
                                             "--overlap-grad-reduce",
                                             "--overlap-param-gather",
                                             "--use-torch-fsdp2",
                                             "--micro-batch-size",
                                             "--global-batch-size",
                                             "--recompute-granularity",
                                             "--recompute-method",
                                             "--recompute-num-layers"};

// The flags of an emitted Megatron-LM argument list, each checked known.
std::map<std::string, std::string> megatron_flags(const std::string& text) {
  std::map<std::string, std::string> flags;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (line.size() >= 2 && line.substr(line.size() - 2) == " \\") line.resize(line.size() - 2);
    const size_t sp = line.find(' ');
    const std::string flag = line.substr(0, sp);
    EXPECT_TRUE(kMegatronArgs.count(flag)) << "not a Megatron-LM argument: " << flag;
    flags[flag] = sp == std::string::npos ? "" : line.substr(sp + 1);
  }
  return flags;
}

// emit_plan refuses `p` for `t`, saying `want`.
void expect_refused(const Plan& p, const TrainingJob& job, EmitTarget t, const std::string& want) {
  Result<std::string> r = emit_plan(p, job, true, t);
  ASSERT_FALSE(r.is_ok()) << want;
  EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
}

TEST(PlanEmit, MegatronArgumentsSpellThePlan) {
  const TrainingJob job{model("llama3_70b.json"), 256, 8192};
  Plan p;
  p.dp = 2, p.tp = 4, p.pp = 4, p.cp = 2, p.sp = true, p.vp = 1;
  p.micro_batch = 2, p.num_micro_batches = 64;
  p.recompute = Recompute::kFull;
  p.zero = 1;
  p.layers_per_stage = {17, 21, 21, 21};
  const std::string text = value_or_throw(emit_plan(p, job, true, EmitTarget::kMegatron));
  const auto f = megatron_flags(text);
  EXPECT_EQ(f.at("--tensor-model-parallel-size"), "4");
  EXPECT_EQ(f.at("--pipeline-model-parallel-size"), "4");
  EXPECT_EQ(f.at("--context-parallel-size"), "2");
  EXPECT_EQ(f.at("--cp-comm-type"), "a2a");
  EXPECT_TRUE(f.count("--sequence-parallel"));
  EXPECT_EQ(f.at("--decoder-first-pipeline-num-layers"), "17");
  EXPECT_EQ(f.at("--decoder-last-pipeline-num-layers"), "21");
  EXPECT_EQ(f.at("--micro-batch-size"), "2");
  EXPECT_EQ(f.at("--global-batch-size"), "256");
  EXPECT_EQ(f.at("--recompute-granularity"), "full");
  EXPECT_TRUE(f.count("--use-distributed-optimizer"));
  // The overlaps the price assumes, off by default in Megatron-LM.
  EXPECT_TRUE(f.count("--overlap-grad-reduce"));
  EXPECT_TRUE(f.count("--overlap-param-gather"));
  EXPECT_EQ(f.at("--num-query-groups"), "8");
  EXPECT_EQ(f.at("--normalization"), "RMSNorm");
  EXPECT_TRUE(f.count("--bf16"));
  // Interleaved: layers per virtual stage.
  p.layers_per_stage.clear();
  p.schedule = ScheduleKind::kInterleaved, p.vp = 5;
  EXPECT_EQ(megatron_flags(value_or_throw(emit_plan(p, job, true, EmitTarget::kMegatron)))
                .at("--num-layers-per-virtual-pipeline-stage"),
            "4");
  // What Megatron-LM cannot run as planned.
  p.schedule = ScheduleKind::kGPipe, p.vp = 1;
  expect_refused(p, job, EmitTarget::kMegatron, "1F1B and its interleaved form only");
  p.schedule = ScheduleKind::k1F1B;
  p.layers_per_stage = {10, 30, 20, 20};
  expect_refused(p, job, EmitTarget::kMegatron, "middle stages differ");
  p.layers_per_stage.clear();
  p.zero = 3;
  expect_refused(p, job, EmitTarget::kMegatron, "--use-torch-fsdp2");
  // Its distributed optimizer keeps the whole gradient buffer: ZeRO-2's
  // sharded gradients are not what it runs.
  p.zero = 2;
  expect_refused(p, job, EmitTarget::kMegatron, "pin zero=1");
}

// Llama-3 405B's 126 layers over pp = 8 x vp = 8 chunks (Megatron-Core's
// recipes): the embedding and the loss count as a layer each, so the first
// and the last chunk hold one block and the other 62 two. Interleaved
// chunks of unequal blocks are priced on the formula's memory model too
// (each stage holds its chunks' blocks: 15 on the first and the last, 16
// between), emitted as Megatron-LM's account-for flags, and as TorchTitan's
// model parts; an interleaved split of another shape Megatron-LM cannot run.
TEST(PlanEmit, UnevenInterleavedChunksAreMegatronsEmbeddingAndLossSplit) {
  const TrainingJob job{model("llama3_405b.json"), 512, 8192};
  const Cluster cl = value_or_throw(with_devices(
      value_or_throw(load_cluster(source_dir() + "/configs/clusters/h100_sxm.json")), 1024));
  Plan p;
  p.dp = 8, p.tp = 8, p.pp = 8, p.cp = 2, p.vp = 8, p.sp = true, p.ring = true;
  p.schedule = ScheduleKind::kInterleaved;
  p.micro_batch = 1, p.num_micro_batches = 64, p.zero = 1;
  const CostModel cm(job, cl, stack_constants(EmitTarget::kMegatron, true));
  EXPECT_NE(cm.invalid_reason(p).find("must divide the 126 layers (or give layers_per_stage"),
            std::string::npos)
      << cm.invalid_reason(p);
  p.layers_per_stage.assign(64, 2);
  p.layers_per_stage.front() = 1, p.layers_per_stage.back() = 1;
  ASSERT_EQ(cm.invalid_reason(p), "");
  const StepCost c = value_or_throw(cm.price(p));
  EXPECT_GT(c.step_time_s, 0);
  const std::vector<MemoryBreakdown> stages = value_or_throw(cm.memory_by_stage(p));
  ASSERT_EQ(stages.size(), 8u);
  for (int s = 2; s < 7; ++s) EXPECT_DOUBLE_EQ(stages[s].params, stages[1].params) << s;
  // The middle stages' 16 blocks each; the last one's 15 and the head.
  EXPECT_NE(stages[7].params, stages[1].params);
  EXPECT_GT(stages[1].activations, stages[7].activations);  // more blocks, more in flight
  const auto f = megatron_flags(value_or_throw(emit_plan(p, job, true, EmitTarget::kMegatron)));
  EXPECT_EQ(f.at("--num-virtual-stages-per-pipeline-rank"), "8");
  EXPECT_TRUE(f.count("--account-for-embedding-in-pipeline-split"));
  EXPECT_TRUE(f.count("--account-for-loss-in-pipeline-split"));
  EXPECT_FALSE(f.count("--num-layers-per-virtual-pipeline-stage"));
  EXPECT_FALSE(f.count("--decoder-first-pipeline-num-layers"));
  // Interleaved chunks of another shape: not what Megatron-LM runs.
  const TrainingJob job70{model("llama3_70b.json"), 256, 8192};
  Plan q;
  q.dp = 8, q.tp = 8, q.pp = 4, q.vp = 2, q.sp = true;
  q.schedule = ScheduleKind::kInterleaved;
  q.micro_batch = 1, q.num_micro_batches = 32, q.zero = 1;
  q.layers_per_stage = {12, 10, 10, 10, 10, 10, 10, 8};
  expect_refused(q, job70, EmitTarget::kMegatron, "one fewer in the first and the last chunk");
  q.layers_per_stage = {9, 10, 10, 10, 10, 10, 12, 9};
  expect_refused(q, job70, EmitTarget::kMegatron, "middle stages differ");
  // The search offers it: 405B with the interleaved schedule pinned on
  // tp=8 pp=8 cp=2 picks chunks of 2 blocks with 1 in the first and the last
  // (vp=8, as Megatron-Bridge's 405B recipe on 1024 H100s: its p2p under
  // the other chunks' compute, what more chunks cost is their delay in the
  // warm-up and the flush).
  const testing::CliRun r = run_cli(
      "plan " + source_dir() + "/configs/models/llama3_405b.json --cluster " + source_dir() +
      "/configs/clusters/h100_sxm.json --gpus 1024 --seq 8192 --global-batch 512 --emit megatron "
      "--fix tp=8,pp=8,cp=2,schedule=interleaved");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--account-for-embedding-in-pipeline-split"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(" vp=8 stages=1/2/2/"), std::string::npos) << r.output;
  // TorchTitan names each chunk's modules (its model parts, in model order).
  const std::string toml = value_or_throw(emit_plan(p, job, true, EmitTarget::kTorchTitan));
  EXPECT_NE(toml.find("module_fqns_per_model_part = [[\"tok_embeddings\", \"layers.0\"], "
                      "[\"layers.1\", \"layers.2\"]"),
            std::string::npos)
      << toml.substr(0, 400);
}

// Full recompute of the first N blocks of each (virtual) stage
// (Plan::recompute_layers) is Megatron-LM's block method
// (arguments.py: --recompute-method choices uniform, block); DeepSpeed's and
// TorchTitan's configs have no such count and refuse it by name.
TEST(PlanEmit, RecomputeOfSomeBlocksIsMegatronsBlockMethod) {
  const TrainingJob job{model("llama3_8b.json"), 256, 8192};
  Plan p;
  p.dp = 8, p.tp = 4, p.pp = 2, p.sp = true;
  p.micro_batch = 1, p.num_micro_batches = 32;
  p.recompute = Recompute::kFull, p.recompute_layers = 5;
  const auto f = megatron_flags(value_or_throw(emit_plan(p, job, true, EmitTarget::kMegatron)));
  EXPECT_EQ(f.at("--recompute-granularity"), "full");
  EXPECT_EQ(f.at("--recompute-method"), "block");
  EXPECT_EQ(f.at("--recompute-num-layers"), "5");
  p.recompute_layers = 0;
  const auto all = megatron_flags(value_or_throw(emit_plan(p, job, true, EmitTarget::kMegatron)));
  EXPECT_EQ(all.at("--recompute-method"), "uniform");
  EXPECT_EQ(all.at("--recompute-num-layers"), "1");
  Plan q;
  q.dp = 32, q.micro_batch = 1, q.num_micro_batches = 8, q.zero = 3;
  q.recompute = Recompute::kFull, q.recompute_layers = 16;
  expect_refused(q, job, EmitTarget::kTorchTitan, "pin recompute_layers=0");
  q.zero = 2;
  expect_refused(q, job, EmitTarget::kDeepSpeed, "pin recompute_layers=0");
}

TEST(PlanEmit, DeepSpeedConfigIsItsJson) {
  const TrainingJob job{model("llama3_8b.json"), 512, 4096};
  Plan p;
  p.dp = 16, p.tp = 4;
  p.micro_batch = 2, p.num_micro_batches = 16;
  p.zero = 2;
  p.recompute = Recompute::kFull;
  const std::string text = value_or_throw(emit_plan(p, job, true, EmitTarget::kDeepSpeed));
  const nlohmann::json j = nlohmann::json::parse(text);
  const std::set<std::string> keys = {"train_batch_size",
                                      "train_micro_batch_size_per_gpu",
                                      "gradient_accumulation_steps",
                                      "zero_optimization",
                                      "bf16",
                                      "tensor_parallel",
                                      "activation_checkpointing"};
  for (const auto& [k, v] : j.items()) EXPECT_TRUE(keys.count(k)) << "not a DeepSpeed key: " << k;
  EXPECT_EQ(j["train_batch_size"], 512);
  // DeepSpeed checks train_batch_size = micro x accumulation x data-parallel size.
  EXPECT_EQ(j["train_micro_batch_size_per_gpu"].get<int>() *
                j["gradient_accumulation_steps"].get<int>() * p.dp,
            512);
  EXPECT_EQ(j["zero_optimization"]["stage"], 2);
  EXPECT_EQ(j["zero_optimization"]["overlap_comm"], true);  // the price overlaps the reduction
  EXPECT_EQ(j["tensor_parallel"]["autotp_size"], 4);
  EXPECT_EQ(j["bf16"]["enabled"], true);
  for (const auto& [mutate, want] : std::vector<std::pair<std::function<void(Plan&)>, std::string>>{
           {[](Plan& q) { q.pp = 2, q.dp = 8; }, "PipelineModule(num_stages"},
           {[](Plan& q) { q.sp = true; }, "AutoTP has no sequence parallelism"},
           {[](Plan& q) { q.zero = 3; }, "ZeRO stage 0, 1 or 2"},
           {[](Plan& q) { q.recompute = Recompute::kSelective; }, "not selected ops"}}) {
    Plan q = p;
    mutate(q);
    expect_refused(q, job, EmitTarget::kDeepSpeed, want);
  }
}

TEST(PlanEmit, TorchTitanTomlTables) {
  const TrainingJob job{model("llama3_70b.json"), 256, 8192};
  Plan p;
  p.dp = 2, p.tp = 4, p.pp = 4, p.cp = 2, p.sp = true, p.ring = true;
  p.micro_batch = 2, p.num_micro_batches = 64;
  p.zero = 1;  // FSDP2 under pipelines: parameters and gradients whole for the step
  p.recompute = Recompute::kSelective;
  p.layers_per_stage = {17, 21, 21, 21};
  const std::string text = value_or_throw(emit_plan(p, job, true, EmitTarget::kTorchTitan));
  const std::set<std::string> keys = {"local_batch_size",
                                      "global_batch_size",
                                      "seq_len",
                                      "data_parallel_replicate_degree",
                                      "data_parallel_shard_degree",
                                      "tensor_parallel_degree",
                                      "context_parallel_degree",
                                      "context_parallel_rotate_method",
                                      "pipeline_parallel_degree",
                                      "pipeline_parallel_schedule",
                                      "pipeline_parallel_microbatch_size",
                                      "pipeline_parallel_layers_per_stage",
                                      "module_fqns_per_model_part",
                                      "mode",
                                      "selective_ac_option",
                                      "enable",  // [compile] (job_config.py: Compile)
                                      "components"};
  std::map<std::string, std::string> kv;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || line[0] == '[') continue;
    const size_t eq = line.find(" = ");
    ASSERT_NE(eq, std::string::npos) << line;
    const std::string key = line.substr(0, eq);
    EXPECT_TRUE(keys.count(key)) << "not a TorchTitan key: " << key;
    kv[key] = line.substr(eq + 3);
  }
  EXPECT_NE(text.find("[parallelism]"), std::string::npos);
  EXPECT_EQ(kv["data_parallel_shard_degree"], "2");  // FSDP2 (ZeRO-1 under its pipelines)
  EXPECT_EQ(kv["data_parallel_replicate_degree"], "1");
  EXPECT_EQ(kv["pipeline_parallel_schedule"], "\"1F1B\"");
  EXPECT_EQ(kv["local_batch_size"], "128");  // the replica's batch: 64 micro-batches of 2
  EXPECT_EQ(kv["mode"], "\"selective\"");
  // cp is its ring (torch's context_parallel rotating the K/V shards); Ulysses
  // (head shards) is not what it runs.
  EXPECT_EQ(kv["context_parallel_rotate_method"], "\"alltoall\"");
  {
    Plan u = p;
    u.ring = false;
    expect_refused(u, job, EmitTarget::kTorchTitan, "pin ring=true");
  }
  // The uneven split by module: the embedding and 17 layers, ..., the last 21 with norm and output.
  EXPECT_NE(kv["module_fqns_per_model_part"].find("[\"tok_embeddings\", \"layers.0\","),
            std::string::npos);
  EXPECT_NE(kv["module_fqns_per_model_part"].find("\"layers.79\", \"norm\", \"output\"]]"),
            std::string::npos);
  Plan q = p;
  q.zero = 3;  // not what its FSDP2 runs under pipelines
  expect_refused(q, job, EmitTarget::kTorchTitan, "pin zero=1 or zero=0");
  q.pp = 1, q.layers_per_stage.clear(), q.dp = 8;
  const std::string fsdp = value_or_throw(emit_plan(q, job, true, EmitTarget::kTorchTitan));
  EXPECT_NE(fsdp.find("data_parallel_shard_degree = 8"), std::string::npos) << fsdp;
  q.zero = 1;  // without pipelines FSDP2 is ZeRO-3 or nothing
  expect_refused(q, job, EmitTarget::kTorchTitan, "FSDP2: ZeRO-3");
  q = p;
  q.sp = false;
  expect_refused(q, job, EmitTarget::kTorchTitan, "pin sp=true");
  q = p;
  q.ops = true;
  expect_refused(q, job, EmitTarget::kTorchTitan, "per-operator strategies");
  // ZB-V: torch's ZBVZeroBubble (two stages per rank, placed in a V by the
  // schedule), 80 layers in 8 model parts of 10; zb-h1 has no torch form.
  q = p;
  q.layers_per_stage.clear();
  q.schedule = ScheduleKind::kZbV, q.vp = 2;
  const std::string zbv = value_or_throw(emit_plan(q, job, true, EmitTarget::kTorchTitan));
  EXPECT_NE(zbv.find("pipeline_parallel_schedule = \"ZBVZeroBubble\""), std::string::npos) << zbv;
  EXPECT_NE(zbv.find("pipeline_parallel_layers_per_stage = 10"), std::string::npos) << zbv;
  expect_refused(q, job, EmitTarget::kMegatron, "1F1B and its interleaved form only");
  q.schedule = ScheduleKind::kZbH1, q.vp = 1;
  expect_refused(q, job, EmitTarget::kTorchTitan, "pin schedule=zb-v or 1f1b");
  const TrainingJob gpt{model("gpt3_1.3b.json"), 512, 2048};
  Plan g;
  g.dp = 8, g.micro_batch = 4, g.num_micro_batches = 16;
  expect_refused(g, gpt, EmitTarget::kTorchTitan, "LLaMA-style");
}

// --emit prices the program of the stack that runs the plan
// (stack_constants): Megatron-LM's bf16 gradients are accumulated and
// all-reduced in f32 (6 + 12/dp bytes per parameter under its distributed
// optimizer: twice the 16-bit gradients' memory), DeepSpeed's ZeRO-1/2 holds
// the step's f32 gradient partition and its reduce bucket, TorchTitan
// reduces in f32 and regathers nothing for the recompute.
TEST(PlanEmit, PricedAsTheTargetStackRunsIt) {
  const TrainingJob job{model("llama3_8b.json"), 512, 4096};
  const Cluster cl = value_or_throw(with_devices(
      value_or_throw(load_cluster(source_dir() + "/configs/clusters/h100_sxm.json")), 64));
  Plan p;
  p.dp = 8, p.tp = 8, p.micro_batch = 1, p.num_micro_batches = 64, p.zero = 1;
  auto price = [&](const CostConstants& k, const Plan& q) {
    return value_or_throw(CostModel(job, cl, k).price(q));
  };
  const StepCost plain = price(CostConstants{}, p);
  const StepCost megatron = price(stack_constants(EmitTarget::kMegatron, true), p);
  EXPECT_NEAR(megatron.memory.grads, 2 * plain.memory.grads, 1e-6 * plain.memory.grads);
  EXPECT_GT(megatron.comm.data_parallel, plain.comm.data_parallel);  // f32 reduce-scatter
  EXPECT_TRUE(stack_constants(EmitTarget::kMegatron, true).overlap_param_gather);
  EXPECT_EQ(stack_constants(EmitTarget::kMegatron, false).grad_accumulation_bytes, 0);
  const StepCost deepspeed = price(stack_constants(EmitTarget::kDeepSpeed, true), p);
  EXPECT_NEAR(deepspeed.memory.grads - plain.memory.grads, 4 * plain.memory.params / 2 / 8,
              1e-6 * plain.memory.params);
  EXPECT_NEAR(deepspeed.memory.temporaries - plain.memory.temporaries, 5e8 * 2, 1.0);
  // Without ZeRO its engine all-reduces the gradients after the backward.
  Plan z0 = p;
  z0.zero = 0;
  const StepCost ds0 = price(stack_constants(EmitTarget::kDeepSpeed, true), z0);
  const StepCost overlapped0 = price(CostConstants{}, z0);
  EXPECT_GT(ds0.dp_comm_s, 1.5 * overlapped0.dp_comm_s);
  Plan z3 = p;
  z3.tp = 1, z3.dp = 64, z3.num_micro_batches = 8, z3.zero = 3, z3.recompute = Recompute::kFull;
  CostConstants f32_reduce;
  f32_reduce.grad_reduce_bytes = 4;
  // Its FSDP2 under pipelines (ZeRO-1) reduce-scatters after the last backward.
  Plan pz1 = p;
  pz1.tp = 8, pz1.dp = 4, pz1.pp = 2, pz1.num_micro_batches = 128, pz1.sp = true;
  CostConstants titan_overlapped = stack_constants(EmitTarget::kTorchTitan, true);
  titan_overlapped.zero1_reduce_after_backward = false;
  const StepCost titan_pp = price(stack_constants(EmitTarget::kTorchTitan, true), pz1);
  EXPECT_GT(titan_pp.dp_comm_s, price(titan_overlapped, pz1).dp_comm_s);
  // FSDP2 holds its gradients in the f32 reduce dtype: under the pipeline's
  // no-sync micro-batches each backward's bf16 gradient is added into an
  // unsharded f32 one (to_accumulated_grad_if_needed); under ZeRO-3 the
  // shards are its f32 sharded parameters' gradients.
  const StepCost bf16_pp = price(CostConstants{}, pz1);
  EXPECT_NEAR(titan_pp.memory.grads, 2 * bf16_pp.memory.grads, 1e-6 * bf16_pp.memory.grads);
  EXPECT_NEAR(titan_pp.memory.grads, 4 * titan_pp.memory.params / 2, 1e-6 * titan_pp.memory.grads);
  EXPECT_EQ(stack_constants(EmitTarget::kTorchTitan, false).grad_accumulation_bytes, 0);
  const StepCost fsdp = price(stack_constants(EmitTarget::kTorchTitan, true), z3);
  EXPECT_NEAR(fsdp.memory.grads, 2 * price(CostConstants{}, z3).memory.grads,
              1e-6 * fsdp.memory.grads);
  const StepCost regathers = price(f32_reduce, z3);
  EXPECT_LT(fsdp.comm.data_parallel, regathers.comm.data_parallel);
  EXPECT_GT(price(f32_reduce, z3).comm.data_parallel,
            price(CostConstants{}, z3).comm.data_parallel);
  // TorchTitan logs its allocator's reserved peak: the tensors' peak times
  // what a lent H200 measured for such a step under expandable segments
  // (1.004 compiled, 1.063 eager); the other stacks report the tensors' peak.
  EXPECT_DOUBLE_EQ(plain.reserved_memory, plain.memory.total);
  EXPECT_DOUBLE_EQ(megatron.reserved_memory, megatron.memory.total);
  EXPECT_NEAR(fsdp.reserved_memory, 1.004 * fsdp.memory.total, 1e-9 * fsdp.memory.total);
  CostConstants titan_eager = stack_constants(EmitTarget::kTorchTitan, true);
  set_eager(&titan_eager);
  const StepCost eager = price(titan_eager, z3);
  EXPECT_NEAR(eager.reserved_memory, 1.063 * eager.memory.total, 1e-9 * eager.memory.total);
  CostConstants plain_eager;
  set_eager(&plain_eager);  // eager PyTorch without a reserved-peak report: the tensors'
  EXPECT_DOUBLE_EQ(price(plain_eager, z3).reserved_memory, price(plain_eager, z3).memory.total);
  // The CLI says which stack it priced, and the memory as the stack reports it.
  testing::CliRun r = run_cli("plan " + source_dir() + "/configs/models/llama3_8b.json --cluster " +
                              source_dir() + "/configs/clusters/h100_sxm.json --gpus 64 " +
                              "--global-batch 512 --seq 4096 --emit megatron");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("priced as Megatron-LM's (gradients accumulated and all-reduced in f32"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("reserved by PyTorch's allocator"), std::string::npos) << r.output;
  r = run_cli("plan " + source_dir() + "/configs/models/llama3_8b.json --cluster " + source_dir() +
              "/configs/clusters/h100_sxm.json --gpus 64 --global-batch 512 --seq 4096 --emit "
              "torchtitan");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(" GiB per device reserved by PyTorch's allocator, priced as"),
            std::string::npos)
      << r.output;
}

// The CLI: --emit searches only what the target runs and prints only the
// emitted text on stdout; a bad target or --json with it is an error.
TEST(PlanEmit, CliSearchesWhatTheTargetRuns) {
  const std::string base = "plan " + source_dir() + "/configs/models/llama3_8b.json --cluster " +
                           source_dir() + "/configs/clusters/h100_sxm.json --gpus 64 " +
                           "--global-batch 512 --seq 4096";
  // (run_cli joins stderr to stdout: the one "meshflow: best plan ..." line
  // of stderr is taken out; the rest is stdout.)
  auto stdout_of = [](const std::string& out) {
    std::string kept;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);)
      if (line.rfind("meshflow: best plan ", 0) != 0) kept += line + "\n";
    return kept;
  };
  testing::CliRun r = run_cli(base + " --emit deepspeed");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("meshflow: best plan "), std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(stdout_of(r.output));  // the JSON alone
  EXPECT_EQ(j["train_batch_size"], 512);
  r = run_cli(base + " --emit torchtitan");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[parallelism]"), std::string::npos);
  r = run_cli(base + " --emit megatron");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--tensor-model-parallel-size"), std::string::npos);
  megatron_flags(stdout_of(r.output));
  r = run_cli(base + " --emit slurm");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("valid targets are megatron, deepspeed, torchtitan"), std::string::npos);
  r = run_cli(base + " --emit megatron --json");
  EXPECT_EQ(r.code, 2);
  r = run_cli("plan " + source_dir() + "/configs/models/resnet50.json --cluster " + source_dir() +
              "/configs/clusters/h100_sxm.json --gpus 8 --emit megatron");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("not a transformer language model"), std::string::npos) << r.output;
}

// A fresh temporary directory for one test's files, removed with it.
struct TempDir {
  explicit TempDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() /
             ("meshflow_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::filesystem::path path;
};

// `meshflow simulate` on the plan file at `path` prints the step time
// `meshflow plan --out` predicted in it; its run, for more checks.
testing::CliRun expect_simulate_agrees(const std::string& path) {
  const nlohmann::json plan = nlohmann::json::parse(std::ifstream(path));
  char want[64];
  std::snprintf(want, sizeof want, "predicted %.2f s per step",
                plan["plan"]["prediction"]["step_time_s"].get<double>());
  testing::CliRun r = run_cli("simulate " + path);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  return r;
}

// `meshflow simulate` refuses the plan file at `path` once its plan.`key` is
// `bad`, with exit 2 and a message containing `says`.
void expect_simulate_refuses(const std::string& path, const std::string& key,
                             const nlohmann::json& bad, const std::string& says) {
  nlohmann::json plan = nlohmann::json::parse(std::ifstream(path));
  plan["plan"][key] = bad;
  std::ofstream(path) << plan.dump();
  const testing::CliRun r = run_cli("simulate " + path);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(says), std::string::npos) << says << "\n" << r.output;
}

// A plan file written with --emit names the stack it was priced as, and
// `meshflow simulate` prices it with that stack's constants: the same step
// time as `plan` printed (TorchTitan's op-level SAC fits LLaMA-3 8B at 8192
// tokens on eight 96 GB H100s where Megatron's selective recompute does not).
// A stack simulate does not know is refused by name.
TEST(PlanEmit, PlanFileKeepsTheStackSimulatePricesWith) {
  const TempDir dir("emit");
  const std::string out = dir.file("plan.json");
  testing::CliRun r = run_cli(
      "plan " + source_dir() + "/configs/models/llama3_8b.json --cluster " + source_dir() +
      "/configs/clusters/h100_96gb.json --gpus 8 --global-batch 16 --seq 8192 --top 0 --fix " +
      "tp=1,pp=1,dp=8,micro_batch=2,recompute=selective,zero=3 --emit torchtitan --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  nlohmann::json plan = nlohmann::json::parse(std::ifstream(out));
  EXPECT_EQ(plan["plan"]["stack"], "torchtitan");
  r = expect_simulate_agrees(out);
  EXPECT_EQ(r.output.find("warning: the plan needs"), std::string::npos) << r.output;
  // Without the stack it is priced as meshflow's own: Megatron's selective
  // recompute keeps more, and the plan no longer fits.
  plan["plan"].erase("stack");
  std::ofstream(out) << plan.dump();
  r = run_cli("simulate " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: the plan needs"), std::string::npos) << r.output;
  expect_simulate_refuses(out, "stack", "jax",
                          "plan.stack must be the --emit target the plan was priced for "
                          "(megatron, deepspeed or torchtitan), got \"jax\"");
}

// Megatron-LM's attention is Transformer Engine's, which on Hopper prefers
// cuDNN's fused kernel to FlashAttention: `--emit megatron` prices it with the
// cluster file's "cudnn" entry where it has one (the H100 and H200 files),
// FlashAttention-2 elsewhere and for the other stacks; the plan file keeps
// the stack, so simulate prices the same.
TEST(PlanEmit, MegatronRunsCudnnAttentionOnHopper) {
  const Cluster h100 =
      value_or_throw(load_cluster(source_dir() + "/configs/clusters/h100_sxm.json"));
  const Cluster a100 =
      value_or_throw(load_cluster(source_dir() + "/configs/clusters/dgx_a100_80gb.json"));
  CostConstants k;
  apply_stack_attention(EmitTarget::kMegatron, h100, &k);
  EXPECT_EQ(k.fused_attention, "cudnn");
  for (const double keys : {2048.0, 8192.0})
    for (const bool fwd : {true, false})
      EXPECT_GT(h100.device.attention_efficiency.at("cudnn").at(keys, fwd),
                h100.device.attention_efficiency.at("flash2").at(keys, fwd));
  CostConstants ka, kt;
  apply_stack_attention(EmitTarget::kMegatron, a100, &ka);
  apply_stack_attention(EmitTarget::kTorchTitan, h100, &kt);
  EXPECT_EQ(ka.fused_attention, "flash2");
  EXPECT_EQ(kt.fused_attention, "flash2");

  const TempDir dir("cudnn");
  const std::string out = dir.file("plan.json");
  const std::string base = "plan " + source_dir() + "/configs/models/llama3_8b.json --cluster " +
                           source_dir() + "/configs/clusters/h100_sxm.json --gpus 8 " +
                           "--global-batch 16 --seq 8192 --top 0 --fix tp=2,pp=1,dp=4,zero=1";
  testing::CliRun r = run_cli(base + " --emit megatron --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  const double megatron =
      nlohmann::json::parse(std::ifstream(out))["plan"]["prediction"]["step_time_s"].get<double>();
  expect_simulate_agrees(out);
  // The same plan with FlashAttention-2 named: slower attention.
  r = run_cli(base + " --emit megatron --attention flash2 --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  const double flash2 =
      nlohmann::json::parse(std::ifstream(out))["plan"]["prediction"]["step_time_s"].get<double>();
  EXPECT_GT(flash2, megatron);
}

// --eager: the memory-bound ops priced as PyTorch's eager kernels
// (CostConstants::kEagerElementwise, measured on an H100); the GEMMs and the
// attention as before, so where memory is free the step is nearly the same. The plan
// file keeps the choice and `simulate` prices with it; a wrong value is
// refused by name.
TEST(PlanEmit, EagerPricesTheMemoryBoundOpsAndTravelsInThePlanFile) {
  const ModelConfig model = value_or_throw(parse_model_config(
      value_or_throw(read_json_file(source_dir() + "/configs/models/llama3_8b.json"))));
  Cluster c = value_or_throw(with_devices(
      value_or_throw(load_cluster(source_dir() + "/configs/clusters/h100_sxm.json")), 8));
  Plan p;
  p.dp = 8, p.micro_batch = 1, p.num_micro_batches = 1, p.zero = 3;
  p.recompute = Recompute::kFull;
  CostConstants eager;
  set_eager(&eager);
  const TrainingJob job{model, 8, 8192};
  const auto compute = [&](const Cluster& cl, const CostConstants& k) {
    return value_or_throw(CostModel(job, cl, k).price(p)).compute_s;
  };
  const double extra = compute(c, eager) - compute(c, {});
  EXPECT_GT(extra, compute(c, {}) * 0.04);
  c.device.memory_bandwidth_bytes_per_s = 1e18;  // (their few FLOPs remain)
  EXPECT_LT(compute(c, eager) - compute(c, {}), extra / 10);

  const TempDir dir("eager");
  const std::string out = dir.file("plan.json");
  const std::string base = "plan " + source_dir() + "/configs/models/llama3_8b.json --cluster " +
                           source_dir() + "/configs/clusters/h100_sxm.json --gpus 8 " +
                           "--global-batch 16 --seq 8192 --top 0 --fix tp=1,pp=1,dp=8,zero=3";
  const auto step = [&](const std::string& flags) {
    testing::CliRun r = run_cli(base + flags + " --out " + out);
    EXPECT_EQ(r.code, 0) << r.output;
    return nlohmann::json::parse(std::ifstream(out))["plan"];
  };
  const double fused = step("")["prediction"]["step_time_s"].get<double>();
  nlohmann::json plan = step(" --eager");
  EXPECT_EQ(plan["eager"], true);
  EXPECT_GT(plan["prediction"]["step_time_s"].get<double>(), fused);
  expect_simulate_agrees(out);
  // TorchTitan compiles only when asked ([compile], off by default): the
  // emitted plan asks for it unless it was priced eager.
  const std::string compile = "\n[compile]\nenable = true\ncomponents = [\"model\", \"loss\"]\n";
  testing::CliRun r = run_cli(base + " --emit torchtitan");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(compile), std::string::npos) << r.output;
  r = run_cli(base + " --emit torchtitan --eager");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("[compile]"), std::string::npos) << r.output;
  expect_simulate_refuses(out, "eager", 1, "plan.eager must be true or false, got 1");
}

// --launch-blocking (CUDA_LAUNCH_BLOCKING=1): every launch's host time
// added (tests/plan_launch_test.cc prices it), so a fixed plan is slower, more
// so with micro-batches of one sequence than of four at the same batch. The
// plan file keeps the choice, `simulate` prices with it, and a wrong value is
// refused by name.
TEST(PlanEmit, LaunchBlockingIsPricedAndTravelsInThePlanFile) {
  const TempDir dir("launch");
  const std::string out = dir.file("plan.json");
  const std::string base = "plan " + source_dir() + "/configs/models/gpt3_6.7b.json --cluster " +
                           source_dir() + "/configs/clusters/dgx_a100_80gb.json --gpus 16 " +
                           "--global-batch 64 --seq 2048 --top 0 --fix tp=8,pp=2,dp=1," +
                           "recompute=full,micro_batch=";
  const auto step = [&](const std::string& mb, const std::string& flags) {
    testing::CliRun r = run_cli(base + mb + flags + " --out " + out);
    EXPECT_EQ(r.code, 0) << r.output;
    return nlohmann::json::parse(std::ifstream(out))["plan"];
  };
  const auto seconds = [](const nlohmann::json& plan) {
    return plan["prediction"]["step_time_s"].get<double>();
  };
  const double async1 = seconds(step("1", "")), async4 = seconds(step("4", ""));
  const double blocking4 = seconds(step("4", " --launch-blocking"));
  nlohmann::json plan = step("1", " --launch-blocking");
  EXPECT_EQ(plan["launch_blocking"], true);
  EXPECT_GT(blocking4, async4);
  EXPECT_GT(seconds(plan) - async1, 3.0 * (blocking4 - async4));
  expect_simulate_agrees(out);
  testing::CliRun r = run_cli(base + "1 --launch-blocking");
  EXPECT_NE(r.output.find("kernels launched synchronously (CUDA_LAUNCH_BLOCKING=1)"),
            std::string::npos)
      << r.output;
  // An emitted plan says how it was priced (on stderr: the launch text stays
  // the framework's own).
  r = run_cli(base + "1 --launch-blocking --emit megatron");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("run it with CUDA_LAUNCH_BLOCKING=1 set, as priced"), std::string::npos)
      << r.output;
  expect_simulate_refuses(out, "launch_blocking", "yes",
                          "plan.launch_blocking must be true or false, got \"yes\"");
}

// --fp8: the blocks' linears in FP8 (TrainingJob::fp8). Megatron-LM gets
// Transformer Engine's hybrid recipe, TorchTitan its float8 converter with the
// output layer left 16-bit (as priced); DeepSpeed has no FP8 of its own, and a
// device without an FP8 rate is refused by name. The plan file keeps it, and
// simulate prices it so.
TEST(PlanEmit, Fp8IsSpelledByTheStacksThatRunIt) {
  const std::string base = "plan " + source_dir() + "/configs/models/llama3_8b.json --cluster " +
                           source_dir() + "/configs/clusters/h100_sxm.json --gpus 64 " +
                           "--global-batch 512 --seq 4096 --fp8";
  testing::CliRun r = run_cli(base + " --emit megatron");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* flag :
       {"--fp8-format hybrid", "--fp8-amax-history-len 1024", "--fp8-amax-compute-algo max"})
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag << "\n" << r.output;
  // The header says how the price treats the stack's FP8 weights.
  EXPECT_NE(r.output.find("; FP8 weights cast once a step, Transformer Engine's cache, the tp "
                          "all-gathers in FP8)"),
            std::string::npos)
      << r.output;
  std::string args;
  for (std::istringstream in(r.output); std::getline(in, args);)
    if (args.rfind("--", 0) == 0) megatron_flags(args);
  r = run_cli(base + " --emit torchtitan");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[model]\nconverters = [\"float8\"]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[float8]\nfilter_fqns = [\"output\"]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("; FP8 weights cast every forward, gathered in FP8 under FSDP, the tp "
                          "all-gathers in FP8)"),
            std::string::npos)
      << r.output;
  // With FSDP, its gathers in FP8 (as priced: fp8_weight_gather).
  r = run_cli(base + " --emit torchtitan --fix tp=1,pp=1,zero=3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("enable_fsdp_float8_all_gather = true\n"
                          "precompute_float8_dynamic_scale_for_fsdp = true"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(stack_constants(EmitTarget::kTorchTitan, true).fp8_weight_gather);
  EXPECT_TRUE(stack_constants(EmitTarget::kTorchTitan, true).fp8_tp_all_gather);
  EXPECT_TRUE(stack_constants(EmitTarget::kMegatron, true).fp8_tp_all_gather);
  EXPECT_FALSE(stack_constants(EmitTarget::kDeepSpeed, true).fp8_tp_all_gather);
  r = run_cli(base + " --emit deepspeed");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("DeepSpeed's config has no FP8 training of its own"), std::string::npos)
      << r.output;
  r = run_cli("plan " + source_dir() + "/configs/models/llama3_8b.json --cluster " + source_dir() +
              "/configs/clusters/dgx_a100_80gb.json --gpus 8 --fp8");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("gives no FP8 rate for its device ('NVIDIA A100-SXM4-80GB'): "
                          "device.peak_flops.fp8"),
            std::string::npos)
      << r.output;
  r = run_cli("plan " + source_dir() + "/configs/models/resnet50.json --cluster " + source_dir() +
              "/configs/clusters/h100_sxm.json --gpus 8 --fp8");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("has no transformer blocks, whose linear layers --fp8 runs in FP8"),
            std::string::npos)
      << r.output;
  // Without --fp8 the Megatron arguments have none.
  r = run_cli("plan " + source_dir() + "/configs/models/llama3_8b.json --cluster " + source_dir() +
              "/configs/clusters/h100_sxm.json --gpus 64 --global-batch 512 --seq 4096 "
              "--emit megatron");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("--fp8"), std::string::npos) << r.output;

  const TempDir dir("fp8");
  const std::string out = dir.file("plan.json");
  r = run_cli(base + " --top 0 --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("seq 4096; the blocks' linears in FP8"), std::string::npos) << r.output;
  nlohmann::json plan = nlohmann::json::parse(std::ifstream(out));
  EXPECT_EQ(plan["plan"]["fp8"], true);
  expect_simulate_agrees(out);
  expect_simulate_refuses(out, "fp8", "yes", "plan.fp8 must be true or false");
}

// --fp8-scaling rowwise (torchao's rowwise recipe): TorchTitan gets its
// recipe_name and no FP8 all-gather (tensorwise's alone), priced slower than
// tensorwise; Megatron (Transformer Engine has no rowwise recipe) and a
// scaling without --fp8 or with an unknown name are refused by name; the plan
// file keeps it and simulate prices it so.
TEST(PlanEmit, Fp8RowwiseIsTorchaosRecipe) {
  const std::string base = "plan " + source_dir() + "/configs/models/llama3_8b.json --cluster " +
                           source_dir() + "/configs/clusters/h100_sxm.json --gpus 64 " +
                           "--global-batch 512 --seq 4096 --fix tp=1,pp=1,zero=3 --fp8";
  testing::CliRun r = run_cli(base + " --fp8-scaling rowwise --emit torchtitan");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[float8]\nfilter_fqns = [\"output\"]\nrecipe_name = \"rowwise\"\n"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("enable_fsdp_float8_all_gather"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("FP8 rowwise: each GEMM casts its operands per row"), std::string::npos)
      << r.output;
  auto step = [](const std::string& out) {
    const size_t at = out.find("s per step predicted");
    EXPECT_NE(at, std::string::npos) << out;
    const size_t from = out.rfind(", ", at);
    return std::stod(out.substr(from + 2, at - from - 2));
  };
  const double rowwise = step(r.output);
  r = run_cli(base + " --fp8-scaling tensorwise --emit torchtitan");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("recipe_name"), std::string::npos) << r.output;
  EXPECT_GT(rowwise, 1.02 * step(r.output));

  r = run_cli(base + " --fp8-scaling rowwise --emit megatron");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("Transformer Engine has no rowwise recipe"), std::string::npos)
      << r.output;
  r = run_cli("plan " + source_dir() + "/configs/models/llama3_8b.json --cluster " + source_dir() +
              "/configs/clusters/h100_sxm.json --gpus 8 --fp8-scaling rowwise");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--fp8-scaling rowwise: it scales the FP8 linears of --fp8; add --fp8"),
            std::string::npos)
      << r.output;
  for (const char* bad : {"columnwise", "''"}) {
    r = run_cli(base + " --fp8-scaling " + bad);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find("not in {tensorwise,rowwise}"), std::string::npos) << r.output;
  }

  const TempDir dir("fp8rw");
  const std::string out = dir.file("plan.json");
  r = run_cli(base + " --fp8-scaling rowwise --top 0 --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("the blocks' linears in FP8, rowwise scaled"), std::string::npos)
      << r.output;
  nlohmann::json plan = nlohmann::json::parse(std::ifstream(out));
  EXPECT_EQ(plan["plan"]["fp8_scaling"], "rowwise");
  expect_simulate_agrees(out);
  expect_simulate_refuses(out, "fp8_scaling", "per-row", "plan.fp8_scaling must be tensorwise");
  expect_simulate_refuses(out, "fp8_scaling", 3, "plan.fp8_scaling must be tensorwise or rowwise");
  // The library refuses it for Megatron too (a caller other than the CLI).
  TrainingJob job{model("llama3_8b.json"), 512, 4096};
  job.fp8 = true, job.fp8_scaling = Fp8Scaling::kRowwise;
  Plan p;
  p.dp = 64, p.micro_batch = 1, p.num_micro_batches = 8;
  expect_refused(p, job, EmitTarget::kMegatron, "Transformer Engine has no rowwise FP8 recipe");
  EXPECT_NE(value_or_throw(emit_plan(p, job, true, EmitTarget::kTorchTitan))
                .find("recipe_name = \"rowwise\""),
            std::string::npos);
}

}  // namespace
}  // namespace meshflow::plan
