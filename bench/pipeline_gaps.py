#!/usr/bin/env python3
"""Where a pipeline step's idle time goes, from a meshscope trace (its `pipeline` slices).

Usage: bench/pipeline_gaps.py TRACE.json [--skip 3]

For every rank and step from --skip on, each gap before a compute action is split into
  wait  until its input existed: the producing action's end on the neighbour (F of model chunk
        k needs F of k-1; B of k needs B of k+1, the last chunk's B its own F)
  late  the rest, from max(own previous end, input made) to the start: the receive, waking up,
        being scheduled, any fixed cost between two actions
  tail  after the rank's last action, to the end of the step's window
(the four parts, with busy, add up to the rank's window). Then each step is replayed with
instant posted transfers (a compute starts once its input is made and its rank is free),
i.e. the planner's simulator, with the actions' durations taken four ways:
  uniform    the step's mean F, B and W (what the formulas assume: equal stages)
  per-chunk  each model chunk's mean F, B and W (unequal stages, e.g. the head on the last)
  per-rank   each rank's mean F, B and W
  actual     every action's own duration
  cpu        every action's thread CPU time (`cpu ns`, when the trace has it): what the step
             would take with a core per rank and free transfers
The differences between measured, actual, per-chunk and uniform say how much of the bubble
comes from transfers and scheduling (measured - actual), from jitter (actual - per-chunk),
from unequal chunks (per-chunk - uniform) and from the schedule itself (uniform). Last, the
durations of F and B by how many ranks were inside an action at the same time: with more
ranks than cores, a crowded action takes longer."""
import collections
import json
import statistics as st
import sys


def load(path, skip):
    d = json.load(open(path))
    ev = d['traceEvents'] if isinstance(d, dict) else d
    acts = [e for e in ev if e.get('cat') == 'pipeline' and e.get('ph') == 'X']
    if not acts:
        sys.exit(f"pipeline_gaps: no pipeline slices in {path} (a run with --pp > 1 and --trace)")
    steps = collections.defaultdict(list)
    for e in acts:
        if e['args']['step'] >= skip:
            steps[e['args']['step']].append(e)
    return acts[0]['args'], steps


def key(e):
    a = e['args']
    return (a['action'], a['model chunk'], a['micro-batch'])


def main():
    path = sys.argv[1]
    skip = int(sys.argv[sys.argv.index('--skip') + 1]) if '--skip' in sys.argv else 3
    a0, steps = load(path, skip)
    p, v, m = a0['stages'], a0['virtual stages'], a0['micro-batches']
    last = p * v - 1

    def dep(e):
        a = e['args']
        k, mb = a['model chunk'], a['micro-batch']
        if a['action'] == 'F' and k > 0:
            return ('F', k - 1, mb)
        if a['action'] == 'B' and k < last:
            return ('B', k + 1, mb)
        return None

    def replay(order, dur_of):
        end, clock, busy = {}, {r: 0.0 for r in order}, {r: 0.0 for r in order}
        pos = {r: 0 for r in order}
        moved = True
        while moved:
            moved = False
            for r, x in order.items():
                while pos[r] < len(x):
                    e = x[pos[r]]
                    d = dep(e)
                    if d and d not in end:
                        break
                    t = dur_of(r, e)
                    clock[r] = max(clock[r], end[d] if d else 0.0) + t
                    busy[r] += t
                    end[key(e)] = clock[r]
                    pos[r] += 1
                    moved = True
        span = max(clock.values())
        return st.mean(1 - busy[r] / span for r in order)

    tot = collections.Counter()
    replays = collections.defaultdict(list)
    measured = []
    late_ran, late_woke = [], []
    crowd = collections.defaultdict(lambda: collections.defaultdict(list))
    cpu = collections.defaultdict(list)
    nranks = 0
    for s, es in sorted(steps.items()):
        made = {key(e): e['ts'] + e['dur'] for e in es}
        lo = min(e['ts'] for e in es)
        hi = max(e['ts'] + e['dur'] for e in es)
        order = collections.defaultdict(list)
        for e in sorted(es, key=lambda e: e['ts']):
            order[e['pid']].append(e)
        nranks = len(order)
        means = {}
        for name, keyf in (('uniform', lambda r, e: e['args']['action']),
                           ('per-chunk', lambda r, e: (e['args']['model chunk'], e['args']['action'])),
                           ('per-rank', lambda r, e: (r, e['args']['action']))):
            g = collections.defaultdict(list)
            for r, x in order.items():
                for e in x:
                    g[keyf(r, e)].append(e['dur'])
            means[name] = ({k: st.mean(d) for k, d in g.items()}, keyf)
        for name, (mn, keyf) in means.items():
            replays[name].append(replay(order, lambda r, e, mn=mn, keyf=keyf: mn[keyf(r, e)]))
        replays['actual'].append(replay(order, lambda r, e: e['dur']))
        if all('cpu ns' in e['args'] for e in es):
            replays['cpu'].append(replay(order, lambda r, e: e['args']['cpu ns'] / 1e3))
            for e in es:
                cpu[e['args']['action']].append((e['args']['cpu ns'] / 1e6, e['dur'] / 1e3))
        busy = {r: sum(e['dur'] for e in x) for r, x in order.items()}
        measured.append(st.mean(1 - busy[r] / (hi - lo) for r in order))
        for r, x in order.items():
            prev = lo
            for e in x:
                d = dep(e)
                ready = made.get(d, lo) if d else lo
                wait = max(0.0, min(e['ts'], ready) - prev)
                tot['wait'] += wait
                tot['late'] += e['ts'] - prev - wait
                (late_woke if ready > prev else late_ran).append((e['ts'] - max(prev, ready)) / 1e3)
                prev = e['ts'] + e['dur']
                t0, t1 = e['ts'], e['ts'] + e['dur']
                inside = sum(max(0.0, min(t1, f['ts'] + f['dur']) - max(t0, f['ts']))
                             for q, y in order.items() if q != r for f in y)
                crowd[e['args']['action']][min(round(1 + inside / e['dur']), nranks)].append(
                    e['dur'] / 1e3)
            tot['tail'] += hi - prev
            tot['busy'] += busy[r]
            tot['window'] += hi - lo
    n = len(steps)
    print(f"{path}: pp {p}, {m} micro-batches, {v} virtual stage(s), {a0['schedule']}; "
          f"steps {min(steps)}..{max(steps)}, {nranks} ranks")
    for k in ('busy', 'wait', 'late', 'tail'):
        print(f"  {k:5s} {100 * tot[k] / tot['window']:6.2f}% of the ranks' windows "
              f"({tot[k] / 1e3 / n / nranks:8.1f} ms per rank and step)")
    if late_ran:
        print(f"  late when the input was there first: median {st.median(late_ran):.3f} ms "
              f"(n {len(late_ran)}); after waiting for it: "
              + (f"median {st.median(late_woke):.3f} ms (n {len(late_woke)})" if late_woke else "-"))
    print(f"  bubble measured {100 * st.mean(measured):.2f}%; replayed with instant posted "
          "transfers: " + ", ".join(f"{k} {100 * st.mean(x):.2f}%" for k, x in replays.items()))
    for op, x in sorted(cpu.items()):
        print(f"  {op} mean ms: cpu {st.mean(c for c, _ in x):.2f}, wall {st.mean(w for _, w in x):.2f}")
    for op, bins in sorted(crowd.items()):
        print(f"  {op} ms by ranks inside an action at once: "
              + ", ".join(f"{b}: {st.mean(x):.1f} (n {len(x)})" for b, x in sorted(bins.items())))


if __name__ == '__main__':
    main()
