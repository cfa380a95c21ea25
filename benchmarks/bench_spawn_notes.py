"""Cost of exception notes (issue 27): what enable_spawn_tracking()'s
exception_notes adds, with spawn tracking on in every case.

  switch      g.switch() between two greenlets, nothing raised: greenlet's
              own method against btcore's noting one (both descriptors
              called directly, in interleaved rounds)
  escape      a tracked greenlet created and switched to, its run raising,
              the exception caught: greenlet's own switch against the noting
              one (the note's text found in the rendered-chain cache: the
              same chain failing again)
  gevent      what the wrapped Hub.handle_error adds before gevent's own
              handling: the note of a fresh exception from a tracked gevent
              Greenlet (cached text)
  first       the first note of a chain in a fresh process (names resolved,
              cold caches): once, in a subprocess

Targets (issue 27): nothing on the path where nothing fails; <= 2 us added per
escaping exception.

Times are the thread's CPU time per call, in interleaved rounds; the added
cost is each round's difference, its median printed with the spread.

Usage: python benchmarks/bench_spawn_notes.py [--rounds N]
Prints a report; exits 0 whatever the result (this is a report, not a test).
"""
import argparse
import os
import subprocess
import sys
import time

import gevent
import greenlet

import btcore
from btcore.capture import spawn_notes

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import spread  # noqa: E402

OWN_SWITCH = greenlet.greenlet.__dict__["switch"]


def ping_pong(switch):
    """A callable switching once into a greenlet that switches straight back."""
    def bounce():
        parent = greenlet.getcurrent().parent
        while True:
            parent.switch()
    g = greenlet.greenlet(bounce)
    return lambda: switch(g)


def raiser():
    raise ValueError("escapes")


def escape(switch):
    def once():
        try:
            switch(greenlet.greenlet(raiser))
        except ValueError:
            pass
    return once


def interleaved_cpu(fns, rounds, loops):
    """{name: [ns of the thread's CPU time per call, one per round]}: every
    round runs each callable `loops` times, the order reversed every other
    round (CPU time: the machine is shared; wall time counts others' work)."""
    for fn in fns.values():   # warm: the first note of a chain renders it
        fn()
    runs = {name: [] for name in fns}
    for r in range(rounds):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            fn = fns[name]
            t0 = time.thread_time_ns()
            for _ in range(loops):
                fn()
            runs[name].append((time.thread_time_ns() - t0) / loops)
    return runs


def first_note_seconds():
    code = ("import time, greenlet, btcore\n"
            "btcore.enable_spawn_tracking()\n"
            "g = greenlet.greenlet(lambda: 1 / 0)\n"
            "t0 = time.perf_counter()\n"
            "try: g.switch()\n"
            "except ZeroDivisionError as e: assert e.__notes__\n"
            "print(time.perf_counter() - t0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return float(out.stdout)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    rounds = parser.parse_args().rounds
    btcore.enable_spawn_tracking()
    noted_switch = greenlet.greenlet.__dict__["switch"]
    assert noted_switch is not OWN_SWITCH

    runs = interleaved_cpu({"own": ping_pong(OWN_SWITCH), "noted": ping_pong(noted_switch)}, rounds, 50_000)
    added = spread([b - a for a, b in zip(runs["own"], runs["noted"])])
    print(f"switch, nothing raised: greenlet's own {spread(runs['own']).text(1)} ns, "
          f"noting {spread(runs['noted']).text(1)} ns, added {added.text(1)} ns")

    runs = interleaved_cpu({"own": escape(OWN_SWITCH), "noted": escape(noted_switch)}, rounds, 5_000)
    added = spread([(b - a) / 1000 for a, b in zip(runs["own"], runs["noted"])])
    print(f"escaping exception (create + switch + raise + catch): own {spread(runs['own']).text(0)} ns, "
          f"noted {spread(runs['noted']).text(0)} ns, added {added.text(2)} us   (target <= 2 us)")

    glet = gevent.spawn(lambda: None)
    glet.join()
    runs = interleaved_cpu({"bare": lambda: ValueError("x"),
                            "noted": lambda: spawn_notes._note_quietly(ValueError("x"), glet)}, rounds, 20_000)
    added = spread([(b - a) / 1000 for a, b in zip(runs["bare"], runs["noted"])])
    print(f"gevent Hub.handle_error wrapper, added per error: {added.text(2)} us   (target <= 2 us)")

    firsts = [first_note_seconds() for _ in range(3)]
    print(f"first note of a chain in a fresh process: {spread(firsts).text(3)} s (names resolved cold)")


if __name__ == "__main__":
    main()
