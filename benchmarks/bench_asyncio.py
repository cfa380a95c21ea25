"""asyncio tasks (issue 30): the cost of creation tracking, and the time of a
dump of many tasks.

Creation: a batch of --batch (default 1000) tasks of `async def noop()`,
created with asyncio.create_task() --depth (default 10) Python frames deep
inside a task and run to completion (the batch's last task awaited: every
other has completed by then), on one loop, in interleaved rounds:

  untracked   nothing on
  tracked     btcore.enable_spawn_tracking() (the defaults: native + Python
              frames, all generations)
  python-only btcore.enable_spawn_tracking(native=False)
  debug       asyncio's debug mode (loop.set_debug(True)): what it costs to
              get each task's creation traceback (_source_traceback) from asyncio

Times are the thread's CPU time (the machine is shared: wall time counts
other processes).  Each mode runs --batches batches per round; the ratio
to untracked is printed per mode (median of the per-round ratios, and
their spread).  Target: tracked <= 1.2x untracked.

Dump: --tasks (default 10 000) tasks parked in asyncio.sleep() through four
different await chains (a task awaiting a task awaiting a sleep, gather,
a lock, a queue), then snapshot() alone and dump_all() as text (snapshot,
grouping and names) timed in CPU time, best of 3.  Target: dump <= 0.5 s.

Outside (x86-64): the same --tasks parked in another process, dumped by
python -m btcore dump's code (btcore.remote.process.dump_process, warm: the
target's ELF tables cached after the first dump), --rounds times: the whole
dump (wall and this process's CPU time) and how long the target was
stopped (wall, and the dumper's CPU in that window: a loaded machine
stretches the wall time by preempting the dumper), medians.  Targets:
dump <= 0.5 s, stopped <= 2 ms per 1,000 tasks.

Usage: python benchmarks/bench_asyncio.py [--rounds N] [--batches N] [--batch N] [--depth D] [--tasks N]
Prints a report; exits 0 whatever the result (this is a report, not a test).
"""
import argparse
import asyncio
import io
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from parked_tasks import park  # noqa: E402
from timing import ratio, spread  # noqa: E402

import btcore  # noqa: E402


async def noop():
    pass


def _create(depth, batch):
    if depth:
        return _create(depth - 1, batch)
    return [asyncio.create_task(noop()) for _ in range(batch)]


async def one_batch(depth, batch):
    """One batch of the creation benchmark (benchmarks/callgrind_tasks.py counts its instructions)."""
    await _create(depth, batch)[-1]


def creation(rounds, batches, batch, depth):
    loop = asyncio.new_event_loop()
    # name: (spawn tracking's options or None, asyncio debug mode)
    modes = {"untracked": (None, False), "tracked": ({}, False), "python-only": ({"native": False}, False),
             "debug": (None, True)}
    runs = {name: [] for name in modes}
    for r in range(rounds):
        for name in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
            tracked, debug = modes[name]
            if tracked is not None:   # turned on and off outside the timed part
                btcore.enable_spawn_tracking(**tracked)
            loop.set_debug(debug)
            t0 = time.thread_time_ns()
            for _ in range(batches):
                loop.run_until_complete(one_batch(depth, batch))
            runs[name].append((time.thread_time_ns() - t0) / batches)
            loop.set_debug(False)
            btcore.disable_spawn_tracking()
    loop.close()
    per_task = {name: spread(values).median / batch for name, values in runs.items()}
    print(f"create_task + completion, {batch} tasks per batch, created {depth} Python frames deep, "
          f"{rounds} interleaved rounds:")
    for name in modes:
        line = f"  {name:11} {per_task[name] / 1000:7.2f} us per task"
        if name != "untracked":
            line += f"   {ratio(runs[name], runs['untracked']).text()}x untracked"
        print(line)
    print("  target: tracked <= 1.2x untracked")


def _best(fn, times=3):
    best = None
    for _ in range(times):
        t0 = time.thread_time()
        fn()
        dt = time.thread_time() - t0
        best = dt if best is None else min(best, dt)
    return best


async def _dump(count):
    made = await park(count)
    tasks = [info for info in btcore.snapshot() if isinstance(info, btcore.capture.tasks.TaskInfo)]
    snap = _best(btcore.snapshot)
    dump = _best(lambda: btcore.dump_all(io.StringIO()))
    print(f"dump of {len(tasks)} pending tasks ({len(made)} created, gather's children included):")
    print(f"  snapshot()          {snap:.3f} s")
    print(f"  dump_all() as text  {dump:.3f} s   (target <= 0.5 s)")
    for task in made:
        task.cancel()
    await asyncio.gather(*made, return_exceptions=True)


OUTSIDE_TARGET = """
import asyncio, sys
sys.path.insert(0, {here!r})
from parked_tasks import park
async def main():
    await park({count})
    open({ready!r}, "w").close()
    await asyncio.sleep(3600)
asyncio.run(main())
"""


def _median(values):
    return sorted(values)[len(values) // 2]


def outside(count, rounds):
    from btcore.remote.process import dump_process, process_stacks
    folder = tempfile.mkdtemp(prefix="bench-asyncio-")
    ready = os.path.join(folder, "ready")
    code = OUTSIDE_TARGET.format(here=os.path.dirname(os.path.abspath(__file__)), count=count, ready=ready)
    target = subprocess.Popen([sys.executable, "-c", code])
    try:
        while not os.path.exists(ready):
            time.sleep(0.05)
        snap, stacks = process_stacks(target.pid)   # warm: the target's ELF tables
        tasks = sum(1 for s in stacks if s.kind == "task")
        whole, whole_cpu, stopped, stopped_cpu = [], [], [], []
        for _ in range(rounds):
            t0, c0 = time.perf_counter(), time.process_time()
            dump_process(target.pid, io.StringIO())
            whole.append(time.perf_counter() - t0)
            whole_cpu.append(time.process_time() - c0)
            snap, _ = process_stacks(target.pid)
            stopped.append(snap.stopped_for)
            stopped_cpu.append(snap.stopped_cpu)
    finally:
        target.kill()
        target.wait()
        os.remove(ready)
        os.rmdir(folder)
    per_1000 = 1000 / max(tasks, 1)
    print(f"outside dump (python -m btcore dump) of {tasks} pending tasks, {rounds} rounds, medians:")
    print(f"  whole dump   {_median(whole):.3f} s wall, {_median(whole_cpu):.3f} s CPU   (target <= 0.5 s)")
    print(f"  stopped      {_median(stopped) * 1000:.1f} ms wall, {_median(stopped_cpu) * 1000:.1f} ms CPU: "
          f"{_median(stopped) * 1000 * per_1000:.2f} / {_median(stopped_cpu) * 1000 * per_1000:.2f} ms per 1,000 "
          "tasks   (target <= 2 ms per 1,000)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--depth", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=10000)
    args = parser.parse_args()
    print(f"Python {sys.version.split()[0]}, pid {os.getpid()}")
    logging.getLogger("asyncio").setLevel(logging.ERROR)   # debug mode's "Executing ... took" lines
    creation(args.rounds, args.batches, args.batch, args.depth)
    asyncio.run(_dump(args.tasks))
    if platform.machine() == "x86_64":
        outside(args.tasks, args.rounds)


if __name__ == "__main__":
    main()
