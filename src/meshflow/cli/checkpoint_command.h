// `meshflow checkpoint inspect DIR` and `meshflow checkpoint export DIR --to
// FILE.safetensors`: what a full-state checkpoint (io/checkpoint.h) holds,
// and its model (parameters and buffers) consolidated into one safetensors
// file, which `train --init` (and any safetensors reader) loads.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace meshflow::cli {

struct CheckpointOptions {
  std::string path;     // a checkpoint directory, or a directory of them (its latest)
  bool verify = false;  // inspect: read every file whole and check its CRC-32
  bool json = false;    // inspect: print the manifest
  std::string to;       // export: the safetensors file to write
  bool hf = false;      // export: transformers' names and layouts (GPT-2, LLaMA)
};
int run_checkpoint_inspect(const CheckpointOptions& o);
int run_checkpoint_export(const CheckpointOptions& o);

// Adds `checkpoint inspect` and `checkpoint export` to the CLI.
void add_checkpoint_commands(CLI::App& app);

}  // namespace meshflow::cli
