#!/usr/bin/python3
"""Numerics check of meshflow's GPT / LLaMA / ResNet against PyTorch.

Reads the files tests/torch_check.cc writes into DIR (weights, batch, grads,
after_steps; see there), builds the same model in plain PyTorch, and compares:
  - the loss and the gradient of every parameter after one forward + backward,
  - every parameter after `steps` optimizer steps on the same batch:
    torch.optim.AdamW for GPT / LLaMA (global-norm clipping and decoupled
    weight decay as meshflow's optimizer), torch.optim.SGD with momentum (and
    weight decay, optionally Nesterov) for ResNet,
  - ResNet: the batch-norm running mean / variance after those steps (one
    update per training forward, as torch's BatchNorm2d in training mode), and
    meshflow's initial running statistics against BatchNorm2d's (0 and 1).
Error per tensor: max|meshflow - torch| / max|torch|. Prints a table; exits 1
if any error exceeds --tol (default 1e-4).

    torch_check gpt /tmp/x && /usr/bin/python3 tests/torch/check_model.py /tmp/x

The reference runs in float64 by default, so the errors shown are meshflow's
own (f32) rounding; --dtype float32 compares f32 against f32 instead.

Weights are kept in meshflow's layout ([in.., out..], x @ W; attention
projections [hidden, heads, head_dim] and [heads, head_dim, hidden]) and viewed
in PyTorch's nn.Linear layout ([out, in]) where the forward uses them, so the
gradients come out in meshflow's layout. Convolution weights are [out, in, kh,
kw] on both sides. The safetensors files are parsed by hand (struct + numpy),
no safetensors package.
"""

import argparse
import json
import math
import os
import struct
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - environment problem
    sys.stderr.write(
        f"check_model.py: cannot import torch/numpy with {sys.executable} ({e}).\n"
        "The PyTorch numerics check needs Debian's python3-torch and python3-numpy for "
        "/usr/bin/python3: run scripts/install-deps.sh\n")
    sys.exit(1)


# ----- safetensors, by hand -----

_DTYPES = {"F32": "<f4", "I32": "<i4", "F64": "<f8", "I64": "<i8"}


def read_safetensors(path):
    """Returns ({name: np.ndarray}, metadata dict)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: {len(data)} bytes, too short")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} runs past the end ({len(data)} bytes)")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    out = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        if e["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has dtype {e['dtype']}")
        arr = np.frombuffer(data, dtype=_DTYPES[e["dtype"]], count=(end - begin) //
                            np.dtype(_DTYPES[e["dtype"]]).itemsize, offset=base + begin)
        out[name] = arr.reshape(e["shape"]).copy()
    return out, meta


# ----- the models, in plain PyTorch -----


class Params(dict):
    """Parameter tensors by meshflow name; remembers which ones the model read."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.used = set()

    def __getitem__(self, name):
        self.used.add(name)
        return super().__getitem__(name)


def linear(x, w, b=None, n_in=1):
    """x @ w for a meshflow weight w [in.., out..], computed as PyTorch's nn.Linear does
    with its [out, in] weight: F.linear(x, w.reshape(in, out).t(), b)."""
    in_shape, out_shape = w.shape[:n_in], w.shape[n_in:]
    w_pt = w.reshape(math.prod(in_shape), math.prod(out_shape)).t()  # [out, in]
    lead = x.shape[:x.dim() - n_in]
    y = F.linear(x.reshape(*lead, -1), w_pt, None if b is None else b.reshape(-1))
    return y.reshape(*lead, *out_shape)


def causal_attention(q, k, v):
    """q [B,H,T,D], k and v [B,K,T,D] (K divides H; query head h reads kv head h // (H/K),
    as Hugging Face's repeat_kv) -> [B,H,T,D]."""
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    T = q.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v


def gpt_logits(P, cfg, tokens):
    B, T = tokens.shape
    C, L = cfg["n_embd"], cfg["n_layer"]
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    x = F.embedding(tokens, P["wte.weight"]) + P["wpe.weight"][:T]  # [B,T,C]
    for i in range(L):
        p = f"h.{i}."
        a = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps)
        q, k, v = (linear(a, P[p + f"attn.{n}.weight"], P[p + f"attn.{n}.bias"]).transpose(1, 2)
                   for n in ("q_proj", "k_proj", "v_proj"))  # [B,H,T,D]
        y = causal_attention(q, k, v).transpose(1, 2)  # [B,T,H,D]
        x = x + linear(y, P[p + "attn.c_proj.weight"], P[p + "attn.c_proj.bias"], n_in=2)
        h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps)
        h = F.gelu(linear(h, P[p + "mlp.c_fc.weight"], P[p + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + linear(h, P[p + "mlp.c_proj.weight"], P[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], eps)
    if cfg.get("tie_word_embeddings", True):
        return F.linear(x, P["wte.weight"])  # wte is [V, C]: already nn.Linear's [out, in]
    return linear(x, P["lm_head.weight"])


def rms_norm(x, w, eps):
    """Hugging Face LlamaRMSNorm."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):
    """x [B,T,n,D]; Hugging Face LLaMA's rotary embedding (rotate_half: pairs (i, i + D/2))."""
    T, D = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1).to(x.dtype)  # [T, D]
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def llama_logits(P, cfg, tokens):
    L = cfg["num_hidden_layers"]
    eps = cfg.get("rms_norm_eps", 1e-6)
    theta = cfg.get("rope_theta", 10000.0)
    x = F.embedding(tokens, P["model.embed_tokens.weight"])  # [B,T,C]
    for i in range(L):
        p = f"model.layers.{i}."
        a = rms_norm(x, P[p + "input_layernorm.weight"], eps)
        q = rope(linear(a, P[p + "self_attn.q_proj.weight"]), theta).transpose(1, 2)  # [B,H,T,D]
        k = rope(linear(a, P[p + "self_attn.k_proj.weight"]), theta).transpose(1, 2)  # [B,K,T,D]
        v = linear(a, P[p + "self_attn.v_proj.weight"]).transpose(1, 2)
        y = causal_attention(q, k, v).transpose(1, 2)  # [B,T,H,D]
        x = x + linear(y, P[p + "self_attn.o_proj.weight"], n_in=2)
        h = rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
        h = F.silu(linear(h, P[p + "mlp.gate_proj.weight"])) * linear(h, P[p + "mlp.up_proj.weight"])
        x = x + linear(h, P[p + "mlp.down_proj.weight"])
    x = rms_norm(x, P["model.norm.weight"], eps)
    if cfg.get("tie_word_embeddings", False):
        return F.linear(x, P["model.embed_tokens.weight"])
    return linear(x, P["lm_head.weight"])


# Hugging Face ResNetConvLayer's BatchNorm2d defaults.
BN_EPS, BN_MOMENTUM = 1e-5, 0.1


def is_running_stat(name):
    return name.endswith(".running_mean") or name.endswith(".running_var")


def resnet_logits(P, S, cfg, x):
    """Hugging Face ResNetForImageClassification in training mode (batch norm on the
    batch's statistics; updates the running statistics S in place). x [B, C*H*W]."""
    act = {"relu": F.relu, "gelu": F.gelu}[cfg.get("hidden_act", "relu")]
    size = cfg.get("image_size", 224)
    x = x.reshape(x.shape[0], cfg.get("num_channels", 3), size, size)

    def conv_bn(h, name, stride, activation):
        w = P[name + ".convolution.weight"]  # [out, in, k, k], nn.Conv2d's layout
        h = F.conv2d(h, w, stride=stride, padding=w.shape[-1] // 2)
        n = name + ".normalization."
        h = F.batch_norm(h, S[n + "running_mean"], S[n + "running_var"], P[n + "weight"],
                         P[n + "bias"], training=True, momentum=BN_MOMENTUM, eps=BN_EPS)
        return act(h) if activation else h

    # ResNetEmbeddings: 7x7/2 conv + batch norm + act, 3x3/2 max pool (padding 1).
    x = conv_bn(x, "embedder.embedder", 2, True)
    x = F.max_pool2d(x, kernel_size=3, stride=2, padding=1)
    # ResNetEncoder: stage i's first layer has stride 2, but the first stage's only
    # with downsample_in_first_stage; a projection shortcut where the shape changes.
    in_ch = cfg["embedding_size"]
    bottleneck = cfg.get("layer_type", "bottleneck") == "bottleneck"
    in_bottleneck = cfg.get("downsample_in_bottleneck", False)
    for i, (out_ch, depth) in enumerate(zip(cfg["hidden_sizes"], cfg["depths"])):
        for j in range(depth):
            stride = 1 if j > 0 else (2 if i > 0 or cfg.get("downsample_in_first_stage") else 1)
            p = f"encoder.stages.{i}.layers.{j}."
            residual = x
            if in_ch != out_ch or stride != 1:
                residual = conv_bn(x, p + "shortcut", stride, False)
            if bottleneck:  # 1x1 to out/4, 3x3, 1x1 to out
                h = conv_bn(x, p + "layer.0", stride if in_bottleneck else 1, True)
                h = conv_bn(h, p + "layer.1", 1 if in_bottleneck else stride, True)
                h = conv_bn(h, p + "layer.2", 1, False)
            else:  # two 3x3
                h = conv_bn(x, p + "layer.0", stride, True)
                h = conv_bn(h, p + "layer.1", 1, False)
            x = act(h + residual)
            in_ch = out_ch
    # ResNetModel's pooler (AdaptiveAvgPool2d(1)), then classifier = Flatten, Linear.
    x = F.adaptive_avg_pool2d(x, 1).flatten(1)
    return linear(x, P["classifier.1.weight"], P["classifier.1.bias"])


def loss_fn(model, P, S, cfg, batch):
    if model.startswith("resnet"):
        return F.cross_entropy(resnet_logits(P, S, cfg, batch["x"]), batch["labels"])
    logits = (gpt_logits if model.startswith("gpt") else llama_logits)(P, cfg, batch["tokens"])
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), batch["targets"].reshape(-1), ignore_index=-1)


# ----- comparison -----


def rel_err(ours, ref, floor=0.0):
    """max|ours - ref| / max(max|ref|, floor), and max|ref|."""
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ours.shape != ref.shape:
        return float("inf"), float("nan")
    diff = float(np.max(np.abs(ours - ref))) if ref.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    denom = max(scale, floor)
    if denom == 0.0:
        return (0.0 if diff == 0.0 else float("inf")), scale
    return diff / denom, scale


class Table:
    def __init__(self, tol):
        self.tol = tol
        self.rows = []

    def add(self, section, name, shape, ours, ref, floor=0.0):
        err, scale = rel_err(ours, ref, floor)
        self.rows.append((section, name, shape, scale, err, scale < floor))
        return err

    def print(self):
        w = max(len(r[1]) for r in self.rows)
        print(f"{'check':<6} {'tensor':<{w}} {'shape':<14} {'max|torch|':>11} {'rel err':>10}")
        for section, name, shape, scale, err, floored in self.rows:
            mark = (" *" if floored else "") + ("" if err <= self.tol else "   <-- FAIL")
            shp = "x".join(str(s) for s in shape) or "scalar"
            print(f"{section:<6} {name:<{w}} {shp:<14} {scale:11.4g} {err:10.3e}{mark}")
        if any(r[5] for r in self.rows):
            print("* gradient zero in exact arithmetic (e.g. a key bias: softmax ignores a shift "
                  "shared by all keys);\n  error relative to 1e-2 x the largest gradient instead")

    def worst(self, section):
        errs = [r[4] for r in self.rows if r[0] == section]
        return max(errs) if errs else 0.0

    def failures(self):
        return [r for r in self.rows if not r[4] <= self.tol]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="directory torch_check wrote its files into")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    args = ap.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    dtype = getattr(torch, args.dtype)

    weights, meta = read_safetensors(os.path.join(args.dir, "weights.safetensors"))
    batch_np, _ = read_safetensors(os.path.join(args.dir, "batch.safetensors"))
    grads, _ = read_safetensors(os.path.join(args.dir, "grads.safetensors"))
    after, after_meta = read_safetensors(os.path.join(args.dir, "after_steps.safetensors"))
    model = meta["model"]
    cfg = json.loads(meta["config"])
    steps = int(meta["steps"])
    optimizer = meta.get("optimizer", "adamw")
    lr, wd, clip = float(meta["lr"]), float(meta["weight_decay"]), float(meta["grad_clip"])
    decay_all = meta.get("decay_all") == "true"

    P = Params({n: torch.tensor(a, dtype=dtype, requires_grad=True) for n, a in weights.items()
                if not is_running_stat(n)})
    # Batch-norm running statistics: buffers, not parameters. The reference
    # starts from meshflow's (so the update is checked on its own); whether
    # those match BatchNorm2d's initial 0 / 1 is a separate "init" row.
    S = {n: torch.tensor(a, dtype=dtype) for n, a in weights.items() if is_running_stat(n)}
    batch = {n: torch.tensor(a, dtype=dtype if a.dtype.kind == "f" else torch.long)
             for n, a in batch_np.items()}
    table = Table(args.tol)
    problems = []
    for name, s in S.items():
        init = torch.zeros_like(s) if name.endswith("running_mean") else torch.ones_like(s)
        table.add("init", name, s.shape, s.numpy(), init.numpy())

    # One forward + backward.
    loss = loss_fn(model, P, S, cfg, batch)
    loss.backward()
    unused = sorted(set(P) - P.used)
    if unused:
        problems.append(f"parameters the PyTorch model does not use: {unused}")
    table.add("loss", "loss", (), grads["loss"], loss.item())
    ref_grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().numpy()
                 for n, p in P.items()}
    # A tensor whose exact gradient is 0 holds only rounding noise on both
    # sides: judge it against the model's gradient scale, not its own.
    floor = 1e-2 * max(float(np.max(np.abs(g))) for g in ref_grads.values())
    for name, p in P.items():
        if name not in grads:
            problems.append(f"grads.safetensors has no gradient for {name!r}")
            continue
        table.add("grad", name, p.shape, grads[name], ref_grads[name], floor)

    # Optimizer steps on the same batch, as meshflow's optimizer: global-norm
    # clip, weight decay (decoupled for AdamW, added to the gradient for SGD)
    # on every parameter with decay_all, else on the weights of linear layers,
    # convolutions and embeddings, the PyTorch convention (not biases, not norm
    # gains), chosen here by name.
    def decays(name):
        return decay_all or (name.endswith(".weight") and
                             not any(k in name for k in ("ln_", "norm")))
    groups = [{"params": [p for n, p in P.items() if decays(n)], "weight_decay": wd},
              {"params": [p for n, p in P.items() if not decays(n)], "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    if optimizer == "sgd":
        momentum, nesterov = float(meta["momentum"]), meta["nesterov"] == "true"
        opt = torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=nesterov)
        opt_desc = f"SGD lr {lr:g} momentum {momentum:g}{' nesterov' if nesterov else ''} wd {wd:g}"
    else:
        b1, b2, eps = float(meta["beta1"]), float(meta["beta2"]), float(meta["eps"])
        opt = torch.optim.AdamW(groups, lr=lr, betas=(b1, b2), eps=eps)
        opt_desc = f"AdamW lr {lr:g} betas ({b1:g}, {b2:g}) eps {eps:g} wd {wd:g}"
    losses = []
    norm0 = None
    for step in range(steps):
        if step > 0:
            opt.zero_grad()
            loss = loss_fn(model, P, S, cfg, batch)
            loss.backward()
        losses.append(loss.item())
        norm = torch.nn.utils.clip_grad_norm_(list(P.values()), clip if clip > 0 else float("inf"))
        if step == 0:
            norm0 = norm.item()
        opt.step()
    table.add("loss", "grad_norm", (), grads["grad_norm"], norm0)
    ours_losses = json.loads(after_meta["losses"])
    table.add("loss", f"losses[{steps}]", (steps,), ours_losses, losses)
    for name, p in P.items():
        if name not in after:
            problems.append(f"after_steps.safetensors has no {name!r}")
            continue
        table.add(optimizer, name, p.shape, after[name], p.detach().numpy())
    for name, s in S.items():
        if name not in after:
            problems.append(f"after_steps.safetensors has no {name!r}")
            continue
        table.add("stats", name, s.shape, after[name], s.numpy())
    extra = sorted(set(after) - set(P) - set(S))
    if extra:
        problems.append(f"after_steps.safetensors has tensors the model lacks: {extra}")

    table.print()
    if S and not table.worst("init") <= args.tol:
        print("init: meshflow's running statistics before the first step are not BatchNorm2d's "
              "(running_mean 0, running_var 1);\n  the rows after the steps start the "
              "reference from meshflow's, so they check the update alone")
    print(f"\n{model}: reference in torch {torch.__version__} {args.dtype}; {opt_desc}; "
          f"grad norm {norm0:.4g} (clip {clip:g}: {'active' if clip and norm0 > clip else 'inactive'});"
          f" losses meshflow {ours_losses} torch {[round(x, 6) for x in losses]}")
    worst = (f"{model}: max rel err  loss {table.worst('loss'):.2e}  "
             f"grads {table.worst('grad'):.2e}  {optimizer} weights {table.worst(optimizer):.2e}")
    if S:
        worst += (f"  running stats {table.worst('stats'):.2e}  "
                  f"init stats {table.worst('init'):.2e}")
    print(f"{worst}  (tol {args.tol:g})")
    fails = table.failures()
    for p in problems:
        print(f"{model}: FAIL: {p}")
    if fails or problems:
        print(f"{model}: FAIL: {len(fails)} tensor(s) above tolerance")
        return 1
    print(f"{model}: PASS ({len(table.rows)} tensors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
