"""The one CPython layout table (native/remote/pylayout.c; completed from
the interpreter's _Py_DebugOffsets on 3.13+, btcore/remote/debug_offsets.py) and
the one walker of another process's Python frames (native/remote/rpython.c),
against CPython's own view of the same frames: sys._current_frames() for a
thread, gr_frame for a suspended greenlet.  The walker reads this process's
memory through the reader a dump of another process uses (btc_rmem), so
this runs on every version lane (the sid chroot's 3.13-3.15 included),
where the dump tests need a target of another process.
"""
import ctypes
import os
import sys
import threading
import types

import greenlet
import pytest

from btcore.remote import debug_offsets

from btcore.remote import greenlet_offsets
from btcore._native import ffi, lib
from btcore.remote.snapshot import Memory

MOST = 256


@pytest.fixture
def memory():
    m = Memory(lib.btc_rmem_open_pid(os.getpid()))
    yield m
    m.close()


def runtime() -> int:
    return ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))


def table(memory):
    """The table for this interpreter, as a dump of a process running it fills it."""
    lay = ffi.new("btc_remote_layout *")
    known = lib.btc_remote_layout_of(sys.hexversion, lay)
    if known < 0:
        pytest.skip(f"no layout table for CPython {sys.version_info[:2]}")
    assert known == 0 or debug_offsets.fill(memory, runtime(), lay)
    lay.code_type = id(types.CodeType)
    return lay


# The fields _Py_DebugOffsets gives (marked D in native/btcore_api.h).
DEBUG_FIELDS = ["runtime_interp_head", "interp_next", "interp_threads_head", "tstate_next", "tstate_thread_id",
                "tstate_native_thread_id", "tstate_current_frame", "frame_previous", "frame_executable",
                "frame_instr_ptr", "frame_owner", "code_filename", "code_qualname", "code_firstlineno",
                "code_linetable", "code_adaptive", "type_name", "unicode_state", "unicode_length", "ascii_data",
                "compact_data", "bytes_size", "bytes_data"]


def test_the_table_read_from_debug_offsets_is_the_compiled_one(memory):
    # guards: debug_offsets.fill (the field order of _Py_DebugOffsets, listed per family) gives every field the
    # offset this build's in-process readers compile in (offsetof on its headers: pylayout.c), on 3.13-3.15.
    compiled = ffi.new("btc_remote_layout *")
    if lib.btc_remote_layout_compiled(compiled) < 0:
        pytest.skip("3.11's table is pinned to its headers at compile time (native/remote/pylayout.c)")
    lay = table(memory)
    assert {name: getattr(lay, name) for name in DEBUG_FIELDS} == {name: getattr(compiled, name)
                                                                   for name in DEBUG_FIELDS}


def cpython_view(frame) -> list:
    """[(code, instruction offset in bytes)] of a frame and its callers, as CPython shows them."""
    out = []
    while frame is not None:
        out.append((id(frame.f_code), frame.f_lasti))
        frame = frame.f_back
    return out


def walked(frames, n) -> tuple:
    """([(code, lasti)], {code: entry}) of the walker's output."""
    chain = [(frames[i].code, frames[i].lasti) for i in range(n)]
    return chain, {frames[i].code: bool(frames[i].entry) for i in range(n)}


def word(memory, addr: int) -> int:
    value = memory.word(addr)
    assert value is not None, hex(addr)
    return value


def thread_state(memory, lay, ident: int) -> int:
    """The thread state of thread `ident`, found as a dump finds it (interpreters, their thread lists)."""
    interp = word(memory, runtime() + lay.runtime_interp_head)
    while interp:
        ts = word(memory, interp + lay.interp_threads_head)
        while ts:
            if word(memory, ts + lay.tstate_thread_id) == ident:
                return ts
            ts = word(memory, ts + lay.tstate_next)
        interp = word(memory, interp + lay.interp_next)
    raise AssertionError(f"no thread state for thread {ident}")


# A chain with one call from C in its middle (map calls `called_from_c` through a new eval-loop call) and
# plain Python calls elsewhere (top -> direct: run inline in the caller's eval-loop call since 3.11).
def called_from_c(park):
    park()
    return 0


def direct(park):
    return list(map(called_from_c, [park]))


def top(park):
    return direct(park)


def check_entries(entries):
    """The frames a C function called start their eval-loop calls; a plain Python call does not."""
    assert entries[id(called_from_c.__code__)] is True
    assert entries[id(direct.__code__)] is False


def test_a_threads_frames_are_cpythons(memory):
    # guards: the layout table (thread-state list, current frame, frame links, code and instruction pointers,
    # shims) and the walker over a thread's chain: the same frames and instruction offsets as
    # sys._current_frames(), entry frames where C called Python.
    lay = table(memory)
    parked, release = threading.Event(), threading.Event()
    worker = threading.Thread(target=top, args=(lambda: parked.set() or release.wait(),), daemon=True)
    worker.start()
    parked.wait()
    try:
        ts = thread_state(memory, lay, worker.ident)
        out = ffi.new("btc_remote_pyframe[]", MOST)
        n = lib.btc_remote_thread_frames(memory.handle, lay, ts, out, MOST)
        chain, entries = walked(out, n)
        assert chain == cpython_view(sys._current_frames()[worker.ident])
        check_entries(entries)
        assert out[n - 1].entry, "the outermost frame starts its eval-loop call"
    finally:
        release.set()
        worker.join()


def stack_maps():
    """(lo[], hi[], n) of this process's mappings, sorted, as C arrays."""
    with open("/proc/self/maps") as f:
        spans = sorted(tuple(int(x, 16) for x in line.split()[0].split("-")) for line in f)
    return ffi.new("uintptr_t[]", [lo for lo, _ in spans]), ffi.new("uintptr_t[]", [hi for _, hi in spans]), len(spans)


def test_a_suspended_greenlets_frames_are_cpythons(memory):
    # guards: the walker over a suspended greenlet's chain, read through the greenlet's view of its stack (its
    # saved part from greenlet's heap copy): the frames of gr_frame, and, where greenlet relinked them past the
    # eval loop's shims (3.12+), entry frames told by the links it saved.
    lay = table(memory)
    main = greenlet.getcurrent()
    g = greenlet.greenlet(lambda: top(main.switch))
    g.switch()
    greenlet.greenlet(lambda: [0] * 4096 and main.switch()).switch()   # another greenlet spills g's stack
    offsets = ffi.new("size_t[3]", greenlet_offsets.local())
    states = ffi.new("btc_remote_greenlet[1]")
    assert lib.btc_remote_greenlet_states(memory.handle, ffi.new("uintptr_t[]", [id(g)]), 1, offsets, states) == 1
    maps = stack_maps()
    total = lib.btc_remote_greenlet_fit(states, 1, *maps, 1 << 30)
    spill, out = ffi.new("uint8_t[]", max(total, 1)), ffi.new("btc_remote_pyframe[]", MOST)
    n = lib.btc_remote_greenlet_copies(memory.handle, lay, states, 1, spill, total, out, MOST, *maps)
    assert states[0].saved > 0 and states[0].copied and n == states[0].nframes   # read through the heap copy
    chain, entries = walked(out, n)
    assert chain == cpython_view(g.gr_frame)
    check_entries(entries)
    assert out[n - 1].entry


# The object offsets a dump names greenlets with (native/remote/robjects.c) that _Py_DebugOffsets also gives.
PUBLISHED_OBJECT_FIELDS = {"code_name": "code_object.name", "type_flags": "type_object.tp_flags",
                           "dict_keys": "dict_object.ma_keys", "dict_values": "dict_object.ma_values",
                           "long_size": "long_object.lv_tag", "long_digits": "long_object.ob_digit"}


def test_the_object_table_agrees_with_the_interpreters_debug_offsets(memory):
    # guards: robjects.c's column for this version gives the offsets the interpreter itself publishes, on 3.13-3.15
    # (where btcore is built for a version, its column is also pinned to its headers at compile time).
    found = debug_offsets.published(memory, runtime(), sys.hexversion >> 16)
    if found is None:
        pytest.skip("3.11's table is pinned to its headers at compile time (native/remote/pylayout.c)")
    objects = ffi.new("btc_remote_objlayout *")
    assert lib.btc_remote_pyobjects(sys.hexversion, objects) == 0
    assert {field: getattr(objects, field) for field in PUBLISHED_OBJECT_FIELDS} == \
        {field: found[1][name] for field, name in PUBLISHED_OBJECT_FIELDS.items()}
