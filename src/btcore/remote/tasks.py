"""asyncio tasks of another process (python -m btcore dump PID): every
pending task of 3.11 and 3.13-3.15 targets, listed as dump_all() lists them
in-process (btcore/capture/tasks.py): name, state, coroutine, await chain, who
awaits whom.

Found while the target is stopped (gather(), from remote.gather()):
- 3.14+: in the interpreter's and each thread's task lists, whose offsets
  the target's _asyncio module publishes (.AsyncioDebug, as capture/tasks.py reads
  them in-process);
- 3.11-3.13: in asyncio's registry (a WeakSet: its weak references sit in
  one set object), and any other set holding tasks.  Reaching it by name
  would need each version's dicts, managed dicts and instance values;
  instead, before the stop, the gc lists' sets are looked through for
  (weak references to) tasks, and the stop reads only those tables.
Task types: 3.11's static TaskType and FutureType by name in _asyncio's data, 3.13+'s
heap types by name among the gc lists' types (before the stop too).
The task, its coroutine chain (what the interpreter resumes: the awaited
object on each suspended frame's stack) and its awaiters (the wakeup bound
to the awaiting task among its done-callbacks; through the futures gather's
closure or 3.11 wait_for's partial holds) are read in C
(native/remote/rtasks.c), type-checked and bounded.  A TaskGroup member's
awaiter is the task suspended in a method of the group its callback is bound
to (paired here, _place(); an object of another type is no evidence: a task
may wait in a method of an object whose method is another task's callback
for reasons of its own).  Names and the chains of awaiters are put
together after the target runs again, while its memory is still open
(stacks(), then infos()).

A task's thread: the one running its loop (3.13+: the thread state's
running loop; 3.11: the thread with a frame whose first local is the loop,
run_forever()'s self; every version: the thread whose frames end with a
running task's coroutine chain).  A running task's stack is that thread's
(merged native + Python); a suspended one's is its await chain, then its
awaiter's, headed "awaited by <task>:".  Not read from outside:
pure-Python tasks (asyncio.tasks._PyTask), creation sites.
"""
from __future__ import annotations

import struct
import weakref
from typing import NamedTuple

from ..symbols import asyncio_debug

from . import bounds
from .._native import ffi, lib
from ..capture.backtrace import KIND_PYTHON, RECORD, append_labelled
from ..capture.introspect import CAPACITY, NOT_STARTED, RUNNING, SUSPENDED
from ..symbols.elf_files import symbol_value
from ..capture.records import PYFRAME, TASK
from .names import shown
from ..views.schema import RemoteGreenlet

_MAX_TASKS = 1 << 20
_MAX_LOOPS = 64       # event loops placed in their threads (3.11)
_CHAIN_DEPTH = 64      # awaiters appended to a suspended task's stack (as capture/tasks.py)
_TASK_NAME = "_asyncio.Task"
_FUTURE_NAME = "_asyncio.Future"
_STATES = {lib.BTC_REMOTE_TASK_NOT_STARTED: NOT_STARTED, lib.BTC_REMOTE_TASK_SUSPENDED: SUSPENDED,
           lib.BTC_REMOTE_TASK_RUNNING: RUNNING}
_AWAITERS = lib.BTC_REMOTE_TASK_AWAITERS
_SYMBOLS = {"coro_type": "PyCoro_Type", "gen_type": "PyGen_Type", "cfunction_type": "PyCFunction_Type",
            "function_type": "PyFunction_Type", "tuple_type": "PyTuple_Type", "list_type": "PyList_Type",
            "cell_type": "PyCell_Type", "set_type": "PySet_Type", "weakref_type": "_PyWeakref_RefType",
            "method_type": "PyMethod_Type"}


class _Reader:
    """What reading one target's tasks needs, learned while it runs: its
    task layout (None: tasks are not read, `note` says why)."""

    def __init__(self, target):
        self.layout, self.note, self.registries = None, None, []
        lay = ffi.new("btc_remote_tasklayout *")
        if lib.btc_remote_task_layout_of(target.layout.version_hex, lay) != 0:
            return
        interpreter = target.modules.at(target.types.code) if target.types.code else None
        asyncio_files = [m.path for m in (target.modules.named(lambda name: name.startswith("_asyncio")),
                                          interpreter) if m is not None]
        if interpreter is None or not self._types(target, lay, interpreter, asyncio_files):
            return   # no asyncio (yet): no tasks
        if lay.version_hex >> 16 >= 0x030E and not self._lists(lay, asyncio_files):
            self.note = "the target's _asyncio publishes no task lists btcore can use: asyncio tasks are not listed"
            return
        self.layout, self.registries = lay, [] if lay.thread_tasks_head else _registries(target, lay)

    @staticmethod
    def _types(target, lay, interpreter, asyncio_files) -> bool:
        for field, symbol in _SYMBOLS.items():
            value = symbol_value(interpreter.path, symbol)
            setattr(lay, field, interpreter.bias + value if value else 0)
        if lay.version_hex >> 16 == 0x030B:   # static types, in _asyncio's data (the interpreter's if built in)
            tasks, futures = _static_types(target, interpreter, asyncio_files[:1], (_TASK_NAME, _FUTURE_NAME))
        else:
            tasks, futures = _heap_types(target, interpreter, (_TASK_NAME, _FUTURE_NAME))
        if not tasks or not futures or not all(getattr(lay, field) for field in _SYMBOLS):
            return False
        lay.task_types[0:len(tasks)], lay.future_types[0:len(futures)] = tasks, futures
        return True

    @staticmethod
    def _lists(lay, asyncio_files) -> bool:
        """3.14+: the lists' offsets from the section, the fields it shares with the table checked."""
        offsets = next((o for o in map(asyncio_debug.offsets, asyncio_files) if o), None)
        if offsets is None or (offsets["task_coro"], offsets["task_name"]) != (lay.task_coro, lay.task_name):
            return False
        lay.task_node, lay.interp_tasks_head = offsets["task_node"], offsets["interp_tasks_head"]
        lay.thread_tasks_head, lay.thread_running_loop = offsets["thread_tasks_head"], offsets["thread_running_loop"]
        return True

    def addresses(self, target, threads, room) -> list:
        """The task objects to read: 3.14+'s lists, else the registries' tasks."""
        lay, found = self.layout, []
        for interp in target.interpreters() if lay.thread_tasks_head else ():
            for head in [interp + lay.interp_tasks_head] + [t.tstate + lay.thread_tasks_head for t in threads
                                                            if t.tstate]:
                found += _bounded(lib.btc_remote_task_list, target.memory, lay, head, room)
        for registry in self.registries:
            found += _bounded(lib.btc_remote_set_tasks, target.memory, lay, registry, room)
        return found


def _static_types(target, interpreter, files, names) -> tuple:
    """([types named names[0]], ...) among the static type objects in the writable data of the modules
    at files (3.11's TaskType and FutureType).  Found by their names, not their symbols: those are local,
    and a distribution's build strips them (Debian's _asyncio keeps only .dynsym)."""
    type_type = symbol_value(interpreter.path, "PyType_Type")
    found = {name: [] for name in names}
    if not type_type:
        return tuple(found.values())
    needle = struct.pack("<Q", interpreter.bias + type_type)   # a static type's ob_type, after ob_refcnt
    for lo, data in _module_data(target, files):
        at = data.find(needle, 8)   # at 8: a type's head lies inside the mapping
        while at >= 0:
            tp = lo + at - 8
            name = _tp_name(target.memory, target.layout, tp) if at % 8 == 0 else None
            if name in found and len(found[name]) < lib.BTC_REMOTE_TASK_TYPES - 1:
                found[name].append(tp)
            at = data.find(needle, at + 1)
    return tuple(found.values())


_MAX_MODULE_DATA = 64 << 20   # bytes of one module's writable mappings looked through for static types


def _module_data(target, files):
    """(address, bytes) of each writable (in a core: each) mapping of the files at files, as far as readable."""
    for m in target.mappings:
        if m.path in files and ("w" in m.perms or not m.perms) and m.hi - m.lo <= _MAX_MODULE_DATA:
            data = _readable_part(target.memory, m.lo, m.hi)
            if data:
                yield m.lo, data


def _readable_part(memory, lo: int, hi: int) -> bytes:
    """The bytes of [lo, hi) up to the first page that cannot be read (64 KiB at a time, else a page)."""
    parts = []
    while lo < hi:
        raw = memory.read(lo, min(hi - lo, 1 << 16)) or memory.read(lo, min(hi - lo, 4096))
        if raw is None:
            break
        parts.append(raw)
        lo += len(raw)
    return b"".join(parts)


def _heap_types(target, interpreter, names) -> tuple:
    """([types named names[0]], [types named names[1]], ...) among the heap types of the target's interpreters."""
    type_type = symbol_value(interpreter.path, "PyType_Type")
    if not type_type:
        return tuple([] for _ in names)
    type_type += interpreter.bias
    found = {name: [] for name in names}
    for interp in target.interpreters():
        for tp in _instances(target, interp, type_type):
            name = _tp_name(target.memory, target.layout, tp)
            if name in found and len(found[name]) < lib.BTC_REMOTE_TASK_TYPES - 1:
                found[name].append(tp)
    return tuple(found[name] for name in names)


def _tp_name(memory, layout, tp: int) -> str | None:
    at = memory.word(tp + layout.type_name) if tp else None
    raw = memory.read(at, bounds.MAX_TYPE_NAME) if at else None
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace") if raw else None


def _instances(target, interp: int, wanted: int) -> list:
    """Objects of type wanted (or a subtype) in interp's gc lists (read while the target runs)."""
    heads = target.gc_heads(interp)
    visited, broken = ffi.new("uint64_t *"), ffi.new("int *")
    most = 1 << 12
    while most <= _MAX_TASKS:
        out = ffi.new("uintptr_t[]", most)
        n = lib.btc_remote_gc_instances(target.memory.handle, heads, len(heads), wanted, out, most, visited, broken)
        if n >= 0:
            return list(out[0:n])
        most *= 2
    return []


def _bounded(read, memory, lay, where: int, room) -> list:
    """The tasks read(memory, lay, where, out, most) finds (a task list, a
    registry), in room's buffer for where, grown until they fit."""
    most = max(1 << 12, room.size(("tasks", where)) // 8)
    while most <= _MAX_TASKS:
        out = ffi.cast("uintptr_t *", ffi.from_buffer(room.get(("tasks", where), most * 8)))
        n = read(memory.handle, lay, where, out, most)
        if n >= 0:
            return list(out[0:n])
        most *= 2
    return []


def _registries(target, lay) -> list:
    """The sets holding tasks (3.11-3.13: asyncio's registry WeakSet keeps
    its weak references in one; a program's own set of tasks counts too):
    found among the gc lists' sets before the stop, which reads only them."""
    set_type = lay.set_type
    found = []
    for interp in target.interpreters():
        for candidate in _instances(target, interp, set_type):
            if lib.btc_remote_set_tasks(target.memory.handle, lay, candidate, ffi.new("uintptr_t[1]"), 1) != 0:
                found.append(candidate)
    return found


_readers = weakref.WeakKeyDictionary()    # target -> _Reader (made at the rehearsal, while it runs)
_gathered = weakref.WeakKeyDictionary()   # the target's Memory -> what the stop read (stacks() takes it)
_built = weakref.WeakKeyDictionary()      # the target's Memory -> its RemoteTaskInfos (infos() takes them)


class _Copied:
    """What the stop read: kept task records (in the buffer tasks), their
    frames, each thread's running loop (loop address -> tid)."""

    def __init__(self, tasks, kept: int, frames, loops: dict, note):
        self.tasks, self.kept, self.frames, self.loops, self.note = tasks, kept, frames, loops, note


def learn(target):
    """What reading target's tasks needs (its _Reader), learned once while
    it runs: 3.13+ walks every gc list for the task types, 3.11-3.13 for the
    registries."""
    reader = _readers.get(target)
    if reader is None:
        reader = _readers[target] = _Reader(target)
    return reader


def gather(target, threads, room) -> None:
    """Read every pending task while the target is stopped (threads: the
    ThreadCopies, their thread states found)."""
    reader = learn(target)
    lay = reader.layout
    if lay is None:
        _gathered[target.memory] = _Copied(b"", 0, b"", {}, reader.note)
        return
    addresses = reader.addresses(target, threads, room)
    n = len(addresses)
    records = room.get(("tasks", "records"), max(1, n) * TASK.size)
    most = min(bounds.MAX_FRAMES * 256, 16 * n + CAPACITY)
    frames = room.get(("tasks", "frames"), most * PYFRAME.size)
    c_records = ffi.cast("btc_remote_task *", ffi.from_buffer(records))
    kept = lib.btc_remote_tasks(target.memory.handle, target.layout, lay, ffi.new("uintptr_t[]", addresses), n,
                                CAPACITY, c_records, ffi.cast("btc_remote_pyframe *", ffi.from_buffer(frames)),
                                most)
    loops = _loop_threads(target, lay, [t for t in threads if t.tstate], c_records, kept)
    _gathered[target.memory] = _Copied(records, kept, frames, loops, None)   # the room's buffers: no copy


def _loop_threads(target, lay, threads: list, records, kept: int) -> dict:
    """{loop address: tid of the thread running it} for the loops of the
    tasks read: the thread state's running loop (3.13+), else the thread
    with a frame of one of the loop's methods (3.11)."""
    if lay.thread_running_loop:
        loops = {target.memory.word(t.tstate + lay.thread_running_loop): t.tid for t in threads}
        return {loop: tid for loop, tid in loops.items() if loop}
    loops, thread_of = ffi.new("uintptr_t[]", _MAX_LOOPS), ffi.new("int[]", _MAX_LOOPS)
    n = lib.btc_remote_loop_threads(target.memory.handle, target.layout, lay, [t.tstate for t in threads],
                                    len(threads), records, kept, loops, thread_of, _MAX_LOOPS)
    return {loops[i]: threads[thread_of[i]].tid for i in range(n) if thread_of[i] >= 0}


# ---- after the stop: the dump's entries ----

class RemoteTaskInfo:
    """One pending asyncio task of another process, as views/dump.py renders it:
    the attributes of a tasks.TaskInfo, read from the target.  greenlet and
    task are the same RemoteGreenlet (its address there), awaited_by those
    of the tasks awaiting it."""

    __slots__ = ("greenlet", "task", "loop", "thread_id", "thread_name", "state", "name", "coroutine", "backtrace",
                 "python_only", "awaited_by", "under", "parent", "spawned_by", "spawn_chain", "spawn_backtrace",
                 "last_ran", "error", "tid")

    def __init__(self, task: RemoteGreenlet, loop: RemoteGreenlet, state: str, name: str, coroutine: str):
        self.greenlet = self.task = task
        self.loop, self.state, self.name, self.coroutine = loop, state, name, coroutine
        self.thread_id = self.thread_name = self.backtrace = self.under = self.parent = self.spawned_by = None
        self.spawn_chain = self.spawn_backtrace = self.last_ran = self.error = self.tid = None
        self.python_only = False
        self.awaited_by = []


def stacks(snap, space, shown: list) -> list:
    """ProcessStacks (kind "task") of the tasks read while snap's target was
    stopped, their frames named through space (the dump's names of the
    target's frames) while its memory is open; shown: the dump's stacks so
    far, its threads' first (a running task's stack is its thread's)."""
    from .process import ProcessStack, RemoteBacktrace   # (remote/process.py builds on this module)
    copied = _gathered.pop(snap.memory, None)
    if copied is not None and copied.note:
        snap.notes.append(copied.note)
    if copied is None or not copied.kept:
        return []
    names = _Names(snap)
    found, order, shared = {}, [], {}
    for r in map(_Record.of, TASK.iter_unpack(memoryview(copied.tasks)[:copied.kept * TASK.size])):
        if r.address not in found:   # a list read twice over (a corrupt target) gives it once
            found[r.address] = _entry(r, names, copied.frames, space, RemoteBacktrace, shared)
            order.append(r)
    threads = dict(zip((t.tid for t in snap.threads), shown))
    loops = {loop: tid for loop, tid in copied.loops.items()}
    for r in order:
        if found[r.address].state == RUNNING:
            _run_by_its_thread(found[r.address], snap, threads, loops, r.loop)
    in_method_of = {r.self: r.address for r in order if r.self and found[r.address].state == SUSPENDED}
    for r in order:
        _place(found[r.address], r, found, loops,
               in_method_of.get(r.holder) if r.holder in in_method_of and names.is_task_group(r.holder) else None)
    out, frames_of = [], {}
    for info in found.values():
        if info.state == SUSPENDED:
            _append_awaiters(info, found)
        raw = bytes(info.backtrace._raw)   # identical stacks share their resolved frames (read-only)
        if raw not in frames_of:
            frames_of[raw] = info.backtrace.frames()
        out.append(ProcessStack("task", info.name, info.tid, frames_of[raw], info.error, info.backtrace,
                                info.task.address))
    _built[snap.memory] = list(found.values())
    return out


def infos(snap, stacks: list, shown_infos: list) -> list:
    """The RemoteTaskInfos of snap's task stacks (stacks()), in the thread
    of their loop as shown_infos (the dump's entries of stacks) names it."""
    built = _built.pop(snap.memory, [])
    threads = {s.tid: info for s, info in zip(stacks, shown_infos) if s.kind == "thread"}
    for info in built:
        thread = threads.get(info.tid)
        if thread is not None:
            info.thread_id, info.thread_name = thread.thread_id, thread.thread_name
    return built


class _Names:
    """Task names and coroutine names, read from the target (bounded, escaped)."""

    def __init__(self, snap):
        self._memory, self._layout = snap.memory, snap.layout
        self._strings = bounds.Names(snap.memory, snap.layout, snap.types)
        interpreter = snap.modules.at(snap.types.code) if snap.types.code else None
        value = symbol_value(interpreter.path, "PyLong_Type") if interpreter else None
        self._int_type = interpreter.bias + value if value else 0
        self._types, self._shown, self._groups = {}, {}, {}
        objects = ffi.new("btc_remote_objlayout *")
        self._objects = objects if lib.btc_remote_pyobjects(snap.layout.version_hex, objects) == 0 else None

    def is_task_group(self, obj: int) -> bool:
        """Is obj an asyncio TaskGroup (its type, or a base, named so)?"""
        tp = self._memory.word(obj + 8) if obj else None
        if tp not in self._groups:
            self._groups[tp] = bool(tp and self._objects is not None and lib.btc_remote_type_inherits(
                self._memory.handle, self._layout, self._objects, tp, b"TaskGroup"))
        return self._groups[tp]

    def string(self, obj: int) -> str | None:
        """A str object's text as a dump shows it (remembered: tasks share their coroutines' names)."""
        if obj not in self._shown:
            text = self._strings.string(obj) if obj else None
            self._shown[obj] = shown(text) if text is not None else None
        return self._shown[obj]

    def task_name(self, obj: int) -> str | None:
        """A task's name: its str, or 3.13+'s lazy name, the int N of "Task-N"."""
        text = self.string(obj)
        if text is None and obj and self._int_type and self._memory.word(obj + 8) == self._int_type:
            number = self._small_int(obj)
            text = f"Task-{number}" if number is not None else None
        return text

    def _small_int(self, obj: int) -> int | None:
        """A non-negative int of at most 2 digits (3.11: ob_size; 3.12+: lv_tag)."""
        head, digits = self._memory.word(obj + 16), self._memory.read(obj + 24, 8)
        if head is None or digits is None:
            return None
        count = head if self._layout.version_hex >> 16 == 0x030B else (head >> 3 if head & 3 != 2 else -1)
        if not 0 <= count <= 2:
            return None
        return sum(d << (30 * i) for i, d in enumerate(struct.unpack("<2I", digits)[:count]))

    def type_name(self, tp: int) -> str:
        if tp not in self._types:
            self._types[tp] = _tp_name(self._memory, self._layout, tp) or "?"
        return self._types[tp]


class _Record(NamedTuple):
    """A btc_remote_task, unpacked."""
    address: int
    type: int
    loop: int
    name: int
    coro: int
    qualname: int
    awaiters: tuple
    state: int
    frames_at: int
    nframes: int
    truncated: int
    holder: int   # an object a done-callback of it is a method of
    self: int     # suspended: the first local of its innermost coroutine

    @classmethod
    def of(cls, fields: tuple):
        return cls(*fields[:6], tuple(a for a in fields[6:6 + _AWAITERS] if a), *fields[6 + _AWAITERS:])


def _entry(r: _Record, names: _Names, frames, space, kind, shared: dict) -> RemoteTaskInfo:
    coroutine = names.string(r.qualname) or "?" if r.coro else "?"
    name = f"{names.task_name(r.name) or 'Task'} ({coroutine})"
    info = RemoteTaskInfo(RemoteGreenlet(r.address, names.type_name(r.type)), RemoteGreenlet(r.loop, "loop"),
                          _STATES[r.state], name, coroutine)
    key = bytes(frames[r.frames_at * PYFRAME.size:(r.frames_at + r.nframes) * PYFRAME.size])
    if key not in shared:   # tasks parked in one place share their records
        shared[key] = _records(key)
    raw, codes, cut = shared[key]
    bt = object.__new__(kind)
    bt._raw, bt._refs, bt._capacity, bt.truncated, bt._space = bytearray(raw), codes, CAPACITY, bool(r.truncated), space
    info.backtrace, info.error = bt, cut
    return info


def _records(frames: bytes) -> tuple:
    """(The Backtrace records of a task's btc_remote_pyframe records, their code addresses, why the chain was
    cut or None)."""
    codes, raw, cut = [], bytearray(), None
    for code, lasti, _ in PYFRAME.iter_unpack(frames):
        if not code:
            cut = bounds.cut_reason(lasti).replace("frame chain", "await chain")
            continue
        codes.append(code)
        raw += RECORD.pack(code, lasti, KIND_PYTHON, 0, 0)
    return bytes(raw), tuple(codes), cut


def _run_by_its_thread(info: RemoteTaskInfo, snap, threads: dict, loops: dict, loop: int) -> None:
    """A running task's stack is its thread's (threads: tid -> its
    ProcessStack): the thread whose Python frames end with the task's (its
    coroutine's frame and the callers below it); loops learns its loop's."""
    own = [(code, lasti) for code, lasti, *_ in RECORD.iter_unpack(info.backtrace._raw)]
    for t in snap.threads:
        theirs = [(code, lasti) for code, lasti, _ in t.pyframes]
        if own and theirs[len(theirs) - len(own):] == own and t.tid in threads:
            info.backtrace, info.error = threads[t.tid].backtrace, threads[t.tid].error
            loops.setdefault(loop, t.tid)
            return
    info.python_only = True   # its frames from the interpreter only


def _place(info: RemoteTaskInfo, r, found: dict, loops: dict, holder_task: int | None) -> None:
    """Its thread (its loop's), its awaiters and where the tree draws it.
    holder_task: the task suspended in a method of the TaskGroup one of r's
    done-callbacks is a method of (its parent task, in __aexit__), which
    awaits it too."""
    info.tid = loops.get(r.loop)
    awaiting = r.awaiters
    if holder_task is not None and holder_task != r.address and holder_task not in awaiting:
        awaiting += (holder_task,)
    info.awaited_by = [found[a].task if a in found else RemoteGreenlet(a, "task") for a in awaiting]
    info.under = next((found[a].task for a in awaiting if a in found), None)


def _append_awaiters(info: RemoteTaskInfo, found: dict) -> None:
    """The await chain: the first awaiter's own frames after the task's,
    then its first awaiter's... (bounded, cycles cut), as capture/tasks.py does."""
    bt, seen, awaiting = info.backtrace, {info.task.address}, info.awaited_by
    while awaiting and len(seen) <= _CHAIN_DEPTH and len(bt) < bt.capacity:
        above = found.get(awaiting[0].address)
        if above is None or above.task.address in seen or above.state != SUSPENDED:
            break
        seen.add(above.task.address)
        append_labelled(bt, _own(above), f"awaited by {above.name}:")
        awaiting = above.awaited_by


def _own(info: RemoteTaskInfo):
    """info's own frames (before any awaiter's were appended to them)."""
    bt = object.__new__(type(info.backtrace))
    joined = next(iter(sorted(getattr(info.backtrace, "_labels", None) or {})), len(info.backtrace))
    bt._raw, bt._refs = info.backtrace._raw[:joined * RECORD.size], info.backtrace._refs[:joined]
    bt._capacity, bt.truncated, bt._space = CAPACITY, info.backtrace.truncated, info.backtrace._space
    return bt
