// The shipped model and cluster files (configs/models, configs/clusters), read
// as the planner's tests use them: a bad file stops the test binary with the
// parse error.
//
//   const TrainingJob job{testing::load_model("llama3_8b.json"), 16, 8192};
//   CostModel cm(job, testing::load_sized_cluster("h100_sxm.json", 64));
#pragma once

#include <cstdint>
#include <string>

#include "cli_run.h"
#include "meshflow/config/json_reader.h"
#include "meshflow/core/check.h"
#include "meshflow/models/from_config.h"
#include "meshflow/plan/cluster.h"

namespace meshflow::testing {

inline ModelConfig load_model(const std::string& name) {
  Result<nlohmann::json> j = read_json_file(source_dir() + "/configs/models/" + name);
  MF_CHECK(j.is_ok()) << j.status().message();
  Result<ModelConfig> m = parse_model_config(*j);
  MF_CHECK(m.is_ok()) << m.status().message();
  return *m;
}

// The file resized to `gpus` devices (plan::with_devices).
inline plan::Cluster load_sized_cluster(const std::string& name, int64_t gpus) {
  Result<plan::Cluster> c = plan::load_cluster(source_dir() + "/configs/clusters/" + name);
  MF_CHECK(c.is_ok()) << c.status().message();
  Result<plan::Cluster> n = plan::with_devices(*c, gpus);
  MF_CHECK(n.is_ok()) << n.status().message();
  return *n;
}

}  // namespace meshflow::testing
