"""Native backtrace peers for benchmarks/bench_capture.py.

Compiles (cffi, API mode, at run time, cached in a temp directory keyed by the
source) a small C module exposing:

  glibc_bt(max)            glibc backtrace() into a static buffer; returns the count
  unw_bt(max)              libunwind unw_backtrace() into a static buffer; returns the
                           count (-1 if libunwind could not be loaded)
  recurse_then(depth, which, max)
                           depth native frames, then the capture `which`
                           (PEER_GLIBC / PEER_UNWIND / PEER_NOOP); returns its count
  noop()                   the cost of a cffi call (the same wrapper shape and GIL
                           handling as btcore's btc_backtrace), to subtract
  peer_addr(i)             entry i of the last capture's buffer (for checks)

libunwind is opened with dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL) and
unw_backtrace found with dlsym.  RTLD_LOCAL matters: libunwind exports weak
`backtrace` and `_Unwind_Backtrace` symbols; loaded globally they could take
the place of glibc's and we would time libunwind twice.  (`nm -D` on the
installed libunwind.so.8 shows `T unw_backtrace` and `W backtrace` at the same
address.)  We link nothing against libunwind (no headers are installed).

Run standalone to smoke-test: python benchmarks/peers.py
"""
import hashlib
import importlib.util
import os
import sys
import tempfile

from cffi import FFI

PEER_NOOP, PEER_GLIBC, PEER_UNWIND = 0, 1, 2
LIBUNWIND = "libunwind.so.8"

CDEF = """
int peers_init(void);
const char *peers_error(void);
int glibc_bt(int max);
int unw_bt(int max);
int recurse_then(int depth, int which, int max);
int noop(void);
uintptr_t peer_addr(int i);
uintptr_t glibc_backtrace_addr(void);
uintptr_t unw_backtrace_addr(void);
"""

# Same call overhead as btcore's own entry points: btcore's build keeps the
# GIL across its cffi calls (src/btcore/_build.py), so the peers do too.
SOURCE = r"""
#undef Py_BEGIN_ALLOW_THREADS
#undef Py_END_ALLOW_THREADS
#define Py_BEGIN_ALLOW_THREADS {
#define Py_END_ALLOW_THREADS }
#include <dlfcn.h>
#include <execinfo.h>
#include <stdint.h>
#include <stdio.h>

#define PEER_MAX 1024
static void *buf[PEER_MAX];
static int (*p_unw_backtrace)(void **, int);
static char err[256];

static int peers_init(void)
{
    if (p_unw_backtrace)
        return 0;
    void *h = dlopen("LIBUNWIND", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(err, sizeof err, "dlopen: %s", dlerror());
        return -1;
    }
    p_unw_backtrace = (int (*)(void **, int))dlsym(h, "unw_backtrace");
    if (!p_unw_backtrace) {
        snprintf(err, sizeof err, "dlsym(unw_backtrace): %s", dlerror());
        return -1;
    }
    return 0;
}

static const char *peers_error(void) { return err; }

static int clampmax(int max) { return max < 1 ? 1 : max > PEER_MAX ? PEER_MAX : max; }

static int glibc_bt(int max) { return backtrace(buf, clampmax(max)); }

static int unw_bt(int max)
{
    if (!p_unw_backtrace)
        return -1;
    return p_unw_backtrace(buf, clampmax(max));
}

static int noop(void) { return 0; }

static volatile int peers_sink;

__attribute__((noinline, noclone)) static int recurse_then(int depth, int which, int max)
{
    int r;
    if (depth > 0)
        r = recurse_then(depth - 1, which, max);
    else if (which == 1)
        r = glibc_bt(max);
    else if (which == 2)
        r = unw_bt(max);
    else
        r = noop();
    peers_sink = peers_sink + 1;      /* no tail call: each level is a frame */
    return r;
}

static uintptr_t peer_addr(int i) { return (i >= 0 && i < PEER_MAX) ? (uintptr_t)buf[i] : 0; }
static uintptr_t glibc_backtrace_addr(void) { return (uintptr_t)&backtrace; }
static uintptr_t unw_backtrace_addr(void) { return (uintptr_t)p_unw_backtrace; }
""".replace("LIBUNWIND", LIBUNWIND)

_lib = None
_ffi = None


def _cache_dir():
    key = hashlib.sha256((CDEF + SOURCE + sys.version).encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), "btcore-bench-peers-" + key)


def load():
    """Build (once, cached) and import the peers module; returns (ffi, lib)."""
    global _lib, _ffi
    if _lib is not None:
        return _ffi, _lib
    name = "_btcore_bench_peers"
    d = _cache_dir()
    so = None
    if os.path.isdir(d):
        for f in os.listdir(d):
            if f.startswith(name) and f.endswith(".so"):
                so = os.path.join(d, f)
    if so is None:
        os.makedirs(d, exist_ok=True)
        b = FFI()
        b.cdef(CDEF)
        b.set_source(name, SOURCE, extra_compile_args=["-O2", "-g"], libraries=["dl"])
        so = b.compile(tmpdir=d, verbose=False)
    spec = importlib.util.spec_from_file_location(name, so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if mod.lib.peers_init() != 0:
        raise RuntimeError("libunwind peer unavailable: " + mod.ffi.string(mod.lib.peers_error()).decode())
    _ffi, _lib = mod.ffi, mod.lib
    return _ffi, _lib


if __name__ == "__main__":
    import ctypes
    ffi, lib = load()
    n_g = lib.recurse_then(10, PEER_GLIBC, 256)
    g = [lib.peer_addr(i) for i in range(n_g)]
    n_u = lib.recurse_then(10, PEER_UNWIND, 256)
    u = [lib.peer_addr(i) for i in range(n_u)]
    print("glibc frames", n_g, "libunwind frames", n_u)
    # Both from recurse_then's frames outward must agree (the innermost entries
    # are inside glibc_bt / unw_bt and differ).
    common = min(n_g, n_u) - 2
    print("outer", common, "frames agree:", g[-common:] == u[-common:])
    libc_bt = ctypes.cast(ctypes.CDLL(None).backtrace, ctypes.c_void_p).value
    print("backtrace is glibc's:", lib.glibc_backtrace_addr() == libc_bt,
          hex(lib.glibc_backtrace_addr()), "unw_backtrace at", hex(lib.unw_backtrace_addr()))
