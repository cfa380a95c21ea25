"""Capture cost of a suspended greenlet, like for like.

g is parked at the bottom of a D-deep (default 30) Python recursion; every
method is timed in interleaved rounds (benchmarks/timing.py), from inside
another greenlet h at the same depth, and each ratio is the median of the
per-round ratios, with their min-max.

Like-for-like rows (the targets):
  Python-only raw capture of g:  collect(g, native=False) vs a pure-Python
                                 loop over g.gr_frame collecting (f_code, f_lasti)
                                 target: >= 3x faster
  merged capture, g vs the current stack at the same depth:
                                 collect(g) vs collect() in h
                                 target: <= 1.5x the time
For information (not like for like): traceback.extract_stack(g.gr_frame),
which also resolves names and reads source lines.

Runs against the installed btcore (pip install .), from any directory.
Usage: python benchmarks/bench_greenlet.py [--rounds N] [--depth D]
Prints a table; exits 0 whatever the result (a report, not a test).
"""
import argparse
import statistics
import sys
import traceback

import greenlet

import btcore
from timing import interleaved, ratio


def frame_loop(frame):
    out = []
    while frame is not None:
        out.append((frame.f_code, frame.f_lasti))
        frame = frame.f_back
    return out


def at_depth(depth, fn):
    """fn() at the bottom of a `depth`-deep Python recursion."""
    if depth <= 0:
        return fn()
    return at_depth(depth - 1, fn)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", "--repeat", type=int, default=15)
    ap.add_argument("--depth", type=int, default=30)
    args = ap.parse_args()
    depth = args.depth

    parent = greenlet.getcurrent()
    g = greenlet.greenlet(lambda: at_depth(depth, parent.switch))
    g.switch()
    assert g.gr_frame is not None

    bt = btcore.collect(g)
    assert not bt.truncated, "default capacity too small for this depth"
    n_py = sum(1 for f in bt.frames() if f.kind == "python")
    assert len(traceback.extract_stack(g.gr_frame)) == n_py == len(frame_loop(g.gr_frame))
    out = {}

    def measure():
        b = btcore.collect()
        out["current"] = (len(b), sum(1 for f in b.frames() if f.kind == "python"))
        out["runs"] = interleaved({
            "collect(g)": lambda: btcore.collect(g),
            # called the way collect(g) is, through a lambda (a bare btcore.collect saved one Python
            # call and frame: the ratio read 1.42 for what is 1.12 with the calls alike)
            "collect() current stack, same depth": lambda: btcore.collect(),
            "collect(g, native=False)": lambda: btcore.collect(g, native=False),
            "Python loop over g.gr_frame": lambda: frame_loop(g.gr_frame),
            "collect(g, python=False)": lambda: btcore.collect(g, python=False),
            "traceback.extract_stack(g.gr_frame)": lambda: traceback.extract_stack(g.gr_frame),
        }, args.rounds)

    h = greenlet.greenlet(lambda: at_depth(depth, measure))
    h.switch()
    g.switch()   # let g finish
    runs = out["runs"]

    print(f"Python {sys.version.split()[0]}, greenlet {greenlet.__version__}, depth {depth}, "
          f"{args.rounds} interleaved rounds")
    print(f"collect(g): {len(bt)} frames ({n_py} Python); current stack: {out['current'][0]} frames "
          f"({out['current'][1]} Python)")
    print()
    w = max(map(len, runs))
    print(f"{'method':<{w}}  {'ns/call median':>15}  {'(min-max)':>17}")
    print(f"{'-' * w}  {'-' * 15}  {'-' * 17}")
    for name, values in runs.items():
        print(f"{name:<{w}}  {statistics.median(values):>15,.0f}  "
              f"{f'({min(values):,.0f}-{max(values):,.0f})':>17}")
    print()
    rows = [
        ("like for like: Python loop / collect(g, native=False)",
         ratio(runs["Python loop over g.gr_frame"], runs["collect(g, native=False)"]),
         ">= 3x faster", lambda v: v >= 3),
        ("like for like: collect(g) / collect() current stack",
         ratio(runs["collect(g)"], runs["collect() current stack, same depth"]), "<= 1.5x", lambda v: v <= 1.5),
        ("information: extract_stack(g.gr_frame) / collect(g)",
         ratio(runs["traceback.extract_stack(g.gr_frame)"], runs["collect(g)"]), "", None),
    ]
    w2 = max(len(r[0]) for r in rows)
    print(f"{'ratio (median of per-round ratios, min-max)':<{w2}}  {'measured':>22}  {'target':>13}  result")
    print(f"{'-' * w2}  {'-' * 22}  {'-' * 13}  ------")
    for name, value, goal, ok in rows:
        verdict = "" if ok is None else ("PASS" if ok(value.median) else "MISS")
        print(f"{name:<{w2}}  {value.text():>22}  {goal:>13}  {verdict}")


if __name__ == "__main__":
    main()
