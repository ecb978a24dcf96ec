// User-given strategies (parallel/strategy.h): MindSpore-style split tuples,
// Mesh-TensorFlow-style dim rules applied to GPT graphs, and the "parallel"
// config object.
#include <gtest/gtest.h>

#include "meshflow/config/json_reader.h"
#include "meshflow/models/gpt.h"
#include "meshflow/ops/op_def.h"
#include "meshflow/parallel/strategy.h"

namespace meshflow {
namespace {

// EXPECT_HAS(text, HasSubstr("part")): text contains part (no gmock here).
struct Substr {
  std::string part;
};
Substr HasSubstr(std::string part) {
  return {std::move(part)};
}
::testing::AssertionResult Contains(const std::string& text, const Substr& s) {
  if (text.find(s.part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "\"" << text << "\"\n does not contain \"" << s.part << "\"";
}
#define EXPECT_HAS(text, sub) EXPECT_TRUE(Contains(text, sub))

Mesh mesh_of(const std::string& s) {
  return value_or_throw(Mesh::parse(s));
}
Layout L(const std::string& s) {
  return value_or_throw(Layout::parse(s));
}

std::string error_of(const Status& s) {
  EXPECT_FALSE(s.is_ok());
  return s.message();
}
template <class T>
std::string error_of(const Result<T>& r) {
  EXPECT_FALSE(r.is_ok());
  return r.status().message();
}

Graph tiny_gpt(int64_t batch = 4, int64_t seq = 8) {
  GptConfig c;
  c.n_layer = 2;
  c.n_embd = 16;
  c.n_head = 4;
  c.n_positions = 8;
  c.vocab_size = 32;
  return value_or_throw(build_gpt(c, batch, seq)).graph;
}

NodeId find_node(const Graph& g, const std::string& name) {
  for (NodeId i = 0; i < g.num_nodes(); ++i)
    if (g.node(i).name == name) return i;
  ADD_FAILURE() << "no node " << name;
  return -1;
}

// ---- split tuples: parsing ----

TEST(StrategySplitTuples, Parses) {
  using V = std::vector<std::vector<std::string>>;
  EXPECT_EQ(value_or_throw(parse_split_tuples("((dp, 1), (1, tp))")),
            (V{{"dp", "1"}, {"1", "tp"}}));
  EXPECT_EQ(value_or_throw(parse_split_tuples(" ( (2,1),(1 , 4) ) ")), (V{{"2", "1"}, {"1", "4"}}));
  EXPECT_EQ(value_or_throw(parse_split_tuples("((dp*tp, 1),)")), (V{{"dp*tp", "1"}}));
  EXPECT_EQ(value_or_throw(parse_split_tuples("((dp * tp, 1),)")), (V{{"dp*tp", "1"}}));
  EXPECT_EQ(value_or_throw(parse_split_tuples("((dp,), ())")), (V{{"dp"}, {}}));
  EXPECT_EQ(value_or_throw(parse_split_tuples("[[dp, 1], [1, tp]]")),
            (V{{"dp", "1"}, {"1", "tp"}}));
  EXPECT_EQ(value_or_throw(parse_split_tuples("()")), V{});
}

TEST(StrategySplitTuples, ParseErrors) {
  EXPECT_HAS(error_of(parse_split_tuples("dp, 1")), HasSubstr("expected '('"));
  EXPECT_HAS(error_of(parse_split_tuples("((dp 1))")), HasSubstr("expected ',' or ')'"));
  EXPECT_HAS(error_of(parse_split_tuples("((dp, , 1))")), HasSubstr("empty entry 1"));
  EXPECT_HAS(error_of(parse_split_tuples("((dp, 1)")), HasSubstr("at the end"));
  EXPECT_HAS(error_of(parse_split_tuples("((dp, 1)) x")), HasSubstr("unexpected text"));
  EXPECT_HAS(error_of(parse_split_tuples("(dp, 1)")), HasSubstr("tuple of input 0"));
}

// ---- split entries -> mesh axes ----

TEST(StrategySplitEntries, NamesProductsAndIntegers) {
  Mesh m = mesh_of("dp=2,tp=4");
  EXPECT_EQ(value_or_throw(split_entry_axes("1", m)), std::vector<int>{});
  EXPECT_EQ(value_or_throw(split_entry_axes("dp", m)), std::vector<int>{0});
  EXPECT_EQ(value_or_throw(split_entry_axes(" tp ", m)), std::vector<int>{1});
  EXPECT_EQ(value_or_throw(split_entry_axes("dp*tp", m)), (std::vector<int>{0, 1}));
  EXPECT_EQ(value_or_throw(split_entry_axes("tp*dp", m)), (std::vector<int>{1, 0}));
  EXPECT_EQ(value_or_throw(split_entry_axes("2", m)), std::vector<int>{0});
  EXPECT_EQ(value_or_throw(split_entry_axes("4", m)), std::vector<int>{1});
  EXPECT_EQ(value_or_throw(split_entry_axes("8", m)), (std::vector<int>{0, 1}));
  EXPECT_EQ(mesh_split_counts(m), "1, 2, 4 or 8");
  // Size-1 axes never make an integer ambiguous.
  EXPECT_EQ(value_or_throw(split_entry_axes("4", mesh_of("pp=1,tp=4"))), std::vector<int>{1});
}

TEST(StrategySplitEntries, Errors) {
  Mesh m = mesh_of("dp=2,tp=4");
  EXPECT_EQ(error_of(split_entry_axes("3", m)),
            "split 3 ways, but the mesh {dp: 2, tp: 4} splits only 1, 2, 4 or 8 ways");
  EXPECT_HAS(error_of(split_entry_axes("0", m)), HasSubstr(">= 1"));
  EXPECT_HAS(error_of(split_entry_axes("mp", m)),
             HasSubstr("'mp' is not an axis of the mesh {dp: 2, tp: 4}"));
  EXPECT_HAS(error_of(split_entry_axes("dp*dp", m)), HasSubstr("names mesh axis dp twice"));
  // Ambiguous: 2 is dp or tp; 4 is c or a*b.
  EXPECT_EQ(error_of(split_entry_axes("2", mesh_of("dp=2,tp=2"))),
            "split 2 ways is ambiguous on the mesh {dp: 2, tp: 2}: it could be dp or tp; name the "
            "mesh axes instead");
  EXPECT_HAS(error_of(split_entry_axes("4", mesh_of("a=2,b=2,c=4"))),
             HasSubstr("it could be a*b or c"));
}

// ---- split tuples on GPT nodes ----

TEST(StrategyFromSplits, MegatronMatmulsOnGpt) {
  Graph g = tiny_gpt();
  Mesh m = mesh_of("dp=2,tp=2");
  // Column-parallel c_fc: [B,T,C] x [C,F] -> [B,T,F].
  ShardingStrategy st = value_or_throw(
      strategy_from_splits(g, find_node(g, "h.0.mlp.c_fc"), m, "((dp, 1, 1), (1, tp))"));
  EXPECT_EQ(st.inputs[0], L("[S(0), R]"));
  EXPECT_EQ(st.inputs[1], L("[R, S(1)]"));
  ASSERT_EQ(st.outputs.size(), 1u);
  EXPECT_EQ(st.outputs[0], L("[S(0), S(2)]"));
  // Row-parallel c_proj: [B,T,F] x [F,C] -> Partial on tp.
  st = value_or_throw(
      strategy_from_splits(g, find_node(g, "h.0.mlp.c_proj"), m, "((dp, 1, tp), (tp, 1))"));
  EXPECT_EQ(st.outputs[0], L("[S(0), P]"));
  // Attention q_proj: [B,T,C] x [C,H,D], heads over tp.
  st = value_or_throw(
      strategy_from_splits(g, find_node(g, "h.1.attn.q_proj"), m, "((dp,1,1),(1,tp,1))"));
  EXPECT_EQ(st.outputs[0], L("[S(0), S(2)]"));
  // Integers on a mesh where they are unique: {dp: 2, tp: 4}.
  Mesh m24 = mesh_of("dp=2,tp=4");
  st = value_or_throw(
      strategy_from_splits(g, find_node(g, "h.0.mlp.c_fc"), m24, "((2, 1, 1), (1, 4))"));
  EXPECT_EQ(st.outputs[0], L("[S(0), S(2)]"));
  // Both axes on batch, dp major ("8" = dp*tp) or tp major.
  Graph g8 = tiny_gpt(8);
  st = value_or_throw(
      strategy_from_splits(g8, find_node(g8, "h.0.mlp.c_fc"), m24, "((8, 1, 1), (1, 1))"));
  EXPECT_EQ(st.outputs[0], L("[S(0), S(0)]"));
  st = value_or_throw(
      strategy_from_splits(g8, find_node(g8, "h.0.mlp.c_fc"), m24, "((tp*dp, 1, 1), (1, 1))"));
  EXPECT_EQ(st.inputs[0], L("[S(0)#1, S(0)#0]"));
  EXPECT_EQ(st.outputs[0], L("[S(0)#1, S(0)#0]"));
}

TEST(StrategyFromSplits, ErrorsNameNodeInputDimAndSizes) {
  Graph g = tiny_gpt();
  Mesh m = mesh_of("dp=2,tp=4");
  NodeId fc = find_node(g, "h.0.mlp.c_fc");
  EXPECT_EQ(error_of(strategy_from_splits(g, fc, m, "((1, 1, 1), (3, 1))")),
            "matmul 'h.0.mlp.c_fc': input 1 dim 0 (hidden=16) split 3 ways, but the mesh "
            "{dp: 2, tp: 4} splits only 1, 2, 4 or 8 ways");
  EXPECT_HAS(error_of(strategy_from_splits(g, fc, m, "((1, 1, 1),)")),
             HasSubstr("matmul 'h.0.mlp.c_fc': 1 split tuples"));
  EXPECT_HAS(error_of(strategy_from_splits(g, fc, m, "((1, 1), (1, 1))")),
             HasSubstr("input 0 [batch=4,seq=8,hidden=16] has 3 dims but its split tuple has 2"));
  EXPECT_HAS(error_of(strategy_from_splits(g, fc, m, "((tp, tp, 1), (1, 1))")),
             HasSubstr("mesh axis tp splits both dim 0 and dim 1"));
  // seq=8 cannot be split 8 ways? It can; batch=4 cannot.
  EXPECT_HAS(error_of(strategy_from_splits(g, fc, m, "((dp*tp, 1, 1), (1, 1))")),
             HasSubstr("input 0 dim 0 (batch=4) cannot be split 8 ways (dp*tp); valid splits "
                       "of batch: 1, 2, 4"));
  // Inconsistent K: the rule's error (derive_output_layouts) names the node.
  EXPECT_HAS(error_of(strategy_from_splits(g, fc, m, "((1, 1, tp), (1, 1))")),
             HasSubstr("matmul 'h.0.mlp.c_fc'"));
  EXPECT_HAS(error_of(strategy_from_splits(g, fc, m, "((1, 1, 1), (1, 1")),
             HasSubstr("matmul 'h.0.mlp.c_fc': split tuples"));
  // Softmax-like need-replicate dims are refused by the rule.
  NodeId ln = find_node(g, "h.0.ln_1");
  EXPECT_HAS(error_of(strategy_from_splits(g, ln, m, "((1, 1, tp), (tp,), (tp,))")),
             HasSubstr("must be replicated"));
}

// ---- dim rules ----

TEST(StrategyDimRules, ParseAndApplyToShapes) {
  DimRules r = value_or_throw(DimRules::parse("{batch: dp, ffn: tp, heads: tp}"));
  EXPECT_EQ(r.to_string(), "{batch: dp, ffn: tp, heads: tp}");
  EXPECT_EQ(value_or_throw(DimRules::parse("batch=dp, ffn : tp")).to_string(),
            "{batch: dp, ffn: tp}");
  EXPECT_EQ(value_or_throw(DimRules::parse(R"j({"batch": "dp"})j")).to_string(), "{batch: dp}");
  EXPECT_EQ(value_or_throw(DimRules::from_json(json{{"heads", "tp"}})).to_string(), "{heads: tp}");
  EXPECT_HAS(error_of(DimRules::parse("batch dp")), HasSubstr("'batch dp' is not 'dim: axis'"));
  EXPECT_HAS(error_of(DimRules::parse("batch: dp, batch: tp")), HasSubstr("two rules"));
  EXPECT_HAS(error_of(DimRules::from_json(json{{"batch", 2}})),
             HasSubstr("rules.batch must be a mesh axis name"));
  EXPECT_HAS(error_of(r.check(mesh_of("dp=2"))), HasSubstr("'tp' is not an axis"));

  Mesh m = mesh_of("dp=2,tp=2");
  Shape act{{"batch", 4}, {"seq", 8}, {"ffn", 64}};
  EXPECT_EQ(value_or_throw(apply_rules(r, m, act)), L("[S(0), S(2)]"));
  EXPECT_EQ(value_or_throw(apply_rules(r, m, Shape{{"hidden", 16}, {"ffn", 64}})), L("[R, S(1)]"));
  // ffn and heads both want tp: the earlier rule (ffn) takes it, heads is replicated.
  EXPECT_EQ(value_or_throw(apply_rules(r, m, Shape{{"heads", 4}, {"ffn", 64}})), L("[R, S(1)]"));
  EXPECT_EQ(value_or_throw(apply_rules(r, m, Shape{})), L("[R, R]"));
  EXPECT_EQ(error_of(apply_rules(r, m, Shape{{"batch", 3}})),
            "[batch=3] dim 0 (batch=3) cannot be split 2 ways over mesh axis dp (rule batch: dp); "
            "valid splits of batch: 1, 3");
}

TEST(StrategyDimRules, DataParallelOnGpt) {
  Graph g = tiny_gpt();
  Mesh m = mesh_of("dp=2,tp=2");
  RulesReport rep = value_or_throw(apply_rules(g, m, value_or_throw(DimRules::parse("batch: dp"))));
  ASSERT_EQ(static_cast<int>(rep.layouts.size()), g.num_values());
  for (ValueId v = 0; v < g.num_values(); ++v) {
    const Shape& s = g.shape(v);
    SCOPED_TRACE(g.value(v).name + " " + s.to_string());
    int b = s.index_of("batch");
    if (b >= 0) {
      EXPECT_EQ(rep.layouts[v],
                Layout::make({Placement::Shard(b), Placement::Replicate()}).value());
    } else {
      EXPECT_TRUE(rep.layouts[v].is_replicated());
    }
  }
  for (ValueId p : g.parameters()) EXPECT_TRUE(rep.layouts[p].is_replicated());
  // Every op of the blocks runs batch-parallel without resharding; only the
  // reductions over the batch (the loss) need one.
  std::string flagged;
  for (size_t i = 0; i < rep.needs_reshard.size(); ++i)
    flagged += node_label(g.node(rep.needs_reshard[i])) + ": " + rep.reasons[i] + "\n";
  for (NodeId id = 0; id < g.num_nodes(); ++id) {
    const Node& n = g.node(id);
    if (n.name.rfind("h.", 0) == 0) {
      EXPECT_FALSE(rep.needs(id)) << node_label(n) << "\n" << flagged;
    }
  }
  EXPECT_FALSE(rep.needs_reshard.empty()) << "the loss reduces over the batch";
  // Exactly the loss (its mean needs the whole batch) and the metric count (a Partial sum).
  ASSERT_EQ(rep.needs_reshard.size(), 2u) << flagged;
  EXPECT_EQ(g.node(rep.needs_reshard[0]).kind, OpKind::kCrossEntropy) << flagged;
}

TEST(StrategyDimRules, MegatronOnGpt) {
  Graph g = tiny_gpt();
  Mesh m = mesh_of("dp=2,tp=2");
  RulesReport rep = value_or_throw(
      apply_rules(g, m, value_or_throw(DimRules::parse("{batch: dp, ffn: tp, heads: tp}"))));
  auto layout_of_param = [&](const std::string& name) { return rep.layouts[g.find(name)]; };
  // Column-parallel weights split on their output dim, row-parallel on their input dim.
  EXPECT_EQ(layout_of_param("h.0.mlp.c_fc.weight"), L("[R, S(1)]"));
  EXPECT_EQ(layout_of_param("h.0.mlp.c_fc.bias"), L("[R, S(0)]"));
  EXPECT_EQ(layout_of_param("h.0.mlp.c_proj.weight"), L("[R, S(0)]"));
  EXPECT_EQ(layout_of_param("h.0.mlp.c_proj.bias"), L("[R, R]"));
  for (const char* w : {"q_proj", "k_proj", "v_proj"})
    EXPECT_EQ(layout_of_param(std::string("h.1.attn.") + w + ".weight"), L("[R, S(1)]")) << w;
  EXPECT_EQ(layout_of_param("h.1.attn.c_proj.weight"), L("[R, S(0)]"));
  EXPECT_EQ(layout_of_param("wte.weight"), L("[R, R]"));

  std::string flagged;
  for (size_t i = 0; i < rep.needs_reshard.size(); ++i)
    flagged += node_label(g.node(rep.needs_reshard[i])) + ": " + rep.reasons[i] + "\n";
  for (int layer = 0; layer < 2; ++layer) {
    const std::string h = "h." + std::to_string(layer);
    // Column-parallel matmuls and the attention core run as laid out.
    for (const std::string n :
         {".mlp.c_fc", ".mlp.gelu", ".attn.q_proj", ".attn.k_proj", ".attn.v_proj", ".attn.core"})
      EXPECT_FALSE(rep.needs(find_node(g, h + n))) << h + n << "\n" << flagged;
    // Row-parallel matmuls give Partial sums where the rules say replicated:
    // the partitioner's all-reduce goes there.
    for (const std::string n : {".mlp.c_proj", ".attn.c_proj"}) {
      NodeId id = find_node(g, h + n);
      ASSERT_TRUE(rep.needs(id)) << h + n << "\n" << flagged;
      size_t k = std::find(rep.needs_reshard.begin(), rep.needs_reshard.end(), id) -
                 rep.needs_reshard.begin();
      EXPECT_HAS(rep.reasons[k], HasSubstr("would be [S(0), P]"));
    }
  }
  // The four row-parallel matmuls, the loss and the metric count.
  EXPECT_EQ(rep.needs_reshard.size(), 6u) << flagged;
}

TEST(StrategyDimRules, GraphErrorsNameTheValue) {
  Graph g = tiny_gpt(3);
  Mesh m = mesh_of("dp=2,tp=2");
  EXPECT_HAS(error_of(apply_rules(g, m, value_or_throw(DimRules::parse("batch: dp")))),
             HasSubstr("value 'tokens': [batch=3,seq=8] dim 0 (batch=3) cannot be split 2 ways"));
  EXPECT_HAS(error_of(apply_rules(g, m, value_or_throw(DimRules::parse("batch: pp")))),
             HasSubstr("'pp' is not an axis of the mesh {dp: 2, tp: 2}"));
}

// ---- config ----

TEST(StrategyConfigTest, ParsesFullObject) {
  json j = json::parse(R"j({
    "mode": "semi", "mesh": {"dp": 2, "tp": 2},
    "rules": {"batch": "dp", "ffn": "tp", "heads": "tp"},
    "strategies": {"h.*.mlp.c_fc": "((dp, 1, 1), (1, tp))", "h.0.mlp.c_fc": "((dp*tp,1,1),(1,1))",
                   "h.*.attn.*": "((dp,1,1),(1,tp,1))", "h.*.attn.c_proj": "((dp,1,tp,1),(tp,1,1))"}
  })j");
  StrategyConfig c = value_or_throw(parse_strategy_config(j));
  EXPECT_EQ(c.mode, "semi");
  EXPECT_TRUE(c.has_mesh);
  EXPECT_EQ(c.mesh, mesh_of("dp=2,tp=2"));
  EXPECT_EQ(c.rules.to_string(), "{batch: dp, ffn: tp, heads: tp}");
  ASSERT_EQ(c.strategies.size(), 4u);
  EXPECT_EQ(*c.strategy_for("h.0.mlp.c_fc"), "((dp*tp,1,1),(1,1))");  // exact wins
  EXPECT_EQ(*c.strategy_for("h.1.mlp.c_fc"), "((dp, 1, 1), (1, tp))");
  EXPECT_EQ(*c.strategy_for("h.1.attn.c_proj"), "((dp,1,tp,1),(tp,1,1))");  // most specific
  EXPECT_EQ(*c.strategy_for("h.1.attn.q_proj"), "((dp,1,1),(1,tp,1))");
  EXPECT_EQ(c.strategy_for("h.1.mlp.c_proj"), nullptr);

  // The strategies apply to the GPT nodes they name.
  Graph g = tiny_gpt();
  for (const char* name : {"h.0.mlp.c_fc", "h.1.mlp.c_fc", "h.1.attn.c_proj", "h.1.attn.v_proj"})
    EXPECT_TRUE(strategy_from_splits(g, find_node(g, name), c.mesh, *c.strategy_for(name)).is_ok())
        << name;

  StrategyConfig d =
      value_or_throw(parse_strategy_config(json::parse(R"j({"mesh": "tp=2,dp=4"})j")));
  EXPECT_EQ(d.mode, "data");
  EXPECT_EQ(d.mesh, mesh_of("tp=2,dp=4"));
  EXPECT_FALSE(value_or_throw(parse_strategy_config(json::object())).has_mesh);
  EXPECT_EQ(
      value_or_throw(parse_strategy_config(json::parse(
                         R"j({"mode": "hybrid", "mesh": "dp=2,tp=2", "rules": "batch: dp"})j")))
          .rules.to_string(),
      "{batch: dp}");
}

TEST(StrategyConfigTest, ErrorsNameTheKey) {
  auto err = [](const char* text) { return error_of(parse_strategy_config(json::parse(text))); };
  EXPECT_HAS(err(R"j({"mdoe": "data"})j"), HasSubstr("mdoe"));
  EXPECT_HAS(err(R"j({"mode": "magic"})j"), HasSubstr("parallel.mode"));
  EXPECT_HAS(err(R"j({"preset": "fsdp"})j"), HasSubstr("parallel.preset"));
  EXPECT_HAS(err(R"j({"mesh": "tp=2", "zero": 1})j"), HasSubstr("no axis named dp"));
  EXPECT_HAS(err(R"j({"mesh": {"dp": 0}})j"),
             HasSubstr("parallel.mesh.dp must be an integer >= 1 (the axis size), got 0"));
  EXPECT_HAS(err(R"j({"mesh": {"dp": "2"}})j"), HasSubstr("parallel.mesh.dp must be an integer"));
  EXPECT_HAS(err(R"j({"mesh": [2, 2]})j"), HasSubstr("parallel.mesh must be an object"));
  EXPECT_HAS(err(R"j({"mesh": "dp=x"})j"), HasSubstr("parallel.mesh"));
  EXPECT_HAS(err(R"j({"mode": "semi", "mesh": {"dp": 2}, "rules": {"batch": 1}})j"),
             HasSubstr("parallel.rules.batch must be a mesh axis name"));
  EXPECT_HAS(err(R"j({"mode": "semi", "mesh": {"dp": 2}, "rules": {"batch": "tp"}})j"),
             HasSubstr("parallel.rules: rule batch: tp: 'tp' is not an axis"));
  EXPECT_HAS(err(R"j({"mode": "semi", "mesh": {"dp": 2}, "rules": [1]})j"),
             HasSubstr("parallel.rules must be an object"));
  EXPECT_HAS(err(R"j({"mode": "semi", "mesh": {"dp": 2}, "strategies": ["x"]})j"),
             HasSubstr("parallel.strategies must be an object"));
  EXPECT_HAS(err(R"j({"mode": "semi", "mesh": {"dp": 2}, "strategies": {"h.0.c_fc": 3}})j"),
             HasSubstr("parallel.strategies.h.0.c_fc must be a string"));
  EXPECT_HAS(err(R"j({"mode": "semi", "mesh": {"dp": 2}, "strategies": {"h.0.c_fc": "(dp)"}})j"),
             HasSubstr("parallel.strategies.h.0.c_fc: split tuples"));
  EXPECT_EQ(
      err(R"j({"mode": "semi", "mesh": {"dp": 2, "tp": 4}, "strategies": {"x": "((3,1),)"}})j"),
      "parallel.strategies.x: input 0 dim 0 split 3 ways, but the mesh {dp: 2, tp: 4} "
      "splits only 1, 2, 4 or 8 ways");
  EXPECT_HAS(err(R"j({"mesh": {"dp": 2}, "rules": {"batch": "dp"}})j"),
             HasSubstr("parallel.rules is not used in mode \"data\""));
  EXPECT_HAS(err(R"j({"mesh": {"dp": 2}, "strategies": {"x": "((dp,),)"}})j"),
             HasSubstr("parallel.strategies is not used in mode \"data\""));
  EXPECT_HAS(error_of(parse_strategy_config(json(3))), HasSubstr("parallel must be an object"));
}

TEST(StrategyConfigTest, GlobMatch) {
  EXPECT_TRUE(glob_match("h.*.mlp.c_fc", "h.12.mlp.c_fc"));
  EXPECT_FALSE(glob_match("h.*.mlp.c_fc", "h.1.mlp.c_proj"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("h.?.attn.*", "h.3.attn.q_proj"));
  EXPECT_FALSE(glob_match("h.?.attn.*", "h.13.attn.q_proj"));
  EXPECT_TRUE(glob_match("*c_proj", "h.0.attn.c_proj"));
  EXPECT_FALSE(glob_match("c_proj", "h.0.attn.c_proj"));
}

}  // namespace
}  // namespace meshflow
