// The data-parallel part of a step's price: the gradients' reduction (and
// ZeRO's gathers) over the dp * cp replicas, and what communication
// overlapped with compute adds to it (CostConstants::overlap_compute_slowdown).
// Members of CostModel (plan/cost_model.h), apart from cost_model.cc for size.
#include <algorithm>
#include <cmath>

#include "meshflow/plan/cost_model.h"
#include "meshflow/plan/rank_program.h"

namespace meshflow::plan {

double CostModel::cp_replicated_share(const Plan& p, const LayerCost& lc, double blocks) const {
  if (!p.ops || p.cp <= 1) return 1.0;  // the templates: every weight whole over cp
  const double all = blocks * double(lc.layer_params) + double(lc.embed_params + lc.head_params);
  const double over_cp = blocks * lc.opt_cp_params + lc.opt_cp_params_outside;
  return all > 0 ? std::clamp(over_cp / all, 0.0, 1.0) : 1.0;
}

double CostModel::overlap_exposed_s(double comm, double compute, double slowdown) {
  const double s = std::max(slowdown, 0.0);
  if (comm <= 0) return 0;
  if (comm >= compute * (1 + s)) return comm - compute;
  return comm * s / (1 + s);
}

double CostModel::overlap_slowdown_on(const Link& link) const {
  const double nvlink = cluster_.intra_node.effective_bandwidth();
  const double share = nvlink > 0 ? std::min(link.effective_bandwidth() / nvlink, 1.0) : 1.0;
  return k_.overlap_compute_slowdown * share;
}

// The exposed time of the gradients' reduction (and ZeRO's gathers) over the
// dp * cp replicas; *bytes: what a device sends for it per step.
double CostModel::data_parallel_time(const Plan& p, const LayerCost& lc, const StageTimes& st,
                                     double p_stage, double* bytes) const {
  const Cluster& cl = cluster_;
  const double act = double(dtype_size(dtype_));
  const double m = double(p.num_micro_batches), ls = double(blocks_per_stage(p));
  // Bytes an element of the weights' all_gathers: the compute dtype's, or
  // with FP8 gathers 1 for the blocks' weights (CostConstants::fp8_weight_gather).
  double gather_b = act;
  if (job_.fp8_tensorwise() && k_.fp8_weight_gather && p_stage > 0) {
    const double blocks = std::min(1.0, ls * double(lc.layer_params) / p_stage);
    gather_b = blocks * 1.0 + (1 - blocks) * act;
  }
  const double F = st.forward_s, B = st.backward_s, W = st.weight_grad_s;
  // ---- data parallel over the replicas of each weight: `params` of them
  // over `replicas` ranks (dp * cp, or dp alone for those split over cp), a
  // share `tensor_share` of the stage's tensors.
  auto reduce = [&](int64_t replicas, double params, double tensor_share, double* out_bytes) {
    const Link dp_link = ring_link(replicas, p.tp);
    const double slowdown = overlap_slowdown_on(dp_link);
    auto overlap_exposed_s = [slowdown](double comm, double compute) {
      return CostModel::overlap_exposed_s(comm, compute, slowdown);
    };
    // Gradients reduce in the compute dtype, or in the stack's reduce dtype
    // (PyTorch FSDP's MixedPrecision reduce_dtype=float32: 4 bytes).
    const double grad_b = k_.grad_reduce_bytes > 0 ? k_.grad_reduce_bytes : act;
    const double grad_bytes = params * grad_b;
    const double ring_dp = replicas > 1 ? double(replicas - 1) / double(replicas) : 0.0;
    // The last micro-batch's backward, unless the stack reduces after it.
    const bool after = (p.zero == 0 && k_.zero0_reduce_after_backward) ||
                       (p.zero == 1 && k_.zero1_reduce_after_backward);
    const double window = k_.overlap_grad_reduce && !after ? B + W : 0.0;
    double dp_exposed = 0, dp_bytes = 0;
    // Collectives per step for the stage's gradients: one (bucketed), or one per
    // parameter tensor (collective_per_tensor), each paying the ring latency.
    const double tensors =
        k_.collective_per_tensor
            ? std::max(1.0,
                       std::round(
                           tensor_share *
                           (ls * lc.layer_param_tensors +
                            std::max(p.pp == 1 ? lc.embed_param_tensors + lc.head_param_tensors : 0,
                                     std::max(lc.embed_param_tensors, lc.head_param_tensors)))))
            : 1.0;
    auto dp_collective = [&](Collective c, double bytes) {
      return tensors * cl.collective_time_s(c, replicas, bytes / tensors, dp_link);
    };
    // The embedding's gradient is the backward's last (its node ends the
    // first stage's backward, which ends the step), so the bucket holding it
    // starts reducing when nothing is left to hide it: Megatron-LM's
    // DistributedDataParallel and PyTorch DDP bucket in reverse order and
    // never split a tensor, so their last bucket holds at least the
    // embedding. Likewise a gather overlapped with the forward
    // (overlap_param_gather) starts with the embedding's, before any
    // compute. (Of the stage's parameters reduced here: tensor_share.)
    const double tail_params = std::min(params, tensor_share * double(lc.embed_params));
    auto exposed_with_tail = [&](Collective c, double bytes_per_param, double under) {
      const double all = dp_collective(c, params * bytes_per_param);
      if (under <= 0 || tail_params <= 0) return overlap_exposed_s(all, under);
      return dp_collective(c, tail_params * bytes_per_param) +
             overlap_exposed_s(dp_collective(c, (params - tail_params) * bytes_per_param), under);
    };
    if (p.zero == 0 && k_.bucketed_grad_all_reduce) {
      // The runtime's buckets: over the replicas, and over tp for the weights
      // replicated across it, all started during the last backward.
      auto bucketed = [&](int64_t group, double bytes, const Link& link) {
        if (group <= 1 || bytes <= 0) return 0.0;
        const double n = std::max(1.0, std::ceil(bytes / k_.grad_bucket_bytes));
        return n * cl.collective_time_s(Collective::kAllReduce, group, bytes / n, link);
      };
      const double tp_bytes =
          tensor_share * (ls * lc.opt_bucketed_tp_bytes + lc.opt_bucketed_tp_outside_bytes);
      const double t = bucketed(replicas, grad_bytes, dp_link) +
                       bucketed(p.tp, tp_bytes, ring_link(p.tp, axis_stride(p, "tp")));
      dp_exposed = overlap_exposed_s(t, window);
      dp_bytes = 2 * ring_dp * grad_bytes;
    } else if (p.zero == 0) {
      dp_exposed = exposed_with_tail(Collective::kAllReduce, grad_b, window);
      dp_bytes = 2 * ring_dp * grad_bytes;
    } else if (p.zero == 1 || (p.zero == 2 && !k_.fsdp_shard_grad_op)) {
      // ZeRO-1 keeps the whole accumulated gradients and reduce-scatters them
      // once, after the last backward. ZeRO-2 keeps only its shard, so every
      // micro-batch's gradients are reduce-scattered in that micro-batch's
      // backward: m reduce-scatters a step, each under its own backward
      // (DeepSpeed's stage 2 "communicates during non gradient accumulation
      // boundaries as well"; meshflow's partitioner: LocalProgram's
      // early_grad, runs_per_step). The weights are gathered once a step.
      const double rs_calls = p.zero == 2 ? m : 1.0;
      const double rs = dp_collective(Collective::kReduceScatter, grad_bytes);
      const double ag = dp_collective(Collective::kAllGather, params * gather_b);
      // The gradient norm over sharded gradients: the partitioned program sums
      // every shard's squares and all_reduces them once (one_norm_reduction:
      // the program's one all_reduce in the optimizer phase), not per tensor.
      const double norm = k_.collective_per_tensor
                              ? cl.collective_time_s(Collective::kAllReduce, replicas, 4.0, dp_link)
                              : 0.0;
      // (ZeRO-2's reduce-scatters but the last run on under the next
      // micro-batch's forward: only the last one's embedding is exposed.)
      dp_exposed =
          (rs_calls - 1) * overlap_exposed_s(rs, window) +
          exposed_with_tail(Collective::kReduceScatter, grad_b, window) +
          (k_.overlap_param_gather ? exposed_with_tail(Collective::kAllGather, gather_b, F) : ag) +
          norm;
      dp_bytes = ring_dp * (rs_calls * grad_bytes + params * gather_b);
    } else {
      // By layer: ZeRO-3, and ZeRO-2 as FSDP's SHARD_GRAD_OP runs it (its
      // gather before the forward only, kept for the backward).
      // ZeRO-3 (DeepSpeed stage 3): a layer's weights are all_gathered right
      // before it runs and freed after it, its gradients reduce-scattered after
      // its backward, every micro-batch: one gather per layer in the forward,
      // one before the recomputed forward (full recompute, unless the stack
      // keeps the backward's gather for it: zero3_gather_for_recompute), one
      // before the backward, and one reduce_scatter (the embedding/head count as one more
      // layer). The collectives share one communication stream, so a layer's
      // run one after another; with the next layer's collectives prefetched
      // while this one computes (depth 1), each layer of a pass takes
      // max(compute, collectives), and the first gather of each pass and the
      // last reduce_scatter have nothing to hide behind. Without overlap
      // (zero3_prefetch false: meshflow's program runs them as nodes) all of it
      // is exposed.
      // calls: the layers + the embedding/head; a layer's collectives are one
      // per tensor of it with collective_per_tensor.
      const double calls = ls + 1;
      const double per_call = std::max(1.0, tensors / calls);
      const double ag =
          per_call * cl.collective_time_s(Collective::kAllGather, replicas,
                                          params * gather_b / calls / per_call, dp_link);
      const double rs = per_call * cl.collective_time_s(Collective::kReduceScatter, replicas,
                                                        grad_bytes / calls / per_call, dp_link);
      const double bwd_gathers =
          p.zero < 3 ? 0.0
                     : 1.0 + (k_.zero3_gather_for_recompute ? full_recompute_share(p, ls) : 0.0);
      double fwd = calls * ag, bwd = calls * (bwd_gathers * ag + rs);
      if (k_.zero3_prefetch) {
        fwd = calls * overlap_exposed_s(ag, F / calls) + ag;
        bwd = calls * overlap_exposed_s(bwd_gathers * ag + rs, (B + W) / calls) +
              (bwd_gathers > 0 ? ag : 0.0) + rs;
      }
      dp_exposed = m * (fwd + bwd);
      dp_bytes = m * ring_dp * ((1 + bwd_gathers) * params * gather_b + grad_bytes);
    }
    *out_bytes = dp_bytes;
    return dp_exposed;
  };
  // Under per-operator strategies on cp, the parameters the search split over
  // cp are reduced over dp alone (the program all_reduces over cp only the
  // ones Partial there); under the templates every one is Partial over cp.
  const double cp_share = cp_replicated_share(p, lc, ls);
  double b1 = 0, b2 = 0;
  double dp_exposed = reduce(p.dp * p.cp, cp_share * p_stage, cp_share, &b1);
  if (cp_share < 1) dp_exposed += reduce(p.dp, (1 - cp_share) * p_stage, 1 - cp_share, &b2);
  const double dp_bytes = b1 + b2;
  *bytes = dp_bytes;
  return dp_exposed;
}

}  // namespace meshflow::plan
