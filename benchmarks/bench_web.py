"""What btcore.web costs the program it runs in: loop lag and descriptors.

The program is tests/fixtures/web_target.py (gevent: N greenlets parked on
an Event, a ticker greenlet sleeping 1 ms in a loop, btcore.web.serve() in
the hub).  Measured from outside, over loopback:

  loop lag per request   the largest gap between two ticks of the program's
                         ticker while a GET of the page was in flight (the
                         ticker's own period, ~1 ms, is the floor); median and
                         worst of the rounds, one request at a time; and the
                         same over the window btcore.views.html.page() ran in alone
                         (the render's share; the rest is the snapshot's)
  10 concurrent GETs     the same, over 10 requests sent at once
  snapshot               btcore.snapshot() alone in the program's hub (median):
                         the part of a request that still runs in the loop
  idle connections       1,100 connections that send half a request head and
                         wait, under RLIMIT_NOFILE 1024 (the issue's case): the
                         program's open descriptors, and whether it can still
                         open 50 files of its own

"before" is the view as it was (issue 25): btcore.web.app's snapshot and
render in the hub, served by gevent's pywsgi with no limit (--inline).

Target (issue 25): loop lag <= 50 ms per request at 10,000 greenlets; 1,000
idle connections change nothing for the program's own descriptors.

Usage: python benchmarks/bench_web.py [--greenlets N] [--rounds R] [--no-before]
Imports the installed btcore.  Prints a table; exits 0 whatever the result.
"""
import argparse
import json
import os
import resource
import select
import socket
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, os.pardir, "tests", "fixtures", "web_target.py")
TIMEOUT = 120


class Target:
    def __init__(self, *options, stderr=None):
        self.proc = subprocess.Popen([sys.executable, "-P", TARGET, "gevent", *options],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True)
        info = self._answer()
        self.url, self.port = info["url"], info["address"][1]

    def _answer(self):
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT)
        if not ready:
            raise RuntimeError("the target did not answer")
        return json.loads(self.proc.stdout.readline())

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(TIMEOUT)

    def get(self):
        """GET the page; returns its size."""
        path = self.url.partition(str(self.port))[2]
        head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nConnection: close\r\n\r\n"
        with socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT) as sock:
            sock.sendall(head.encode())
            size = 0
            while chunk := sock.recv(1 << 16):
                size += len(chunk)
        return size


def largest_gap(times, start, end, from_start=False):
    """The largest gap between consecutive ticks over [start, end], the gaps
    across both ends included; from_start: counted from start, not from the
    tick before it (a window that begins when the loop has just been let go)."""
    inside = [t for t in times if start <= t <= end]
    before = [start] if from_start else [t for t in times if t < start][-1:]
    after = [t for t in times if t > end][:1]
    ticks = before + inside + after
    return max((b - a for a, b in zip(ticks, ticks[1:])), default=end - start)


def lag_per_request(target, rounds):
    """[(largest gap over the request, largest gap while btcore.views.html.page ran)] of each round."""
    target.get()     # warm: names resolved once, as in a long-running process
    lags = []
    for _ in range(rounds):
        start = time.monotonic()
        target.get()
        end = time.monotonic()
        time.sleep(0.05)            # a tick after the window
        times = target.ask("ticks")["times"]
        *_, page_start, page_end = target.ask("pages")[-1]
        lags.append((largest_gap(times, start, end), largest_gap(times, page_start, page_end, from_start=True)))
    return lags


def lag_concurrent(target, n=10):
    barrier = threading.Barrier(n)

    def one():
        barrier.wait()
        target.get()

    clients = [threading.Thread(target=one) for _ in range(n)]
    start = time.monotonic()
    for client in clients:
        client.start()
    for client in clients:
        client.join(TIMEOUT)
    end = time.monotonic()
    time.sleep(0.05)
    return largest_gap(target.ask("ticks")["times"], start, end), end - start


def idle_connections(target, n):
    """(descriptors before, descriptors while n idle connections are held (or why not known),
    opening 50 files: error or None)."""
    before = target.ask("fds")["fds"]
    held = []
    for _ in range(n):
        try:
            sock = socket.create_connection(("127.0.0.1", target.port), timeout=5)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            held.append(sock)
        except OSError:
            pass
    time.sleep(0.5)           # let the program accept what it will
    during = target.ask("fds")
    during = during.get("fds", during.get("error"))
    opened = target.ask("open 50")
    for sock in held:
        sock.close()
    return before, during, opened["error"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--greenlets", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--no-before", action="store_true")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    import btcore
    print(f"btcore {btcore.__version__}: the web view in a gevent program with {args.greenlets} parked greenlets, "
          f"{args.rounds} requests one at a time (ms)")
    kinds = [("now", [])] + ([] if args.no_before else [("before", ["--inline"])])
    for name, options in kinds:
        target = Target("--greenlets", str(args.greenlets), *options)
        try:
            size = target.get()
            lags = lag_per_request(target, args.rounds)
            concurrent, wall = lag_concurrent(target)
            renders = len(target.ask("pages"))
            snapshot = statistics.median(target.ask(f"snapshot {args.rounds}"))
        finally:
            target.close()
        whole, render = [lag for lag, _ in lags], [lag for _, lag in lags]
        print(f"  {name:7s} loop lag per request: median {statistics.median(whole) * 1e3:7.1f}, "
              f"worst {max(whole) * 1e3:7.1f}   during the page's render alone: median "
              f"{statistics.median(render) * 1e3:.1f}, worst {max(render) * 1e3:.1f}")
        print(f"  {'':7s} 10 concurrent GETs: lag {concurrent * 1e3:7.1f} "
              f"(all answered in {wall * 1e3:.0f})   page {size / 1e6:.2f} MB, {renders} renders in all")
        print(f"  {'':7s} snapshot alone: median {snapshot * 1e3:.1f}")
    print("idle connections: 1,100 connections holding half a request head, the program under RLIMIT_NOFILE 1024")
    for name, options in kinds:
        # pywsgi (before) prints each EMFILE of its accept loop: not the figures
        target = Target("--nofile", "1024", *options, stderr=subprocess.DEVNULL)
        try:
            before, during, error = idle_connections(target, 1100)
        finally:
            target.close()
        print(f"  {name:7s} program's descriptors {before} -> {during}; its own open() of 50 files: "
              f"{'ok' if error is None else error}")
    print("targets: loop lag <= 50 ms per request at 10,000 greenlets; idle connections change nothing "
          "for the program's own descriptors")


if __name__ == "__main__":
    main()
