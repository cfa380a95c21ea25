"""Capture cost: btcore.collect() against its peers, and the targets.

At the bottom of a 30-deep Python recursion, time per call (median of several
repeats of timeit-style loops):

  btcore.collect()                     merged Python + native
  btcore.collect(python=False)         native only
  libunwind unw_backtrace()            native only, from C via cffi (peer)
  glibc backtrace()                    native only, from C via cffi (peer)
  traceback.extract_stack(limit=64)    Python only
  sys._getframe loop (f_code, f_lasti) Python only

and the first collect() in a fresh process (after import).  Targets:

  collect()  <= 2.0x  libunwind native-only capture
  collect()  >= 50x   faster than traceback.extract_stack
  collect()  >= 5x    faster than glibc backtrace()
  first collect() in a fresh process <= 50 ms

Usage: python benchmarks/bench_capture.py [--repeat N] [--depth D]
Prints a table; exits 0 whatever the result (this is a report, not a test).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)   # peers.py; btcore itself must be installed (pip install .)

import peers  # noqa: E402


def timeit_ns(fn, repeat, target_s=0.05):
    """Median ns per call of fn() over `repeat` runs of an auto-sized loop."""
    loops = 1
    while True:  # size the loop like timeit: each run takes >= target_s
        t0 = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        dt = time.perf_counter_ns() - t0
        if dt >= target_s * 1e9 or loops >= 1 << 22:
            break
        loops *= 2 if dt > target_s * 1e8 else 10
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        runs.append((time.perf_counter_ns() - t0) / loops)
    return statistics.median(runs), loops


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


def first_collect_ms(n=5):
    code = ("import time, btcore; t = time.perf_counter(); btcore.collect(); "
            "print(time.perf_counter() - t)")
    vals = []
    for _ in range(n):
        # -P: a source checkout in the current directory must not shadow the
        # installed package.
        out = subprocess.run([sys.executable, "-P", "-c", code],
                             capture_output=True, text=True, timeout=120)
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--depth", type=int, default=30)
    ap.add_argument("--fresh", type=int, default=5, help="fresh processes for the first-collect time")
    args = ap.parse_args()

    import btcore

    ffi, lib = peers.load()
    if not in_libc(lib.glibc_backtrace_addr()):
        print("WARNING: backtrace() does not resolve into libc.so: the glibc peer is not glibc's")

    rows = {}

    def measure():
        # frame counts first (what each method actually captured here)
        counts = {
            "collect()": len(btcore.collect()),
            "collect(python=False)": len(btcore.collect(python=False, capacity=256)),
            "libunwind unw_backtrace": lib.unw_bt(256),
            "glibc backtrace()": lib.glibc_bt(256),
            "traceback.extract_stack(64)": len(traceback.extract_stack(limit=64)),
            "sys._getframe loop": len(frame_loop()),
            "cffi no-op call": 0,
        }
        collect = btcore.collect
        unw_bt, glibc_bt, noop = lib.unw_bt, lib.glibc_bt, lib.noop
        extract = traceback.extract_stack
        fns = {
            "collect()": lambda: collect(),
            "collect(python=False)": lambda: collect(python=False, capacity=256),
            "libunwind unw_backtrace": lambda: unw_bt(256),
            "glibc backtrace()": lambda: glibc_bt(256),
            "traceback.extract_stack(64)": lambda: extract(limit=64),
            "sys._getframe loop": frame_loop,
            "cffi no-op call": lambda: noop(),
        }
        for name, fn in fns.items():
            ns, loops = timeit_ns(fn, args.repeat)
            rows[name] = (ns, loops, counts[name])

    at_depth(args.depth, measure)
    fresh = first_collect_ms(args.fresh) if args.fresh > 0 else []

    print(f"Capture at the bottom of a {args.depth}-deep Python recursion "
          f"(median of {args.repeat} runs; Python {sys.version.split()[0]})")
    print()
    print(f"{'method':32} {'ns/call':>10} {'frames':>7} {'loops':>8}")
    print("-" * 60)
    for name, (ns, loops, n) in rows.items():
        print(f"{name:32} {ns:10.0f} {n:7d} {loops:8d}")
    print()

    c = rows["collect()"][0]
    targets = [
        ("collect() <= 2.0x libunwind native-only",
         c / rows["libunwind unw_backtrace"][0], "x libunwind", lambda r: r <= 2.0),
        ("collect() >= 50x faster than extract_stack",
         rows["traceback.extract_stack(64)"][0] / c, "x faster", lambda r: r >= 50),
        ("collect() >= 5x faster than glibc backtrace()",
         rows["glibc backtrace()"][0] / c, "x faster", lambda r: r >= 5),
    ]
    if fresh:
        targets.append(("first collect() in fresh process <= 50 ms",
                        statistics.median(fresh), f"ms (median of {len(fresh)}; max {max(fresh):.1f})",
                        lambda r: r <= 50))
    print(f"{'target':48} {'measured':>10}  {'':30} result")
    print("-" * 100)
    for name, val, unit, ok in targets:
        print(f"{name:48} {val:10.2f}  {unit:30} {'PASS' if ok(val) else 'MISS'}")
    print()
    print(f"collect(python=False) vs libunwind: "
          f"{rows['collect(python=False)'][0] / rows['libunwind unw_backtrace'][0]:.2f}x; "
          f"cffi no-op call: {rows['cffi no-op call'][0]:.0f} ns")


if __name__ == "__main__":
    main()
