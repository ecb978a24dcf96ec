// meshflow command line.
//
//   meshflow train CONFIG.json [--steps N] [--set key=value]... [--metrics FILE] [--ranks N]
//                  [--trace FILE]
//   mpirun -np N meshflow train CONFIG.json        (one rank per process, Open MPI)
//   meshflow graph CONFIG.json [--phase all|forward|backward|optimizer]
//   meshflow bench --calibrate [--out FILE] [--quick]   (cluster JSON of this machine, for the
//   planner)
//
// Exit codes: 0 success, 2 a user error (bad config, missing file, invalid
// option) with a one-line message naming the thing and what is valid, 1 a
// failure while running.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "meshflow/cli/bench_command.h"
#include "meshflow/cli/checkpoint_command.h"
#include "meshflow/cli/commands.h"
#include "meshflow/cli/errors.h"
#include "meshflow/cli/explain_command.h"
#include "meshflow/cli/launch_command.h"
#include "meshflow/cli/plan_command.h"
#include "meshflow/kernels/cpu/blas_core.h"

int main(int argc, char** argv) {
  // OpenBLAS's own kernels for this CPU, not its generic fallback (a VM that
  // hides the CPU model): a restart with OPENBLAS_CORETYPE, before anything runs.
  meshflow::cpu::use_supported_blas_kernels(argv);
  CLI::App app{
      "meshflow: train neural networks across devices, choosing how to split the work.\n"
      "Run 'meshflow COMMAND --help' for a command's options."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "meshflow 0.1");

  meshflow::cli::TrainOptions train;
  CLI::App* t = app.add_subcommand("train", "Train a model from a run config (JSON)");
  t->add_option("config", train.config, "Run config JSON (see configs/ and docs/config.md)")
      ->required();
  t->add_option("--steps", train.steps, "Override train.steps")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  t->add_option("--set", train.overrides,
                "Override any config key: --set optimizer.lr=3e-4 (repeatable)");
  t->add_option("--metrics", train.metrics, "Write JSON-lines metrics to FILE");
  t->add_option("--threads", train.threads,
                "Compute threads (default: train.threads, else all cores; 0: all cores)")
      ->check(CLI::Range(0, 1024));
  t->add_option("--checkpoint", train.checkpoint,
                "Override train.checkpoint: a directory of full-state checkpoints (written at the "
                "end and every train.save_every steps), or FILE.safetensors for the weights alone");
  t->add_option("--init", train.init, "Start from the weights of a safetensors file");
  t->add_option("--resume", train.resume,
                "Continue from a full-state checkpoint: its directory, a directory of them (the "
                "latest), or 'latest' (train.checkpoint's latest); any plan's");
  t->add_option("--trace", train.trace,
                "Write a Chrome trace (all ranks in one file; ui.perfetto.dev) of every step");
  t->add_option("--max-restarts", train.max_restarts,
                "In-process ranks: restart a failed job up to N times from the latest checkpoint "
                "of train.checkpoint (a directory), or from the start")
      ->check(CLI::Range(0, 1000));
  t->add_option("--restart-attempt", train.attempt,
                "Set by `meshflow launch` on a restart: continue from train.checkpoint's latest")
      ->group("")
      ->check(CLI::Range(0, 1000));
  t->add_flag("--elastic", train.elastic,
              "With --max-restarts: restart on fewer ranks (the most the job fits below the "
              "failed one's)");
  t->add_flag("--quiet", train.quiet, "Only errors and the final result");
  t->add_flag("--profile", train.profile, "Print kernel time by op kind at the end");
  t->add_flag("--check-plan", train.check_plan,
              "Compare the run with the planner's prediction for its layout (compute, "
              "collectives, optimizer, memory) and say when another plan would be faster "
              "(auto mode always does)");
  t->add_option("--calibrate-from-run", train.calibrate_from_run,
                "Write the local cluster file refitted by this run's plan check (measured vs "
                "predicted compute and collectives; implies --check-plan)");
  t->add_option(
       "--ranks", train.ranks,
       "Data-parallel ranks as threads of this process (under mpirun, ranks are its processes)")
      ->check(CLI::Range(1, 1024));

  meshflow::cli::GraphOptions graph;
  CLI::App* gcmd = app.add_subcommand("graph", "Print the training graph of a run config");
  gcmd->add_option("config", graph.config, "Run config JSON")->required();
  gcmd->add_option("--set", graph.overrides, "Override any config key (repeatable)");
  gcmd->add_option("--phase", graph.phase, "Which nodes: all, forward, backward, optimizer")
      ->check(CLI::IsMember({"all", "forward", "backward", "optimizer"}));

  meshflow::cli::BenchOptions bench;
  CLI::App* bcmd = app.add_subcommand("bench", "Measure this machine for the planner");
  bcmd->add_flag(
      "--calibrate", bench.calibrate,
      "Measure SGEMM rate, memory bandwidth and local all_reduce alpha-beta; print a cluster JSON");
  bcmd->add_option("--out", bench.out,
                   "Write the cluster JSON to FILE (e.g. configs/clusters/local_cpu.json)");
  bcmd->add_flag("--quick", bench.quick, "Smaller sizes (about 0.2 s)");
  bcmd->add_option("--ranks", bench.ranks, "Local ranks for the all_reduce fit")
      ->check(CLI::Range(2, 64));

  meshflow::cli::add_plan_commands(app);
  meshflow::cli::add_checkpoint_commands(app);
  meshflow::cli::add_launch_command(app);

  meshflow::cli::ExplainOptions explain;
  CLI::App* ecmd = app.add_subcommand(
      "explain", "Show how the partitioner splits a run config: layouts and collectives");
  ecmd->add_option("config", explain.config, "Run config JSON with a \"parallel\" section")
      ->required();
  ecmd->add_option("--set", explain.overrides, "Override any config key (repeatable)");
  ecmd->add_option("--rank", explain.rank, "Whose program to show (default 0)");
  ecmd->add_option("--ranks", explain.ranks,
                   "The job's rank count, as `train --ranks N` (default: the config's mesh, "
                   "times the pipeline stages; else 1)")
      ->check(CLI::Range(1, 1 << 20));
  ecmd->add_flag("!--no-nodes", explain.nodes, "Only the collectives and totals");
  ecmd->add_flag("--predict", explain.predict,
                 "The planner's prediction for this layout on this machine (step time, memory) "
                 "beside the fastest plan it prices");

  // Every failure, whatever throws it, ends as one "meshflow: error:" line.
  return meshflow::cli::guard([&]() -> int {
    try {
      app.parse(argc, argv);  // `plan` and `simulate` run (and exit) from here
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
      return meshflow::cli::print_error(
          std::string(e.what()) + " (see meshflow " +
              (app.get_subcommands().empty() ? std::string()
                                             : app.get_subcommands().back()->get_name() + " ") +
              "--help)",
          2);
    }
    if (t->parsed()) return meshflow::cli::run_train(train);
    if (gcmd->parsed()) return meshflow::cli::run_graph(graph);
    if (bcmd->parsed()) return meshflow::cli::run_bench(bench);
    if (ecmd->parsed()) return meshflow::cli::run_explain(explain);
    return 2;
  });
}
