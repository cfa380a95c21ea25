"""Cost of spawn tracking: btcore.enable_spawn_tracking() against gevent's own
config.track_greenlet_tree, in time per spawn and in memory per live greenlet.

Time: gevent.Greenlet(f) created DEPTH (default 20) Python frames deep inside
a gevent greenlet, three ways, in interleaved rounds (A B C A B C ...):

  neither   gevent's track_greenlet_tree off, btcore's tracking off
  gevent    gevent's track_greenlet_tree on (10 Python frames, one generation)
  btcore    btcore's tracking on (the defaults: native + Python frames, all
            generations), gevent's off

Times are the thread's CPU time (the machine is shared: wall time would
count other processes).  The added cost of each is its time minus
"neither" in the same round; the median over rounds is printed with the
spread (min..max).  For a figure that does not move with machine load,
count instructions instead (see docs/design.md, "Spawn tracking").

Memory: RSS per live tracked greenlet, for 50 000 gevent.Greenlet objects
(gevent's tracking off) that share one spawn site and for 50 000 created
from 50 000 different sites (the same 20-frame shape, differing in the call
sites of four levels).  Each case runs in a fresh process, once with btcore's
tracking on and once off; the difference, divided by the count, is printed.

gunicorn + Flask (issue 24): a real gunicorn (gevent worker) serving a
Flask view that times gevent.spawn(f).join() (its own thread's CPU time) in
interleaved rounds with tracking off and on (the defaults; on since the
worker loaded the app, so the request greenlet itself is tracked), from the
view itself and from --app-depth more Python frames below it entered through
C every 4th (a deeper app); the child's spawn chain (generations, frames,
truncated?) is printed with it.  Skipped when gunicorn or Flask is missing.

Targets (issue 11):
  btcore added <= 0.5x gevent added, and <= 1.0 us
  RSS per tracked greenlet <= 256 bytes (one site), <= 1.5 KiB (distinct sites)
Targets (issue 24):
  gunicorn + Flask: spawn + join tracked <= 1.25x untracked

Usage: python benchmarks/bench_spawn.py [--rounds N] [--depth D] [--count N] [--app-depth D]
                                        [--capacity C] [--gunicorn-only]
Prints a report; exits 0 whatever the result (this is a report, not a test).
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import gevent
from gevent import config

import btcore
import btcore.capture.spawn  # DEFAULT_CAPACITY (not imported by btcore itself)


# CPU time of this thread: the machine is shared, and wall time would count
# the time other processes ran.
clock = time.thread_time_ns


def f():
    pass


def create_many(depth, n):
    """ns per gevent.Greenlet(f), created `depth` Python frames below here."""
    if depth > 1:
        return create_many(depth - 1, n)
    t0 = clock()
    for _ in range(n):
        gevent.Greenlet(f)
    return (clock() - t0) / n


def set_mode(mode):
    config.track_greenlet_tree = mode == "gevent"
    if mode == "btcore":
        btcore.enable_spawn_tracking()
    else:
        btcore.disable_spawn_tracking()


def time_rounds(rounds, depth, n):
    modes = ("neither", "gevent", "btcore")
    runs = {m: [] for m in modes}
    for _ in range(rounds + 1):          # round 0 warms up and is dropped
        for m in modes:
            set_mode(m)
            runs[m].append(create_many(depth, n))
    set_mode("neither")
    return {m: v[1:] for m, v in runs.items()}


def report_time(rounds, depth, n):
    runs = gevent.spawn(time_rounds, rounds, depth, n).get()
    added = {m: [t - base for t, base in zip(runs[m], runs["neither"])] for m in ("gevent", "btcore")}
    print(f"time per gevent.Greenlet(f), {depth} Python frames deep, {rounds} interleaved rounds of {n}:")
    print(f"  neither  {statistics.median(runs['neither']):7.0f} ns")
    for m in ("gevent", "btcore"):
        a = added[m]
        print(f"  {m:7s}  {statistics.median(runs[m]):7.0f} ns   added {statistics.median(a):6.0f} ns "
              f"(spread {min(a):.0f}..{max(a):.0f})")
    ratios = [b / g for b, g in zip(added["btcore"], added["gevent"]) if g > 0]
    print(f"  btcore added / gevent added: {statistics.median(ratios):.2f} "
          f"(per round {min(ratios):.2f}..{max(ratios):.2f})   target <= 0.5")
    print(f"  btcore added: {statistics.median(added['btcore']) / 1000:.2f} us   target <= 1.0 us")


# ---- memory: each case in a fresh process ----

CHILD = r'''
import sys
import gevent
from gevent import config
import btcore

config.track_greenlet_tree = False
mode, count, tracked = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "on"

def f():
    pass

def make(k):
    return gevent.Greenlet(f)

# Distinct sites: four levels, each calling the next from one of 16 call
# sites chosen by a hex digit of i (16**4 = 65 536 different stacks).
src = ["def level4(i):\n    return make(i)\n"]
for level in (3, 2, 1, 0):
    body = "".join(f"    {'if' if d == 0 else 'elif'} digit == {d}:\n        return level{level + 1}(i)\n"
                   for d in range(16))
    src.append(f"def level{level}(i):\n    digit = (i >> {4 * level}) & 15\n{body}")
exec("".join(src))

def deep(n, fn, i):
    return deep(n - 1, fn, i) if n else fn(i)

def rss():
    with open("/proc/self/statm") as s:
        return int(s.read().split()[1]) * 4096

def run():
    if tracked:
        btcore.enable_spawn_tracking()
    site = level0 if mode == "distinct" else make
    deep(14, site, 0)                    # warm: tables, caches
    keep = []
    before = rss()
    for i in range(count):
        keep.append(deep(14, site, i))
    print(rss() - before)

gevent.spawn(run).join()
'''


def rss_delta(mode, count, tracked):
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(count), "on" if tracked else "off"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[-1])


def report_memory(count, repeat=3):
    print(f"RSS per live tracked greenlet ({count} gevent.Greenlet objects, fresh process per run):")
    for mode, target in (("shared", 256), ("distinct", 1536)):
        per = []
        for _ in range(repeat):          # interleaved: off, on, off, on, ...
            off = rss_delta(mode, count, False)
            on = rss_delta(mode, count, True)
            per.append((on - off) / count)
        label = "one shared site" if mode == "shared" else "distinct sites"
        print(f"  {label:16s} {statistics.median(per):6.0f} bytes (spread {min(per):.0f}..{max(per):.0f})"
              f"   target <= {target}")


# ---- gunicorn + Flask: spawn + join from a real handler ----

APP = r'''
import json, time
import gevent
from flask import Flask, request
import btcore

btcore.enable_spawn_tracking()      # the defaults, from the worker's start
app = Flask(__name__)
clock = time.thread_time_ns
chains = {}


def f():
    chains.setdefault("child", btcore.spawn_chain(gevent.getcurrent()))


def spawn_join(n):
    t0 = clock()
    for _ in range(n):
        gevent.spawn(f).join()
    return (clock() - t0) / n


def descend(depth, then):
    if depth == 0:
        return then()
    if depth % 4:
        return descend(depth - 1, then)
    out = []
    sorted([0], key=lambda _: out.append(descend(depth - 1, then)))
    return out[0]


@app.route("/bench")
def bench():
    rounds, n, depth, capacity = (int(request.args[k]) for k in ("rounds", "n", "depth", "capacity"))
    on = lambda: btcore.enable_spawn_tracking(capacity=capacity)
    runs = {"off": [], "on": []}
    for r in range(rounds + 1):                     # round 0 warms up and is dropped
        for mode in (("off", "on") if r % 2 else ("on", "off")):
            (on if mode == "on" else btcore.disable_spawn_tracking)()
            runs[mode].append(descend(depth, lambda: spawn_join(n)))
    on()
    chains.clear()
    descend(depth, lambda: gevent.spawn(f).join())
    chain = chains["child"]
    bt = btcore.chain_backtrace(chain)
    return json.dumps({"off": runs["off"][1:], "on": runs["on"][1:], "generations": len(chain.links),
                       "site_frames": [len(site) for site, _, _ in chain.links], "frames": len(bt),
                       "truncated": bt.truncated})
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_serving(port, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def report_gunicorn(rounds, n, depths, capacity):
    try:
        import flask  # noqa: F401
        import gunicorn  # noqa: F401
    except ImportError as e:
        print(f"gunicorn + Flask: skipped ({e})")
        return
    with tempfile.TemporaryDirectory() as where:
        with open(os.path.join(where, "bench_app.py"), "w") as out:
            out.write(APP)
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-k", "gevent", "-w", "1", "-b",
                                 f"127.0.0.1:{port}", "--chdir", where, "--log-level", "warning", "bench_app:app"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            if not wait_serving(port, proc):
                print(f"gunicorn + Flask: the server did not start: {proc.stderr.read()[-500:] if proc.poll() else ''}")
                return
            print(f"gunicorn + Flask (gevent worker): gevent.spawn(f).join() from a request handler, "
                  f"{rounds} interleaved rounds of {n}, tracking capacity {capacity}:")
            for depth in depths:
                url = f"http://127.0.0.1:{port}/bench?rounds={rounds}&n={n}&depth={depth}&capacity={capacity}"
                got = json.loads(urllib.request.urlopen(url, timeout=600).read())
                ratios = [on / off for on, off in zip(got["on"], got["off"])]
                where_ = "in the Flask view" if depth == 0 else f"{depth} Python frames below the view"
                print(f"  {where_}: untracked {statistics.median(got['off']) / 1000:.2f} us, "
                      f"tracked {statistics.median(got['on']) / 1000:.2f} us, tracked / untracked "
                      f"{statistics.median(ratios):.2f} (per round {min(ratios):.2f}..{max(ratios):.2f})"
                      f"   target <= 1.25")
                print(f"    the child's chain: {got['generations']} generations, sites of {got['site_frames']} "
                      f"frames, {got['frames']} frames in all, truncated: {got['truncated']}")
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--n", type=int, default=2000, help="greenlets per timed round")
    ap.add_argument("--count", type=int, default=50_000, help="live greenlets for the memory figures")
    ap.add_argument("--app-depth", type=int, default=24, help="a deeper app: Python frames below the Flask view")
    ap.add_argument("--capacity", type=int, default=btcore.capture.spawn.DEFAULT_CAPACITY,
                    help="the tracking capacity in the gunicorn + Flask runs (32: the default before issue 24)")
    ap.add_argument("--gunicorn-only", action="store_true", help="only the gunicorn + Flask runs")
    args = ap.parse_args()
    if not args.gunicorn_only:
        report_time(args.rounds, args.depth, args.n)
        report_memory(args.count)
    report_gunicorn(args.rounds, args.n, (0, args.app_depth), args.capacity)


if __name__ == "__main__":
    main()
