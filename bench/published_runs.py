#!/usr/bin/env python3
"""Published GPU training runs against the planner's prediction.

Each run of bench/published_runs.json is priced by `meshscope plan --json --evaluate` with its
published settings pinned (tp, pp, dp, the micro-batch where published, ZeRO) and the ones the
runs all shared (no sp, no cp, full recompute, no overlapped buckets, bf16); the planner picks
what the source leaves unstated. A run's software stack may set cluster fields where it behaves
differently from the stack the preset describes ("stacks" in the JSON, each with its source). Prints one markdown row per run (published and predicted
hardware TFLOP/s per GPU, the error) and, per software stack and over all runs, the mean error
(bias) and the worst.

Usage: bench/published_runs.py [--bin build/meshscope] [--runs bench/published_runs.json]
           [--cluster dgx-a100-80gb] [--stack megatron-lm] [--check WORST,BIAS]
--check 10,3 exits 1 unless the selected runs' worst |error| <= 10% and |bias| <= 3%.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

SHARED = {"cp": "1", "sp": "0", "recompute": "1", "bucket_mb": "0", "zero": "0"}


def settings_of(run):
    s = dict(SHARED)
    for kv in run["settings"].split(","):
        k, v = kv.split("=", 1)
        s[k] = v
    return ",".join(f"{k}={v}" for k, v in s.items())


def cluster_for(cluster, run, stacks, tmp):
    """The preset as the run's software stack behaves: the preset file with the stack's
    settings (bench/published_runs.json "stacks") applied, or the preset's name as it is."""
    name = run.get("cluster", cluster)
    over = {k: v for k, v in stacks.get(run["stack"], {}).items() if k != "why"}
    if not over:
        return name
    src = name if name.endswith(".json") else os.path.join(
        os.path.dirname(__file__), "..", "configs", "clusters", name + ".json")
    with open(src) as f:
        c = json.load(f)
    c.update(over)
    c["name"] = f"{c['name']}-{run['stack']}"
    path = os.path.join(tmp, f"{c['name']}.json")
    with open(path, "w") as f:
        json.dump(c, f)
    return path


def price(binary, cluster, run, tmp):
    model = {"model_type": "gpt2", "n_positions": run.get("seq", 2048)}
    model.update(run["model"])
    path = os.path.join(tmp, "model.json")
    with open(path, "w") as f:
        json.dump(model, f)
    cmd = [binary, "plan", "--model", path, "--cluster", cluster,
           "--devices", str(run["gpus"]), "--global-batch", str(run["global_batch"]),
           "--seq", str(run.get("seq", 2048)), "--dtype", "bf16",
           "--evaluate", settings_of(run), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"published_runs: {run['name']}: {' '.join(cmd)} failed: "
                 f"{out.stderr.strip() or out.stdout.strip()}")
    c = json.loads(out.stdout)["candidates"][0]
    return c["hardware_tflops_per_device"], c["step_time_s"], c["text"]


def summary(rows):
    errs = [r["error"] for r in rows]
    return sum(errs) / len(errs), max(errs, key=abs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build/meshscope")
    ap.add_argument("--runs", default=os.path.join(os.path.dirname(__file__), "published_runs.json"))
    ap.add_argument("--cluster", default="dgx-a100-80gb")
    ap.add_argument("--stack", help="only the runs of this software stack")
    ap.add_argument("--check", help="WORST,BIAS in percent: exit 1 unless both hold")
    a = ap.parse_args()
    data = json.load(open(a.runs))
    runs = [r for r in data["runs"] if not a.stack or r["stack"] == a.stack]
    stacks = data.get("stacks", {})
    if not runs:
        sys.exit(f"published_runs: no run of stack {a.stack!r} in {a.runs}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in runs:
            hw, step, text = price(a.bin, cluster_for(a.cluster, r, stacks, tmp), r, tmp)
            rows.append(dict(r, predicted=hw, step=step, text=text,
                             error=100 * (hw / r["published"] - 1)))
    print("| run | source | stack | GPUs | batch | settings | published | predicted | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['source']} | {r['stack']} | {r['gpus']} | {r['global_batch']} "
              f"| {r['text']} | {r['published']:g} | {r['predicted']:.1f} | {r['error']:+.1f}% |")
    print()
    stacks = sorted({r["stack"] for r in rows})
    for st in stacks + ([None] if len(stacks) > 1 else []):
        sel = [r for r in rows if st is None or r["stack"] == st]
        bias, worst = summary(sel)
        print(f"{st or 'all runs'}: {len(sel)} runs from {len({r['source'] for r in sel})} "
              f"sources; mean error {bias:+.1f}%, worst {worst:+.1f}%")
    if a.check:
        lim_worst, lim_bias = (float(x) for x in a.check.split(","))
        bias, worst = summary(rows)
        if abs(worst) > lim_worst or abs(bias) > lim_bias:
            print(f"published_runs: FAIL: worst {worst:+.1f}% (limit {lim_worst:g}%), "
                  f"bias {bias:+.1f}% (limit {lim_bias:g}%)")
            return 1
        print(f"published_runs: PASS: worst {worst:+.1f}%, bias {bias:+.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
