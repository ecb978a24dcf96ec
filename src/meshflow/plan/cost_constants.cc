// The stacks' constants: CostConstants presets (megatron2021_constants,
// meshflow_cpu_constants) and the setters the CLI and the plan file use
// (set_eager, set_launch_blocking, set_attention_kernel). The constants are documented
// where they are declared, in cost_model.h.
#include <string>

#include "meshflow/plan/cost_model.h"

namespace meshflow::plan {

void set_eager(CostConstants* k) {
  k->eager = true;
  k->elementwise_cost = CostConstants::kEagerElementwise;
  k->loss_bytes_per_logit = CostConstants::kEagerLossBytesPerLogit;
  // A stack that reports the allocator's reserved peak reports eager's.
  if (k->allocator_reserved_ratio > 1)
    k->allocator_reserved_ratio = CostConstants::kReservedRatioEager;
}

void set_launch_blocking(CostConstants* k) {
  k->blocking_launch_s = CostConstants::kBlockingLaunch;
}

CostConstants megatron2021_constants() {
  CostConstants k;
  k.attention = AttentionKernel::kMaterialized;
  k.overlap_grad_reduce = false;
  k.striped_rings = false;
  return k;
}

CostConstants meshflow_cpu_constants() {
  CostConstants k;
  // The CPU stack's fitted constant (the A100 fit's counterpart, fitted once):
  // training GEMMs inside a step reach 0.92 of the calibration's best-of-N
  // rate at their size (cold caches, transposed and skinny operands). Fitted on
  // one kernel profile, not on step times: `bench/plan_accuracy --profile
  // --only dp1` on configs/clusters/local_cpu.json, matmul kernels 147.4 ms
  // against 134.9 ms of roofline at scale 1 (dp2: 145.1, dp4: 144.3).
  k.matmul_efficiency_scale = 0.92;
  k.overlap_grad_reduce = false;
  k.zero3_prefetch = false;
  k.collective_per_tensor = true;
  k.bucketed_grad_all_reduce = true;
  k.attention = AttentionKernel::kBlockedCpu;
  k.recompute_from_pass = true;
  k.memory_model = MemoryModel::kStaticArena;
  k.zero_arena_program = true;
  k.grads_accumulated_in_buckets = true;
  // The in-process transport's overlap (ring attention's shifts) is not
  // measured against the CPU kernels; the GPU figure is not carried over.
  k.overlap_compute_slowdown = 0;
  k.tp_overlap_compute_slowdown = 0;
  return k;
}

Status set_attention_kernel(const std::string& name, const Cluster& cluster,
                            const std::string& what, CostConstants* k) {
  if (name == "materialized") {
    k->attention = AttentionKernel::kMaterialized;
    return Status::ok();
  }
  const auto& listed = cluster.device.attention_efficiency;
  if (name == "fused" || name == "flash2" || listed.count(name)) {
    k->attention = AttentionKernel::kFused;
    k->fused_attention = name == "fused" ? "flash2" : name;
    return Status::ok();
  }
  std::string valid = "fused, flash2";
  for (const auto& [kernel, e] : listed)
    if (kernel != "flash2") valid += ", " + kernel;
  return Status::invalid(what + " must be materialized or a fused kernel (" + valid +
                         ": the cluster file's device.attention_efficiency), got '" + name + "'");
}

}  // namespace meshflow::plan
