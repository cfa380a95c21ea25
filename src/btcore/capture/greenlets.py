"""Which greenlet a capture targets, and the one-time check of greenlet's layout.

btcore reads a suspended greenlet's saved stack state from greenlet's C++
object.  Nothing about that object is taken on trust: the first capture of a
suspended greenlet makes two greenlets in known states and has the native
core locate and validate the state from them; a greenlet build it does not
recognise is refused with BacktraceError, never guessed at.
"""
from __future__ import annotations

import os
import threading

import greenlet

from .._native import ffi, lib
from ..errors import BacktraceError
from .threads import current_ident, current_name


CURRENT = 0      # capture the calling thread's own stack (address 0 in btc_collect)
NOTHING = None   # a greenlet with no stack to capture (not started, or dead)

_learn_lock = threading.Lock()
_learned: str | None = None   # "" once learned, else the reason it failed
_learning = threading.local()   # .now: this thread is checking the layout


def _learn_lock_after_fork_in_child():
    # Held at fork() by a thread the child does not have: learning, never
    # finished here, starts over on a new lock.
    global _learn_lock
    if _learn_lock.locked():
        _learn_lock = threading.Lock()


os.register_at_fork(after_in_child=_learn_lock_after_fork_in_child)


def _park():
    greenlet.getcurrent().parent.switch()


def _learn_layout() -> str:
    """Check the layout with this thread's greenlet tracer suspended: the
    check switches greenlets, and a tracer that captures would re-enter it."""
    tracer = greenlet.settrace(None)   # per thread: other threads keep theirs
    try:
        return _learn_from_known_greenlets()
    finally:
        greenlet.settrace(tracer)


def _learn_from_known_greenlets() -> str:
    """Show the native core two suspended greenlets with different, known
    amounts of stack copied to the heap."""
    from_main = greenlet.greenlet(_park)
    from_main.switch()   # the caller reused the stack: all of it was copied
    outcome = []

    def parent():
        # Starting `child` copies only parent's switching frames.
        child = greenlet.greenlet(lambda: outcome.append(lib.btc_greenlet_learn(
            id(greenlet.greenlet), id(from_main), from_main._stack_saved,
            id(parent_greenlet), parent_greenlet._stack_saved)))
        child.switch()

    parent_greenlet = greenlet.greenlet(parent)
    parent_greenlet.switch()
    from_main.throw(greenlet.GreenletExit)
    if outcome == [0]:
        return ""
    return ffi.string(lib.btc_last_error()).decode() or "greenlet layout check failed"


def layout_known() -> bool:
    """Learn greenlet's layout if not done yet; False if it is not recognised."""
    global _learned
    if _learned is None:
        if getattr(_learning, "now", False):   # a signal handler or finalizer run by the check
            raise BacktraceError("greenlet's layout is being checked on this thread: a capture of a "
                                 "suspended greenlet cannot run inside that check; retry after it")
        with _learn_lock:
            if _learned is None:
                _learning.now = True
                try:
                    _learned = _learn_layout()
                finally:
                    _learning.now = False
    return not _learned


def _ensure_layout() -> None:
    if not layout_known():
        raise BacktraceError(
            f"cannot read suspended greenlets of greenlet {greenlet.__version__}: {_learned}")


# greenlet's own state, read through the base type: subclasses override
# __bool__ (gevent's Greenlet is true once scheduled, before it has run) and
# may override anything else.
_active = greenlet.greenlet.__bool__   # started and not dead
_parent = greenlet.greenlet.parent.__get__


def _root(g):
    while (parent := _parent(g)) is not None:
        g = parent
    return g


def target_of(target):
    """(CURRENT or NOTHING or a greenlet's address, extra capture flags).

    Only what cannot change is decided here; whether a greenlet is running,
    suspended or dead is checked again in C under the GIL, since another
    thread may switch between this check and the capture.
    """
    if not isinstance(target, greenlet.greenlet):
        raise TypeError(f"target must be a greenlet or None, not {type(target).__name__}")
    current = greenlet.getcurrent()
    if target is current:
        return CURRENT, 0
    if not _active(target):   # not started, or dead: no stack
        return NOTHING, 0
    _ensure_layout()
    # greenlets cannot change threads, and a parent is always in the same thread
    return id(target), (lib.BTC_WANT_OWN_THREAD if _root(target) is _root(current) else 0)


def _state(g, in_this_thread: bool) -> str:
    """Read from greenlet's own slots: gevent's Greenlet overrides __bool__ and dead."""
    base = greenlet.greenlet
    if base.dead.__get__(g):
        return "dead"
    if not base.__bool__(g):
        return "not started"
    if in_this_thread:   # a thread runs one greenlet at a time: the current one
        return "running" if g is greenlet.getcurrent() else "suspended"
    return "suspended" if base.gr_frame.__get__(g) is not None else "running"


def describe(g) -> str:
    """repr, state and thread of greenlet g, as they are now (format time)."""
    try:
        text = repr(g)
    except Exception:   # a subclass's __repr__ must not break a backtrace
        text = object.__repr__(g)
    in_this_thread = _root(g) is _root(greenlet.getcurrent())
    if in_this_thread:   # the OS thread: threading's under monkey-patching names a greenlet
        where = f"thread {current_name()} (id {current_ident()})"
    else:
        where = "another thread"
    return f"{text}: {_state(g, in_this_thread)}, {where}"
