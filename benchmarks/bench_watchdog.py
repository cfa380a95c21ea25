"""What the watchdog costs, like for like (benchmarks/timing.py: interleaved
rounds, each ratio the median of the per-round ratios, min-max in brackets).

1. Switch detection on a program switching ~100 000 times per second: two
   greenlets ping-pong, each doing ~10 us of Python work between switches.
   With the watchdog running (watching the thread) and without it, in
   instructions (callgrind, a whole child process, every thread counted: a
   busy machine does not disturb it) and in wall-clock time (in-process
   runs, interleaved, the watchdog started and stopped between them).  Target: <= 1.02.  For comparison, what a switch tracer
   costs on the same run: gevent's own monitor tracer
   (gevent._tracer.GreenletTracer, Cython), when gevent is installed.
2. Capture of a mixed stack (D levels of Python recursion through C:
   map() and list(), so Python and native frames alternate) inside a
   signal handler's code path vs collect() of the same stack:
   - the handler's capture alone (btc_signal_capture from getcontext()'s
     registers, no signal): target <= 2x collect();
   - the whole round trip a requester pays (pthread_kill to the thread,
     the kernel's delivery, the handler, the answer), for information.
3. Repeated reports of one stuck call (threshold 0.1 s, stuck 1 s: reports
   at 0.1, 0.2, 0.4, 0.8 s), a greenlet D Python levels deep (a gunicorn +
   Flask handler is ~30-40): the lines and bytes of the first report and
   of each later one, stuck in a sleep (the same stack) and in a Python
   loop (its inner frames change).  Before, each later one was as long as
   the first.

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
    dog = btcore.start_watchdog(threshold=60)   # its thread reads the switch count 10 times a second
def main():
    for _ in range(switches // 2):
        for _ in range(spin):
            pass
        g.switch()
main()
"""


def child(mode, switches, spin):
    return [sys.executable, "-P", "-c", PING_PONG_CHILD, mode, str(switches), str(spin)]


def switch_overhead(rounds):
    spin = calibrated_work()
    print(f"1. switch detection, ping-pong at ~100k switches/s ({spin} loop turns of work between switches)")
    switch_overhead_in_instructions(spin)
    switches = 20_000
    runs = wall_with_and_without(ping_pong(switches, spin), rounds)
    print(f"   wall clock, {switches} switches with the watchdog running / without: "
          f"{ratio(runs['btcore'], runs['none']).text(3)}   (target <= 1.02; "
          f"{min(runs['none']) / 1e6:.0f} ms without)")
    gevent_peer(rounds, spin)


def wall_with_and_without(run, rounds):
    """{mode: [ns, one a round]}: run timed in this process with the watchdog
    running (watching this thread) and without it, interleaved; the
    watchdog is started and stopped outside the timed part (its start-up,
    the tables it builds once, is not what a switch costs)."""
    runs = {"none": [], "btcore": []}
    for r in range(rounds):
        for mode in ("none", "btcore") if r % 2 == 0 else ("btcore", "none"):
            dog = btcore.start_watchdog(threshold=60) if mode == "btcore" else None
            t0 = time.perf_counter_ns()
            run()
            runs[mode].append(time.perf_counter_ns() - t0)
            if dog:
                dog.stop()
    return runs


def gevent_peer(rounds, spin):
    """What a switch tracer costs (gevent's monitor detects switches with one), in-process, for comparison."""
    try:
        from gevent._tracer import GreenletTracer
    except ImportError:
        return
    tracer = GreenletTracer()   # installs itself: take it off, time it on its own
    greenlet.settrace(None)
    runs = interleaved({"none": with_tracer(None, ping_pong(1000, spin)),
                        "gevent": with_tracer(tracer, ping_pong(1000, spin))}, rounds)
    print(f"   peer: gevent's GreenletTracer / without (in-process): {ratio(runs['gevent'], runs['none']).text(3)}")


def instructions(mode, switches, spin):
    """Instructions a whole child run executes (every thread), counted by callgrind."""
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *child(mode, switches, spin)],
                          capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONHASHSEED="0"))
    return int(re.search(r"Collected : (\d+)", done.stderr).group(1))


def switch_overhead_in_instructions(spin):
    """The comparison in instructions (callgrind): stable on a busy machine,
    where wall-clock ratios spread widely.  Two run lengths, so that
    start-up (importing btcore, starting the watchdog) cancels out."""
    if not shutil.which("valgrind"):
        print("   (valgrind not found: no instruction counts)")
        return
    short, long = 2000, 12000
    per = {}
    for mode in ("none", "btcore"):
        per[mode] = (instructions(mode, long, spin) - instructions(mode, short, spin)) / (long - short)
    print(f"   instructions per switch + its work (callgrind): {per['none']:.0f} without, {per['btcore']:.0f} with:"
          f" {per['btcore'] / per['none']:.4f} (+{per['btcore'] - per['none']:.0f} a switch)   (target <= 1.02)")


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


STUCK_CHILD = r"""
import sys, time, greenlet, btcore
depth, mode = int(sys.argv[1]), sys.argv[2]
def spin():
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        pass
def level(n):
    return level(n - 1) if n else time.sleep(1.0) if mode == "sleep" else spin()
with btcore.start_watchdog(threshold=0.1, file=sys.stdout):
    greenlet.greenlet(level).switch(depth)
"""


def stuck_reports(depth, mode):
    """The stuck reports of one episode, each a list of its lines."""
    out = subprocess.run([sys.executable, "-P", "-c", STUCK_CHILD, str(depth), mode], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    reports = []
    for line in out.splitlines():
        if line.startswith("btcore watchdog: ") and "has not switched" in line:
            reports.append([line])
        elif line.startswith("  ") and reports:
            reports[-1].append(line)
    return reports


def repeated_reports(depth):
    print(f"3. repeated reports of one stuck call, {depth} Python levels deep: lines / bytes, first -> later ones")
    for mode in ("sleep", "loop"):
        sizes = [f"{len(r)} / {sum(len(line) + 1 for line in r)}" for r in stuck_reports(depth, mode)]
        print(f"   {mode:>5}: {sizes[0]} -> {', '.join(sizes[1:])}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--depth", type=int, default=10)
    args = ap.parse_args()
    print(f"Python {sys.version.split()[0]}, greenlet {greenlet.__version__}")
    switch_overhead(args.rounds)
    capture_cost(args.rounds, args.depth)
    repeated_reports(30)


if __name__ == "__main__":
    main()
