"""dump_process(): every thread's running stack and every suspended greenlet
of another process (live, or a core file), native and Python frames merged,
with no agent inside it.

The target is stopped only while btcore/remote.py copies what the dump
needs; walking the copies (the same DWARF walker as collect(), over a
memory view of the copy: native/remote/rmodules.c), merging and naming
happen after it runs again.
"""
from __future__ import annotations

import json
import os
import platform
import struct
import sys
import time
from dataclasses import dataclass, field

from . import bounds, remote_names
from ._native import ffi, lib
from .frame import NATIVE, PYTHON, Frame
from .resolve import file_symbol, native_frames
from .remote import (DumpError, DumpPermissionError, Mapping, Memory, Snapshot, Target, gather, greenlet_copies,
                     snapshot_live, symbol_value, vdso_file)

__all__ = ["DumpError", "DumpPermissionError", "ProcessStack", "dump_process", "process_stacks"]

_MAX_NATIVE = 256
_EVAL_LOOP = "_PyEval_EvalFrameDefault"


@dataclass
class ProcessStack:
    """One stack of the target: a thread's running stack, or a suspended greenlet's.

    kind      "thread" or "greenlet"
    name      thread: "Thread <tid>"; greenlet: as dump_all() names it (btcore/remote_names.py),
              else "<type at 0x...>"
    tid       the thread it runs on (greenlet: whose stack holds it; None if unknown)
    frames    resolved Frames, innermost first
    error     why the stack is missing or short, or None
    """

    kind: str
    name: str
    tid: int | None
    frames: list = field(default_factory=list)
    error: str | None = None
    address: int | None = None   # greenlet: its object's address in the target
    parent: int | None = None    # greenlet: its parent's address, if known
    spawned_by: int | None = None   # greenlet: its live spawner's address, if known


# ---- walking the copies ----

class _Walker:
    def __init__(self, snap: Snapshot, native: bool):
        self.snap, self.native = snap, native
        self._symbols = {}   # pc (looked-up) -> (module, symbol, start)
        self._names = bounds.Names(snap.memory, snap.layout, snap.types)
        self._named = {}     # raw frame -> (its Frames, what is wrong with it or None)
        code = snap.greenlet_code
        stubs = [(code.stub_lo[i], code.stub_hi[i]) for i in range(code.nstub)] if code else []
        self._end_lo = ffi.new("uintptr_t[2]", [lo for lo, _ in stubs] + [0] * (2 - len(stubs)))
        self._end_hi = ffi.new("uintptr_t[2]", [hi for _, hi in stubs] + [0] * (2 - len(stubs)))
        self._nstub = len(stubs)
        greenlet_mod = snap.modules.named(lambda name: name.startswith("_greenlet"))
        self._greenlet_span = (greenlet_mod.lo, greenlet_mod.hi) if greenlet_mod else (0, 0)
        self._eval_ranges = _eval_ranges(snap)

    def unwind(self, regs, exact: bool, lo: int, data: bytes, last_cfa: int = 0, stub_ends: bool = True) -> list:
        pcs = ffi.new("uintptr_t[]", _MAX_NATIVE)
        copy = ffi.from_buffer(data)
        n = lib.btc_remote_unwind(self.snap.modules.handle, regs, exact, lo, lo + len(data), copy, last_cfa,
                                  self._end_lo, self._end_hi, self._nstub if stub_ends else 0, pcs, _MAX_NATIVE)
        return [(pcs[i], exact and i == 0) for i in range(n)]

    def symbol(self, lookup: int):
        found = self._symbols.get(lookup)
        if found is None:
            mod = self.snap.modules.at(lookup)
            name, start = file_symbol(mod.path, lookup - mod.bias) if mod else (None, None)
            found = self._symbols[lookup] = (mod, name, start)
        return found

    def in_eval_loop(self, pc: int, exact: bool) -> bool:
        lookup = pc if exact else pc - 1
        if any(lo <= lookup < hi for lo, hi in self._eval_ranges):
            return True
        name = self.symbol(lookup)[1]
        return bool(name) and (name == _EVAL_LOOP or name.startswith(_EVAL_LOOP + "."))

    def internal(self, pc: int, exact: bool) -> bool:
        lo, hi = self._greenlet_span
        return lo <= (pc if exact else pc - 1) < hi

    def merge(self, natives: list, pyframes: list, greenlet: bool) -> list:
        """Raw merged frames: ("native", pc, exact) and ("python", code, lasti).
        Each eval-loop frame becomes the Python frames it runs, up to and
        including the next entry frame; leftovers are appended (never fails)."""
        if greenlet:   # greenlet's own switching machinery, as collect() hides it
            while natives and self.internal(*natives[0]):
                natives = natives[1:]
            while natives and self.internal(*natives[-1]):
                natives = natives[:-1]
        out, py = [], list(pyframes)
        for pc, exact in natives:
            if self.in_eval_loop(pc, exact):
                taken = 0
                while py:
                    code, lasti, entry = py.pop(0)
                    out.append(("python", code, lasti))
                    taken += 1
                    if entry:
                        break
                if taken or not self.native:
                    continue
            if self.native:
                out.append(("native", pc, exact))
        out.extend(("python", code, lasti) for code, lasti, _ in py)
        return out

    def resolve(self, raw: list) -> tuple:
        """(Frames, what is wrong with them or None) of a merged raw stack; each
        raw frame is named once per dump (10 000 greenlets parked in a few
        places repeat the same frames)."""
        frames, wrong = [], None
        for key in raw:
            named = self._named.get(key)
            if named is None:
                kind, a, b = key
                named = self._named[key] = self._python(a, b) if kind == "python" else (self._native(a, b), None)
            frames.extend(named[0])
            wrong = wrong or named[1]
        return frames, wrong

    def _native(self, pc: int, exact: bool) -> tuple:
        lookup = pc if exact else pc - 1
        mod, name, start = self.symbol(lookup)
        if mod is None:
            return (Frame(NATIVE, pc, None, None, None, None, None),)
        offset = pc - mod.bias - start if name else pc - mod.bias
        return native_frames(pc, mod.path, name, offset, lookup - mod.bias)

    def _python(self, address: int, lasti: int) -> tuple:
        code, wrong = self._names.code(address), None
        if code.error:
            wrong = f"a frame's code at {address:#x}: {code.error}"
        elif not bounds.lasti_ok(code, lasti):
            wrong = f"a frame's instruction offset {lasti} lies outside its code ({code.qualname})"
        frame = Frame(PYTHON, None, code.filename, code.qualname, None, code.filename, bounds.line(code, lasti))
        return (frame,), wrong


_MAX_EVAL_RANGES = 16


def _eval_ranges(snap: Snapshot) -> list:
    """[(lo, hi)] of the target's eval-loop code, with the parts a stripped
    interpreter leaves unnamed (Debian's python3.X: most of the loop)."""
    interpreter = snap.modules.named(lambda name: name.startswith(("libpython", "python")))
    code = symbol_value(interpreter.path, "PyEval_EvalCode") if interpreter else None   # exported: in its code
    if code is None:
        return []
    lo, hi = ffi.new("uintptr_t[]", _MAX_EVAL_RANGES), ffi.new("uintptr_t[]", _MAX_EVAL_RANGES)
    n = lib.btc_rmodules_eval_ranges(snap.modules.handle, interpreter.bias + code, lo, hi, _MAX_EVAL_RANGES)
    return [(lo[i], hi[i]) for i in range(n)]


# ---- stacks of a snapshot ----

def _stacks(snap: Snapshot, native: bool) -> list:
    walker = _Walker(snap, native)
    stacks = []
    for t in snap.threads:
        name = f"Thread {t.tid}" + (" (main thread)" if t.tid == snap.pid else "")
        pyframes, cut = _uncut(t.pyframes)
        if t.regs is None or not t.stack:
            frames, wrong = walker.resolve([("python", c, l) for c, l, _ in pyframes])
            stacks.append(ProcessStack("thread", name, t.tid, frames, _noted(t.error, cut, wrong)))
            continue
        natives = walker.unwind(t.regs, True, t.stack_lo, t.stack) if native else []
        frames, wrong = walker.resolve(walker.merge(natives, pyframes, False))
        stacks.append(ProcessStack("thread", name, t.tid, frames, _noted(cut, wrong)))
    labels = remote_names.Labels(snap) if snap.greenlets else None
    for g in snap.greenlets:
        stacks.append(_greenlet_stack(snap, walker, g, native, labels.label(g)))
    return stacks


def _uncut(pyframes: list) -> tuple:
    """(The Python frames, why their chain was cut short or None): a walk
    that met garbage ends its chain with a frame of code 0 (bounds.CUT_*)."""
    if pyframes and pyframes[-1][0] == 0:
        return pyframes[:-1], bounds.cut_reason(pyframes[-1][1])
    return pyframes, None


def _noted(*why) -> str | None:
    """A stack's error: what went wrong with it, first things first."""
    return "; ".join(w for w in why if w) or None


def _greenlet_stack(snap: Snapshot, walker: _Walker, g, native: bool, label) -> ProcessStack:
    # The thread whose stack holds the greenlet's part still in place.
    inside = g.start if g.main else g.stop - 1
    thread = next((t for t in snap.threads if t.mapping[0] <= inside < t.mapping[1]), None)
    stack = ProcessStack("greenlet", label.name, thread.tid if thread else None, address=g.address,
                         parent=label.parent, spawned_by=label.spawned_by)
    pyframes, cut = _uncut(g.pyframes)
    natives = []
    if native and snap.greenlet_code is not None and g.error is None:
        data = _greenlet_bytes(g, thread)
        code = snap.greenlet_code
        bp, bx = _word_at(data, code.bp_slot), _word_at(data, code.bx_slot)
        if data is not None and bp is not None and bx is not None:
            natives = walker.unwind((code.resume_pc, g.start, bp, bx), False, g.start, data,
                                    0 if g.main else g.stop, stub_ends=False)
        else:
            stack.error = "its saved stack is not in the copies made: Python frames only"
    stack.frames, wrong = walker.resolve(walker.merge(natives, pyframes, True))
    stack.error = _noted(g.error, stack.error, cut, wrong)
    return stack


def _greenlet_bytes(g, thread):
    """[start, stop) of a suspended greenlet: greenlet's heap copy of the low
    part, then the part still in place on its thread's stack (copied with it)."""
    in_place_lo = g.start + g.saved
    if g.spill is None:
        return None
    if not g.main and in_place_lo >= g.stop:
        return g.spill
    if thread is None or in_place_lo < thread.stack_lo:
        return None
    hi = thread.stack_lo + len(thread.stack) if g.main else g.stop
    return bytes(g.spill) + thread.stack[in_place_lo - thread.stack_lo: hi - thread.stack_lo]


def _word_at(data, at: int):
    return None if data is None else struct.unpack_from("<Q", data, at)[0] if 0 <= at <= len(data) - 8 else None


# ---- core files ----

def _snapshot_core(core: str, exe: str | None, threads_only: bool) -> Snapshot:
    f = open(core, "rb")
    memory = Memory(lib.btc_rmem_open_segments(), [f])
    try:
        mappings, regs_of, vdso = _read_core(core, f, memory)
        return _snapshot_core_memory(memory, mappings, regs_of, vdso, exe, threads_only)
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
            raise DumpError(f"{core} is not a core file" + (" of an x86-64 process" if rc == -2 else ""))
        segments, threads, files, paths = c.nsegments, c.nthreads, c.nfiles, c.paths_used
    raise DumpError(f"{core}: its notes changed while read")


def _read_core(core: str, f, memory: Memory) -> tuple:
    """(mappings, tid -> registers (the first thread listed is the process's), vDSO address) of
    a core file; its PT_LOAD data becomes memory's first segments."""
    c, _keep = _core_notes(core, f)
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
    return mappings, regs_of, c.vdso or None


def _snapshot_core_memory(memory: Memory, mappings: list, regs_of: dict, vdso, exe, threads_only) -> Snapshot:
    notes = []
    for m in mappings:   # the mappings the core left out: from the files themselves
        if m.path.startswith("/") and os.path.exists(m.path):
            fm = open(m.path, "rb")
            memory.keep.append(fm)
            lib.btc_rmem_add_segment(memory.handle, m.lo, m.hi - m.lo, fm.fileno(), m.offset)
    segment = next((m for m in mappings if not m.path and vdso is not None and m.lo <= vdso < m.hi), None)
    if segment is not None:   # a thread may be stopped inside the vDSO (clock_gettime)
        mappings += vdso_file(Mapping(segment.lo, segment.hi, "", 0, "[vdso]"), memory)
    if exe and not any(m.path == exe for m in mappings):
        notes.append(f"{exe} is not among the core's mapped files")
    pid = next(iter(regs_of), 0)
    target = Target(pid, memory, [m for m in mappings if m.path] + [m for m in mappings if not m.path], notes)
    threads, greenlets = gather(target, regs_of, threads_only)
    return Snapshot(pid, threads, greenlet_copies(target, greenlets), target.modules, memory,
                    target.greenlet_code, target.layout, 0.0, notes, types=target.types)


# ---- public ----

def _check_architecture() -> None:
    """Registers (ptrace, a core's NT_PRSTATUS) are read as x86-64's: refuse elsewhere."""
    if platform.machine() != "x86_64":
        raise DumpError("dumping another process or a core file is implemented on x86-64 only, "
                        f"not {platform.machine()}")


def process_stacks(pid: int | None = None, *, core: str | None = None, exe: str | None = None,
                   native: bool = True, threads_only: bool = False, timeout: float = 5.0):
    """(Snapshot, [ProcessStack]) of process pid, or of a core file."""
    if (pid is None) == (core is None):
        raise ValueError("give either a pid or a core file")
    _check_architecture()
    snap = _snapshot_core(core, exe, threads_only) if core else \
        snapshot_live(pid, threads_only=threads_only, timeout=timeout)
    try:
        return snap, _stacks(snap, native)
    finally:
        snap.memory.close()


def dump_process(pid: int | None = None, file=None, *, core: str | None = None, exe: str | None = None,
                 format: str = "text", native: bool = True, threads_only: bool = False,
                 timeout: float = 5.0) -> None:
    """Write every thread's running stack and every suspended greenlet of
    process pid (or of a core file, with the executable that made it) to
    file (default: sys.stdout), from outside: nothing runs in the target,
    which is stopped only while its state is copied.

    format: "text" (identical stacks grouped, largest group first) or "json".
    native=False: Python frames only.  threads_only: no greenlets.
    timeout: seconds to wait for each thread to stop.
    Raises DumpPermissionError (what to change to be allowed) or DumpError.
    """
    if format not in ("text", "json"):
        raise ValueError(f"format must be 'text' or 'json', not {format!r}")
    snap, stacks = process_stacks(pid, core=core, exe=exe, native=native, threads_only=threads_only,
                                  timeout=timeout)
    text = _json(snap, stacks) if format == "json" else _text(snap, stacks, core)
    out = sys.stdout if file is None else file
    out.write(text)
    out.flush()


def _groups(stacks: list) -> list:
    groups = {}
    for s in stacks:
        key = (s.kind,) + (tuple(s.frames), s.error) if s.kind == "greenlet" else (id(s),)
        groups.setdefault(key, []).append(s)
    threads = [g for g in groups.values() if g[0].kind == "thread"]
    greenlets = sorted((g for g in groups.values() if g[0].kind == "greenlet"), key=lambda g: -len(g))
    return threads + greenlets


def _text(snap: Snapshot, stacks: list, core) -> str:
    groups = _groups(stacks)
    nthreads = sum(1 for s in stacks if s.kind == "thread")
    ngreenlets = len(stacks) - nthreads
    source = f"core file {core}" if core else f"process {snap.pid}"
    out = [f"Process dump, {source}: {nthreads} thread{'s' if nthreads != 1 else ''}, "
           f"{ngreenlets} suspended greenlet{'s' if ngreenlets != 1 else ''}, {len(groups)} distinct stacks"
           + (f" (stopped {snap.stopped_for * 1000:.1f} ms)" if not core else "")]
    out.extend(f"note: {n}" for n in snap.notes)
    for number, group in enumerate(groups, 1):
        first = group[0]
        if first.kind == "thread":
            out.append(f"\n=== stack {number}: {first.name} ===")
        else:
            names = ", ".join(s.name for s in group[:3]) + (f" (+{len(group) - 3} more)" if len(group) > 3 else "")
            threads = sorted({str(s.tid) for s in group})
            out.append(f"\n=== stack {number}: {len(group)} greenlet{'s' if len(group) != 1 else ''}, suspended ===")
            out.append(f"  e.g. {names}")
            out.append(f"  thread{'s' if len(threads) > 1 else ''}: {', '.join(threads)}")
        if first.error:
            out.append(f"  ({first.error})")
        out.append("Traceback (most recent call last):" if first.frames else "  (no frames)")
        out.extend(f.format() for f in reversed(first.frames))
    return "\n".join(out) + "\n"


def _json(snap: Snapshot, stacks: list) -> str:
    groups = _groups(stacks)
    doc = {
        "version": 1,
        "pid": snap.pid,
        "time": time.time(),
        "stopped_ms": snap.stopped_for * 1000,
        "notes": snap.notes,
        "stacks": [{"id": n, "kind": g[0].kind, "count": len(g), "error": g[0].error,
                    "members": [{"name": s.name, "tid": s.tid, "address": s.address, "parent": s.parent,
                                 "spawned_by": s.spawned_by} for s in g],
                    "frames": [{"kind": f.kind, "function": f.function, "file": f.file, "line": f.line,
                                "module": f.module, "ip": f.ip, "offset": f.offset, "inlined": f.inlined}
                               for f in g[0].frames]}
                   for n, g in enumerate(groups, 1)],
    }
    return json.dumps(doc, indent=1) + "\n"
