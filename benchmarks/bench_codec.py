"""Compact tokens: size per frame and the cost of encode().

Sizes (characters of the whole token, prefix and module table included,
divided by the raw frames it holds; targets: native-only <= 6, merged <= 16):
  shallow     the stack a small script has inside json's object_hook
              (Python -> C -> Python), merged and native-only
  deep        the bottom of a 30-deep recursion that goes through C at every
              level (map -> lambda -> ...), merged and native-only
  showcase    every distinct stack of the gevent showcase's snapshot
              (btcore/showcase.py: what dump_all() prints), each encoded

Time, in interleaved rounds (benchmarks/timing.py), on a 40-frame merged
trace (collect(limit=40) at the bottom of the deep recursion):
  collect()          the capture of that stack (timed at the bottom of the
                     same recursion), for scale
  encode()           steady state: the C encoder knows the trace's modules
                     (every encode() writes the whole token: there is no
                     token cache)
  encode, new        a trace whose Python frames' lines are not cached
                     (the line cache emptied first, which is part of the
                     time): what a stack never encoded before costs once
                     its modules are known
  encode, cold       the first encode() in a process: the C encoder forgets
                     every module first and is taught them again (Python
                     computes each module's table entry)
  encode, reference  the Python reference encoder (codec._encode), for scale
Target: encode() <= 2 us; its ratio to collect() is printed.

Runs against the installed btcore (pip install .), from any directory; the
showcase needs gevent.  Usage: python benchmarks/bench_codec.py [--rounds N]
"""
import argparse
import json
import statistics

import btcore
from btcore import codec

from timing import interleaved, ratio, spread

DEPTH = 30


def through_c(depth, at_bottom):
    """depth levels of Python -> map() (C) -> lambda (Python)."""
    if depth:
        return list(map(lambda d: through_c(d, at_bottom), [depth - 1]))[0]
    return at_bottom()


def traces():
    """{name: Backtrace} of the size rows."""
    def leaf(**kw):
        return json.loads('{"a": 1}', object_hook=lambda obj: btcore.collect(**kw))

    return {
        "shallow merged": leaf(),
        "shallow native-only": leaf(python=False),
        "deep merged": through_c(DEPTH, lambda: btcore.collect(capacity=256)),
        "deep native-only": through_c(DEPTH, lambda: btcore.collect(capacity=256, python=False)),
    }


def size_row(name, backtraces):
    chars = sum(len(bt.encode()) for bt in backtraces)
    frames = sum(len(bt) for bt in backtraces)
    modules = statistics.mean(len(btcore.decode(bt.encode()).modules) for bt in backtraces)
    print(f"{name:<34} {len(backtraces):>6} {frames:>7} {chars:>7} {modules:>8.1f} {chars / frames:>11.2f}")


def showcase_stacks():
    """The distinct stacks of the showcase's greenlets (dump_all's groups),
    merged, and native-only (collect(g, python=False) of the same greenlets)."""
    try:
        import gevent
    except ImportError:
        return None, None, None
    from btcore import showcase
    greenlets, release = showcase._build(gevent)
    gevent.sleep(0.01)
    merged, native = {}, {}
    for info in btcore.snapshot():
        bt = info.backtrace
        if bt is not None and len(bt):
            merged.setdefault((bytes(bt._raw), bt.truncated), bt)
        if info.state == "suspended":
            bt = btcore.collect(info.greenlet, python=False, capacity=128)
            native.setdefault((bytes(bt._raw), bt.truncated), bt)
    return list(merged.values()), list(native.values()), lambda: (release(), gevent.joinall(greenlets, timeout=5))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    print(f"{'trace':<34} {'tokens':>6} {'frames':>7} {'chars':>7} {'modules':>8} {'chars/frame':>11}")
    for name, bt in traces().items():
        size_row(name, [bt])
    merged, native, release = showcase_stacks()
    if merged is None:
        print("showcase: gevent is not installed")
    else:
        try:
            size_row("showcase merged: distinct stacks", merged)
            size_row("showcase native-only", native)
        finally:
            release()

    forty = through_c(DEPTH, lambda: btcore.collect(limit=40))
    assert len(forty) == 40, len(forty)
    forty.encode()   # warm: the modules taught

    def cold():
        codec.lib.btc_encode_forget(1, 1)
        codec._places.cache.clear()
        return forty.encode()

    def new_lines():
        codec.lib.btc_encode_forget(0, 1)
        return forty.encode()

    # collect() at the bottom of the same recursion: the same 40 frames
    runs = through_c(DEPTH, lambda: interleaved({
        "collect": lambda: btcore.collect(limit=40),
        "encode": forty.encode,
        "encode_new": new_lines,
        "encode_cold": cold,
        "reference": lambda: codec._encode(forty),
    }, args.rounds))
    print(f"\n40-frame merged trace, {args.rounds} interleaved rounds: median ns (min-max)")
    for name, values in runs.items():
        print(f"  {name:<14} {spread(values).text(0)}")
    print(f"  encode() / collect()        {ratio(runs['encode'], runs['collect']).text()}")
    print(f"  new-trace encode / collect() {ratio(runs['encode_new'], runs['collect']).text()}")
    print(f"  cold encode / collect()     {ratio(runs['encode_cold'], runs['collect']).text()}")
    print(f"  reference / collect()       {ratio(runs['reference'], runs['collect']).text()}")
    print(f"  token: {len(forty.encode())} characters for 40 raw frames")


if __name__ == "__main__":
    main()
