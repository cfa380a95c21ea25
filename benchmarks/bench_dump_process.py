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
10 000 greenlets <= 2 s.  Issue 26: 10 000 greenlets, the command <= 0.25 s,
the API <= 0.15 s, stopped <= 2 ms per 1 000 greenlets (3.11 and 3.13-3.15
targets).

Each build's dumps run in a process of their own per round (warmed by one
dump first), builds and rounds interleaved on the same target.

Usage: python benchmarks/bench_dump_process.py [--greenlets N ...] [--rounds R]
                                              [--chroot ROOT --python PATH]
                                              [--before SITE]
--chroot/--python: the target runs on another interpreter in a chroot (as
root; the sid chroot of ci/sid-matrix.sh, PATH a venv there with gevent):
a target on CPython 3.13-3.15, read through its _Py_DebugOffsets.
--spawn-tracking: the target enables btcore's spawn tracking before it parks
its greenlets (its btcore is the installed one, or the chroot venv's).
--before SITE: another build of btcore (pip install --target SITE), measured
in the same rounds: a "before" row under each "after" row (the installed
build).  Also "api cpu": the dumper's CPU time for a whole API dump.
Prints a table; exits 0 whatever the result (a report, not a test).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from timing import interleaved_processes, ratio, spread   # benchmarks/ is first on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = """
import sys, gevent
sys.path.insert(0, {here!r})
if {track}:   # --spawn-tracking: every greenlet has a spawn record, which the dump reads and shows
    import btcore
    btcore.enable_spawn_tracking()
from parked import park
park({n})
open({ready!r}, "w").close()
gevent.sleep(3600)
"""


def start_target(n, chroot=None, python=None, track=False):
    """(the target process, a folder to remove after it or None)."""
    inside = None
    if chroot is None:
        ready = tempfile.mktemp(prefix="btcore-bench-ready-")
        proc = subprocess.Popen([sys.executable, "-c", TARGET.format(here=HERE, n=n, ready=ready, track=track)])
    else:   # parked.py and the ready file inside the chroot, named as the target sees them
        inside = tempfile.mkdtemp(prefix="btcore-bench-", dir=os.path.join(chroot, "tmp"))
        shutil.copy(os.path.join(HERE, "parked.py"), inside)
        here = "/tmp/" + os.path.basename(inside)
        ready = os.path.join(inside, "ready")
        proc = subprocess.Popen(["chroot", chroot, python, "-c",
                                 TARGET.format(here=here, n=n, ready=here + "/ready", track=track)])
    while not os.path.exists(ready):
        if proc.poll() is not None:
            raise SystemExit("the target exited")
        time.sleep(0.05)
    os.unlink(ready)
    return proc, inside


# One round of one build: a warm-up dump, then one whole API dump and one stop measured.
DUMPER = """
import io, json, sys, time
sys.path[:0] = sys.argv[2:]
import btcore
from btcore.remote.process import process_stacks
pid = int(sys.argv[1])
process_stacks(pid)
t0, c0 = time.perf_counter(), time.process_time()
btcore.dump_process(pid, io.StringIO())
whole, cpu = time.perf_counter() - t0, time.process_time() - c0
snap, stacks = process_stacks(pid)
print(json.dumps([snap.stopped_for * 1000, snap.stopped_cpu * 1000, whole, cpu,
                  sum(1 for s in stacks if s.kind == "greenlet")]))
"""


def dumps(pid, builds, rounds):
    """{build: [(stopped ms, stop cpu ms, API s, API cpu s, greenlets listed), one per round]}."""
    out = {name: [] for name in builds}
    for r in range(rounds):
        for name in (list(builds) if r % 2 == 0 else list(builds)[::-1]):
            done = subprocess.run([sys.executable, "-c", DUMPER, str(pid)] + builds[name], capture_output=True,
                                  text=True, check=True, timeout=600, cwd=HERE)
            out[name].append(json.loads(done.stdout))
    return out


def cli(site):
    """`python -m btcore` of a build (site: its directory, or None: the installed one)."""
    return (["env", f"PYTHONPATH={site}"] if site else []) + [sys.executable, "-m", "btcore"]


def measure(n, rounds, chroot=None, python=None, before=None, track=False):
    builds = {"after": []} | ({"before": [before]} if before else {})
    proc, folder = start_target(n, chroot, python, track)
    try:
        measured = dumps(proc.pid, builds, rounds)
        commands = {f"btcore cli {name}": cli(site[0] if site else None) + ["dump", str(proc.pid)]
                    for name, site in builds.items()}
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
    return measured, processes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--greenlets", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chroot", help="run the target in this chroot (with --python)")
    parser.add_argument("--python", help="the target's interpreter, as the chroot names it")
    parser.add_argument("--before", help="another build of btcore (a pip --target directory) to compare with")
    parser.add_argument("--spawn-tracking", action="store_true",
                        help="the target tracks spawns: the dump also reads and shows every greenlet's spawn chain")
    args = parser.parse_args()
    if bool(args.chroot) != bool(args.python):
        parser.error("--chroot and --python go together")
    print(f"{'greenlets':>9} {'build':>6} {'listed':>7} {'stopped ms':>18} {'stop cpu ms':>18} {'btcore API s':>18} "
          f"{'API cpu s':>18} {'btcore cli s':>18} {'py-spy s':>18} {'cli/py-spy':>16} {'pystack s':>18} "
          f"{'cli/pystack':>16}")
    for n in args.greenlets:
        measured, processes = measure(n, args.rounds, args.chroot, args.python, args.before, args.spawn_tracking)
        for name, runs in measured.items():
            stopped, cpu, whole, whole_cpu, counted = zip(*runs)
            mine = processes[f"btcore cli {name}"]
            peers = []
            for peer in ("py-spy", "pystack"):
                peers += [spread(processes[peer]).text(3), ratio(mine, processes[peer]).text()] \
                    if peer in processes else ["not installed", "-"]
            print(f"{n:>9} {name:>6} {max(counted):>7} {spread(stopped).text(1):>18} {spread(cpu).text(1):>18} "
                  f"{spread(whole).text(3):>18} {spread(whole_cpu).text(3):>18} {spread(mine).text(3):>18} "
                  + " ".join(f"{p:>{w}}" for p, w in zip(peers, (18, 16, 18, 16))))


if __name__ == "__main__":
    main()
