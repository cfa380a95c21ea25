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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--greenlets", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--spawn-tracking", action="store_true", help="enable_spawn_tracking() first")
    args = parser.parse_args()
    if args.spawn_tracking:
        btcore.enable_spawn_tracking()
    sinks = {"capture + writer thread": Sink(), "whole dump in the handler": Sink()}
    signals = {"capture + writer thread": btcore.DEFAULT_DUMP_SIGNAL, "whole dump in the handler": OLD_SIGNAL}
    btcore.register_dump_signal(file=sinks["capture + writer thread"])   # at start-up, as a server's hook does
    greenlets, release = park(args.greenlets)
    ticker = Ticker()
    old_sink = sinks["whole dump in the handler"]
    signal.signal(OLD_SIGNAL, lambda signum, frame: btcore.dump_all(old_sink))   # the old handler

    t0 = time.perf_counter()
    infos = btcore.snapshot()
    capture = time.perf_counter() - t0
    cold = one_dump(ticker, btcore.DEFAULT_DUMP_SIGNAL, sinks["capture + writer thread"])
    runs = {name: [] for name in sinks}
    for r in range(args.rounds):
        for name in (list(sinks) if r % 2 == 0 else list(sinks)[::-1]):
            runs[name].append(one_dump(ticker, signals[name], sinks[name]))

    print(f"signal dump of {len(infos)} greenlets ({args.greenlets} parked"
          f"{', spawn tracking on' if args.spawn_tracking else ''}), {args.rounds} rounds, medians (min-max)")
    print(f"  snapshot() alone: {capture * 1e3:.1f} ms")
    print(f"  first dump (cold), writer thread: loop stalled {cold[0] * 1e3:.1f} ms, whole dump {cold[1] * 1e3:.0f} ms")
    print(f"  {'':28}{'loop stalled (ms)':>24}{'whole dump (ms)':>24}")
    for name, values in runs.items():
        print(f"  {name:28}{spread([v[0] for v in values]):>24}{spread([v[1] for v in values]):>24}")
    stall = statistics.median(v[0] for v in runs["capture + writer thread"])
    print(f"  target: stall <= 50 ms with 2,000 greenlets: {'met' if stall <= 0.05 else 'NOT met'} "
          f"({stall * 1e3:.1f} ms)")
    assert btcore.unregister_dump_signal()
    ticker.greenlet.kill()
    release()


def spread(values):
    ms = [v * 1e3 for v in values]
    return f"{statistics.median(ms):.1f} ({min(ms):.1f}-{max(ms):.1f})"


if __name__ == "__main__":
    main()
