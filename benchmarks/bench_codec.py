"""Compact tokens: size per frame and the cost of encode().

Sizes (characters of the whole token, prefix and module table included,
divided by the raw frames it holds; targets: native-only <= 5, merged <= 12,
repetitive (deep) traces <= 1.5x zlib):
  shallow     the stack a small script has inside json's object_hook
              (Python -> C -> Python), merged and native-only
  ffi         inside a ctypes callback that libc's qsort() calls (Python ->
              _ctypes -> libffi -> libc -> libffi -> Python): a short stack
              over more modules, as foreign-function stacks are
  deep        the bottom of a 30-deep recursion that goes through C at every
              level (map -> lambda -> ...), merged and native-only
  showcase    every distinct stack of the gevent showcase's snapshot
              (btcore/views/showcase.py: what dump_all() prints), each encoded
The same for format 3 (the reference encoder's, for comparison), and for
zlib: characters of base64url(zlib.compress(raw records, 9)) per frame, a
general compressor of the raw list (which holds no module identity and no
names: it cannot be decoded elsewhere), and the token's size over it.

Time, in interleaved rounds (benchmarks/timing.py), on a 40-frame merged
trace (collect(limit=40) at the bottom of the deep recursion):
  collect()          the capture of that stack (timed at the bottom of the
                     same recursion), for scale
  encode()           steady state: the C encoder knows the trace's modules
                     (every encode() writes the whole token: there is no
                     token cache)
  encode, new        a trace whose Python frames are not cached (lines and
                     coded strings forgotten first): what a stack never
                     encoded before costs once its modules are known; the
                     ratio is printed without the forgetting, which is
                     timed alone in the same rounds ("forget")
  encode, cold       the C encoder forgets every module first and is taught
                     them again (Python computes each module's table entry;
                     the process-wide lists of loaded modules and searched
                     places are kept)
  encode, reference  the Python reference encoder (codec._encode), for scale
  first in a process the first encode() of a fresh interpreter (a child
                     process per run): that also lists the loaded modules
                     and the places decoders search (sysconfig)
Target: encode() <= 1.0x collect(); the ratio is printed.

Runs against the installed btcore (pip install .), from any directory; the
showcase needs gevent.  Usage: python benchmarks/bench_codec.py [--rounds N]
"""
import argparse
import base64
import ctypes
import json
import os
import statistics
import subprocess
import sys
import zlib

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
        "ffi merged": in_qsort(),
        "ffi native-only": in_qsort(python=False),
        "deep merged": through_c(DEPTH, lambda: btcore.collect(capacity=256)),
        "deep native-only": through_c(DEPTH, lambda: btcore.collect(capacity=256, python=False)),
    }


def in_qsort(**kw):
    """A backtrace taken in a ctypes comparison function libc's qsort() calls."""
    got = []
    compare = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(
        lambda a, b: got.append(btcore.collect(**kw)) or 0)
    items = (ctypes.c_int * 2)(2, 1)
    ctypes.CDLL(None).qsort(items, 2, ctypes.sizeof(ctypes.c_int), compare)
    return got[0]


def zlib_chars(bt) -> int:
    return len(base64.urlsafe_b64encode(zlib.compress(bytes(bt._raw), 9)).rstrip(b"="))


def size_row(name, backtraces):
    chars = sum(len(bt.encode()) for bt in backtraces)
    format_3 = sum(len(codec._encode(bt, version=3)) for bt in backtraces)
    squeezed = sum(zlib_chars(bt) for bt in backtraces)
    frames = sum(len(bt) for bt in backtraces)
    modules = statistics.mean(len(btcore.decode(bt.encode()).modules) for bt in backtraces)
    print(f"{name:<34} {len(backtraces):>6} {frames:>7} {chars:>7} {modules:>8.1f} {chars / frames:>11.2f}"
          f" {format_3 / frames:>9.2f} {squeezed / frames:>6.2f} {chars / squeezed:>7.2f}")


def showcase_stacks():
    """The distinct stacks of the showcase's greenlets (dump_all's groups),
    merged, and native-only (collect(g, python=False) of the same greenlets)."""
    try:
        import gevent
    except ImportError:
        return None, None, None
    from btcore.views import showcase
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

    print(f"{'trace':<34} {'tokens':>6} {'frames':>7} {'chars':>7} {'modules':>8} {'chars/frame':>11}"
          f" {'format 3':>9} {'zlib':>6} {'/ zlib':>7}")
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

    def forget_objects():
        codec.lib.btc_encode_forget(0, 1)

    def new_trace():
        forget_objects()
        return forty.encode()

    # collect() at the bottom of the same recursion: the same 40 frames
    runs = through_c(DEPTH, lambda: interleaved({
        "collect": lambda: btcore.collect(limit=40),
        "encode": forty.encode,
        "encode_new": new_trace,
        "forget": forget_objects,
        "encode_cold": cold,
        "reference": lambda: codec._encode(forty),
    }, args.rounds))
    print(f"\n40-frame merged trace, {args.rounds} interleaved rounds: median ns (min-max)")
    for name, values in runs.items():
        print(f"  {name:<14} {spread(values).text(0)}")
    print(f"  encode() / collect()        {ratio(runs['encode'], runs['collect']).text()}")
    new = [n - f for n, f in zip(runs["encode_new"], runs["forget"])]
    print(f"  new-trace encode / collect() {ratio(new, runs['collect']).text()} (without the forgetting)")
    print(f"  cold encode / collect()     {ratio(runs['encode_cold'], runs['collect']).text()}")
    print(f"  reference / collect()       {ratio(runs['reference'], runs['collect']).text()}")
    print(f"  token: {len(forty.encode())} characters for 40 raw frames")
    first = statistics.median(first_encode_in_new_process() for _ in range(5))
    print(f"  first encode() in a new process: {first:.0f} ns (median of 5 processes)")


FIRST_ENCODE = """
import sys, time
sys.path.insert(0, sys.argv[1])
import btcore, bench_codec
forty = bench_codec.through_c(bench_codec.DEPTH, lambda: btcore.collect(limit=40))
start = time.perf_counter_ns()
forty.encode()
print(time.perf_counter_ns() - start)
"""


def first_encode_in_new_process() -> int:
    """ns of the first encode() of the 40-frame trace in a fresh interpreter."""
    here = os.path.dirname(os.path.abspath(__file__))
    return int(subprocess.run([sys.executable, "-c", FIRST_ENCODE, here], capture_output=True, text=True,
                              check=True, timeout=120).stdout)


if __name__ == "__main__":
    main()
