// Cluster: what the planner knows about the machine it plans for: nodes of
// identical devices, each device's peak FLOP/s per dtype, memory and memory
// bandwidth, and the two links (inside a node, across nodes). It prices the
// three things a step is made of: matmuls (a roofline with a size-dependent
// efficiency curve), memory-bound work, and collectives (alpha-beta with the
// ring factors). Format and shipped files: docs/cluster.md, configs/clusters/.
//
//   MF_ASSIGN_OR_RETURN(Cluster c, load_cluster("configs/clusters/dgx_a100_80gb.json"));
//   c.nodes = 16;                                            // 128 GPUs
//   double t_mm = c.matmul_time_s(2.0 * m * n * k, DType::BF16);
//   const Link& l = c.link_for_ranks({0, 1, 2, 3});          // inside a node: NVLink
//   double t_ar = c.collective_time_s(Collective::kAllReduce, 4, grad_bytes, l);
//
// Invariant (parse_cluster checks it): nodes, devices_per_node >= 1; every
// bandwidth, peak and memory size > 0; every efficiency in (0, 1]; latencies >= 0;
// the efficiency curve is sorted by GFLOP per call with distinct entries.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "meshflow/config/json_reader.h"
#include "meshflow/core/dtype.h"
#include "meshflow/core/mesh.h"
#include "meshflow/core/status.h"
#include "meshflow/ir/op_kind.h"
#include "meshflow/parallel/collective_cost.h"
#include "meshflow/parallel/reshard.h"

namespace meshflow::plan {

// One point of the matmul efficiency curve: a call of `gflop` GFLOP runs at
// `efficiency` of peak. Between points the efficiency is interpolated linearly
// in log(gflop); outside them it is the nearest end's value.
struct EfficiencyPoint {
  double gflop = 0;
  double efficiency = 1;
};

// Kernel efficiency by shape: what a GEMM with one thin side sustains of a
// square GEMM of the same FLOPs, on a grid of its thin side (`dim`) and the
// geometric mean of its other two (`big`), both in elements. Bilinear in
// log(dim) and log(big), clamped at the grid's ends (at most 1).
struct ThinGrid {
  std::vector<double> big, dim;             // increasing, >= 1
  std::vector<std::vector<double>> factor;  // [big][dim], in (0, 1]
  bool empty() const { return big.empty(); }
  double at(double dim_, double big_) const;
};

// Peak FLOP/s of one device. f32 is required; a missing entry falls back to f32.
struct PeakFlops {
  double f32 = 0;
  double tf32 = 0;  // f32 matmuls on tensor cores (when the runtime allows TF32)
  double bf16 = 0;
  double f16 = 0;
  // 8-bit floating point on tensor cores (Hopper and later: E4M3 and E5M2
  // operands, FP32 accumulation), dense; 0: the device has none.
  double fp8 = 0;
};

// One point of a fused attention kernel's efficiency by length: calls whose
// queries attend over `keys` keys (the call's key length; causal calls count
// their full length) sustain `forward` and `backward` of the 16-bit peak.
struct AttentionPoint {
  double keys = 0, forward = 0, backward = 0;
};

// A fused attention kernel's sustained fraction of the 16-bit peak: one
// figure for every length, or a table by key length (by_keys, ascending; a
// kernel's fixed work per query tile and its partly masked diagonal tiles
// weigh less as the keys grow), interpolated in log(keys) like the matmul
// curve and held flat beyond its ends.
struct AttentionEfficiency {
  double forward = 0, backward = 0;  // without by_keys
  std::vector<AttentionPoint> by_keys;
  // The efficiency of a call over `keys` keys, forward or backward.
  double at(double keys, bool fwd) const;
};

struct Device {
  std::string name;
  PeakFlops peak_flops;
  int64_t memory_bytes = 0;
  double memory_bandwidth_bytes_per_s = 0;
  std::vector<EfficiencyPoint> matmul_efficiency;  // empty: 1 at every size
  // Kernel efficiency by shape (a BLAS's packing and micro-kernel edges are
  // paid per row of a thin operand): measured by `meshflow bench
  // --calibrate` on all threads; empty: the curve by FLOPs alone (the GPU
  // files, whose training GEMMs are wide).
  ThinGrid matmul_thin_efficiency;
  // The same on one thread, against one thread's square GEMMs: what a local
  // rank that has one core runs (share_machine takes it for ranks >= cores).
  ThinGrid matmul_thin_efficiency_one_thread;
  double memory_efficiency = 1;
  // The fraction of the 16-bit peak each fused attention kernel sustains,
  // forward and backward, by kernel name ("flash1", "flash2", "cudnn", ...):
  // kernel measurements, not the GEMM curve (on H100 FlashAttention-2
  // reaches about 34% of peak where cuBLAS GEMMs reach ~70%). A kernel
  // without an entry is priced on the matmul curve like any GEMM.
  std::map<std::string, AttentionEfficiency> attention_efficiency;
  // FP8 GEMMs run on the matmul curve times this: their sustained fraction
  // of the FP8 peak against the 16-bit GEMMs' fraction of theirs (H100/H200:
  // 73.4% against 80.3% in ml-engineering's MAMF tables, 0.914). 1 where a
  // file gives none.
  double fp8_matmul_efficiency = 1;
  // A kernel's measured time over the roofline the cost model gives it, by
  // op kind (ir/op_kind.h's names): for the kinds whose kernels are not a
  // streaming pass or a GEMM (windows, per-channel reductions, convolutions'
  // reorders), measured by `meshflow bench --calibrate` at a ResNet stem's
  // shape on all threads; 1 for a kind not listed (the GPU files list none).
  std::map<std::string, double, std::less<>> kernel_time_scale;
  double kernel_scale(OpKind kind) const;
  // Board power, watts (both optional). rated_power_w: the power limit of the
  // GPU its compute figures (peak x the efficiencies above) hold at, the
  // datasheet's maximum (700 for an H100 or H200 SXM, 400 for an A100 SXM).
  // power_limit_w: the limit the cluster runs its GPUs at (nvidia-smi -pl;
  // 0: rated). Training GEMMs and fused attention already hold a Hopper at its
  // power limit (a lent 700 W H100 ran back-to-back GEMMs at 1350 of its 1980
  // MHz, drawing 699 W), so below it the clock drops until the power fits:
  // dynamic power goes as f V^2 and the voltage with f, so the clock goes as
  // the cube root of the power (compute_clock_scale). Memory-bound work and
  // collectives are not priced slower.
  double rated_power_w = 0;
  double power_limit_w = 0;
  // The clock a power limit leaves tensor-core-bound kernels, as a fraction of
  // the rated one: (power_limit_w / rated_power_w)^(1/3), 1 without a limit.
  // The whole board's power is taken as dynamic (a static part would lower
  // it: 70 W of 700 gives 0.881 at 500 W, against 0.894), and the law holds
  // above the voltage floor (roughly half the rated power; further down the
  // clock falls faster than this says).
  double compute_clock_scale() const;
};

// Links and collectives are priced by parallel/collective_cost.h, the one
// collective cost the reshard planner and the planner share.
using meshflow::Collective;
using meshflow::collective_name;
using meshflow::Link;

// The host side of a device, for offload (Plan::offload): absent fields are
// 0, and a plan that needs one is invalid, naming it.
struct Host {
  double link_bandwidth_bytes_per_s = 0;    // device <-> host (PCIe), per device, one direction
  double memory_bytes = 0;                  // host memory per node
  double memory_bandwidth_bytes_per_s = 0;  // host memory per node (the CPU optimizer's bound)
  double nvme_bandwidth_bytes_per_s = 0;    // the node's NVMe, read or write
  double nvme_bytes = 0;                    // the node's NVMe capacity
};

struct Cluster {
  std::string name;
  // A calibration's software (plan/calibrate.h: calibration_software); empty
  // in a file written by hand. Optional key "calibrated_with".
  std::string calibrated_with;
  int nodes = 1;
  int devices_per_node = 1;
  Device device;
  Link intra_node;
  Link inter_node;
  // A node whose devices are not all on one NVLink fabric (optional key
  // "islands"): its devices form islands of `devices_per_island` consecutive
  // devices, joined inside by intra_node, and a device reaches another
  // island of its node over `between_islands` (PCIe through the host: an
  // 8-GPU server of NVLink-bridged pairs, a node of two 4-GPU NVLink boards,
  // GPUs on PCIe alone with islands of 1). 0: the whole node is one island.
  // A node's last island may hold fewer (a file resized to part of a node).
  int devices_per_island = 0;
  Link between_islands;
  // An NVLink fabric larger than a node (optional key "nvlink_domain"): every
  // `devices_per_domain` consecutive devices, a whole number of nodes, are
  // joined by intra_node (a GB200 NVL72 rack: 72 GPUs over its NVLink
  // switches, 18 trays of 4); devices of different domains talk over
  // inter_node. 0: each node is its own fabric. Not with islands.
  int devices_per_domain = 0;
  Host host;  // optional "host" section
  // A CPU machine's in-process transport with two ranks a core (optional key
  // "time_shared_latency_s", written by the calibration since version 4):
  // seconds per message step of a ring collective when the ranks time-share
  // the cores, which share_machine prices for more ranks than cores. 0: not
  // measured (share_machine then adds the transport's spin time).
  double time_shared_latency_s = 0;
  // share_machine with more ranks than cores: the cores the ranks time-share
  // (a pipeline's ranks waiting in its bubble give theirs to the others:
  // SimCosts::cores). 0: each device is its own. Not part of the JSON.
  int64_t shared_cores = 0;

  int64_t total_devices() const { return static_cast<int64_t>(nodes) * devices_per_node; }

  // The devices one NVLink fabric joins: an nvlink_domain's, else a node's.
  int64_t fabric_devices() const {
    return devices_per_domain > devices_per_node ? devices_per_domain : devices_per_node;
  }
  // The devices of one island: devices_per_island, or the fabric's.
  int64_t island_devices() const {
    return devices_per_island > 0 && devices_per_island < devices_per_node ? devices_per_island
                                                                           : fabric_devices();
  }
  // The link a group of (global) device ranks communicates over: intra_node
  // when every rank lies on one island (rank / island_devices()),
  // between_islands when on one node (rank / devices_per_node), else
  // inter_node. (With an nvlink_domain, "node" reads "domain" here and below.)
  // REQUIRES: ranks non-empty, every rank in [0, total_devices()).
  const Link& link_for_ranks(const std::vector<int64_t>& ranks) const;
  // The same for a mesh axis of `size` ranks `stride` devices apart (groups
  // aligned to multiples of size * stride, as mesh axes are): intra_node when
  // (size - 1) * stride + 1 <= island_devices(), i.e. the group fits in an
  // island; between_islands when it fits in a node. One device's port: what
  // a point-to-point transfer or an all_to_all (every member sending at
  // once) gets.
  const Link& link_for_axis(int64_t size, int64_t stride) const;
  // The link a ring collective (all_reduce, all_gather, reduce_scatter) of
  // that axis runs at. Across nodes NCCL runs a ring per channel and spreads
  // the channels over the node's network ports, so a group with k members on
  // each node crosses each node boundary on k ports at once:
  // striped_inter_node(min(size, devices_per_node / stride)). Across the
  // islands of a node alike, on each member's own path:
  // striped_between_islands(min(size, island_devices() / stride)), which
  // also bounds a ring across nodes whose hops inside a node cross islands.
  Link ring_link_for_axis(int64_t size, int64_t stride) const;
  // inter_node at k times the per-device bandwidth (latency and efficiency
  // unchanged), at most the intra-node link's effective bandwidth (the
  // ring's hops inside the node ride it). inter_node.bandwidth_bytes_per_s is
  // the node's network bandwidth divided by its devices.
  Link striped_inter_node(int64_t k) const;
  // between_islands at k times its per-device bandwidth, at most intra_node's
  // effective bandwidth.
  Link striped_between_islands(int64_t k) const;

  // Peak FLOP/s of a matmul in `dtype` (F32 uses tf32 when allow_tf32).
  double peak_flops(DType dtype, bool allow_tf32 = false) const;
  // The efficiency curve at a call of `flops` FLOPs.
  double matmul_efficiency(double flops) const;
  // Seconds for `flops` of tensor-core-bound work at `peak` FLOP/s sustaining
  // `efficiency` of it, at the clock the device's power limit leaves
  // (Device::compute_clock_scale): what GEMMs and fused attention cost.
  double compute_bound_time_s(double flops, double peak, double efficiency) const;
  // Seconds for one matmul call of `flops` FLOPs: flops / (peak * efficiency).
  double matmul_time_s(double flops, DType dtype, bool allow_tf32 = false) const;
  // The same for an FP8 GEMM: at peak_flops.fp8 on the curve times
  // fp8_matmul_efficiency. REQUIRES: device.peak_flops.fp8 > 0.
  double fp8_matmul_time_s(double flops) const;
  // What a GEMM of m x k times k x n sustains of a square GEMM of its FLOPs
  // (the curve by FLOPs): the thin grid at (its smallest side, the geometric
  // mean of the other two); 1 where that side is not the thinner, or
  // without a grid.
  double matmul_shape_factor(double m, double n, double k) const;
  // Seconds to stream `bytes` through device memory (memory-bound ops).
  double memory_time_s(double bytes) const;
  // Roofline of an op: the larger of its compute time (at the efficiency of a
  // call of that size) and its memory time.
  double roofline_time_s(double flops, double bytes, DType dtype) const;

  // meshflow::collective_time_s (parallel/collective_cost.h) on `link`.
  double collective_time_s(Collective c, int64_t n, double bytes, const Link& link) const;
  // The same on the link a group of ranks maps to.
  double collective_time_s(Collective c, const std::vector<int64_t>& ranks, double bytes) const;
};

// The cluster resized to `devices` devices (what `meshflow plan --gpus N` does
// with a shipped one-node file): devices <= devices_per_node gives one node of
// `devices` devices; more must be a multiple of devices_per_node and gives
// devices / devices_per_node nodes. Anything else is an error saying what fits.
Result<Cluster> with_devices(const Cluster& c, int64_t devices);

// `ranks` in-process ranks sharing one machine described by a one-device
// cluster (configs/clusters/local_cpu.json: the whole CPU socket as one
// device), as `meshflow train --ranks N` runs them: the trainer gives each rank
// threads / ranks of the cores, so each rank is a device with 1/ranks of the
// peak FLOP/s, of the memory bandwidth and of the memory. A matmul call of F
// FLOPs on a 1/ranks share does the per-core work of a call of ranks x F on the
// whole machine, so the efficiency curve's call sizes scale by 1/ranks. The
// ranks form one node; both links are the calibrated in-process transport.
// More ranks than `cores` (0: this machine's hardware threads) time-share the
// cores: a message step of a collective waits for a peer that may itself be
// waiting for a core. Its latency is the machine's measured
// time_shared_latency_s where the file has it (a waiting rank polls yielding
// its core, so the peer runs in the meantime: about 6 us a step on the
// 2-core VM, against the transport's 50 us spin), else latency + the spin
// time (LocalTransportOptions::spin_us), a bound from older files; and
// shared_cores records the cores, for the pipeline's time-shared simulation.
// REQUIRES machine.total_devices() == 1 (errors otherwise), ranks >= 1.
Result<Cluster> share_machine(const Cluster& machine, int64_t ranks, int64_t cores = 0);

// The reshard planner's links on this cluster for `mesh`: axis a's groups of
// mesh.size(a) ranks, strides[a] devices apart, on the link they map to
// (link_for_axis; ring collectives on ring_link_for_axis). Without strides, the mesh's own
// row-major order (the last axis innermost, as the runtime numbers ranks). REQUIRES: strides empty
// or one per mesh axis.
ReshardCostModel reshard_costs(const Cluster& c, const Mesh& mesh,
                               std::vector<int64_t> strides = {}, int64_t bytes_per_element = 4);

// Reads a cluster from its JSON (strict: unknown keys, wrong types and
// out-of-range values are errors naming the key and what is valid).
Result<Cluster> parse_cluster(const json& j);
Result<Cluster> load_cluster(const std::string& path);
json cluster_to_json(const Cluster& c);
// The JSON text of a cluster, keys in the documented order, curve points on one line.
std::string format_cluster_json(const Cluster& c);

}  // namespace meshflow::plan
