"""How long a signal dump stalls a gevent loop: register_dump_signal()'s
handler (capture only; a writer thread names and writes) against the old way,
a handler that runs the whole dump_all() itself.

The program: a monkey-patched gevent process (as Locust and gunicorn's gevent
worker are), N greenlets parked in four places (benchmarks/parked.py,
default 2,000), and a ticker greenlet that sleeps 1 ms in a loop and keeps
the longest gap between two of its ticks.  Each round sends the process one
signal of each kind (order alternating) from a greenlet, waits for the dump
to be written, and reports:

  stall   the ticker's longest gap minus its 1 ms sleep: how long the loop,
          and every request in flight, waited
  whole   from the signal to the dump's last write (the file's flush)

The first dump of the process is reported apart (cold: names not cached
yet, libpython's DWARF loaded on first use).  Target (issue 24): stall of
the in-process dump of 2,000 greenlets <= 50 ms.

Also the per-round ratio of the two stalls (the machine's load moves both alike).

Usage: python benchmarks/bench_signal_dump.py [--greenlets N] [--rounds R] [--spawn-tracking]
Prints a table; exits 0 whatever the result (a report, not a test).
"""
import gevent.monkey

gevent.monkey.patch_all()

import argparse  # noqa: E402
import io  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402

import btcore  # noqa: E402
from parked import park  # noqa: E402  (benchmarks/ is the script's directory, first on sys.path)

TICK = 0.001
OLD_SIGNAL = signal.SIGUSR2


class Sink(io.StringIO):
    """Keeps the dump; flush() (the last thing a dump does) stamps the end."""

    done = None

    def flush(self):
        self.done = time.perf_counter()


class Ticker:
    def __init__(self):
        self.longest = 0.0
        self.greenlet = gevent.spawn(self._run)

    def _run(self):
        last = time.perf_counter()
        while True:
            gevent.sleep(TICK)
            now = time.perf_counter()
            self.longest, last = max(self.longest, now - last - TICK), now


def one_dump(ticker, signum, sink):
    """(stall s, whole s, characters) of one dump delivered by signum to sink."""
    sink.seek(0)
    sink.truncate()
    sink.done = None
    gevent.sleep(0.05)          # the ticker settles
    ticker.longest = 0.0
    sent = time.perf_counter()
    gevent.spawn(os.kill, os.getpid(), signum).join()
    while sink.done is None:
        gevent.sleep(TICK)
    gevent.sleep(0.02)          # a stall right at the end is counted too
    return ticker.longest, sink.done - sent, len(sink.getvalue())


KINDS = ("capture + writer thread", "whole dump in the handler")


def setup(args):
    """The program: handlers registered at start-up (as a server's hook
    does), then the parked greenlets and the ticker."""
    if args.spawn_tracking:
        btcore.enable_spawn_tracking()
    sinks = {kind: Sink() for kind in KINDS}
    btcore.register_dump_signal(file=sinks[KINDS[0]])
    old_sink = sinks[KINDS[1]]
    signal.signal(OLD_SIGNAL, lambda signum, frame: btcore.dump_all(old_sink))   # the old handler
    greenlets, release = park(args.greenlets)
    return sinks, dict(zip(KINDS, (btcore.DEFAULT_DUMP_SIGNAL, OLD_SIGNAL))), Ticker(), release


def first_dump(args):
    """This process's first dump, of the kind args.first names (cold: no
    name cached, libpython's DWARF not loaded yet): prints its figures."""
    sinks, signals, ticker, release = setup(args)
    kind = KINDS[args.first]
    stall, whole, _ = one_dump(ticker, signals[kind], sinks[kind])
    print(f"{stall} {whole}")


def cold_runs(args):
    """{kind: [(stall, whole)]}: first dumps, each in a fresh process, kinds interleaved."""
    runs = {kind: [] for kind in KINDS}
    for r in range(args.rounds):
        for n in ((0, 1) if r % 2 == 0 else (1, 0)):
            argv = [sys.executable, __file__, "--first", str(n), "--greenlets", str(args.greenlets)]
            argv += ["--spawn-tracking"] if args.spawn_tracking else []
            out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300).stdout
            runs[KINDS[n]].append(tuple(map(float, out.split())))
    return runs


def warm_runs(args):
    """{kind: [(stall, whole)]}, one process, after an untimed dump of each kind;
    and the time of snapshot() alone there."""
    sinks, signals, ticker, release = setup(args)
    for kind in KINDS:
        one_dump(ticker, signals[kind], sinks[kind])
    t0 = time.perf_counter()
    count = len(btcore.snapshot())
    capture = time.perf_counter() - t0
    runs = {kind: [] for kind in KINDS}
    for r in range(args.rounds):
        for kind in (KINDS if r % 2 == 0 else KINDS[::-1]):
            runs[kind].append(one_dump(ticker, signals[kind], sinks[kind])[:2])
    assert btcore.unregister_dump_signal()
    ticker.greenlet.kill()
    release()
    return runs, capture, count


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--greenlets", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--spawn-tracking", action="store_true", help="enable_spawn_tracking() first")
    parser.add_argument("--first", type=int, choices=(0, 1), help=argparse.SUPPRESS)   # a cold_runs() child
    args = parser.parse_args()
    if args.first is not None:
        return first_dump(args)
    cold = cold_runs(args)
    warm, capture, count = warm_runs(args)
    print(f"signal dump of {count} greenlets ({args.greenlets} parked"
          f"{', spawn tracking on' if args.spawn_tracking else ''}), {args.rounds} rounds, medians (min-max)")
    print(f"  snapshot() alone (warm): {capture * 1e3:.1f} ms")
    print(f"  {'':36}{'loop stalled (ms)':>22}{'whole dump (ms)':>22}")
    for title, runs in (("first dump of a process", cold), ("later dumps", warm)):
        for kind in KINDS:
            values = runs[kind]
            print(f"  {title + ', ' + kind.split()[0] + (' (old)' if kind == KINDS[1] else ''):36}"
                  f"{spread([v[0] for v in values]):>22}{spread([v[1] for v in values]):>22}")
    for title, runs in (("first dump", cold), ("later dumps", warm)):
        ratio = [new[0] / old[0] for new, old in zip(runs[KINDS[0]], runs[KINDS[1]])]
        print(f"  stall, writer thread / old, {title}: {statistics.median(ratio):.2f} "
              f"({min(ratio):.2f}-{max(ratio):.2f}), per round")
    stall = max(statistics.median(v[0] for v in runs[KINDS[0]]) for runs in (cold, warm))
    print(f"  target: stall <= 50 ms with 2,000 greenlets: {'met' if stall <= 0.05 else 'NOT met'} "
          f"(worst median {stall * 1e3:.1f} ms)")


def spread(values):
    ms = [v * 1e3 for v in values]
    return f"{statistics.median(ms):.1f} ({min(ms):.1f}-{max(ms):.1f})"


if __name__ == "__main__":
    main()
