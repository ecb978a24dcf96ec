#include "meshflow/plan/local_graph.h"

#include <algorithm>
#include <string>

#include "meshflow/autodiff/autodiff.h"
#include "meshflow/ir/builder.h"

namespace meshflow::plan {

Result<TransformerDims> transformer_dims(const ModelConfig& model) {
  TransformerDims d;
  if (const auto* g = std::get_if<GptConfig>(&model)) {
    d.llama = false;
    d.layers = g->n_layer;
    d.hidden = g->n_embd;
    d.heads = g->n_head;
    d.kv_heads = g->n_head;
    d.head_dim = g->head_dim();
    d.ffn = g->ffn();
    d.vocab = g->vocab_size;
    d.max_seq = g->n_positions;
    d.tied = g->tie_word_embeddings;
    d.dropout = g->resid_pdrop > 0.f || g->embd_pdrop > 0.f;
    return d;
  }
  if (const auto* l = std::get_if<LlamaConfig>(&model)) {
    d.llama = true;
    d.layers = l->num_hidden_layers;
    d.hidden = l->hidden_size;
    d.heads = l->num_attention_heads;
    d.kv_heads = l->kv_heads();
    d.head_dim = l->head_dim();
    d.ffn = l->intermediate_size;
    d.vocab = l->vocab_size;
    d.max_seq = l->max_position_embeddings;
    d.tied = l->tie_word_embeddings;
    d.dropout = false;
    return d;
  }
  return Status::invalid(
      "the planner prices transformer language models (gpt2, llama); this model is an mlp");
}

namespace {

std::string str(int64_t x) {
  return std::to_string(x);
}

// kv heads one rank holds: kv_heads / tp, or 1 (replicated) when tp > kv_heads.
int64_t local_kv_heads(const TransformerDims& d, int64_t tp) {
  return std::max<int64_t>(1, d.kv_heads / tp);
}

}  // namespace

Status check_local_shape(const TransformerDims& d, const LocalShape& s) {
  if (s.micro_batch < 1 || s.seq < 1 || s.tp < 1 || s.cp < 1)
    return Status::invalid("micro_batch, seq, tp and cp must be >= 1");
  if (d.heads % s.tp != 0)
    return Status::invalid("tp=" + str(s.tp) + " does not divide heads=" + str(d.heads) +
                           " (tensor parallelism splits the attention heads)");
  if (d.kv_heads % s.tp != 0 && s.tp % d.kv_heads != 0)
    return Status::invalid("tp=" + str(s.tp) + " and kv_heads=" + str(d.kv_heads) +
                           ": one must divide the other (kv heads are split or replicated)");
  if (d.ffn % s.tp != 0)
    return Status::invalid("tp=" + str(s.tp) + " does not divide ffn=" + str(d.ffn));
  if (s.seq % s.cp != 0)
    return Status::invalid("cp=" + str(s.cp) + " does not divide seq=" + str(s.seq) +
                           " (context parallelism splits the sequence)");
  if (s.sp && (s.tp < 2 || (s.seq / s.cp) % s.tp != 0))
    return Status::invalid("sp splits the local seq " + str(s.seq / s.cp) + " by tp=" + str(s.tp) +
                           ", which needs tp > 1 dividing it");
  if (s.layers < 1) return Status::invalid("layers must be >= 1, got " + str(s.layers));
  if (s.seq > d.max_seq)
    return Status::invalid("seq=" + str(s.seq) + " exceeds the model's maximum " + str(d.max_seq));
  return Status::ok();
}

Result<Graph> build_local_layer_graph(const ModelConfig& model, const LocalShape& s) {
  MF_ASSIGN_OR_RETURN(TransformerDims d, transformer_dims(model));
  MF_RETURN_IF_ERROR(check_local_shape(d, s));
  // Legend: B micro-batch, T local query seq (seq / cp; keys span cp * T), C hidden,
  // H local heads, K local kv heads, D head_dim, F local ffn, V local vocab.
  const int64_t B = s.micro_batch, T = s.seq / s.cp, C = d.hidden, H = d.heads / s.tp,
                K = local_kv_heads(d, s.tp), D = d.head_dim, F = d.ffn / s.tp,
                V = (d.vocab + s.tp - 1) / s.tp;
  const Dim hidden{"hidden", C}, heads{"heads", H}, kv_heads{"kv_heads", K},
      head_dim{"head_dim", D}, ffn{"ffn", F}, vocab{"vocab", V};
  const Init w = Init::normal(0.02f);
  const float p_drop = d.dropout ? 0.1f : 0.f;

  Graph g;
  try {
    Builder b(g);
    auto param = [&b](const std::string& name, Shape sh, Init init) {
      return b.parameter(b.qualify(name), std::move(sh), init);
    };
    auto dropout = [&](ValueId x, const std::string& name) {
      return p_drop > 0.f ? b.dropout(x, p_drop, 1, name) : x;
    };
    // Keys/values of the whole sequence: the local [B,K,T,D] gathered over the
    // cp ranks (a concat stands for the all_gather's output buffer).
    auto gather_seq = [&](ValueId kv, const std::string& name) {
      if (s.cp == 1) return kv;
      return b.concat(std::vector<ValueId>(static_cast<size_t>(s.cp), kv), 2, name);
    };
    // Sequence parallelism: the replicated region holds seq / tp tokens; a
    // concat of tp copies stands for the all_gather into a tensor-parallel
    // region, a slice for the reduce_scatter out of it.
    const int64_t Ts = s.sp ? T / s.tp : T;
    auto gather_sp = [&](ValueId v, const std::string& name) {
      if (!s.sp) return v;
      return b.concat(std::vector<ValueId>(static_cast<size_t>(s.tp), v), 1, name);
    };
    auto scatter_sp = [&](ValueId v, const std::string& name) {
      return s.sp ? b.slice(v, 1, 0, Ts, name) : v;
    };
    ValueId tokens = b.input("tokens", Shape{{"batch", B}, {"seq", T}}, DType::I32);
    ValueId targets = b.input("targets", Shape{{"batch", B}, {"seq", T}}, DType::I32);
    const std::string embed_name = d.llama ? "model.embed_tokens" : "wte";
    ValueId table = param(embed_name + ".weight", Shape{vocab, hidden}, w);
    ValueId x = b.embedding(table, tokens, embed_name);  // [B,T,C]
    if (!d.llama) {
      ValueId wpe = param("wpe.weight", Shape{{"positions", T}, hidden}, w);
      x = b.add(x, wpe, "embed");
    }
    x = scatter_sp(x, "embed_scatter");
    if (!d.llama) x = dropout(x, "embd_drop");

    for (int64_t layer = 0; layer < s.layers; ++layer) {
      const std::string prefix = (d.llama ? "model.layers." : "h.") + str(layer);
      auto block = b.scope(prefix, static_cast<int>(layer));
      auto norm = [&](ValueId v, const std::string& name) {
        if (d.llama) return b.rms_norm(v, param(name + ".weight", Shape{hidden}, Init::ones()));
        return b.layer_norm(v, param(name + ".weight", Shape{hidden}, Init::ones()),
                            param(name + ".bias", Shape{hidden}, Init::zeros()), 1e-5f, name);
      };
      ValueId a = gather_sp(norm(x, d.llama ? "input_layernorm" : "ln_1"), "ln_1_gather");
      ValueId o;
      {
        auto attn = b.scope(d.llama ? "self_attn" : "attn");
        auto project = [&](const std::string& name, const Dim& n, bool rotate) {
          ValueId y = b.matmul(a, param(name + ".weight", Shape{hidden, n, head_dim}, w), {}, name);
          if (!d.llama)
            y = b.add(y, param(name + ".bias", Shape{n, head_dim}, Init::zeros()),
                      name + ".bias_add");
          if (rotate) y = b.rope(y, 10000.f, name + ".rope");
          return b.transpose(y, {0, 2, 1, 3}, name + ".to_heads");  // [B,n,T,D]
        };
        ValueId q = project("q_proj", heads, d.llama);
        ValueId k = gather_seq(project("k_proj", kv_heads, d.llama), "k_all_gather");
        ValueId v = gather_seq(project("v_proj", kv_heads, false), "v_all_gather");
        ValueId y = b.attention(q, k, v, /*causal=*/true, 0.f, "core");  // [B,H,T,D]
        y = b.transpose(y, {0, 2, 1, 3}, "from_heads");                  // [B,T,H,D]
        const std::string out = d.llama ? "o_proj" : "c_proj";
        o = b.matmul(y, param(out + ".weight", Shape{heads, head_dim, hidden}, w), {.contract = 2},
                     out);  // [B,T,C]
        o = scatter_sp(o, out + ".scatter");
        if (!d.llama) {
          o = b.bias_add(o, param(out + ".bias", Shape{hidden}, Init::zeros()), out + ".bias_add");
          o = dropout(o, "resid_drop");
        }
      }
      x = b.add(x, o, "residual_attn");
      ValueId h = gather_sp(norm(x, d.llama ? "post_attention_layernorm" : "ln_2"), "ln_2_gather");
      {
        auto mlp = b.scope("mlp");
        if (d.llama) {
          ValueId gate =
              b.matmul(h, param("gate_proj.weight", Shape{hidden, ffn}, w), {}, "gate_proj");
          ValueId up = b.matmul(h, param("up_proj.weight", Shape{hidden, ffn}, w), {}, "up_proj");
          ValueId act = b.mul(b.silu(gate, "silu"), up, "swiglu");  // [B,T,F]
          h = scatter_sp(
              b.matmul(act, param("down_proj.weight", Shape{ffn, hidden}, w), {}, "down_proj"),
              "down_proj.scatter");
        } else {
          ValueId w1 = param("c_fc.weight", Shape{hidden, ffn}, w);
          ValueId b1 = param("c_fc.bias", Shape{ffn}, Init::zeros());
          h = b.gelu(b.bias_add(b.matmul(h, w1, {}, "c_fc"), b1, "c_fc.bias_add"), "gelu");
          ValueId w2 = param("c_proj.weight", Shape{ffn, hidden}, w);
          ValueId b2 = param("c_proj.bias", Shape{hidden}, Init::zeros());
          h = scatter_sp(b.matmul(h, w2, {}, "c_proj"), "c_proj.scatter");
          h = dropout(b.bias_add(h, b2, "c_proj.bias_add"), "resid_drop");
        }
      }
      x = b.add(x, h, "residual_mlp");
    }

    if (d.llama) {
      x = b.rms_norm(x, param("model.norm.weight", Shape{hidden}, Init::ones()), 1e-6f,
                     "model.norm");
    } else {
      x = b.layer_norm(x, param("ln_f.weight", Shape{hidden}, Init::ones()),
                       param("ln_f.bias", Shape{hidden}, Init::zeros()), 1e-5f, "ln_f");
    }
    x = gather_sp(x, "ln_f_gather");
    // The vocab-parallel head: each rank's logits are [B,T,V/tp].
    ValueId logits =
        d.tied ? b.matmul(x, table, {.trans_b = true}, "lm_head")
               : b.matmul(x, param("lm_head.weight", Shape{hidden, vocab}, w), {}, "lm_head");
    g.loss = b.cross_entropy(logits, targets, "loss");
    append_backward(g);
  } catch (const StatusError& e) {
    return e.status().with_context("building the local layer graph");
  }
  return g;
}

}  // namespace meshflow::plan
