"""Modules loaded and unloaded at run time (dlopen/dlclose).

Two tests.  The first loads libraries of different sizes in turn (a walk
that used the previous library's CFI would compute the wrong CFA).  The
second is the hard case: two different libraries with an identical layout
(same code size, same functions at the same offsets, differing only in
their names and frame sizes), loaded in turn at the same address; a module
identified by its address and span alone, a walker row cache kept across
the change, or a name cache keyed by pc all give the first library's
answers for the second.  Oracle: glibc's backtrace() called in the same
frame; the libraries' own symbol names and paths.
"""
import ctypes
import _ctypes
import subprocess

import pytest

import conftest

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


@conftest.skip_under_asan
def test_reloaded_library_is_walked_with_its_own_tables(libraries):
    small, large = libraries
    for path in (small, large, small, large):
        where, ours, theirs = walk_in(path)
        # Both start in walk_here (at different call sites); from its caller
        # outward they must agree, down to the bottom of the stack.
        assert len(ours) == len(theirs) > 5
        assert ours[1:] == theirs[1:], path


# ---- a different library at the same address (issue 9.5) ----

TWIN_SOURCE = r"""
#include <execinfo.h>
typedef int (*callback)(int);
void *glibc_bt[256];
int glibc_n;
volatile int sink;
#define JOIN(a, b) a##_##b
#define NAME(a, b) JOIN(a, b)
/* Each level has a frame of `pad` bytes: the same instructions (imm32) for
 * both libraries, a different CFA offset in each. */
#define LEVEL(name, pad, call) \
    __attribute__((noinline)) int NAME(PREFIX, name)(callback cb, int x) \
    { volatile char frame[pad]; frame[0] = (char)x; int r = call; sink = frame[0] + r; return r + 1; }
LEVEL(leaf, PAD_LEAF, (glibc_n = backtrace(glibc_bt, 256), cb(x)))
LEVEL(mid, PAD_MID, NAME(PREFIX, leaf)(cb, x + 1))
LEVEL(entry, PAD_ENTRY, NAME(PREFIX, mid)(cb, x + 1))
"""

# Names of equal length keep .dynstr, hence every later section, in place.
TWINS = (("alpha", 1024, 512, 768), ("bravo", 512, 768, 1024))


def _layout(path):
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as f:
        elf = ELFFile(f)
        return ([(s["p_type"], s["p_vaddr"], s["p_memsz"]) for s in elf.iter_segments()],
                {s.name: (s["sh_addr"], s["sh_size"]) for s in elf.iter_sections()
                 if s["sh_flags"] & 2})   # SHF_ALLOC


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    d = tmp_path_factory.mktemp("twins")
    (d / "twin.c").write_text(TWIN_SOURCE)
    paths = []
    for prefix, leaf, mid, entry in TWINS:
        so = d / f"{prefix}.so"
        subprocess.run(["gcc", "-O2", "-g", "-shared", "-fPIC", f"-DPREFIX={prefix}", f"-DPAD_LEAF={leaf}",
                        f"-DPAD_MID={mid}", f"-DPAD_ENTRY={entry}", "-o", str(so), str(d / "twin.c")], check=True)
        paths.append(str(so))
    assert _layout(paths[0]) == _layout(paths[1]), "the twin libraries must have the same layout"
    return paths


def capture_in(handle, prefix):
    """(btcore's frames, glibc's pcs) captured inside prefix_leaf, via a Python callback."""
    import btcore
    got = {}

    def in_callback(x):
        got["bt"] = btcore.collect(python=False, capacity=1024)
        return 0

    cb = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(in_callback)
    getattr(handle, f"{prefix}_entry")(cb, 0)
    n = ctypes.c_int.in_dll(handle, "glibc_n").value
    glibc = [p or 0 for p in (ctypes.c_void_p * 256).in_dll(handle, "glibc_bt")[:n]]
    return got["bt"], glibc


def check_against_glibc(frames, glibc, path, prefix):
    """glibc's frames from the caller of the leaf outward equal the outer
    suffix of ours, address for address; the library's frames have its names."""
    ours = [f.ip for f in frames if not f.inlined]
    assert len(glibc) > 4 and len(ours) > len(glibc)
    k = len(ours) - (len(glibc) - 1)
    assert [hex(a) for a in ours[k:]] == [hex(a) for a in glibc[1:]], prefix
    mine = [f for f in frames if f.ip in ours[k - 1:k + 2]]
    assert [(f.function, f.module) for f in mine] == [(f"{prefix}_{n}", path) for n in ("leaf", "mid", "entry")]


@conftest.skip_under_asan
def test_different_library_at_the_same_address(twins):
    """Guards issue 9.5: a library loaded where another one (same layout) was got its tables and names."""
    import btcore
    where = {}
    for path, (prefix, *_) in zip(twins + twins[:1], TWINS + TWINS[:1]):
        for attempt in range(5):
            handle = ctypes.CDLL(path)
            base = ctypes.cast(getattr(handle, f"{prefix}_entry"), ctypes.c_void_p).value
            if not where or base == next(iter(where.values())):
                break
            _ctypes.dlclose(handle._handle)   # the loader chose another place: try again
        else:
            # qemu-user chooses guest addresses itself and moves on past a freed range
            pytest.skip(("qemu-user: " if conftest.UNDER_QEMU else "")
                        + f"the loader would not reuse the address range in 5 tries ({where}, {base:#x})")
        where[prefix] = base
        bt, glibc = capture_in(handle, prefix)
        check_against_glibc(bt.frames(), glibc, path, prefix)
        # an encoded token names this library too (the codec's pc -> module memo)
        decoded = btcore.decode(bt.encode()).frames()
        assert {f"{prefix}_{n}" for n in ("leaf", "mid", "entry")} <= {f.function for f in decoded}
        _ctypes.dlclose(handle._handle)


def test_modules_generation_changes_with_dlopen_and_dlclose(libraries):
    """Guards btcore.symbols.resolve.modules_generation(), the public reading of
    the core's module-list generation (decoded-token caches key on it): it
    changes once a library is loaded, and again once it is unloaded."""
    import btcore
    from btcore.symbols.resolve import modules_generation
    btcore.collect()   # a capture brings the module list up to date
    before = modules_generation()
    handle = ctypes.CDLL(libraries[0])
    btcore.collect()
    loaded = modules_generation()
    _ctypes.dlclose(handle._handle)
    btcore.collect()
    assert before != loaded != modules_generation()


def interpreter_functions():
    """The interpreter's function addresses (libpython's, or a static interpreter's own), from pyelftools on its
    file, biased by where /proc/self/maps has it loaded."""
    import os
    import sys
    from elftools.elf.elffile import ELFFile
    with open("/proc/self/maps") as f:
        maps = [line.split() for line in f]
    path = next((p[5] for p in maps if len(p) > 5 and "libpython" in p[5]), os.path.realpath(sys.executable))
    with open(path, "rb") as f:
        elf = ELFFile(f)
        first = min(seg["p_vaddr"] for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD") & ~0xfff
        bias = min(int(p[0].split("-")[0], 16) for p in maps if len(p) > 5 and p[5] == path) - first
        symbols = elf.get_section_by_name(".dynsym").iter_symbols()
        return sorted({bias + s["st_value"] for s in symbols if s["st_info"]["type"] == "STT_FUNC" and s["st_value"]})


def test_the_row_cache_keeps_two_call_sites_that_share_a_set():
    # guards: unwind.c's row cache is two-way: two pcs of one stack in one set are both kept (direct-mapped,
    # each missed at every walk: Debian's python3.14, 243 against 203 ns a capture); a third evicts the older
    # of the two.  pcs: the interpreter's functions, their sets as the cache computes them.
    by_set = {}
    for pc in interpreter_functions():
        by_set.setdefault(lib.btc_test_row_cache_set(pc + 1), []).append(pc + 1)
    a, b, c = next(pcs for pcs in by_set.values() if len(pcs) >= 3)[:3]
    lib.btc_test_row_cache_misses([a, b], 2)
    assert lib.btc_test_row_cache_misses([a, b, a, b], 4) == 0, "two pcs of one set evicted each other"
    assert lib.btc_test_row_cache_misses([c], 1) == 1
    assert lib.btc_test_row_cache_misses([c, b], 2) == 0, "a miss evicted the newer pc of the set"
    assert lib.btc_test_row_cache_misses([a], 1) == 1, "a set held three pcs"
