#!/usr/bin/python3
"""torch_gpt.py - the PyTorch side of bench/train_vs_torch.sh: a GPT-2 training step with the
same architecture and step contents as `meshscope train` on one rank, timed per step.

Architecture (as engine/model/gpt.c): learned token (wte) and position (wpe) embeddings, L
pre-LayerNorm blocks (LayerNorm eps 1e-5 -> causal multi-head attention with a fused qkv
Linear(C, 3C) and an output Linear(C, C) -> residual; LayerNorm -> Linear(C, 4C) -> GELU (tanh
approximation) -> Linear(4C, C) -> residual), a final LayerNorm, logits through the tied wte,
mean cross-entropy. Biases everywhere, no dropout.

One step (as cli/cmd_train.c): sample a batch (random byte tokens here; meshscope samples
windows of its text file), forward, backward, global-norm clip to 1.0, AdamW (betas 0.9/0.95,
eps 1e-8, weight decay 0, as meshscope's defaults). Timed with time.perf_counter; prints one
JSON object with the median step time of the measured steps (and a forward / backward /
clip+optimizer breakdown of each step).

Run with Debian's python3 and python3-torch (1.13): /usr/bin/python3 bench/torch_gpt.py ...
Thread counts must be set before torch is imported: this script sets OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS (Debian's torch calls OpenBLAS through libblas.so.3, whose thread pool
torch.set_num_threads does not size) from --threads, then calls torch.set_num_threads.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--embd", type=int, required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--positions", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--steps", type=int, default=5, help="measured steps")
    p.add_argument("--seed", type=int, default=1337)
    a = p.parse_args()
    if min(a.layers, a.heads, a.embd, a.vocab, a.positions, a.batch, a.seq, a.threads) < 1:
        p.error("sizes and --threads must be >= 1")
    if a.embd % a.heads:
        p.error("--embd must be divisible by --heads")
    if a.seq > a.positions:
        p.error("--seq must not exceed --positions")
    if a.steps < 1 or a.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    return a


args = parse_args()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import torch  # noqa: E402  (after the thread variables)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from torch_env import blas_libraries  # noqa: E402


class Block(nn.Module):
    def __init__(self, C, H, T_max):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        mask = torch.tril(torch.ones(T_max, T_max, dtype=torch.bool))
        self.register_buffer("mask", mask, persistent=False)

    def attention(self, x):
        B, T, C = x.shape
        hs = C // self.H
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.H, hs).transpose(1, 2)  # [B, H, T, hs]
        k = k.view(B, T, self.H, hs).transpose(1, 2)
        v = v.view(B, T, self.H, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.attn_proj(y)

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, L, H, C, V, P):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(P, C)
        self.h = nn.ModuleList([Block(C, H, P) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        # Initialisation as meshscope's: N(0, 0.02) weights, residual projections scaled by
        # 1/sqrt(2L), wpe N(0, 0.01), zero biases. (Timing does not depend on it.)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.01)
        for blk in self.h:
            for lin in (blk.c_attn, blk.attn_proj, blk.c_fc, blk.mlp_proj):
                std = 0.02 / math.sqrt(2 * L) if lin in (blk.attn_proj, blk.mlp_proj) else 0.02
                nn.init.normal_(lin.weight, std=std)
                nn.init.zeros_(lin.bias)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        x = self.ln_f(x)
        logits = F.linear(x, self.wte.weight)  # tied: [B, T, V]
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    a = args
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = GPT(a.layers, a.heads, a.embd, a.vocab, a.positions)
    model.train()
    params = list(model.parameters())  # the tied wte appears once
    n_params = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    gen = torch.Generator().manual_seed(a.seed)
    B, T = a.batch, a.seq
    # Tokens are bytes (ids < 256) as in meshscope's byte-level data, whatever the vocab.
    hi = min(a.vocab, 256)

    steps, fwd, bwd, upd, losses = [], [], [], [], []
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        batch = torch.randint(0, hi, (B, T + 1), generator=gen)
        idx, tgt = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
        loss = model(idx, tgt)
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        t3 = time.perf_counter()
        if not math.isfinite(loss.item()):
            print(f"torch_gpt.py: non-finite loss at step {step}", file=sys.stderr)
            return 1
        if step >= a.warmup:
            steps.append(t3 - t0)
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            upd.append(t3 - t2)
            losses.append(loss.item())

    med = statistics.median(steps)
    out = {
        "side": "pytorch",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "blas": blas_libraries(),
        "params": n_params,
        "batch": B,
        "seq": T,
        "warmup": a.warmup,
        "steps": a.steps,
        "step_ms": [round(s * 1e3, 3) for s in steps],
        "median_step_ms": med * 1e3,
        "tokens_per_s": B * T / med,
        "median_forward_ms": statistics.median(fwd) * 1e3,
        "median_backward_ms": statistics.median(bwd) * 1e3,
        "median_clip_adamw_ms": statistics.median(upd) * 1e3,
        "losses": [round(x, 4) for x in losses],
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
