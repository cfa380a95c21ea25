"""Dumping a gevent process from outside (python -m btcore dump), against
`py-spy dump` on the same target when py-spy is installed.

The target: a separate process with N gevent greenlets parked in four
places (benchmarks/parked.py: Event.wait 5 Python calls deep, Queue.get,
sleep, a sorted() key callback).  Measured, rounds interleaved:

  stopped     how long the target's threads are stopped per dump (btcore
              measures it between the first PTRACE_INTERRUPT and the last
              detach): registers, stack copies, thread states, the gc lists,
              every greenlet's saved state and Python frames
  btcore      a whole dump through the API, warm (ELF symbol tables of the
              target's modules cached): stop + walk + merge + names + text
  btcore cli  `python -m btcore dump PID` as a process (cold: imports, tables)
  py-spy      `py-spy dump --pid PID` as a process (running stacks only:
              it does not see suspended greenlets)

Targets (issue 15): stopped <= 10 ms for 1 000 greenlets; a whole dump of
10 000 greenlets <= 2 s.

Usage: python benchmarks/bench_dump_process.py [--greenlets N ...] [--rounds R]
Prints a table; exits 0 whatever the result (a report, not a test).
"""
import argparse
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time

import btcore
from btcore.process import process_stacks
from timing import interleaved_processes, ratio, spread   # benchmarks/ is first on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = """
import sys, gevent
sys.path.insert(0, {here!r})
from parked import park
park({n})
open({ready!r}, "w").close()
gevent.sleep(3600)
"""


def start_target(n):
    ready = tempfile.mktemp(prefix="btcore-bench-ready-")
    proc = subprocess.Popen([sys.executable, "-c", TARGET.format(here=HERE, n=n, ready=ready)])
    while not os.path.exists(ready):
        if proc.poll() is not None:
            raise SystemExit("the target exited")
        time.sleep(0.05)
    os.unlink(ready)
    return proc


def measure(n, rounds):
    proc = start_target(n)
    try:
        process_stacks(proc.pid)   # warm: symbol tables, greenlet offsets
        stopped, whole, counted = [], [], 0
        for _ in range(rounds):
            t0 = time.perf_counter()
            out = io.StringIO()
            btcore.dump_process(proc.pid, out)
            whole.append(time.perf_counter() - t0)
            snap, stacks = process_stacks(proc.pid)
            stopped.append(snap.stopped_for * 1000)
            counted = sum(1 for s in stacks if s.kind == "greenlet")
        commands = {"btcore cli": [sys.executable, "-m", "btcore", "dump", str(proc.pid)]}
        spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
        if os.path.exists(spy):
            commands["py-spy"] = [spy, "dump", "--pid", str(proc.pid)]
        processes = interleaved_processes(commands, rounds)
    finally:
        proc.kill()
        proc.wait()
    return counted, spread(stopped), spread(whole), processes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--greenlets", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{'greenlets':>9} {'listed':>7} {'stopped ms':>18} {'btcore API s':>18} {'btcore cli s':>18} "
          f"{'py-spy s':>18} {'cli/py-spy':>16}")
    for n in args.greenlets:
        counted, stopped, whole, processes = measure(n, args.rounds)
        cli = spread(processes["btcore cli"])
        spy = spread(processes["py-spy"]).text(3) if "py-spy" in processes else "not installed"
        vs = ratio(processes["btcore cli"], processes["py-spy"]).text() if "py-spy" in processes else "-"
        print(f"{n:>9} {counted:>7} {stopped.text(1):>18} {whole.text(3):>18} {cli.text(3):>18} {spy:>18} {vs:>16}")


if __name__ == "__main__":
    main()
