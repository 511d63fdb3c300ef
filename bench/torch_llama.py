#!/usr/bin/python3
"""torch_llama.py - the PyTorch side of bench/train_vs_torch.sh for LLaMA: a training step with
the same architecture and step contents as `meshscope train` on one rank, timed per step.

Architecture (as engine/model/llama.c, Hugging Face modeling_llama): a token embedding, L
pre-norm layers (RMSNorm -> q, k, v projections without bias, grouped kv heads, rotary on q and
k over pairs (i, i + D/2), causal attention, o projection -> residual; RMSNorm -> SwiGLU MLP
silu(gate(x)) * up(x) -> down -> residual), a final RMSNorm, an untied lm_head, mean cross-
entropy. The kv heads are repeated to the query heads (Hugging Face's repeat_kv) for the
product; PyTorch 1.13 has no fused attention, so scores are materialised as in torch_gpt.py.

One step as torch_gpt.py: random byte tokens, forward, backward, global-norm clip to 1.0, AdamW
(betas 0.9/0.95, eps 1e-8, weight decay 0). Prints one JSON object with the median step time.

Run with Debian's python3 and python3-torch (1.13): /usr/bin/python3 bench/torch_llama.py ...
Thread variables are set from --threads before torch is imported (see torch_gpt.py).
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
    p.add_argument("--kv-heads", type=int, required=True)
    p.add_argument("--embd", type=int, required=True)
    p.add_argument("--inter", type=int, required=True, help="the SwiGLU width")
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--positions", type=int, required=True)
    p.add_argument("--theta", type=float, default=10000.0)
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--steps", type=int, default=5, help="measured steps")
    p.add_argument("--seed", type=int, default=1337)
    a = p.parse_args()
    if min(a.layers, a.heads, a.kv_heads, a.embd, a.inter, a.vocab, a.positions, a.batch,
           a.seq, a.threads) < 1:
        p.error("sizes and --threads must be >= 1")
    if a.embd % a.heads or a.heads % a.kv_heads or (a.embd // a.heads) % 2:
        p.error("--heads must divide --embd (an even head size) and --kv-heads divide --heads")
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


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Layer(nn.Module):
    def __init__(self, a):
        super().__init__()
        C, H, Hkv = a.embd, a.heads, a.kv_heads
        self.H, self.Hkv, self.D = H, Hkv, C // H
        self.input_layernorm = RMSNorm(C, a.eps)
        self.q_proj = nn.Linear(C, H * self.D, bias=False)
        self.k_proj = nn.Linear(C, Hkv * self.D, bias=False)
        self.v_proj = nn.Linear(C, Hkv * self.D, bias=False)
        self.o_proj = nn.Linear(H * self.D, C, bias=False)
        self.post_attention_layernorm = RMSNorm(C, a.eps)
        self.gate_proj = nn.Linear(C, a.inter, bias=False)
        self.up_proj = nn.Linear(C, a.inter, bias=False)
        self.down_proj = nn.Linear(a.inter, C, bias=False)
        T = a.positions
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        self.register_buffer("mask", mask, persistent=False)

    def attention(self, x, cos, sin):
        B, T, C = x.shape
        H, Hkv, D = self.H, self.Hkv, self.D
        q = self.q_proj(x).view(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
        k = self.k_proj(x).view(B, T, Hkv, D).transpose(1, 2)
        v = self.v_proj(x).view(B, T, Hkv, D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // Hkv, dim=1)  # query head h reads kv head h / (H / Hkv)
        v = v.repeat_interleave(H // Hkv, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, H * D)
        return self.o_proj(y)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.input_layernorm(x), cos, sin)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab, a.embd)
        self.layers = nn.ModuleList([Layer(a) for _ in range(a.layers)])
        self.norm = RMSNorm(a.embd, a.eps)
        self.lm_head = nn.Linear(a.embd, a.vocab, bias=False)
        D = a.embd // a.heads
        inv = a.theta ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)
        ang = torch.outer(torch.arange(a.positions, dtype=torch.float32), inv)
        ang = torch.cat((ang, ang), dim=-1)  # [T, D]: pairs (i, i + D/2) share an angle
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)
        # Initialisation as meshscope's: N(0, 0.02), o and down scaled by 1/sqrt(2L).
        for name, p in self.named_parameters():
            if p.dim() == 2:
                out = name.endswith("o_proj.weight") or name.endswith("down_proj.weight")
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * a.layers) if out else 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    a = args
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = Llama(a)
    model.train()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    gen = torch.Generator().manual_seed(a.seed)
    B, T, hi = a.batch, a.seq, min(a.vocab, 256)
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
            print(f"torch_llama.py: non-finite loss at step {step}", file=sys.stderr)
            return 1
        if step >= a.warmup:
            steps.append(t3 - t0)
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            upd.append(t3 - t2)
            losses.append(loss.item())
    med = statistics.median(steps)
    print(json.dumps({
        "side": "pytorch",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "blas": blas_libraries(),
        "params": sum(p.numel() for p in params),
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
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
