"""The process's OS threads: ident and name as `threading` knew them before
any monkey-patching, whatever gevent or eventlet did to `threading` since.

Under monkey-patching threading.get_ident() is the current greenlet's id
(it changes with the greenlet that asks) and threading.enumerate() lists
greenlets dressed as threads.  What stays true: the interpreter's thread
states (native/capture/threads.c) and pthread_self().  Names come from the
`threading` that registered the thread: the original module's `_active`
dict, keyed by the real ident (eventlet keeps the original module as
`__original_module_threading`; gevent patches `threading` in place, keeping
its dict, but re-keys the main thread under the hub's greenlet).
"""
from __future__ import annotations

import _thread
import os
import sys

from .._native import ffi, lib

MAX_THREADS = 1024          # threads listed at most (the rest are not named)
THREADPOOL_WORKER = "ThreadPool worker"   # a gevent threadpool thread (started without `threading`)

if lib.btc_install_thread_clocks(id(globals())) != 0:
    raise ImportError("btcore: cannot install _thread_clocks")
# Installed above (native/capture/threads.c): _thread_clocks(), {ident: (CPU
# ns or -1, switch count)} of every other thread that runs Python code, in one
# pass (the profiler's look at every thread at every tick).
thread_clocks = globals()["_thread_clocks"]


class OSThread:
    """One OS thread of the interpreter.

    ident      its threading ident before patching (pthread_t)
    native_id  the kernel's thread id
    name       its name as `threading` knew it, else a fallback from native_id
    stack_lo, stack_hi   its stack's address range, (0, 0) if unknown
    """

    __slots__ = ("ident", "native_id", "name", "stack_lo", "stack_hi")

    def __init__(self, ident, native_id, name, stack_lo=0, stack_hi=0):
        self.ident, self.native_id, self.name = ident, native_id, name
        self.stack_lo, self.stack_hi = stack_lo, stack_hi

    def owns(self, address: int) -> bool:
        """Whether address lies on this thread's stack."""
        return self.stack_lo <= address < self.stack_hi

    def __repr__(self) -> str:
        return f"<OSThread {self.name} ident=0x{self.ident:x} native_id={self.native_id}>"


def current_ident() -> int:
    """The calling OS thread's ident, as threading.get_ident() gave it before
    patching (the patched one returns the current greenlet's id)."""
    return lib.btc_os_thread_self()


def current_thread() -> OSThread | None:
    """The calling OS thread (None only if it has no thread state)."""
    ident = current_ident()
    return next((thread for thread in os_threads() if thread.ident == ident), None)


def current_name() -> str:
    """The calling OS thread's name (see os_threads)."""
    thread = current_thread()
    return thread.name if thread is not None else fallback_name(None)


def is_main_thread() -> bool:
    """Whether the caller runs in the process's main thread, in any greenlet
    (the kernel's rule: its thread id is the pid, also after fork())."""
    thread = current_thread()
    return thread is not None and thread.native_id == os.getpid()


def os_threads(greenlets=()) -> list[OSThread]:
    """Every thread the interpreter knows, named.  greenlets: greenlets seen
    by the caller; a gevent threadpool worker among them names its thread."""
    out = ffi.new("btc_os_thread[]", MAX_THREADS)
    count = lib.btc_os_threads(out, MAX_THREADS)
    workers = _threadpool_idents(greenlets)
    threads = []
    for i in range(max(count, 0)):
        t = out[i]
        name = _name_of(t.ident, t.native_id, workers)
        threads.append(OSThread(t.ident, t.native_id, name, t.stack_lo, t.stack_hi))
    return threads


def real_thread(name: str):
    """_thread.NAME (start_new_thread, allocate_lock) as it was before gevent
    or eventlet patched it: a real OS thread, a lock of OS threads (gevent's
    lock would need a hub in the waiting thread, and would not wake it from
    another)."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None:
        return monkey.get_original("_thread", name)   # the current one if unpatched
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is not None and patcher.is_monkey_patched("thread"):
        return getattr(patcher.original("_thread"), name)
    return getattr(_thread, name)


def fallback_name(native_id) -> str:
    """The name of a thread `threading` never named (never "?")."""
    return f"native thread {native_id}" if native_id else "unnamed thread"


def _name_of(ident, native_id, workers) -> str:
    # The main thread by the kernel's rule: after fork() the forking thread
    # is the child's main thread, and main_thread().native_id is the parent's.
    if native_id == os.getpid():
        main = _main_thread()
        if main is not None:
            return main.name
    for active in _active_dicts():
        thread = active.get(ident)
        if thread is not None and getattr(thread, "_ident", None) == ident:
            return thread.name
    if ident in workers:
        return THREADPOOL_WORKER
    return fallback_name(native_id)


def _main_thread():
    threading = sys.modules.get("threading")
    try:
        return threading.main_thread() if threading is not None else None
    except Exception:   # a patched module's code must not fail a dump
        return None


def _active_dicts() -> list:
    """threading's `_active` dicts (ident -> Thread) that may hold real idents:
    eventlet's saved original module first, then the module in use."""
    found = []
    for name in ("__original_module_threading", "threading"):
        active = getattr(sys.modules.get(name), "_active", None)
        if isinstance(active, dict) and all(active is not other for other in found):
            found.append(active)
    return found


def _threadpool_idents(greenlets) -> set:
    """Real idents of the threads that gevent threadpool workers run in."""
    pool = sys.modules.get("gevent.threadpool")
    worker = getattr(pool, "_WorkerGreenlet", None)
    if worker is None:
        return set()
    return {g._thread_ident for g in greenlets if isinstance(g, worker) and g._thread_ident}
