"""Dumping a gevent process from outside (python -m btcore dump), against
`py-spy dump` on the same target when py-spy is installed.

The target: a separate process with N gevent greenlets parked in four
places (benchmarks/parked.py: Event.wait 5 Python calls deep, Queue.get,
sleep, a sorted() key callback).  Measured, rounds interleaved:

  stopped     how long the target's threads are stopped per dump (btcore
              measures it between the first PTRACE_INTERRUPT and the last
              detach): registers, stack copies, thread states, the gc lists,
              every greenlet's saved state and Python frames
  stop cpu    the dumper's CPU time (user + system) in that window: what the
              stop costs on a quiet machine (a loaded one stretches the wall
              time above by preempting the dumper)
  btcore      a whole dump through the API, warm (ELF symbol tables of the
              target's modules cached): stop + walk + merge + names + text
  btcore cli  `python -m btcore dump PID` as a process (cold: imports, tables)
  py-spy      `py-spy dump --pid PID` as a process (running stacks only:
              it does not see suspended greenlets)
  pystack     `pystack remote --native PID` as a process (running stacks
              only, as py-spy)

Targets (issue 15): stopped <= 10 ms for 1 000 greenlets; a whole dump of
10 000 greenlets <= 2 s.

Usage: python benchmarks/bench_dump_process.py [--greenlets N ...] [--rounds R]
                                              [--chroot ROOT --python PATH]
--chroot/--python: the target runs on another interpreter in a chroot (as
root; the sid chroot of ci/sid-matrix.sh, PATH a venv there with gevent):
a target on CPython 3.13-3.15, read through its _Py_DebugOffsets.
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


def start_target(n, chroot=None, python=None):
    """(the target process, a folder to remove after it or None)."""
    inside = None
    if chroot is None:
        ready = tempfile.mktemp(prefix="btcore-bench-ready-")
        proc = subprocess.Popen([sys.executable, "-c", TARGET.format(here=HERE, n=n, ready=ready)])
    else:   # parked.py and the ready file inside the chroot, named as the target sees them
        inside = tempfile.mkdtemp(prefix="btcore-bench-", dir=os.path.join(chroot, "tmp"))
        shutil.copy(os.path.join(HERE, "parked.py"), inside)
        here = "/tmp/" + os.path.basename(inside)
        ready = os.path.join(inside, "ready")
        proc = subprocess.Popen(["chroot", chroot, python, "-c",
                                 TARGET.format(here=here, n=n, ready=here + "/ready")])
    while not os.path.exists(ready):
        if proc.poll() is not None:
            raise SystemExit("the target exited")
        time.sleep(0.05)
    os.unlink(ready)
    return proc, inside


def measure(n, rounds, chroot=None, python=None):
    proc, folder = start_target(n, chroot, python)
    try:
        process_stacks(proc.pid)   # warm: symbol tables, greenlet offsets
        stopped, cpu, whole, counted = [], [], [], 0
        for _ in range(rounds):
            t0 = time.perf_counter()
            out = io.StringIO()
            btcore.dump_process(proc.pid, out)
            whole.append(time.perf_counter() - t0)
            snap, stacks = process_stacks(proc.pid)
            stopped.append(snap.stopped_for * 1000)
            cpu.append(snap.stopped_cpu * 1000)
            counted = sum(1 for s in stacks if s.kind == "greenlet")
        commands = {"btcore cli": [sys.executable, "-m", "btcore", "dump", str(proc.pid)]}
        spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
        if os.path.exists(spy):
            commands["py-spy"] = [spy, "dump", "--pid", str(proc.pid)]
        pystack = shutil.which("pystack") or os.path.join(os.path.dirname(sys.executable), "pystack")
        if os.path.exists(pystack):   # issue 26's peer: it shows no parked greenlet either
            commands["pystack"] = [pystack, "remote", "--native", str(proc.pid)]
        processes = interleaved_processes(commands, rounds)
    finally:
        proc.kill()
        proc.wait()
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
    return counted, spread(stopped), spread(cpu), spread(whole), processes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--greenlets", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chroot", help="run the target in this chroot (with --python)")
    parser.add_argument("--python", help="the target's interpreter, as the chroot names it")
    args = parser.parse_args()
    if bool(args.chroot) != bool(args.python):
        parser.error("--chroot and --python go together")
    print(f"{'greenlets':>9} {'listed':>7} {'stopped ms':>18} {'stop cpu ms':>18} {'btcore API s':>18} "
          f"{'btcore cli s':>18} {'py-spy s':>18} {'cli/py-spy':>16} {'pystack s':>18} {'cli/pystack':>16}")
    for n in args.greenlets:
        counted, stopped, cpu, whole, processes = measure(n, args.rounds, args.chroot, args.python)
        cli = spread(processes["btcore cli"])
        spy = spread(processes["py-spy"]).text(3) if "py-spy" in processes else "not installed"
        vs = ratio(processes["btcore cli"], processes["py-spy"]).text() if "py-spy" in processes else "-"
        stack = spread(processes["pystack"]).text(3) if "pystack" in processes else "not installed"
        vs_stack = ratio(processes["btcore cli"], processes["pystack"]).text() if "pystack" in processes else "-"
        print(f"{n:>9} {counted:>7} {stopped.text(1):>18} {cpu.text(1):>18} {whole.text(3):>18} {cli.text(3):>18} "
              f"{spy:>18} {vs:>16} {stack:>18} {vs_stack:>16}")


if __name__ == "__main__":
    main()
