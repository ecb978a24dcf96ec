#!/usr/bin/env python3
"""The same GPT training step as bench/gpt_step.cc, in PyTorch (Debian python3-torch, CPU).

GPT-2 architecture: learned positions, pre-LayerNorm blocks, GELU (tanh) MLP, tied head,
causal attention as PyTorch 1.13 writes it (matmul, mask, softmax, matmul), AdamW with
weight decay on matrices only, global-norm clipping at 1.0.
Usage: /usr/bin/python3 bench/torch_gpt.py --threads 2 --steps 20
"""
import argparse, json, math, time
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln_1 = nn.LayerNorm(d)
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)

    def attn(self, x, mask):
        B, T, C = x.shape
        hd = C // self.h
        q = self.q(x).view(B, T, self.h, hd).transpose(1, 2)
        k = self.k(x).view(B, T, self.h, hd).transpose(1, 2)
        v = self.v(x).view(B, T, self.h, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def forward(self, x, mask):
        x = x + self.attn(self.ln_1(x), mask)
        x = x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, layers, d, h, seq, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList([Block(d, h) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T)
        x = self.wte(idx) + self.wpe(pos)
        for b in self.blocks:
            x = b(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(threads=1, steps=20, layers=4, embd=256, heads=4, seq=128, batch=16).items():
        ap.add_argument("--" + k, type=int, default=v)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT(a.layers, a.embd, a.heads, a.seq, 256)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
    idx = torch.randint(0, 256, (a.batch, a.seq))
    tgt = torch.randint(0, 256, (a.batch, a.seq))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    for _ in range(3):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    el = time.perf_counter() - t0
    print(json.dumps({"impl": "pytorch", "version": torch.__version__, "threads": a.threads,
                      "tokens_per_s": round(a.batch * a.seq * a.steps / el, 1),
                      "step_ms": round(1e3 * el / a.steps, 2), "loss": round(loss, 4)}))


if __name__ == "__main__":
    main()
