#!/usr/bin/python3
"""train_vs_torch.py - single-rank GPT and LLaMA training speed, meshscope next to PyTorch.

Called by bench/train_vs_torch.sh (which builds meshscope, prepares the data and installs
python3-torch first); runs with Debian's /usr/bin/python3 and only the standard library (the
PyTorch side is a child process, bench/torch_gpt.py).

For each model and each thread count: `meshscope train` (one rank, --threads K) and
bench/torch_gpt.py or bench/torch_llama.py (torch.set_num_threads(K)) in two environments, "stock" (as installed) and
"tuned" (see TUNED_ENV), run one after the other, ROUNDS times with a rotating order; the
measured steps of all rounds are pooled per side and their median is reported.
Then `meshscope bench gemm --backward` times the model's own dense GEMM shapes, giving the
sgemm ceiling: the rate the step's dense GEMMs would run at if nothing else took time.

FLOPs per training step, the same formula for both sides (PaLM appendix B, as nanoGPT's
estimate_mfu): 6 * N * B * T + 12 * L * C * T * B * T, where N counts every parameter except
the position embeddings (the tied wte counts once, as the logits matmul; LLaMA's untied
embed_tokens is a lookup and does not count, its lm_head does). The attention term counts the
full T x T scores (no causal discount), whatever each implementation computes.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

MODELS = {
    "a": dict(
        name="A: GPT L4 H4 C256 V256",
        config="bench/configs/gpt-a.json",
        L=4, H=4, C=256, V=256, P=128, B=8, T=128, warmup=3, steps=5, rounds=3,
    ),
    "b": dict(
        name="B: GPT-2 small L12 H12 C768 V50257",
        config="bench/configs/gpt2-small.json",
        L=12, H=12, C=768, V=50257, P=1024, B=4, T=64, warmup=1, steps=3, rounds=3,
    ),
    # LLaMA (RMSNorm, rotary, SwiGLU, grouped kv heads, untied head): configs/llama-tiny.json,
    # and the width of model A (bench/configs/llama-a.json).
    "lt": dict(
        name="LT: LLaMA L4 H4 KV2 C128 I352 V256", family="llama",
        config="configs/llama-tiny.json",
        L=4, H=4, KV=2, C=128, I=352, V=256, P=128, B=8, T=128, warmup=3, steps=5, rounds=3,
    ),
    "la": dict(
        name="LA: LLaMA L4 H4 KV2 C256 I704 V256", family="llama",
        config="bench/configs/llama-a.json",
        L=4, H=4, KV=2, C=256, I=704, V=256, P=128, B=8, T=128, warmup=3, steps=5, rounds=3,
    ),
}


def die(msg):
    print(f"train_vs_torch: {msg}", file=sys.stderr)
    sys.exit(1)


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return float("nan")


def is_llama(m):
    return m.get("family") == "llama"


def n_params(m):
    """All parameters of the tied GPT-2 (as meshscope and torch_gpt.py build it), or of the
    untied LLaMA (llama.c, torch_llama.py)."""
    L, C, V, P = m["L"], m["C"], m["V"], m["P"]
    if is_llama(m):
        kv = C // m["H"] * m["KV"]
        per_layer = 2 * C + C * C + 2 * C * kv + C * C + 3 * C * m["I"]
        return 2 * V * C + L * per_layer + C
    ln = 2 * 2 * C
    per_layer = ln + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    return V * C + P * C + L * per_layer + 2 * C


def step_flops(m):
    N = n_params(m) - (m["V"] if is_llama(m) else m["P"]) * m["C"]
    B, T, L, C = m["B"], m["T"], m["L"], m["C"]
    return 6.0 * N * B * T + 12.0 * L * C * T * B * T


def gemm_shapes(m):
    """The dense products of one step as the engine calls them: weights are [in, out], so a
    linear layer is C[BT, out] = A[BT, in] B[in, out]; the tied logits multiply by wte [V, C]
    transposed. Each runs forward, dA and dB (all three, as in training)."""
    BT, C, V, L = m["B"] * m["T"], m["C"], m["V"], m["L"]
    if is_llama(m):  # LINEAR: x W^T with W [out, in]
        kv, inter = C // m["H"] * m["KV"], m["I"]
        return [
            dict(name="q, o", m=BT, n=C, k=C, tb=True, count=2 * L),
            dict(name="k, v", m=BT, n=kv, k=C, tb=True, count=2 * L),
            dict(name="gate, up", m=BT, n=inter, k=C, tb=True, count=2 * L),
            dict(name="down", m=BT, n=C, k=inter, tb=True, count=L),
            dict(name="logits", m=BT, n=V, k=C, tb=True, count=1),
        ]
    return [
        dict(name="qkv", m=BT, n=3 * C, k=C, tb=False, count=L),
        dict(name="attn proj", m=BT, n=C, k=C, tb=False, count=L),
        dict(name="mlp fc", m=BT, n=4 * C, k=C, tb=False, count=L),
        dict(name="mlp proj", m=BT, n=C, k=4 * C, tb=False, count=L),
        dict(name="logits", m=BT, n=V, k=C, tb=True, count=1),
    ]


def run(cmd, env=None, what="", timeout=3600):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        die(f"{what} timed out after {timeout} s: {' '.join(cmd)}")
    except OSError as e:
        die(f"{what} could not start: {e}")
    if p.returncode != 0:
        tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-15:])
        die(f"{what} failed (exit {p.returncode}): {' '.join(cmd)}\n{tail}")
    return p.stdout, time.time() - t0


# The "tuned" PyTorch variant: environment only, no code change.
#  - glibc keeps freed memory in its heap instead of returning each large block with munmap:
#    torch allocates activations and (set_to_none) gradients afresh every step, and in a VM
#    every first touch of a fresh page is an expensive fault (see bench/README.md). meshscope
#    allocates its buffers once, so this does not change its numbers.
#  - OpenMP workers sleep instead of spinning after a parallel region, so they do not compete
#    for the cores with OpenBLAS's own pthreads (Debian's torch calls OpenBLAS-pthread).
TUNED_ENV = {
    "GLIBC_TUNABLES": "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736",
    "OMP_WAIT_POLICY": "PASSIVE",
}
TORCH_VARIANTS = ("stock", "tuned")


def blas_core(exe):
    """The OpenBLAS core meshscope asks for on this CPU (engine/kernels/blas.h; '' when the
    library knows the CPU). Debian's torch calls the same OpenBLAS for its linear layers, so the
    tuned PyTorch gets it too: both sides then run the same GEMM kernels."""
    out = subprocess.run([exe, "blas-core"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def thread_env(k, extra=None):
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(k)
    env.update(extra or {})
    return env


def run_meshscope(exe, m, k, tmp, data):
    log = os.path.join(tmp, f"ms-{m['key']}-{k}.jsonl")
    steps = m["warmup"] + m["steps"]
    cmd = [exe, "train", "--model", m["config"], "--data", data, "--steps", str(steps),
           "--batch", str(m["B"]), "--seq", str(m["T"]), "--threads", str(k),
           "--log-jsonl", log, "--lr", "1e-3"]
    _, wall = run(cmd, thread_env(k), f"meshscope train ({m['name']}, {k} threads)")
    rows = []
    with open(log) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    if len(rows) != steps:
        die(f"meshscope train logged {len(rows)} steps, expected {steps} ({log})")
    meas = rows[m["warmup"]:]
    return dict(cmd=cmd, step_ms=[r["step_ms"] for r in meas],
                losses=[r["loss"] for r in meas], wall_s=wall)


def run_torch(m, k, variant):
    script = "torch_llama.py" if is_llama(m) else "torch_gpt.py"
    cmd = ["/usr/bin/python3", os.path.join("bench", script),
           "--layers", str(m["L"]), "--heads", str(m["H"]), "--embd", str(m["C"]),
           "--vocab", str(m["V"]), "--positions", str(m["P"]), "--batch", str(m["B"]),
           "--seq", str(m["T"]), "--threads", str(k), "--warmup", str(m["warmup"]),
           "--steps", str(m["steps"])]
    if is_llama(m):
        cmd += ["--kv-heads", str(m["KV"]), "--inter", str(m["I"])]
    extra = TUNED_ENV if variant == "tuned" else None
    out, wall = run(cmd, thread_env(k, extra), f"PyTorch {variant} ({m['name']}, {k} threads)")
    try:
        res = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        die(f"bench/torch_gpt.py printed no JSON result:\n{out[-2000:]}")
    res["cmd"] = ([f"{key}={val}" for key, val in extra.items()] if extra else []) + cmd
    res["wall_s"] = wall
    return res


def run_gemm(exe, shape, k, reps):
    cmd = [exe, "bench", "gemm", "--m", str(shape["m"]), "--n", str(shape["n"]),
           "--k", str(shape["k"]), "--backward", "--threads", str(k), "--reps", str(reps),
           "--json"]
    if shape["tb"]:
        cmd.insert(cmd.index("--backward"), "--tb")
    out, _ = run(cmd, thread_env(k), f"meshscope bench gemm ({shape['name']})")
    res = json.loads(out)
    return {r["pass"]: r for r in res["results"]}, cmd


def fmt_ms(x):
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def main():
    ap = argparse.ArgumentParser(description="meshscope train vs PyTorch, one rank")
    ap.add_argument("--meshscope", default=os.path.join(ROOT, "build", "meshscope"),
                    help="the meshscope binary (default build/meshscope)")
    ap.add_argument("--data", default="data/kjv.txt")
    ap.add_argument("--models", default="a,b", help="subset of a,b,lt,la (default a,b)")
    ap.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    ap.add_argument("--rounds", type=int, default=0,
                    help="runs of each side per point, order rotating (default 3)")
    ap.add_argument("--torch-variants", default="stock,tuned",
                    help="PyTorch environments: stock (as installed), tuned (glibc keeps "
                    "freed memory, OpenMP waits passively); default both")
    ap.add_argument("--gemm-reps", type=int, default=5)
    ap.add_argument("--no-gemm", action="store_true", help="skip the sgemm ceiling")
    ap.add_argument("--json-out", help="also write every number to this file")
    a = ap.parse_args()

    exe = os.path.abspath(a.meshscope)
    if not os.access(exe, os.X_OK):
        die(f"{exe} is not an executable; build meshscope first (bench/train_vs_torch.sh does)")
    core = blas_core(exe)
    if core:
        TUNED_ENV["OPENBLAS_CORETYPE"] = core
        print(f"OpenBLAS core {core} for meshscope and the tuned PyTorch (OPENBLAS_CORETYPE)")
    if not os.path.isfile(os.path.join(ROOT, a.data)) and not os.path.isfile(a.data):
        die(f"{a.data} is missing; run scripts/prepare-data.sh")
    keys = [x.strip() for x in a.models.split(",") if x.strip()]
    for key in keys:
        if key not in MODELS:
            die(f"--models: unknown model '{key}' (a, b, lt, la)")
    try:
        threads = [int(x) for x in a.threads.split(",") if x.strip()]
    except ValueError:
        die(f"--threads: '{a.threads}' is not a list of integers")
    if not threads or min(threads) < 1:
        die("--threads: give thread counts >= 1, such as 1,2")
    if a.rounds < 0:
        die("--rounds must be >= 1")
    variants = [x.strip() for x in a.torch_variants.split(",") if x.strip()]
    if not variants or any(v not in TORCH_VARIANTS for v in variants):
        die(f"--torch-variants: '{a.torch_variants}' is not a subset of stock,tuned")

    print(f"machine: {os.cpu_count()} CPUs, load average {loadavg():.2f} at start; "
          "medians of the measured steps (the machine is noisy: other jobs change these "
          "numbers by tens of percent)")
    results = []
    with tempfile.TemporaryDirectory(prefix="ms-bench-") as tmp:
        for key in keys:
            m = dict(MODELS[key], key=key)
            rounds = a.rounds or m["rounds"]
            flops = step_flops(m)
            print(f"\n== model {m['name']}, B={m['B']} T={m['T']}: {n_params(m)/1e6:.2f} M "
                  f"params, {flops/1e9:.2f} GFLOP per step; {m['warmup']} warm-up + "
                  f"{m['steps']} measured steps per run, {rounds} round(s)", flush=True)
            for k in threads:
                sides = ["meshscope"] + [f"pytorch-{v}" for v in variants]
                steps = {x: [] for x in sides}
                runs = {x: [] for x in sides}
                load0 = loadavg()
                for r in range(rounds):
                    # Rotate the order so that no side always runs first (or last).
                    for side in sides[r % len(sides):] + sides[:r % len(sides)]:
                        if side == "meshscope":
                            x = run_meshscope(exe, m, k, tmp, a.data)
                        else:
                            x = run_torch(m, k, side.split("-")[1])
                            if x["params"] != n_params(m):
                                die(f"the PyTorch model has {x['params']} parameters, "
                                    f"expected {n_params(m)}")
                        steps[side] += x["step_ms"]
                        runs[side].append(x)
                load1 = loadavg()
                tokens = m["B"] * m["T"]
                row = dict(model=m["name"], key=key, threads=k, B=m["B"], T=m["T"],
                           params=n_params(m), gflop_per_step=flops / 1e9, rounds=rounds,
                           load_before=load0, load_after=load1, sides={})
                for side in sides:
                    med = statistics.median(steps[side])
                    d = dict(step_ms=med, min_step_ms=min(steps[side]), steps_ms=steps[side],
                             tokens_per_s=tokens / (med / 1e3),
                             gflops=flops / 1e9 / (med / 1e3),
                             cmd=" ".join(runs[side][0]["cmd"]))
                    if side != "meshscope":
                        for part in ("forward", "backward", "clip_adamw"):
                            d[part + "_ms"] = statistics.median(
                                x[f"median_{part}_ms"] for x in runs[side])
                        d["torch"] = runs[side][0]["torch"]
                        d["blas"] = runs[side][0]["blas"]
                    row["sides"][side] = d
                ms_med = row["sides"]["meshscope"]["step_ms"]
                for side in sides:
                    d = row["sides"][side]
                    d["meshscope_speedup"] = d["step_ms"] / ms_med
                    d["meshscope_speedup_best"] = (d["min_step_ms"]
                                                   / row["sides"]["meshscope"]["min_step_ms"])
                line = f"  {k} thread(s), load {load0:.1f} -> {load1:.1f}:"
                for side in sides:
                    d = row["sides"][side]
                    line += (f"\n    {side:14s} {fmt_ms(d['step_ms']):>6s} ms/step (best "
                             f"{fmt_ms(d['min_step_ms'])}) "
                             f"{d['tokens_per_s']:7.0f} tok/s {d['gflops']:6.1f} GFLOP/s")
                    if side != "meshscope":
                        line += (f"  (fwd {fmt_ms(d['forward_ms'])}, bwd "
                                 f"{fmt_ms(d['backward_ms'])}, clip+AdamW "
                                 f"{fmt_ms(d['clip_adamw_ms'])} ms); meshscope speed / this = "
                                 f"{d['meshscope_speedup']:.2f} (best steps: "
                                 f"{d['meshscope_speedup_best']:.2f})")
                print(line, flush=True)
                if not a.no_gemm:
                    gemms, dense_flops, floor_s = [], 0.0, 0.0
                    for sh in gemm_shapes(m):
                        rates, cmd = run_gemm(exe, sh, k, a.gemm_reps)
                        f1 = 2.0 * sh["m"] * sh["n"] * sh["k"]
                        for p in ("forward", "dA", "dB"):
                            dense_flops += sh["count"] * f1
                            floor_s += sh["count"] * f1 / (rates[p]["gflops"] * 1e9)
                        gemms.append(dict(sh, cmd=" ".join(cmd),
                                          **{p + "_gflops": rates[p]["gflops"]
                                             for p in ("forward", "dA", "dB")}))
                        print(f"    sgemm {sh['name']:9s} m={sh['m']} n={sh['n']} k={sh['k']}"
                              f"{' (B^T)' if sh['tb'] else ''}: forward "
                              f"{rates['forward']['gflops']:.1f}, dA {rates['dA']['gflops']:.1f}"
                              f", dB {rates['dB']['gflops']:.1f} GFLOP/s", flush=True)
                    ceiling = dense_flops / floor_s / 1e9
                    row.update(gemms=gemms, dense_gflop_per_step=dense_flops / 1e9,
                               gemm_floor_ms=floor_s * 1e3, sgemm_ceiling_gflops=ceiling)
                    for side in sides:
                        row["sides"][side]["vs_ceiling"] = row["sides"][side]["gflops"] / ceiling
                    print(f"    sgemm ceiling {ceiling:.1f} GFLOP/s (the dense GEMMs alone take "
                          f"{floor_s*1e3:.0f} ms/step); achieved/ceiling: "
                          + ", ".join(f"{x} {row['sides'][x]['vs_ceiling']:.2f}" for x in sides),
                          flush=True)
                results.append(row)

    print("\n| model | threads | side | ms/step (median) | best ms/step | tokens/s | GFLOP/s "
          "| / sgemm ceiling | meshscope speed / this (median) | (best) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for side, d in r["sides"].items():
            vc = f"{d['vs_ceiling']:.2f}" if "vs_ceiling" in d else "-"
            sp = ("- | -" if side == "meshscope" else
                  f"{d['meshscope_speedup']:.2f} | {d['meshscope_speedup_best']:.2f}")
            print(f"| {r['model'].split(':')[0]} | {r['threads']} | {side} | "
                  f"{fmt_ms(d['step_ms'])} | {fmt_ms(d['min_step_ms'])} | "
                  f"{d['tokens_per_s']:.0f} | {d['gflops']:.1f} | {vc} | {sp} |")
    if not a.no_gemm:
        print("\n| model | threads | GEMM (m x k @ k x n) | forward | dA | dB | GFLOP/s |")
        print("|---|---|---|---|---|---|---|")
        for r in results:
            for g in r.get("gemms", []):
                shape = (f"{g['name']} {g['m']}x{g['k']} @ {g['k']}x{g['n']}"
                         f"{' (B^T)' if g['tb'] else ''}")
                print(f"| {r['model'].split(':')[0]} | {r['threads']} | {shape} | "
                      f"{g['forward_gflops']:.1f} | {g['dA_gflops']:.1f} | {g['dB_gflops']:.1f} "
                      "| |")
            if "sgemm_ceiling_gflops" in r:
                print(f"| {r['model'].split(':')[0]} | {r['threads']} | **ceiling** (FLOP-weighted"
                      f", {r['gemm_floor_ms']:.0f} ms/step) | | | | "
                      f"**{r['sgemm_ceiling_gflops']:.1f}** |")
    print(f"\nload average {loadavg():.2f} at the end. 'meshscope speed / this' = this side's "
          "step time / meshscope's (above 1: meshscope is faster); tokens/s and GFLOP/s are "
          "from the median step; 'best' compares each side's fastest measured step, the least "
          "disturbed by other jobs.")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(dict(results=results, cpus=os.cpu_count()), f, indent=1)
        print(f"wrote {a.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
