"""The outside profiler (python -m btcore profile PID) against a gevent process
with N parked greenlets, and `py-spy record` on the same target when installed.

The target: benchmarks/parked.py's N greenlets (Event.wait 5 Python calls
deep, Queue.get, sleep, a sorted() key callback), started as
bench_dump_process.py starts it.  Each round runs, in turn (the order
reversed every other round):

  btcore   python -m btcore profile PID --rate R --duration S: the target's
           stop per sample (median and max, as the command reports them:
           from the first PTRACE_INTERRUPT to the last detach; and the
           profiler's CPU time in it: a stop's cost with a CPU to spare), the
           profiler's own CPU while recording (as the command reports it)
           and the whole command's (user + system from wait4, start-up
           included) as % of one core over S
  py-spy   py-spy record --pid PID --rate R --duration S --format raw: its
           CPU (wait4) and what its profile shows of the parked greenlets
           (py-spy samples threads: the parked greenlets are in no sample)

Then, in this process, the CPU time of one sample against one whole
process_stacks() (what sampling by repeated dumps would cost: rehearsal,
stop, walk, names of every stack), interleaved, 20 of each per round.

Targets (issue 28): the target stopped <= 2 ms per sample per 1,000
greenlets; the profiler's own CPU <= 50% of one core.
Usage: python benchmarks/bench_profile_remote.py [--greenlets N] [--rate R] [--seconds S] [--rounds K]
Prints a table; exits 0 whatever the result (a report, not a test).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_dump_process import start_target  # noqa: E402
from timing import ratio, spread  # noqa: E402

PARKED_FUNCTIONS = ("deep", "in_callback", "get", "<lambda>")   # what parked.py's greenlets run


def timed(command):
    """(stderr, CPU seconds of the command: user + system, from wait4)."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read()
    if proc.returncode:
        raise SystemExit(f"{command[0]} failed: {text[-500:]}")
    return text, usage.ru_utime + usage.ru_stime


def btcore_round(pid, rate, seconds, folder):
    out = os.path.join(folder, "btcore.txt")
    text, cpu = timed([sys.executable, "-m", "btcore", "profile", str(pid), "--rate", str(rate), "--duration",
                       str(seconds), "-o", out])
    found = re.search(r"(\d+) samples .*target stopped ([\d.]+) ms per sample \(median; max ([\d.]+) ms; "
                      r"([\d.]+) ms of CPU\); the profiler's CPU (\d+)% of one core", text)
    if found is None:
        raise SystemExit(f"unexpected report: {text[-500:]}")
    samples, median, most, stop_cpu, recording = found.groups()
    parked = _greenlets_seen(out)
    return {"samples": int(samples), "stop": float(median), "stop_max": float(most), "stop_cpu": float(stop_cpu),
            "recording": int(recording),
            "cpu": 100 * cpu / seconds, "parked": parked}


def pyspy_round(spy, pid, rate, seconds, folder):
    out = os.path.join(folder, "pyspy.txt")
    _, cpu = timed([spy, "record", "--pid", str(pid), "--rate", str(rate), "--duration", str(seconds),
                    "--format", "raw", "-o", out])
    return {"cpu": 100 * cpu / seconds, "parked": _functions_seen(out)}


def _greenlets_seen(path):
    """{function: microseconds} of btcore's parked greenlets, by the function in their group."""
    seen = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            stack, _, count = line.rpartition(" ")
            group = stack.split(";", 2)
            if len(group) > 1 and group[1] == "parked":
                function = group[0].rpartition("(")[2].rstrip(")")
                seen[function] = seen.get(function, 0) + int(count)
    return seen


def _functions_seen(path):
    """{parked.py function: samples whose stack shows it} of py-spy's raw output."""
    seen = {name: 0 for name in PARKED_FUNCTIONS}
    with open(path, encoding="utf-8") as f:
        for line in f:
            stack, _, count = line.rpartition(" ")
            for name in PARKED_FUNCTIONS:
                if f";{name} (" in f";{stack}" and "parked.py" in stack:
                    seen[name] += int(count) if count.isdigit() else 0
    return seen


def per_sample_cpu(pid, rounds):
    """{name: [CPU seconds per call, one value per round]}: ProcessProfiler.sample() and process_stacks()."""
    import time
    from btcore.remote.process import process_stacks
    from btcore.profile.remote import ProcessProfiler
    profiler = ProcessProfiler(pid)
    try:
        ways = {"sample": profiler.sample, "process_stacks": lambda: process_stacks(pid)}
        for way in ways.values():   # warm: tables, names, the first walk
            way()
        runs = {name: [] for name in ways}
        for r in range(rounds):
            for name in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
                started = time.process_time()
                for _ in range(20):
                    ways[name]()
                runs[name].append((time.process_time() - started) / 20)
        return runs
    finally:
        profiler.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--greenlets", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=20)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    kinds = ["btcore"] + (["py-spy"] if os.path.exists(spy) else [])
    results = {kind: [] for kind in kinds}
    proc, _ = start_target(args.greenlets)
    try:
        with tempfile.TemporaryDirectory() as folder:
            for r in range(args.rounds):
                for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                    results[kind].append(btcore_round(proc.pid, args.rate, args.seconds, folder) if kind == "btcore"
                                         else pyspy_round(spy, proc.pid, args.rate, args.seconds, folder))
        cpu = per_sample_cpu(proc.pid, args.rounds)
    finally:
        proc.kill()
        proc.wait()
    ours = results["btcore"]
    print(f"Outside profile of {args.greenlets} parked gevent greenlets at {args.rate} Hz, {args.seconds} s x "
          f"{args.rounds} interleaved rounds (median (min-max))")
    print(f"  btcore: target stopped {spread([r['stop'] for r in ours]).text(1)} ms per sample (per-round medians; "
          f"max {max(r['stop_max'] for r in ours):.1f} ms), the profiler's CPU in a stop "
          f"{spread([r['stop_cpu'] for r in ours]).text(1)} ms   target: <= {2 * args.greenlets / 1000:.1f} ms")
    print(f"          profiler CPU while recording {spread([r['recording'] for r in ours]).text(0)}% of one core, "
          f"whole command {spread([r['cpu'] for r in ours]).text(0)}% (start-up included)   target: <= 50%")
    print(f"          {spread([r['samples'] for r in ours]).text(0)} samples; parked greenlets' wall time by "
          f"function (s): {', '.join(f'{k} {v / 1e6:.1f}' for k, v in sorted(ours[-1]['parked'].items()))}")
    if "py-spy" in results:
        theirs = results["py-spy"]
        print(f"  py-spy record: CPU {spread([r['cpu'] for r in theirs]).text(0)}% of one core; samples showing "
              f"the parked greenlets' functions: {theirs[-1]['parked']} (it samples threads: a parked greenlet "
              f"is in none of them)")
    else:
        print("  (py-spy not installed: pip install py-spy to compare)")
    print(f"  CPU per sample: {spread(cpu['sample']).text(4)} s; a whole process_stacks() "
          f"{spread(cpu['process_stacks']).text(4)} s (ratio {ratio(cpu['process_stacks'], cpu['sample']).text()}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
