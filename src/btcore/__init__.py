"""btcore: native C/C++ and Python frames merged in true call order, for the
running stack and for suspended greenlets.

    bt = btcore.collect()          # raw capture: cheap, no strings
    print(bt)                      # resolved lazily, through a shared cache
"""
from .backtrace import Backtrace, append, collect, foreach
from .codec import decode
from .errors import BacktraceError
from .frame import Frame
from .resolve import cache
from .introspect import GreenletInfo, snapshot
from .dump import DEFAULT_DUMP_SIGNAL, dump_all, register_dump_signal, unregister_dump_signal
from .html import write_html
from .watchdog import Watchdog, gevent_blocking_reports, start_watchdog
from .switchclock import disable_switch_timing, enable_switch_timing
from .profile import Profile, profiling, start_profiler, stop_profiler
from .spawn import (SpawnChain, chain_backtrace, disable_spawn_tracking, enable_spawn_tracking, spawn_backtrace,
                    spawn_chain, spawn_tracking_enabled)
from .spawn_notes import spawn_exception_notes_enabled
from .crash import crash_report_enabled, disable_crash_report, enable_crash_report

__all__ = ["Backtrace", "BacktraceError", "DEFAULT_DUMP_SIGNAL",
           "DumpError", "DumpPermissionError", "Frame", "GreenletInfo", "Profile", "SpawnChain",
           "Watchdog", "append", "cache", "chain_backtrace", "collect", "crash_report_enabled", "decode",
           "disable_crash_report", "disable_spawn_tracking", "enable_crash_report",
           "disable_switch_timing", "dump_all", "dump_process", "enable_spawn_tracking", "enable_switch_timing",
           "foreach", "gevent_blocking_reports", "profile_process", "profiling", "register_dump_signal", "snapshot",
           "spawn_backtrace",
           "spawn_chain", "spawn_exception_notes_enabled", "spawn_tracking_enabled", "start_profiler",
           "start_watchdog", "stop_profiler", "unregister_dump_signal", "write_html"]
__version__ = "0.1.0"

# BTCORE_CRASH_REPORT=1: crash reports from start-up, as PYTHONFAULTHANDLER
# does for faulthandler (the thread importing btcore is registered).
if __import__("os").environ.get("BTCORE_CRASH_REPORT") == "1":
    enable_crash_report()


def __getattr__(name):
    # dump_process() and its modules (process.py, remote.py and the layout
    # tables they import) are imported on first use, not with btcore.
    if name in ("dump_process", "DumpError", "DumpPermissionError"):
        from . import process
        return getattr(process, name)
    if name == "profile_process":   # the outside profiler: the same modules
        from .profile_remote import profile_process
        return profile_process
    raise AttributeError(f"module 'btcore' has no attribute {name!r}")
