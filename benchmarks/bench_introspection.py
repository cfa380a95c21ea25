"""What every greenlet is doing, for 10 000 parked gevent greenlets: btcore
against gevent's own dump, on the same program, in the same run.

The program: N gevent greenlets (default 10 000) parked in four different
places (Event.wait 5 Python calls deep, Queue.get, sleep, a sorted() key
callback waiting on an Event: Python -> C -> Python).  Timed, warm (one
untimed call of each first), rounds interleaved so that load changes hit
both alike:

  btcore grouped    btcore.snapshot() + dump_all(group=True, tree=False) to a StringIO
  btcore + tree     the same with the spawn/parent tree (dump_all's default)
  gevent            gevent.util.print_run_info() to a StringIO (Python frames only,
                    no grouping: one traceback per greenlet)

Memory: the peak of Python allocations (tracemalloc) during one grouped
dump, and the process's peak RSS (ru_maxrss) before and after the runs.

Targets (issue 12): btcore grouped <= 1 s warm, and <= 5x gevent.

Usage: python benchmarks/bench_introspection.py [--greenlets N] [--rounds R]
Prints a table; exits 0 whatever the result (a report, not a test).
"""
import argparse
import io
import resource
import statistics
import time
import tracemalloc

import gevent
import gevent.util

import btcore
from parked import park   # benchmarks/ is the script's directory, first on sys.path


def btcore_grouped():
    out = io.StringIO()
    btcore.dump_all(out, group=True, tree=False)
    return out.getvalue()


def btcore_tree():
    out = io.StringIO()
    btcore.dump_all(out, group=True, tree=True)
    return out.getvalue()


def gevent_dump():
    out = io.StringIO()
    gevent.util.print_run_info(file=out)
    return out.getvalue()


def timed(fn):
    t0 = time.perf_counter()
    text = fn()
    return time.perf_counter() - t0, len(text)


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--greenlets", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    greenlets, release = park(args.greenlets)
    contenders = {"btcore grouped": btcore_grouped, "btcore + tree": btcore_tree, "gevent": gevent_dump}
    sizes = {name: timed(fn)[1] for name, fn in contenders.items()}     # warm-up
    rss_warm = peak_rss_mib()
    runs = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, fn in contenders.items():
            runs[name].append(timed(fn)[0])

    tracemalloc.start()
    btcore_grouped()
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    release()

    print(f"{args.greenlets} parked gevent greenlets (+ hub, main), {args.rounds} interleaved rounds, warm")
    print(f"{'':16} {'median s':>9} {'min s':>7} {'max s':>7} {'output KiB':>10}")
    for name, times in runs.items():
        print(f"{name:16} {statistics.median(times):9.3f} {min(times):7.3f} {max(times):7.3f} "
              f"{sizes[name] / 1024:10.0f}")
    ratio = statistics.median(runs["btcore grouped"]) / statistics.median(runs["gevent"])
    print(f"btcore grouped / gevent: {ratio:.2f}x   (target <= 5x; btcore grouped target <= 1 s)")
    print(f"peak Python allocations during one grouped dump (tracemalloc): {traced_peak / 2**20:.1f} MiB")
    print(f"peak RSS: {rss_warm:.0f} MiB after warm-up, {peak_rss_mib():.0f} MiB at the end")


if __name__ == "__main__":
    main()
