#!/usr/bin/env python3
"""Measures, on one NVIDIA GPU through PyTorch, the kernel rates the planner's
cluster files assume (docs/cluster.md): 16-bit GEMMs by shape (the layers of
the public runs' models, every tensor-parallel split), the sustained GEMM rate
at the power limit, fused attention by kernel, sequence length and head size,
a ring-attention rank's calls (PyTorch's context parallel, load-balanced
causal), a LLaMA block forward and backward in eager mode and compiled with a
per-op profile, FP8 GEMMs (tensorwise and rowwise scales; and each pass of
the tensor-parallel splits' linears, section fp8_tp), and a LLaMA
block's activation memory by activation checkpoint (TorchTitan's op-level SAC
among them), eager and compiled, and a whole LLaMA-3 8B step's memory
(allocated and reserved) with its loss eager or compiled.

Not part of the suite (it needs a GPU and PyTorch); its figures and the date
they were taken are recorded in docs/cluster.md. Usage:
  python3 bench/gpu/hopper_kernels.py OUTDIR [section ...]
Writes OUTDIR/hopper_kernels.json (one key per section, written after each)
and prints a short table per section.
"""
import json
import os
import subprocess
import sys
import threading
import time
import traceback

import torch
import torch.nn.functional as F

OUT = sys.argv[1] if len(sys.argv) > 1 else "."
SECTIONS = sys.argv[2:]
RESULTS = {}
DEV = torch.device("cuda")
BF16 = torch.bfloat16


def save():
    with open(os.path.join(OUT, "hopper_kernels.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)


def log(*a):
    print(*a, flush=True)


def bench(fn, min_time=0.05, warmup=2, max_iters=200):
    """Median-free mean over a batch of back-to-back calls, timed with events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    s = torch.cuda.Event(enable_timing=True)
    e = torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    t1 = s.elapsed_time(e) / 1e3
    n = max(3, min(max_iters, int(min_time / max(t1, 1e-6))))
    s.record()
    for _ in range(n):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / 1e3 / n


def smi(fields):
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=" + fields, "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip()
    except Exception as ex:  # noqa: BLE001
        return "nvidia-smi failed: %s" % ex


def section_env():
    p = torch.cuda.get_device_properties(0)
    RESULTS["env"] = {
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "name": p.name,
        "sms": p.multi_processor_count, "memory_bytes": p.total_memory,
        "smi": smi("name,power.limit,power.max_limit,clocks.max.sm,clocks.max.mem,"
                   "memory.total,driver_version,temperature.gpu"),
    }
    log("env", RESULTS["env"])


def section_gemm():
    """Each linear of a block as the three GEMMs training runs (forward,
    input gradient, weight gradient), F.linear's layouts, at token counts and
    tensor-parallel splits of the public runs' models."""
    rows = []
    models = {
        # name: (hidden, q, kv, ffn, gated)
        "llama3_8b": (4096, 4096, 1024, 14336, True),
        "llama3_70b": (8192, 8192, 1024, 28672, True),
        "gpt3_175b": (12288, 12288, 12288, 49152, False),
        "bloom_176b": (14336, 14336, 14336, 57344, False),
    }
    for name, (h, q, kv, ffn, gated) in models.items():
        for tp in (1, 2, 4, 8):
            for tokens in (2048, 8192, 16384):
                linears = {
                    "qkv": (h, (q + 2 * kv) // tp),
                    "proj": (q // tp, h),
                    "fc1": (h, (2 if gated else 1) * ffn // tp),
                    "fc2": (ffn // tp, h),
                }
                for lname, (k_in, n_out) in linears.items():
                    x = torch.randn(tokens, k_in, device=DEV, dtype=BF16)
                    w = torch.randn(n_out, k_in, device=DEV, dtype=BF16)
                    dy = torch.randn(tokens, n_out, device=DEV, dtype=BF16)
                    flops = 2.0 * tokens * k_in * n_out
                    for kind, fn in (("fwd", lambda: F.linear(x, w)),
                                     ("dgrad", lambda: torch.mm(dy, w)),
                                     ("wgrad", lambda: torch.mm(dy.t(), x))):
                        t = bench(fn, min_time=0.03)
                        rows.append({"model": name, "tp": tp, "tokens": tokens, "linear": lname,
                                     "gemm": kind, "m_n_k": [tokens, n_out, k_in],
                                     "gflop": flops / 1e9, "s": t, "tflops": flops / t / 1e12})
                    del x, w, dy
        log("gemm", name, "done")
    for n in (512, 1024, 2048, 4096, 8192, 16384):
        a = torch.randn(n, n, device=DEV, dtype=BF16)
        b = torch.randn(n, n, device=DEV, dtype=BF16)
        t = bench(lambda: torch.mm(a, b), min_time=0.05)
        rows.append({"model": "square", "tp": 1, "tokens": n, "linear": "square", "gemm": "fwd",
                     "m_n_k": [n, n, n], "gflop": 2.0 * n ** 3 / 1e9, "s": t,
                     "tflops": 2.0 * n ** 3 / t / 1e12})
    RESULTS["gemm"] = rows
    # Summary: TFLOP/s by GFLOP per call, in buckets.
    buckets = {}
    for r in rows:
        b = 2 ** round(max(-4, min(10, __import__("math").log2(r["gflop"]))))
        buckets.setdefault(b, []).append(r["tflops"])
    for b in sorted(buckets):
        v = sorted(buckets[b])
        log("gemm  %7.3f GFLOP/call  n=%3d  median %6.1f  min %6.1f  max %6.1f TFLOP/s" %
            (b, len(v), v[len(v) // 2], v[0], v[-1]))


def section_sustained(seconds=25):
    """Back-to-back 8192^3 bf16 GEMMs for `seconds`: the rate each second and
    the SM clock and power nvidia-smi reads meanwhile (the other GPUs of the
    machine, if any, are idle)."""
    n = 8192
    a = [torch.randn(n, n, device=DEV, dtype=BF16) for _ in range(2)]
    b = [torch.randn(n, n, device=DEV, dtype=BF16) for _ in range(2)]
    samples = []
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            samples.append((time.time(), smi("clocks.sm,power.draw,temperature.gpu")))
            time.sleep(1.0)

    th = threading.Thread(target=poll)
    th.start()
    rates = []
    t0 = time.time()
    i = 0
    while time.time() - t0 < seconds:
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(50):
            torch.mm(a[i % 2], b[i % 2])
            i += 1
        e.record()
        torch.cuda.synchronize()
        rates.append((time.time() - t0, 50 * 2.0 * n ** 3 / (s.elapsed_time(e) / 1e3) / 1e12))
    stop.set()
    th.join()
    RESULTS["sustained"] = {"rates": rates, "smi": [(t - t0, v) for t, v in samples]}
    first = [r for t, r in rates if t < 1.0]
    last = [r for t, r in rates if t > seconds - 5]
    log("sustained  first second %.1f TFLOP/s, last 5 s %.1f TFLOP/s" %
        (sum(first) / max(1, len(first)), sum(last) / max(1, len(last))))
    log("sustained  smi (clock MHz, W, C):", [v for _, v in samples[-5:]])


def attention_call(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
          "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

    def call(q, k, v, causal):
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return call


def time_attention(call, b, hq, sq, sk, d, causal, bwd=True):
    q = torch.randn(b, hq, sq, d, device=DEV, dtype=BF16, requires_grad=True)
    k = torch.randn(b, hq, sk, d, device=DEV, dtype=BF16, requires_grad=True)
    v = torch.randn(b, hq, sk, d, device=DEV, dtype=BF16, requires_grad=True)
    go = torch.randn(b, hq, sq, d, device=DEV, dtype=BF16)
    with torch.no_grad():
        tf = bench(lambda: call(q, k, v, causal), min_time=0.1, warmup=1)

    def fb():
        o = call(q, k, v, causal)
        o.backward(go)
    tfb = bench(fb, min_time=0.1) if bwd else float("nan")
    return tf, tfb - tf


def section_attention():
    """Fused attention, 16-bit, 32 heads (LLaMA-3 8B after repeat_kv), by
    kernel, head size, causal mask and length; batch fills 32k tokens.
    FLOPs as FlashAttention counts them: forward 4 b h sq sk d (halved when
    causal), backward 2.5x the forward."""
    rows = []
    for backend in ("flash", "cudnn", "efficient"):
        try:
            call = attention_call(backend)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            continue
        for d in (128, 64):
            for causal in (True, False):
                for s in (1024, 2048, 4096, 8192, 16384, 32768):
                    if d == 64 and s > 16384:
                        continue
                    if backend == "efficient" and s > 16384:
                        continue
                    b = max(1, 32768 // s)
                    h = 32 if d == 128 else 64
                    try:
                        tf, tb = time_attention(call, b, h, s, s, d, causal)
                    except Exception as ex:  # noqa: BLE001
                        rows.append({"backend": backend, "d": d, "causal": causal, "seq": s,
                                     "error": str(ex)[:200]})
                        continue
                    fl = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                    rows.append({"backend": backend, "d": d, "causal": causal, "seq": s, "batch": b,
                                 "heads": h, "fwd_s": tf, "bwd_s": tb,
                                 "fwd_tflops": fl / tf / 1e12, "bwd_tflops": 2.5 * fl / tb / 1e12})
                    log("attn %-9s d=%3d causal=%d s=%6d  fwd %6.1f  bwd %6.1f TFLOP/s" %
                        (backend, d, causal, s, fl / tf / 1e12, 2.5 * fl / tb / 1e12))
                    torch.cuda.empty_cache()
        RESULTS["attention"] = rows
        save()


def section_ring():
    """One rank of PyTorch's ring attention (context parallel, load-balanced
    causal) for LLaMA-3 8B's 32 heads, d 128: at step 0 the local n tokens
    attend causally to themselves; at each of the cp-1 other steps n/2 x n of
    scores without a mask (half the queries against all visiting keys, or all
    queries against half). Each call through SDPA's flash kernel with autograd;
    the merge of each step's partial output by its log-sum-exp is timed apart as
    the eager fp32 elementwise ops that do it. Compared with one causal call
    over the same FLOPs."""
    call = attention_call("flash")
    rows = []
    h, d = 32, 128
    for cp, seq in ((2, 65536), (4, 131072), (8, 262144)):
        n = seq // cp
        try:
            q = torch.randn(1, h, n, d, device=DEV, dtype=BF16, requires_grad=True)
            k = torch.randn(1, h, n, d, device=DEV, dtype=BF16, requires_grad=True)
            v = torch.randn(1, h, n, d, device=DEV, dtype=BF16, requires_grad=True)
            go = torch.randn(1, h, n, d, device=DEV, dtype=BF16)
            half = n // 2

            def steps(backward):
                outs = [call(q, k, v, True)]
                for i in range(1, cp):
                    if i % 2:
                        outs.append(call(q, k[:, :, :half], v[:, :, :half], False))
                    else:
                        outs.append(call(q[:, :, half:], k, v, False))
                if backward:
                    torch.autograd.backward(outs, [go if o.shape[2] == n else go[:, :, half:]
                                                   for o in outs])

            with torch.no_grad():
                tf = bench(lambda: steps(False), min_time=0.2, warmup=1)
            tfb = bench(lambda: steps(True), min_time=0.2, warmup=1)
            out = torch.randn(1, h, n, d, device=DEV, dtype=torch.float32)
            lse = torch.randn(1, h, n, 1, device=DEV, dtype=torch.float32)
            blk = torch.randn(1, h, n, d, device=DEV, dtype=BF16)
            blk_lse = torch.randn(1, h, n, 1, device=DEV, dtype=torch.float32)

            def merge():
                o, l_ = out, lse
                for _ in range(cp - 1):
                    o = o - torch.sigmoid(blk_lse - l_) * (o - blk.float())
                    l_ = l_ - F.logsigmoid(l_ - blk_lse)
                return o.to(BF16)
            tm = bench(merge, min_time=0.1, warmup=1)
            fl = 4.0 * h * n * n * d * (0.5 + 0.5 * (cp - 1))
            rows.append({"cp": cp, "seq": seq, "local": n, "fwd_s": tf, "bwd_s": tfb - tf,
                         "merge_s": tm, "fwd_tflops": fl / tf / 1e12,
                         "bwd_tflops": 2.5 * fl / (tfb - tf) / 1e12})
            log("ring cp=%d seq=%d local=%d  fwd %.1f  bwd %.1f TFLOP/s  merge %.2f ms (fwd %.2f ms)" %
                (cp, seq, n, fl / tf / 1e12, 2.5 * fl / (tfb - tf) / 1e12, tm * 1e3, tf * 1e3))
            del q, k, v, go, out, lse, blk, blk_lse
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            traceback.print_exc()
    RESULTS["ring"] = rows


class RMSNorm(torch.nn.Module):
    """TorchTitan's eager RMSNorm (torchtitan/models/norms.py, 2024)."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


def rope(x, freqs_cis):
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs_cis).flatten(3).type_as(x)


class Block(torch.nn.Module):
    """A LLaMA block as TorchTitan's llama model writes it (RMSNorm, RoPE by
    complex multiply, repeat_kv, SDPA causal, SwiGLU), `heads` and `kv` the
    rank's own under tensor parallelism."""

    def __init__(self, h, heads, kv, ffn, d=128):
        super().__init__()
        self.heads, self.kv, self.d = heads, kv, d
        self.wq = torch.nn.Linear(h, heads * d, bias=False)
        self.wk = torch.nn.Linear(h, kv * d, bias=False)
        self.wv = torch.nn.Linear(h, kv * d, bias=False)
        self.wo = torch.nn.Linear(heads * d, h, bias=False)
        self.w1 = torch.nn.Linear(h, ffn, bias=False)
        self.w3 = torch.nn.Linear(h, ffn, bias=False)
        self.w2 = torch.nn.Linear(ffn, h, bias=False)
        self.n1 = RMSNorm(h)
        self.n2 = RMSNorm(h)

    def forward(self, x, freqs_cis):
        b, s, _ = x.shape
        y = self.n1(x)
        q = self.wq(y).view(b, s, self.heads, self.d)
        k = self.wk(y).view(b, s, self.kv, self.d)
        v = self.wv(y).view(b, s, self.kv, self.d)
        q, k = rope(q, freqs_cis), rope(k, freqs_cis)
        rep = self.heads // self.kv
        k = k[:, :, :, None, :].expand(b, s, self.kv, rep, self.d).reshape(b, s, self.heads, self.d)
        v = v[:, :, :, None, :].expand(b, s, self.kv, rep, self.d).reshape(b, s, self.heads, self.d)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
        y = self.n2(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


def block_inputs(b, s, h):
    """RoPE's rotations, an input that wants its gradient, and an output gradient."""
    freqs = torch.polar(torch.ones(s, 64, device=DEV),
                        torch.randn(s, 64, device=DEV)).view(1, s, 1, 64)
    x = torch.randn(b, s, h, device=DEV, dtype=BF16, requires_grad=True)
    return freqs, x, torch.randn(b, s, h, device=DEV, dtype=BF16)


def chain(fns, x, freqs):
    for fn in fns:
        x = fn(x, freqs)
    return x


def block_flops(h, heads, kv, ffn, d, b, s):
    t = b * s
    lin = 2.0 * t * (h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * ffn)
    att = 4.0 * b * heads * s * s * d * 0.5
    return lin + att, lin, att


def section_block():
    """Forward and backward of LLaMA blocks (bf16 weights, as FSDP2's
    MixedPrecision param_dtype), eager and torch.compile'd per block, and a
    per-op profile of the eager one."""
    rows = []
    cases = [("llama3_8b", 4096, 32, 8, 14336, 1, 8192, ("eager",)),
             ("llama3_8b", 4096, 32, 8, 14336, 2, 8192, ("eager", "compile")),
             ("llama3_70b_tp8", 8192, 8, 1, 3584, 1, 8192, ("eager",)),
             ("llama3_405b_tp8", 16384, 16, 1, 6656, 1, 8192, ("eager",))]
    for name, h, heads, kv, ffn, b, s, modes in cases:
        for mode in modes:
            try:
                torch.manual_seed(0)
                blocks = torch.nn.ModuleList([Block(h, heads, kv, ffn) for _ in range(2)]).to(DEV, BF16)
                if mode == "compile":
                    for i in range(len(blocks)):
                        blocks[i] = torch.compile(blocks[i])
                freqs, x, go = block_inputs(b, s, h)

                def fwd():
                    return chain(blocks, x, freqs)
                t_c = time.time()
                fwd().backward(go)
                torch.cuda.synchronize()
                first = time.time() - t_c
                with torch.no_grad():
                    tf = bench(fwd, min_time=0.3) / len(blocks)
                tfb = bench(lambda: fwd().backward(go), min_time=0.5) / len(blocks)
                total, lin, att = block_flops(h, heads, kv, ffn, 128, b, s)
                rows.append({"case": name, "mode": mode, "batch": b, "seq": s, "fwd_s": tf,
                             "bwd_s": tfb - tf, "first_call_s": first, "flops_fwd": total,
                             "flops_linear_fwd": lin, "flops_attention_fwd": att,
                             "fwd_tflops": total / tf / 1e12,
                             "bwd_tflops": (2 * lin + 2.5 * att) / (tfb - tf) / 1e12})
                log("block %-16s %-7s b=%d s=%d  fwd %.2f ms  bwd %.2f ms  (fwd %.0f TFLOP/s, fwd+bwd %.0f)" %
                    (name, mode, b, s, tf * 1e3, (tfb - tf) * 1e3, total / tf / 1e12,
                     (total + 2 * lin + 2.5 * att) / tfb / 1e12))
                if mode == "eager" and b == 1:
                    from torch.profiler import ProfilerActivity, profile
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        fwd().backward(go)
                        torch.cuda.synchronize()
                    ev = []
                    for a in prof.key_averages():
                        dt = getattr(a, "device_time_total", None)
                        if dt is None:
                            dt = getattr(a, "cuda_time_total", 0)
                        if dt > 0:
                            ev.append((dt, a.key, a.count))
                    ev.sort(reverse=True)
                    rows.append({"case": name, "mode": "profile", "ops_us": ev[:40]})
                    log("profile", name, [(round(t / 1e3 / 2, 2), k[:40], c) for t, k, c in ev[:14]])
                del blocks, x, go
                torch.cuda.empty_cache()
            except Exception:  # noqa: BLE001
                traceback.print_exc()
            RESULTS["block"] = rows
            save()


def op_sac_context():
    """TorchTitan's op-level selective activation checkpoint (its
    _apply_ac_to_transformer_block, 'op' option): save the outputs of the
    matmuls but every second one, of the attention kernels and of max;
    recompute everything else."""
    from collections import defaultdict

    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    save = {torch.ops.aten.mm.default, torch.ops.aten.max.default}
    for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention"):
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            save.add(op.default)
    meta = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = ("recompute" if ctx.is_recompute else "forward") + "_mm_count"
        if func == torch.ops.aten.mm.default:
            meta[key] += 1
        keep = func in save and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)


def section_memory():
    """Activation memory of LLaMA-3 8B blocks (4 of them, bf16 weights) at
    8192 tokens a sequence, by activation checkpoint (none, TorchTitan's
    op-level SAC, full) and mode (eager, compiled): the bytes the forward
    leaves allocated per block, and the peak over the weights through the
    backward (the weights' gradients, allocated there, reported apart)."""
    from torch.utils.checkpoint import checkpoint
    rows = []
    L = 4
    for b in (1, 2):
        for ac in ("none", "op_sac", "full"):
            for mode in ("eager", "compile"):
                if mode == "compile" and ac == "full":
                    continue
                try:
                    torch.cuda.empty_cache()
                    torch.manual_seed(0)
                    blocks = [Block(4096, 32, 8, 14336).to(DEV, BF16) for _ in range(L)]
                    s, h = 8192, 4096

                    def wrap(blk):
                        if ac == "none":
                            fn = blk
                        elif ac == "full":
                            def fn(x, f, blk=blk):
                                return checkpoint(blk, x, f, use_reentrant=False,
                                                  preserve_rng_state=False)
                        else:
                            def fn(x, f, blk=blk):
                                return checkpoint(blk, x, f, use_reentrant=False,
                                                  context_fn=op_sac_context,
                                                  preserve_rng_state=False)
                        return torch.compile(fn) if mode == "compile" else fn
                    fns = [wrap(blk) for blk in blocks]
                    freqs, x, go = block_inputs(b, s, h)

                    def fwd():
                        return chain(fns, x, freqs)
                    fwd().backward(go)  # warm-up (compiles)
                    params = [q for blk in blocks for q in blk.parameters()]
                    for q in params:
                        q.grad = None
                    x.grad = None
                    torch.cuda.synchronize()
                    base = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    y = fwd()
                    torch.cuda.synchronize()
                    after_fwd = torch.cuda.memory_allocated()
                    fwd_peak = torch.cuda.max_memory_allocated()
                    y.backward(go)
                    torch.cuda.synchronize()
                    peak = torch.cuda.max_memory_allocated()
                    grad_bytes = sum(q.numel() * q.element_size() for q in params)
                    out_bytes = y.numel() * y.element_size()
                    r = {"batch": b, "seq": s, "ac": ac, "mode": mode, "blocks": L,
                         "saved_per_block_bytes": (after_fwd - base - out_bytes) / L,
                         "forward_peak_over_base_bytes": fwd_peak - base,
                         "peak_over_base_bytes": peak - base, "weight_grad_bytes": grad_bytes,
                         "tokens": b * s}
                    rows.append(r)
                    log("memory b=%d %-6s %-7s saved/block %.3f GiB (%.1f B/token/h)  peak-base %.2f GiB"
                        " (grads %.2f)" % (b, ac, mode, r["saved_per_block_bytes"] / 2**30,
                                           r["saved_per_block_bytes"] / (b * s * h),
                                           (peak - base) / 2**30, grad_bytes / 2**30))
                    del blocks, fns, x, go, y, params
                except Exception:  # noqa: BLE001
                    traceback.print_exc()
                RESULTS["memory"] = rows
                save()


def section_step():
    """One training step's memory of a whole LLaMA-3 8B (bf16 weights, no
    optimizer) at 2 x 8192 tokens, as TorchTitan runs it: op-level SAC on each
    block, the blocks eager or compiled, the f32 cross-entropy eager (TorchTitan
    2024) or compiled with the model (2025, compile components model and
    loss). Reports the bytes the forward leaves, the peak allocated and the
    peak reserved (what TorchTitan logs as its memory) over the weights and
    their gradients; and the output projection with its loss alone, in bytes
    per logit. Run it once with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    (TorchTitan's launch script) and once without."""
    rows = []
    b, s, h, vocab, layers = 2, 8192, 4096, 128256, 32
    torch._dynamo.config.cache_size_limit = 64
    from torch.utils.checkpoint import checkpoint

    def xent(logits, labels):
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))

    # The output projection and loss alone, per logit.
    for mode in ("eager", "compile"):
        try:
            torch.cuda.empty_cache()
            x = torch.randn(b, s, h, device=DEV, dtype=BF16, requires_grad=True)
            w = torch.randn(vocab, h, device=DEV, dtype=BF16, requires_grad=True)
            labels = torch.randint(0, vocab, (b, s), device=DEV)
            loss_fn = torch.compile(xent) if mode == "compile" else xent
            loss_fn(F.linear(x, w), labels).backward()  # warm-up (compiles)
            x.grad = w.grad = None
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            loss = loss_fn(F.linear(x, w), labels)
            torch.cuda.synchronize()
            after_fwd = torch.cuda.memory_allocated()
            loss.backward()
            torch.cuda.synchronize()
            grads = x.grad.numel() * 2 + w.grad.numel() * 2
            n = b * s * vocab
            r = {"case": "loss", "mode": mode, "logits": n,
                 "forward_left_per_logit": (after_fwd - base) / n,
                 "peak_per_logit": (torch.cuda.max_memory_allocated() - base - grads) / n,
                 "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
            rows.append(r)
            log("step loss %-7s left %.2f B/logit, peak %.2f B/logit (over the grads)"
                % (mode, r["forward_left_per_logit"], r["peak_per_logit"]))
            del x, w, labels, loss
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        RESULTS["step"] = rows
        save()

    for blocks_mode, loss_mode in (("eager", "eager"), ("compile", "eager"), ("compile", "compile")):
        try:
            torch.cuda.empty_cache()
            torch.manual_seed(0)
            emb = torch.nn.Embedding(vocab, h).to(DEV, BF16)
            blocks = [Block(h, 32, 8, 14336).to(DEV, BF16) for _ in range(layers)]
            norm = RMSNorm(h).to(DEV, BF16)
            out = torch.nn.Linear(h, vocab, bias=False).to(DEV, BF16)

            def wrap(blk):
                def fn(x, f, blk=blk):
                    return checkpoint(blk, x, f, use_reentrant=False, context_fn=op_sac_context,
                                      preserve_rng_state=False)
                return torch.compile(fn) if blocks_mode == "compile" else fn
            fns = [wrap(blk) for blk in blocks]
            loss_fn = torch.compile(xent) if loss_mode == "compile" else xent
            tokens = torch.randint(0, vocab, (b, s), device=DEV)
            labels = torch.randint(0, vocab, (b, s), device=DEV)
            freqs, _, _ = block_inputs(1, s, h)
            params = [q for m in [emb, norm, out] + blocks for q in m.parameters()]

            def step():
                y = chain(fns, emb(tokens), freqs)
                return loss_fn(out(norm(y)), labels)
            t0 = time.time()
            step().backward()  # warm-up (compiles)
            compile_s = time.time() - t0
            for q in params:
                q.grad = None
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # the reserved peak is the measured step's own
            weights = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            reserved0 = torch.cuda.memory_reserved()
            loss = step()
            torch.cuda.synchronize()
            after_fwd = torch.cuda.memory_allocated()
            loss.backward()
            torch.cuda.synchronize()
            grad_bytes = sum(q.numel() * q.element_size() for q in params)
            peak = torch.cuda.max_memory_allocated()
            peak_reserved = torch.cuda.max_memory_reserved()
            r = {"case": "llama3_8b", "blocks": blocks_mode, "loss": loss_mode, "batch": b, "seq": s,
                 "weights_bytes": weights, "grad_bytes": grad_bytes,
                 "forward_left_bytes": after_fwd - weights,
                 "peak_allocated_bytes": peak, "peak_reserved_bytes": peak_reserved,
                 "reserved_before_bytes": reserved0, "warmup_s": compile_s,
                 "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
            rows.append(r)
            gib = 2.0**30
            log("step 8b blocks %-7s loss %-7s weights %.1f  fwd-left %.2f  peak alloc %.2f  "
                "peak reserved %.2f GiB (grads %.1f; reserved/allocated %.3f; warm-up %.0f s)"
                % (blocks_mode, loss_mode, weights / gib, (after_fwd - weights) / gib, peak / gib,
                   peak_reserved / gib, grad_bytes / gib, peak_reserved / peak, compile_s))
            del emb, blocks, norm, out, fns, tokens, labels, params, loss
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        RESULTS["step"] = rows
        save()


def section_fp8():
    """FP8 GEMMs through torch._scaled_mm (e4m3 x e4m3 -> bf16) with
    tensorwise and rowwise scales, against bf16, LLaMA-3 8B's linears at 8k and
    16k tokens; and the eager cast of an input (amax, scale, convert)."""
    rows = []
    f8 = torch.float8_e4m3fn
    for tokens in (8192, 16384):
        for lname, (k_in, n_out) in {"qkv": (4096, 6144), "proj": (4096, 4096),
                                     "fc1": (4096, 28672), "fc2": (14336, 4096)}.items():
            x = torch.randn(tokens, k_in, device=DEV, dtype=BF16)
            w = torch.randn(n_out, k_in, device=DEV, dtype=BF16)
            x8, w8 = x.to(f8), w.to(f8)
            one = torch.ones((), device=DEV)
            ra = torch.ones(tokens, 1, device=DEV)
            rb = torch.ones(1, n_out, device=DEV)
            fl = 2.0 * tokens * k_in * n_out
            r = {"tokens": tokens, "linear": lname, "gflop": fl / 1e9}
            r["bf16_tflops"] = fl / bench(lambda: F.linear(x, w)) / 1e12
            for kind, sa, sb, fast in (("tensorwise", one, one, False),
                                       ("tensorwise_fast_accum", one, one, True),
                                       ("rowwise", ra, rb, False)):
                try:
                    r[kind + "_tflops"] = fl / bench(lambda: torch._scaled_mm(
                        x8, w8.t(), scale_a=sa, scale_b=sb, out_dtype=BF16,
                        use_fast_accum=fast)) / 1e12
                except Exception as ex:  # noqa: BLE001
                    r[kind + "_error"] = str(ex)[:200]

            def cast():
                amax = x.abs().amax()
                return (x.float() * (448.0 / amax)).to(f8)
            r["cast_s"] = bench(cast)
            r["cast_bytes_per_s_at_3B"] = 3.0 * x.numel() / r["cast_s"]
            rows.append(r)
            log("fp8", r)
    RESULTS["fp8"] = rows


def section_fp8_tp():
    """FP8 GEMMs of the tensor-parallel splits TorchTitan's AsyncTP runs
    (public_runs rows 36-43: LLaMA-3 8B and 70B at tp = 8 with sequence
    parallelism, the sequence gathered before the column-parallel linears):
    each linear's forward, input-gradient and weight-gradient GEMM at tp = 1,
    4 and 8, in bf16, FP8 tensorwise and FP8 rowwise (torch._scaled_mm, e4m3,
    bf16 out; rowwise scales along each GEMM's reduction axis, as torchao's
    rowwise recipe casts them), at the runs' tokens per GEMM (a rank's local
    batch times 8192). The planner prices rowwise GEMMs at
    fp8_rowwise_gemm_efficiency of the tensorwise rate on every shape; the
    rowwise rows at tp = 8 are 16-33% slower than that prices."""
    rows = []
    f8 = torch.float8_e4m3fn
    models = {  # name: (tokens per GEMM, hidden, kv width, ffn)
        "llama3_8b": (12 * 8192, 4096, 1024, 14336),
        "llama3_70b": (16 * 8192, 8192, 1024, 28672),
    }

    def gemm_rates(m, k, n):
        """TFLOP/s of (m x k) @ (k x n) in bf16, tensorwise and rowwise FP8."""
        a = torch.randn(m, k, device=DEV, dtype=BF16)
        b_t = torch.randn(n, k, device=DEV, dtype=BF16)  # b column-major, as cuBLASLt takes it
        a8, b8 = a.to(f8), b_t.to(f8)
        fl = 2.0 * m * k * n
        out = {"m": m, "k": k, "n": n, "gflop": fl / 1e9,
               "bf16_tflops": fl / bench(lambda: a @ b_t.t()) / 1e12}
        one = torch.ones((), device=DEV)
        for kind, sa, sb in (("tensorwise", one, one),
                             ("rowwise", torch.ones(m, 1, device=DEV),
                              torch.ones(1, n, device=DEV))):
            try:
                out[kind + "_tflops"] = fl / bench(lambda: torch._scaled_mm(
                    a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=BF16)) / 1e12
            except Exception as ex:  # noqa: BLE001
                out[kind + "_error"] = str(ex)[:200]
        del a, b_t, a8, b8
        return out

    for model, (tokens, h, kv, ffn) in models.items():
        for tp in (1, 4, 8):
            linears = {  # name: (in, out) of one rank's shard; colwise split out, rowwise in
                "wq": (h, h // tp), "wk": (h, kv // tp), "w1": (h, ffn // tp),
                "wo": (h // tp, h), "w2": (ffn // tp, h)}
            for lname, (k_in, n_out) in linears.items():
                if k_in % 16 or n_out % 16:
                    continue
                for pass_name, (m, k, n) in (("fwd", (tokens, k_in, n_out)),
                                             ("dgrad", (tokens, n_out, k_in)),
                                             ("wgrad", (n_out, tokens, k_in))):
                    try:
                        r = {"model": model, "tp": tp, "linear": lname, "pass": pass_name}
                        r.update(gemm_rates(m, k, n))
                    except Exception:  # noqa: BLE001
                        traceback.print_exc()
                        continue
                    rows.append(r)
                    log("fp8_tp", {key: (round(v, 1) if isinstance(v, float) else v)
                                   for key, v in r.items()})
            torch.cuda.empty_cache()
        RESULTS["fp8_tp"] = rows
        save()


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    order = ["env", "gemm", "attention", "ring", "block", "fp8", "fp8_tp", "sustained", "memory",
             "step"]
    for name in order:
        if SECTIONS and name not in SECTIONS and name != "env":
            continue
        t = time.time()
        try:
            globals()["section_" + name]()
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        RESULTS.setdefault("seconds", {})[name] = time.time() - t
        log("== section %s: %.1f s" % (name, time.time() - t))
        save()


if __name__ == "__main__":
    main()
