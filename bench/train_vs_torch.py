#!/usr/bin/python3
"""train_vs_torch.py - single-rank GPT training speed, meshscope next to PyTorch in one run.

Called by bench/train_vs_torch.sh (which builds meshscope, prepares the data and installs
python3-torch first); runs with Debian's /usr/bin/python3 and only the standard library (the
PyTorch side is a child process, bench/torch_gpt.py).

For each model and each thread count: `meshscope train` (one rank, --threads K) and
bench/torch_gpt.py (torch.set_num_threads(K)) run one after the other, ROUNDS times alternating
which goes first; the measured steps of all rounds are pooled and their median is reported.
Then `meshscope bench gemm --backward` times the model's own dense GEMM shapes, giving the
sgemm ceiling: the rate the step's dense GEMMs would run at if nothing else took time.

FLOPs per training step, the same formula for both sides (PaLM appendix B, as nanoGPT's
estimate_mfu): 6 * N * B * T + 12 * L * C * T * B * T, where N counts every parameter except
the position embeddings (the tied wte counts once, as the logits matmul). The attention term
counts the full T x T scores (no causal discount), whatever each implementation computes.
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
        L=4, H=4, C=256, V=256, P=128, B=8, T=128, warmup=3, steps=5,
    ),
    "b": dict(
        name="B: GPT-2 small L12 H12 C768 V50257",
        config="bench/configs/gpt2-small.json",
        L=12, H=12, C=768, V=50257, P=1024, B=4, T=64, warmup=1, steps=3,
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


def n_params(m):
    """All parameters of the tied GPT-2 (as meshscope and torch_gpt.py build it)."""
    L, C, V, P = m["L"], m["C"], m["V"], m["P"]
    per_layer = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    return V * C + P * C + L * per_layer + 2 * C


def step_flops(m):
    N = n_params(m) - m["P"] * m["C"]
    B, T, L, C = m["B"], m["T"], m["L"], m["C"]
    return 6.0 * N * B * T + 12.0 * L * C * T * B * T


def gemm_shapes(m):
    """The dense products of one step as the engine calls them: weights are [in, out], so a
    linear layer is C[BT, out] = A[BT, in] B[in, out]; the tied logits multiply by wte [V, C]
    transposed. Each runs forward, dA and dB (all three, as in training)."""
    BT, C, V, L = m["B"] * m["T"], m["C"], m["V"], m["L"]
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


def thread_env(k):
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(k)
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


def run_torch(m, k):
    cmd = ["/usr/bin/python3", os.path.join("bench", "torch_gpt.py"),
           "--layers", str(m["L"]), "--heads", str(m["H"]), "--embd", str(m["C"]),
           "--vocab", str(m["V"]), "--positions", str(m["P"]), "--batch", str(m["B"]),
           "--seq", str(m["T"]), "--threads", str(k), "--warmup", str(m["warmup"]),
           "--steps", str(m["steps"])]
    out, wall = run(cmd, thread_env(k), f"PyTorch ({m['name']}, {k} threads)")
    try:
        res = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        die(f"bench/torch_gpt.py printed no JSON result:\n{out[-2000:]}")
    res["cmd"] = cmd
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
    ap.add_argument("--models", default="a,b", help="subset of a,b (default a,b)")
    ap.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="meshscope/PyTorch pairs per point, order alternating (default 1)")
    ap.add_argument("--gemm-reps", type=int, default=5)
    ap.add_argument("--no-gemm", action="store_true", help="skip the sgemm ceiling")
    ap.add_argument("--json-out", help="also write every number to this file")
    a = ap.parse_args()

    exe = os.path.abspath(a.meshscope)
    if not os.access(exe, os.X_OK):
        die(f"{exe} is not an executable; build meshscope first (bench/train_vs_torch.sh does)")
    if not os.path.isfile(os.path.join(ROOT, a.data)) and not os.path.isfile(a.data):
        die(f"{a.data} is missing; run scripts/prepare-data.sh")
    keys = [x.strip() for x in a.models.split(",") if x.strip()]
    for key in keys:
        if key not in MODELS:
            die(f"--models: unknown model '{key}' (a, b)")
    try:
        threads = [int(x) for x in a.threads.split(",") if x.strip()]
    except ValueError:
        die(f"--threads: '{a.threads}' is not a list of integers")
    if not threads or min(threads) < 1:
        die("--threads: give thread counts >= 1, such as 1,2")
    if a.rounds < 1:
        die("--rounds must be >= 1")

    print(f"machine: {os.cpu_count()} CPUs, load average {loadavg():.2f} at start; "
          "medians of the measured steps (the machine is noisy: other jobs change these "
          "numbers by tens of percent)")
    results = []
    with tempfile.TemporaryDirectory(prefix="ms-bench-") as tmp:
        for key in keys:
            m = dict(MODELS[key], key=key)
            flops = step_flops(m)
            print(f"\n== model {m['name']}, B={m['B']} T={m['T']}: {n_params(m)/1e6:.2f} M "
                  f"params, {flops/1e9:.2f} GFLOP per step; {m['warmup']} warm-up + "
                  f"{m['steps']} measured steps x {a.rounds} round(s)", flush=True)
            for k in threads:
                ms_steps, pt_steps, ms_runs, pt_runs = [], [], [], []
                load0 = loadavg()
                for r in range(a.rounds):
                    order = ("ms", "pt") if r % 2 == 0 else ("pt", "ms")
                    for side in order:
                        if side == "ms":
                            x = run_meshscope(exe, m, k, tmp, a.data)
                            ms_steps += x["step_ms"]
                            ms_runs.append(x)
                        else:
                            x = run_torch(m, k)
                            pt_steps += x["step_ms"]
                            pt_runs.append(x)
                load1 = loadavg()
                ms_med, pt_med = statistics.median(ms_steps), statistics.median(pt_steps)
                tokens = m["B"] * m["T"]
                row = dict(model=m["name"], key=key, threads=k, B=m["B"], T=m["T"],
                           params=n_params(m), gflop_per_step=flops / 1e9,
                           meshscope_step_ms=ms_med, meshscope_steps_ms=ms_steps,
                           meshscope_tokens_per_s=tokens / (ms_med / 1e3),
                           meshscope_gflops=flops / 1e9 / (ms_med / 1e3),
                           torch_step_ms=pt_med, torch_steps_ms=pt_steps,
                           torch_tokens_per_s=tokens / (pt_med / 1e3),
                           torch_gflops=flops / 1e9 / (pt_med / 1e3),
                           speed_ratio=pt_med / ms_med,
                           torch_forward_ms=statistics.median(
                               x["median_forward_ms"] for x in pt_runs),
                           torch_backward_ms=statistics.median(
                               x["median_backward_ms"] for x in pt_runs),
                           torch_clip_adamw_ms=statistics.median(
                               x["median_clip_adamw_ms"] for x in pt_runs),
                           torch_version=pt_runs[0]["torch"], torch_blas=pt_runs[0]["blas"],
                           torch_params=pt_runs[0]["params"],
                           meshscope_cmd=" ".join(ms_runs[0]["cmd"]),
                           torch_cmd=" ".join(pt_runs[0]["cmd"]),
                           load_before=load0, load_after=load1)
                if pt_runs[0]["params"] != n_params(m):
                    print(f"  warning: PyTorch model has {pt_runs[0]['params']} parameters, "
                          f"expected {n_params(m)}", file=sys.stderr)
                print(f"  {k} thread(s): meshscope {fmt_ms(ms_med)} ms/step "
                      f"{row['meshscope_tokens_per_s']:.0f} tok/s {row['meshscope_gflops']:.1f} "
                      f"GFLOP/s | PyTorch {fmt_ms(pt_med)} ms/step "
                      f"{row['torch_tokens_per_s']:.0f} tok/s {row['torch_gflops']:.1f} GFLOP/s "
                      f"| meshscope speed / PyTorch speed = {row['speed_ratio']:.2f} "
                      f"(load {load0:.1f} -> {load1:.1f})", flush=True)
                print(f"    PyTorch breakdown: forward {fmt_ms(row['torch_forward_ms'])} ms, "
                      f"backward {fmt_ms(row['torch_backward_ms'])} ms, clip+AdamW "
                      f"{fmt_ms(row['torch_clip_adamw_ms'])} ms", flush=True)
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
                               gemm_floor_ms=floor_s * 1e3, sgemm_ceiling_gflops=ceiling,
                               meshscope_vs_ceiling=row["meshscope_gflops"] / ceiling,
                               torch_vs_ceiling=row["torch_gflops"] / ceiling)
                    print(f"    sgemm ceiling {ceiling:.1f} GFLOP/s (dense GEMMs alone: "
                          f"{floor_s*1e3:.0f} ms/step); achieved/ceiling: meshscope "
                          f"{row['meshscope_vs_ceiling']:.2f}, PyTorch "
                          f"{row['torch_vs_ceiling']:.2f}", flush=True)
                results.append(row)

    print("\n| model | threads | meshscope ms/step | tok/s | GFLOP/s | PyTorch ms/step | tok/s "
          "| GFLOP/s | meshscope/PyTorch speed | sgemm ceiling GFLOP/s | meshscope / ceiling "
          "| PyTorch / ceiling |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        ceil = (f"{r['sgemm_ceiling_gflops']:.1f} | {r['meshscope_vs_ceiling']:.2f} | "
                f"{r['torch_vs_ceiling']:.2f}") if "sgemm_ceiling_gflops" in r else "- | - | -"
        print(f"| {r['model']} | {r['threads']} | {fmt_ms(r['meshscope_step_ms'])} | "
              f"{r['meshscope_tokens_per_s']:.0f} | {r['meshscope_gflops']:.1f} | "
              f"{fmt_ms(r['torch_step_ms'])} | {r['torch_tokens_per_s']:.0f} | "
              f"{r['torch_gflops']:.1f} | {r['speed_ratio']:.2f} | {ceil} |")
    print(f"\nload average {loadavg():.2f} at the end. meshscope/PyTorch speed = PyTorch step "
          "time / meshscope step time (above 1: meshscope is faster).")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(dict(results=results, cpus=os.cpu_count()), f, indent=1)
        print(f"wrote {a.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
