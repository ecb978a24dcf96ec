// Cluster description (plan/cluster.h) and calibration (plan/calibrate.h):
// the shipped files parse, every user mistake gets a message naming the key,
// and the cost helpers match hand-computed values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>

#include "meshflow/plan/calibrate.h"
#include "meshflow/plan/cluster.h"
#include "meshflow/plan/prediction_band.h"

namespace meshflow::plan {
namespace {

std::string source_dir() {
  const char* e = std::getenv("MESHFLOW_SOURCE_DIR");
  return e ? e : MESHFLOW_SOURCE_DIR_DEFAULT;
}

json valid_cluster() {
  return json::parse(R"({
    "name": "test", "nodes": 2, "devices_per_node": 4,
    "device": {"name": "d", "peak_flops": {"f32": 1e12, "bf16": 8e12},
               "memory_bytes": 1000, "memory_bandwidth_bytes_per_s": 1e11,
               "matmul_efficiency": [[1, 0.6], [16, 0.9], [128, 0.95]],
               "memory_efficiency": 0.5},
    "intra_node": {"bandwidth_bytes_per_s": 100e9, "latency_s": 1e-6, "efficiency": 0.5},
    "inter_node": {"bandwidth_bytes_per_s": 10e9, "latency_s": 1e-5, "efficiency": 1}
  })");
}

std::string error_of(const json& j) {
  Result<Cluster> c = parse_cluster(j);
  EXPECT_FALSE(c.is_ok()) << j.dump();
  return c.is_ok() ? "" : c.status().message();
}

TEST(PlanCluster, ShippedFilesParse) {
  // (Each named as its file: prediction_bands.json keys its bands by file.)
  for (const char* f : {"a100_40gb", "a100_pcie_80gb", "b200_sxm", "dgx_a100_80gb", "gb200_nvl72",
                        "gb300_nvl72", "h100_96gb", "h100_sxm", "h200_sxm", "local_cpu"}) {
    Result<Cluster> c = load_cluster(source_dir() + "/configs/clusters/" + f + ".json");
    ASSERT_TRUE(c.is_ok()) << f << ": " << c.status().message();
    EXPECT_EQ(c->name, f);
    EXPECT_EQ(c->nodes, 1);
    EXPECT_GT(c->device.peak_flops.f32, 0);
    EXPECT_GT(c->intra_node.effective_bandwidth(), 0);
  }
  // The GPU files state their rated board power and no limit (a limit is the
  // deployment's, like its fabric's rate): compute at the rated clock.
  for (const char* f : {"a100_40gb", "b200_sxm", "dgx_a100_80gb", "gb200_nvl72", "gb300_nvl72",
                        "h100_96gb", "h100_sxm", "h200_sxm"}) {
    Result<Cluster> c = load_cluster(source_dir() + "/configs/clusters/" + f + ".json");
    ASSERT_TRUE(c.is_ok()) << f << ": " << c.status().message();
    EXPECT_GE(c->device.rated_power_w, 400) << f;
    EXPECT_EQ(c->device.power_limit_w, 0) << f;
    EXPECT_EQ(c->device.compute_clock_scale(), 1.0) << f;
  }
  // The PCIe A100: the SXM part's curve (measured at 400 W) at its own 300 W
  // board limit, NVLink-bridged pairs meeting over PCIe 4.0.
  Result<Cluster> pcie = load_cluster(source_dir() + "/configs/clusters/a100_pcie_80gb.json");
  ASSERT_TRUE(pcie.is_ok()) << pcie.status().message();
  EXPECT_NEAR(pcie->device.compute_clock_scale(), 0.9086, 1e-4);
  EXPECT_EQ(pcie->island_devices(), 2);
  EXPECT_EQ(&pcie->link_for_axis(2, 1), &pcie->intra_node);
  EXPECT_EQ(&pcie->link_for_axis(4, 1), &pcie->between_islands);
  Result<Cluster> a100 = load_cluster(source_dir() + "/configs/clusters/dgx_a100_80gb.json");
  ASSERT_TRUE(a100.is_ok());
  EXPECT_EQ(a100->total_devices(), 8);
  EXPECT_DOUBLE_EQ(a100->peak_flops(DType::BF16), 312e12);
  EXPECT_DOUBLE_EQ(a100->peak_flops(DType::F32, /*allow_tf32=*/true), 156e12);
  EXPECT_DOUBLE_EQ(a100->inter_node.effective_bandwidth(), 25e9 * 0.9);
  // Round trip: to_json then parse gives the same numbers.
  Result<Cluster> back = parse_cluster(cluster_to_json(*a100));
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_EQ(cluster_to_json(*back), cluster_to_json(*a100));
  // Attention kernels by name: on H100 FlashAttention-2 at 35% of peak (the
  // FlashAttention-3 paper) and FlashAttention-1 at half of it; on A100
  // FlashAttention-1 at 40% / 30% (the FlashAttention-2 paper), FlashAttention-2
  // left to the GEMM curve. Kept by the round trip.
  Result<Cluster> h100 = load_cluster(source_dir() + "/configs/clusters/h100_sxm.json");
  ASSERT_TRUE(h100.is_ok());
  // FP8: the datasheet's dense 1979 TFLOP/s, at 0.914 of the 16-bit curve
  // (MAMF: 73.4% of the FP8 peak against 80.3% of the BF16 one); A100 has none.
  EXPECT_DOUBLE_EQ(h100->device.peak_flops.fp8, 1979e12);
  EXPECT_DOUBLE_EQ(h100->device.fp8_matmul_efficiency, 0.914);
  EXPECT_DOUBLE_EQ(a100->device.peak_flops.fp8, 0);
  EXPECT_NEAR(h100->fp8_matmul_time_s(1e12),
              h100->matmul_time_s(1e12, DType::BF16) * 989.5 / (1979 * 0.914), 1e-15);
  EXPECT_EQ(cluster_to_json(value_or_throw(parse_cluster(cluster_to_json(*h100)))),
            cluster_to_json(*h100));
  const auto& h = h100->device.attention_efficiency;
  // cuDNN's fused attention and FlashAttention-2 by key length, as measured
  // on an H100 SXM (bench/gpu/hopper_kernels.py, causal, head dim 128): at
  // each measured length its figures, between two the log-interpolation,
  // beyond the ends the end's; the backward far under the forward at 1-2k.
  ASSERT_EQ(h.size(), 3u);
  EXPECT_DOUBLE_EQ(h.at("cudnn").at(8192, true), 0.587);
  EXPECT_DOUBLE_EQ(h.at("cudnn").at(8192, false), 0.478);
  EXPECT_NEAR(h.at("cudnn").at(std::sqrt(4096.0 * 8192), false), (0.427 + 0.478) / 2, 1e-12);
  EXPECT_DOUBLE_EQ(h.at("cudnn").at(1e6, true), 0.618);
  EXPECT_DOUBLE_EQ(h.at("cudnn").at(128, false), 0.230);
  EXPECT_DOUBLE_EQ(h.at("flash2").at(2048, true), 0.311);
  EXPECT_DOUBLE_EQ(h.at("flash2").at(2048, false), 0.202);
  EXPECT_LT(h.at("flash2").at(2048, false), h.at("flash2").at(8192, false));
  // A kernel with one figure has it at every length.
  EXPECT_DOUBLE_EQ(h.at("flash1").at(512, false), 0.175);
  EXPECT_DOUBLE_EQ(h.at("flash1").at(1 << 20, false), 0.175);
  const auto& a = a100->device.attention_efficiency;
  ASSERT_EQ(a.size(), 1u);
  EXPECT_DOUBLE_EQ(a.at("flash1").forward, 0.40);
  EXPECT_DOUBLE_EQ(a.at("flash1").backward, 0.30);
  back = parse_cluster(cluster_to_json(*h100));
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_DOUBLE_EQ(back->device.attention_efficiency.at("flash1").forward, 0.175);
  EXPECT_EQ(cluster_to_json(*back), cluster_to_json(*h100));
  // Each wrong entry is refused, naming its key and what is valid.
  const nlohmann::json good = cluster_to_json(*h100);
  auto refused_with = [&](const char* path, const nlohmann::json& v, const std::string& want) {
    nlohmann::json bad = good;
    bad["device"]["attention_efficiency"][path] = v;
    Result<Cluster> r = parse_cluster(bad);
    ASSERT_FALSE(r.is_ok()) << path;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
  };
  refused_with("flash2", {{"forward", 1.5}, {"backward", 0.3}},
               "cluster.device.attention_efficiency.flash2.forward must be in (0, 1], got 1.5");
  refused_with("flash1", {{"forward", 0.3}}, "attention_efficiency.flash1.backward is required");
  refused_with("cudnn", 0.5, "attention_efficiency.cudnn must be an object");
  refused_with("cudnn", {{"forward", 0.5}, {"backward", 0.4}, {"by_keys", {{1024, 0.5, 0.4}}}},
               "attention_efficiency.cudnn: give either forward and backward (one figure for "
               "every length) or by_keys, not both");
  refused_with("cudnn", {{"by_keys", {{2048, 0.5, 0.4}, {1024, 0.5, 0.4}}}},
               "attention_efficiency.cudnn.by_keys[1]: keys must increase along the table, got "
               "1024 after 2048");
  refused_with("cudnn", {{"by_keys", {{2048, 0.5}}}},
               "attention_efficiency.cudnn.by_keys[0] must be [keys, forward, backward] (three "
               "numbers), got [2048,0.5]");
  refused_with("cudnn", {{"by_keys", {{2048, 0.5, 1.2}}}},
               "attention_efficiency.cudnn.by_keys[0]: each efficiency must be in (0, 1], got 1.2");
  refused_with("cudnn", {{"by_keys", {{0, 0.5, 0.4}}}},
               "attention_efficiency.cudnn.by_keys[0]: keys must be > 0, got 0");
  refused_with("cudnn", {{"by_keys", nlohmann::json::array()}},
               "attention_efficiency.cudnn.by_keys must be a non-empty array");
  refused_with("flash3", {{"forward", 0.7}, {"backward", 0.6}, {"fwd", 0.7}},
               "attention_efficiency.flash3");
  nlohmann::json old_key = good;
  old_key["device"]["attention_forward_efficiency"] = 0.35;
  Result<Cluster> r = parse_cluster(old_key);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("attention_forward_efficiency"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("attention_efficiency"), std::string::npos)
      << r.status().message();
}

// Bands: p10..p90 of published / predicted per GPU-count range, none with
// fewer than 5 runs; a round trip; the range lookup.
TEST(PlanBand, QuantilesRangesAndRoundTrip) {
  std::vector<std::pair<int64_t, double>> s;
  for (int i = 0; i <= 10; ++i) s.push_back({8, 1.0 + 0.1 * i});  // 1.0 .. 2.0
  s.push_back({512, 1.1});                                        // one run: no band
  const std::vector<BandEntry> b = make_bands(s);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].min_gpus, 1);
  EXPECT_EQ(b[0].max_gpus, 64);
  EXPECT_EQ(b[0].runs, 11);
  EXPECT_NEAR(b[0].lo, 1.1, 1e-12);
  EXPECT_NEAR(b[0].hi, 1.9, 1e-12);
  PredictionBands pb;
  pb.source = "test";
  pb.by_cluster["c"] = b;
  const PredictionBands back =
      value_or_throw(parse_prediction_bands(prediction_bands_to_json(pb), "bands"));
  ASSERT_NE(find_band(back, "c", 64), nullptr);
  EXPECT_NEAR(find_band(back, "c", 64)->hi, 1.9, 1e-3);
  EXPECT_EQ(find_band(back, "c", 65), nullptr);
  EXPECT_EQ(find_band(back, "d", 8), nullptr);
  Result<PredictionBands> bad = parse_prediction_bands(json{{"clusters", {{"c", 3}}}}, "bands");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("bands.clusters.c must be a list"), std::string::npos);
}

TEST(PlanCluster, ErrorsNameTheKey) {
  json j = valid_cluster();
  ASSERT_TRUE(parse_cluster(j).is_ok()) << parse_cluster(j).status().message();

  j = valid_cluster();
  j["device"]["peak_flop"] = 1;
  std::string m = error_of(j);
  EXPECT_NE(m.find("cluster.device: unknown key 'peak_flop'"), std::string::npos) << m;
  EXPECT_NE(m.find("peak_flops"), std::string::npos) << m;  // lists the valid keys

  j = valid_cluster();
  j["gpus"] = 8;
  m = error_of(j);
  EXPECT_NE(m.find("unknown key 'gpus'"), std::string::npos) << m;

  j = valid_cluster();
  j["device"]["peak_flops"]["fp4"] = 1e15;
  m = error_of(j);
  EXPECT_NE(m.find("cluster.device.peak_flops: unknown key 'fp4'"), std::string::npos) << m;

  j = valid_cluster();
  j["device"]["peak_flops"]["fp8"] = -1;
  m = error_of(j);
  EXPECT_NE(m.find("cluster.device.peak_flops.fp8 must be in [1e+06, inf)"), std::string::npos)
      << m;

  j = valid_cluster();
  j["device"]["fp8_matmul_efficiency"] = 1.5;
  m = error_of(j);
  EXPECT_NE(m.find("cluster.device.fp8_matmul_efficiency must be in (0, 1]"), std::string::npos)
      << m;

  j = valid_cluster();
  j["device"]["kernel_time_scale"] = {{"max_pool", 7.5}};
  m = error_of(j);
  EXPECT_NE(m.find("cluster.device.kernel_time_scale.max_pool: not an op kind"), std::string::npos)
      << m;
  EXPECT_NE(m.find("max_pool2d"), std::string::npos) << m;  // names valid ones
  j["device"]["kernel_time_scale"] = {{"max_pool2d", -1}};
  m = error_of(j);
  EXPECT_NE(m.find("cluster.device.kernel_time_scale.max_pool2d must be a number in [0.01, 1000]"),
            std::string::npos)
      << m;
  j["device"]["kernel_time_scale"] = {{"max_pool2d", "fast"}};
  EXPECT_NE(error_of(j).find("got \"fast\""), std::string::npos) << error_of(j);

  j = valid_cluster();
  j["devices_per_node"] = "eight";
  m = error_of(j);
  EXPECT_NE(m.find("cluster.devices_per_node must be an integer"), std::string::npos) << m;

  j = valid_cluster();
  j["intra_node"]["bandwidth_bytes_per_s"] = "fast";
  m = error_of(j);
  EXPECT_NE(m.find("cluster.intra_node.bandwidth_bytes_per_s must be a number in [1e+06, inf)"),
            std::string::npos)
      << m;

  j = valid_cluster();
  j["inter_node"]["bandwidth_bytes_per_s"] = -25e9;
  m = error_of(j);
  EXPECT_NE(m.find("cluster.inter_node.bandwidth_bytes_per_s must be in [1e+06, inf)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("-2.5e+10"), std::string::npos) << m;

  j = valid_cluster();
  j["intra_node"]["latency_s"] = -1;
  m = error_of(j);
  EXPECT_NE(m.find("cluster.intra_node.latency_s must be in [0, 1]"), std::string::npos) << m;

  // Figures no machine has (the fuzzer's years-long message step reached the
  // ILP as a coefficient CLP aborts on): refused with the range.
  const struct {
    const char* pointer;
    double value;
    const char* want;
  } absurd[] = {
      {"/inter_node/latency_s", 9223372036854775807.0,
       "cluster.inter_node.latency_s must be in [0, 1] (seconds per message step)"},
      {"/device/memory_bandwidth_bytes_per_s", 5,
       "cluster.device.memory_bandwidth_bytes_per_s must be in [1e+06, inf)"},
      {"/device/peak_flops/bf16", 1e-300, "peak_flops.bf16 must be in [1e+06, inf)"},
      {"/time_shared_latency_s", 5.0,
       "cluster.time_shared_latency_s must be in [0, 1] (seconds per message step with two "
       "ranks a core)"},
      {"/time_shared_latency_s", -1e-6, "cluster.time_shared_latency_s must be in [0, 1]"},
  };
  for (const auto& a : absurd) {
    j = valid_cluster();
    j[json::json_pointer(a.pointer)] = a.value;
    m = error_of(j);
    EXPECT_NE(m.find(a.want), std::string::npos) << m;
  }

  j = valid_cluster();
  j["intra_node"]["efficiency"] = 1.5;
  m = error_of(j);
  EXPECT_NE(m.find("cluster.intra_node.efficiency must be in (0, 1]"), std::string::npos) << m;

  j = valid_cluster();
  j.erase("device");
  m = error_of(j);
  EXPECT_NE(m.find("cluster.device is required"), std::string::npos) << m;

  j = valid_cluster();
  j["device"] = 3;
  m = error_of(j);
  EXPECT_NE(m.find("cluster.device must be an object"), std::string::npos) << m;

  j = valid_cluster();
  j["device"]["peak_flops"].erase("f32");
  m = error_of(j);
  EXPECT_NE(m.find("cluster.device.peak_flops.f32 is required"), std::string::npos) << m;

  j = valid_cluster();
  j["device"].erase("memory_bytes");
  m = error_of(j);
  EXPECT_NE(m.find("cluster.device.memory_bytes is required"), std::string::npos) << m;

  j = valid_cluster();
  j["nodes"] = 0;
  m = error_of(j);
  EXPECT_NE(m.find("cluster.nodes must be >= 1"), std::string::npos) << m;

  j = valid_cluster();
  j.erase("inter_node");
  m = error_of(j);
  EXPECT_NE(m.find("cluster.inter_node is required when cluster.nodes > 1"), std::string::npos)
      << m;
  j["nodes"] = 1;
  EXPECT_TRUE(parse_cluster(j).is_ok());

  j = valid_cluster();
  j["device"]["matmul_efficiency"] = json::parse("[[16, 0.9], [1, 0.6]]");
  m = error_of(j);
  EXPECT_NE(m.find("cluster.device.matmul_efficiency[1]: gflop_per_call must increase"),
            std::string::npos)
      << m;

  j = valid_cluster();
  j["device"]["matmul_efficiency"] = json::parse("[[16, 1.2]]");
  m = error_of(j);
  EXPECT_NE(m.find("matmul_efficiency[0]: efficiency must be in (0, 1]"), std::string::npos) << m;

  j = valid_cluster();
  j["device"]["matmul_efficiency"] = json::parse("[16, 0.9]");
  m = error_of(j);
  EXPECT_NE(m.find("matmul_efficiency[0] must be [gflop_per_call, efficiency]"), std::string::npos)
      << m;

  j = valid_cluster();
  j["device"]["matmul_efficiency"] = "high";
  m = error_of(j);
  EXPECT_NE(m.find("matmul_efficiency must be a number in (0, 1] or [[gflop_per_call"),
            std::string::npos)
      << m;
}

// Inside a node: the intra-node link. Across nodes: one device's port for
// point-to-point and all_to_all; for a ring collective as many ports as the
// group has members on one node (NCCL's channels spread over the node's
// NICs), at most the intra-node link's effective bandwidth.
TEST(PlanCluster, LinkSelection) {
  Result<Cluster> c = parse_cluster(valid_cluster());  // 2 nodes x 4 devices
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->total_devices(), 8);
  EXPECT_EQ(&c->link_for_ranks({0, 1, 2, 3}), &c->intra_node);
  EXPECT_EQ(&c->link_for_ranks({4, 7}), &c->intra_node);
  EXPECT_EQ(&c->link_for_ranks({3, 4}), &c->inter_node);  // consecutive but across a boundary
  EXPECT_EQ(&c->link_for_ranks({0, 4}), &c->inter_node);
  EXPECT_EQ(&c->link_for_ranks({5}), &c->intra_node);
  EXPECT_EQ(&c->link_for_axis(4, 1), &c->intra_node);  // tp=4 inside a node
  EXPECT_EQ(&c->link_for_axis(2, 2), &c->intra_node);  // {0, 2}
  EXPECT_EQ(&c->link_for_axis(8, 1), &c->inter_node);
  EXPECT_EQ(&c->link_for_axis(2, 4), &c->inter_node);  // dp over nodes: {0, 4}
  EXPECT_EQ(&c->link_for_axis(1, 4), &c->intra_node);
  auto same = [](const Link& a, const Link& b) {
    return a.bandwidth_bytes_per_s == b.bandwidth_bytes_per_s && a.latency_s == b.latency_s &&
           a.efficiency == b.efficiency;
  };
  auto ports = [&](int64_t k) {
    Link l = c->inter_node;
    l.bandwidth_bytes_per_s *= static_cast<double>(k);
    return l;
  };
  EXPECT_TRUE(same(c->ring_link_for_axis(4, 1), c->intra_node));
  EXPECT_TRUE(same(c->ring_link_for_axis(8, 1), ports(4)));       // all 8: 4 ports per node
  EXPECT_TRUE(same(c->ring_link_for_axis(4, 2), ports(2)));       // {0, 2, 4, 6}
  EXPECT_TRUE(same(c->ring_link_for_axis(2, 4), c->inter_node));  // one member per node
  EXPECT_DOUBLE_EQ(c->ring_link_for_axis(8, 1).effective_bandwidth(), 40e9);
  // The reshard planner ranks redistributions on the same links: an
  // all_gather over the 8 ranks on four ports, an all_to_all on one.
  const ReshardCostModel rc = reshard_costs(*c, value_or_throw(Mesh::parse("dp=8")));
  EXPECT_DOUBLE_EQ(rc.link(0, Collective::kAllGather).effective_bandwidth(), 40e9);
  EXPECT_DOUBLE_EQ(rc.link(0, Collective::kAllToAll).effective_bandwidth(), 10e9);
  // Four ports of 20 GB/s would pass NVLink's 100 GB/s x 0.5: capped there.
  c->inter_node.bandwidth_bytes_per_s = 20e9;
  EXPECT_DOUBLE_EQ(c->ring_link_for_axis(8, 1).effective_bandwidth(),
                   c->intra_node.effective_bandwidth());
  EXPECT_DOUBLE_EQ(c->ring_link_for_axis(8, 1).latency_s, c->inter_node.latency_s);
  EXPECT_DOUBLE_EQ(c->ring_link_for_axis(4, 2).effective_bandwidth(), 40e9);
}

// A node of NVLink islands (cluster.h: Cluster::devices_per_island): inside
// an island intra_node; across the islands of a node between_islands, a ring
// striped over as many paths as it has members on one island (at most the
// intra-node link); a ring across nodes whose hops inside a node cross
// islands no faster than that. The file round-trips, and its mistakes name
// the key.
TEST(PlanCluster, IslandsJoinOverTheirOwnLink) {
  json j = valid_cluster();
  j["devices_per_node"] = 8;  // 2 nodes of 8: four NVLink-bridged pairs each
  j["islands"] = {{"devices", 2}, {"link", {{"bandwidth_bytes_per_s", 20e9}, {"latency_s", 2e-6}}}};
  Result<Cluster> c = parse_cluster(j);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->island_devices(), 2);
  EXPECT_EQ(&c->link_for_ranks({0, 1}), &c->intra_node);
  EXPECT_EQ(&c->link_for_ranks({1, 2}), &c->between_islands);  // neighbours, two islands
  EXPECT_EQ(&c->link_for_ranks({0, 7}), &c->between_islands);
  EXPECT_EQ(&c->link_for_ranks({7, 8}), &c->inter_node);
  EXPECT_EQ(&c->link_for_ranks({8, 9}), &c->intra_node);  // the second node's first pair
  {
    // Islands of 3 in nodes of 8 (3, 3 and 2): each node's count from its start.
    json odd = valid_cluster();
    odd["devices_per_node"] = 8;
    odd["islands"] = {{"devices", 3}, {"link", {{"bandwidth_bytes_per_s", 20e9}}}};
    Result<Cluster> o = parse_cluster(odd);
    ASSERT_TRUE(o.is_ok()) << o.status().message();
    EXPECT_EQ(&o->link_for_ranks({8, 10}), &o->intra_node);
    EXPECT_EQ(&o->link_for_ranks({6, 7}), &o->intra_node);  // the node's last island, of 2
    EXPECT_EQ(&o->link_for_ranks({10, 11}), &o->between_islands);
  }
  EXPECT_EQ(&c->link_for_axis(2, 1), &c->intra_node);  // tp=2 on a bridge
  EXPECT_EQ(&c->link_for_axis(4, 1), &c->between_islands);
  EXPECT_EQ(&c->link_for_axis(2, 2), &c->between_islands);  // {0, 2}
  EXPECT_EQ(&c->link_for_axis(2, 8), &c->inter_node);
  EXPECT_DOUBLE_EQ(c->ring_link_for_axis(2, 1).effective_bandwidth(), 50e9);  // 100 x 0.5
  // tp=8 over four pairs: each pair's two PCIe paths at once.
  EXPECT_DOUBLE_EQ(c->ring_link_for_axis(8, 1).effective_bandwidth(), 40e9);
  EXPECT_DOUBLE_EQ(c->ring_link_for_axis(8, 1).latency_s, 2e-6);
  EXPECT_DOUBLE_EQ(c->ring_link_for_axis(4, 2).effective_bandwidth(), 20e9);  // one a pair
  // Across both nodes: eight 10 GB/s ports would give 80; the hops between
  // the pairs inside a node give 40.
  EXPECT_DOUBLE_EQ(c->ring_link_for_axis(16, 1).effective_bandwidth(), 40e9);
  EXPECT_DOUBLE_EQ(c->ring_link_for_axis(16, 1).latency_s, c->inter_node.latency_s);
  EXPECT_DOUBLE_EQ(c->ring_link_for_axis(2, 8).effective_bandwidth(), 10e9);  // one a node
  // The planner prices a redistribution on the same links.
  const ReshardCostModel rc = reshard_costs(*c, value_or_throw(Mesh::parse("dp=2,tp=8")));
  EXPECT_DOUBLE_EQ(rc.link(1, Collective::kAllGather).effective_bandwidth(), 40e9);
  EXPECT_DOUBLE_EQ(rc.link(1, Collective::kAllToAll).effective_bandwidth(), 20e9);

  // Written and read back alike; part of a node keeps the islands it holds.
  Result<Cluster> back = parse_cluster(cluster_to_json(*c));
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_EQ(back->devices_per_island, 2);
  EXPECT_DOUBLE_EQ(back->between_islands.bandwidth_bytes_per_s, 20e9);
  Result<Cluster> six = with_devices(*c, 6);
  ASSERT_TRUE(six.is_ok());
  EXPECT_EQ(six->island_devices(), 2);
  EXPECT_TRUE(parse_cluster(cluster_to_json(*six)).is_ok());
  Result<Cluster> two = with_devices(*c, 2);
  ASSERT_TRUE(two.is_ok());
  EXPECT_EQ(two->devices_per_island, 0);  // one island: the whole (smaller) node
  EXPECT_EQ(&two->link_for_axis(2, 1), &two->intra_node);

  j["islands"]["devices"] = 16;
  std::string m = error_of(j);
  EXPECT_NE(m.find("cluster.islands.devices must be at most cluster.devices_per_node (8), got 16"),
            std::string::npos)
      << m;
  j["islands"] = {{"devices", 2}};
  m = error_of(j);
  EXPECT_NE(m.find("cluster.islands"), std::string::npos) << m;
  EXPECT_NE(m.find("link"), std::string::npos) << m;
  j["islands"] = {{"devices", 2}, {"link", {{"bandwidth_bytes_per_s", -1}}}};
  m = error_of(j);
  EXPECT_NE(m.find("cluster.islands.link"), std::string::npos) << m;
  j["islands"] = {{"devices", 0}, {"link", {{"bandwidth_bytes_per_s", 1e9}}}};
  m = error_of(j);
  EXPECT_NE(m.find("cluster.islands"), std::string::npos) << m;
  EXPECT_NE(m.find("devices"), std::string::npos) << m;
}

// A GB200 NVL72 rack: trays of 4 GPUs, all 72 on one NVLink fabric; racks
// meet over the network.
TEST(PlanCluster, NvlinkDomainsJoinWholeNodes) {
  json j = valid_cluster();
  j["nodes"] = 36;  // two domains of 18 nodes
  j["nvlink_domain"] = {{"devices", 72}};
  Result<Cluster> c = parse_cluster(j);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->fabric_devices(), 72);
  EXPECT_EQ(c->island_devices(), 72);
  EXPECT_EQ(&c->link_for_ranks({0, 5}), &c->intra_node);  // two trays, one rack
  EXPECT_EQ(&c->link_for_ranks({0, 71}), &c->intra_node);
  EXPECT_EQ(&c->link_for_ranks({71, 72}), &c->inter_node);  // two racks
  EXPECT_EQ(&c->link_for_ranks({72, 143}), &c->intra_node);
  EXPECT_EQ(&c->link_for_axis(8, 1), &c->intra_node);  // tp=8 over two trays
  EXPECT_EQ(&c->link_for_axis(2, 64), &c->intra_node);
  EXPECT_EQ(&c->link_for_axis(2, 72), &c->inter_node);
  EXPECT_DOUBLE_EQ(c->ring_link_for_axis(16, 1).effective_bandwidth(), 50e9);  // NVLink
  // A ring over both racks: 72 members on each side, each GPU's own port,
  // capped at NVLink's 50 GB/s; two racks one member each: one 10 GB/s port.
  EXPECT_DOUBLE_EQ(c->ring_link_for_axis(144, 1).effective_bandwidth(), 50e9);
  EXPECT_DOUBLE_EQ(c->ring_link_for_axis(144, 1).latency_s, c->inter_node.latency_s);
  EXPECT_DOUBLE_EQ(c->ring_link_for_axis(2, 72).effective_bandwidth(), 10e9);
  // The same cluster without the domain: each tray its own fabric.
  json trays = valid_cluster();
  trays["nodes"] = 36;
  Result<Cluster> t = parse_cluster(trays);
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(&t->link_for_axis(8, 1), &t->inter_node);

  // Written and read back alike; resized clusters keep their domains.
  Result<Cluster> back = parse_cluster(cluster_to_json(*c));
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_EQ(back->devices_per_domain, 72);
  Result<Cluster> eight = with_devices(*c, 8);
  ASSERT_TRUE(eight.is_ok());
  EXPECT_EQ(eight->nodes, 2);
  EXPECT_EQ(&eight->link_for_ranks({0, 7}), &eight->intra_node);
  // Part of one node: the node is the fabric, and the file reads back (on
  // nodes of 8, five devices: 72 is no multiple of 5).
  json wide = j;
  wide["devices_per_node"] = 8, wide["nodes"] = 9;
  Result<Cluster> five = with_devices(value_or_throw(parse_cluster(wide)), 5);
  ASSERT_TRUE(five.is_ok());
  EXPECT_EQ(five->fabric_devices(), 5);
  EXPECT_TRUE(parse_cluster(cluster_to_json(*five)).is_ok());

  j["nvlink_domain"]["devices"] = 6;  // not whole trays
  std::string m = error_of(j);
  EXPECT_NE(m.find("cluster.nvlink_domain.devices must be a whole number of nodes (a multiple of "
                   "cluster.devices_per_node = 4), got 6"),
            std::string::npos)
      << m;
  j["nvlink_domain"] = {{"devices", 72}, {"gpus", 72}};
  EXPECT_NE(error_of(j).find("cluster.nvlink_domain: unknown key 'gpus'"), std::string::npos)
      << error_of(j);
  j["nvlink_domain"] = {{"devices", 8}};
  j["islands"] = {{"devices", 2}, {"link", {{"bandwidth_bytes_per_s", 20e9}}}};
  m = error_of(j);
  EXPECT_NE(m.find("cluster.islands and cluster.nvlink_domain"), std::string::npos) << m;
  j.erase("islands");
  j["nvlink_domain"] = {{"devices", 4}};  // the node itself: no domain
  Result<Cluster> own = parse_cluster(j);
  ASSERT_TRUE(own.is_ok());
  EXPECT_EQ(own->devices_per_domain, 0);
  EXPECT_EQ(own->fabric_devices(), 4);
}

TEST(PlanCluster, WithDevices) {
  Result<Cluster> a100 = load_cluster(source_dir() + "/configs/clusters/dgx_a100_80gb.json");
  ASSERT_TRUE(a100.is_ok());
  Result<Cluster> big = with_devices(*a100, 3072);
  ASSERT_TRUE(big.is_ok());
  EXPECT_EQ(big->nodes, 384);
  EXPECT_EQ(big->devices_per_node, 8);
  EXPECT_EQ(big->total_devices(), 3072);
  Result<Cluster> small = with_devices(*a100, 4);
  ASSERT_TRUE(small.is_ok());
  EXPECT_EQ(small->nodes, 1);
  EXPECT_EQ(small->devices_per_node, 4);
  Result<Cluster> bad = with_devices(*a100, 12);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("valid: <= 8 or a multiple of 8 (e.g. 8 or 16)"),
            std::string::npos)
      << bad.status().message();
  EXPECT_FALSE(with_devices(*a100, 0).is_ok());
}

TEST(PlanCluster, CollectiveTimes) {
  Result<Cluster> c = parse_cluster(valid_cluster());
  ASSERT_TRUE(c.is_ok());
  const Link& in = c->intra_node;  // 100 GB/s * 0.5 = 50 GB/s, 1 us
  const double bytes = 1e9;
  // all_reduce over 4: 2*3*1us + 2*(3/4)*1e9/50e9 = 6e-6 + 0.03
  EXPECT_NEAR(c->collective_time_s(Collective::kAllReduce, 4, bytes, in), 6e-6 + 0.03, 1e-12);
  // all_gather / reduce_scatter / all_to_all over 4: 3us + (3/4)*1e9/50e9 = 3e-6 + 0.015
  for (Collective k : {Collective::kAllGather, Collective::kReduceScatter, Collective::kAllToAll})
    EXPECT_NEAR(c->collective_time_s(k, 4, bytes, in), 3e-6 + 0.015, 1e-12) << collective_name(k);
  EXPECT_NEAR(c->collective_time_s(Collective::kSendRecv, 2, bytes, in), 1e-6 + 0.02, 1e-12);
  EXPECT_EQ(c->collective_time_s(Collective::kAllReduce, 1, bytes, in), 0.0);
  // Over ranks {0, 4}: inter-node, 10 GB/s, 10 us: 2*1*10us + 2*(1/2)*1e9/10e9 = 2e-5 + 0.1
  EXPECT_NEAR(c->collective_time_s(Collective::kAllReduce, {0, 4}, bytes), 2e-5 + 0.1, 1e-12);
}

TEST(PlanCluster, EfficiencyCurveAndRoofline) {
  Result<Cluster> c = parse_cluster(valid_cluster());
  ASSERT_TRUE(c.is_ok());
  EXPECT_DOUBLE_EQ(c->matmul_efficiency(0.01e9), 0.6);  // below the first point: clamped
  EXPECT_DOUBLE_EQ(c->matmul_efficiency(1e9), 0.6);
  EXPECT_DOUBLE_EQ(c->matmul_efficiency(16e9), 0.9);
  EXPECT_DOUBLE_EQ(c->matmul_efficiency(1000e9), 0.95);  // above the last: clamped
  // 4 GFLOP is halfway from 1 to 16 in log space: 0.75.
  EXPECT_NEAR(c->matmul_efficiency(4e9), 0.75, 1e-12);
  // 32 GFLOP: a third of the way from 16 to 128 in log2 (4 -> 5 -> 7): 0.9 + 0.05/3.
  EXPECT_NEAR(c->matmul_efficiency(32e9), 0.9 + 0.05 / 3, 1e-12);
  // Matmul: 16 GFLOP in bf16 at 8 TFLOP/s * 0.9.
  EXPECT_NEAR(c->matmul_time_s(16e9, DType::BF16), 16e9 / (8e12 * 0.9), 1e-15);
  // f16 has no entry: falls back to f32.
  EXPECT_NEAR(c->matmul_time_s(16e9, DType::F16), 16e9 / (1e12 * 0.9), 1e-15);
  EXPECT_NEAR(c->memory_time_s(1e9), 1e9 / (1e11 * 0.5), 1e-15);
  EXPECT_NEAR(c->roofline_time_s(1e9, 1e9, DType::F32), std::max(1e9 / (1e12 * 0.6), 1e9 / 5e10),
              1e-15);
  // A scalar efficiency is the same at every size.
  json j = valid_cluster();
  j["device"]["matmul_efficiency"] = 0.8;
  Result<Cluster> flat = parse_cluster(j);
  ASSERT_TRUE(flat.is_ok()) << flat.status().message();
  EXPECT_DOUBLE_EQ(flat->matmul_efficiency(1e6), 0.8);
  EXPECT_DOUBLE_EQ(flat->matmul_efficiency(1e15), 0.8);
}

// A power limit below the rated power: tensor-core-bound work (GEMMs in any
// dtype, FP8 GEMMs, fused attention) at the cube root of the power ratio,
// memory-bound work as before; the keys' errors name them.
TEST(PlanCluster, PowerLimitSlowsComputeBoundWorkByTheCubeRootOfThePower) {
  json j = valid_cluster();
  j["device"]["peak_flops"]["fp8"] = 16e12;
  j["device"]["rated_power_w"] = 700;
  Result<Cluster> rated = parse_cluster(j);
  ASSERT_TRUE(rated.is_ok()) << rated.status().message();
  EXPECT_DOUBLE_EQ(rated->device.compute_clock_scale(), 1.0);  // no limit: rated
  j["device"]["power_limit_w"] = 500;
  Result<Cluster> capped = parse_cluster(j);
  ASSERT_TRUE(capped.is_ok()) << capped.status().message();
  const double s = std::cbrt(500.0 / 700.0);  // 0.894
  EXPECT_NEAR(capped->device.compute_clock_scale(), s, 1e-12);
  EXPECT_NEAR(capped->matmul_time_s(16e9, DType::BF16), rated->matmul_time_s(16e9, DType::BF16) / s,
              1e-15);
  EXPECT_NEAR(capped->fp8_matmul_time_s(16e9), rated->fp8_matmul_time_s(16e9) / s, 1e-15);
  EXPECT_DOUBLE_EQ(capped->memory_time_s(1e9), rated->memory_time_s(1e9));
  // A memory-bound op's roofline does not move; a compute-bound one's does.
  EXPECT_DOUBLE_EQ(capped->roofline_time_s(1e6, 1e10, DType::BF16),
                   rated->roofline_time_s(1e6, 1e10, DType::BF16));
  EXPECT_GT(capped->roofline_time_s(1e12, 1e6, DType::BF16),
            1.1 * rated->roofline_time_s(1e12, 1e6, DType::BF16));
  // The keys round-trip through the cluster's JSON.
  Result<Cluster> back = parse_cluster(json::parse(format_cluster_json(*capped)));
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_DOUBLE_EQ(back->device.power_limit_w, 500);
  EXPECT_DOUBLE_EQ(back->device.rated_power_w, 700);

  j["device"]["power_limit_w"] = 800;
  std::string m = error_of(j);
  EXPECT_NE(m.find("cluster.device.power_limit_w must be at most rated_power_w (700 W), got 800"),
            std::string::npos)
      << m;
  j["device"]["power_limit_w"] = -5;
  m = error_of(j);
  EXPECT_NE(m.find("cluster.device.power_limit_w must be > 0"), std::string::npos) << m;
  j["device"].erase("rated_power_w");
  j["device"]["power_limit_w"] = 500;
  m = error_of(j);
  EXPECT_NE(m.find("cluster.device.power_limit_w needs rated_power_w"), std::string::npos) << m;
}

// Kernel efficiency by shape: a GEMM with one thin side runs at the grid's
// factor of a square GEMM of its FLOPs, at (its thin side, the geometric
// mean of the other two); a side that is not the thinner, or no grid: 1.
TEST(PlanCluster, ThinMatmulsRunAtTheirShapesFactor) {
  json j = valid_cluster();
  j["device"]["matmul_thin_efficiency"] = json::parse(
      R"({"big": [512, 2048], "dim": [16, 64, 256], "factor": [[0.8, 0.9, 1.0], [0.4, 0.8, 1.0]]})");
  Result<Cluster> c = parse_cluster(j);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_DOUBLE_EQ(c->matmul_shape_factor(512, 512, 512), 1.0);
  // 2048 x 2048 x 16 (any side thin): the grid's corner.
  EXPECT_NEAR(c->matmul_shape_factor(2048, 2048, 16), 0.4, 1e-12);
  EXPECT_NEAR(c->matmul_shape_factor(16, 2048, 2048), 0.4, 1e-12);
  EXPECT_NEAR(c->matmul_shape_factor(512, 16, 512), 0.8, 1e-12);
  // 2048 x 32 x 2048: halfway from 16 to 64 in log: 0.6. Between the bigs
  // (1024 x 1024 x 16): halfway from 0.8 to 0.4.
  EXPECT_NEAR(c->matmul_shape_factor(2048, 32, 2048), 0.6, 1e-12);
  EXPECT_NEAR(c->matmul_shape_factor(1024, 1024, 16), 0.6, 1e-12);
  // The other two sides' geometric mean: 4096 x 1024 x 16 is at big 2048.
  EXPECT_NEAR(c->matmul_shape_factor(4096, 16, 1024), 0.4, 1e-12);
  // Beyond the grid: clamped (a 4-wide side at big 8192 as 16 at 2048).
  EXPECT_NEAR(c->matmul_shape_factor(8192, 8192, 4), 0.4, 1e-12);
  // The time: the curve's, over the factor.
  EXPECT_NEAR(
      c->matmul_time_s(2.0 * 2048 * 2048 * 16, DType::F32) / c->matmul_shape_factor(2048, 2048, 16),
      2.0 * 2048 * 2048 * 16 / (1e12 * c->matmul_efficiency(2.0 * 2048 * 2048 * 16)) / 0.4, 1e-15);
  EXPECT_DOUBLE_EQ(
      value_or_throw(parse_cluster(valid_cluster())).matmul_shape_factor(2048, 2048, 16), 1.0);
  Result<Cluster> back = parse_cluster(json::parse(format_cluster_json(*c)));
  ASSERT_TRUE(back.is_ok()) << back.status().message() << "\n" << format_cluster_json(*c);
  EXPECT_EQ(back->device.matmul_thin_efficiency.factor, c->device.matmul_thin_efficiency.factor);
  EXPECT_NE(format_cluster_json(*c).find("[0.4, 0.8, 1.0]"), std::string::npos)
      << format_cluster_json(*c);
  // A local rank that has one core runs its GEMMs on one thread: share_machine
  // takes the one-thread grid for ranks >= cores, the machine's otherwise.
  j["device"]["matmul_thin_efficiency_one_thread"] =
      json::parse(R"({"big": [2048], "dim": [16], "factor": [[0.5]]})");
  j["nodes"] = 1, j["devices_per_node"] = 1;  // one machine
  const Cluster both = value_or_throw(parse_cluster(j));
  for (const auto& [ranks, cores, factor] : std::vector<std::tuple<int, int, double>>{
           {2, 2, 0.5}, {4, 2, 0.5}, {1, 2, 0.4}, {2, 4, 0.4}})
    EXPECT_DOUBLE_EQ(
        value_or_throw(share_machine(both, ranks, cores)).matmul_shape_factor(2048, 2048, 16),
        factor)
        << ranks << " ranks on " << cores << " cores";
  EXPECT_FALSE(value_or_throw(parse_cluster(json::parse(format_cluster_json(both))))
                   .device.matmul_thin_efficiency_one_thread.empty());
  // What is wrong with a grid, named.
  j = valid_cluster();
  for (const auto& [bad, says] : std::vector<std::pair<std::string, std::string>>{
           {R"([[16, 0.4]])", "matmul_thin_efficiency must be {\"big\""},
           {R"({"big": [2048, 512], "dim": [16], "factor": [[0.4], [0.8]]})",
            "matmul_thin_efficiency.big[1] must increase"},
           {R"({"big": [2048], "dim": [0.5], "factor": [[0.4]]})",
            "matmul_thin_efficiency.dim[0] must be a number >= 1"},
           {R"({"big": [2048], "dim": [16], "factor": [[0.4], [0.8]]})",
            "matmul_thin_efficiency.factor must be 1 rows"},
           {R"({"big": [2048], "dim": [16, 64], "factor": [[0.4]]})",
            "matmul_thin_efficiency.factor[0] must be 2 numbers"},
           {R"({"big": [2048], "dim": [16], "factor": [[1.5]]})",
            "matmul_thin_efficiency.factor[0][0] must be in (0, 1]"}}) {
    j["device"]["matmul_thin_efficiency"] = json::parse(bad);
    const std::string m = error_of(j);
    EXPECT_NE(m.find("cluster.device." + says), std::string::npos) << bad << ": " << m;
  }
}

TEST(PlanCluster, QuickCalibration) {
  CalibrationOptions o;
  o.quick = true;
  Result<Calibration> cal = calibrate(o);
  ASSERT_TRUE(cal.is_ok()) << cal.status().message();
  // About 1.7 s on an idle 2-core machine; the bound catches a runaway
  // calibration under the suite's -j2 load, it does not benchmark it.
  EXPECT_LT(cal->wall_s, 6.0);
  EXPECT_GT(cal->peak_flops, 1e8);
  EXPECT_GT(cal->memory_bandwidth_bytes_per_s, 1e8);
  EXPECT_GT(cal->link_bandwidth_bytes_per_s, 1e6);
  EXPECT_GT(cal->link_latency_s, 0);
  EXPECT_LT(cal->link_latency_s, 0.01);
  ASSERT_EQ(cal->gemm.size(), 4u);
  for (const GemmSample& g : cal->gemm) EXPECT_GT(g.flops_per_s, 0);
  Cluster c = cluster_from_calibration(*cal, "local_cpu");
  const std::string report = format_calibration(*cal);
  Result<Cluster> back = parse_cluster(json::parse(format_cluster_json(c)));
  ASSERT_TRUE(back.is_ok()) << back.status().message() << "\n" << cluster_to_json(c).dump(2);
  EXPECT_NEAR(back->device.peak_flops.f32, cal->peak_flops, 1e-3 * cal->peak_flops);
  EXPECT_EQ(back->device.matmul_efficiency.size(), 4u);
  EXPECT_DOUBLE_EQ(back->matmul_efficiency(1e15), back->device.matmul_efficiency.back().efficiency);
  // The thin GEMMs (bigs 512 and 2048, thin sides 16, 64, 256), each a
  // factor of a square GEMM of the same FLOPs, on all threads and on one.
  for (const ThinGrid* g :
       {&back->device.matmul_thin_efficiency, &back->device.matmul_thin_efficiency_one_thread}) {
    ASSERT_EQ(g->big.size(), 2u);
    ASSERT_EQ(g->dim.size(), 3u);
    for (const std::vector<double>& row : g->factor)
      for (double f : row) {
        EXPECT_GT(f, 0.0);
        EXPECT_LE(f, 1.0);
      }
  }
  // The kernels the roofline misses, each its median time over its roofline
  // on this calibration's numbers (pooling's scalar windows run several times
  // over it; what they are on this machine is the point, so only sane bounds).
  for (const char* kind :
       {"max_pool2d", "max_pool2d_grad", "avg_pool2d", "avg_pool2d_grad", "batch_norm",
        "batch_norm_grad", "conv2d", "conv2d_grad_input", "conv2d_grad_weight"}) {
    ASSERT_EQ(back->device.kernel_time_scale.count(kind), 1u) << kind;
    EXPECT_GT(back->device.kernel_time_scale.at(kind), 0.01) << kind;
    EXPECT_LT(back->device.kernel_time_scale.at(kind), 1000) << kind;
  }
  EXPECT_EQ(back->device.kernel_time_scale, cal->kernel_time_scale);
  EXPECT_EQ(back->device.kernel_scale(OpKind::kMaxPool2d), cal->kernel_time_scale.at("max_pool2d"));
  EXPECT_EQ(back->device.kernel_scale(OpKind::kRelu), 1.0);  // a kind it does not list
  EXPECT_NE(report.find("over their roofline"), std::string::npos);
  EXPECT_NE(report.find("one thin side"), std::string::npos);
  EXPECT_NE(report.find("SGEMM"), std::string::npos);
  EXPECT_NE(report.find("all_reduce"), std::string::npos);
  // The ring step with two ranks a core, written to the file and read back.
  EXPECT_EQ(cal->time_shared_ranks, std::clamp(2 * cal->threads, 4, 64));
  EXPECT_GT(cal->time_shared_latency_s, 0);
  EXPECT_LT(cal->time_shared_latency_s, 0.01);
  EXPECT_NEAR(back->time_shared_latency_s, cal->time_shared_latency_s,
              1e-3 * cal->time_shared_latency_s);
  EXPECT_NE(report.find("time-shared: "), std::string::npos);
}

TEST(PlanCluster, CalibrationRejectsOneRank) {
  CalibrationOptions o;
  o.quick = true;
  o.ranks = 1;
  Result<Calibration> cal = calibrate(o);
  ASSERT_FALSE(cal.is_ok());
  EXPECT_NE(cal.status().message().find("ranks must be >= 2, got 1"), std::string::npos);
}

}  // namespace
}  // namespace meshflow::plan
