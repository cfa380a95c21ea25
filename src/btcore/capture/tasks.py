"""asyncio tasks in snapshot(): every task of every loop and thread, its
state, its stack and who awaits it.

Tasks are found without asyncio's debug mode, in the registry every Task
(C or Python, any factory, Task(...) itself) adds itself to at creation:
asyncio.tasks._all_tasks on 3.11, _scheduled_tasks and _eager_tasks on
3.12-3.13 (_registered_tasks()).  3.14+ keeps C tasks (asyncio.Task and its
subclasses) in per-thread C lists instead, walked in C
(native/capture/cpython/asyncio_lists.c) with the offsets 3.14 publishes for
debuggers (_task_node_offset()); its pure-Python tasks are still in
_scheduled_tasks and _eager_tasks.  Not reachable on 3.14+: tasks of another
type (not asyncio.Task) that register through asyncio.tasks._register_task,
kept in the C module's private WeakSet.  A loop is what task.get_loop() says, its
thread the calling one for its running loop, else what the loop's
_thread_id says while it runs (BaseEventLoop sets it in run_forever); the running task is the one whose coroutine runs
(cr_running: the same as asyncio.tasks._current_tasks says, for every thread).

A task's stack: the running one's is its thread's (the merged native +
Python stack of collect() in the calling thread; Python frames only in
another thread, as for greenlets).  A suspended one's is its coroutine
chain (cr_frame of each coroutine through cr_await, innermost first: what
the interpreter resumes), followed by the same chain of the task that
awaits it, and so on (a join headed "awaited by <task>:"): the await
chain as 3.14's asyncio.capture_call_graph() follows it.

Who awaits a task is read from its done-callbacks (_awaiters_of): a task
awaiting it directly registered its wakeup method there; gather, wait_for
and shield registered a callback holding the future the waiting task
waits on (followed to that task); a TaskGroup's child holds the group,
whose parent task awaits it (3.14 records the same edges itself).
"""
from __future__ import annotations

import asyncio
import collections
import functools
import sys
from asyncio import tasks as _tasks_module

from ..symbols import asyncio_debug
from .backtrace import Backtrace, append_labelled, collect
from ..errors import BacktraceError
from .introspect import (CAPACITY, NOT_STARTED, RUNNING, SUSPENDED, Entry, read_optional, python_backtrace,
                         python_frames_of_thread, without_own_frames)
from .._native import lib
from .threads import current_ident

# 3.14+: _asyncio_task_lists(task_type, node_offset) and _asyncio_layout()
# (native/capture/cpython/asyncio_lists.c); nothing is installed before 3.14.
if lib.btc_asyncio_install(id(globals())) != 0:
    raise ImportError("btcore: cannot install the asyncio task lists")

_AWAIT_DEPTH = 16      # futures followed from a task to the task that awaits it
# The C types and the pure-Python ones (asyncio.tasks._PyTask is no subclass of asyncio.Task)
_TASKS = tuple({asyncio.Task, getattr(_tasks_module, "_PyTask", asyncio.Task)})
_FUTURES = tuple({asyncio.Future, getattr(asyncio.futures, "_PyFuture", asyncio.Future)})
_CHAIN_DEPTH = 64      # awaiters appended to a suspended task's stack


class TaskInfo(Entry):
    """One pending asyncio task, as snapshot() saw it: the attributes of a
    GreenletInfo (so every view lists it the same way), and its own.

    task         the asyncio.Task (the snapshot keeps it alive); `greenlet`
                 is the same object, for code shared with greenlets
    loop         its event loop
    thread_id    the ident of the thread running its loop, or None (a loop not running)
    thread_name  that thread's name, or None
    state        "running" (its loop's current task), "suspended" or
                 "not started" (its coroutine has not run yet)
    name         its name and coroutine: "Task-3 (handler)"
    coroutine    its coroutine's qualified name
    backtrace    its stack (see the module's docstring), or None (see error)
    python_only  True for the running task of another thread
    awaited_by   the tasks that await it (in this snapshot or not)
    under        where the tree draws it: its first awaiter in the
                 snapshot, else its creator (spawn tracking), else None
    spawned_by   the task (or greenlet) that created it, with spawn tracking
    spawn_chain, spawn_backtrace   as for greenlets (spawn tracking)
    parent, last_ran   None (greenlet notions)
    error        None, or why there is no backtrace
    """

    __slots__ = ("task", "loop", "thread_id", "thread_name", "state", "name", "coroutine", "backtrace",
                 "python_only", "awaited_by", "under", "spawned_by", "spawn_chain", "_spawn_backtrace",
                 "parent", "last_ran", "error")

    def __init__(self, task, loop, state):
        self.task, self.loop, self.state = task, loop, state
        coro = task.get_coro()
        self.coroutine = getattr(coro, "__qualname__", type(coro).__name__)
        self.name = f"{read_optional(_task_name, task) or 'Task'} ({self.coroutine})"
        self.thread_id = self.thread_name = self.backtrace = self.under = self.spawned_by = None
        self.spawn_chain = self._spawn_backtrace = self.parent = self.last_ran = self.error = None
        self.python_only = False
        self.awaited_by = []

    @property
    def greenlet(self):
        return self.task

    def __repr__(self) -> str:
        return f"<TaskInfo {self.name} {self.state} thread={self.thread_name}>"


def _task_name(task) -> str:
    return task.get_name()


def _registered_tasks() -> list:
    """Every task asyncio has registered (done ones included)."""
    found = []
    for name in ("_all_tasks", "_scheduled_tasks", "_eager_tasks"):
        registry = getattr(_tasks_module, name, None)
        if registry is not None:
            found.extend(_copy_of(registry))
    node_offset = _task_node_offset()
    if node_offset is not None:
        found.extend(_asyncio_task_lists(asyncio.Task, node_offset))
    return found


@functools.cache
def _task_node_offset() -> int | None:
    """Where a C Task holds its list node (3.14+), from the offsets 3.14
    publishes for debuggers, trusted only if they agree with the Task type's
    size and with the thread and interpreter offsets btcore was compiled with;
    None before 3.14 or if they cannot be read or do not agree."""
    if "_asyncio_layout" not in globals():
        return None
    import _asyncio
    for path in _module_files(_asyncio):
        offsets = asyncio_debug.offsets(path)
        if offsets is not None:
            break
    else:
        return None
    compiled = _asyncio_layout()   # noqa: F821 (installed above, 3.14+)
    if (offsets["task_size"] != asyncio.Task.__basicsize__ or
            (offsets["thread_tasks_head"], offsets["thread_running_loop"], offsets["thread_running_task"],
             offsets["interp_tasks_head"]) != compiled):
        return None
    return offsets["task_node"]


def _module_files(module) -> list:
    """The files that may hold a C module: its own (a shared object), else the
    executable's and libpython's (a module built into the interpreter;
    sys.executable where /proc is not mounted, a chroot)."""
    files = [module.__file__] if getattr(module, "__file__", None) else []
    files += ["/proc/self/exe", sys.executable]
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="surrogateescape") as maps:
            files.extend(sorted({line.split(None, 5)[5].strip() for line in maps
                                 if line.count(" ") >= 5 and "/libpython3" in line}))
    except OSError:
        pass
    return files


def _copy_of(registry) -> list:
    # A WeakSet changes when a task dies, maybe during the copy (a gc run):
    # retried as asyncio.all_tasks() does.
    for _ in range(1000):
        try:
            return list(registry)
        except RuntimeError:
            continue
    return []


def _coroutine_state(coro) -> str | None:
    """NOT_STARTED, SUSPENDED or RUNNING from the coroutine itself; None once it has ended."""
    for prefix in ("cr_", "gi_", "ag_"):
        frame = getattr(coro, prefix + "frame", False)
        if frame is not False:
            break
    else:
        return SUSPENDED   # an awaitable of another kind: nothing says more
    if frame is None:
        return None
    if getattr(coro, prefix + "running", False):
        return RUNNING
    return SUSPENDED if getattr(coro, prefix + "suspended", True) else NOT_STARTED


def _running(coro) -> bool:
    """Is coro (a coroutine, generator or async generator) running?  What
    one awaits is the top of its frame's stack, kept only while it is
    suspended; a running one's await chain is its thread's stack.  And its
    cr_await is not to be read: 3.11-3.12's getter decides "awaiting" from
    the code unit after the frame's last instruction, which for a running
    frame is often a specialized call's inline cache, whose data can read
    as a RESUME, and then returns the word below the unkept stack (a
    SIGSEGV: a snapshot from a collection set off inside a running task)."""
    return bool(getattr(coro, "cr_running", False) or getattr(coro, "gi_running", False)
                or getattr(coro, "ag_running", False))


def coroutine_frames(coro, limit: int = CAPACITY) -> tuple[list, bool]:
    """The frames of coro's await chain (coro, what it awaits, ...),
    innermost first: the innermost limit of them, and whether outer ones
    were left out.  (The chain is walked from its outer end: a chain
    cannot loop, each coroutine awaits at most one.)"""
    frames, walked = collections.deque(maxlen=limit), 0
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is None:
            break
        frames.append(frame)
        walked += 1
        if _running(coro):
            break   # it awaits nothing yet (see _running)
        coro = (getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
                or getattr(coro, "ag_await", None))
    frames.reverse()
    return list(frames), walked > limit


def _own_backtrace(task) -> Backtrace:
    frames, truncated = coroutine_frames(task.get_coro())
    return python_backtrace(frames, truncated)


# ---- who awaits whom ----

def _awaiters_of(fut, depth: int = 0, seen=None) -> list:
    """The tasks awaiting fut, found through its done-callbacks (see the
    module's docstring); bounded, cycles cut."""
    seen = set() if seen is None else seen
    found = []
    for callback in _callbacks_of(fut):
        owner = getattr(callback, "__self__", None)
        if isinstance(owner, _TASKS):   # its wakeup: that task awaits fut
            found.append(owner)
            continue
        for ref in _held_by(callback):
            if id(ref) in seen:
                continue
            seen.add(id(ref))
            if isinstance(ref, _FUTURES) and depth < _AWAIT_DEPTH:
                found.extend(_awaiters_of(ref, depth + 1, seen))
            elif isinstance(getattr(ref, "_parent_task", None), _TASKS):   # a TaskGroup
                found.append(ref._parent_task)
    return _unique(found)


def _callbacks_of(fut) -> list:
    return [entry[0] if isinstance(entry, tuple) else entry for entry in (getattr(fut, "_callbacks", None) or ())]


def _held_by(callback) -> list:
    """What a done-callback holds: a partial's arguments, a closure's cells,
    a bound method's object."""
    held = list(getattr(callback, "args", None) or ())
    held.extend(_cell_contents(getattr(callback, "__closure__", None) or ()))
    owner = getattr(callback, "__self__", None)
    if owner is not None:
        held.append(owner)
    return held


def _cell_contents(cells) -> list:
    contents = []
    for cell in cells:
        try:
            contents.append(cell.cell_contents)
        except ValueError:   # an empty cell
            pass
    return contents


def _unique(items) -> list:
    ids = set()
    return [x for x in items if not (id(x) in ids or ids.add(id(x)))]


# ---- the snapshot's entries ----

def task_infos(threads: dict) -> list:
    """A TaskInfo for every pending task; threads: ident -> OSThread (snapshot()'s).
    A task whose own methods fail (a Task subclass) is left out, never the snapshot."""
    infos = [info for info in (read_optional(_info_of, task) for task in _unique(_registered_tasks()))
             if info is not None]
    mine = asyncio.events._get_running_loop()
    for info in infos:
        info.thread_id = _thread_of(info.loop, mine)
        thread = threads.get(info.thread_id)
        info.thread_name = thread.name if thread is not None else None
    by_task = {id(info.task): info for info in infos}
    for info in infos:
        _capture(info, by_task)
        _track(info)
    return infos


def _info_of(task) -> TaskInfo | None:
    """task's entry, without its stack; None once it is done."""
    if task.done():
        return None
    state = _coroutine_state(task.get_coro())   # a running task runs its coroutine
    if state is None:
        return None
    loop = task.get_loop()
    info = TaskInfo(task, loop, state)
    info.awaited_by = read_optional(_awaiters_of, task) or []
    return info


def _thread_of(loop, mine):
    """The ident of the thread running loop: the calling thread's for its own
    running loop (the real ident, as snapshot() names threads, also under
    monkey-patching; and a loop of another kind, uvloop's, has no
    _thread_id), else BaseEventLoop's _thread_id, set while it runs."""
    return current_ident() if loop is mine else getattr(loop, "_thread_id", None)


def _capture(info: TaskInfo, by_task: dict) -> None:
    try:
        if info.state == RUNNING and info.thread_id == current_ident():
            info.backtrace = without_own_frames(collect(capacity=CAPACITY))
        elif info.state == RUNNING:
            info.backtrace, info.python_only = python_frames_of_thread(info.thread_id), True
            if info.backtrace is None:
                info.error = "running in a thread that cannot be identified"
        else:
            info.backtrace = _own_backtrace(info.task)
            _append_awaiters(info, by_task)
    except BacktraceError as e:
        info.error = f"BacktraceError: {e}"


def _append_awaiters(info: TaskInfo, by_task: dict) -> None:
    """The await chain: the awaiter's own frames after the task's, then its
    awaiter's... (the first awaiter of each; bounded, cycles cut)."""
    bt, seen, awaiting = info.backtrace, {id(info.task)}, info.awaited_by
    while awaiting and len(seen) <= _CHAIN_DEPTH and len(bt) < bt.capacity:
        above = awaiting[0]
        if id(above) in seen:
            break
        seen.add(id(above))
        known = by_task.get(id(above))
        name = known.name if known is not None else f"{read_optional(_task_name, above) or 'Task'}"
        append_labelled(bt, _own_backtrace(above), f"awaited by {name}:")
        awaiting = known.awaited_by if known is not None else (read_optional(_awaiters_of, above) or [])


def _track(info: TaskInfo) -> None:
    spawn = sys.modules.get("btcore.capture.spawn")
    if spawn is not None and spawn.spawn_tracking_enabled():
        info.spawn_chain = read_optional(spawn.spawn_chain, info.task)
        info.spawned_by = read_optional(spawn._spawn_creator, info.task)


def place_tasks(infos) -> None:
    """Draw each task under its first awaiter in the snapshot (the tree of
    who awaits whom); one that nothing awaits stays where place_in_tree
    put it (under its creator, with spawn tracking)."""
    present = {id(info.greenlet) for info in infos}
    for info in infos:
        if isinstance(info, TaskInfo):
            above = next((t for t in info.awaited_by if id(t) in present), None)
            if above is not None:
                info.under = above
