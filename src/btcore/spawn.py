"""Spawn tracking: every greenlet remembers where it was created, and by whom,
all generations back, bounded.

enable_spawn_tracking() hooks greenlet creation in the native core
(native/spawn.c): each greenlet created afterwards records the raw frames of
the stack that created it (no names: those are looked up only when somebody
asks) and a reference to its spawner's ancestry.  spawn_backtrace(g) joins
them into a Backtrace, newest generation first.
"""
from __future__ import annotations

import greenlet

from ._native import ffi, lib
from .backtrace import Backtrace, _check_capacity, append_labelled
from .errors import BacktraceError
from .greenlets import layout_known

if lib.btc_spawn_install(id(globals()), id(greenlet.greenlet)) != 0:
    raise ImportError("btcore: cannot install spawn tracking")

# _spawn_chain(g, limit) (installed above): [(site Backtrace, spawner repr)]
# of g and its ancestors, newest first, at most limit; None if untracked.
_spawn_chain = globals()["_spawn_chain"]
# _spawn_creator(g): the greenlet that created g while tracking was on, or
# None (untracked, or its creator is gone).
_spawn_creator = globals()["_spawn_creator"]


def enable_spawn_tracking(*, capacity: int = 32, native: bool = True) -> None:
    """Record the spawn site of every greenlet created from now on.

    capacity: the most frames a spawn_backtrace() holds (and a single spawn
    site captures).  native: record native frames too, not only Python ones.
    Calling it again while on changes the settings for greenlets created
    afterwards.
    """
    _check_capacity(capacity)
    if type(native) is not bool:
        raise TypeError(f"native must be a bool, not {type(native).__name__}")
    if native and not layout_known():
        # Inside a greenlet a native capture must stop at its bottom, which
        # needs greenlet's layout: refuse rather than record stale frames.
        raise BacktraceError(f"cannot record native spawn sites with greenlet {greenlet.__version__}: "
                             "its layout is not recognised (use native=False)")
    if lib.btc_spawn_enable(capacity, native) != 0:
        raise BacktraceError("cannot enable spawn tracking")


def disable_spawn_tracking() -> None:
    """Stop recording at once and restore greenlet creation exactly as it was.
    Greenlets already tracked keep their records."""
    lib.btc_spawn_disable()


def spawn_tracking_enabled() -> bool:
    return bool(lib.btc_spawn_enabled())


def spawn_backtrace(g) -> Backtrace | None:
    """Where greenlet g was created, then where its creator was, and so on:
    a Backtrace of the tracking capacity, newest generation first, each
    generation a join headed "spawned by <spawner> at:".  None if g was not
    created while tracking was on."""
    capacity = lib.btc_spawn_capacity()
    chain = _spawn_chain(g, capacity + 1)   # each site holds >= 1 frame, or adds nothing
    if chain is None:
        return None
    bt = Backtrace(capacity)
    for site, spawner in chain:
        if len(bt) == capacity:
            bt.truncated = True   # older generations dropped
            break
        append_labelled(bt, site, f"spawned by {spawner} at:")
    return bt


def _counts() -> tuple[int, int]:
    """(live records, interned sites): for tests and benchmarks."""
    records, sites = ffi.new("int64_t *"), ffi.new("int64_t *")
    lib.btc_spawn_counts(records, sites)
    return records[0], sites[0]


