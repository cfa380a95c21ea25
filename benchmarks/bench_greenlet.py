"""Capture cost of a suspended greenlet: btcore.collect(g) against its peers.

g is parked at the bottom of a D-deep (default 30) Python recursion.  Time per
call (median of several repeats of timeit-style loops):

  btcore.collect(g)                          merged Python + native, suspended greenlet
  btcore.collect(g, python=False)            native only           (for information)
  btcore.collect(g, native=False)            Python only           (for information)
  traceback.extract_stack(g.gr_frame)        Python only, the stdlib way
  btcore.collect()                           the current stack, inside a greenlet
                                             at the same depth

Targets:
  collect(g) >= 30x  faster than traceback.extract_stack(g.gr_frame)
  collect(g) <= 1.5x collect() of the current stack at the same depth

Usage: python benchmarks/bench_greenlet.py [--repeat N] [--depth D]
Prints a table; exits 0 whatever the result (this is a report, not a test).
"""
import argparse
import os
import statistics
import sys
import time
import traceback


import greenlet  # noqa: E402

import btcore  # noqa: E402


def loops_for(fn, target_s=0.02):
    """Size a loop like timeit: one run of it takes >= target_s."""
    loops = 1
    while True:
        t0 = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        dt = time.perf_counter_ns() - t0
        if dt >= target_s * 1e9 or loops >= 1 << 22:
            return loops
        loops *= 2 if dt > target_s * 1e8 else 10


def one_run(fn, loops):
    t0 = time.perf_counter_ns()
    for _ in range(loops):
        fn()
    return (time.perf_counter_ns() - t0) / loops


def interleaved(fns, repeat):
    """{name: median ns per call}: the runs of all fns are interleaved, round
    after round, so that a change of machine load hits them alike."""
    loops = {name: loops_for(fn) for name, fn in fns.items()}
    runs = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            runs[name].append(one_run(fn, loops[name]))
    return {name: statistics.median(r) for name, r in runs.items()}


def at_depth(depth, fn):
    """fn() at the bottom of a `depth`-deep Python recursion."""
    if depth <= 0:
        return fn()
    return at_depth(depth - 1, fn)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--depth", type=int, default=30)
    args = ap.parse_args()
    depth, repeat = args.depth, args.repeat

    parent = greenlet.getcurrent()
    g = greenlet.greenlet(lambda: at_depth(depth, parent.switch))
    g.switch()
    assert g and g.gr_frame is not None

    bt = btcore.collect(g)
    assert not bt.truncated, "default capacity too small for this depth"
    n_py = sum(1 for f in bt.frames() if f.kind == "python")
    n_all = len(bt)
    n_tb = len(traceback.extract_stack(g.gr_frame))
    assert n_tb == n_py, (n_tb, n_py)

    # The current stack at the same depth: inside another greenlet h, so
    # that its stack has the same shape as g's.  h runs the measurements:
    # every method is timed round after round from the same place.
    out = {}

    def measure():
        b = btcore.collect()
        out["frames"] = len(b)
        out["py"] = sum(1 for f in b.frames() if f.kind == "python")
        out["rows"] = interleaved({
            "collect(g)": lambda: btcore.collect(g),
            "collect(g, python=False)": lambda: btcore.collect(g, python=False),
            "collect(g, native=False)": lambda: btcore.collect(g, native=False),
            "traceback.extract_stack(g.gr_frame)": lambda: traceback.extract_stack(g.gr_frame),
            "collect() current stack, same depth": btcore.collect,
        }, repeat)

    h = greenlet.greenlet(lambda: at_depth(depth, measure))
    h.switch()
    g.switch()   # let g finish
    rows, cur = out["rows"], {"frames": out["frames"], "py": out["py"]}
    cur["ns"] = rows["collect() current stack, same depth"]

    t_g = rows["collect(g)"]
    tb_ratio = rows["traceback.extract_stack(g.gr_frame)"] / t_g
    cur_ratio = t_g / cur["ns"]

    print(f"Python {sys.version.split()[0]}, greenlet {greenlet.__version__}, depth {depth}, "
          f"median of {repeat}")
    print(f"collect(g): {n_all} frames ({n_py} Python); current stack: {cur['frames']} frames "
          f"({cur['py']} Python)")
    print()
    w = max(map(len, rows))
    print(f"{'method':<{w}}  {'ns/call':>10}")
    print(f"{'-' * w}  {'-' * 10}")
    for name, ns in rows.items():
        print(f"{name:<{w}}  {ns:>10,.0f}")
    print()
    targets = [
        ("collect(g) vs traceback.extract_stack(g.gr_frame)", f"{tb_ratio:.1f}x faster",
         ">= 30x faster", tb_ratio >= 30),
        ("collect(g) vs collect() current stack", f"{cur_ratio:.2f}x the time",
         "<= 1.5x", cur_ratio <= 1.5),
    ]
    w2 = max(len(t[0]) for t in targets)
    print(f"{'target':<{w2}}  {'measured':>16}  {'goal':>14}  result")
    print(f"{'-' * w2}  {'-' * 16}  {'-' * 14}  ------")
    for name, got, goal, ok in targets:
        print(f"{name:<{w2}}  {got:>16}  {goal:>14}  {'PASS' if ok else 'MISS'}")


if __name__ == "__main__":
    main()
