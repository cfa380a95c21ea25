"""The showcase: a small gevent program whose greenlets are parked everywhere a
real server's are, and btcore's dump of all of them (grouped, then as a tree).

Parked: 3 Python calls deep; inside C code that called back into Python
(sorted()'s key, re.sub()'s replacement, json's object_hook); in a socket
recv (five identical connection handlers: one group of five); on an Event,
a Queue, a Lock, a sleep; and a 3-generation spawn tree (a supervisor, its
workers, their tasks).  Everything is released and joined before run()
returns.
"""
from __future__ import annotations

import argparse
import json
import re
import sys


def _build(gevent):
    """Spawn the parked greenlets; returns (greenlets, release) with release() ending them all."""
    import gevent.event
    import gevent.lock
    import gevent.queue
    import gevent.socket

    gate = gevent.event.Event()        # what every "waits inside C" greenlet waits on
    orders = gevent.queue.Queue()
    lock = gevent.lock.Semaphore()
    lock.acquire()                     # held by the main greenlet until release()
    pairs = [gevent.socket.socketpair() for _ in range(5)]

    def after_the_gate(value):
        gate.wait()
        return value

    def validate(request):
        gate.wait()
        return request

    def parse(request):
        return validate(request.strip())

    def handle_request(request):
        return parse(request)

    def sort_by_key(items):
        # builtin sorted() (C) calls the key function (Python), which waits
        return sorted(items, key=lambda item: after_the_gate(item))

    def substitute(text):
        # the _sre C module calls the replacement function, which waits
        return re.sub(r"\d", lambda match: after_the_gate("#"), text)

    def decode(document):
        # the _json C module calls object_hook, which waits
        return json.loads(document, object_hook=lambda obj: after_the_gate(obj))

    def serve_connection(sock):
        return sock.recv(1)

    def consume():
        return orders.get()

    def update_shared_state():
        with lock:
            return True

    def task():
        gate.wait()

    def worker():
        gevent.spawn(task)
        gate.wait()

    def supervisor():
        gevent.spawn(worker)
        gevent.spawn(worker)
        gate.wait()

    greenlets = [
        gevent.spawn(handle_request, " GET / "),
        gevent.spawn(sort_by_key, [3, 1, 2]),
        gevent.spawn(substitute, "a1b"),
        gevent.spawn(decode, '{"a": 1}'),
        *[gevent.spawn(serve_connection, mine) for mine, _ in pairs],
        gevent.spawn(consume),
        gevent.spawn(update_shared_state),
        gevent.spawn(gevent.sleep, 3600),
        gevent.spawn(supervisor),
    ]

    def release():
        gate.set()
        orders.put("stop")
        lock.release()
        for _, theirs in pairs:
            theirs.sendall(b"x")
        gevent.sleep(0)
        gevent.killall(greenlets)      # the sleeper, and anything still parked
        for mine, theirs in pairs:
            mine.close()
            theirs.close()

    return greenlets, release


def run(argv=None) -> int:
    """python -m btcore demo: print the dump of the showcase's greenlets; 0 on success."""
    parser = argparse.ArgumentParser(prog="python -m btcore demo", description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=("text", "json", "html"), default="text")
    args = parser.parse_args(argv)
    try:
        import gevent
    except ImportError:
        print("the showcase needs gevent: pip install gevent", file=sys.stderr)
        return 1
    import btcore

    greenlets, release = _build(gevent)
    gevent.sleep(0.01)                 # let every greenlet run until it parks
    try:
        btcore.dump_all(sys.stdout, format=args.format)
    finally:
        release()
    gevent.joinall(greenlets, timeout=5)
    return 0
