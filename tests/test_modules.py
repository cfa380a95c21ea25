"""Modules loaded and unloaded at run time (dlopen/dlclose).

A library is loaded, walked through, unloaded, and a different library is
loaded in its place — the loader reuses the address range — with a
different stack frame layout.  A walk that used the first library's cached
CFI (table or per-pc row) would compute the wrong CFA there and end early.
Oracle: glibc's backtrace() called from the same frame.  (glibc reuses the
range here; where a loader would not, the test still checks fresh modules.)
Breaking the refresh (never rebuilding the module list) makes it fail.
"""
import ctypes
import _ctypes
import subprocess

import pytest

from btcore._native import ffi, lib

SOURCE = r"""
#include <execinfo.h>
#include <stdint.h>
typedef int (*walker)(uintptr_t *, int);
volatile int sink;
/* Both walks start in this frame; PAD changes its size, hence its CFI. */
__attribute__((noinline)) int walk_here(uintptr_t fn, uintptr_t *ours, int max, void **theirs, int *ntheirs)
{
    volatile char pad[PAD];
    pad[0] = 1;
    *ntheirs = backtrace(theirs, max);
    int n = ((walker)fn)(ours, max);
    sink = pad[0] + n;
    return n;
}
"""


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    d = tmp_path_factory.mktemp("dl")
    (d / "walk.c").write_text(SOURCE)
    paths = []
    for name, pad in (("small", 16), ("large", 4000)):
        so = d / f"{name}.so"
        subprocess.run(["gcc", "-O2", "-g", "-shared", "-fPIC", f"-DPAD={pad}", "-o", str(so), str(d / "walk.c")],
                       check=True)
        paths.append(str(so))
    return paths


def walk_in(path):
    """(load address of walk_here, btcore's pcs, glibc's pcs), then dlclose."""
    handle = ctypes.CDLL(path)
    ours, theirs, ntheirs = (ctypes.c_uint64 * 128)(), (ctypes.c_void_p * 128)(), ctypes.c_int()
    walker = int(ffi.cast("uintptr_t", ffi.addressof(lib, "btc_backtrace")))
    n = handle.walk_here(ctypes.c_uint64(walker), ours, 128, theirs, ctypes.byref(ntheirs))
    where = ctypes.cast(handle.walk_here, ctypes.c_void_p).value
    _ctypes.dlclose(handle._handle)
    return where, list(ours[:n]), [p or 0 for p in theirs[:ntheirs.value]]


def test_reloaded_library_is_walked_with_its_own_tables(libraries):
    small, large = libraries
    for path in (small, large, small, large):
        where, ours, theirs = walk_in(path)
        # Both start in walk_here (at different call sites); from its caller
        # outward they must agree, down to the bottom of the stack.
        assert len(ours) == len(theirs) > 5
        assert ours[1:] == theirs[1:], path
