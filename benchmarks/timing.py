"""Timing shared by the benchmarks: interleaved rounds, ratios with their spread.

Two methods timed one after the other are compared across whatever the
machine did in between: one noisy moment decides the ratio.  Here every
round runs every method once, in turn (the order reversed every other round,
so neither side always runs first), each round gives its own ratio, and the
spread of those per-round ratios is printed with their median.
"""
import statistics
import subprocess
import time
from typing import NamedTuple


class Spread(NamedTuple):
    median: float
    low: float
    high: float

    def text(self, digits=2):
        return f"{self.median:.{digits}f} ({self.low:.{digits}f}-{self.high:.{digits}f})"


def spread(values):
    return Spread(statistics.median(values), min(values), max(values))


def loops_for(fn, target_s=0.02):
    """Size a loop like timeit: one run of it takes >= target_s."""
    loops = 1
    while True:
        t0 = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        dt = time.perf_counter_ns() - t0
        if dt >= target_s * 1e9 or loops >= 1 << 22:
            return loops
        loops *= 2 if dt > target_s * 1e8 else 10


def _one_run(fn, loops):
    t0 = time.perf_counter_ns()
    for _ in range(loops):
        fn()
    return (time.perf_counter_ns() - t0) / loops


def _rounds(names, rounds):
    """The order of the names in each round: as given, then reversed, ..."""
    for r in range(rounds):
        yield names if r % 2 == 0 else names[::-1]


def interleaved(fns, rounds):
    """{name: [ns per call, one value per round]} for the callables in fns."""
    loops = {name: loops_for(fn) for name, fn in fns.items()}
    runs = {name: [] for name in fns}
    for order in _rounds(list(fns), rounds):
        for name in order:
            runs[name].append(_one_run(fns[name], loops[name]))
    return runs


def interleaved_processes(commands, rounds, timeout=300):
    """{name: [seconds, one value per round]}: each command (an argv list)
    run as a whole process, start to exit, round after round."""
    runs = {name: [] for name in commands}
    for order in _rounds(list(commands), rounds):
        for name in order:
            t0 = time.perf_counter()
            subprocess.run(commands[name], capture_output=True, check=True, timeout=timeout)
            runs[name].append(time.perf_counter() - t0)
    return runs


def ratio(numerator, denominator):
    """Spread of the per-round ratios numerator[i] / denominator[i]."""
    return spread([a / b for a, b in zip(numerator, denominator)])


def ratio_minus(numerator, denominator, overhead):
    """Per-round ratio after subtracting that round's overhead from both sides."""
    return spread([(a - o) / (b - o) for a, b, o in zip(numerator, denominator, overhead)])
