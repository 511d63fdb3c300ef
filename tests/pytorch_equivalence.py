"""pytorch_equivalence.py MESHSCOPE MODEL [--tol T] [--resume-at STEP FLAGS...] [STRATEGY FLAGS...]
   or: pytorch_equivalence.py MESHSCOPE MODEL --export DIR   (DIR/model.onnx and DIR/data.npz only)

A model defined in PyTorch, exported to ONNX as a module that returns its loss, trains in
meshscope with PyTorch's losses: the same initial weights (the file's), the same data, fp32,
20 steps of AdamW at a constant rate, every step's loss within 1e-4 relative of PyTorch's.
The references are computed here, by PyTorch, at test time.

MODEL is gpt (a GPT-style decoder: embeddings, causal attention, GELU MLP, LayerNorm, tied
head) or cnn (two convolutions, max pooling, global average pooling, a linear head). Every
batch holds the whole training set, so the loss does not depend on the order rows are drawn.
--tol T checks T instead of 1e-4 (bf16 changes the arithmetic). --resume-at S saves a
checkpoint at step S under the strategy flags, then resumes it in a second run under the flags
after --resume-at's step (up to the end), and checks the two runs' steps together.
Exit 0: equal; 1: a step differs or a run failed; 77: PyTorch is not installed.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # the suite runs without PyTorch: skipped, and said why
    print(f"skip: PyTorch is not installed ({e}); scripts/install-deps.sh installs python3-torch")
    sys.exit(77)

STEPS, LR, ROWS = 20, 3e-3, 16


class Block(nn.Module):
    def __init__(self, c, heads, seq):
        super().__init__()
        self.c, self.heads, self.seq = c, heads, seq  # static sizes: no Shape ops in the export
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x, mask):
        t, c = self.seq, self.c
        d = c // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.reshape(-1, t, self.heads, d).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(2, 3)) * (1.0 / math.sqrt(d))
        att = att.masked_fill(mask, -1e4).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(-1, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=48, seq=16, c=32, heads=4, layers=2):
        super().__init__()
        self.vocab = vocab
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(seq, c)
        self.blocks = nn.ModuleList(Block(c, heads, seq) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        self.register_buffer("pos", torch.arange(seq))
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))

    def forward(self, ids, targets):
        x = self.wte(ids) + self.wpe(self.pos)
        for blk in self.blocks:
            x = blk(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1))


class CNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.head = nn.Linear(32, classes)

    def forward(self, image, label):
        x = F.max_pool2d(F.relu(self.conv1(image)), 2)
        x = F.relu(self.conv2(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return F.cross_entropy(self.head(x), label)


def make(kind, g):
    if kind == "gpt":
        model = GPT()
        ids = torch.randint(0, 48, (2 * ROWS, 16), generator=g)
        targets = torch.roll(ids, -1, dims=1)  # predict the next token
        return model, {"ids": ids, "targets": targets}
    model = CNN()
    image = torch.randn(2 * ROWS, 3, 16, 16, generator=g)
    label = torch.randint(0, 10, (2 * ROWS,), generator=g)
    return model, {"image": image, "label": label}


def export(model, data, names, onnx_path, npz_path):
    # Exported in training mode: in eval mode the exporter merges initializers of equal
    # values (every LayerNorm's fresh ones and zeros), which would then train as one.
    # There is no dropout or batch norm here, so both modes compute alike.
    torch.onnx.export(model, tuple(data[n][:ROWS] for n in names), onnx_path,
                      input_names=names, output_names=["loss"], opset_version=17,
                      dynamic_axes={n: {0: "batch"} for n in names}, do_constant_folding=False,
                      training=torch.onnx.TrainingMode.TRAINING)
    # the first ROWS rows train, the last ROWS validate (--val-fraction 0.5)
    np.savez(npz_path, **{n: data[n].numpy() for n in names})


def run_meshscope(binary, onnx_path, npz_path, log, flags):
    cmd = [binary, "train", "--model", onnx_path, "--data", npz_path, "--batch", str(ROWS),
           "--steps", str(STEPS), "--lr", str(LR), "--min-lr", str(LR), "--warmup", "0",
           "--clip", "0", "--weight-decay", "0", "--val-fraction", "0.5", "--log-every",
           "1", "--log-jsonl", log] + flags
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        print(f"FAIL: meshscope exited {run.returncode}: {' '.join(cmd)}")
        print(run.stdout[-2000:], run.stderr[-2000:])
        return None
    with open(log) as f:
        rows = [json.loads(line) for line in f]
    if "--switch" in flags and "switched" not in run.stdout:
        print(f"FAIL: --switch given, but the run never switched: {run.stdout[-2000:]}")
        return None
    # a switch of layout keeps the mesh's name; any other switch changes it
    layout_only = any("placements" in f for f in flags)
    if ("--switch" in flags and not layout_only and rows
            and rows[0]["strategy"] == rows[-1]["strategy"]):
        print(f"FAIL: --switch given, but every step ran {rows[0]['strategy']}")
        return None
    return [r["loss"] for r in rows]


def meshscope(binary, onnx_path, npz_path, tmp, flags, resume):
    """meshscope's losses: one run, or a run saving at step S and a second resuming there."""
    log = os.path.join(tmp, "log.jsonl")
    if not resume:
        return run_meshscope(binary, onnx_path, npz_path, log, flags)
    at, then = resume
    ck = os.path.join(tmp, "ck")
    first = run_meshscope(binary, onnx_path, npz_path, log, flags + [
        "--save-dir", ck, "--save-every", str(at), "--keep", "5"])
    if first is None:
        return None
    second = run_meshscope(binary, onnx_path, npz_path, os.path.join(tmp, "log2.jsonl"), then + [
        "--resume", os.path.join(ck, f"step-{at:08d}")])
    return None if second is None else first[:at] + second


def main():
    if len(sys.argv) < 3 or sys.argv[2] not in ("gpt", "cnn"):
        print(__doc__)
        return 2
    binary, kind, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
    tol, resume = 1e-4, None
    if flags[:1] == ["--tol"]:
        tol, flags = float(flags[1]), flags[2:]
    if "--resume-at" in flags:
        i = flags.index("--resume-at")
        resume = (int(flags[i + 1]), flags[i + 2:])
        flags = flags[:i]
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model, data = make(kind, g)
    names = list(data)
    if flags[:1] == ["--export"]:  # the model and its data only, into a directory
        os.makedirs(flags[1], exist_ok=True)
        export(model, data, names, os.path.join(flags[1], "model.onnx"),
               os.path.join(flags[1], "data.npz"))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path, npz_path = os.path.join(tmp, "model.onnx"), os.path.join(tmp, "data.npz")
        export(model, data, names, onnx_path, npz_path)
        train = {n: data[n][:ROWS] for n in names}
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), eps=1e-8,
                                weight_decay=0.0)
        ref = []
        for _ in range(STEPS):
            opt.zero_grad()
            loss = model(*(train[n] for n in names))
            loss.backward()
            opt.step()
            ref.append(loss.item())
        got = meshscope(binary, onnx_path, npz_path, tmp, flags, resume)
        if got is None:
            return 1
    bad = [i for i in range(STEPS)
           if i >= len(got) or abs(got[i] - ref[i]) > tol * abs(ref[i])]
    for i in range(STEPS):
        mark = "  <-" if i in bad else ""
        print(f"step {i:2d}  pytorch {ref[i]:.7f}  meshscope "
              f"{got[i] if i < len(got) else float('nan'):.7f}{mark}")
    flags_s = " ".join(flags) or "one rank"
    if bad or ref[-1] >= ref[0]:
        print(f"FAIL {kind} ({flags_s}): steps {bad} differ by more than {tol}, or no learning")
        return 1
    worst = max(abs(got[i] - ref[i]) / abs(ref[i]) for i in range(STEPS))
    if resume:
        flags_s += f", saved at step {resume[0]}, resumed under {' '.join(resume[1]) or 'one rank'}"
    print(f"ok   {kind} ({flags_s}): {STEPS} losses within {tol} of PyTorch's (worst {worst:.1e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
