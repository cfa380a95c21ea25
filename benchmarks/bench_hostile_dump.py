"""Dumping a target whose memory is corrupt (docs/safety.md, "hostile
targets"): the dumper's peak RSS over a clean dump's, and its wall time.

Targets (tests/fixtures/hostile_target.py): N healthy gevent greenlets
(1 000 by default) and victims whose fields the target corrupted itself
after parking: every field a dump reads of a greenlet (greenlet,
StackState, frames, code, names, line table) set to each sentinel (0, -1,
2**63, 2**64-16, unaligned, a self-cycle, huge), a sleeping thread's state
and the gc lists set to each sentinel, then seeded random words in many
victims.  Each is dumped with `python -m btcore dump --json PID`, cold, as a
user runs it: the peak RSS is the dumper process's VmHWM, the baseline the
same dump of a clean target of the same size.

Targets (issue 25): peak RSS <= 100 MB over the baseline on any corrupt
target; wall <= 2 s at 1 000 greenlets.

Usage: python benchmarks/bench_hostile_dump.py [--greenlets N] [--seeds S]
Prints a table; exits 0 whatever the result (a report, not a test).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "..", "tests", "fixtures", "hostile_target.py")
VALUES = ["0", "-1", "2^63", "2^64-16", "unaligned", "self", "huge"]
GREENLET_FIELDS = ["greenlet.type", "greenlet.pimpl", "state.start", "state.stop", "state.copy", "state.saved",
                   "state.frame", "frameobj.f_frame", "frame.code", "frame.previous", "frame.prev_instr",
                   "frame.flags", "caller.code", "caller.previous", "caller.prev_instr", "code.type", "code.size",
                   "code.filename", "code.qualname", "code.firstlineno", "code.linetable", "qualname.length",
                   "qualname.state", "linetable.size"]
SHARED_FIELDS = ["gc.next", "gc.prev", "gchead.next", "tstate.next", "tstate.thread_id",
                 "tstate.native_thread_id", "tstate.cframe", "cframe.current_frame"]
DUMPER = """
import sys
import btcore.__main__
rc = btcore.__main__.main(sys.argv[1:])
with open("/proc/self/status") as f:
    print(next(line.split()[1] for line in f if line.startswith("VmHWM:")), file=sys.stderr)
sys.exit(rc)
"""


def start(folder, spec):
    spec_path, ready = os.path.join(folder, "spec.json"), os.path.join(folder, "ready.json")
    if os.path.exists(ready):
        os.unlink(ready)
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    proc = subprocess.Popen([sys.executable, TARGET, spec_path, ready])
    while not os.path.exists(ready):
        if proc.poll() is not None:
            raise RuntimeError("the target exited before it was ready")
        time.sleep(0.05)
    return proc


def dump(pid):
    """(peak RSS in MiB, wall seconds, notes (the dump's and its stacks'), exit status)."""
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", DUMPER, "dump", "--json", str(pid)], capture_output=True,
                          text=True, timeout=600, cwd="/")
    wall = time.perf_counter() - began
    if done.returncode:
        return None, wall, 0, done.returncode
    doc = json.loads(done.stdout)
    notes = len(doc["notes"]) + sum(1 for s in doc["stacks"] if s["error"])   # the dump's and its stacks
    return int(done.stderr.split()[-1]) / 1024, wall, notes, 0


def cases(seeds: int):
    for value in VALUES:
        yield f"greenlet fields = {value}", {"corrupt": [[f, value] for f in GREENLET_FIELDS]}
        yield f"thread, gc lists = {value}", {"corrupt": [[f, value] for f in SHARED_FIELDS]}
    for first in range(0, seeds, 16):
        yield f"random, seeds {first}-{first + 15}", {"corrupt": [], "random": [[s, 6] for s in range(first, first + 16)]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--greenlets", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=160)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="btcore-hostile-") as folder:
        proc = start(folder, {"healthy": args.greenlets, "corrupt": []})
        try:
            base, base_wall, _, _ = min(dump(proc.pid) for _ in range(3))
        finally:
            proc.kill()
            proc.wait()
        print(f"{args.greenlets} healthy greenlets; clean dump: peak {base:.1f} MiB, wall {base_wall:.2f} s")
        print(f"{'case':<34} {'peak MiB':>9} {'over':>7} {'wall s':>7} {'noted':>6}")
        worst_over, worst_wall, failures = 0.0, 0.0, 0
        for name, spec in cases(args.seeds):
            proc = start(folder, dict(spec, healthy=args.greenlets))
            try:
                peak, wall, notes, rc = dump(proc.pid)
            finally:
                proc.kill()
                proc.wait()
            if rc:
                failures += 1
                print(f"{name:<34} {'exit ' + str(rc):>9}")
                continue
            worst_over, worst_wall = max(worst_over, peak - base), max(worst_wall, wall)
            print(f"{name:<34} {peak:9.1f} {peak - base:+7.1f} {wall:7.2f} {notes:6d}")
        print(f"worst: {worst_over:+.1f} MiB over the clean dump (target <= 100 MB), wall {worst_wall:.2f} s "
              f"(target <= 2 s), {failures} dumps failed")


if __name__ == "__main__":
    main()
