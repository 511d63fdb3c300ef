#!/usr/bin/env python3
"""Live gains: does the advisor's first suggestion in the live demo deliver what it predicts?

Each round starts the demo's training job afresh (`make run`'s: gpt-tiny on data/kjv.txt, 4
thread ranks on tp4, the dashboard on localhost, no TUI), waits for the advisor's first
suggestion, accepts it through the dashboard's API exactly as the Accept button does, then
trains WINDOW more steps on the new strategy and stops the job. The measured gain compares the
median step of the WINDOW steps before the switch with the median of the WINDOW steps after it
(the first step after the switch, which pays for the switch, left out); the predicted gain is
the suggestion's. Prints one line per round and the worst gap in points.

Usage: bench/live_gains.py [--bin build/meshscope] [--rounds 5] [--window 20] [--timeout 600]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

DEMO = ["--model", "configs/gpt-tiny.json", "--data", "data/kjv.txt", "--tp", "4", "--batch", "8",
        "--seq", "64", "--lr", "3e-3", "--min-lr", "3e-4", "--log-every", "1000000",
        "--web", "127.0.0.1:0", "--steps", "1000000"]


def request(base, token, path, method="GET"):
    req = urllib.request.Request(base + path, method=method,
                                 headers={"Authorization": "Bearer " + token,
                                          "Origin": base})
    with urllib.request.urlopen(req, timeout=20) as r:
        body = r.read()
        return json.loads(body) if body.strip().startswith(b"{") else {}


def steps(log):
    try:
        with open(log) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def wait_for(pred, timeout, proc):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = pred()
        if v:
            return v
        if proc.poll() is not None:
            sys.exit(f"live_gains: the job ended (exit {proc.returncode}) while waiting")
        time.sleep(0.5)
    sys.exit("live_gains: timed out")


def one_round(a, tmp, r):
    log, out = os.path.join(tmp, f"log{r}.jsonl"), os.path.join(tmp, f"out{r}.txt")
    with open(out, "w") as fo:
        proc = subprocess.Popen([a.bin, "train", *DEMO, "--log-jsonl", log], stdout=fo,
                                stderr=subprocess.STDOUT)
    try:
        url = wait_for(lambda: (re.findall(r"^dashboard: (\S+)", open(out).read(), re.M) or
                                [None])[0], a.timeout, proc)
        base, token = url.split("/?token=")
        sugg = wait_for(lambda: [s for s in request(base, token, "/api/v1/suggestions")
                                 .get("suggestions", []) if s.get("state") == "open"],
                        a.timeout, proc)[0]
        request(base, token, f"/api/v1/suggestions/{sugg['id']}/accept", "POST")
        # the first step logged under the new strategy (the log read once per poll)
        def first_switched():
            rows = steps(log)
            return next((s["step"] for s in rows if s["strategy"] != rows[0]["strategy"]), None)
        switched = wait_for(first_switched, a.timeout, proc)
        wait_for(lambda: len(steps(log)) > switched + a.window + 1, a.timeout, proc)
        request(base, token, "/api/v1/stop", "POST")
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rows = steps(log)
    before = [s["step_ms"] for s in rows if switched - a.window <= s["step"] < switched]
    after = [s["step_ms"] for s in rows if switched + 1 <= s["step"] <= switched + a.window]
    if len(before) < a.window:
        print(f"  (only {len(before)} steps before the switch at step {switched})")
    b, f = statistics.median(before), statistics.median(after)
    measured = (b - f) / b
    return sugg, rows[0]["strategy"], switched, b, f, measured


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build/meshscope")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    gaps = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            sugg, start, at, b, f, measured = one_round(a, tmp, r)
            pred = sugg["predicted_gain"]
            gaps.append(100 * abs(pred - measured))
            print(f"round {r + 1}: {start} -> {sugg['target']} at step {at}: predicted "
                  f"{100 * pred:+.1f}%, measured {100 * measured:+.1f}% ({b:.1f} -> {f:.1f} ms, "
                  f"medians of {a.window} steps; the advisor's current "
                  f"{1e3 * sugg['current_step_s']:.1f} ms, predicted "
                  f"{1e3 * sugg['predicted_step_s']:.1f} ms); gap {gaps[-1]:.1f} points; load average "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    print(f"worst gap {max(gaps):.1f} points over {len(gaps)} rounds (goal: 5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
