"""Crash reports: on a fatal signal, the crashing thread's merged native +
Python backtrace, written by an async-signal-safe handler
(native/watch/crash.c), then every thread and parked greenlet read from
outside by a healthy helper process (`python -m btcore dump PID`), before
the signal does what it would have done without btcore (faulthandler's
report, a core dump, the same exit status).
"""
from __future__ import annotations

import os
import sys

from .._native import ffi, lib
from ..errors import BacktraceError
from ..capture.greenlets import layout_known
from .watchdog import last_native_error

_fd = None     # the handler's own duplicate of its descriptor (closed when replaced or disabled)

# The helper: this interpreter, isolated from the crashed program's
# environment and directory (-I), importing this btcore (its folder first),
# then the dump of the pid the handler appends, with the handler's record
# (its address in the crashed process) named and encoded.
_HELPER = ("import sys; sys.path.insert(0, sys.argv[1]); from btcore.__main__ import main; "
           "print('btcore crash report, the rest read from outside (every thread and greenlet):', flush=True); "
           "sys.exit(main(['dump', '--crash-record', sys.argv[2], sys.argv[3]]))")


def helper_command() -> list | None:
    """The helper's command without the pid, or None where this process's
    interpreter cannot run it (an embedding program: uWSGI's sys.executable
    is uwsgi) or another process cannot be dumped (remote/process.py: x86-64)."""
    exe = sys.executable
    if os.uname().machine != "x86_64" or not exe or not os.path.basename(exe).startswith("python") or not os.access(exe, os.X_OK):
        return None
    site = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # holds btcore/
    return [exe, "-I", "-c", _HELPER, site,
            hex(lib.btc_crash_record_address())]


def enable_crash_report(file=None, *, helper: bool = True, helper_timeout: float = 10.0) -> None:
    """On SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT, write the signal, the
    fault address and the crashing thread's backtrace (most recent call
    first) to file (default sys.stderr), then, with helper (where this
    interpreter can run it), every thread and parked greenlet as
    `python -m btcore dump PID` shows them, read by a helper process started
    at the crash and waited for at most helper_timeout seconds; then pass
    the signal on to the handler installed before (faulthandler's, or the
    default action).

    The calling thread is registered for signal-context capture and given
    an alternate signal stack; call it in each thread whose crashes should
    be reported (a crash in another thread prints a line saying so; the
    helper's part shows every thread).  Calling it again changes the file
    and the helper."""
    file = sys.stderr if file is None else file
    if not 0 <= helper_timeout <= 3600:
        raise ValueError(f"helper_timeout must be 0 to 3600 seconds, not {helper_timeout!r}")
    try:   # a descriptor of its own: the file may be closed, and its number given to another file
        fd = os.dup(file.fileno())
    except (AttributeError, OSError, ValueError) as e:
        raise ValueError(f"enable_crash_report() needs a file with an open descriptor: {e}") from None
    try:
        _enable(file, fd, helper, helper_timeout)
    except BaseException:
        os.close(fd)
        raise
    global _fd
    previous, _fd = _fd, fd
    if previous is not None:
        os.close(previous)


def _enable(file, fd: int, helper: bool, helper_timeout: float) -> None:
    command = helper_command() if helper else None
    layout_known()   # greenlet's layout: how the handler finds the crashing greenlet's spawn record
    if lib.btc_thread_register() < 0:
        raise BacktraceError(f"cannot register this thread for crash reports: {last_native_error()}")
    if hasattr(file, "flush"):
        file.flush()
    args = [ffi.new("char[]", os.fsencode(a)) for a in command or ()]
    if lib.btc_crash_set_helper(args, len(args), int(helper_timeout * 1000)) != 0:
        raise ValueError("the crash report's helper command is too long")
    if lib.btc_crash_enable(fd) != 0:
        raise BacktraceError("cannot install the crash report's signal handlers")


def disable_crash_report() -> None:
    """Put back the handlers found when the report was enabled (where a later
    handler has not replaced ours)."""
    global _fd
    lib.btc_crash_disable()
    if _fd is not None:
        os.close(_fd)
    _fd = None


def crash_report_enabled() -> bool:
    """Enabled and not disabled since.  (A handler installed afterwards,
    faulthandler.enable() for one, runs first and passes the signal on to
    the crash report's: both reports are written, ours still of the
    fault's own frames.)"""
    return bool(lib.btc_crash_enabled())
