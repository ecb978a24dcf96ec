// CostModel: the predicted step time, memory and communication of a Plan for
// training a model on a Cluster: any model the engine builds (GPT, LLaMA, the
// MLP), priced from the program the engine would run.
//
//   TrainingJob job{model_config, /*global_batch=*/1536, /*seq=*/2048};
//   CostModel cm(job, cluster);                       // cluster sized to the plan's devices
//   MF_ASSIGN_OR_RETURN(StepCost c, cm.price(plan));  // c.step_time_s, c.memory.total, ...
//
// How a step is priced (docs/planner.md has the derivation and the sources):
//   1. The rank's program (plan/rank_program.h: the model's own builder cut to
//      one transformer block, autodiff, recompute, and the SPMD partitioner on
//      the plan's cp x tp mesh, from the section `plan --out` writes) is priced
//      node by node from each OpDef's cost: a roofline of its FLOPs (at the
//      cluster's size-dependent matmul efficiency) and its bytes (at memory
//      bandwidth), scaled to the compute dtype; each collective node the
//      partitioner inserted by collective_time_s on the link of its mesh axis
//      (parallel/collective_cost.h, the reshard planner's cost too). Backward
//      nodes split into input-gradient (B) and weight-gradient (W) work.
//      Cached per (tp, cp, micro_batch, sp): all blocks are the same, so a
//      96-layer model costs one program. A model without blocks (the MLP) is
//      built and priced whole; a ResNet on a pipeline (its layers differ) is
//      split by the runtime's own split_pipeline and priced chunk by chunk
//      (chunk_costs).
//   2. A stage = its blocks x that (compute + the block's collectives: the
//      Megatron all_reduces, or all_gather + reduce_scatter with sequence
//      parallelism, Ulysses' all_to_alls with cp), the embedding (first
//      stage), head + loss (last). Recompute adds the forward (full) or the
//      attention core (selective) to B, or the pass's clones (recompute_from_pass).
//   3. The schedule: m (F + B + W) + the bubble: (p-1)(F+B+W) for GPipe/1F1B,
//      /v for interleaved, (p-1)(F+B-W) for ZB-H1; point-to-point sends on the
//      pp link; the gradient reduce over dp*cp ranks (ring, on the link the axis
//      maps to) overlapped with the last micro-batch's backward; ZeRO-3's
//      per-layer gathers and reduce_scatters, prefetched one layer ahead on
//      one stream (each layer of a pass takes max(compute, collectives)); the
//      optimizer as memory-bound work.
//   4. Memory per device (the worst of the first and last stage): parameters,
//      gradients, optimizer state per ZeRO stage, activations per micro-batch in
//      flight (Korthikanti et al. 2022), temporaries (logits, recompute working
//      set); or, for meshflow's own executor (MemoryModel::kStaticArena), its
//      static memory planner run over the local program.
//
// Local runs: CostModel(job, *share_machine(local_cpu, ranks), meshflow_cpu_constants())
// prices N in-process ranks sharing this machine (bench/plan_accuracy checks it).
//
// Mesh order (rank = ((pp * dp + d) * cp + c) * tp + t: tp innermost, pp
// outermost, as Megatron-LM) decides which link each axis uses.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "meshflow/core/dtype.h"
#include "meshflow/core/status.h"
#include "meshflow/models/from_config.h"
#include "meshflow/plan/cluster.h"
#include "meshflow/plan/model_dims.h"
#include "meshflow/plan/plan.h"
#include "meshflow/plan/rank_program.h"

namespace meshflow::plan {

struct NodeTotals;  // cost_model.cc: what a program's nodes cost, by kind of work

// TrainingJob::fp8_scaling.
enum class Fp8Scaling { kTensorwise, kRowwise };
// "tensorwise" | "rowwise" (torchao's recipe names, TorchTitan's
// float8.recipe_name), and back; an unknown name is invalid, naming both.
const char* fp8_scaling_name(Fp8Scaling s);
Result<Fp8Scaling> parse_fp8_scaling(const std::string& name, const std::string& what);

struct TrainingJob {
  ModelConfig model;
  int64_t global_batch = 1;  // sequences per optimizer step
  int64_t seq = 1;
  // f32 state values the optimizer keeps per parameter (optimizer_state_values:
  // AdamW's two moments, SGD's momentum buffer): the model states' memory and
  // the update's memory traffic. Local plans take the run config's;
  // `meshflow plan --optimizer` sets it (AdamW by default).
  int optimizer_states = 2;
  // The blocks' linear layers run their three GEMMs (forward, input and
  // weight gradient) in FP8 with per-tensor scaling (Transformer Engine's
  // recipe, TorchTitan's Float8 linears): at the device's FP8 rate, their
  // operands cast from the compute dtype once each, into both layouts the
  // GEMMs read; attention, norms, the embedding and the head stay 16-bit
  // (both stacks leave the output layer out). `meshflow plan --fp8`. Needs
  // device.peak_flops.fp8.
  bool fp8 = false;
  // How those FP8 operands are scaled (`meshflow plan --fp8-scaling`):
  // one scale a tensor (Transformer Engine's recipes, torchao's tensorwise),
  // or one a row along the GEMM's reduction axis (torchao's rowwise recipe,
  // TorchTitan's float8.recipe_name = "rowwise"), which each GEMM casts its
  // two operands for itself and runs slower kernels
  // (CostConstants::fp8_rowwise_gemm_efficiency).
  Fp8Scaling fp8_scaling = Fp8Scaling::kTensorwise;
  // FP8 with one scale a tensor: what FP8 weight gathers, tp gathers and
  // Transformer Engine's weight cache need.
  bool fp8_tensorwise() const { return fp8 && fp8_scaling == Fp8Scaling::kTensorwise; }
};

// How attention runs on the device: fused (FlashAttention: scores stay on chip,
// causal half skipped, as the attention OpDef prices it) or the 2021 Megatron-LM
// way (two batched GEMMs over the full seq x seq scores, written to memory, a
// fused scale-mask-softmax and a dropout between them).
// kBlockedCpu: meshflow's CPU kernel (kernels/cpu/attention.cc): per (batch,
// head) blocks of 64 query rows, each against the keys its last row sees (the
// causal triangle rounded up to whole blocks), through SGEMM calls of 64 x
// keys x head_dim (2 per block forward, 5 backward), each priced at the
// efficiency of a call of that size.
enum class AttentionKernel { kFused, kMaterialized, kBlockedCpu };

// How the software stack holds activations and temporaries, which decides the
// memory model:
//   kMegatron     PyTorch/Megatron-LM: 16-bit activations kept per layer as
//                 Korthikanti et al. 2022 count them, allocated on demand.
//   kStaticArena  meshflow's executor (runtime/executor.h): every transient
//                 value of the per-rank program in one arena laid out before
//                 the first step by the static memory planner
//                 (runtime/memory_plan.h), gradients included. The cost model
//                 runs that planner over the rank program of one and of two
//                 blocks (plan/rank_program.h, with the plan's recompute pass)
//                 and extrapolates linearly to the stage's blocks. A model
//                 without blocks has no Korthikanti formula: it always uses this.
enum class MemoryModel { kMegatron, kStaticArena };

// Every constant of the cost model that is not in the Cluster file. Each is a
// property of the software stack (what the kernels and the framework do), taken
// from a published description; none is tuned to a published throughput.
struct CostConstants {
  // THE ONE FITTED CONSTANT. The fraction of the cluster's matmul efficiency
  // curve (Calculon's A100 table: 0.95 of peak from 128 GFLOP per call) that
  // training GEMMs sustain: a single scalar for every matmul of every plan,
  // fitted once by least squares of log(predicted / published) over the ten
  // rows of Megatron-LM 2021 Table 1 (tests/plan_reference_test.cc prints the
  // refit; docs/planner.md). It stands for what the datasheet peak does not
  // show: clocks below boost under sustained load, cuBLAS tile and wave
  // quantization, kernel launch gaps.
  double matmul_efficiency_scale = 0.78;
  AttentionKernel attention = AttentionKernel::kFused;
  // kFused: which fused kernel the stack runs, a key of the cluster file's
  // device.attention_efficiency ("flash2": FlashAttention-2, PyTorch SDPA;
  // "flash1": FlashAttention-1 and its 2022 Triton port, llm-foundry's
  // attn_impl triton). A kernel the file does not list is priced on the
  // matmul curve.
  std::string fused_attention = "flash2";
  // kMaterialized: bytes moved per element of the [heads, seq, seq] score
  // matrix, 16-bit. Forward: QK^T writes it (2), the fused scale-mask-softmax
  // reads and writes (4), dropout reads, writes and stores its mask (5), the
  // PV GEMM reads (2) = 13. Backward: dP written (2), dropout-backward reads
  // dP and the mask and writes (5), softmax-backward reads dP', P and writes
  // dS (6), the dQ/dK GEMMs read dS (4), the dV GEMM reads P (2) = 19.
  double materialized_fwd_bytes_per_score = 13;
  double materialized_bwd_bytes_per_score = 19;
  // Gradients reduce in buckets while the last micro-batch's backward runs
  // (PyTorch DDP, Megatron overlap_grad_reduce). false: after it.
  bool overlap_grad_reduce = true;
  // Without ZeRO the stack all-reduces the gradients after the backward
  // (DeepSpeed's engine: backward() ends with allreduce_gradients()), even
  // where overlap_grad_reduce holds for its ZeRO stages (overlap_comm).
  bool zero0_reduce_after_backward = false;
  // The same for ZeRO-1: TorchTitan's FSDP2 under torch's pipeline schedules
  // reduce-scatters each stage's gradients once, after the step's last
  // backward (PipelineStage's post_backward).
  bool zero1_reduce_after_backward = false;
  // Ring collectives across nodes run striped over the node's ports
  // (Cluster::ring_link_for_axis), as NCCL's channels do. false: at one
  // device's port (Cluster::link_for_axis), which is what the 2021-22
  // Megatron-DeepSpeed runs got: Megatron-LM 2021 Table 2's ZeRO-3 rows at
  // 768 and 1536 GPUs are within 3% at one port and 2-4x too fast striped.
  // Why that stack got less is not modelled (docs/planner.md). Rings inside
  // a node cross its islands (Cluster::islands) striped either way.
  bool striped_rings = true;
  // How much slower compute runs while a collective over the node's GPU links
  // overlaps it (NCCL's kernels hold SMs and memory bandwidth the GEMMs would
  // use), as overlap_exposed_s applies it: compute at 1 / (1 + s) of its speed
  // for as long as the communication runs. From Lee et al. 2025
  // ("Characterizing Compute-Communication Overlap in GPU-Accelerated
  // Distributed Deep Learning", arXiv 2507.03114; GPT and LLaMA training on 4
  // A100s, H100s, MI250s, MI210s, so rings over one node's links), whose two
  // averages fix both unknowns of that model: overlapped, the compute takes
  // 1.189x its time alone; one after the other, the step takes 1.102x the
  // overlapped one. So the communication was 1.102 * 1.189 - 1 = 0.310 of the
  // compute, and overlapping it cost 0.189 / 0.310 = 0.61 of its time alone:
  // s / (1 + s) = 0.61, s = 1.56. A ring that moves fewer bytes per second
  // through each GPU slows it proportionally less (overlap_slowdown_on: a
  // ring with one GPU per node, at its NIC, 1/6 of this on H100: 45 of 270
  // GB/s; a model, no source measures it).
  // Applies to the overlaps NCCL runs: the gradients' reduction under the
  // last backward, ZeRO's and FSDP's prefetched gathers and per-layer
  // reduce_scatters, ring attention's shifts. (Before, 0.189 itself was read
  // as this slowdown, which leaves 0.16 of an overlapped collective exposed
  // where the paper's two averages say 0.61: docs/planner.md.)
  double overlap_compute_slowdown = 1.56;
  // The same for tensor-parallel communication a stack overlaps with its
  // GEMMs (tp_comm_overlap: Transformer Engine's userbuffers, TorchTitan's
  // AsyncTP), which move the data with copy engines or a few SMs rather than
  // NCCL's kernels: not measured; the earlier reading of Lee et al.'s
  // per-kernel average (0.189) is kept for it.
  double tp_overlap_compute_slowdown = 0.189;
  // The stack's selective recompute is TorchTitan's op-level SAC
  // (torchtitan/distributed/activation_checkpoint.py, selective_ac_option
  // "op"): inside each block the outputs of the matmuls, the attention and the
  // reduce_scatters are saved, except every second matmul, and everything
  // else is recomputed in the backward (op_sac_matmul_share). false:
  // Megatron-LM's selective recompute, the attention core alone.
  bool selective_is_op_sac = false;
  // Bytes per gradient element in the data-parallel reduction; 0: the compute
  // dtype's. 4 for a stack that reduces in f32 (PyTorch FSDP MixedPrecision
  // with reduce_dtype=float32: Composer's "DEFAULT" mode, TorchTitan's
  // default).
  double grad_reduce_bytes = 0;
  // Bytes per gradient element the stack holds between backward and update;
  // 0: the compute dtype's. 4 where gradients accumulate in f32 (Megatron's
  // main_grad with --accumulate-allreduce-grads-in-fp32, DeepSpeed's
  // BF16_Optimizer): memory only; what crosses the wire is grad_reduce_bytes.
  double grad_accumulation_bytes = 0;
  // Bytes per parameter a pass after every micro-batch's backward moves to
  // add its 16-bit gradients into the f32 ones, part of that micro-batch's
  // backward on every stage; 0: the backward's GEMMs accumulate in place.
  // kBf16OptimizerHpGradPass: DeepSpeed's 2022 BF16_Optimizer, which its
  // pipeline engine calls after each micro-batch (engine.py
  // _exec_backward_pass: optimizer.update_hp_grads, hp_grad.add_(lp.grad
  // .to(float32)) for every parameter of the stage, the f32 copy whole):
  // the 16-bit gradient read (2), the f32 one read and written (4 + 4).
  static constexpr double kBf16OptimizerHpGradPass = 10;
  double hp_grad_pass_bytes = 0;
  // Bytes per parameter a stack holds beside those gradients: where it
  // accumulates into a wider copy and keeps the compute dtype's gradients too
  // (2 for DeepSpeed's 2022 BF16_Optimizer, which adds each backward's bf16
  // gradients into its f32 ones and frees neither: backward(clear_lp_grads=False)).
  double grad_copy_bytes = 0;
  // The f32 master weights a stack keeps whole under ZeRO-1/2, sharding only
  // the optimizer's moments: DeepSpeed's 2022 BF16_Optimizer ("TODO: Need to
  // only track fp32 params of this partition": its flat f32 copy of every
  // parameter, the rank's partition a view of it). false: sharded with the
  // moments (DeepSpeed's ZeRO optimizer, Megatron's distributed optimizer).
  bool whole_master_weights = false;
  // DeepSpeed's ZeRO-1/2 optimizer (stage_1_and_2.py): the f32 gradient
  // partition its step allocates (4 bytes per sharded parameter) and the
  // contiguous reduce bucket (reduce_bucket_size elements in the compute
  // dtype, 5e8 by default). 0: neither (Megatron's distributed optimizer
  // reduces into its grad buffer).
  double zero_grad_partition_bytes = 0;
  double zero_reduce_bucket_elements = 0;
  // ZeRO-3 prefetches the next layer's weight gather (and runs the previous
  // layer's gradient reduce_scatter) while a layer computes, as DeepSpeed
  // stage 3 does; false: the collectives run between the layers' compute.
  bool zero3_prefetch = true;
  // ZeRO-3 with full recompute gathers a layer's weights again for its
  // recomputed forward, then for its backward, as DeepSpeed stage 3 does (its
  // forward hooks fetch and release them around the recompute). false: one
  // gather serves both, as in PyTorch FSDP, whose activation checkpoint sits
  // inside the sharded unit, so the unit's pre-backward unshard holds the
  // weights the recompute and the backward use (llm-foundry, TorchTitan).
  bool zero3_gather_for_recompute = true;
  // ZeRO-2 as PyTorch FSDP's SHARD_GRAD_OP runs it: each unit (a block; the
  // embedding and head as one more) all_gathers its weights right before its
  // forward in every micro-batch and keeps them for the backward, and
  // reduce_scatters its gradients after its backward; per unit, each paying
  // its ring latency, hidden under the unit's compute as ZeRO-3's
  // (zero3_prefetch). False: DeepSpeed's stage 2 (and meshflow's runtime),
  // each micro-batch's gradients reduce_scattered in its backward, the shard
  // accumulated, and the weights gathered once a step.
  bool fsdp_shard_grad_op = false;
  // ZeRO-1/2's weight all_gather after the update runs under the next
  // step's first forward, bucket by bucket as each layer needs its weights
  // (Megatron-LM's --overlap-param-gather with its distributed optimizer):
  // it costs what that forward does not hide, like the gradients'
  // reduce_scatter under the last backward. false: after the update,
  // exposed (DeepSpeed's stage 1 and 2, meshflow's runtime).
  bool overlap_param_gather = false;
  // Bytes of device memory the optimizer step streams per parameter it updates:
  // AdamW reads grad, master weight, m, v (4 x 4) and writes master, m, v (3 x 4),
  // plus the 16-bit weight copy (2) under mixed precision = 30; f32: 28. An
  // optimizer with fewer f32 states (TrainingJob::optimizer_states) streams 8
  // bytes less per state it lacks (CostModel::update_bytes_per_param).
  double adam_bytes_per_param_mixed = 30;
  double adam_bytes_per_param_f32 = 28;
  // The part of device memory a plan may use: the rest goes to the CUDA context,
  // communicator buffers and allocator fragmentation (PyTorch typically reserves
  // 5-10% above allocated).
  double usable_memory_fraction = 0.92;
  // What the stack's caching allocator reserves over the peak of the tensors
  // it holds (PyTorch's max_memory_reserved() over max_memory_allocated()),
  // for stacks that report the reserved peak (TorchTitan logs max_reserved;
  // StepCost::reserved_memory): 1 by default, the tensors' peak. Measured on
  // a lent H200 over one LLaMA-3 8B step (bench/gpu/hopper_kernels.py's step
  // section, docs/cluster.md) under expandable segments, TorchTitan's
  // PYTORCH_CUDA_ALLOC_CONF: 1.063 with the blocks and the loss eager, 1.062
  // with the blocks compiled and the loss eager (TorchTitan of Dec 2024),
  // 1.004 with both compiled (`--emit torchtitan`). The f32 loss's
  // transients are what the allocator keeps. One workload's figures: other
  // shapes fragment differently.
  double allocator_reserved_ratio = 1.0;
  static constexpr double kReservedRatioEager = 1.063;
  static constexpr double kReservedRatioEagerLoss = 1.062;
  static constexpr double kReservedRatioCompiled = 1.004;
  // Fraction of a link's bandwidth a p2p send reaches relative to a ring step
  // (1: the same effective bandwidth as collectives).
  double p2p_efficiency = 1.0;
  // Megatron-LM's scatter/gather optimization: each p2p send carries 1/tp of the
  // activation and the receiver all_gathers it over the tp link (2021 paper, Sec. 4.1).
  bool p2p_scatter_gather = true;
  // The interleaved schedule's p2p runs under the other chunks' compute in its
  // steady 1F1B phase: Megatron-LM's overlap_p2p_comm, on by default for
  // interleaved schedules (--no-overlap-p2p-communication turns it off; it is
  // turned off for the others), its warm-up and flush blocking. Priced as the
  // runtime's schedule with each message an asynchronous delay (SimCosts::p2p)
  // and the compute it runs under slowed as by an overlapped collective on
  // the pipeline's link (overlap_slowdown_on). false: every send blocks the
  // chunk that sends it (DeepSpeed's pipeline engine, PyTorch's pipelining
  // schedules, which wait on each step's batched sends and receives, the
  // 2021 Megatron-LM, meshflow's runtime).
  bool overlap_p2p_interleaved = false;
  MemoryModel memory_model = MemoryModel::kMegatron;
  // Gradient reductions (and ZeRO gathers) as one collective per parameter
  // tensor, each paying its ring latency (meshflow's partitioned program), or
  // bucketed into a few large ones whose latency is negligible (PyTorch DDP,
  // Megatron-LM, DeepSpeed: false).
  bool collective_per_tensor = false;
  // meshflow's runtime: the gradient all_reduces of ZeRO-0 (over the replicas,
  // and over tp for weights replicated across it) run in buckets of
  // grad_bucket_bytes, each started as soon as its gradients are final in the
  // last micro-batch's backward (runtime/grad_buckets.h), whatever
  // collective_per_tensor says of the other collectives. They hide behind the
  // backward only with overlap_grad_reduce: on a CPU the in-process transport's
  // copies and sums run on the cores the backward computes on, so
  // meshflow_cpu_constants counts them whole.
  bool bucketed_grad_all_reduce = false;
  double grad_bucket_bytes = 4 << 20;  // train.bucket_mib
  // Recompute prices what meshflow's recompute pass (autodiff/recompute.h)
  // clones into the backward (full: the forward nodes whose outputs the
  // backward reads, and what they need; selective: the attention core and its
  // layout ops), node by node; false: Megatron-LM's, the whole layer forward
  // (full) or the attention core (selective).
  bool recompute_from_pass = false;
  // The static arena (MemoryModel::kStaticArena) of a ZeRO plan is planned
  // on the ZeRO program itself (one of dp replicas, with the optimizer
  // phase: full gradients kept for its reduce_scatter under ZeRO-1, reduced
  // to shards in the backward under 2 and 3, the gathers after), as
  // meshflow's executor runs it: within 0.4% of the held memory for ZeRO 1,
  // 2 and 3 on 2 ranks, where the arena of the program without ZeRO was off
  // by +14.6%, -6.5% and -7.8% (`meshflow train --check-plan`, 2026-11-26).
  // false (the GPU stacks' default): that program without ZeRO; building the
  // ZeRO program at every dp and micro-batch doubled a ResNet-50 search on
  // 16 GPUs (5.5 s to 11.0 s).
  bool zero_arena_program = false;
  // The gradients are summed over micro-batches outside the program, in f32
  // gradient buckets (meshflow's runtime, runtime/grad_buckets.cc): each
  // micro-batch after the first adds its gradients to the buckets in a pass
  // over memory (read both, write one), the first copies them in, as does a
  // step of one micro-batch whose gradients are reduced over replicas; under
  // ZeRO-2/3 the rank's shard alone (reduce-scattered in the backward).
  // false (the GPU stacks): the backward's GEMMs accumulate into the
  // gradients themselves. A step of 16 micro-batches of one sequence ran
  // 0.15-0.18 s slower than one of 16 sequences on the 2-core VM
  // (2026-11-29); these passes are 21 ms of it (docs/planner.md).
  bool grads_accumulated_in_buckets = false;
  // Host seconds each kernel launch adds to the step when the stack launches
  // synchronously: under CUDA_LAUNCH_BLOCKING=1 a launch returns only when
  // its kernel has finished, so the host's dispatch of the next op (Python,
  // the framework's dispatcher and autograd, the driver) no longer runs while
  // the GPU works. It is added to every kernel of the program priced node by
  // node: a block's forward, backward and recompute, and its collectives. 0:
  // launches are asynchronous, the host runs ahead of the GPU.
  // kBlockingLaunch comes from the one A/B measurement published: BLOOM's
  // Megatron-DeepSpeed on Jean Zay (bigscience tr11-176B-ml
  // chronicles-prequel.md, "dealing with JZ hanging"): 200B, TP=8 PP=10 DP=1,
  // MBS=1, GBS=512 on 80 A100s ran at 91.04 TFLOPs with blocking launches and
  // 97.20 without: 15.07 s more per step (from Narayanan et al.'s Eq. 3
  // FLOPs of that model), about 3.6 ms for each of a stage's 512 x 8 block
  // passes. This model's tp=8 block launches 80 kernels a pass with full
  // recompute (56 forward and backward, 24 recomputed); kBlockingLaunch is
  // the time per launch that prices the same plan 15.07 s slower
  // (tests/plan_launch_test.cc). The same page's two 160-GPU pairs differ by
  // under 0.2%: there, the author wrote, the larger job's communication held
  // the asynchronous runs' host too, which the single replica's did not; so
  // that pair measures the host time every blocking run pays (planner.md,
  // "Synchronous launches").
  static constexpr double kBlockingLaunch = 44.6e-6;
  double blocking_launch_s = 0;
  // How much more the stack's memory-bound ops (norms, rotary embedding,
  // activations, residual adds, the loss) cost than one fused kernel per op
  // of the graph, which is what they are priced at: 1 where a compiler or
  // hand-fused kernels run them (torch.compile, Megatron-LM's and Transformer
  // Engine's fused kernels). PyTorch in eager mode runs each op as the chain
  // of kernels its Python spells (TorchTitan's RMSNorm: upcast, pow, mean,
  // rsqrt, multiply, downcast, scale), each a pass over memory and a launch:
  // kEagerElementwise. Measured on one H100 SXM (PyTorch 2.11,
  // bench/gpu/hopper_kernels.py, docs/cluster.md): a LLaMA-3 8B block's
  // forward and backward over 2 x 8192 tokens took 51.56 ms eager and
  // 44.70 ms compiled; the 3.43 ms per 8192 tokens between them is 1.62
  // times the 2.11 ms this model gives the block's memory-bound ops there
  // (the ops priced here, not the GEMMs' and attention's memory floors).
  static constexpr double kEagerElementwise = 2.62;
  double elementwise_cost = 1.0;
  // The stack runs the model in PyTorch's eager mode (`meshflow plan
  // --eager`, set_eager): elementwise_cost at kEagerElementwise, the tensors
  // the blocks' Python keeps for the backward (layer_activation_bytes) and
  // the eager loss (loss_bytes_per_logit).
  bool eager = false;
  // Bytes per logit (an element of the head's [tokens, vocab / tp] output)
  // the loss holds at its peak in the backward, over what the blocks keep: 8
  // by default, f32 logits and their f32 gradient. Measured on one H200
  // (PyTorch 2.11, bench/gpu/hopper_kernels.py's step section; docs/cluster.md)
  // for TorchTitan's cross_entropy(pred.flatten(0, 1).float(), ...) over
  // 16384 x 128256 logits: eager 11.44 (log_softmax's saved f32 output, the
  // f32 gradients of its output and input, the bf16 one), compiled 3.44
  // (bf16 logits and their gradient in fused kernels: TorchTitan since 2025
  // compiles the loss with the model, as `--emit torchtitan` writes).
  double loss_bytes_per_logit = 8.0;
  static constexpr double kEagerLossBytesPerLogit = 11.44;
  static constexpr double kCompiledLossBytesPerLogit = 3.44;
  // The stack overlaps tensor-parallel communication with the GEMMs it feeds
  // (Megatron-LM's --tp-comm-overlap with Transformer Engine's userbuffers,
  // TorchTitan's AsyncTP): each collective runs in tp chunks, chunk i's
  // transfer under chunk i-1's GEMM, so a block's tp communication costs its
  // first chunk plus whatever the block's compute does not cover. meshflow's
  // runtime does not (false).
  bool tp_comm_overlap = false;
  // Whether tp_comm_overlap covers the backward's collectives too (Transformer
  // Engine's userbuffers overlap the input-gradient GEMMs' all_gathers and
  // reduce_scatters as well). false: the forward's alone (and the recomputed
  // forward's), as TorchTitan's AsyncTP ran them: PyTorch's micro-pipeline TP
  // pass fuses all_gather -> matmul and matmul -> reduce_scatter where the
  // graph spells them so, which its authors measured as a forward speedup of
  // up to 20-29% and 8% end to end on Llama 3 8B and 70B ("Introducing Async
  // Tensor Parallelism in PyTorch", discuss.pytorch.org, 2024): what a forward
  // at 1/2 of a fully recomputed step's compute gains alone.
  bool tp_comm_overlap_backward = true;
  // The stack runs the backward's tensor-parallel collectives asynchronously
  // under the weight-gradient GEMMs (Megatron-LM since 2022:
  // LinearWithGradAccumulationAndAsyncCommunication; Korthikanti et al. 2022
  // §6.2, "we overlap all-reduce communication with the linear weight's
  // gradient computation"; with sequence parallelism the all_gather of the
  // input runs under the input-gradient GEMM and the reduce_scatter under the
  // weight gradient). NCCL's kernels do the moving, so the overlap costs the
  // compute overlap_compute_slowdown on the tp ring (overlap_exposed_s).
  // meshflow's runtime does not (false); tp_comm_overlap covers it.
  bool tp_backward_overlap = false;
  // With TrainingJob::fp8, the stack all-gathers the blocks' linear weights
  // for ZeRO/FSDP in FP8, cast before the gather (TorchTitan's
  // float8.enable_fsdp_float8_all_gather, which `--emit torchtitan --fp8`
  // turns on): 1 byte an element instead of the compute dtype's; the
  // embedding and the head gather in 16-bit.
  bool fp8_weight_gather = false;
  // With TrainingJob::fp8 tensorwise, the stack all-gathers a block's
  // activations over tp in FP8: TorchTitan's enable_float8_tensorwise_tp
  // (on whenever its float8 recipe is tensorwise) casts the sequence-parallel
  // input before its gather (torchao's PrepareFloat8ModuleInput) and the
  // output's gradient before the backward's gather (Float8RowwiseParallel);
  // Transformer Engine quantizes LayerNormLinear's norm output before its
  // gather and the gradient before the backward's (grad_output_preprocess):
  // the tp all_gathers move 1 byte an element, the reduce_scatters 16-bit.
  bool fp8_tp_all_gather = false;
  // With TrainingJob::fp8, the stack casts each block weight to FP8 once a
  // step and reuses it for the step's micro-batches: Transformer Engine's
  // weight cache, which Megatron-Core's schedules drive
  // (set_is_first_microbatch on a step's first micro-batch: quantize and
  // cache; the later ones read the cache). The blocks' GEMMs then cast only
  // their activations and gradients, and the step pays one cast of the
  // stage's block weights (read 2 bytes, write the FP8 copy and its
  // transpose: 4 bytes an element). false: every GEMM casts its operands
  // (TorchTitan's Float8Linear, Composer's TE layers without the flag).
  bool fp8_weight_cache = false;
  // With TrainingJob::fp8_scaling rowwise (torchao's rowwise recipe: every
  // operand scaled per row along the GEMM's reduction axis): the fraction
  // of the per-tensor FP8 rate its GEMMs reach. The forward runs PyTorch's
  // CUTLASS rowwise kernel (90-100% of cuBLAS's per-tensor one for most
  // shapes, down to 50% for some: pytorch/pytorch#147971), the two backward
  // GEMMs cuBLAS's without fast accumulation and the scales applied after
  // (torchao's addmm_float8_unwrapped, pytorch/ao#1325). Fitted once, on
  // torchao's own measurement (torchao/float8/README.md, "Training
  // benchmarks": Llama3-8B on 8 H100s, FSDP2, per-op SAC, batch 1 at 8192:
  // rowwise 6768 tokens/s against tensorwise's 7689.5;
  // bench/fits/torchao_float8_readme.json), not on the public set
  // (docs/planner.md). Each rowwise GEMM also casts both its operands
  // itself (no FP8 copy shared by the two GEMMs that read a tensor, each
  // along its own axis), and FSDP gathers the weights in 16-bit (float8
  // all-gather is tensorwise's alone).
  double fp8_rowwise_gemm_efficiency = 0.89;
};

// The roofline the cost model gives an op of `flops` and `bytes` of memory
// traffic on `c` under `k`: `dtype`'s matmul curve times
// matmul_efficiency_scale against the memory stream (CostModel's, and what
// the calibration measures Device::kernel_time_scale over).
double roofline_time_s(const Cluster& c, const CostConstants& k, DType dtype, double flops,
                       double bytes);

// The bytes ring attention's CPU kernels (kernels/cpu/ring_attention.cc)
// move on a rank beyond the one-rank kernel's, per call, f32: forward, the
// k/v block packed for the ring (read and written), the output zeroed, and
// each of the ring - 1 blocks received copied in on this rank's thread (the
// in-process transport's receiver copies); backward, dq and each step's
// share zeroed, the k/v block packed and received as in the forward, each
// arriving dk/dv accumulator added in (two reads, a write) and received, and
// the rank's own copied out. 0 for a node that is not a ring.
double ring_attention_pass_bytes(const Graph& g, const Node& n);

// PyTorch in eager mode (`meshflow plan --eager`, a plan file's plan.eager):
// CostConstants::eager with its time (elementwise_cost) and loss memory.
void set_eager(CostConstants* k);
// The stack launches synchronously (`meshflow plan --launch-blocking`, a plan
// file's plan.launch_blocking): blocking_launch_s at kBlockingLaunch.
void set_launch_blocking(CostConstants* k);

// The software stack of Narayanan et al. 2021 (the published Table 1 runs):
// unfused attention with materialized scores, gradients reduced after the
// pipeline flush (no overlap). The fitted constant is the default's.
CostConstants megatron2021_constants();

// meshflow's own CPU runtime on a calibrated cluster (configs/clusters/local_cpu.json,
// shared among in-process ranks with share_machine): matmul_efficiency_scale
// 0.92, this stack's one fit (training GEMMs against the calibration's
// best-of-N SGEMM rate, fitted once on a kernel profile; see the .cc); memory
// from the static arena; gradient reductions and ZeRO gathers run as
// collective nodes of the program, one per parameter tensor, after the
// backward (no overlap, no prefetch); f32 AdamW (28 B/param).
CostConstants meshflow_cpu_constants();

// The stack's attention kernel by name, as `meshflow plan --attention` and a
// plan file's "plan.attention" give it: "materialized", "fused" (=
// "flash2", FlashAttention-2) or a fused kernel `cluster` lists in
// device.attention_efficiency. Sets k->attention and k->fused_attention; an
// unknown name is an error listing the valid ones (`what` names the input).
Status set_attention_kernel(const std::string& name, const Cluster& cluster,
                            const std::string& what, CostConstants* k);

// Bytes per device, for the worst pipeline stage.
struct MemoryBreakdown {
  double params = 0;
  double grads = 0;
  double optimizer = 0;
  double activations = 0;
  double temporaries = 0;
  double total = 0;
  // Plan::offload: the optimizer state per device kept on the host or NVMe
  // instead (not in total; optimizer is then 0).
  double offloaded = 0;
  // The optimizer state moved off the device (Plan::offload).
  void offload_optimizer() {
    offloaded = optimizer;
    total -= optimizer;
    optimizer = 0;
  }
};

// Bytes one device sends per step (the full buffer of each collective it joins).
struct CommBreakdown {
  double tensor_parallel = 0;   // tp all_reduce / all_gather + reduce_scatter
  double context_parallel = 0;  // cp K/V all_gather + reduce_scatter
  double pipeline = 0;          // p2p activations and gradients
  double data_parallel = 0;     // gradient reduce, ZeRO gathers
  double offload = 0;  // over PCIe (and to NVMe) for Plan::offload; not network, not in total()
  double total() const { return tensor_parallel + context_parallel + pipeline + data_parallel; }
};

// One micro-batch through one pipeline stage (all its layers; a chunk is 1/vp of it).
struct StageTimes {
  double forward_s = 0;      // F, with its tp/cp collectives and the embedding/head
  double backward_s = 0;     // B: input gradients (+ recompute), with collectives
  double weight_grad_s = 0;  // W: weight gradients
  double recompute_s = 0;    // the part of B that is recompute
  double tp_comm_s = 0;      // the part of F + B that is tp collectives
  double cp_comm_s = 0;      // the part of F + B that is cp collectives
  double p2p_s = 0;          // one send of an activation (or its gradient) to the next stage
};

struct StepCost {
  Plan plan;
  double step_time_s = 0;
  // Where the step goes, on the slowest stage; sums to step_time_s.
  double compute_s = 0;  // m x (F + B + W) less the collectives and recompute in them
  double recompute_s = 0;
  double tp_comm_s = 0;
  double cp_comm_s = 0;
  double pp_comm_s = 0;  // exposed p2p
  double bubble_s = 0;
  double dp_comm_s = 0;  // exposed gradient reduce / ZeRO gathers
  double optimizer_s = 0;
  StageTimes stage;  // per micro-batch, the slowest stage
  // A pipeline's per-chunk costs its schedule was simulated with (each
  // message on the action that sends it, or with the interleaved schedule's
  // p2p overlapped a delay of its own): what simulate_step draws.
  SimCosts pipeline_costs;
  MemoryBreakdown memory;  // the device with the most (a pipeline's worst stage)
  CommBreakdown comm;
  bool fits = false;  // memory.total <= usable device memory
  double usable_memory = 0;
  // memory.total x CostConstants::allocator_reserved_ratio: the peak the
  // stack's allocator reports reserved.
  double reserved_memory = 0;
  double tokens_per_s = 0;
  double model_flops = 0;     // per step: 3 x forward FLOPs (no recompute), all devices
  double hardware_flops = 0;  // per step, counting recompute (Megatron's convention)
  double tflops_per_gpu = 0;  // hardware_flops / step / devices / 1e12
  double mfu = 0;             // model_flops / step / (devices x peak)
};

// The priced forward/backward of one transformer block (or of what lies
// outside the blocks: embedding, final norm, head, loss) per micro-batch, read
// off the rank's program (plan/rank_program.h). Compute times exclude the
// collectives; the collectives the partitioner put in the block are priced
// apart on the link of their mesh axis. A model without blocks (the MLP) is
// all "head".
struct LayerCost {
  double forward_s = 0, backward_s = 0, weight_grad_s = 0;  // compute
  // The block's collectives by mesh axis (tp; cp: Ulysses' all_to_alls).
  double tp_fwd_s = 0, tp_bwd_s = 0, cp_fwd_s = 0, cp_bwd_s = 0;
  double tp_fwd_bytes = 0, tp_bwd_bytes = 0, cp_fwd_bytes = 0, cp_bwd_bytes = 0;  // sent per rank
  double attention_core_s = 0;  // forward of the attention op (selective recompute)
  double forward_matmul_s = 0;  // forward of the block's matmuls (op-level SAC)
  double recompute_full_s = 0, recompute_selective_s = 0;  // recompute_from_pass: the clones
  // A model without blocks under full recompute (a ResNet's residual layers,
  // every one recomputing): its whole program's clones, their compute and
  // their collectives over tp and over cp, in the head's backward. Set by
  // price() for such a plan (whole_recompute), 0 otherwise.
  double head_recompute_s = 0, head_recompute_tp_s = 0, head_recompute_cp_s = 0;
  // Outside the blocks, collectives included; *_comm_s / *_comm_bytes: theirs.
  double embed_fwd_s = 0, embed_bwd_s = 0;                  // before the first block
  double head_fwd_s = 0, head_bwd_s = 0, head_wgrad_s = 0;  // after the last block
  // (seconds: all collectives; bytes: over tp, and over cp in outside_cp_bytes)
  double embed_comm_s = 0, head_comm_s = 0, embed_comm_bytes = 0, head_comm_bytes = 0;
  // Of those times, the collectives over cp (a ResNet's height halos live in its "head").
  double embed_cp_comm_s = 0, head_cp_comm_s = 0;
  double outside_cp_bytes = 0;
  // The optimizer phase's collectives, once per step: the block's and the rest's.
  double opt_comm_s = 0, opt_comm_outside_s = 0, opt_comm_bytes = 0, opt_comm_outside_bytes = 0;
  // Of those, the gradient all_reduces over tp the runtime runs in buckets
  // (bucketed_grad_all_reduce; weights replicated over tp): their buffer bytes,
  // priced with the data-parallel buckets instead (not in opt_comm_*).
  double opt_bucketed_tp_bytes = 0, opt_bucketed_tp_outside_bytes = 0;
  // The parameters whose gradients are Partial over cp (all_reduced over it):
  // every one under the templates; under per-operator strategies not those
  // the search split over cp, which reduce over dp alone.
  double opt_cp_params = 0, opt_cp_params_outside = 0;
  // Gradients the program reduces through all_reduce chains, which the
  // runtime runs in persistent buckets (runtime/grad_buckets.h).
  int grad_chains = 0;
  int64_t layer_params = 0;  // per rank
  int64_t embed_params = 0;  // per rank (word + position table)
  int64_t head_params = 0;  // per rank (final norm + lm_head; everything of a model without blocks)
  int layer_param_tensors = 0, embed_param_tensors = 0, head_param_tensors = 0;
  double input_bytes = 0;  // the data one micro-batch feeds the rank (inputs of the program)
  int nodes = 0;           // compute nodes priced (forward + backward of the program)
  int collectives = 0;     // collective nodes priced
  // Kernels one block launches per micro-batch (its compute nodes and
  // collectives, forward and backward, without recompute).
  int block_launches = 0;
};

// One pipeline chunk of a model without uniform blocks (a ResNet, whose
// residual layers differ in width and resolution): a chunk of the runtime's
// own split of the rank program (pipeline/stage_graph.h: split_pipeline with
// balanced_layers, as the pipeline trainer splits it), priced node by node.
struct ChunkCost {
  int first_layer = 0, num_layers = 0;  // its blocks
  // One micro-batch: F, B (the input-gradient nodes, with the backward's
  // collectives), W (split_pipeline's weight-gradient nodes), and of those
  // the tp and cp collectives; p2p_s is not set.
  StageTimes times;
  double tp_bytes = 0, cp_bytes = 0;  // collectives' bytes sent per micro-batch
  double act_bytes = 0;               // the activations sent to the next chunk (compute dtype)
  int64_t params = 0;                 // per rank
  // Of those, tied copies (the head's copy of a tied embedding): weights
  // only, the owner chunk keeps their gradient and optimizer state.
  int64_t copied_params = 0;
  int param_tensors = 0;
  // The optimizer phase's collectives over tp (LayerCost::opt_*), once per step.
  double opt_comm_s = 0, opt_comm_bytes = 0, opt_bucketed_tp_bytes = 0;
  double arena_bytes = 0;  // the chunk executor's arena (static memory planner)
  // Of the arena, the values kept readable to the end of a run
  // (ChunkProgram::keep_alive): the messages out (activations, gradients)
  // and the stashes.
  double kept_bytes = 0, act_out_bytes = 0, grad_out_bytes = 0;
  double stash_bytes = 0;        // per micro-batch from F to B (Bi when split)
  double weight_hold_bytes = 0;  // split backward: from Bi to W
  double input_bytes = 0;        // fed per micro-batch: data, received activations and gradients
  // The pipeline trainer's stash copies per micro-batch (a copy reads and
  // writes its bytes): F saves the entries it does not write in place
  // (ChunkProgram::stash_in_place: fed inputs, messages, the loss) out of the
  // executor's arena, which the next micro-batch reuses; B copies them back
  // (restore_s). Split, Bi copies back those it reads and saves the values W
  // reads, and W copies back those and its forward ones (bi_copy_s, w_copy_s).
  double save_s = 0, restore_s = 0, bi_copy_s = 0, w_copy_s = 0;
  // times with the copies the schedule's actions make (split: zb-h1, zb-v).
  StageTimes with_copies(bool split) const;
};

class CostModel {
 public:
  // `cluster` must have at least as many devices as the plans priced use;
  // collectives choose links by the mesh order above.
  CostModel(TrainingJob job, Cluster cluster, CostConstants constants = {});

  const TrainingJob& job() const { return job_; }
  const Cluster& cluster() const { return cluster_; }
  const CostConstants& constants() const { return k_; }
  const TransformerDims& dims() const { return dims_; }
  DType compute_dtype() const { return dtype_; }
  // An error when seq exceeds a language model's maximum or the batch is < 1.
  const Status& status() const { return status_; }
  // A transformer LM (dims() filled); false: a model without blocks (the MLP),
  // priced whole on one stage (no pp, cp or sp).
  bool has_blocks() const { return dims_.layers > 0; }

  // Why `p` is not a valid plan for this job ("" when it is).
  std::string invalid_reason(const Plan& p) const;
  // How price() times the pipeline. kSimulated: the runtime's own schedule
  // (pipeline/schedule.h: the action lists the pipeline engine executes) run
  // by its simulator with this plan's per-action costs; what every reported
  // figure uses. kClosedForm: the schedule's textbook formula (the same for
  // GPipe and 1F1B with uniform stages), which the search sweeps with and then
  // re-prices its leaders by simulation.
  enum class PipelineModel { kSimulated, kClosedForm };
  // The cost of a valid plan (errors say why a plan is invalid).
  Result<StepCost> price(const Plan& p, PipelineModel model = PipelineModel::kSimulated) const;
  // One block's cost at these local shapes (the rank program built and priced
  // once per (tp, cp, micro_batch, sp), then cached, errors included).
  Result<LayerCost> layer_cost(int64_t tp, int64_t cp, int64_t micro_batch, bool sp = false,
                               bool ops = false, bool ring = false) const;
  // The per-operator strategy search (parallel/strategy_search.h) of this
  // job's program at micro-batch `micro_batch` on the tp and cp axes of a
  // dp x tp x cp mesh: compute priced by this model's roofline, reshards on
  // the cluster's links for those axes, attention's sequence split over cp
  // only (ring attention, the program in zigzag order), the device's usable
  // memory as the budget. Solved once per (tp, cp, micro_batch), then cached
  // (errors included).
  Result<std::shared_ptr<const StrategySearch>> op_search(int64_t tp, int64_t cp,
                                                          int64_t micro_batch) const;
  // From now on op_search answers `given` (split tuples written by hand,
  // StrategySearch::fixed) at every shape: this model then prices the user's
  // own per-operator plan.
  void fix_strategies(std::shared_ptr<const StrategySearch> given) {
    fixed_ops_ = std::move(given);
  }
  // op_search's solves end by this time (meshflow plan --time-limit): each
  // CBC solve stops at the sooner of its own 20 s and this, returning its
  // best assignment with its gap, and none starts past it (an error, and
  // the template plans stand). Default: none.
  void set_op_search_deadline(std::chrono::steady_clock::time_point t) { op_deadline_ = t; }
  // The partitioner's strategy for a rank program is chosen once per
  // (degrees, recompute, blocks) and lowered at every micro-batch priced
  // (the search's sweep: annotating is most of a rank program's cost). A run
  // annotates at its own micro-batch, and the partitioner's choices weigh
  // sizes that grow with it (a table against its tokens, a weight against its
  // activations), so a plan priced after another micro-batch may be priced
  // with a strategy its run does not choose (GPT-3 175B, megatron-sp tp=8:
  // micro-batch 16 after 1 at 39.48 s, 39.28 s as its run annotates; 0.5%).
  // With exact strategies every micro-batch is annotated as its run is; a
  // model that prices one plan (plan --check, simulate) is exact either way.
  void set_exact_strategies(bool exact) { exact_strategies_ = exact; }
  bool exact_strategies() const { return exact_strategies_; }
  // A model of the same job, cluster and constants with exact strategies,
  // answering op_search as this one has (its solves, fix_strategies, the
  // deadline): the search re-prices its leaders with it.
  std::unique_ptr<CostModel> exact_model() const;
  // The rank program the planner prices (plan/rank_program.h), with the
  // cluster's links for the reshard planner.
  Result<LocalProgram> rank_program(const RankShape& s) const;
  // MemoryModel::kStaticArena: bytes of the executor's arena for one rank's
  // program of `layers` blocks (+ embedding, head, loss) at the plan's local
  // shapes and recompute policy: the static memory planner run over the local
  // program of one and of two blocks, extrapolated linearly (planned once per
  // (tp, cp, micro_batch, sp, recompute), then cached).
  Result<double> arena_bytes(const Plan& p, int64_t layers) const;

  // The chunks the pipeline runtime splits a model without uniform blocks (a
  // ResNet) into, `chunks` = pp x vp of them, priced at these local shapes
  // (built and split once per (tp, cp, micro_batch, chunks), then cached).
  // `recompute_first` > 0 under full recompute: only the first that many
  // blocks of each chunk recompute (Plan::recompute_layers).
  // Errors: the model has fewer blocks than chunks, or its program does not
  // partition at these degrees.
  Result<std::vector<ChunkCost>> chunk_costs(int64_t tp, int64_t cp, int64_t micro_batch,
                                             int64_t chunks, bool sp = false,
                                             Recompute recompute = Recompute::kNone,
                                             const std::vector<int64_t>& layers = {},
                                             std::shared_ptr<const StrategySearch> ops = {},
                                             bool ring = false, int64_t recompute_first = 0) const;
  // Blocks per stage for p's pipeline chosen by time and memory together:
  // the split that minimizes the slowest stage's work per micro-batch with
  // every stage's predicted peak within the device's usable memory (a 1F1B
  // pipeline's first stages hold more micro-batches in flight, the first
  // stage the embedding, the last the head and its logits). For a chain of
  // identical blocks the stage's time and memory are linear in its blocks,
  // so a bisection on the slowest stage's time with each stage taking what
  // fits is exact. A pipeline priced by chunk (meshflow's executor, any
  // model; vp = 1) is split from its blocks priced one by one: a dynamic
  // program over contiguous splits minimizes the slowest stage's time, then
  // the largest share of the memory budget a stage uses, with each stage's
  // memory taken as its blocks' model states and stashes (times the
  // micro-batches its schedule keeps in flight) and its largest block's
  // arena; the split is then priced whole, and a stage the estimate let past
  // its device gets a budget lowered by the excess (a few rounds). Empty when
  // no split fits.
  Result<std::vector<int64_t>> stage_split(const Plan& p) const;
  // Whether price() times p's pipeline by the runtime's split of the whole
  // program, chunk by chunk (meshflow's executor: the static-arena memory
  // model, or a model without uniform blocks), rather than by identical blocks.
  bool prices_by_chunk(const Plan& p) const {
    return p.pp > 1 && (!has_blocks() || k_.memory_model == MemoryModel::kStaticArena);
  }
  // The blocks a pipeline splits: a language model's transformer blocks, a
  // ResNet's residual layers; 0 for a model that cannot be pipelined (the MLP).
  int64_t pipeline_layers() const { return pipeline_layers_; }

  // Every pipeline stage's memory for a valid plan, stage 0 first (the
  // largest is price()'s memory); empty for pp = 1.
  Result<std::vector<MemoryBreakdown>> memory_by_stage(const Plan& p) const;

  // Parameters of the whole model (all stages, unsharded).
  int64_t num_parameters() const;
  // Model FLOPs per token (3 x forward, attention at full seq x seq).
  double model_flops_per_token() const;

  // What `comm` seconds of communication overlapped with `compute` seconds of
  // compute add to the compute: the compute runs `slowdown` slower while the
  // communication runs, so comm - compute once the communication outlasts the
  // slowed compute, else comm * s / (1 + s).
  static double overlap_exposed_s(double comm, double compute, double slowdown);
  // The slowdown of compute under a collective on `link`:
  // CostConstants::overlap_compute_slowdown for a ring over the node's GPU
  // links, scaled by the link's effective bandwidth relative to theirs (a
  // ring striped over k NICs per node: k NICs' worth, at most 1; one GPU per node: one
  // NIC's), as NCCL's kernels copy at the rate the link takes.
  double overlap_slowdown_on(const Link& link) const;

 private:
  // Seconds of `flops` of matmul work (the cluster curve x matmul_efficiency_scale,
  // x `shape_factor`: Cluster::matmul_shape_factor of the GEMM's sizes), and
  // the roofline of an op with that compute and `bytes` of memory traffic.
  double compute_time_s(double flops, double shape_factor = 1.0) const;
  // Bytes the optimizer step streams per parameter it updates (CostConstants'
  // AdamW figure, less 8 per f32 state the job's optimizer lacks), and the
  // bytes of its f32 state (with the master weight under mixed precision).
  double update_bytes_per_param(bool mixed) const;
  double optimizer_state_bytes_per_param(bool mixed) const;
  // One node of a local program: roofline, attention by the kernel in use.
  double node_time_s(const Graph& g, const Node& n) const;
  // One collective node of a rank program: collective_time_s of its buffer
  // (in the compute dtype) on the link its mesh axis maps to under plan `p`.
  // Sets *bytes to what the rank sends, *axis to the mesh axis name.
  double collective_node_time_s(const Graph& g, const Mesh& mesh, const Node& n, const Plan& p,
                                double* bytes, std::string* axis) const;
  // Adds the cost of a program's nodes (on `mesh`, priced under `p`'s links)
  // to parts[part[i]] (parts[0] for every node when `part` is empty):
  // compute as F, B or W (`weight_grad`), collectives by mesh axis,
  // parameters, fed inputs.
  void price_nodes(const Graph& g, const Mesh& mesh, const Plan& p,
                   const std::vector<bool>& weight_grad, const std::vector<uint8_t>& part,
                   NodeTotals* parts) const;
  // The same for a collective of `kind` over `group` ranks of mesh axis
  // `axis` moving a buffer of `buffer_bytes` (a node's, or one a kernel runs).
  double collective_time_on(OpKind kind, int64_t group, double buffer_bytes,
                            const std::string& axis, const Plan& p, double* bytes) const;
  double roofline_time_s(double flops, double bytes) const;
  // The parts of price(), in order (cost_model.cc).
  // The most blocks a stage holds; per stage (Plan::layers_per_stage, or
  // that most on every stage when balanced).
  int64_t blocks_per_stage(const Plan& p) const;
  std::vector<int64_t> stage_blocks(const Plan& p) const;
  // One micro-batch's F, B, W on pipeline stage `stage` holding `blocks`
  // blocks (the embedding on the first, the head on the last).
  StageTimes stage_times(const Plan& p, const LayerCost& lc, int64_t stage, double blocks) const;
  StageTimes slowest_stage(const Plan& p, const LayerCost& lc, double* p2p_bytes) const;
  Result<double> pipeline_time(const Plan& p, const StageTimes& st, PipelineModel model,
                               StepCost* r) const;
  // The makespan of the runtime's schedule for p's micro-batches, simulated
  // with `costs` (chunk_sim_costs).
  Result<double> simulated_pipeline_s(const Plan& p, const SimCosts& costs) const;
  // One chunk's simulated F, B, W (1/vp of the stage, each F and Bi carrying its message).
  // On time-shared cores (Cluster::shared_cores) the simulation runs them so.
  SimCosts chunk_sim_costs(const Plan& p, const StageTimes& st) const;
  // CostConstants::overlap_p2p_interleaved applies to p.
  bool p2p_overlapped(const Plan& p) const;
  // What a chunk's `compute` seconds lose to a message of `p2p` seconds
  // running under them on the pipeline's link (the overlapped collectives'
  // slowdown, overlap_slowdown_on); the rest of the message is a delay.
  double p2p_under_compute_s(const Plan& p, double compute, double p2p) const;
  // Parameters per device on stage `stage` holding `blocks` blocks; the most
  // over the plan's stages.
  double stage_params(const Plan& p, const LayerCost& lc, int64_t stage, double blocks) const;
  double most_stage_params(const Plan& p, const LayerCost& lc) const;
  // The share of a stage's parameters (holding `blocks` blocks) replicated
  // over cp, whose gradients reduce and whose ZeRO shards split over dp * cp;
  // the rest (per-operator strategies that split them over cp) over dp alone.
  double cp_replicated_share(const Plan& p, const LayerCost& lc, double blocks) const;
  double data_parallel_time(const Plan& p, const LayerCost& lc, const StageTimes& st,
                            double p_stage, double* bytes) const;
  // The link a ring collective over `size` ranks `stride` apart runs at
  // (striped across nodes when CostConstants::striped_rings).
  Link ring_link(int64_t size, int64_t stride) const;
  // The link collective_time_on prices a `kind` over `group` ranks of `axis`
  // at: ring_link for a ring collective, else the axis's slowest link.
  Link collective_link(OpKind kind, int64_t group, const std::string& axis, const Plan& p) const;
  // Activation bytes one block keeps per micro-batch (MemoryModel::kMegatron):
  // Korthikanti's count for the template layouts; for a per-operator plan
  // that count at the Megatron layout scaled by the ratio of the two rank
  // programs' stashed forward values per block.
  Result<double> layer_activations(const Plan& p) const;
  Result<bool> grads_in_buckets(const Plan& p, const LayerCost& lc) const;
  Result<MemoryBreakdown> stage_memory(const Plan& p, const LayerCost& lc, int64_t stage,
                                       double blocks) const;
  // The worst stage's; *stages (when given) gets every stage's.
  Result<MemoryBreakdown> memory_per_device(const Plan& p, const LayerCost& lc,
                                            std::vector<MemoryBreakdown>* stages = nullptr) const;
  // A pipeline of priced chunks (a ResNet's): *st, the slowest rank's chunks
  // summed; *lc, the rank with the most parameters as a model without blocks
  // (its parameters, optimizer collectives and collective bytes as the
  // "head"); *p2p_bytes, the largest activation a chunk sends.
  void stages_from_chunks(const Plan& p, const std::vector<ChunkCost>& chunks, StageTimes* st,
                          LayerCost* lc, double* p2p_bytes) const;
  // Bytes per device of every rank: its chunks' model states, arenas, and
  // the most stash bytes its schedule holds at once (simulated with each
  // chunk's stash; the order zb-v makes for the chunk times st). And one
  // rank's memory from its chunks' totals and that stash.
  Result<std::vector<MemoryBreakdown>> memory_by_rank(const Plan& p,
                                                      const std::vector<ChunkCost>& chunks,
                                                      const StageTimes& st) const;
  MemoryBreakdown chunk_rank_memory(const Plan& p, double params, double copied, double arena,
                                    double inputs, double bucketed_tp, double stash) const;
  // stage_split for a pipeline priced by chunk (cost_model_pipeline.cc).
  Result<std::vector<int64_t>> chunk_stage_split(const Plan& p) const;
  // layer_cost without the cache.
  Result<LayerCost> price_program(int64_t tp, int64_t cp, int64_t micro_batch, bool sp, bool ops,
                                  bool ring) const;
  // A model without blocks under full recompute: what the recompute pass
  // clones into its whole program's backward (every block, or a ResNet's
  // first p.recompute_layers residual layers), {compute, tp collectives, cp
  // collectives} in seconds per micro-batch (LayerCost::head_recompute_*).
  Result<std::array<double, 3>> whole_recompute(const Plan& p,
                                                std::shared_ptr<const StrategySearch> ops) const;

  TrainingJob job_;
  Cluster cluster_;
  CostConstants k_;
  TransformerDims dims_;
  DType dtype_ = DType::F32;
  int64_t num_parameters_ = 0;
  double forward_flops_per_token_ = 0;
  Status status_;
  mutable std::mutex mu_;
  mutable std::map<std::tuple<int64_t, int64_t, int64_t, int>,
                   std::shared_ptr<const Result<LayerCost>>>
      cache_;
  // (tp, micro_batch) -> a per-operator plan's stashed activations per block
  // over the Megatron layout's (layer_activations).
  mutable std::map<std::tuple<int64_t, int64_t, int64_t>, double> stash_ratio_cache_;
  // (tp, micro_batch) -> the strategy search's answer.
  // A future: the first thread to ask solves, the others wait for its answer.
  mutable std::map<std::tuple<int64_t, int64_t, int64_t>,
                   std::shared_future<Result<std::shared_ptr<const StrategySearch>>>>
      op_search_cache_;
  std::shared_ptr<const StrategySearch> fixed_ops_;  // fix_strategies
  bool exact_strategies_ = false;                    // set_exact_strategies
  // The reshard planner's answers, kept across the rank programs lowered.
  std::shared_ptr<ReshardPlanCaches> reshard_plans_ = std::make_shared<ReshardPlanCaches>();
  std::chrono::steady_clock::time_point op_deadline_ = std::chrono::steady_clock::time_point::max();
  // (tp, cp, sp, recompute + flags + zero, blocks, ops, dp under ZeRO, the
  // blocks that recompute, micro_batch) -> the partitioner's strategy for the
  // rank program (rank_program: shared by the programs that differ only in
  // what the strategy does not read).
  mutable std::map<std::tuple<int64_t, int64_t, bool, int, int64_t, const StrategySearch*, int64_t,
                              std::vector<int>, int64_t>,
                   std::shared_ptr<const Annotation>>
      strategy_cache_;
  // (tp, cp, micro_batch, sp, recompute, zero, dp under ZeRO) -> arena bytes of
  // one and of two blocks (recompute 3: two blocks, the first recomputing).
  mutable std::map<std::tuple<int64_t, int64_t, int64_t, int, int, int, int64_t>,
                   std::pair<double, double>>
      arena_cache_;
  // (tp, cp, micro_batch, chunks, sp + 2 x recompute, layers, ops) -> the priced chunks.
  mutable std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int, std::vector<int64_t>,
                              const StrategySearch*>,
                   std::shared_ptr<const Result<std::vector<ChunkCost>>>>
      chunk_cache_;
  // (tp, cp, micro_batch, sp + 2 x recompute, ops, the blocks that recompute)
  // -> the program chunk_costs splits.
  mutable std::map<
      std::tuple<int64_t, int64_t, int64_t, int, const StrategySearch*, std::vector<int>>,
      std::shared_ptr<const LocalProgram>>
      pipeline_programs_;
  // (tp, cp, micro_batch, ring, ops, recompute_layers) -> whole_recompute's answer.
  mutable std::map<std::tuple<int64_t, int64_t, int64_t, bool, const StrategySearch*, int64_t>,
                   std::array<double, 3>>
      whole_recompute_cache_;
  int64_t pipeline_layers_ = 0;
};

// The executor's arena for a local program (runtime/executor.cc): sources
// have their own storage, the loss, the parameter gradients and `kept` stay
// alive to the end, everything else is planned over the graph order.
double static_arena_bytes(const Graph& g, const std::vector<ValueId>& kept = {});

// Activation bytes one layer keeps for one micro-batch (Korthikanti et al. 2022,
// generalized to the model's ffn and kv heads; see docs/planner.md). With
// `op_sac`, selective recompute keeps what TorchTitan's op-level SAC saves
// (CostConstants::selective_is_op_sac); with `eager`, what PyTorch's eager
// mode keeps of a LLaMA block as TorchTitan writes it (CostConstants::eager).
double layer_activation_bytes(const TransformerDims& d, const Plan& p, int64_t seq,
                              AttentionKernel attention, double act_bytes, bool op_sac = false,
                              bool eager = false);

// TorchTitan's op-level SAC recomputes every second matmul of a block, in
// forward order: of a LLaMA block's wq, wk, wv, wo, w1, w3, w2 the wk, wo and
// w3; of a GPT block's qkv, proj, fc1, fc2 the proj and fc2. The parameters of
// those (per block, unsharded) and their share of the block's matmul FLOPs.
double op_sac_recomputed_params(const TransformerDims& d);
double op_sac_matmul_share(const TransformerDims& d);

}  // namespace meshflow::plan
