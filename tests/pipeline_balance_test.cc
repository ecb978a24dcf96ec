// Automatic stage balancing: without layers_per_stage the blocks are split
// by their cost, with the embedding in the first chunk and the head + loss in
// the last, not by their count.
#include <gtest/gtest.h>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/engine/trainer.h"
#include "meshflow/models/from_config.h"
#include "meshflow/optim/optimizer.h"
#include "meshflow/pipeline/stage_graph.h"

namespace meshflow {
namespace {

Graph training_graph(int64_t vocab, int layers) {
  json m = {{"model_type", "gpt2"},
            {"n_layer", layers},
            {"n_embd", 32},
            {"n_head", 4},
            {"n_positions", 16},
            {"vocab_size", vocab},
            {"tie_word_embeddings", false}};
  ModelGraph g = value_or_throw(build_model_from_json(m, 4, 16));
  append_backward(g.graph);
  append_optimizer(g.graph, {});
  return std::move(g.graph);
}

TEST(PipelineBalance, EqualBlocksWithASmallHeadSplitEvenly) {
  const Graph g = training_graph(64, 8);
  EXPECT_EQ(balanced_layers(g, 2), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(balanced_layers(g, 4), (std::vector<int64_t>{2, 2, 2, 2}));
}

TEST(PipelineBalance, AHeavyHeadGivesTheLastStageFewerBlocks) {
  // vocab 8192 x d 32: the LM head and the loss cost several blocks.
  const Graph g = training_graph(8192, 8);
  const std::vector<int64_t> l = balanced_layers(g, 2);
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0] + l[1], 8);
  EXPECT_GT(l[0], l[1]) << l[0] << " / " << l[1];
  // And split_pipeline uses it when no layers are given.
  PipelineSplit s = value_or_throw(split_pipeline(g, 2));
  ASSERT_EQ(s.num_layers, 8);
}

TEST(PipelineBalance, FewerBlocksThanChunksIsAClearError) {
  const Graph g = training_graph(64, 2);
  EXPECT_TRUE(balanced_layers(g, 4).empty());
  auto r = split_pipeline(g, 4);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("fewer than the 4 pipeline chunks"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace meshflow
