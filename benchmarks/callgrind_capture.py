"""Instructions per native frame, btcore against libunwind (callgrind).

Wall-clock time on a shared machine varies by 2x; instruction counts do not.
This script, run under callgrind, walks the same C stack (a C recursion
`depth` deep, compiled here with cffi) with each method `calls` times; each
method's entry point is its own callgrind toggle, so its instructions are
counted alone, from the first entry into the recursion on (callgrind's
--zero-before: the warm-up call that builds the tables is not counted):

  libunwind   unw_backtrace()
  btcore      btc_backtrace() (the walk alone: registers, module lock, walk)
  collect     btc_collect() under collect(python=False), from a cffi callback
              at the bottom of the same recursion (adds the output, the
              Backtrace object and the eval-loop test per frame)
  libunwind-py  unw_backtrace() at the bottom of a Python recursion `depth`
              levels deep, each level called through C (operator.call):
              mixed Python and C frames
  merged      btc_collect() under collect() on that same stack
  greenlet    btc_collect() under collect(g) of a greenlet suspended at the
              bottom of such a recursion

btcore's captures use the capacity a caller sizing it for this stack would
pass: the smallest of 64 (collect()'s default), 256 and 1024 that holds the
whole stack, found by an uncounted capture first (printed).  Above 256
frames a capture allocates its buffers (~1,700 instructions a call: three
mallocs and their frees); --capacity N forces N.

Usage (prints instructions per call and per frame for each method):
  python benchmarks/callgrind_capture.py [--depth 250] [--calls 200] [--capacity N]
The script re-runs itself under valgrind once per method.
"""
import argparse
import operator
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

TOGGLES = {"libunwind": "*backtrace", "btcore": "btc_backtrace", "collect": "btc_collect",
           "libunwind-py": "*backtrace", "merged": "btc_collect", "greenlet": "btc_collect"}

CDEF = """
int recurse_call(int depth, int (*fn)(void));
"""
SOURCE = r"""
static volatile int sink;
__attribute__((noinline, noclone)) static int recurse_call(int depth, int (*fn)(void))
{
    int r = depth > 0 ? recurse_call(depth - 1, fn) : fn();
    sink = sink + 1;   /* no tail call: each level is a frame */
    return r;
}
"""


def driver():
    from cffi import FFI
    b = FFI()
    b.cdef(CDEF)
    b.set_source("_btcore_cg_driver", SOURCE, extra_compile_args=["-O2", "-g"])
    d = tempfile.mkdtemp(prefix="btcore-cg-")
    so = b.compile(tmpdir=d, verbose=False)
    import importlib.util
    spec = importlib.util.spec_from_file_location("_btcore_cg_driver", so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ffi, mod.lib


CAPACITIES = (64, 256, 1024)


def fitting(capacity, capture):
    """capacity if given, else the smallest of CAPACITIES that holds what
    capture(largest) captures."""
    if capacity:
        return capacity
    n = capture(CAPACITIES[-1])
    return next((c for c in CAPACITIES if n < c), CAPACITIES[-1])


def child(method, depth, calls, capacity):
    import btcore
    from btcore._native import ffi as bffi, lib as blib
    import peers
    pffi, plib = peers.load()
    ffi, lib = driver()
    frames = []
    if method == "libunwind":
        @ffi.callback("int(void)")
        def body():
            for _ in range(calls):
                frames.append(plib.unw_bt(1024))
            return 0
    elif method == "btcore":
        buf = bffi.new("uintptr_t[]", 1024)

        @ffi.callback("int(void)")
        def body():
            for _ in range(calls):
                frames.append(blib.btc_backtrace(buf, 1024))
            return 0
    elif method == "collect":
        size = []
        zero = ffi.callback("int(void)", lambda: 0)

        @ffi.callback("int(void)")
        def body():
            size[:] = [fitting(capacity, lambda c: len(btcore.collect(python=False, capacity=c)))]
            lib.recurse_call(0, zero)   # callgrind zeroes its counts here: the fitting capture is not counted
            for _ in range(calls):
                frames.append(len(btcore.collect(python=False, capacity=size[0])))
            return 0
    else:
        return python_stack(method, depth, calls, frames, plib, ffi, lib, capacity)
    body_calls = calls
    calls = 1
    # Warm, from inside the recursion: every module's table is built (the
    # driver's too, which a call from Python would not need); callgrind
    # zeroes its counts at each entry into recurse_call, so only the
    # measured recursion's deepest entry on is counted.
    lib.recurse_call(1, body)
    frames.clear()
    calls = body_calls
    lib.recurse_call(depth, body)
    print("FRAMES", frames[-1], "CAPACITY", size[0] if method == "collect" else "-")


def python_stack(method, depth, calls, frames, plib, ffi, lib, capacity):
    """The mixed stacks: a Python recursion `depth` deep; 'greenlet' runs it
    in a greenlet and captures that greenlet, suspended, from outside."""
    import btcore
    import greenlet
    capture = {"merged": lambda c: len(btcore.collect(capacity=c)),
               "libunwind-py": lambda c: plib.unw_bt(1024)}

    # Each level goes through C (operator.call: the interpreter's call
    # machinery and a new eval-loop call), as Python code calling Python
    # code through C extensions does; a plain Python recursion on 3.11 runs
    # in one eval-loop call and has a handful of native frames.
    def rec(n, at_bottom):
        return operator.call(rec, n - 1, at_bottom) if n else at_bottom()

    sys.setrecursionlimit(depth + 100)
    btcore.collect()   # warm: tables built, eval ranges found
    if method == "greenlet":
        g = greenlet.greenlet(lambda: rec(depth, greenlet.getcurrent().parent.switch))
        g.switch()
        btcore.collect(g)   # warm: greenlet's layout learned
        size = fitting(capacity, lambda c: len(btcore.collect(g, capacity=c)))
        lib.recurse_call(0, ffi.callback("int(void)", lambda: 0))   # callgrind zeroes its counts here
        for _ in range(calls):
            frames.append(len(btcore.collect(g, capacity=size)))
    else:
        size = []

        def bottom():
            size.append(fitting(capacity, capture[method]) if method == "merged" else "-")
            lib.recurse_call(0, ffi.callback("int(void)", lambda: 0))   # zero here
            for _ in range(calls):
                frames.append(capture[method](size[0]))
        rec(depth, bottom)
        size = size[0]
    print("FRAMES", frames[-1], "CAPACITY", size)


def measure(method, depth, calls, capacity):
    out = tempfile.mktemp(prefix="cg-", suffix=".out")
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
           f"--toggle-collect={TOGGLES[method]}", "--zero-before=recurse_call", sys.executable, __file__, "--child", method,
           "--depth", str(depth), "--calls", str(calls), "--capacity", str(capacity)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    m = re.search(r"FRAMES (\d+) CAPACITY (\S+)", p.stdout)
    if not m:
        raise RuntimeError(p.stdout + p.stderr)
    total = None
    with open(out) as f:
        for line in f:
            if line.startswith("totals:") or line.startswith("summary:"):
                total = int(line.split()[1])
    os.unlink(out)
    return total / calls, int(m.group(1)), m.group(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, default=250)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--capacity", type=int, default=0, help="btcore's capture capacity (0: the smallest that fits)")
    ap.add_argument("--child")
    ap.add_argument("--methods", default="libunwind,btcore,collect,libunwind-py,merged,greenlet")
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.depth, args.calls, args.capacity)
    print(f"C recursion {args.depth} deep (libunwind-py, merged, greenlet: Python recursion), {args.calls} calls each")
    print(f"{'method':12} {'instr/call':>12} {'frames':>7} {'instr/frame':>12} {'capacity':>9}")
    for method in args.methods.split(","):
        per_call, frames, capacity = measure(method, args.depth, args.calls, args.capacity)
        print(f"{method:12} {per_call:12.0f} {frames:7d} {per_call / frames:12.1f} {capacity:>9}")


if __name__ == "__main__":
    main()
