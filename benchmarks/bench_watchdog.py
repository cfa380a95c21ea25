"""What the watchdog costs, like for like (benchmarks/timing.py: interleaved
rounds, each ratio the median of the per-round ratios, min-max in brackets).

1. Switch detection on a program switching ~100 000 times per second: two
   greenlets ping-pong, each doing ~10 us of Python work between switches.
   The same run with the watchdog's C switch counter installed (the
   watchdog thread running, as in production) and with no tracer at all.
   Peer: gevent's own monitor tracer (gevent._tracer.GreenletTracer,
   Cython) on the same run, when gevent is installed.  Target: <= 1.02.
   Also the bare switch cost (no work between switches), ns per switch,
   and the ratio in instructions (callgrind, if valgrind is installed),
   which a busy machine does not disturb.
2. Capture of a mixed stack (D levels of Python recursion through C:
   map() and list(), so Python and native frames alternate) inside a
   signal handler's code path vs collect() of the same stack:
   - the handler's capture alone (btc_signal_capture from getcontext()'s
     registers, no signal): target <= 2x collect();
   - the whole round trip a requester pays (pthread_kill to the thread,
     the kernel's delivery, the handler, the answer), for information.

Runs against the installed btcore (pip install .), from any directory.
Usage: python benchmarks/bench_watchdog.py [--rounds N] [--depth D]
Prints a table; exits 0 whatever the result (a report, not a test).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import greenlet

import btcore
from btcore._native import ffi, lib
from timing import interleaved, ratio

WORK = 10_000   # ns of work between two switches: 100 000 switches/s


def calibrated_work():
    """A Python loop of about WORK ns."""
    n = 1000
    while True:
        t0 = time.perf_counter_ns()
        for _ in range(20):
            for _ in range(n):
                pass
        per = (time.perf_counter_ns() - t0) / 20
        if per > 0:
            n = max(1, int(n * WORK / per))
            return n


def ping_pong(switches, spin):
    """Run `switches` switches between two greenlets, spin iterations of work each."""
    def other():
        main = greenlet.getcurrent().parent
        while True:
            for _ in range(spin):
                pass
            main.switch()

    g = greenlet.greenlet(other)

    def run():
        for _ in range(switches // 2):
            for _ in range(spin):
                pass
            g.switch()
    return run


def with_tracer(tracer, run):
    def timed():
        previous = greenlet.settrace(tracer)
        try:
            run()
        finally:
            greenlet.settrace(previous)
    return timed


def switch_overhead(rounds):
    spin = calibrated_work()
    dog = btcore.start_watchdog(threshold=60)
    ours = greenlet.gettrace()
    greenlet.settrace(None)
    fns_work = {"none": with_tracer(None, ping_pong(1000, spin)),
                "btcore": with_tracer(ours, ping_pong(1000, spin))}
    fns_bare = {"none": with_tracer(None, ping_pong(1000, 0)),
                "btcore": with_tracer(ours, ping_pong(1000, 0))}
    try:
        from gevent._tracer import GreenletTracer
        gevent_tracer = GreenletTracer()   # installs itself: take it off, time it like ours
        greenlet.settrace(None)
        fns_work["gevent"] = with_tracer(gevent_tracer, ping_pong(1000, spin))
        fns_bare["gevent"] = with_tracer(gevent_tracer, ping_pong(1000, 0))
    except ImportError:
        pass
    work = interleaved(fns_work, rounds)
    bare = interleaved(fns_bare, rounds)
    greenlet.settrace(ours)
    dog.stop()
    rate = 1e9 / (min(work["none"]) / 1000)
    print(f"1. switch detection, ping-pong at ~{rate / 1000:.0f}k switches/s ({spin} loop turns of work each)")
    print(f"   with btcore's switch counter / without:  {ratio(work['btcore'], work['none']).text(3)}"
          "   (target <= 1.02)")
    if "gevent" in work:
        print(f"   with gevent's GreenletTracer / without:  {ratio(work['gevent'], work['none']).text(3)}")
    for name, runs in bare.items():
        print(f"   bare switch, {name:>6}: {min(runs) / 1000:7.0f} ns per switch")
    # The same overhead from the quieter measurement: what the tracer adds to
    # one switch, over what one switch plus its work costs.
    added = ratio(bare["btcore"], bare["none"])
    per_switch = min(bare["none"]) / 1000
    print(f"   btcore's added cost per switch / (switch + work): "
          f"{(added.median - 1) * per_switch / (min(work['none']) / 1000):.2%} "
          f"({(added.median - 1) * per_switch:.0f} ns per switch)")
    switch_overhead_in_instructions(spin)


PING_PONG_CHILD = r"""
import sys, greenlet, btcore
mode, switches, spin = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def other():
    main = greenlet.getcurrent().parent
    while True:
        for _ in range(spin):
            pass
        main.switch()
g = greenlet.greenlet(other)
g.switch()
if mode == "btcore":
    dog = btcore.start_watchdog(threshold=60)
def main():
    for _ in range(switches // 2):
        for _ in range(spin):
            pass
        g.switch()
main()
"""


def instructions(mode, switches, spin):
    """Instructions a whole child run executes, counted by callgrind."""
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                           "-P", "-c", PING_PONG_CHILD, mode, str(switches), str(spin)],
                          capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONHASHSEED="0"))
    return int(re.search(r"Collected : (\d+)", done.stderr).group(1))


def switch_overhead_in_instructions(spin):
    """The same comparison in instructions (callgrind): stable on a busy
    machine, where the wall-clock ratios above spread widely.  Two run
    lengths, so that start-up cancels out."""
    if not shutil.which("valgrind"):
        print("   (valgrind not found: no instruction counts)")
        return
    short, long = 2000, 12000
    per = {}
    for mode in ("none", "btcore"):
        per[mode] = (instructions(mode, long, spin) - instructions(mode, short, spin)) / (long - short)
    print(f"   instructions per switch + its work (callgrind): {per['none']:.0f} without, {per['btcore']:.0f} with:"
          f" {per['btcore'] / per['none']:.3f}   (target <= 1.02)")


def mixed_stack(depth, at_bottom):
    """at_bottom() called D levels deep, each level Python -> map() -> list() -> Python."""
    def level(n):
        return list(map(level, [n - 1]))[0] if n else at_bottom()
    return level(depth)


def capture_cost(rounds, depth):
    lib.btc_thread_register()
    sample = ffi.new("btc_sigsample *")
    ident = threading.get_ident()

    def measure():
        fns = {"collect": lambda: btcore.collect(capacity=128),
               "handler": lambda: lib.btc_test_capture_here(sample),
               "round trip": lambda: lib.btc_signal_sample(ident, 1000, sample)}
        return interleaved(fns, rounds), len(btcore.collect(capacity=128)), \
            (lib.btc_test_capture_here(sample), sample.n, sample.partial)[1:]

    runs, n_collect, (n_sample, partial) = mixed_stack(depth, measure)
    print(f"2. capture of a {depth}-level mixed stack (collect(): {n_collect} records; "
          f"signal sample: {n_sample} records, partial={partial})")
    print(f"   handler's capture / collect():           {ratio(runs['handler'], runs['collect']).text()}"
          "   (target <= 2)")
    print(f"   signal round trip / collect():           {ratio(runs['round trip'], runs['collect']).text()}")
    for name, values in runs.items():
        print(f"   {name:>10}: {min(values):8.0f} ns")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--depth", type=int, default=10)
    args = ap.parse_args()
    print(f"Python {sys.version.split()[0]}, greenlet {greenlet.__version__}")
    switch_overhead(args.rounds)
    capture_cost(args.rounds, args.depth)


if __name__ == "__main__":
    main()
