"""The watchdog: the stack of a greenlet that stopped switching, written while it is stuck.

greenlet counts each thread's switches itself (every switch increments the
thread state's context_ver); a C thread (native/watch/watchdog.c) reads the
counters of the watched threads without the GIL and, when one has not
moved for the threshold, samples the stuck thread through a signal whose
handler captures its running stack (native/capture/signal_capture.c),
names the frames in C and writes the report itself: the stuck thread may
hold the GIL, so nothing here waits for Python.  A switch costs nothing
more.  See docs/design.md, "Stuck threads".
"""
from __future__ import annotations

import atexit
import importlib.machinery
import os
import sys

import greenlet

from .._native import ffi, lib
from ..capture.greenlets import BacktraceError
from ..capture.modules import loaded_modules

_running = None                # the Watchdog whose C thread runs (one per process)


def _idle_point() -> tuple:
    """(code, lo, hi): where a thread sampled while waiting for events is,
    not stuck, for the asyncio loop the calling thread runs, else for
    gevent's hub if gevent is imported: the code of its innermost Python
    frame (the loop's selector's select(), gevent's Hub.run; None: not
    known), and for a loop written in C (uvloop: its wait has no Python
    frame of its own) the span [lo, hi) of that loop's code, from which the
    wait must be called (else empty)."""
    loop = _running_asyncio_loop()
    if loop is not None:
        select = getattr(type(getattr(loop, "_selector", None)), "select", None)
        if hasattr(select, "__code__"):
            return select.__code__, 0, 0
        compiled = _compiled_loop_point(loop)
        if compiled is not None:
            return compiled
    hub = sys.modules.get("gevent.hub")
    return getattr(getattr(getattr(hub, "Hub", None), "run", None), "__code__", None), 0, 0


def _compiled_loop_point(loop):
    """_idle_point() of a loop without a selector of Python's: one written in
    C waits in its own code, under the frame that runs the loop (the frame
    the running task's coroutine was resumed from: the C task and the loop
    have none); None if either is not found."""
    span = _compiled_code_of(type(loop))
    task = sys.modules["asyncio"].current_task(loop)
    frame = getattr(getattr(task, "get_coro", lambda: None)(), "cr_frame", None)
    runner = frame.f_back if frame is not None else None
    if span is None or runner is None:
        return None
    return (runner.f_code, *span)


def _compiled_code_of(cls):
    """(lo, hi): the executable span of the extension module that defines the
    first class of cls's MRO written in C, or None."""
    for klass in cls.__mro__:
        path = getattr(sys.modules.get(klass.__module__), "__file__", None)
        if path and path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            for module in loaded_modules():
                try:
                    if module.path and os.path.samefile(module.path, path):
                        return module.lo, module.hi
                except OSError:
                    continue
            return None
    return None


def _running_asyncio_loop():
    """The asyncio loop running in the calling thread, if any (asyncio is not imported for it)."""
    events = sys.modules.get("asyncio.events")
    return events._get_running_loop() if events is not None else None


def last_native_error() -> str:
    return ffi.string(lib.btc_last_error()).decode("utf-8", "replace")


def _switches_are_counted() -> bool:
    """Does this greenlet count its switches where the watchdog reads them?
    (greenlet increments context_ver on every switch; checked, not assumed.)"""
    before = lib.btc_switch_count()
    greenlet.greenlet(lambda: None).switch()   # two switches: there and back
    return lib.btc_switch_count() - before >= 2


def _watch_calling_thread() -> None:
    if not _switches_are_counted():
        raise BacktraceError(f"cannot watch this thread: greenlet {greenlet.__version__} does not count "
                             "switches in the thread state's context_ver")
    code, lo, hi = _idle_point()
    if lib.btc_watch_thread(0 if code is None else id(code), lo, hi) < 0:
        raise BacktraceError(f"cannot watch this thread: {last_native_error()}")


def _unwatch_calling_thread() -> None:
    lib.btc_unwatch_thread()


def _fileno(file) -> int:
    file = sys.stderr if file is None else file
    try:
        file.flush()
        fd = file.fileno()
        os.fstat(fd)   # open
        return fd
    except (AttributeError, OSError, ValueError) as e:
        raise ValueError("the watchdog writes from a C thread with write(2): file must have a fileno()") from e


class Watchdog:
    """A running watchdog (see start_watchdog()); stop() it, or use it as a context manager."""

    def __init__(self, threshold: float, file, repeat: bool):
        self.threshold, self.repeat = threshold, repeat
        self._fd = _fileno(file)

    def _start(self) -> None:
        global _running
        if _running is not None:
            raise RuntimeError("a watchdog is already running in this process (stop() it first)")
        _watch_calling_thread()
        if lib.btc_watchdog_start(self.threshold, self._fd, self.repeat) < 0:
            _unwatch_calling_thread()
            raise RuntimeError("cannot start the watchdog thread")
        _running = self

    def watch(self) -> None:
        """Watch the calling thread too."""
        _watch_calling_thread()

    @property
    def reports(self) -> int:
        """Stuck reports written so far."""
        return lib.btc_watchdog_reports()

    def stop(self) -> None:
        """Stop the watchdog thread and stop watching every thread it watched (from
        any thread).  Idempotent."""
        global _running
        if _running is not self:
            return
        lib.btc_watchdog_stop()
        _running = None

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_watchdog(threshold: float = 1.0, file=None, *, repeat: bool = True) -> Watchdog:
    """Watch the calling thread: when its greenlets have not switched for
    threshold seconds, write the running greenlet's merged native + Python
    stack to file (default sys.stderr) while it is still stuck, again after
    2x, 4x, ... the threshold while it stays stuck (repeat=True: "the same
    stack as at T s", or only the inner frames that changed since the last
    stack shown), and a line with how long it was stuck when it switches
    again.

    Works whatever the thread is stuck in: C code holding the GIL, a
    blocking system call, a Python loop.  A thread switched into gevent's
    hub is idle, not stuck (import gevent before starting).  An asyncio
    loop: call it from a coroutine running on that loop; every callback
    the loop runs counts as a switch, a loop stuck in one callback is
    reported, and one waiting in its selector (uvloop's: in libuv) is
    idle.  The report is
    written by a C thread with write(2) on file's descriptor.  One watchdog
    per process; call Watchdog.watch() in other threads to watch them too.
    """
    if not threshold > 0:
        raise ValueError("threshold must be > 0 seconds")
    if not isinstance(repeat, bool):
        raise TypeError(f"repeat must be True or False, not {type(repeat).__name__}")
    dog = Watchdog(float(threshold), file, repeat)
    dog._start()
    return dog


def _forget_in_child() -> None:
    # The C thread does not exist in a forked child (native/watch/watchdog.c
    # says so there too): the child may start its own.
    global _running
    _running = None


os.register_at_fork(after_in_child=_forget_in_child)


@atexit.register
def _stop_at_exit() -> None:
    # The C thread reads code objects and type names: not during finalization.
    if _running is not None:
        _running.stop()


# ---- one sample, as text (gevent's monitor, tests) ----

def _sample_text(thread_ident: int, timeout: float = 1.0) -> str | None:
    """The running stack of a registered thread, sampled by signal and named
    in C; None if it does not answer."""
    sample = ffi.new("btc_sigsample *")
    if lib.btc_signal_sample(thread_ident, int(timeout * 1000), sample) < 0:
        return None
    buf = ffi.new("char[]", 64 * 1024)
    n = lib.btc_sigsample_format(sample, buf, len(buf))
    return ffi.string(buf, n).decode("utf-8", "replace")


def _register_calling_thread() -> None:
    if lib.btc_thread_register() < 0:
        raise BacktraceError(f"cannot register this thread for signal sampling: {last_native_error()}")


def gevent_blocking_reports() -> None:
    """Make gevent's own blocking monitor (config.monitor_thread,
    config.max_blocking_time) add btcore's merged native + Python stack of
    the blocked loop to its report (EventLoopBlocked.info, which it prints).

    Call it in the thread whose hub is monitored (the main thread usually).
    gevent's monitor is a Python thread: it reports a loop blocked in a
    Python loop or in C code that released the GIL; for C code that holds
    the GIL, use start_watchdog()."""
    from gevent import events
    _register_calling_thread()
    if _on_gevent_event not in events.subscribers:
        events.subscribers.append(_on_gevent_event)


def _on_gevent_event(event) -> None:
    from gevent.events import EventLoopBlocked
    if not isinstance(event, EventLoopBlocked):
        return
    ident = getattr(event.hub, "thread_ident", None)
    text = _sample_text(ident) if ident is not None else None
    if text is None:
        event.info.append("btcore: the blocked thread did not answer the capture signal "
                          "(call btcore.gevent_blocking_reports() in that thread)")
        return
    event.info.append("btcore: the blocked thread's native and Python stack, innermost first:")
    event.info.extend(text.rstrip("\n").split("\n"))


# ---- register_dump_signal(stuck=True) ----

def install_stuck_dump(signum: int, file, chain: bool) -> None:
    _register_calling_thread()
    if lib.btc_dump_signal_install(signum, _fileno(file), chain) < 0:
        raise ValueError(f"cannot install a stuck-thread dump on signal {signum} "
                         "(one at a time; not the capture signal)")


def uninstall_stuck_dump(signum: int) -> bool:
    return lib.btc_dump_signal_uninstall(signum) > 0


@atexit.register
def _uninstall_stuck_dump_at_exit() -> None:
    # Its thread reads code objects when the signal comes: not during finalization.
    lib.btc_dump_signal_uninstall(0)
