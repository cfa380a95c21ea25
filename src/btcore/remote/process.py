"""dump_process(): every thread's running stack and every suspended greenlet
of another process (live, or a core file), native and Python frames merged,
with no agent inside it.

The target is stopped only while btcore/remote/snapshot.py copies what the dump
needs; walking the copies (the same DWARF walker as collect(), over a
memory view of the copy: native/remote/rmodules.c), merging and naming
happen after it runs again.
"""
from __future__ import annotations

import errno
import itertools
import json
import operator
import os
import re
import sys
from dataclasses import dataclass, field

from . import bounds

from .. import codec

from ..views import dump

from . import names as remote_names

from . import spawn as remote_spawn

from . import tasks as remote_tasks
from .._native import ffi, lib
from ..capture.backtrace import KIND_NATIVE, RECORD, Backtrace
from ..symbols.elf_files import symbol_value
from ..capture.frame import NATIVE, PYTHON, Frame
from ..capture.introspect import place_in_tree
from ..capture.records import PYFRAME, record_struct
from .snapshot import (DumpError, DumpPermissionError, Mapping, Memory, Room, Snapshot, Target, gather,
                     greenlet_copies, snapshot_live, spawn_chains, vdso_file)
from ..symbols.resolve import F_EXACT, file_symbol, native_frames, open_regular
from ..views.schema import RemoteGreenlet
from ..capture.spawn import SpawnChain, join_chain
from ..capture.threads import fallback_name, real_thread

__all__ = ["DumpError", "DumpPermissionError", "ProcessStack", "Walker", "dump_process", "process_stacks"]

_new = object.__new__


@dataclass(slots=True)
class ProcessStack:
    """One stack of the target: a thread's running stack, or a suspended greenlet's.

    kind      "thread", "greenlet" or "task" (an asyncio task: btcore/remote/tasks.py)
    name      thread: "Thread <tid>"; greenlet: as dump_all() names it (btcore/remote/names.py),
              else "<type at 0x...>"
    tid       the thread it runs on (greenlet: whose stack holds it; None if unknown)
    frames    resolved Frames, innermost first
    error     why the stack is missing or short, or None
    backtrace its merged records (a RemoteBacktrace: frames() gives frames)
    """

    kind: str
    name: str
    tid: int | None
    frames: list = field(default_factory=list)
    error: str | None = None
    backtrace: object = None
    address: int | None = None      # greenlet: its object's address in the target
    parent: int | None = None       # greenlet: its parent's address, if known
    spawned_by: int | None = None   # greenlet: its live spawner's address, if known
    thread_name: str | None = None  # its thread's name as `threading` knew it (remote/names.py), if it did
    spawn: tuple | None = None      # greenlet, task: (its SpawnChain, the chain capacity) where the target's
                                    # btcore tracked spawns (remote/spawn.py); the links' creators by address


# ---- walking and merging the copies: collect()'s merge, in C ----

class _Names:
    """The target's frames named from its files and memory, each raw frame
    once per dump (10 000 greenlets parked in a few places repeat the same
    frames): what a RemoteBacktrace resolves through."""

    def __init__(self, snap: Snapshot, interpreter):
        self._modules, self._interpreter = snap.modules, interpreter
        self._names = bounds.Names(snap.memory, snap.layout, snap.types)
        self._native, self._python = {}, {}
        self._token_keys = {}   # module path -> what a token says of it

    def string(self, address: int) -> str | None:
        """The target's str object at address, bounded (None if it is not one)."""
        return self._names.string(address)

    def token_place(self, pc: int, exact: bool) -> tuple:
        """(The module key a token names, the module-relative pc) of native pc."""
        mod = self._modules.at(pc if exact else pc - 1)
        if mod is None:
            return None, pc
        key = self._token_keys.get(mod.path)
        if key is None:
            key = self._token_keys[mod.path] = codec.file_module_key(codec.file_build_id(mod.path) or b"", mod.path)
        return key, pc - mod.bias

    # What views/dump.py's grouping asks of a backtrace's _space (as of btcore/symbols/resolve.py).
    def module_key(self, pc: int, exact: bool) -> tuple:
        mod = self._modules.at(pc if exact else pc - 1)
        return (mod.lo if mod else 0,)

    def interpreter_module_id(self) -> int:
        return self._interpreter.lo if self._interpreter else 0

    def resolve_python(self, address: int, lasti: int) -> tuple:
        return self.python(address, lasti)[0]

    def frames(self, addr: int, lasti: int, kind: int, flags: int) -> tuple:
        """The Frames of one record (innermost first)."""
        return self.native(addr, flags) if kind == KIND_NATIVE else self.python(addr, lasti)[0]

    def native(self, pc: int, flags: int) -> tuple:
        named = self._native.get((pc, flags & F_EXACT))
        if named is None:
            named = self._native[pc, flags & F_EXACT] = self._name_native(pc, bool(flags & F_EXACT))
        return named

    def _name_native(self, pc: int, exact: bool) -> tuple:
        mod = self._modules.at(pc if exact else pc - 1)
        if mod is None:
            return (Frame(NATIVE, pc, None, None, None, None, None),)
        return _file_frames(mod.path, _identity(mod.path), mod.bias, pc, exact)

    def name_ahead(self, raws) -> _Ahead | None:
        """Start naming, in a thread of its own, the native frames of raws (merged records) that no dump has
        named yet, for the caller to go on meanwhile (None: nothing to name, or one CPU to do it on)."""
        todo, seen, identities = [], set(), {}
        for raw in raws:
            for pc, _, kind, flags, _ in RECORD.iter_unpack(raw):
                exact = bool(flags & F_EXACT)
                if kind != KIND_NATIVE or (pc, exact) in seen:
                    continue
                seen.add((pc, exact))
                mod = self._modules.at(pc if exact else pc - 1)
                if mod is None:
                    continue
                if mod.path not in identities:
                    identities[mod.path] = _identity(mod.path)
                identity = identities[mod.path]
                if (mod.path, identity, mod.bias, pc, exact) not in _FILE_FRAMES:
                    todo.append((mod.path, (pc if exact else pc - 1) - mod.bias))
        return _Ahead(todo) if todo and len(os.sched_getaffinity(0)) > 1 else None

    def python(self, address: int, lasti: int) -> tuple:
        """(Frames, what is wrong with the frame or None)."""
        named = self._python.get((address, lasti))
        if named is None:
            named = self._python[address, lasti] = self._name_python(address, lasti)
        return named

    def _name_python(self, address: int, lasti: int) -> tuple:
        code, wrong = self._names.code(address), None
        if code.error:
            wrong = f"a frame's code at {address:#x}: {code.error}"
        elif not bounds.lasti_ok(code, lasti):
            wrong = f"a frame's instruction offset {lasti} lies outside its code ({code.qualname})"
        frame = Frame(PYTHON, None, code.filename, code.qualname, None, code.filename, bounds.line(code, lasti))
        return (frame,), wrong


def _identity(path: str) -> tuple | None:
    """What tells the file at path from another one there later (inode, size, mtime), None if it is gone:
    what is remembered of a file across dumps is remembered for this identity."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


_FILE_FRAMES = {}   # (path, identity, bias, pc, exact) -> Frames, across dumps: _file_frames()
_MAX_FILE_FRAMES = 1 << 14


def _file_frames(path: str, identity: tuple | None, bias: int, pc: int, exact: bool) -> tuple:
    """The Frames of pc in the file at path loaded at bias, from its symbols and DWARF; remembered across
    dumps (~0.6 ms a pc: a dump again and again of one process, by the API or a profiler from outside, meets
    the same pcs), while the file is the same one (identity: its inode, size and mtime; None: not kept)."""
    key = (path, identity, bias, pc, exact)
    frames = _FILE_FRAMES.get(key)
    if frames is None:
        lookup = pc if exact else pc - 1
        name, start = file_symbol(path, lookup - bias)
        offset = pc - bias - start if name else pc - bias
        frames = native_frames(pc, path, name, offset, lookup - bias)
        if identity is not None:
            if len(_FILE_FRAMES) >= _MAX_FILE_FRAMES:
                _FILE_FRAMES.clear()
            _FILE_FRAMES[key] = frames
    return frames


class _Ahead:
    """btc_symbolize_ahead() of [(path, module-relative address)] in a real OS thread (a monkey-patched
    process's threading would make it a greenlet of the caller's own thread): the files' symbol tables and
    DWARF units are read while the caller works; its own naming then finds them read.  end() when the caller
    is done: the addresses not reached are left (a hostile target's thousands of distinct pcs do not hold the
    dump up), the one in progress is finished."""

    def __init__(self, todo: list):
        self._paths = [ffi.new("char[]", os.fsencode(path)) for path, _ in todo]
        self._args = ffi.new("const char *[]", self._paths), ffi.new("uintptr_t[]", [a for _, a in todo])
        self._stop = ffi.new("int *")
        self._done = real_thread("allocate_lock")()
        self._done.acquire()
        try:
            real_thread("start_new_thread")(self._run, ())
        except (RuntimeError, MemoryError):   # no thread to be had: the caller names them itself
            self._done.release()

    def _run(self) -> None:
        try:
            lib.btc_symbolize_ahead(*self._args, len(self._paths), self._stop)
        finally:
            self._done.release()

    def end(self) -> None:
        self._stop[0] = 1
        with self._done:
            pass


class RemoteBacktrace(Backtrace):
    """A Backtrace of another process's stack: the records collect() makes
    (a Python record's addr is the target's code object, and _refs holds
    those addresses), named through the dump's _Names."""

    __slots__ = ("_space",)

    def _resolved(self) -> list:
        frames = self._space.frames
        return [(flags, frames(addr, lasti, kind, flags))
                for addr, lasti, kind, flags, _ in RECORD.iter_unpack(self._raw)]

    def encode(self) -> str:
        """Its token (btcore.decode() reads it back): the target's modules
        by build-id, its Python frames by the names the dump read."""
        space, items = self._space, []
        for addr, lasti, kind, flags, _ in RECORD.iter_unpack(self._raw):
            if kind == KIND_NATIVE:
                items.append((flags, *space.token_place(addr, bool(flags & F_EXACT))))
            else:
                frame = space.python(addr, lasti)[0][0]
                items.append((flags, frame.function or "", frame.file or "", frame.line))
        return codec.token(bool(self.truncated), items)

    def wrong(self) -> str | None:
        """What is wrong with its Python frames (a garbage code object), or None."""
        return next((w for addr, lasti, kind, _, _ in RECORD.iter_unpack(self._raw) if kind != KIND_NATIVE
                     for w in (self._space.python(addr, lasti)[1],) if w), None)


def _remote_backtrace(space, raw: bytes, capacity: int, truncated: bool, refs: tuple) -> RemoteBacktrace:
    bt = _new(RemoteBacktrace)
    bt._raw, bt._capacity, bt.truncated, bt._space, bt._refs = bytearray(raw), capacity, bool(truncated), space, refs
    return bt


class _Shared:
    """What identical stacks share: their records, references and error, and their frames once named."""

    __slots__ = ("raw", "refs", "wrong", "_bt", "_frames")

    def __init__(self, bt: RemoteBacktrace):
        self.raw, self.refs, self.wrong, self._bt, self._frames = bt._raw, bt._refs, bt.wrong(), bt, None

    @property
    def frames(self) -> list:
        if self._frames is None:
            self._frames = self._bt.frames()
        return self._frames


_CAPACITY = lib.BTC_REMOTE_MAX_FRAMES   # what remote/process.py showed before: every frame walked
# The records buffer: room for this many stacks of _CAPACITY records (4.5 MB); stacks are far shorter, so one
# call fills it with thousands (a buffer for 1,024 was 71 MB to clear and fault in at every dump).
_STACKS_AT_ONCE = 64


# btc_remote_stack's outputs (at, n, truncated, cut, unwalked), read for a whole array at once
_STACK_OUT = record_struct("btc_remote_stack", "at", "n", "truncated", "cut", "unwalked")


class _Merger:
    """Every stack of a snapshot, walked and merged in C (btc_remote_stacks)."""

    def __init__(self, snap: Snapshot, native: bool):
        t = self.target = ffi.new("btc_remote_target *")
        interpreter, t.neval = _eval_ranges(snap, t.eval_lo, t.eval_hi)
        self.snap, self.names = snap, _Names(snap, interpreter)
        t.want = lib.BTC_WANT_PYTHON | (lib.BTC_WANT_NATIVE if native else 0)
        t.capacity = _CAPACITY
        code = snap.greenlet_code
        t.nstub = code.nstub if code else 0
        for i in range(t.nstub):
            t.stub_lo[i], t.stub_hi[i] = code.stub_lo[i], code.stub_hi[i]
        if code:
            t.resume_pc, t.bp_slot, t.bx_slot = code.resume_pc, code.bp_slot, code.bx_slot
        greenlet_mod = snap.modules.named(lambda name: name.startswith("_greenlet"))
        if greenlet_mod:
            t.greenlet_lo, t.greenlet_hi = greenlet_mod.lo, greenlet_mod.hi
        self._keep = []   # the buffers the C structs point into
        self._shared = {}   # raw records -> (the bytes, their refs): shared by identical stacks

    def thread(self, st, t) -> None:
        """Fill st for thread t of the snapshot: its running stack, when it was stopped and copied."""
        if t.regs is not None and t.stack:
            st.regs[0:4] = t.regs
            self.copy(st, t.stack_lo, t.stack, 0)
        if t.pyframes:
            pyframes = b"".join(PYFRAME.pack(*f) for f in t.pyframes)
            st.py, st.npy = self._kept(ffi.from_buffer("btc_remote_pyframe[]", pyframes)), len(t.pyframes)

    def greenlets(self, stacks, records, group: list, walk: bool) -> list:
        """Fill stacks[0:len(group)] for group, greenlets of records, in C: their Python frames, and when walk,
        their saved stacks where the heap copy is all of one.  Returns the i of those left to the caller
        (_greenlet_bytes: a part in place on the thread's stack)."""
        spill = self._kept(ffi.from_buffer(records.spill))
        frames = self._kept(ffi.from_buffer("btc_remote_pyframe[]", records.frames))
        states = self._kept(ffi.from_buffer("btc_remote_greenlet[]", records.states))
        rows, left = ffi.new("int32_t[]", [g.row for g in group]), ffi.new("int32_t[]", len(group))
        n = lib.btc_remote_greenlet_stacks(states, rows, len(group), spill, len(records.spill), frames,
                                           len(records.frames) // PYFRAME.size, walk, stacks, left)
        return left[0:n]

    def copy(self, st, lo: int, data, last_cfa: int) -> None:
        """st's stack: data, the copy of [lo, lo + len(data)) of the target."""
        if len(data):
            st.lo, st.copy, st.size, st.last_cfa = lo, self._kept(ffi.from_buffer(data)), len(data), last_cfa

    def _kept(self, buffer):
        self._keep.append(buffer)
        return buffer

    def merge(self, stacks, n: int, named: bool = True) -> list:
        """[(RemoteBacktrace, its _Shared or None when not named, why its Python chain was cut short or None,
        whether it was left unwalked)] of stacks[0:n]."""
        out, done = [], 0
        records = ffi.new("btc_frame[]", _CAPACITY * _STACKS_AT_ONCE)
        buffer = ffi.buffer(records)
        while done < n:
            k = lib.btc_remote_stacks(self.snap.modules.handle, self.target, stacks + done, n - done, records,
                                      _CAPACITY * _STACKS_AT_ONCE)
            if k <= 0:
                raise DumpError(ffi.string(lib.btc_last_error()).decode())
            for at, count, truncated, cut, unwalked in _STACK_OUT.iter_unpack(ffi.buffer(stacks + done,
                                                                                        k * _STACK_OUT.size)):
                raw = buffer[at * 16: (at + count) * 16]
                out.append((self.backtrace(raw, truncated) if named else (self._unnamed(raw, truncated), None))
                           + (bounds.cut_reason(cut) if cut else None, unwalked))
            done += k
        return out

    def distinct(self):
        """The distinct records of the stacks merged so far."""
        return self._shared.keys()

    def backtrace(self, raw: bytes, truncated: bool) -> tuple:
        shared = self._shared.get(raw)
        bt = self._unnamed(raw, truncated, shared.refs if shared is not None else None)
        if shared is None:
            shared = self._shared[raw] = _Shared(bt)
        bt._refs = shared.refs
        return bt, shared

    def _unnamed(self, raw: bytes, truncated: bool, refs: tuple | None = None) -> RemoteBacktrace:
        return _remote_backtrace(self.names, raw, _CAPACITY, truncated, refs if refs is not None else tuple(
            addr for addr, _, kind, _, _ in RECORD.iter_unpack(raw) if kind != KIND_NATIVE))

    def forget_buffers(self) -> None:
        """Let go of the copies the last merge read (the merger serves another snapshot next)."""
        self._keep.clear()


def _eval_ranges(snap: Snapshot, lo, hi) -> tuple:
    """(The interpreter's module or None, how many ranges): the target's
    eval-loop code into lo, hi, with the parts a stripped interpreter leaves
    unnamed (Debian's python3.X: most of the loop)."""
    for mod in snap.modules.list:   # the executable when static, else libpython (the executable names it)
        if os.path.basename(mod.path).startswith(("libpython", "python")):
            code = symbol_value(mod.path, "PyEval_EvalCode")   # exported: in the eval loop's module
            if code:
                ranges = _eval_parts(snap, mod, code)
                for i, (start, end) in enumerate(ranges):
                    lo[i], hi[i] = start, end
                return mod, len(ranges)
    return None, 0


_EVAL_PARTS = {}   # (interpreter file, its identity, load bias) -> its eval loop's ranges, across dumps
_MAX_EVAL_PARTS = 64


def _eval_parts(snap: Snapshot, mod, code: int) -> tuple:
    """[(lo, hi)] of the eval loop in the interpreter module mod; remembered across dumps of a process
    while the file is the same one (the scan of a stripped interpreter's image takes ~4 ms)."""
    key = (mod.path, _identity(mod.path), mod.bias)
    parts = _EVAL_PARTS.get(key)
    if parts is None:
        lo, hi = ffi.new("uintptr_t[]", lib.BTC_REMOTE_MAX_EVAL), ffi.new("uintptr_t[]", lib.BTC_REMOTE_MAX_EVAL)
        n = lib.btc_rmodules_eval_ranges(snap.modules.handle, mod.bias + code, lo, hi, lib.BTC_REMOTE_MAX_EVAL)
        parts = tuple(zip(lo[0:n], hi[0:n]))
        if key[1] is not None:
            if len(_EVAL_PARTS) >= _MAX_EVAL_PARTS:
                _EVAL_PARTS.clear()
            _EVAL_PARTS[key] = parts
    return parts


# ---- stacks of a snapshot ----

def _fill(snap: Snapshot, merger: _Merger, native: bool) -> tuple:
    """(The btc_remote_stack array of snap's threads then greenlets, filled for the merge; each stack's notes
    so far; each greenlet's thread or None)."""
    stacks = ffi.new("btc_remote_stack[]", max(1, len(snap.threads) + len(snap.greenlets)))
    for i, t in enumerate(snap.threads):
        merger.thread(stacks[i], t)
    notes = [() if t.regs is not None and t.stack else (t.error,) for t in snap.threads]
    notes += [(g.error, None) for g in snap.greenlets]
    holders, thread = [], None
    for g in snap.greenlets:
        thread = _holder(snap, g, thread)
        holders.append(thread)
    at, walk = len(snap.threads), bool(native and snap.greenlet_code is not None)
    for records, group in itertools.groupby(snap.greenlets, key=_records_of):
        group = list(group)
        for i in merger.greenlets(stacks + at, records, group, walk):
            g = group[i]
            data = _greenlet_bytes(g, holders[at - len(snap.threads) + i])
            if data is None:
                notes[at + i] = (g.error, _UNWALKED)
            else:
                merger.copy(stacks[at + i], g.start, data, 0 if g.main else g.stop)
        at += len(group)
    return stacks, notes, holders


_records_of = operator.attrgetter("records")


def _holder(snap: Snapshot, g, last):
    """The thread whose stack holds g's part still in place, or None; last: the previous greenlet's (most
    greenlets lie on the same one: tried first)."""
    inside = g.start if g.main else g.stop - 1
    if last is not None and last.mapping[0] <= inside < last.mapping[1]:
        return last
    return next((t for t in snap.threads if t.mapping[0] <= inside < t.mapping[1]), None)


def _stacks(snap: Snapshot, merger: _Merger, native: bool, frames: bool = True) -> tuple:
    """([ProcessStack] of snap, the naming started ahead of its native frames or None).  frames: each stack's
    frames named (else left empty: the text, JSON and HTML renderers name backtraces)."""
    stacks, notes, holders = _fill(snap, merger, native)
    merged = merger.merge(stacks, len(snap.threads) + len(snap.greenlets))
    ahead = merger.names.name_ahead(merger.distinct()) if native else None
    try:
        return _shown(snap, merger, notes, holders, merged, frames), ahead
    except BaseException:
        if ahead is not None:
            ahead.end()
        raise


def _shown(snap: Snapshot, merger: _Merger, notes: list, holders: list, merged: list, frames: bool) -> list:
    labels = remote_names.Labels(snap)
    thread_names = labels.thread_names()
    shown = [ProcessStack("thread", f"Thread {t.tid}" + (" (main thread)" if t.tid == snap.pid else ""), t.tid,
                          thread_name=thread_names.get(t.tid)) for t in snap.threads]
    for g, thread, label in zip(snap.greenlets, holders, labels.labels(snap.greenlets)):
        tid = thread.tid if thread else None
        # (by position: kind, name, tid, frames, error, backtrace, address, parent, spawned_by, thread_name;
        # by keyword, 10,000 of them took 2 ms more)
        shown.append(ProcessStack("greenlet", label.name, tid, [], None, None, g.address, label.parent,
                                  label.spawned_by, thread_names.get(tid)))
    for stack, note, (bt, shared, cut, unwalked) in zip(shown, notes, merged):
        stack.backtrace = bt
        if unwalked or cut or shared.wrong or any(note):   # (most stacks: nothing to say)
            stack.error = _noted(*note, _UNWALKED if unwalked else None, cut, shared.wrong)
    shown += remote_tasks.stacks(snap, merger.names, shown)
    spawned = remote_spawn.chains(snap, merger)
    for stack in shown if spawned else ():
        stack.spawn = spawned.get(stack.address) if stack.kind != "thread" else None
    if frames:
        for stack, (_, shared, _, _) in zip(shown, merged):
            stack.frames = shared.frames   # shared by identical stacks: read-only
    return shown


class Walker:
    """Walks and merges every stack of successive snapshots of one live target
    (the outside profiler's samples: btcore/profile/remote.py), naming
    nothing: their RemoteBacktraces share one naming space (`names`, whose
    frames(addr, lasti, kind, flags) names a record), so a raw frame is named
    once for a whole recording, and only when asked."""

    def __init__(self, snap: Snapshot, native: bool = True):
        self._merger, self._native = _Merger(snap, native), native

    @property
    def names(self):
        return self._merger.names

    def walk(self, snap: Snapshot) -> list:
        """[RemoteBacktrace] of snap's threads, then of its greenlets, in snap's order."""
        stacks, _, _ = _fill(snap, self._merger, self._native)
        try:
            return [bt for bt, _, _, _ in self._merger.merge(stacks, len(snap.threads) + len(snap.greenlets), named=False)]
        finally:
            self._merger.forget_buffers()


def _noted(*why) -> str | None:
    """A stack's error: what went wrong with it, first things first."""
    return "; ".join(w for w in why if w) or None


_UNWALKED = "its saved stack is not in the copies made: Python frames only"


def _greenlet_bytes(g, thread):
    """[start, stop) of a suspended greenlet whose heap copy is not all of its
    stack (btc_remote_greenlet_stacks() fills the others): that copy of the low
    part, then the part still in place on its thread's stack (copied with it)."""
    in_place_lo = g.start + g.saved
    if g.spill is None:
        return None
    if thread is None or in_place_lo < thread.stack_lo:
        return None
    hi = thread.stack_lo + len(thread.stack) if g.main else g.stop
    return bytes(g.spill) + thread.stack[in_place_lo - thread.stack_lo: hi - thread.stack_lo]


# ---- core files ----

def _snapshot_core(core: str, exe: str | None, threads_only: bool) -> Snapshot:
    try:   # a regular file only: opening a FIFO would wait for its writer
        if exe is not None:
            os.close(open_regular(exe))
        f = os.fdopen(open_regular(core), "rb")
    except OSError as e:
        raise DumpError(f"cannot read the {'core file' if e.filename == core else 'executable'} {e.filename}: "
                        f"{e.strerror or e}") from None
    memory = Memory(lib.btc_rmem_open_segments(), [f])
    try:
        mappings, regs_of, vdso, cut = _read_core(core, f, memory)
        notes = [f"the core file {cut}: the memory past its end is missing"] if cut else []
        return _snapshot_core_memory(memory, mappings, regs_of, vdso, exe, threads_only, notes)
    except BaseException:
        memory.close()
        raise


_CORE_ROOM = (1024, 256, 1024, 1 << 16)   # first guess of segments, threads, files, path bytes


def _core_notes(core: str, f):
    """The btc_core of a core file (native/symbols/elf_core.c), read again
    with the room the first read said it needs."""
    segments, threads, files, paths = _CORE_ROOM
    for _ in range(2):
        c = ffi.new("btc_core *")
        keep = [ffi.new("btc_core_segment[]", segments), ffi.new("btc_core_thread[]", threads),
                ffi.new("btc_core_file[]", files), ffi.new("char[]", paths)]
        c.segments, c.threads, c.files, c.paths = keep
        c.max_segments, c.max_threads, c.max_files, c.paths_size = segments, threads, files, paths
        rc = lib.btc_core_read(f.fileno(), c)
        if rc == 0:
            return c, keep
        if rc != -3:
            raise DumpError(_not_read(core, f, rc))
        segments, threads, files, paths = c.nsegments, c.nthreads, c.nfiles, c.paths_used
    raise DumpError(f"{core}: its notes changed while read")


_ELF_KINDS = {1: "a relocatable object", 2: "an executable", 3: "a shared object or executable"}   # e_type


def _not_read(core: str, f, rc: int) -> str:
    """Why btc_core_read() refused the file (rc -1: unreadable headers, -2: not an x86-64 core), from its
    ELF header's e_type."""
    head = os.pread(f.fileno(), 18, 0)
    kind = int.from_bytes(head[16:18], "little") if len(head) == 18 and head[:4] == b"\x7fELF" else None
    if kind == 4:   # ET_CORE
        return (f"{core} is the core file of another machine than x86-64" if rc == -2 else
                f"{core} is a core file cut short (truncated) before the end of its headers")
    return f"{core} is not a core file" + (f" (it is {_ELF_KINDS.get(kind, 'another ELF file')})" if kind else "")

def _read_core(core: str, f, memory: Memory) -> tuple:
    """(mappings, tid -> registers (the first thread listed is the process's), vDSO address, what is wrong
    with the file or None) of a core file; its PT_LOAD data becomes memory's first segments."""
    c, _keep = _core_notes(core, f)
    size, needed = os.fstat(f.fileno()).st_size, max((s.offset + s.filesz for s in c.segments[0:c.nsegments]),
                                                      default=0)
    cut = f"it is truncated ({size:,} of {needed:,} bytes)" if size < needed else None
    if not c.nthreads:
        raise DumpError(f"{core} holds no thread (no NT_PRSTATUS note)" + (f": {cut}" if cut else ""))
    mappings = []
    for seg in c.segments[0:c.nsegments]:
        lib.btc_rmem_add_segment(memory.handle, seg.vaddr, seg.filesz, f.fileno(), seg.offset)
        mappings.append(Mapping(seg.vaddr, seg.vaddr + seg.memsz, "", 0, ""))
    for entry in c.files[0:c.nfiles]:
        path = ffi.string(c.paths + entry.path_at).decode("utf-8", "surrogateescape")
        mappings.append(Mapping(entry.lo, entry.hi, "", entry.offset, path))
    regs_of = {}
    for t in c.threads[0:c.nthreads]:
        regs_of[t.tid] = tuple(t.regs)
    return mappings, regs_of, c.vdso or None, cut


def _snapshot_core_memory(memory: Memory, mappings: list, regs_of: dict, vdso, exe, threads_only,
                          notes: list) -> Snapshot:
    unread = {}
    for m in mappings:   # the mappings the core left out: from the files themselves (regular ones only: a
        if not m.path.startswith("/"):   # core's paths are another machine's, maybe a FIFO or a device here)
            continue
        try:
            fm = os.fdopen(open_regular(m.path), "rb")
        except OSError as e:
            if e.errno != errno.ENOENT:
                unread.setdefault(m.path, e.strerror or str(e))
            continue
        memory.keep.append(fm)
        lib.btc_rmem_add_segment(memory.handle, m.lo, m.hi - m.lo, fm.fileno(), m.offset)
    notes += [f"{path} cannot be read here ({why}): only what the core holds of it is read" for path, why in
              unread.items()]
    segment = next((m for m in mappings if not m.path and vdso is not None and m.lo <= vdso < m.hi), None)
    if segment is not None:   # a thread may be stopped inside the vDSO (clock_gettime)
        mappings += vdso_file(Mapping(segment.lo, segment.hi, "", 0, "[vdso]"), memory)
    if exe and not any(os.path.realpath(m.path) == os.path.realpath(exe) for m in mappings if m.path):
        notes.append(f"{exe} is not among the core's mapped files")
    pid = next(iter(regs_of), 0)
    target = Target(pid, memory, [m for m in mappings if m.path] + [m for m in mappings if not m.path], notes)
    threads, greenlets = gather(target, regs_of, threads_only)
    spawn_chains(target, Room(), threads_only)
    return Snapshot(pid, threads, greenlet_copies(target, greenlets), target.modules, memory,
                    target.greenlet_code, target.layout, 0.0, notes, types=target.types)


# ---- public ----

def check_architecture() -> None:
    """Registers (ptrace, a core's NT_PRSTATUS) are read as x86-64's: refuse elsewhere."""
    if os.uname().machine != "x86_64":
        raise DumpError("dumping another process or a core file is implemented on x86-64 only, "
                        f"not {os.uname().machine}")


def process_stacks(pid: int | None = None, *, core: str | None = None, exe: str | None = None,
                   native: bool = True, threads_only: bool = False, timeout: float = 5.0):
    """(Snapshot, [ProcessStack]) of process pid, or of a core file."""
    snap, stacks, _, ahead = _read(pid, core, exe, native, threads_only, timeout, None, frames=True)
    if ahead is not None:
        ahead.end()
    return snap, stacks


MAX_TIMEOUT = 3600.0   # seconds a dump may wait for a thread to stop


def check_target(pid, core, exe, timeout) -> None:
    """TypeError or ValueError for arguments no dump can use (the command's and the API's checks)."""
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int)):
        raise TypeError(f"pid must be an int, not {type(pid).__name__}")
    for name, path in (("core", core), ("exe", exe)):
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"{name} must be a path (str or os.PathLike), not {type(path).__name__}")
    if exe is not None and core is None:
        raise ValueError("the executable (exe) is checked against a core file's mapped files: give the core file")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    if not 0 < timeout <= MAX_TIMEOUT:   # (NaN fails too)
        raise ValueError(f"timeout must be more than 0 and at most {MAX_TIMEOUT:.0f} seconds, got {timeout}")


def _read(pid, core, exe, native: bool, threads_only: bool, timeout: float, crash_record: int | None,
          frames: bool) -> tuple:
    """(Snapshot, [ProcessStack], the crash record's text or "", the naming started ahead (end() it) or
    None); frames: see _stacks()."""
    if (pid is None) == (core is None):
        raise ValueError("give either a pid or a core file")
    check_target(pid, core, exe, timeout)
    check_architecture()
    snap = _snapshot_core(os.fspath(core), exe and os.fspath(exe), threads_only) if core is not None else \
        snapshot_live(pid, threads_only=threads_only, timeout=timeout)
    ahead = None
    try:
        merger = _Merger(snap, native)
        stacks, ahead = _stacks(snap, merger, native, frames)
        return snap, stacks, _crash_text(snap, merger, crash_record) if crash_record is not None else "", ahead
    except BaseException:
        if ahead is not None:
            ahead.end()
        raise
    finally:
        snap.memory.close()


# ---- the crash report's record (native/watch/crash.c), read from the crashed process ----

_CRASH_RECORD_BYTES = ffi.sizeof("btc_crash_record")
_CRASH_FRAMES_AT = ffi.offsetof("btc_crash_record", "frames")


def _crash_text(snap: Snapshot, merger: _Merger, address: int) -> str:
    """The crash handler's record at address in the target: the crashing
    thread at the fault and its greenlet's spawn sites, named, each with
    its token."""
    data = snap.memory.read(address, _CRASH_RECORD_BYTES)
    record = ffi.cast("btc_crash_record *", ffi.from_buffer(data)) if data else None
    if record is None or record.magic != lib.BTC_CRASH_MAGIC:
        return f"(the crash handler's record at {address:#x} cannot be read or is not complete)\n"
    parts = []
    for i in range(min(record.nstacks, len(record.stacks))):
        st = record.stacks[i]
        first = min(st.first, lib.BTC_CRASH_FRAMES)
        n = min(st.n, lib.BTC_CRASH_FRAMES - first)
        at = _CRASH_FRAMES_AT + first * RECORD.size
        bt, _ = merger.backtrace(data[at:at + n * RECORD.size], st.truncated)
        if i == 0:
            title = "The crashing thread at the fault, named (the handler's record):"
        else:
            title = f"spawned by {merger.names.string(st.object) or '?'} at:"
        if i == 1:
            title = f"The crashing greenlet: <{_c_string(snap, record.greenlet_type)} at {record.greenlet:#x}>\n{title}"
        parts.append(f"{title}\n{bt.format(most_recent_first=True, header=False)}\n  token: {bt.encode()}")
    return "\n\n".join(parts) + "\n\n"


def _c_string(snap: Snapshot, address: int, most: int = 128) -> str:
    data = snap.memory.read(address, most) if address else None
    return data.split(b"\0", 1)[0].decode("utf-8", "replace") if data else "?"


def dump_process(pid: int | None = None, file=None, *, core: str | None = None, exe: str | None = None,
                 format: str = "text", native: bool = True, threads_only: bool = False,
                 timeout: float = 5.0, tokens: bool = False, crash_record: int | None = None) -> None:
    """Write every thread's running stack and every suspended greenlet of
    process pid (or of a core file, with the executable that made it) to
    file (default: sys.stdout), from outside: nothing runs in the target,
    which is stopped only while its state is copied.

    format: "text", "json" or "html", rendered as dump_all() renders a
    process's own greenlets (identical stacks grouped, largest group first;
    the JSON schema of btcore/views/schema.py; the page of write_html()).
    native=False: Python frames only.  threads_only: no greenlets.
    timeout: seconds to wait for each thread to stop.
    tokens: text only, each stack followed by its token (btcore.decode(),
    `python -m btcore decode`).  crash_record: the address of the crash
    report's record in the target (the crash report's helper): the crashing
    thread at the fault and its greenlet's spawn chain, named, first.
    Raises DumpPermissionError (what to change to be allowed) or DumpError.
    """
    if format not in ("text", "json", "html"):
        raise ValueError(f"format must be 'text', 'json' or 'html', not {format!r}")
    # Tens of thousands of small objects (a stack, a Backtrace and an entry per greenlet): collections in
    # their middle cost ~10% of the dump (10,000 greenlets), and find nothing to free.
    with dump.GCHeld():
        snap, stacks, crash, ahead = _read(pid, core, exe, native, threads_only, timeout, crash_record, frames=False)
        try:   # the native frames are named ahead while the stacks are grouped and drawn
            text = crash + _render(snap, stacks, core, format, _token_text if tokens else dump.stack_text)
        finally:
            if ahead is not None:
                ahead.end()
    dump.write_text(sys.stdout if file is None else file, text)


class RemoteInfo:
    """One stack of another process as views/dump.py renders it: the attributes
    of a GreenletInfo (btcore/capture/introspect.py), from what the dump read."""

    __slots__ = ("greenlet", "thread_id", "thread_name", "state", "parent", "spawned_by", "under", "name",
                 "backtrace", "python_only", "spawn_chain", "spawn_backtrace", "last_ran", "error")
    task = None   # not an asyncio task (views/dump.py asks each entry: found here, not by a failed lookup)

    def __init__(self, stack: ProcessStack, greenlet, thread):
        self.greenlet, self.name, self.backtrace, self.error = greenlet, stack.name, stack.backtrace, stack.error
        self.state = "running" if stack.kind == "thread" else "suspended"
        self.thread_id = (thread.thread_id or None) if thread else None
        self.thread_name = (stack.thread_name or fallback_name(thread.tid)) if thread else None
        self.parent = self.spawned_by = self.under = self.spawn_chain = self.spawn_backtrace = None
        self.last_ran, self.python_only = None, False


def _infos(snap: Snapshot, stacks: list) -> list:
    """RemoteInfos of the stacks, their parents and spawners the RemoteGreenlets of this dump (one object
    per address, so the tree finds them; a greenlet not in the dump, the one a thread runs, by its address
    alone), each placed in the tree by the in-process rule."""
    threads = {t.tid: t for t in snap.threads}
    addresses = [(t.tstate, "thread state") for t in snap.threads] + [(g.address, g.type_name)
                                                                       for g in snap.greenlets]
    infos = [RemoteInfo(s, RemoteGreenlet(*where), threads.get(s.tid)) for s, where in zip(stacks, addresses)]
    by_address = {info.greenlet.address: info.greenlet for info, s in zip(infos, stacks) if s.kind == "greenlet"}
    known = lambda address: by_address.get(address) or (RemoteGreenlet(address, "greenlet") if address else None)  # noqa: E731
    for info, s in zip(infos, stacks):   # (most greenlets: a parent in the dump, no spawner)
        info.parent = by_address.get(s.parent) or known(s.parent)
        info.spawned_by = known(s.spawned_by) if s.spawned_by else None
    tasks = remote_tasks.infos(snap, stacks, infos)
    infos += tasks
    _spawn_chains(infos, {s.address: s.spawn for s in stacks if s.spawn is not None})
    awaited = [(task, task.under) for task in tasks if task.under is not None]
    place_in_tree(infos)   # under its spawner, else its parent, as inside
    for task, awaiter in awaited:   # a task awaited: under its first awaiter (tasks.place_tasks)
        task.under = awaiter
    return infos


class _Creator:
    """What a spawn chain's link holds of its creator (spawn_chain()'s weak reference): the creator's
    entry in this dump, or None when it has ended."""

    __slots__ = ("greenlet",)

    def __init__(self, g):
        self.greenlet = g

    def __call__(self):
        return self.greenlet


def _spawn_chains(infos: list, spawn: dict) -> None:
    """Give each entry its spawn chain (remote/spawn.py) with its creators as this dump's entries, and the
    chain's sites joined (each distinct chain once: greenlets spawned alike share theirs)."""
    if not spawn:
        return
    entry = {info.greenlet.address: info.greenlet for info in infos}
    for info in infos:
        info.greenlet.name = info.name
    creators, joined = {}, {}
    for info in infos:
        chain, capacity = spawn.get(info.greenlet.address, (None, 0))
        if chain is None:
            continue
        done = joined.get(id(chain))
        if done is None:
            links = tuple((site, spawner, _creator(creators, entry, creator, spawner))
                          for site, spawner, creator in chain.links)
            theirs = SpawnChain(links, chain.cut)
            space = links[0][0]._space if links else None   # the dump's names, as its sites'
            done = joined[id(chain)] = theirs, join_chain(_remote_backtrace(space, b"", capacity, False, ()), theirs)
        info.spawn_chain, info.spawn_backtrace = done
        creator = done[0].links[0][2] if done[0].links else None
        if info.spawned_by is None and creator is not None:   # gevent's own link first, as inside (_spawner_of)
            info.spawned_by = creator.greenlet


def _creator(creators: dict, entry: dict, address: int, spawner: str):
    """The link's reference to its creator at address (0: none kept), one per creator."""
    if not address:
        return None
    made = creators.get(address)
    if made is None:
        made = creators[address] = _Creator(entry.get(address) or _running_main(address, spawner))
    return made


# greenlet's repr of a main greenlet: "<greenlet.greenlet object at 0x... (otid=0x...) current active started main>"
_MAIN_REPR = re.compile(r"<([\w.]+) object at 0x([0-9a-f]+) \(otid=0x[0-9a-f]+\)(?: \w+)* main>")


def _running_main(address: int, spawner: str):
    """A creator that is no entry of the dump but lives: the greenlet a thread runs, which the dump names by
    its thread.  When its repr (taken as it spawned) says it is that thread's main greenlet, the entry it has
    inside (dump_all names it by type and address); else None: it is named by that repr."""
    match = _MAIN_REPR.fullmatch(spawner)
    if match is None or int(match.group(2), 16) != address:
        return None
    g = RemoteGreenlet(address, match.group(1))
    g.name = remote_names.plain_label(address, True, match.group(1))
    return g


def _token_text(bt) -> str:
    return f"{dump.stack_text(bt)}\n  token: {bt.encode()}"


def _render(snap: Snapshot, stacks: list, core, format: str, stack_text) -> str:
    infos = _infos(snap, stacks)
    source = f"core file {core}" if core else f"process {snap.pid}"
    if format == "text":
        stopped = f" (stopped {snap.stopped_for * 1000:.1f} ms)" if not core else ""
        return dump.render_text(infos, True, True, stack_text, f"Process dump, {source}", stopped, snap.notes)
    more = {"source": source, "stopped_ms": None if core else snap.stopped_for * 1000, "notes": snap.notes}
    if format == "json":
        return json.dumps(dump.json_document(infos, True, pid=snap.pid, **more), indent=1) + "\n"
    from ..views.html import page
    return page(infos, pid=snap.pid, **more)
