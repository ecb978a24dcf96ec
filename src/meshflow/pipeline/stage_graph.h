// Splitting a training graph (forward + backward + optimizer, as Trainer
// builds it) into pipeline chunks: one small Graph per model chunk, holding
// that chunk's forward, backward and optimizer nodes plus copies of the
// sources (parameters, optimizer state, inputs) they read. Values that cross
// a chunk boundary become Inputs of the receiving chunk ("pp.act.<id>",
// "pp.grad.<id>") and are listed, in one fixed order, as the messages the
// runtime sends.
//
//   MF_ASSIGN_OR_RETURN(PipelineSplit split, split_pipeline(g, /*num_chunks=*/4, {}));
//   const ChunkProgram& c = split.chunks[1];
//   Executor ex(c.graph, {.seed = 1, .fetch = c.keep_alive()});
//   ex.run(c.forward);   // after feeding c.act_in from chunk 0's c.act_out
//
// g may be the one-device training graph or a partitioned LocalProgram's
// graph (parallel/partition.h: collectives carry their consumer's layer and
// phase), which is how SPMD stages are made.
// Which chunk a node belongs to:
//   forward   node.layer >= 0: the chunk holding that layer; layer -1: the
//             latest chunk among its inputs' producers (final norm / head /
//             loss -> the last chunk).
//   backward  node.layer >= 0 (autodiff tags a gradient node with its forward
//             node's layer): that layer's chunk; layer -1: the earliest chunk
//             among its inputs' producers (the head's gradient -> the last
//             chunk, the embedding's gradient -> chunk 0).
//   optimizer the chunk of the parameter's gradient, else of what it reads;
//             the clip-coefficient node (global gradient norm) is copied into
//             every chunk, reading the other chunks' sums of squares from
//             Inputs "pp.sumsq.<param>" that the runtime fills (all-reduce
//             over the pipeline); the chunk's optimizer nodes before the clip
//             node (graph order) are ChunkProgram::sum_squares.
//   only sources read (layer -1, or any optimizer node): with its readers (a
//             forward value at the earliest, a backward value at the latest;
//             the embedding lookup -> chunk 0, a gather of a stored ZeRO shard
//             -> its reader's chunk), else with its inputs once placed.
//   metrics   left out (evaluation runs on one device).
// Invariants checked (Status on violation): forward values flow to the same
// or later chunks, gradients to the same or earlier chunks, and a backward
// node reads forward values of its own chunk (or ones sent to it). A
// parameter read by forward or backward nodes of two chunks (tied embeddings
// across the first and last stage) is copied into both and listed in
// PipelineSplit::tied.
//
// Zero-bubble split: a backward node is a weight-gradient node (W) when each
// of its outputs is a parameter's gradient or read only by W nodes, and the
// chunk's outgoing gradient message does not depend on it; the others are
// input-gradient nodes (Bi). In chunk 0 nothing waits for an input gradient,
// so its whole backward is W.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshflow/core/status.h"
#include "meshflow/ir/graph.h"

namespace meshflow {

struct ChunkProgram {
  int chunk = 0;
  int first_layer = 0, num_layers = 0;  // layers [first_layer, first_layer + num_layers)
  Graph graph;
  // Node orders (ids in graph), each in graph order.
  std::vector<NodeId> forward, backward;  // backward = backward_input + backward_weight
  std::vector<NodeId> backward_input, backward_weight;
  std::vector<NodeId>
      sum_squares;             // optimizer nodes before the clip: sums of squares (+ reductions)
  std::vector<NodeId> update;  // clip coefficient + parameter updates
  std::vector<NodeId> metric;  // the chunk with the logits: the argmax hit count (evaluation)
  // Messages (value ids in graph, in message order; matching lists of the
  // neighbour chunk have the same shapes in the same order).
  std::vector<ValueId> act_in;    // Inputs fed from chunk - 1's act_out
  std::vector<ValueId> act_out;   // sent to chunk + 1 after the forward
  std::vector<ValueId> grad_in;   // Inputs fed from chunk + 1's grad_out
  std::vector<ValueId> grad_out;  // sent to chunk - 1 after the (input) backward
  // Stash: values the forward (or inputs fed with it) leaves for the
  // backward of the same micro-batch, saved per micro-batch in flight.
  std::vector<ValueId> stash;
  std::vector<char> stash_for_weight;  // per stash entry: read by a W node (kept until W)
  std::vector<char> stash_for_input;   // per stash entry: read by a Bi node
  // Zero-bubble: values Bi makes (or grad_in) that W reads later.
  std::vector<ValueId> weight_stash;
  ValueId loss = kNoValue;     // the last chunk: the micro-batch loss
  ValueId correct = kNoValue;  // the last chunk of a classifier: argmax hits (metric)
  // Sums of squares: own (parameter name, value) and the Inputs for the others.
  std::vector<std::pair<std::string, ValueId>> norm_out, norm_in;

  // Values the executor must keep readable after a run (messages, stash, norms).
  std::vector<ValueId> keep_alive() const;
  // Per-micro-batch stash bytes held from F to B (to Bi when the backward is
  // split), and, split, from Bi to W: the forward entries W reads plus the W
  // stash.
  int64_t stash_bytes() const;
  int64_t weight_hold_bytes() const;
  // Per stash entry: made by a node of the chunk's forward into the
  // executor's arena and read by no message or metric, so the pipeline
  // trainer has the forward write it straight into the micro-batch's stash
  // buffer and the backward read it there (Executor::bind), with no copy.
  // The others (fed inputs, activations sent on, the loss) are copied out
  // after the forward and back before their first reader.
  std::vector<char> stash_in_place() const;
};

struct PipelineSplit {
  int num_layers = 0;
  std::vector<ChunkProgram> chunks;
  // Parameter names in the order the clip node reads their sums of squares.
  std::vector<std::string> norm_order;
  // Parameters read by forward nodes of several chunks (tied embeddings:
  // chunk 0's lookup and the last chunk's head). Every reading chunk holds a
  // copy; the gradient contributions flow, as gradient messages, to the chunk
  // of the summed gradient (the owner, chunk 0 for embeddings), which alone keeps
  // optimizer state and updates it; the runtime then copies the updated
  // values to the other readers.
  struct Tied {
    std::string name;
    int owner = 0;
    std::vector<int> copies;
  };
  std::vector<Tied> tied;
};

// Layers per chunk: the user's list (one entry per chunk, each >= 1, summing
// to num_layers), or an even split (the first num_layers % num_chunks chunks
// get one more layer). Errors name the sizes and what would be valid.
Result<std::vector<int>> layers_per_chunk(int num_layers, int num_chunks,
                                          const std::vector<int64_t>& requested);

// Layers per chunk balancing the chunks' forward + backward cost (op_cost:
// FLOPs + 10 x bytes), with the embedding counted in the first chunk and the
// final norm, head and loss in the last; a contiguous split minimizing the
// largest chunk. Empty if the graph has fewer blocks than chunks.
std::vector<int64_t> balanced_layers(const Graph& g, int num_chunks);

// Splits g (forward + backward + optimizer). layers: as for layers_per_chunk;
// empty: balanced_layers(g, num_chunks).
Result<PipelineSplit> split_pipeline(const Graph& g, int num_chunks,
                                     const std::vector<int64_t>& layers = {});

}  // namespace meshflow
