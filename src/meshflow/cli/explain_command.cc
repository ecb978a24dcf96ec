#include "meshflow/cli/explain_command.h"

#include <cstdio>
#include <map>

#include "meshflow/ops/op_def.h"
#include "meshflow/runtime/progress.h"
#include "meshflow/runtime/trainer.h"

namespace meshflow::cli {

namespace {
std::string layouts(const std::vector<Layout>& ls) {
  std::string s;
  for (size_t i = 0; i < ls.size(); ++i) s += (i ? ", " : "") + ls[i].to_string();
  return s;
}
}  // namespace

std::string explain_text(const Graph& g, const Annotation& a, const LocalProgram& p,
                         bool list_nodes, int micro_batches) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "mesh %s: %d ranks; program of rank %d: %d nodes (%d global)\n",
                a.mesh.to_string().c_str(), a.mesh.num_ranks(), p.rank, p.graph.num_nodes(),
                g.num_nodes());
  out += line;
  if (list_nodes) {
    out += "\nnode layouts (inputs -> outputs; how chosen):\n";
    for (NodeId id = 0; id < g.num_nodes(); ++id) {
      const Node& n = g.node(id);
      const ShardingStrategy& st = a.node[id];
      std::snprintf(line, sizeof line, "  %-5s %-16s %-34s %s -> %s  (%s)\n",
                    std::string(phase_name(n.phase)).substr(0, 5).c_str(),
                    std::string(op_name(n.kind)).c_str(), n.name.c_str(),
                    n.inputs.empty() ? "" : layouts(st.inputs).c_str(), layouts(st.outputs).c_str(),
                    a.why[id].c_str());
      out += line;
    }
  }
  out += "\ncollectives inserted (per micro-batch in forward/backward, per step in optimizer):\n";
  struct Total {
    int count = 0;
    int64_t bytes = 0;
  };
  std::map<std::pair<std::string, std::string>, Total> totals;  // (phase, kind)
  for (const CollectiveRecord& c : p.collectives) {
    const std::string phase(phase_name(c.phase));
    std::snprintf(line, sizeof line, "  %-9s %-15s over %-3s %-32s for %-32s %s -> %s  %s/rank\n",
                  phase.c_str(), std::string(op_name(c.kind)).c_str(), c.mesh_axis.c_str(),
                  c.value.c_str(), c.consumer.c_str(), c.before.to_string().c_str(),
                  c.after.to_string().c_str(), format_bytes(c.bytes_per_rank).c_str());
    out += line;
    Total& t = totals[{phase, std::string(op_name(c.kind))}];
    ++t.count;
    t.bytes += c.bytes_per_rank;
  }
  if (p.collectives.empty()) out += "  (none: every node reads its inputs where they are)\n";
  out += "\nper step, by phase and kind (" + std::to_string(micro_batches) + " micro-batch(es)):\n";
  int64_t step_bytes = 0;
  for (const auto& [key, t] : totals) {
    const int reps = key.first == "optimizer" ? 1 : micro_batches;
    std::snprintf(line, sizeof line, "  %-9s %-15s %4d x %d  %s/rank\n", key.first.c_str(),
                  key.second.c_str(), t.count, reps, format_bytes(t.bytes * reps).c_str());
    out += line;
    step_bytes += t.bytes * reps;
  }
  out += "  total sent per rank per step: " + format_bytes(step_bytes) + "\n";
  return out;
}

int run_explain(const ExplainOptions& o) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "meshflow: error: %s\n", s.message().c_str());
    return 2;
  };
  Result<RunConfig> rc = load_run_config(o.config, o.overrides);
  if (!rc.is_ok()) return fail(rc.status());
  const StrategyConfig& pc = rc->parallel;
  if (!rc->has_parallel || pc.mode == "data")
    return fail(Status::invalid(
        o.config +
        ": no \"parallel\" section in mode \"semi\" or \"auto\"; data parallel inserts "
        "one gradient all_reduce per bucket (see docs/communication.md)"));
  const Mesh mesh = pc.has_mesh ? pc.mesh : Mesh::line(1, "dp");
  if (o.rank < 0 || o.rank >= mesh.num_ranks())
    return fail(Status::invalid("--rank " + std::to_string(o.rank) + " is not on the mesh " +
                                mesh.to_string() + " (0.." + std::to_string(mesh.num_ranks() - 1) +
                                ")"));
  const int m = rc->train.micro_batches;
  if (rc->train.batch_size % m != 0)
    return fail(Status::invalid("train.batch_size does not split into train.micro_batches"));
  Result<ModelGraph> model = build_training_graph(*rc, rc->train.batch_size / m);
  if (!model.is_ok()) return fail(model.status());
  const PartitionOptions po = partition_options(pc, mesh);
  Result<Annotation> a = annotate(model->graph, mesh, po);
  if (!a.is_ok()) return fail(a.status().with_context("parallel"));
  Result<LocalProgram> p = lower(model->graph, *a, o.rank, po.cost);
  if (!p.is_ok()) return fail(p.status());
  std::fputs(explain_text(model->graph, *a, *p, o.nodes, m).c_str(), stdout);
  return 0;
}

}  // namespace meshflow::cli
