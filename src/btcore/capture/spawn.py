"""Spawn tracking: every greenlet remembers where it was created, and by whom,
all generations back, bounded.

enable_spawn_tracking() hooks greenlet creation in the native core
(native/capture/spawn.c): each greenlet created afterwards records the raw
frames of the stack that created it (no names: those are looked up only
when somebody asks), interned, and a link to its spawner's record.  The
chain over generations is followed when it is read: spawn_chain(g) is the
cheap raw chain (site handles, no frames copied), chain_backtrace() joins a
chain into a Backtrace, newest generation first; spawn_backtrace(g) does both.
"""
from __future__ import annotations

import sys
import weakref
from typing import NamedTuple

import greenlet

from .._native import ffi, lib
from .backtrace import Backtrace, check_capacity, append_labelled
from ..errors import BacktraceError
from .greenlets import layout_known

if lib.btc_spawn_install(id(globals()), id(greenlet.greenlet)) != 0:
    raise ImportError("btcore: cannot install spawn tracking")

# raw_spawn_chain(g, limit) (installed above as _spawn_chain): (links, cut),
# links newest first, at most limit, each (site Backtrace, spawner repr,
# spawner's weak reference or None); cut: older generations were left out.
# None if g is untracked.
raw_spawn_chain = globals()["_spawn_chain"]
# _spawn_creator(g): the greenlet that created g while tracking was on, or
# None (untracked, or its creator is gone).
_spawn_creator = globals()["_spawn_creator"]
# take_created() (installed above as _spawn_take_created): (weak references to
# the greenlets made since the last call, lost) while lib.btc_spawn_watch_creation(1)
# is in force (the profiler); lost: some were not kept, scan the heap.
take_created = globals()["_spawn_take_created"]
# _spawn_task_hook(add, current_tasks, task_types, weakset): the tracking
# add() of asyncio's task registry (native/capture/spawn.c, "asyncio tasks");
# weakset: None, or a plain weakref.WeakSet registry's (data, _pending_removals
# or None, _remove), whose entries the records become.
_spawn_task_hook = globals()["_spawn_task_hook"]
# _spawn_task_new(task_type, on, current_tasks): hook or restore the C Task's tp_new (3.14+).
_spawn_task_new = globals()["_spawn_task_new"]
# asyncio's task registries: every Task calls add() on them at creation
# (3.14+: only pure-Python tasks; C tasks are hooked at tp_new)
_TASK_REGISTRIES = ("_all_tasks", "_scheduled_tasks")
_C_TASK_LISTS = sys.version_info >= (3, 14)

DEFAULT_CAPACITY = lib.BTC_SPAWN_DEFAULT_CAPACITY   # frames of a whole chain's Backtrace
SITE_FRAMES = lib.BTC_SPAWN_SITE_FRAMES             # the most frames one site records
GENERATIONS = lib.btc_spawn_generations()           # the most generations a chain is read to


class SpawnChain(NamedTuple):
    """Where a greenlet was created, and its creator, and so on: raw and cheap
    (no frame copied, nothing resolved).

    links  ((site, spawner, creator), ...), newest generation first, at most
           GENERATIONS: site is the interned raw Backtrace of the creating
           stack (one object for every greenlet created there), spawner the
           creator's repr taken when it first created a greenlet, creator a
           weak reference to the creating greenlet (None when not kept)
    cut    older generations existed and are not in links
    """
    links: tuple
    cut: bool


def enable_spawn_tracking(*, capacity: int = DEFAULT_CAPACITY, native: bool = True,
                          exception_notes: bool = True) -> None:
    """Record the spawn site of every greenlet created from now on.

    capacity: the most frames a spawn_backtrace() holds, all generations
    together (a single spawn site records at most min(capacity, SITE_FRAMES)).
    native: record native frames too, not only Python ones.
    exception_notes: an exception that escapes a tracked greenlet gets its
    spawn chain as a PEP 678 note (see btcore/capture/spawn_notes.py); False: none.
    Calling it again while on changes the settings for greenlets created
    afterwards (and turns notes on or off at once).
    """
    check_capacity(capacity)
    for name, value in (("native", native), ("exception_notes", exception_notes)):
        if type(value) is not bool:
            raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    if native and not layout_known():
        # Inside a greenlet a native capture must stop at its bottom, which
        # needs greenlet's layout: refuse rather than record stale frames.
        raise BacktraceError(f"cannot record native spawn sites with greenlet {greenlet.__version__}: "
                             "its layout is not recognised (use native=False)")
    from .spawn_notes import set_exception_notes   # (it imports this module)
    set_exception_notes(exception_notes)   # first: it may refuse
    if lib.btc_spawn_enable(capacity, native) != 0:
        set_exception_notes(False)
        raise BacktraceError("cannot enable spawn tracking")
    _hook_tasks()


def _hook_tasks() -> None:
    """Track asyncio tasks too: the tracking add() goes on asyncio's task
    registry, which every Task, C or Python, calls once at creation,
    whatever the task factory; on 3.14+, where C tasks register in C lists,
    the C Task type's tp_new is hooked as well (native/capture/spawn.c,
    "asyncio tasks")."""
    from asyncio import futures, tasks
    current_tasks = getattr(tasks, "_current_tasks", None)
    bases = tuple({futures.Future, getattr(futures, "_PyFuture", futures.Future)})
    for registry in _task_registries(tasks):
        if not _hooked(registry) and isinstance(current_tasks, dict):
            registry.add = _spawn_task_hook(registry.add, current_tasks, bases, _weakset_parts(registry))
    c_task = _c_task_type()
    if c_task is not None and isinstance(current_tasks, dict):
        _spawn_task_new(c_task, True, current_tasks)


def _unhook_tasks() -> None:
    tasks = sys.modules.get("asyncio.tasks")
    for registry in _task_registries(tasks) if tasks is not None else ():
        if _hooked(registry):
            del registry.add   # the class's method again
    c_task = _c_task_type() if tasks is not None else None
    if c_task is not None:
        _spawn_task_new(c_task, False, getattr(tasks, "_current_tasks", {}))


def _c_task_type():
    """3.14+'s C Task type, whose tasks register in C lists (None before 3.14
    or without the C module)."""
    if not _C_TASK_LISTS:
        return None
    try:
        from _asyncio import Task
    except ImportError:
        return None
    return Task


def _weakset_parts(registry) -> tuple | None:
    """A plain weakref.WeakSet's (data, _pending_removals, _remove): what its
    add() uses, for the hook to add the task's record as its entry (3.14+'s
    WeakSet has no pending removals: None); None for a registry of any other
    kind (its own add() is called)."""
    if type(registry) is not weakref.WeakSet:
        return None
    data, pending, remove = (vars(registry).get(name) for name in ("data", "_pending_removals", "_remove"))
    kinds_ok = type(data) is set and (pending is None or type(pending) is list) and callable(remove)
    return (data, pending, remove) if kinds_ok else None


def _task_registries(tasks) -> list:
    return [r for r in (getattr(tasks, name, None) for name in _TASK_REGISTRIES) if hasattr(r, "__dict__")]


def _hooked(registry) -> bool:
    return getattr(vars(registry).get("add"), "__name__", None) == "_spawn_task_added"


def disable_spawn_tracking() -> None:
    """Stop recording at once and restore greenlet and asyncio task creation
    exactly as they were.  Greenlets and tasks already tracked keep their
    records; exception notes stop."""
    from .spawn_notes import set_exception_notes
    lib.btc_spawn_disable()
    _unhook_tasks()
    set_exception_notes(False)


def spawn_tracking_enabled() -> bool:
    return bool(lib.btc_spawn_enabled())


def spawn_chain(g) -> SpawnChain | None:
    """g's spawn chain (see SpawnChain), or None if g was not created while
    tracking was on.  Costs a tuple per generation: cheap enough to take for
    every greenlet of a snapshot."""
    try:
        chain = raw_spawn_chain(g, GENERATIONS)
    except TypeError:
        asyncio = sys.modules.get("asyncio")
        if asyncio is not None and isinstance(g, asyncio.Future):   # tracking never on: no task has a record
            return None
        raise
    return None if chain is None else SpawnChain(*chain)


def chain_backtrace(chain: SpawnChain, capacity: int | None = None) -> Backtrace:
    """A chain's sites joined into one Backtrace of `capacity` frames (default:
    the tracking capacity), newest generation first, each generation a join
    headed "spawned by <spawner> at:".  Truncated when the capacity or the
    generation bound is reached (the oldest generation's header says so),
    or when a site recorded only its innermost SITE_FRAMES (its header says so)."""
    if not isinstance(chain, SpawnChain):
        raise TypeError(f"chain_backtrace() takes a SpawnChain (spawn_chain()), not {type(chain).__name__}")
    capacity = lib.btc_spawn_capacity() if capacity is None else check_capacity(capacity)
    return join_chain(Backtrace(capacity), chain)


def join_chain(bt: Backtrace, chain: SpawnChain) -> Backtrace:
    """chain's sites appended to the empty bt (chain_backtrace(); an outside dump's RemoteBacktrace)."""
    capacity, links = bt._capacity, chain.links
    for i, (site, spawner, _) in enumerate(links):
        if len(bt) == capacity:
            bt.truncated = True   # older generations dropped
            break
        notes = ["its outer frames not recorded"] if site.truncated else []
        if chain.cut and i == len(links) - 1:
            bt.truncated = True
            notes.append(f"older generations not kept: {GENERATIONS} at most")
        append_labelled(bt, site, f"spawned by {spawner} at{' (' + '; '.join(notes) + ')' if notes else ''}:")
    return bt


def spawn_backtrace(g) -> Backtrace | None:
    """Where greenlet g was created, then where its creator was, and so on:
    chain_backtrace(spawn_chain(g)).  None if g was not created while
    tracking was on."""
    chain = spawn_chain(g)
    return None if chain is None else chain_backtrace(chain)


def _counts() -> tuple[int, int]:
    """(live records, interned sites): for tests and benchmarks."""
    records, sites = ffi.new("int64_t *"), ffi.new("int64_t *")
    lib.btc_spawn_counts(records, sites)
    return records[0], sites[0]


