"""Capture cost: btcore against its peers, like for like.

At the bottom of a 30-deep Python recursion, every method timed in
interleaved rounds (benchmarks/timing.py); each ratio is the median of the
per-round ratios, with their min-max.

Like-for-like rows (the targets):
  Python-only raw capture   collect(native=False)  vs a pure-Python loop over
                            the frames collecting (f_code, f_lasti)
  native-only raw capture   btcore's btc_backtrace() vs libunwind's
                            unw_backtrace() and glibc's backtrace(), all three
                            called through cffi with the same wrapper and GIL
                            handling; the cffi call itself (a no-op) is timed
                            too, and the ratios are also given without it
Targets:
  Python-only: collect(native=False) >= 3x faster than the Python loop
  native-only: btcore <= 2.0x libunwind;  >= 5x faster than glibc
  first collect() in a fresh process <= 50 ms

For information (not like for like, and named so): the merged collect()
against libunwind's native-only walk (it also reads the Python frames), and
against traceback.extract_stack (which also resolves names and reads source
lines: compare it with a resolved btcore capture, benchmarks/bench_resolve.py).

Runs against the installed btcore (pip install .), from any directory.
Usage: python benchmarks/bench_capture.py [--rounds N] [--depth D] [--fresh N]
Prints a table; exits 0 whatever the result (a report, not a test).
"""
import argparse
import statistics
import subprocess
import sys
import traceback

import btcore
from btcore._native import ffi as btc_ffi, lib as btc_lib

import peers
from timing import interleaved, ratio, ratio_minus

CAPACITY = 256


def frame_loop():
    f = sys._getframe()
    out = []
    while f is not None:
        out.append((f.f_code, f.f_lasti))
        f = f.f_back
    return out


def at_depth(depth, fn):
    """Call fn() at the bottom of a `depth`-deep Python recursion."""
    if depth <= 0:
        return fn()
    return at_depth(depth - 1, fn)


def first_collect_ms(n):
    code = ("import time, btcore; t = time.perf_counter(); btcore.collect(); "
            "print(time.perf_counter() - t)")
    vals = []
    for _ in range(n):
        # -P: a source checkout in the current directory must not shadow the
        # installed package.
        out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError("fresh-process collect failed:\n" + out.stderr)
        vals.append(float(out.stdout.strip().splitlines()[-1]) * 1e3)
    return vals


def in_libc(addr):
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return len(parts) > 5 and "/libc.so" in parts[5]
    return False


def methods(lib):
    collect = btcore.collect
    btc_backtrace, buf = btc_lib.btc_backtrace, btc_ffi.new("uintptr_t[]", CAPACITY)
    unw_bt, glibc_bt, noop = lib.unw_bt, lib.glibc_bt, lib.noop
    extract = traceback.extract_stack
    return {
        # name: (callable, frames it captures)
        "collect(native=False)": (lambda: collect(native=False, capacity=CAPACITY),
                                  lambda: len(collect(native=False, capacity=CAPACITY))),
        "Python loop (f_code, f_lasti)": (frame_loop, lambda: len(frame_loop())),
        "btcore btc_backtrace (cffi)": (lambda: btc_backtrace(buf, CAPACITY),
                                        lambda: btc_backtrace(buf, CAPACITY)),
        "libunwind unw_backtrace (cffi)": (lambda: unw_bt(CAPACITY), lambda: unw_bt(CAPACITY)),
        "glibc backtrace (cffi)": (lambda: glibc_bt(CAPACITY), lambda: glibc_bt(CAPACITY)),
        "cffi no-op call": (noop, lambda: 0),
        "collect() merged": (lambda: collect(capacity=CAPACITY), lambda: len(collect(capacity=CAPACITY))),
        "collect(python=False)": (lambda: collect(python=False, capacity=CAPACITY),
                                  lambda: len(collect(python=False, capacity=CAPACITY))),
        "traceback.extract_stack(limit=64)": (lambda: extract(limit=64), lambda: len(extract(limit=64))),
    }


def report(runs, counts, fresh, args):
    print(f"Capture at the bottom of a {args.depth}-deep Python recursion, {args.rounds} interleaved rounds "
          f"(Python {sys.version.split()[0]})")
    print()
    print(f"{'method':36} {'ns/call median':>15} {'(min-max)':>17} {'frames':>7}")
    print("-" * 78)
    for name, values in runs.items():
        print(f"{name:36} {statistics.median(values):15.0f} "
              f"{f'({min(values):.0f}-{max(values):.0f})':>17} {counts[name]:7d}")
    print()
    r = runs
    noop = r["cffi no-op call"]
    btc, unw, glibc = r["btcore btc_backtrace (cffi)"], r["libunwind unw_backtrace (cffi)"], r["glibc backtrace (cffi)"]
    rows = [
        ("like for like: Python-only raw capture", "", None),
        ("Python loop / collect(native=False)", ratio(r["Python loop (f_code, f_lasti)"], r["collect(native=False)"]),
         (">= 3x faster", lambda v: v >= 3)),
        ("like for like: native-only raw capture, same cffi call", "", None),
        ("btcore / libunwind", ratio(btc, unw), ("<= 2.0x", lambda v: v <= 2.0)),
        ("btcore / libunwind, cffi call subtracted", ratio_minus(btc, unw, noop), None),
        ("glibc / btcore", ratio(glibc, btc), (">= 5x faster", lambda v: v >= 5)),
        ("glibc / btcore, cffi call subtracted", ratio_minus(glibc, btc, noop), None),
        ("not like for like (information)", "", None),
        ("merged collect() / libunwind native-only", ratio(r["collect() merged"], unw), None),
        ("extract_stack (names, source lines) / raw collect()",
         ratio(r["traceback.extract_stack(limit=64)"], r["collect() merged"]), None),
    ]
    print(f"{'ratio (median of per-round ratios, min-max)':56} {'measured':>22}  {'target':>13}  result")
    print("-" * 104)
    for name, value, target in rows:
        if value == "":
            print(name + ":")
            continue
        goal, ok = target or ("", None)
        verdict = "" if ok is None else ("PASS" if ok(value.median) else "MISS")
        print(f"  {name:54} {value.text():>22}  {goal:>13}  {verdict}")
    if fresh:
        ms = statistics.median(fresh)
        print(f"  {'first collect() in a fresh process, ms':54} {f'{ms:.1f} ({min(fresh):.1f}-{max(fresh):.1f})':>22}"
              f"  {'<= 50 ms':>13}  {'PASS' if ms <= 50 else 'MISS'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", "--repeat", type=int, default=15)
    ap.add_argument("--depth", type=int, default=30)
    ap.add_argument("--fresh", type=int, default=5, help="fresh processes for the first-collect time")
    args = ap.parse_args()

    ffi, lib = peers.load()
    if not in_libc(lib.glibc_backtrace_addr()):
        print("WARNING: backtrace() does not resolve into libc.so: the glibc peer is not glibc's")
    got = {}

    def measure():
        table = methods(lib)
        got["counts"] = {name: count() for name, (_, count) in table.items()}
        got["runs"] = interleaved({name: fn for name, (fn, _) in table.items()}, args.rounds)

    at_depth(args.depth, measure)
    fresh = first_collect_ms(args.fresh) if args.fresh > 0 else []
    report(got["runs"], got["counts"], fresh, args)


if __name__ == "__main__":
    main()
