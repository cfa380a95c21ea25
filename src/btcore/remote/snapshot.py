"""Reading another process from outside: a live one (ptrace, process_vm_readv)
or a core file.  What is read while the target is stopped is a Snapshot:
registers and stack copies of every thread, the interpreter's thread states
and every suspended greenlet's saved state and Python frames, as raw
addresses.  Walking and naming (btcore/remote/process.py) happen after the target
runs again, from these copies.
"""
from __future__ import annotations

import atexit
import bisect
import contextlib
import errno
import functools
import mmap
import os
import signal
import time
from dataclasses import dataclass, field

import greenlet

from . import bounds

from . import debug_offsets

from . import greenlet_offsets

from . import spawn as remote_spawn

from .names import shown

from . import tasks as remote_tasks
from .._native import ffi, lib
from ..codec import file_build_id
from ..symbols.elf_files import symbol_value
from ..symbols.resolve import open_regular
from ..capture.records import GREENLET, PYFRAME, record_struct
from ..capture.threads import is_main_thread, real_thread

_MAX_STACK_COPY = bounds.MAX_READ   # bytes of a thread's stack copied, from its sp up
_MAX_GREENLETS = 1 << 20
_MAX_PYFRAMES = bounds.MAX_FRAMES   # per stack
_SCRATCH = 1 << 16            # reads up to this size reuse one buffer
_MAX_CHUNKS = 1 << 15         # the chunk cache's bound (native/remote/rmem.c)
_PAGE = 4096


class DumpError(RuntimeError):
    """btcore cannot dump that process (gone, unsupported, unreadable)."""


class DumpPermissionError(DumpError, PermissionError):
    """The system does not let this process read the target (ptrace rules)."""


def permission_advice(pid: int, why: str, tid: int | None = None) -> str:
    """One message saying what to change, from what this machine says; tid: the thread the dump could not
    stop (another tracer may hold it)."""
    scope = _read_text("/proc/sys/kernel/yama/ptrace_scope")
    owner = _owner(pid)
    text = f"cannot read process {pid}: {why}. "
    tracer = _tracer(pid, tid) if tid is not None else None
    if tracer:
        return text + (f"It is {tracer}: a thread has one tracer at a time. Detach that one (gdb: detach; "
                       "strace: Ctrl-C) or let it finish, then dump again.")
    if os.geteuid() != 0 and owner is not None and owner != os.geteuid():
        return text + (f"It belongs to uid {owner}, this dump runs as uid {os.geteuid()}: "
                       "run the dump as root (sudo) or as the target's user.")
    if scope == "1" and os.geteuid() != 0:
        return text + ("kernel.yama.ptrace_scope is 1 (only a parent may read its children): run the dump "
                       "as root (sudo), or allow it with: sudo sysctl kernel.yama.ptrace_scope=0.")
    if scope == "2" and os.geteuid() != 0:
        return text + "kernel.yama.ptrace_scope is 2 (only CAP_SYS_PTRACE may read a process): run the dump as root."
    if scope == "3":
        return text + "kernel.yama.ptrace_scope is 3: no process may read another until the next reboot."
    if _has_cap_sys_ptrace():
        return text + ("This process has CAP_SYS_PTRACE and the kernel still refused: a security module "
                       "(AppArmor, SELinux, a seccomp filter) or the target itself (a setuid program, prctl "
                       "PR_SET_DUMPABLE 0) forbids it.")
    return text + ("This process lacks CAP_SYS_PTRACE (a container?): run the container with "
                   "--cap-add=SYS_PTRACE (docker, podman) or add SYS_PTRACE to its securityContext "
                   "capabilities (Kubernetes).")


_CAP_SYS_PTRACE = 19


def _has_cap_sys_ptrace() -> bool:
    for line in (_read_text("/proc/self/status") or "").splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> _CAP_SYS_PTRACE & 1)
    return False


def _tracer(pid: int, tid: int) -> str | None:
    """"traced by process N (its name)" if another process traces thread tid of pid, else None."""
    for line in (_read_text(f"/proc/{pid}/task/{tid}/status") or "").splitlines():
        if line.startswith("TracerPid:") and line.split()[1:2] != ["0"]:
            tracer = int(line.split()[1])
            name = "this process: another dump of it" if tracer == os.getpid() else \
                shown(_read_text(f"/proc/{tracer}/comm") or "gone since")
            return f"traced by process {tracer} ({name})"
    return None


def _owner(pid: int):
    for line in (_read_text(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


def _read_text(path: str):
    try:
        with open(path, errors="replace") as f:   # a process names itself with any bytes (prctl PR_SET_NAME)
            return f.read().strip()
    except OSError:
        return None


# ---- memory ----

_MAX_READ_EACH = 64 << 20   # bytes one Memory.read_each() reads

class Memory:
    """The target's memory through the native chunk cache (btc_rmem)."""

    def __init__(self, handle, keep=()):
        self._m = ffi.gc(handle, lib.btc_rmem_close)
        self._keep = list(keep)   # file objects whose descriptors the segments use
        self._scratch = ffi.new("char[]", _SCRATCH)
        self._word = ffi.new("uintptr_t *")

    @property
    def handle(self):
        return self._m

    @property
    def keep(self) -> list:
        """Files whose descriptors its segments read (closed by close())."""
        return self._keep

    def read(self, addr: int, n: int) -> bytes | None:
        # called ~7 times per greenlet a dump names (btcore/remote/names.py): one C call and one copy
        if n == 0:
            return b""
        if not bounds.readable(addr, n):   # addresses and sizes read from the target: anything
            return None
        buf = self._scratch if n <= _SCRATCH else ffi.new("char[]", n)
        return ffi.unpack(buf, n) if lib.btc_rmem_read(self._m, addr, buf, n) == 0 else None

    def word(self, addr: int) -> int | None:
        if not bounds.readable(addr, 8):
            return None
        out = self._word
        return out[0] if lib.btc_rmem_read(self._m, addr, out, 8) == 0 else None

    def read_each(self, addresses: list, n: int) -> tuple:
        """(bytes: the n bytes at each address, one after the other; [was address i's read whole]), in one call
        (btc_rmem_read_each: their chunks prefetched together), where read() for each made a call, and a syscall
        for each new chunk."""
        count = len(addresses)
        if count == 0 or not 0 < n <= bounds.MAX_READ or count * n > _MAX_READ_EACH:
            return b"", [False] * count
        last = bounds.ADDRESS_END - n   # (bounds.readable() of each, inlined: it is called 4,096 times and more)
        at = ffi.new("uintptr_t[]", [a if 0 < a <= last else 0 for a in addresses])
        out, ok = ffi.new("uint8_t[]", count * n), ffi.new("uint8_t[]", count)
        lib.btc_rmem_read_each(self._m, at, count, n, out, ok)
        return ffi.buffer(out)[:], [bool(x) for x in ffi.unpack(ok, count)]

    def syscalls(self) -> int:
        return lib.btc_rmem_syscalls(self._m)

    def chunks(self):
        """The addresses of the chunks read so far (a C array, for prefetch())."""
        out = ffi.new("uintptr_t[]", _MAX_CHUNKS)
        return out, lib.btc_rmem_chunk_bases(self._m, out, _MAX_CHUNKS)

    def forget(self) -> None:
        lib.btc_rmem_forget(self._m)

    def prefetch(self, chunks) -> None:
        """Read these chunks again, together: a few syscalls."""
        lib.btc_rmem_prefetch(self._m, *chunks)

    def close(self) -> None:
        for f in self._keep:
            f.close()


# ---- modules ----

@dataclass
class Mapping:
    lo: int
    hi: int
    perms: str
    offset: int
    path: str


@dataclass
class Module:
    path: str
    bias: int
    lo: int    # lowest mapped address
    hi: int


def parse_maps(text: str) -> list:
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        out.append(Mapping(lo, hi, parts[1], int(parts[2], 16), parts[5] if len(parts) > 5 else ""))
    return out


class Modules:
    """The target's ELF modules, tables built from the files on disk."""

    def __init__(self, mappings: list, memory: Memory | None, notes: list):
        self._set = ffi.gc(lib.btc_rmodules_new(), lib.btc_rmodules_free)
        self.list = []
        first = {}
        for m in mappings:
            if m.path.startswith("/") and m.path not in first:
                first[m.path] = m
        for path, m in first.items():
            bias = ffi.new("uintptr_t *")
            rc = lib.btc_rmodules_add(self._set, memory.handle if memory else ffi.NULL, os.fsencode(path),
                                      m.lo, m.offset, bias)
            if rc == -3:
                notes.append(f"{path}: the file on disk is not the one the target loaded "
                             "(build-id differs): its frames are not walked or named")
            if rc == 0:
                spans = [x for x in mappings if x.path == path]
                self.list.append(Module(path, bias[0], min(x.lo for x in spans), max(x.hi for x in spans)))
        self.list.sort(key=lambda mod: mod.lo)
        self._los = [mod.lo for mod in self.list]

    @property
    def handle(self):
        return self._set

    def at(self, pc: int) -> Module | None:
        i = bisect.bisect_right(self._los, pc) - 1
        return self.list[i] if i >= 0 and pc < self.list[i].hi else None

    def named(self, predicate) -> Module | None:
        return next((m for m in self.list if predicate(os.path.basename(m.path))), None)


# ---- what is copied while the target is stopped ----

@dataclass
class ThreadCopy:
    tid: int
    regs: tuple | None          # ip, sp, rbp, rbx (None: not stopped)
    stack_lo: int = 0
    stack: bytes = b""          # the target's [stack_lo, stack_lo + len(stack))
    mapping: tuple = (0, 0)     # [lo, hi) of the mapping holding its stack
    tstate: int = 0
    thread_id: int = 0          # pthread id, from the thread state
    pyframes: list = field(default_factory=list)
    error: str | None = None


@dataclass(eq=False)   # one stop's: compared by identity (process._fill groups greenlets by them)
class GreenletRecords:
    """One interpreter's suspended greenlets as a stop copied them: btc_remote_greenlet rows (states), the
    heap copies of their saved stacks (spill) and their Python frames (btc_remote_pyframe rows), each row
    saying where its parts are.  remote/process.py fills the stacks of a dump's greenlets from these in C.  They are
    the Room's buffers: valid until its next stop into them (a profiler's Room alternates two sets)."""
    states: memoryview
    spill: object
    frames: memoryview


@dataclass(slots=True)
class GreenletCopy:
    address: int
    type_name: str
    start: int
    stop: int
    saved: int
    main: bool
    records: GreenletRecords    # its interpreter's, which hold its saved stack and Python frames
    row: int                    # its row there
    error: str | None = None    # why its state could not be used (a corrupt target)
    reused: bool = False        # spill is the previous stop's copy: its state had not changed (Room.alternate)

    @property
    def spill(self) -> memoryview | None:
        """[start, start + saved), from greenlet's heap copy (None: unreadable or not copied): a view of the
        stop's one buffer."""
        spill_at, copied = _ROW_SPILL.unpack_from(self.records.states, self.row * GREENLET.size)
        return memoryview(self.records.spill)[spill_at: spill_at + self.saved] if copied else None

    @property
    def pyframes(self) -> memoryview:
        """Its Python frames: btc_remote_pyframe records, innermost first."""
        at, n = _ROW_FRAMES.unpack_from(self.records.states, self.row * GREENLET.size)
        return self.records.frames[at * PYFRAME.size: (at + n) * PYFRAME.size]


_ROW_SPILL = record_struct("btc_remote_greenlet", "spill_at", "copied")     # parts of a row read by themselves
_ROW_FRAMES = record_struct("btc_remote_greenlet", "frames_at", "nframes")


@dataclass
class KnownGreenlets:
    """The greenlet objects a complete walk of an interpreter's gc lists found (alive or not by now), and
    the lists but the youngest as they were then (Target.settled_lists): a new greenlet can only be in the
    youngest list or in one of those that changed since, and a stop walks those alone and checks these."""
    lists: list
    addresses: object   # uintptr_t[]
    n: int


@dataclass
class Snapshot:
    pid: int
    threads: list
    greenlets: list
    modules: Modules
    memory: Memory
    greenlet_code: object | None
    layout: object
    stopped_for: float = 0.0    # seconds the target was stopped
    notes: list = field(default_factory=list)
    stopped_cpu: float = 0.0    # seconds of this thread's CPU time in that window (a loaded machine
                                # stretches stopped_for, not this; the reader's second thread is not counted)
    stopped_reads: int = 0      # syscalls that read its memory in that window
    types: bounds.Types = field(default_factory=bounds.Types)   # the target's type objects (bounds.Names)
    gc_walked: int = 0          # objects of the gc lists walked in that window (the young lists', mostly)


_pyframe_buffer = ffi.new("btc_remote_pyframe[]", _MAX_PYFRAMES)   # reused: the dump runs on one thread


def _pyframes(reader, memory: Memory, layout, addr: int) -> list:
    """[(code, lasti, entry)] innermost first."""
    n = reader(memory.handle, layout, addr, _pyframe_buffer, _MAX_PYFRAMES)
    raw = ffi.buffer(_pyframe_buffer, n * PYFRAME.size)
    return [(code, lasti, bool(entry)) for code, lasti, entry in PYFRAME.iter_unpack(raw)]


def _unreadable(path: str) -> str:
    """Why the file at path cannot be read (strerror), or that it is another build."""
    try:
        os.close(open_regular(path))
    except OSError as e:
        return e.strerror or str(e)
    return "not the build the process loaded"


class Target:
    """What a dump needs to know about the target before stopping it."""

    def __init__(self, pid: int, memory: Memory, mappings: list, notes: list):
        self.pid, self.memory, self.mappings, self.notes = pid, memory, mappings, notes
        self.type_names = {}   # type object address -> tp_name
        self.modules = Modules(mappings, memory, notes)
        self.runtime, self.layout = self._interpreter()
        self.greenlet_type, self.greenlet_code, self.greenlet_offsets = self._greenlet()
        self.known_greenlets = {}   # interpreter -> KnownGreenlets: what the last complete walk found
        self.gc_chunks = None       # the chunks a rehearsal's complete walk read (Memory.chunks())

    def _interpreter(self) -> tuple:
        """(_PyRuntime's address, the layout table to read it with)."""
        for mod in self.modules.list:
            name = os.path.basename(mod.path)
            if name.startswith("libpython") or name.startswith("python"):
                value = symbol_value(mod.path, "_PyRuntime")
                if value:
                    self.types = bounds.Types(*(mod.bias + value if value else 0 for value in (
                        symbol_value(mod.path, name) for name in ("PyCode_Type", "PyUnicode_Type", "PyBytes_Type",
                                                                  "PyFrame_Type"))))
                    return mod.bias + value, self._layout(mod, mod.bias + value)
        named = {mod.path for mod in self.modules.list}
        unread = next((m.path for m in self.mappings if m.path not in named and
                       os.path.basename(m.path).startswith(("libpython", "python"))), None)
        if unread:
            raise DumpError(f"process {self.pid}'s interpreter cannot be read here: {unread}: {_unreadable(unread)} "
                            "(a dump reads its symbols from the file)")
        raise DumpError(f"process {self.pid} is not a CPython process (no _PyRuntime symbol in its modules)")

    def _layout(self, mod: Module, runtime: int):
        """The one layout table (native/remote/pylayout.c) for the target's
        version: 3.11's known one, or its family's constants completed from
        its _Py_DebugOffsets (3.13+), else a DumpError naming the versions."""
        value = symbol_value(mod.path, "Py_Version")
        theirs = self.memory.word(mod.bias + value) if value else None
        lay = ffi.new("btc_remote_layout *")
        known = lib.btc_remote_layout_of(theirs, lay) if theirs is not None else -1
        if known < 0 or known == 1 and not debug_offsets.fill(self.memory, runtime, lay):
            raise DumpError(f"the target runs CPython {_version(theirs) if theirs else 'unknown'}: btcore reads "
                            "3.11 (its known layout) and 3.13-3.15 (their _Py_DebugOffsets)")
        lay.code_type = self.types.code
        return lay

    def thread_frames(self, tstate: int) -> list:
        return _pyframes(lib.btc_remote_thread_frames, self.memory, self.layout, tstate)

    def _greenlet(self):
        """(greenlet's type, its switching code, where its objects keep a
        greenlet's saved state), or (0, None, None) with a note saying why
        suspended greenlets cannot be listed."""
        mod = self.modules.named(lambda name: name.startswith("_greenlet"))
        if mod is None:
            return 0, None, None
        code = ffi.new("btc_remote_greenlet_code *")
        if lib.btc_rmodules_greenlet_shape(self.modules.handle, mod.bias + symbol_value(mod.path, "slp_switch"),
                                           code) != 0:
            self.notes.append("greenlet's switching code has a shape btcore does not know: "
                              "suspended greenlets are not listed")
            return 0, None, None
        greenlet_type = mod.bias + symbol_value(mod.path, "PyGreenlet_Type")
        try:
            if _same_build(mod.path, greenlet._greenlet.__file__):
                return greenlet_type, code, greenlet_offsets.local()
            return greenlet_type, code, self._learned_offsets(mod.path, greenlet_type)
        except greenlet_offsets.Unlearnable as e:
            self.notes.append(f"the target's greenlet ({mod.path}): {e}: suspended greenlets are not listed")
            return 0, None, None

    def _learned_offsets(self, path: str, greenlet_type: int) -> tuple:
        """Offsets learned from the target's own greenlets (greenlet_offsets.learned: a gc walk and up to
        4,096 of them read), once per build of _greenlet (its build-id) while this process lives: they are
        that build's layout, and a profiler from outside dumps the same target again and again."""
        try:
            build = file_build_id(path)
        except OSError:
            build = None
        offsets = _LEARNED.get(build)
        if offsets is None:
            offsets = greenlet_offsets.learned(self.memory, self._some_greenlets(greenlet_type), greenlet_type,
                                               self.types.frame)
            if build is not None:
                if len(_LEARNED) >= _MAX_LEARNED:
                    _LEARNED.clear()
                _LEARNED[build] = offsets
        return offsets

    def _some_greenlets(self, greenlet_type: int) -> list:
        """Greenlet objects of the first interpreter (while it runs: to learn from)."""
        interp = next(self.interpreters(), None)
        if interp is None:
            return []
        heads = self.gc_heads(interp)
        out, visited = ffi.new("uintptr_t[]", greenlet_offsets.SAMPLE), ffi.new("uint64_t *")
        n = lib.btc_remote_gc_instances(self.memory.handle, heads, len(heads), greenlet_type, out,
                                        greenlet_offsets.SAMPLE, visited, ffi.new("int *"))
        return list(out[0:greenlet_offsets.SAMPLE if n < 0 else n])

    def interpreters(self):
        return _linked(self.memory, self.memory.word(self.runtime + self.layout.runtime_interp_head),
                       self.layout.interp_next, _MAX_INTERPRETERS)

    def thread_states(self, interp: int):
        return _linked(self.memory, self.memory.word(interp + self.layout.interp_threads_head),
                       self.layout.tstate_next, _MAX_THREAD_STATES)

    def gc_heads(self, interp: int) -> list:
        """The gc lists' heads: the generations, youngest first, then the permanent one."""
        lay = self.layout
        heads = [interp + lay.interp_gc_generations + i * lay.gc_generation_size for i in range(lay.gc_ngenerations)]
        return heads + [interp + lay.interp_gc_permanent]

    def lists_moved(self) -> bool:
        """Will the gathering walk the oldest gc list or the permanent one (they changed since an
        interpreter's last complete walk, or none was kept)?"""
        known = self.known_greenlets
        return not known or any(k.lists[-2:] != (self.settled_lists(interp) or [])[-2:] for interp, k in known.items())

    def settled_lists(self, interp: int) -> list | None:
        """The `struct gc_generation` (list head, threshold, count) of each gc list but the youngest: an object
        enters one of those only through a collection of the generations before it (which adds to its count,
        or resets the oldest's, and moves objects to its tail: a new tail link) or gc.freeze()/unfreeze() (a
        new tail link of the list merged into).  One unchanged since a walk holds no object it did not hold
        then (objects only leave it otherwise: freed, untracked)."""
        heads, size = self.gc_heads(interp), self.layout.gc_generation_size
        parts = [self.memory.read(head, size) for head in heads[1:]]
        return None if None in parts else parts

    @functools.cached_property
    def map_ranges(self) -> tuple:
        """(lo[], hi[], n) of its mappings, sorted, as C arrays."""
        spans = sorted((m.lo, m.hi) for m in self.mappings)
        return ffi.new("uintptr_t[]", [lo for lo, _ in spans]), ffi.new("uintptr_t[]", [hi for _, hi in spans]), len(spans)

    def stack_mapping(self, sp: int) -> Mapping | None:
        return next((m for m in self.mappings if m.lo <= sp < m.hi), None)


_MAX_INTERPRETERS = 256
_LEARNED = {}            # build-id of a target's _greenlet -> the greenlet offsets learned from it
_MAX_LEARNED = 64        # builds remembered (then forgotten all at once)
_MAX_THREAD_STATES = 65536


def _linked(memory: Memory, at: int | None, link: int, most: int):
    """The nodes of a list the target links through the word at +link: at
    most `most`, each once (a corrupt link may loop), aligned ones only."""
    seen = set()
    while at and not at & 7 and at not in seen and len(seen) < most:
        seen.add(at)
        yield at
        at = memory.word(at + link)


def _same_build(path: str, other: str) -> bool:
    try:
        ours = file_build_id(other)
        return ours is not None and file_build_id(path) == ours
    except OSError:
        return False


def _version(hexversion: int) -> str:
    return f"{hexversion >> 24}.{(hexversion >> 16) & 0xff}"


# ---- the stop ----

class Room:
    """The buffers the stop copies into, made (and their pages touched)
    before it: a rehearsal sizes them, so the stop itself allocates and
    faults in nothing (a fresh 4 MiB buffer costs ~2.5 ms of page faults).
    rehearsal: the gathering made while the target runs, which sizes the
    buffers but copies no greenlet's saved stack (read past the cache, a
    rehearsal learns nothing from them)."""

    def __init__(self, rehearsal: bool = False, spawns: bool = True):
        self.rehearsal = rehearsal
        self.spawns = spawns  # the target's spawn chains are read (a dump); a profiler's samples do without
        self._buffers = {}
        self.walked = 0       # objects of the gc lists the last gathering walked
        self.turn = None      # alternate(): which of the two sets of greenlet buffers the stop fills
        self._previous = {}   # interpreter -> (states, count, heap copies, their size) of the previous stop
        self._pending = {}    # interpreter -> this stop's, and the previous one's as C arguments (finish())
        self.recopy = set()   # addresses of greenlets whose saved stack the next stop reads from the target

    def alternate(self) -> None:
        """Keep each stop's greenlets' states and heap copies for the next one (two sets of buffers, filled in
        turn, the second sized as the first): a profiler's stop then takes an unchanged greenlet's saved stack
        from the previous stop's copy (btc_remote_greenlet_spills), not from the target."""
        if self.turn is not None:
            return
        self.turn = 0
        for key in [key for key in self._buffers if key[-1] in _TURNED]:
            buf = self._buffers.pop(key)
            self._buffers[key + (0,)] = buf
            self.get(key + (1,), len(buf))

    def key(self, interp: int, what: str) -> tuple:
        return (interp, what) if self.turn is None or what not in _TURNED else (interp, what, self.turn)

    def next_stop(self) -> None:
        if self.turn is not None and not self.rehearsal:
            if self._pending:   # the last stop did not finish (an error): its copies are not the previous ones
                self._pending.clear()
                self._previous.clear()
            self.turn ^= 1

    def keep(self, interp: int, states, n: int, spill, size: int, previous: tuple) -> None:
        if self.turn is not None and not self.rehearsal:
            self._pending[interp] = (states, n, spill, size), previous

    def finish(self) -> None:
        """Once the target runs again: the unchanged greenlets' saved stacks copied from the previous stop's
        copies (btc_remote_greenlet_reuse), and this stop's kept for the next."""
        for interp, (now, previous) in self._pending.items():
            states, n, spill, _ = self._previous[interp] = now
            lib.btc_remote_greenlet_reuse(ffi.cast("btc_remote_greenlet *", ffi.from_buffer(states)), n,
                                          ffi.from_buffer(spill), *previous)
        self._pending.clear()

    def previous(self, interp: int) -> tuple:
        """The previous stop's (states, count, heap copies, size) as C arguments; none for a dump."""
        kept = self._previous.get(interp)
        if kept is None:
            return ffi.NULL, 0, ffi.NULL, 0
        states, n, spill, size = kept
        c_states = ffi.cast("btc_remote_greenlet *", ffi.from_buffer(states))
        if self.recopy:   # their copy is stale: they ran and parked again with the same state
            for i in range(n):
                if c_states[i].address in self.recopy:
                    c_states[i].copied = 0
            self.recopy.clear()
        return c_states, n, ffi.from_buffer(spill), size

    def size(self, key) -> int:
        return len(self._buffers.get(key, b""))

    def get(self, key, size: int):
        """A writable buffer (bytearray or mmap) of at least size bytes for key, its pages faulted in."""
        buf = self._buffers.get(key)
        if buf is None or len(buf) < size:
            size += size // 4 + _SCRATCH   # what changes before the stop
            buf = self._buffers[key] = _faulted_in(size)
        return buf


# A large buffer is mapped in transparent huge pages where the kernel gives them (madvise: the dumper's own
# memory, never the target's), its pages populated by the kernel in one call.  47 MB of greenlets' saved stacks
# (10,000 parked gevent greenlets): 17 ms touched page by page from Python, 13 ms populated in 4 KiB pages,
# 4 ms in huge pages.
_MAPPED = 1 << 20
_MADV_POPULATE_WRITE = 23   # Linux 5.14 (Python's mmap module does not name it before 3.13)


def _faulted_in(size: int):
    if size < _MAPPED:
        buf = bytearray(size)
    else:
        buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        with contextlib.suppress(OSError, AttributeError):   # no transparent huge pages: 4 KiB ones
            buf.madvise(mmap.MADV_HUGEPAGE)
        with contextlib.suppress(OSError):
            buf.madvise(_MADV_POPULATE_WRITE)
            return buf
    buf[::_PAGE] = bytes((size + _PAGE - 1) // _PAGE)   # (an older kernel: touched)
    return buf


def gather(target: Target, regs_of: dict, threads_only: bool, room: Room | None = None) -> tuple:
    """Everything the dump reads, while the target is stopped: thread stacks,
    thread states, greenlets (raw: greenlet_copies() unpacks them).
    regs_of: tid -> registers (or an error text).  room: where to copy to."""
    room = room or Room()
    room.walked = 0
    room.next_stop()
    threads = [_copy_thread(target, tid, regs) for tid, regs in regs_of.items()]
    by_tid = {t.tid: t for t in threads}
    greenlets = []
    for interp in target.interpreters():
        for ts in target.thread_states(interp):
            tid = target.memory.word(ts + target.layout.tstate_native_thread_id)
            t = by_tid.get(tid & 0xffffffff if tid is not None else None)
            if t is None:
                continue
            t.tstate = ts
            t.thread_id = target.memory.word(ts + target.layout.tstate_thread_id) or 0
            t.pyframes = target.thread_frames(ts)
        if not threads_only and target.greenlet_type:
            greenlets.append(_copy_greenlets(target, interp, room))
    if not threads_only:
        remote_tasks.gather(target, threads, room)
        if room.rehearsal and room.spawns:   # the spawn records' chunks: the stop reads them, spawn_chains() its copies
            remote_spawn.gather(target, room)
    return threads, greenlets


def spawn_chains(target: Target, room, threads_only: bool) -> None:
    """Read the target's spawn records once it runs again, from the chunks the stop read (their state at
    the stop: the rehearsal read them, so the stop's first reads took them again); a core's, from the core."""
    if not threads_only and room.spawns:
        remote_spawn.gather(target, room)


def _copy_thread(target: Target, tid: int, regs) -> ThreadCopy:
    if isinstance(regs, str):
        return ThreadCopy(tid, None, error=regs)
    t = ThreadCopy(tid, regs)
    mapping = target.stack_mapping(regs[1])
    if mapping is not None:
        t.mapping = (mapping.lo, mapping.hi)
        hi = min(mapping.hi, regs[1] + _MAX_STACK_COPY)
        t.stack_lo = regs[1] & ~7
        t.stack = target.memory.read(t.stack_lo, hi - t.stack_lo) or b""
    if not t.stack:
        t.error = "its stack is unreadable"
    return t


def _find_greenlets(target: Target, interp: int, room: Room) -> tuple:
    """(the greenlet objects of interp's gc lists in room's buffer, how many or -1: more than _MAX_GREENLETS,
    lists found broken).  The youngest list and those that changed since the last complete walk are walked and
    the greenlets that walk found are checked (the older lists are most of the gc's objects: 48 MB of pages at
    10,000 greenlets); with no walk kept, every list.  A walk made while the target is stopped is remembered."""
    heads, memory = target.gc_heads(interp), target.memory
    known, lists = target.known_greenlets.get(interp), target.settled_lists(interp)
    if known is None or lists is None:
        walk, known_at, nknown = heads, ffi.NULL, 0
    else:
        walk, known_at, nknown = (
        [heads[0]] + [head for head, then, now in zip(heads[1:], known.lists, lists) if then != now],
        known.addresses, known.n)
    visited, broken = ffi.new("uint64_t *"), ffi.new("int *")
    most, n = max(1 << 12, room.size((interp, "found")) // 8), -1
    while n < 0 and most <= _MAX_GREENLETS:
        out = ffi.cast("uintptr_t *", ffi.from_buffer(room.get((interp, "found"), most * 8)))
        n = lib.btc_remote_gc_known(memory.handle, heads, len(heads), walk, len(walk), target.greenlet_type, known_at,
                                    nknown, out, most, visited, broken)
        most *= 2
    room.walked += visited[0]
    if not room.rehearsal:
        _remember_greenlets(target, interp, lists, out, n if not broken[0] else -1)
    return out, n, broken[0]


def _remember_greenlets(target: Target, interp: int, lists: list | None, found, n: int) -> None:
    """Keep what a complete walk found (n >= 0), else forget: the next walks every list."""
    if n < 0 or lists is None:
        target.known_greenlets.pop(interp, None)
        return
    addresses = ffi.new("uintptr_t[]", max(n, 1))
    ffi.memmove(addresses, found, n * 8)
    target.known_greenlets[interp] = KnownGreenlets(lists, addresses, n)


def learn_greenlets(target: Target) -> None:
    """Walk every gc list of every interpreter while the target runs, for the stop to walk the young ones
    only (_find_greenlets).  What is walked while it runs is trusted only if its old lists were the same before
    the walk and after it (each read afresh: the chunk cache forgotten) and no list was found broken: then no
    object entered them meanwhile, and each object the old lists held all along was passed (objects only leave
    them).  Leaves the chunk cache empty."""
    memory = target.memory
    interps = list(target.interpreters())
    memory.forget()
    before = [target.settled_lists(interp) for interp in interps]
    for interp in interps:
        target.known_greenlets.pop(interp, None)   # a walk of every list
        _find_greenlets(target, interp, Room())   # (not a rehearsal's room: it remembers what it found)
    target.gc_chunks = memory.chunks()
    memory.forget()
    for interp, lists in zip(interps, before):
        if target.settled_lists(interp) != lists:
            target.known_greenlets.pop(interp, None)
    memory.forget()


def _copy_greenlets(target: Target, interp: int, room: Room) -> list:
    out, n, broken = _find_greenlets(target, interp, room)
    if broken and not room.rehearsal:
        target.notes.append(f"{broken} of the interpreter's gc lists end before their head (a corrupt "
                            "target?): greenlets after the break are not listed")
    if n < 0:
        target.notes.append(f"more than {_MAX_GREENLETS} greenlets: the rest are not listed")
        n = _MAX_GREENLETS
    states = room.get(room.key(interp, "states"), max(n, 1) * GREENLET.size)
    offsets = ffi.new("size_t[3]", target.greenlet_offsets)
    c_states = ffi.cast("btc_remote_greenlet *", ffi.from_buffer(states))
    n = lib.btc_remote_greenlet_states(target.memory.handle, out, n, offsets, c_states)
    spilled = lib.btc_remote_greenlet_fit(c_states, n, *target.map_ranges, bounds.SPILL_BUDGET)
    spill = room.get(room.key(interp, "spill"), max(1, spilled))
    previous = room.previous(interp)
    lib.btc_remote_greenlet_spills(target.memory.handle, c_states, n, ffi.from_buffer(spill),
                                   0 if room.rehearsal else spilled, *previous)
    room.keep(interp, states, n, spill, spilled, previous)
    copied = memoryview(states)[:n * GREENLET.size], spill
    if room.rehearsal:   # the chunks of their frames: the stop reads them, the walk after it reads its copies
        _greenlet_frames(target, *copied)
    return copied


def _greenlet_frames(target: Target, states: memoryview, spill) -> memoryview:
    """The Python frames of the greenlets (btc_remote_pyframe records; each state says which are its own),
    walked from the chunks the stop read: a frame the stop did not read is read now."""
    n = len(states) // GREENLET.size
    most = min(_MAX_PYFRAMES_ALL, 64 * n + _MAX_PYFRAMES)
    # Room for 64 frames a greenlet, of which a few are written: mapped, only the pages written are faulted in
    # (a bytearray cleared all 15 MB of it for 10,000 greenlets: 4 ms).
    frames = mmap.mmap(-1, most * PYFRAME.size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError, AttributeError):   # faulted in 2 MiB at a time where the kernel can
        frames.madvise(mmap.MADV_HUGEPAGE)
    nframes = lib.btc_remote_greenlet_frames(target.memory.handle, target.layout,
                                             ffi.cast("btc_remote_greenlet *", ffi.from_buffer(states)), n,
                                             ffi.from_buffer(spill), ffi.cast("btc_remote_pyframe *",
                                                                              ffi.from_buffer(frames)),
                                             most, *target.map_ranges)
    return memoryview(frames)[:nframes * PYFRAME.size]


_MAX_PYFRAMES_ALL = 1 << 22   # Python frames of all greenlets
_TURNED = ("states", "spill")   # a Room's buffers kept from one stop to the next (Room.alternate)


def greenlet_copies(target: Target, copied: list) -> list:
    """GreenletCopy objects from the raw copies made while the target was
    stopped, their Python frames walked (after it runs again: nothing here
    needs it stopped)."""
    out, seen = [], set()
    # (the loop runs once per greenlet, 10,000 times and more: what it looks up is looked up once)
    type_names, main_stop, copied_before, bad_text = (target.type_names, greenlet_offsets.MAIN_STACK_STOP,
                                                      lib.BTC_REMOTE_COPIED_BEFORE, _BAD.get)
    for states, spill in copied:
        records = GreenletRecords(states, spill, _greenlet_frames(target, states, spill))
        for row, (g, tp, start, stop, _, saved, _, _, _, _, ok, bad) in enumerate(GREENLET.iter_unpack(states)):
            if g in seen:   # a corrupt gc list may lead through objects twice
                continue
            seen.add(g)
            out.append(GreenletCopy(g, type_names.get(tp) or _type_name(target, tp), start, stop, saved,
                                    stop == main_stop, records, row, bad_text(bad), ok == copied_before))
    return out


_BAD = {lib.BTC_REMOTE_BAD_UNREADABLE: "its greenlet state is unreadable (a corrupt target?)",
        lib.BTC_REMOTE_BAD_INCONSISTENT: "its greenlet state is not one greenlet writes (a corrupt target?)",
        lib.BTC_REMOTE_BAD_SKIPPED: "its saved stack lies outside the target's stacks or past the dump's budget: Python frames only",
        lib.BTC_REMOTE_BAD_FRAME: "its top frame cannot be read (a corrupt target?)"}


def _type_name(target: Target, tp: int) -> str:
    name = target.type_names.get(tp)
    if name is None:
        at = target.memory.word(tp + target.layout.type_name) if tp else None
        raw = target.memory.read(at, bounds.MAX_TYPE_NAME) if at else None
        name = target.type_names[tp] = raw.split(b"\0", 1)[0].decode("utf-8", "replace") if raw else "?"
    return name


def vdso_file(vdso: Mapping, memory: Memory) -> list:
    """The target's vDSO (code the kernel maps, with its own CFI and symbols:
    a thread in clock_gettime is inside it) as a file, so that it is a module
    like the others (_VdsoFiles)."""
    image = memory.read(vdso.lo, vdso.hi - vdso.lo)
    path = _vdso_files.path(bytes(image)) if image else None
    return [Mapping(vdso.lo, vdso.hi, vdso.perms, 0, path)] if path else []


class _VdsoFiles:
    """The vDSO images dumps met, each written once to a file of its own and
    kept for this process's life (removed at its exit).  Its frames are
    named by path after the dump's memory is closed (the renderers, the
    naming ahead, a profile's writer): while the file went with the dump's
    memory, every vDSO frame of an outside dump was "??".  One image per
    kernel (each process maps the same), so one file in a dumper of live
    processes; bounded (MAX: cores from many machines), then none (the
    frames inside such a vDSO are not walked)."""

    MAX = 64
    NAME = "linux-vdso.so.1"   # the name the loader gives it

    def __init__(self):
        self.lock = real_thread("allocate_lock")()   # an OS threads' lock, whatever patching comes later
        self.owner = None       # the process that made the folder (a fork child makes its own)
        self.folder = None
        self.paths = {}         # image -> its file

    def path(self, image: bytes) -> str | None:
        with self.lock:
            if self.owner != os.getpid():
                self.owner, self.folder, self.paths = os.getpid(), None, {}
            found = self.paths.get(image)
            if found is None and len(self.paths) < self.MAX:
                found = self.paths[image] = self._write(image)
            return found or None

    def _write(self, image: bytes) -> str:
        """The file of a new image ("" if it cannot be written)."""
        try:
            if self.folder is None:
                self.folder = _new_folder("btcore-vdso-")
                atexit.register(self._remove, os.getpid())
            folder = os.path.join(self.folder, str(len(self.paths)))
            os.mkdir(folder, 0o700)
            path = os.path.join(folder, self.NAME)
            with open(path, "wb") as f:
                f.write(image)
            return path
        except OSError:
            return ""

    def _remove(self, owner: int) -> None:
        if os.getpid() != owner or self.folder is None:   # a fork child leaves its parent's
            return
        with contextlib.suppress(OSError):
            for name in os.listdir(self.folder):
                folder = os.path.join(self.folder, name)
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, self.NAME))
                os.rmdir(folder)
            os.rmdir(self.folder)


_vdso_files = _VdsoFiles()
# A fork child starts afresh: its lock may have been held by another thread at the fork (never released there)
os.register_at_fork(after_in_child=_vdso_files.__init__)


def _new_folder(prefix: str) -> str:
    """A new folder only this user can enter, as tempfile.mkdtemp() makes: a random name under $TMPDIR or
    /tmp (mkdir fails on a name that exists, a link included), else tempfile's own choice.  Not
    tempfile itself on every dump: its import, with shutil and random, was 5 ms of the 0.26 s of
    `python -m btcore dump` (10,000 greenlets)."""
    base = os.environ.get("TMPDIR") or "/tmp"
    for _ in range(3):
        folder = os.path.join(base, prefix + os.urandom(8).hex())
        try:
            os.mkdir(folder, 0o700)
            return folder
        except FileExistsError:
            continue
        except OSError:
            break
    import tempfile
    return tempfile.mkdtemp(prefix=prefix)


def _tids(pid: int) -> list:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        raise DumpError(f"no process {pid}") from None


def rehearse(target: Target, threads_only: bool, spawns: bool = True):
    """(The chunks of memory the stop will read, the Room it copies into),
    learned by gathering once while the target runs; the stop reads those
    chunks again first, in a few syscalls, then mostly walks its own
    copies.  Lists walked while they change may lead anywhere: every read
    is bounded, and a chunk read for nothing costs a copy, not a wrong dump
    (the stop walks them all again).  spawns: the target's spawn records are
    read too (a dump); a profiler's samples do without them."""
    if not threads_only:
        remote_tasks.learn(target)   # before the gathering, whose chunks the stop reads again: it walks every
        target.memory.forget()       # gc list (3.14, one greenlet: 1,142 chunks of the 1,441 the stop read)
    if not threads_only and target.greenlet_type:
        learn_greenlets(target)
    room = Room(rehearsal=True, spawns=spawns)
    gather(target, {tid: "not stopped (rehearsal)" for tid in _tids(target.pid)}, threads_only, room)
    chunks = target.memory.chunks()
    target.memory.forget()
    room.rehearsal = False
    return chunks, room


def stop_threads(pid: int, timeout: float, stopped: dict) -> dict:
    """Stop every thread of pid: tid -> regs or error text.  stopped (filled
    as threads are seized, so an interruption still detaches them): tid ->
    the signal to hand back at detach."""
    regs_of = {}
    for tid in _tids(pid):
        regs, pending = ffi.new("uintptr_t[4]"), ffi.new("int *")
        rc = lib.btc_ptrace_stop(tid, max(1, int(timeout * 1000)), regs, pending)
        if rc in (-errno.EPERM, -errno.EACCES) and not stopped:
            raise DumpPermissionError(permission_advice(pid, os.strerror(-rc), tid))
        if rc not in (-errno.EPERM, -errno.ESRCH):
            stopped[tid] = pending[0]   # seized: detached whatever happened next
        if rc == 0:
            regs_of[tid] = tuple(regs)
        else:
            traced = _tracer(pid, tid) if rc == -errno.EPERM else None
            regs_of[tid] = f"not stopped: {os.strerror(-rc)}" + (f" ({traced})" if traced else "")
    return regs_of


_DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_deferred():
    """Ctrl-C (and SIGTERM, where Python handles it) wait until the target
    runs again, then are handled as usual.  A KeyboardInterrupt raised while
    it is stopped, between two detaches say, would leave threads of the
    target stopped for as long as this process lives on (an interactive
    session that caught it).  Python runs signal handlers in the main
    thread, whichever thread the kernel handed the signal to, so blocking it
    in this thread alone (pthread_sigmask) is not enough: the handlers are
    replaced for the window by one that only notes the signal.  Off the
    main thread nothing is needed: a handler never runs in this thread."""
    if not is_main_thread():   # in any greenlet of it: threading's view is patched under gevent
        yield
        return
    arrived, saved = [], {}
    for sig in _DEFERRED_SIGNALS:
        handler = signal.getsignal(sig)
        if callable(handler):   # SIG_DFL ends the process: the kernel then detaches the target
            saved[sig] = handler
            signal.signal(sig, lambda signum, frame: arrived.append((signum, frame)))
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        for signum, frame in arrived:
            saved[signum](signum, frame)


def exited(pid: int) -> bool:
    """Gone, or a zombie (dead, its parent has not reaped it yet)."""
    stat = _read_text(f"/proc/{pid}/stat")
    return stat is None or stat.rsplit(")", 1)[-1].split()[:1] in (["Z"], ["X"])


def resume_threads(stopped: dict) -> None:
    for tid, pending in stopped.items():
        lib.btc_ptrace_detach(tid, pending)


def _rooted(pid: int, mappings: list) -> list:
    """Mappings whose file paths are valid here.  The kernel names a mapped
    file from the reader's root where it can (a target in a chroot: the
    host's path); a file of another mount namespace (a container) gets the
    target's own path, which this process reaches through /proc/PID/root."""
    link = f"/proc/{pid}/root"
    try:
        if os.path.samefile(link, "/"):
            return mappings
    except OSError:
        return mappings   # unreadable (permissions): the paths as they are
    return [Mapping(m.lo, m.hi, m.perms, m.offset, link + m.path)
            if m.path.startswith("/") and os.path.exists(link + m.path) else m for m in mappings]


def snapshot_live(pid: int, *, threads_only: bool = False, timeout: float = 5.0) -> Snapshot:
    """Stop pid, copy what the dump needs, let it run again (always)."""
    target = open_live(pid)
    try:
        chunks, room = rehearse(target, threads_only)
        return stop_and_copy(target, chunks, room, threads_only, timeout)
    except BaseException:
        target.memory.close()   # its temporary files; on success the dump closes it when done
        raise


def open_live(pid: int) -> Target:
    """The Target of live process pid (its mappings, modules, interpreter and
    greenlet layout), read while it runs: snapshot it once (snapshot_live) or
    many times (stop_and_copy: the outside profiler); close its memory when done."""
    pid, notes = _process_of(pid)
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="surrogateescape") as f:   # paths are bytes
            mappings = _rooted(pid, parse_maps(f.read()))
    except FileNotFoundError:
        raise DumpError(f"no process {pid}") from None
    except PermissionError as e:
        raise DumpPermissionError(permission_advice(pid, e.strerror)) from None
    memory = Memory(lib.btc_rmem_open_pid(pid))
    try:
        vdso = next((m for m in mappings if m.path == "[vdso]"), None)
        mappings = mappings + (vdso_file(vdso, memory) if vdso else [])
        if memory.read(mappings[0].lo, 8) is None if mappings else True:
            code = lib.btc_rmem_last_errno(memory.handle)
            if code in (errno.EPERM, errno.EACCES):
                raise DumpPermissionError(permission_advice(pid, os.strerror(code)))
        return Target(pid, memory, mappings, notes)
    except BaseException:
        memory.close()
        raise


def _process_of(pid: int) -> tuple:
    """(the process that pid names, [a note]): a thread's id names its process (the whole process is read);
    DumpError for this very process (stopping its own threads would stop the dump) and for a zombie."""
    status = _read_text(f"/proc/{pid}/status")
    tgid = next((int(line.split()[1]) for line in (status or "").splitlines() if line.startswith("Tgid:")), pid)
    if tgid == os.getpid():
        raise DumpError(f"process {tgid} is this process: a dump from outside stops the threads of the process it "
                        "reads, so it cannot read its own (inside it, call btcore.dump_all())")
    if status is not None and exited(tgid):
        raise DumpError(f"process {tgid} has exited (a zombie: its parent has not reaped it yet)")
    return tgid, [f"{pid} is a thread of process {tgid}: the whole process is read"] if tgid != pid else []


def stop_and_copy(target: Target, chunks, room: Room, threads_only: bool, timeout: float) -> Snapshot:
    """Stop the target, read chunks again (a few syscalls), copy what the dump
    needs into room, let it run again (always).  chunks, room: rehearse()'s,
    or, for a later snapshot of the same target, the previous one's room and
    target.memory.chunks(), taken before target.memory.forget() (the chunk cache
    holds what the last stop read).  The Snapshot's notes are the target's list."""
    memory, pid, stopped = target.memory, target.pid, {}
    with signals_deferred():
        began, began_cpu, began_reads = time.perf_counter(), time.thread_time(), memory.syscalls()
        try:
            regs_of = stop_threads(pid, timeout, stopped)
            if target.gc_chunks is not None and not threads_only and target.lists_moved():
                memory.prefetch(target.gc_chunks)   # every list is walked: what the rehearsal's walk of them read
            memory.prefetch(chunks)
            threads, greenlets = gather(target, regs_of, threads_only, room)
        finally:
            resume_threads(stopped)
            stopped_for, stopped_cpu = time.perf_counter() - began, time.thread_time() - began_cpu
            stopped_reads = memory.syscalls() - began_reads
    room.finish()
    spawn_chains(target, room, threads_only)
    if exited(pid):
        target.notes.append("the process exited during the dump: what was read before is shown")
    return Snapshot(pid, threads, greenlet_copies(target, greenlets), target.modules, memory,
                    target.greenlet_code, target.layout, stopped_for, target.notes, stopped_cpu, stopped_reads,
                    target.types, room.walked)
