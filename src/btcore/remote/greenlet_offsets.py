"""Where greenlet keeps a suspended greenlet's saved stack (its StackState)
and its top frame object, in the greenlet objects of another process.

greenlet publishes neither: its C++ object's layout changes with greenlet's
version and with the CPython it was built for.  A dump finds them one of
two ways (btcore/remote/snapshot.py picks):

- local(): the target runs the very build of greenlet btcore runs with
  (same build-id), so this process's own greenlets in known states tell
  (greenlets.layout_known(), which in-process capture uses too).
- learned(): any other build (a target on another CPython version, or
  another greenlet release), from the target's own greenlet objects, with
  what greenlet itself guarantees: a main greenlet's StackState has
  stack_stop = (uintptr_t)-1; every StackState is {start, stop, copy,
  saved, prev} with a started greenlet's stack inside [start, stop) and at
  most that much of it saved; a suspended greenlet's top frame is a frame
  object (the target's PyFrame_Type) or nothing.  An offset is taken only
  where every sampled greenlet agrees and no other offset does.
"""
from __future__ import annotations

import ctypes
import struct

import greenlet

from .._native import ffi, lib
from ..capture.greenlets import layout_known

MAIN_STACK_STOP = (1 << 64) - 1
_PIMPL = 32                 # PyGreenlet: PyObject_HEAD, weakreflist, dict, then pimpl
_GREENLET_BASICSIZE = 40
_TP_BASICSIZE = 32          # offsetof(PyTypeObject, tp_basicsize), in every CPython 3
_STATE_SCAN = 24 * 8        # how far into the C++ object StackState may lie (as in-process)
_FRAME_SCAN = 24 * 8        # how far after StackState the top frame may lie
_STATE_WORDS = 4            # start, stop, copy, saved
_OBJECT_WORDS = (_STATE_SCAN + 8 * _STATE_WORDS + _FRAME_SCAN) // 8   # the words of a C++ object looked at
_MAX_STACK = 1 << 30
SAMPLE = 4096               # greenlets looked at


class Unlearnable(Exception):
    """The target's greenlet objects do not tell (the message says why)."""


_local = None


def local() -> tuple:
    """(pimpl, StackState, top frame) offsets of the greenlet build this
    process runs, learned here from greenlets in known states."""
    global _local
    if _local is None:
        if not layout_known():
            raise Unlearnable("greenlet's layout is not one btcore recognises")
        state_off, size, scan = ffi.new("size_t *"), ffi.new("size_t *"), ffi.new("size_t *")
        lib.btc_greenlet_layout(state_off, size, scan)
        pimpl_off = greenlet.greenlet.__basicsize__ - 8
        _local = (pimpl_off, state_off[0], _local_top_frame_offset(pimpl_off, size[0]))
    return _local


def _local_top_frame_offset(pimpl_off: int, size: int) -> int:
    """The one word of greenlet's C++ object equal to gr_frame, in two
    suspended greenlets of this process."""
    def park():
        greenlet.getcurrent().parent.switch()

    found = None
    for _ in range(2):
        g = greenlet.greenlet(park)
        g.switch()
        pimpl = ctypes.c_void_p.from_address(id(g) + pimpl_off).value
        words = struct.unpack(f"<{size // 8}Q", ctypes.string_at(pimpl, size // 8 * 8))
        hits = {i * 8 for i, w in enumerate(words) if w == id(g.gr_frame)}
        found = hits if found is None else found & hits
        g.throw(greenlet.GreenletExit)
    if not found or len(found) != 1:
        raise Unlearnable("cannot find where greenlet keeps a suspended greenlet's frame")
    return found.pop()


def learned(memory, greenlets: list, greenlet_type: int, frame_type: int) -> tuple:
    """(pimpl, StackState, top frame) offsets from greenlet objects of the
    target (addresses, read through memory).  Raises Unlearnable."""
    if memory.word(greenlet_type + _TP_BASICSIZE) != _GREENLET_BASICSIZE:
        raise Unlearnable("its greenlet objects do not have the layout of greenlet 3.x")
    objects = _objects(memory, greenlets[:SAMPLE])
    if not objects:
        raise Unlearnable("none of its greenlet objects is readable")
    state = _only("greenlet's StackState", [off for off in range(0, _STATE_SCAN + 8, 8)
                                              if _states_agree(objects, off // 8)])
    first = state + 8 * _STATE_WORDS
    is_frame = _type_check(memory, frame_type)
    frame = _only("a suspended greenlet's top frame", [
        off for off in range(first, first + _FRAME_SCAN, 8)
        if _frames_agree(objects, state // 8, off // 8, is_frame)])
    return _PIMPL, state, frame


def _objects(memory, greenlets: list) -> list:
    """The words of each readable greenlet's C++ object (its part where StackState and the top frame may lie),
    a memoryview of them each: every pimpl, then every object, read in one batch (4,096 objects read one by one
    took ~13 ms), and a word made an int only when a check looks at it (a tuple of all 56 made 229,000: ~8 ms)."""
    data, ok = memory.read_each([g + _PIMPL for g in greenlets], 8)
    pimpls = memoryview(data).cast("Q") if data else ()
    data, ok = memory.read_each([pimpls[i] for i, read in enumerate(ok) if read and pimpls[i]], _OBJECT_WORDS * 8)
    words = memoryview(data).cast("Q") if data else ()
    return [words[i * _OBJECT_WORDS:(i + 1) * _OBJECT_WORDS] for i, read in enumerate(ok) if read]


def _only(what: str, offsets: list) -> int:
    if len(offsets) != 1:
        raise Unlearnable(f"{len(offsets)} places in its greenlet objects could hold {what}, not one")
    return offsets[0]


def _suspended(w: tuple, i: int) -> bool:
    start, stop = w[i], w[i + 1]
    return start > 1 and start < stop


def _states_agree(objects: list, i: int) -> bool:
    """Does every object hold a StackState at word i, and one of them a main
    greenlet's?"""
    mains = 0
    for w in objects:
        start, stop, saved = w[i], w[i + 1], w[i + 3]
        if stop == MAIN_STACK_STOP:
            mains += 1
            if saved >= _MAX_STACK:
                return False
        elif start > 1 and not (start < stop and stop - start < _MAX_STACK and saved <= stop - start):
            return False
    return mains > 0


def _frames_agree(objects: list, state: int, i: int, is_frame) -> bool:
    """Is word i nothing or a frame object in every suspended greenlet, and
    a frame object in one of them at least that is not a main greenlet?
    (A main greenlet looks suspended while it runs, and a running one may
    keep a stale top frame: only other greenlets are evidence.)"""
    frames = 0
    for w in objects:
        if w[i] and _suspended(w, state):
            if not is_frame(w[i]):
                return False
            frames += w[state + 1] != MAIN_STACK_STOP
    return frames > 0


def _type_check(memory, wanted: int):
    seen = {}

    def is_a(address: int) -> bool:
        if address not in seen:
            seen[address] = not address & 7 and memory.word(address + 8) == wanted
        return seen[address]
    return is_a
