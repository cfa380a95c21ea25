"""Crash reports (issue 27, the in-process part): on a fatal signal, the
crashing thread's merged native + Python backtrace, written by an
async-signal-safe handler (native/watch/crash.c), before the signal does
what it would have done without btcore (faulthandler's report, a core dump,
the same exit status).
"""
from __future__ import annotations

import sys

from ._native import lib
from .errors import BacktraceError
from .watchdog import _reason

_file = None   # kept alive: the handler writes to its descriptor


def enable_crash_report(file=None) -> None:
    """On SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT, write the signal, the
    fault address and the crashing thread's backtrace (most recent call
    first) to file (default sys.stderr), then pass the signal on to the
    handler installed before (faulthandler's, or the default action).

    The calling thread is registered for signal-context capture and given
    an alternate signal stack; call it in each thread whose crashes should
    be reported (a crash in another thread prints a line saying so).
    Calling it again changes the file."""
    file = sys.stderr if file is None else file
    try:
        fd = file.fileno()
    except (AttributeError, OSError, ValueError) as e:
        raise ValueError(f"enable_crash_report() needs a file with a descriptor: {e}") from None
    if lib.btc_thread_register() < 0:
        raise BacktraceError(f"cannot register this thread for crash reports: {_reason()}")
    if hasattr(file, "flush"):
        file.flush()
    if lib.btc_crash_enable(fd) != 0:
        raise BacktraceError("cannot install the crash report's signal handlers")
    global _file
    _file = file


def disable_crash_report() -> None:
    """Put back the handlers found when the report was enabled (where a later
    handler has not replaced ours)."""
    global _file
    lib.btc_crash_disable()
    _file = None


def crash_report_enabled() -> bool:
    """Enabled and not disabled since.  (A handler installed afterwards,
    faulthandler.enable() for one, runs first and passes the signal on to
    the crash report's: both reports are written.)"""
    return bool(lib.btc_crash_enabled())
