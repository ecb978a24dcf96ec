#!/usr/bin/python3
"""Hugging Face interop check (issue 14 §2): weights written the way
`transformers` names and lays them out are read by meshflow and written back.

    hf_check.py write DIR gpt2|llama   HF-format weights (hf.safetensors: GPT-2 under
                                       `transformer.` with Conv1D [in, out] weights, fused
                                       c_attn and the attn.bias / masked_bias buffers; LLaMA
                                       with nn.Linear [out, in] weights, GQA and
                                       rotary_emb.inv_freq), config.json, batch.safetensors,
                                       and ref.json: the loss of a forward written against
                                       those tensors as transformers computes it (float64)
    torch_check hf DIR                 meshflow loads hf.safetensors (models/hf_weights.h),
                                       writes its loss (ours.safetensors) and its weights
                                       back in transformers' names (back.safetensors)
    hf_check.py check DIR              loss within 1e-5 relative; every tensor written back
                                       bit-identical to the one read (buffers aside)

Run by tests/torch/run_hf_check.sh (ctest torch_hf_gpt2, torch_hf_llama).
"""

import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_model import read_safetensors  # noqa: E402

B, T, V = 3, 16, 256


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        dt = {"float32": "F32", "int32": "I32"}[str(arr.dtype)]
        b = arr.tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def attention(q, k, v):
    """q [B,H,T,D], k, v [B,K,T,D]: causal, kv heads repeated (transformers' repeat_kv)."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return s.softmax(-1) @ v


def gpt2_logits(W, cfg, tokens):
    """GPT2LMHeadModel.forward: Conv1D is x @ weight + bias, weight [in, out]."""
    H, nh = cfg["n_embd"], cfg["n_head"]
    conv1d = lambda x, p: x @ W[p + ".weight"] + W[p + ".bias"]  # noqa: E731
    ln = lambda x, p: F.layer_norm(x, (H,), W[p + ".weight"], W[p + ".bias"], 1e-5)  # noqa: E731
    x = W["transformer.wte.weight"][tokens] + W["transformer.wpe.weight"][:T]
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(H, dim=-1)
        heads = lambda t: t.view(B, T, nh, H // nh).transpose(1, 2)  # noqa: E731
        y = attention(heads(q), heads(k), heads(v)).transpose(1, 2).reshape(B, T, H)
        x = x + conv1d(y, p + "attn.c_proj")
        h = F.gelu(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh")
        x = x + conv1d(h, p + "mlp.c_proj")
    return ln(x, "transformer.ln_f") @ W["transformer.wte.weight"].t()  # tied lm_head


def llama_logits(W, cfg, tokens):
    """LlamaForCausalLM.forward: nn.Linear weights [out, in]; RoPE with rotate_half."""
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D, eps = H // nh, cfg["rms_norm_eps"]
    rms = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w  # noqa: E731
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    emb = torch.cat([torch.outer(torch.arange(T, dtype=torch.float64), inv)] * 2, dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]

    def rope(t):  # [B, n, T, D]
        return t * cos + torch.cat([-t[..., D // 2:], t[..., :D // 2]], dim=-1) * sin

    x = W["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms(x, W[p + "input_layernorm.weight"])
        q = F.linear(a, W[p + "self_attn.q_proj.weight"]).view(B, T, nh, D).transpose(1, 2)
        k = F.linear(a, W[p + "self_attn.k_proj.weight"]).view(B, T, nkv, D).transpose(1, 2)
        v = F.linear(a, W[p + "self_attn.v_proj.weight"]).view(B, T, nkv, D).transpose(1, 2)
        y = attention(rope(q), rope(k), v).transpose(1, 2).reshape(B, T, H)
        x = x + F.linear(y, W[p + "self_attn.o_proj.weight"])
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        h = F.silu(F.linear(h, W[p + "mlp.gate_proj.weight"])) * F.linear(h, W[p + "mlp.up_proj.weight"])
        x = x + F.linear(h, W[p + "mlp.down_proj.weight"])
    return F.linear(rms(x, W["model.norm.weight"]), W["lm_head.weight"])


def make(model, rng):
    """config (HF keys) and a transformers-style state dict of random weights."""
    w = {}
    normal = lambda *s: (0.2 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    if model == "gpt2":
        cfg = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 32,
               "vocab_size": V, "tie_word_embeddings": True}
        H = 64
        w["transformer.wte.weight"] = normal(V, H)
        w["transformer.wpe.weight"] = normal(32, H)
        for i in range(2):
            p = f"transformer.h.{i}."
            for n in ("ln_1", "ln_2"):
                w[p + n + ".weight"] = 1 + normal(H)
                w[p + n + ".bias"] = normal(H)
            w[p + "attn.bias"] = np.tril(np.ones((1, 1, 32, 32), np.float32))  # a buffer
            w[p + "attn.masked_bias"] = np.array(-1e4, np.float32)
            w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"] = normal(H, 3 * H), normal(3 * H)
            w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"] = normal(H, H), normal(H)
            w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"] = normal(H, 4 * H), normal(4 * H)
            w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"] = normal(4 * H, H), normal(H)
        w["transformer.ln_f.weight"], w["transformer.ln_f.bias"] = 1 + normal(H), normal(H)
        w["lm_head.weight"] = w["transformer.wte.weight"].copy()  # tied: the same values
        return cfg, w
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
           "vocab_size": V, "max_position_embeddings": 32, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "tie_word_embeddings": False}
    H, F_, KV = 64, 96, 32
    w["model.embed_tokens.weight"] = normal(V, H)
    for i in range(2):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + normal(H)
        w[p + "post_attention_layernorm.weight"] = 1 + normal(H)
        w[p + "self_attn.q_proj.weight"] = normal(H, H)
        w[p + "self_attn.k_proj.weight"] = normal(KV, H)
        w[p + "self_attn.v_proj.weight"] = normal(KV, H)
        w[p + "self_attn.o_proj.weight"] = normal(H, H)
        w[p + "self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)  # a buffer
        w[p + "mlp.gate_proj.weight"] = normal(F_, H)
        w[p + "mlp.up_proj.weight"] = normal(F_, H)
        w[p + "mlp.down_proj.weight"] = normal(H, F_)
    w["model.norm.weight"] = 1 + normal(H)
    w["lm_head.weight"] = normal(V, H)
    return cfg, w


def buffer(name):
    return name.endswith((".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq"))


def main():
    mode, d = sys.argv[1], sys.argv[2]
    if mode == "write":
        model = sys.argv[3]
        rng = np.random.default_rng(7)
        cfg, w = make(model, rng)
        tokens = rng.integers(0, V, (B, T)).astype(np.int32)
        targets = rng.integers(0, V, (B, T)).astype(np.int32)
        targets[0, -1] = -1
        write_safetensors(os.path.join(d, "hf.safetensors"), w)
        write_safetensors(os.path.join(d, "batch.safetensors"), {"tokens": tokens, "targets": targets})
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        W = {k: torch.from_numpy(v).double() for k, v in w.items()}
        logits = (gpt2_logits if model == "gpt2" else llama_logits)(W, cfg, torch.from_numpy(tokens).long())
        loss = F.cross_entropy(logits.reshape(-1, V), torch.from_numpy(targets).long().reshape(-1),
                               ignore_index=-1)
        with open(os.path.join(d, "ref.json"), "w") as f:
            json.dump({"loss": loss.item()}, f)
        return 0
    ref = json.load(open(os.path.join(d, "ref.json")))["loss"]
    ours = float(read_safetensors(os.path.join(d, "ours.safetensors"))[0]["loss"])
    hf, _ = read_safetensors(os.path.join(d, "hf.safetensors"))
    back, _ = read_safetensors(os.path.join(d, "back.safetensors"))
    bad = 0
    err = abs(ours - ref) / abs(ref)
    print(f"loss: meshflow {ours:.7f}, transformers-style reference {ref:.7f}, rel err {err:.2e}")
    if err > 1e-5:
        print("FAIL: the loss differs")
        bad += 1
    want = {k for k in hf if not buffer(k)}
    cfg = json.load(open(os.path.join(d, "config.json")))
    if cfg.get("tie_word_embeddings"):
        want.discard("lm_head.weight")  # save_pretrained leaves a tied head out
    if set(back) != want:
        print(f"FAIL: names written back differ: missing {sorted(want - set(back))}, "
              f"extra {sorted(set(back) - want)}")
        bad += 1
    for k in sorted(want & set(back)):
        if back[k].shape != hf[k].shape or not np.array_equal(back[k], hf[k]):
            print(f"FAIL: {k}: {back[k].shape} written back, {hf[k].shape} read, or other values")
            bad += 1
    print(f"{len(want & set(back))} tensors written back in transformers' names, "
          f"{'all identical' if not bad else str(bad) + ' problems'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
