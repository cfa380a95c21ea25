"""Symbolization cost: btcore's native DWARF engine against binutils addr2line.

  cold   first resolution of a real ~40-frame trace whose native frames lie in
         libpython, in a fresh process (file opened, sections read, units
         decoded), against one batched `addr2line -f -i -C` run over the same
         addresses (a whole process, which is what a tool shelling out pays)
  warm   the same addresses again through the C API (the Python-level frame
         cache sits on top of this and is cheaper still)
  memory bytes the native caches hold afterwards (btc_symbolize_memory)

The trace is real: a child process recurses through C (map -> lambda -> ...)
and takes glibc backtrace() through ctypes, then prints the return
addresses (minus one: the call instruction) that fall in libpython, as
module-relative addresses.

Run: python benchmarks/bench_resolve.py [--rounds N]
Needs btcore._native built from this tree (pip install -e . or the build
script) and binutils.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import time

LIBPYTHON = os.path.join(sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME"))

CAPTURE = r"""
import ctypes, sys
libc = ctypes.CDLL(None)
buf = (ctypes.c_void_p * 256)()
def deepest(n):
    if n:
        return list(map(deepest, [n - 1]))[0]
    return libc.backtrace(buf, 256)
count = deepest(int(sys.argv[1]))
maps = []
for line in open("/proc/self/maps"):
    parts = line.split()
    if len(parts) >= 6 and parts[5] == sys.argv[2]:
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        maps.append((lo, hi, int(parts[2], 16)))
base = min(lo - off for lo, hi, off in maps)
pcs = [buf[i] - 1 for i in range(count) if buf[i]]
print(" ".join("%x" % (pc - base) for pc in pcs if any(lo <= pc < hi for lo, hi, _ in maps)))
"""

COLD = r"""
import json, resource, sys, time
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
from btcore._native import ffi, lib
path = sys.argv[1].encode()
addrs = [int(a, 16) for a in sys.argv[2:]]
out = ffi.new("btc_srcframe[64]")
buf = ffi.new("char[65536]")
name = ffi.new("char[4096]")

def resolve_all():
    frames = 0
    for a in addrs:
        n = lib.btc_symbolize_file(path, a, out, 64, buf, len(buf))
        for i in range(n):
            if out[i].function != ffi.NULL:
                lib.btc_demangle(out[i].function, name, len(name))
        frames += max(n, 0)
    return frames

t0 = time.perf_counter()
frames = resolve_all()
cold = time.perf_counter() - t0
t0 = time.perf_counter()
for _ in range(20):
    resolve_all()
warm = (time.perf_counter() - t0) / 20
print(json.dumps({"cold_s": cold, "warm_s": warm, "frames": frames,
                  "memory": lib.btc_symbolize_memory(),
                  "rss_growth_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0}))
"""


def trace_addresses(depth):
    out = subprocess.run([sys.executable, "-c", CAPTURE, str(depth), os.path.realpath(LIBPYTHON)],
                         capture_output=True, text=True, check=True).stdout.split()
    return out


def addr2line_seconds(addrs):
    t0 = time.perf_counter()
    subprocess.run(["addr2line", "-f", "-i", "-C", "-e", LIBPYTHON] + ["0x" + a for a in addrs],
                   capture_output=True, check=True)
    return time.perf_counter() - t0


def cold_run(addrs):
    out = subprocess.run([sys.executable, "-c", COLD, os.path.realpath(LIBPYTHON)] + addrs,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def warm_frames_ns(depth=30, total=10_000):
    """ns per Frame for Backtrace.frames() once every address is cached:
    what an introspection command pays the second time it prints a stack."""
    import btcore

    def deepest(n):
        return deepest(n - 1) if n else btcore.collect(capacity=256)

    bt = deepest(depth)
    per_call = len(bt.frames())   # the first call resolves and fills the cache
    calls = max(1, total // per_call)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            bt.frames()
        best = min(best, (time.perf_counter_ns() - t0) / (calls * per_call))
    return best, calls * per_call


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--depth", type=int, default=6, help="map() levels; each adds ~6 libpython frames")
    args = ap.parse_args()
    addrs = trace_addresses(args.depth)
    runs = [cold_run(addrs) for _ in range(args.rounds)]
    oracle = [addr2line_seconds(addrs) for _ in range(args.rounds)]
    cold = statistics.median(r["cold_s"] for r in runs)
    a2l = statistics.median(oracle)
    warm = statistics.median(r["warm_s"] for r in runs)
    frames = runs[0]["frames"]
    print(f"trace: {len(addrs)} native frames in {LIBPYTHON}, {frames} source frames with inlines")
    print(f"cold, btcore native (fresh process, median of {args.rounds}): {cold * 1e3:8.2f} ms")
    print(f"one batched addr2line -f -i -C run:                    {a2l * 1e3:8.2f} ms")
    print(f"cold ratio btcore / addr2line: {cold / a2l:.2f} (target <= 2, stretch < 1)")
    print(f"warm, C API per address (no Python cache): {warm / len(addrs) * 1e9:8.0f} ns")
    print(f"memory held by the native caches: {runs[0]['memory'] / 2**20:.1f} MiB "
          f"(process max RSS grew {runs[0]['rss_growth_kb'] / 1024:.1f} MiB)")
    ns, n = warm_frames_ns()
    print(f"warm, Backtrace.frames() through the frame cache: {ns:6.0f} ns per frame over {n} frames "
          f"(target <= 1000) {'PASS' if ns <= 1000 else 'MISS'}")


if __name__ == "__main__":
    main()
