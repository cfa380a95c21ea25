"""Instructions per asyncio task created, tracked and untracked (callgrind).

Time on a shared machine varies by 2x from one round to the next;
instruction counts do not.  The workload is bench_asyncio.py's creation
benchmark (its one_batch(): `async def noop()` tasks made with
asyncio.create_task() --depth Python frames deep inside a task, run to
completion, --batch per batch), in each mode:

  untracked    nothing on
  tracked      btcore.enable_spawn_tracking() (native + Python frames)
  python-only  btcore.enable_spawn_tracking(native=False)

Each mode runs twice under callgrind, --batches and 2 * --batches batches
after one warm-up batch; the difference of the two runs' totals divided by
the extra tasks is the instructions per task, everything included (the
hook, the record, its weakref callback at the task's death, the gc work
the records add), start-up and one-time work cancelled out.

--functions N: also print the N functions with the most inclusive
instructions per task in the tracked mode (the difference of its two runs,
as for the totals; a rough attribution: the inclusive counts of recursive
functions overlap).

Usage: python benchmarks/callgrind_tasks.py [--batch 1000] [--batches 2] [--depth 10] [--functions 0]
"""
import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_asyncio import one_batch  # noqa: E402

MODES = {"untracked": None, "tracked": {}, "python-only": {"native": False}}


def child(mode, batches, batch, depth):
    import btcore
    if MODES[mode] is not None:
        btcore.enable_spawn_tracking(**MODES[mode])
    loop = asyncio.new_event_loop()
    for _ in range(batches + 1):   # one warm-up batch: tables built, sites interned
        loop.run_until_complete(one_batch(depth, batch))
    loop.close()


def _run(mode, batches, batch, depth, out):
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__,
           "--child", mode, "--batches", str(batches), "--batch", str(batch), "--depth", str(depth)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(p.stdout + p.stderr)
    with open(out) as f:
        for line in f:
            if line.startswith(("totals:", "summary:")):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {out}")


def _inclusive(out):
    """{function: inclusive instructions} of a callgrind output."""
    p = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--auto=no", "--threshold=100", out],
                       capture_output=True, text=True, check=True)
    found = {}
    for line in p.stdout.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+([^\s=].*?):(\S+)", line)
        if m:
            found[m.group(3)] = found.get(m.group(3), 0) + int(m.group(1).replace(",", ""))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--depth", type=int, default=10)
    ap.add_argument("--functions", type=int, default=0)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.batches, args.batch, args.depth)
    tasks = args.batches * args.batch
    print(f"Python {sys.version.split()[0]}: create_task + completion, {args.depth} Python frames deep, "
          f"instructions per task ({tasks} tasks: the difference of {args.batches} and {2 * args.batches} batches)")
    folder = tempfile.mkdtemp(prefix="cg-tasks-")
    per_task, functions = {}, {}
    for mode in args.modes.split(","):
        small, large = (os.path.join(folder, f"{mode}-{size}.out") for size in ("small", "large"))
        per_task[mode] = (_run(mode, 2 * args.batches, args.batch, args.depth, large) -
                          _run(mode, args.batches, args.batch, args.depth, small)) / tasks
        if mode == "tracked" and args.functions:
            more, fewer = _inclusive(large), _inclusive(small)
            functions = {name: (count - fewer.get(name, 0)) / tasks for name, count in more.items()}
        os.unlink(small)
        os.unlink(large)
        line = f"  {mode:11} {per_task[mode]:9,.0f}"
        if mode != "untracked" and "untracked" in per_task:
            base = per_task["untracked"]
            line += f"   +{per_task[mode] - base:,.0f}   {per_task[mode] / base:.2f}x untracked"
        print(line)
    if functions:
        print("inclusive instructions per task, tracked:")
        for name, count in sorted(functions.items(), key=lambda kv: -kv[1])[:args.functions]:
            print(f"  {count:9,.0f}  {name}")
    os.rmdir(folder)


if __name__ == "__main__":
    main()
