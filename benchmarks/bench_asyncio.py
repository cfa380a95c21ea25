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

Usage: python benchmarks/bench_asyncio.py [--rounds N] [--batches N] [--batch N] [--depth D] [--tasks N]
Prints a report; exits 0 whatever the result (this is a report, not a test).
"""
import argparse
import asyncio
import io
import logging
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from timing import ratio, spread  # noqa: E402

import btcore  # noqa: E402


async def noop():
    pass


def _create(depth, batch):
    if depth:
        return _create(depth - 1, batch)
    return [asyncio.create_task(noop()) for _ in range(batch)]


async def _one_batch(depth, batch):
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
                loop.run_until_complete(_one_batch(depth, batch))
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


async def _sleeper():
    await asyncio.sleep(3600)


async def _awaits(task):
    await task


async def _gathers():
    await asyncio.gather(_sleeper(), _sleeper())


async def _locked(lock):
    async with lock:
        pass


async def _queued(queue):
    await queue.get()


async def _park(count):
    lock, queue = asyncio.Lock(), asyncio.Queue()
    await lock.acquire()
    made = []
    while len(made) < count:
        inner = asyncio.create_task(_sleeper())
        made += [inner, asyncio.create_task(_awaits(inner)), asyncio.create_task(_gathers()),
                 asyncio.create_task(_locked(lock)), asyncio.create_task(_queued(queue))]
    for _ in range(3):
        await asyncio.sleep(0)
    return made


def _best(fn, times=3):
    best = None
    for _ in range(times):
        t0 = time.thread_time()
        fn()
        dt = time.thread_time() - t0
        best = dt if best is None else min(best, dt)
    return best


async def _dump(count):
    made = await _park(count)
    tasks = [info for info in btcore.snapshot() if isinstance(info, btcore.tasks.TaskInfo)]
    snap = _best(btcore.snapshot)
    dump = _best(lambda: btcore.dump_all(io.StringIO()))
    print(f"dump of {len(tasks)} pending tasks ({len(made)} created, gather's children included):")
    print(f"  snapshot()          {snap:.3f} s")
    print(f"  dump_all() as text  {dump:.3f} s   (target <= 0.5 s)")
    for task in made:
        task.cancel()
    await asyncio.gather(*made, return_exceptions=True)


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


if __name__ == "__main__":
    main()
