"""image_vs_torch.py MESHSCOPE [--threads 1,2] [--rounds 3] [--steps 8] [--warmup 3]

One image model's training speed on one rank: the same CNN trained by PyTorch 1.13 (Debian's
python3-torch, "tuned" environment as bench/train_vs_torch.py's) and by meshscope from its ONNX
export (`meshscope train --model cnn.onnx`), in one run, rounds in rotating order. A step is
forward, backward and AdamW on both sides, fp32, batch 32 of 3 x 32 x 32 images.

The model: a 3x3 conv stem to 32 channels, three residual blocks of two 3x3 convolutions with
ReLU (the middle one downsampling by a strided conv), global average pooling and a linear head
over 10 classes, F.cross_entropy. Prints one line per thread count: medians of the measured
steps pooled over the rounds, and PyTorch's time over meshscope's (> 1: meshscope is faster).
Run it with /usr/bin/python3 (where python3-torch lives).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

B, SIDE, WIDTH, CLASSES = 32, 32, 32, 10
TUNED_ENV = {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736",
             "OMP_WAIT_POLICY": "PASSIVE"}


class Res(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.skip = nn.Conv2d(c_in, c_out, 1, stride=stride) if stride > 1 or c_in != c_out else None

    def forward(self, x):
        y = self.conv2(F.relu(self.conv1(x)))
        return F.relu(y + (self.skip(x) if self.skip is not None else x))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, WIDTH, 3, padding=1)
        self.blocks = nn.Sequential(Res(WIDTH, WIDTH, 1), Res(WIDTH, 2 * WIDTH, 2),
                                    Res(2 * WIDTH, 2 * WIDTH, 1))
        self.head = nn.Linear(2 * WIDTH, CLASSES)

    def forward(self, image, label):
        x = self.blocks(F.relu(self.stem(image)))
        return F.cross_entropy(self.head(F.adaptive_avg_pool2d(x, 1).flatten(1)), label)


def torch_side(k, steps, warmup, path):
    """Runs in a child process (its own thread settings and environment): step times in ms."""
    torch.set_num_threads(k)
    torch.manual_seed(0)
    data = np.load(path)
    image, label = torch.from_numpy(data["image"][:B]), torch.from_numpy(data["label"][:B])
    model = CNN()
    model.load_state_dict(torch.load(path + ".pt"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(image, label).backward()
        opt.step()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps(times))


def env_for(k, tuned):
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(k)
    if tuned:
        env.update(TUNED_ENV)
    return env


def blas_core(exe):
    """The OpenBLAS core meshscope asks for on this CPU, for the tuned PyTorch too."""
    out = subprocess.run([exe, "blas-core"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def run_torch(k, a, path):
    out = subprocess.run([sys.executable, __file__, "--torch-child", str(k), "--steps",
                          str(a.steps), "--warmup", str(a.warmup), "--data", path],
                         capture_output=True, text=True, env=env_for(k, True), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_meshscope(exe, k, a, onnx_path, path, tmp):
    log = os.path.join(tmp, f"ms-{k}.jsonl")
    cmd = [exe, "train", "--model", onnx_path, "--data", path, "--batch", str(B), "--steps",
           str(a.warmup + a.steps), "--threads", str(k), "--lr", "1e-3", "--min-lr", "1e-3",
           "--warmup", "0", "--clip", "0", "--weight-decay", "0", "--val-fraction", "0.5",
           "--log-every", "1", "--log-jsonl", log]
    subprocess.run(cmd, capture_output=True, text=True, env=env_for(k, False), check=True)
    with open(log) as f:
        rows = [json.loads(line) for line in f]
    return [r["step_ms"] for r in rows[a.warmup:]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("meshscope", nargs="?")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--torch-child", type=int, default=0)
    ap.add_argument("--data")
    a = ap.parse_args()
    if a.torch_child:
        torch_side(a.torch_child, a.steps, a.warmup, a.data)
        return 0
    if not a.meshscope:
        ap.error("give the meshscope binary")
    core = blas_core(a.meshscope)
    if core:  # Debian's torch calls the same OpenBLAS: both sides run the same GEMM kernels
        TUNED_ENV["OPENBLAS_CORETYPE"] = core
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        model = CNN()
        g = torch.Generator().manual_seed(1)
        image = torch.randn(2 * B, 3, SIDE, SIDE, generator=g)
        label = torch.randint(0, CLASSES, (2 * B,), generator=g)
        path, onnx_path = os.path.join(tmp, "data.npz"), os.path.join(tmp, "cnn.onnx")
        np.savez(path, image=image.numpy(), label=label.numpy())
        torch.save(model.state_dict(), path + ".pt")
        torch.onnx.export(model, (image[:B], label[:B]), onnx_path,
                          input_names=["image", "label"], output_names=["loss"],
                          dynamic_axes={"image": {0: "batch"}, "label": {0: "batch"}},
                          opset_version=17, do_constant_folding=False,
                          training=torch.onnx.TrainingMode.TRAINING)
        for k in (int(x) for x in a.threads.split(",")):
            ms, pt = [], []
            for r in range(a.rounds):
                sides = [("ms", lambda: ms.extend(run_meshscope(a.meshscope, k, a, onnx_path,
                                                                path, tmp))),
                         ("pt", lambda: pt.extend(run_torch(k, a, path)))]
                for _, run in sides[r % 2:] + sides[:r % 2]:
                    run()
            m, p = statistics.median(ms), statistics.median(pt)
            print(f"threads {k}: meshscope {m:.1f} ms/step, pytorch-tuned {p:.1f} ms/step, "
                  f"pytorch / meshscope {p / m:.2f} (medians of {len(ms)} and {len(pt)} steps, "
                  f"{a.rounds} rounds; load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
