"""How long a crash report takes: from the fault to the crashing thread's
part, and to the whole report (the helper's dump of every thread and parked
greenlet, then the process's death by its signal).

The program: a gevent process with N greenlets parked in gevent.sleep
(default 1,000) that crashes in C (ctypes.string_at(0)) from a greenlet,
with enable_crash_report() on.  It writes the wall-clock time just before
the fault; this script timestamps each line of its stderr as it arrives:

  first   from the fault to the end of the crashing thread's part
  whole   from the fault to the process's exit (the helper's part written,
          the signal passed on)

Targets (issue 27): first <= 50 ms, whole <= 1 s at 1,000 greenlets.
"tracked": spawn tracking on, so the first part also finds the crashing
greenlet among the N + 2 spawn records and writes its spawn chain.
"passed on": faulthandler enabled after btcore, whose handler writes its
report first and raises the signal again; the first part then ends after
both reports, ours found from the kernel's signal frame of the fault.
Beside them, faulthandler's report alone (the same program without btcore's
report) for scale: what the crash costs without any report of greenlets.

Usage: python benchmarks/bench_crash.py [--greenlets N] [--rounds R]
Prints a table; exits 0 whatever the result (a report, not a test).
"""
import argparse
import statistics
import subprocess
import sys
import time

PROGRAM = """
import ctypes, faulthandler, sys, time
import gevent, btcore
{enable}
parked = [gevent.spawn(gevent.sleep, 600) for _ in range({n})]
gevent.sleep(0.05)

def crasher():
    print("FAULT", repr(time.time()), file=sys.stderr, flush=True)
    ctypes.string_at(0)

gevent.spawn(crasher).join()
"""


def one(n: int, enable: str) -> tuple:
    """(seconds to the end of the first part or None, seconds to exit, exit status)."""
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM.format(n=n, enable=enable)], stderr=subprocess.PIPE,
                            text=True, bufsize=1)
    fault = first = None
    in_first = False
    for line in proc.stderr:
        now = time.time()
        if line.startswith("FAULT "):
            fault = float(line.split()[1])
        elif line.startswith("btcore crash report (most recent"):
            in_first = True
        elif in_first and not line.strip():
            first, in_first = now, False
    proc.wait()
    end = time.time()
    return (first - fault if first else None), end - fault, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--greenlets", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    kinds = {"btcore (helper)": "btcore.enable_crash_report()",
             "btcore, no helper": "btcore.enable_crash_report(helper=False)",
             # the crashing greenlet's search among 1,000 spawn records, and its chain, in the first part
             "tracked, no helper": "btcore.enable_spawn_tracking(); btcore.enable_crash_report(helper=False)",
             # faulthandler enabled after btcore: its handler runs first, then passes the signal on to ours
             "passed on, no helper": "btcore.enable_crash_report(helper=False); faulthandler.enable()",
             "faulthandler": "faulthandler.enable()"}
    runs = {kind: [] for kind in kinds}
    for _ in range(args.rounds):   # interleaved: the machine's load moves each alike
        for kind, enable in kinds.items():
            runs[kind].append(one(args.greenlets, enable))
    print(f"{args.greenlets} parked greenlets, {args.rounds} rounds: median ms (min-max)")
    print(f"{'report':<20} {'first part':>22} {'whole, to exit':>22}  exit status")
    for kind, results in runs.items():
        firsts = [r[0] * 1000 for r in results if r[0] is not None]
        wholes = [r[1] * 1000 for r in results]
        first = f"{statistics.median(firsts):.0f} ({min(firsts):.0f}-{max(firsts):.0f})" if firsts else "-"
        print(f"{kind:<20} {first:>22} {statistics.median(wholes):>8.0f} ({min(wholes):.0f}-{max(wholes):.0f})"
              f"{'':>4}  {sorted({r[2] for r in results})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
