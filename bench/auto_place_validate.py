#!/usr/bin/env python3
"""auto_place_validate.py BUILD [--steps N] [--only SUBSTRING]

Automatic placements on this machine: for every case, the layout the search finds
("placements": "auto"), its predicted step against the step measured by training under it, and
the same for data parallelism over the tp group (every weight replicated:
"placements": {"*": "complete"} with no rules), whose prediction the search prints beside its
own. Each run trains N steps (default 30) and the measured step is the median of the steps after
the fifth. The machine is shared: run it quiet, and several times.

Cases: GPT-2, BERT and LLaMA tiny under tp 2 and tp 4, with and without sp (the hand layouts'
cases); the image and speech examples under dp2 x tp2, alone and with --memory-cap at 80% of
what data parallelism needs; the ONNX CNN and GPT from PyTorch under dp2 x tp2 (skipped
without PyTorch).
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        sys.exit(2)
    build, steps, only = args[0], 30, ""
    if "--steps" in args:
        steps = int(args[args.index("--steps") + 1])
    if "--only" in args:
        only = args[args.index("--only") + 1]
    return build, steps, only


def ms(text, key):
    m = re.search(key + r" ([0-9.]+) ms", text)
    return float(m.group(1)) if m else None


def mib(text, key):
    m = re.search(key + r" ([0-9.]+) ([KMG])iB", text)
    if not m:
        return None
    return float(m.group(1)) * {"K": 1 / 1024, "M": 1, "G": 1024}[m.group(2)]


def train(cmd, log):
    run = subprocess.run(cmd + ["--log-every", "1", "--log-jsonl", log], capture_output=True,
                         text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {run.returncode}: {run.stdout[-800:]}"
                           f"{run.stderr[-800:]}")
    with open(log) as f:
        rows = [json.loads(line) for line in f]
    return run.stdout, statistics.median(r["step_ms"] for r in rows[5:])


def sharded(line):
    """The classes the layout splits over tp, short: 'c_fc.weight S(1), res1 S(0)'."""
    rules = re.search(r"auto placements: (\{.*?\});", line)
    if not rules:
        return "-"
    out = []
    for k, v in json.loads(rules.group(1)).items():
        tp = [p.strip() for p in v.strip("[]").split(",")]
        if k != "*" and len(tp) > 1 and tp[1] != "R":
            out.append(f"{k.split('*.')[-1]} {tp[1]}")
    return ", ".join(out) or "none (replicated)"


def case(tmp, name, base, mesh, extra, rows):
    """Trains the searched layout and the replicated one; appends a table row."""
    auto = os.path.join(tmp, "auto.json")
    with open(auto, "w") as f:
        json.dump({"mesh": mesh, "placements": "auto", **extra}, f)
    out, got = train(base + ["--strategy", auto], os.path.join(tmp, "a.jsonl"))
    line = next(l for l in out.splitlines() if l.startswith("auto placements: "))
    pred, dp_pred = ms(line, "predicted step"), ms(line, "replicated:")
    rep = os.path.join(tmp, "rep.json")
    with open(rep, "w") as f:
        json.dump({"mesh": mesh, "placements": {"*": "complete"}, **extra}, f)
    _, dp_got = train(base + ["--strategy", rep], os.path.join(tmp, "r.jsonl"))
    rows.append((name, sharded(line), pred, got, dp_pred, dp_got, mib(line, "ms,")))
    err = 100 * (got - pred) / pred
    print(f"{name}: predicted {pred:.3f} ms, measured {got:.3f} ms ({err:+.0f}%); replicated "
          f"predicted {dp_pred:.3f} ms, measured {dp_got:.3f} ms", flush=True)
    return line


def main():
    build, steps, only = parse_args()
    meshscope = os.path.join(build, "meshscope")
    common = ["--steps", str(steps), "--batch", "8"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        kjv = os.path.join(ROOT, "data", "kjv.txt")
        for model in ("gpt", "bert", "llama"):
            for tp in (2, 4):
                for sp in (False, True):
                    name = f"{model}-tiny tp{tp}{' +sp' if sp else ''}"
                    if only in name:
                        case(tmp, name, [meshscope, "train", "--model",
                                         os.path.join(ROOT, "configs", f"{model}-tiny.json"),
                                         "--data", kjv, "--seq", "32"] + common,
                             {"tp": tp}, {"sp": sp}, rows)
        for ex in ("image_classifier", "speech_classifier"):
            binary = os.path.join(build, ex)
            data = os.path.join(tmp, ex + ".st")
            subprocess.run([binary, "make-data", data, "--samples", "256"], check=True,
                           capture_output=True)
            base = [binary, "train", "--data", data] + common
            if only in ex:
                line = case(tmp, f"{ex} dp2 x tp2", base, {"dp": 2, "tp": 2}, {}, rows)
                # the cap: 80% of what data parallelism (every weight replicated) needs
                cap = 0.8 * mib(line, r"replicated: [0-9.]+ ms,")
                case(tmp, f"{ex} dp2 x tp2, memory cap {cap:.2f} MiB",
                     base + ["--memory-cap", f"{cap:.3f}"], {"dp": 2, "tp": 2}, {}, rows)
        py = "/usr/bin/python3"
        for kind in ("cnn", "gpt"):
            d = os.path.join(tmp, "onnx-" + kind)
            r = subprocess.run([py, os.path.join(ROOT, "tests", "pytorch_equivalence.py"),
                                meshscope, kind, "--export", d], capture_output=True, text=True)
            if r.returncode != 0 or only not in "onnx " + kind:
                continue
            case(tmp, f"onnx {kind} dp2 x tp2",
                 [meshscope, "train", "--model", os.path.join(d, "model.onnx"), "--data",
                  os.path.join(d, "data.npz")] + common, {"dp": 2, "tp": 2}, {}, rows)
    print("\n| case | layout (split over tp) | predicted | measured | error | replicated "
          "predicted | replicated measured | error |\n|---|---|---|---|---|---|---|---|")
    for name, layout, pred, got, dpp, dpg, _ in rows:
        print(f"| {name} | {layout} | {pred:.3f} ms | {got:.3f} ms | {100 * (got - pred) / pred:+.0f}% "
              f"| {dpp:.3f} ms | {dpg:.3f} ms | {100 * (dpg - dpp) / dpp:+.0f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
