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
from .dump import dump_all, register_dump_signal, unregister_dump_signal
from .html import write_html
from .watchdog import Watchdog, gevent_blocking_reports, start_watchdog
from .switchclock import disable_switch_timing, enable_switch_timing
from .profile import Profile, profiling, start_profiler, stop_profiler
from .spawn import (SpawnChain, chain_backtrace, disable_spawn_tracking, enable_spawn_tracking, spawn_backtrace,
                    spawn_chain, spawn_tracking_enabled)

__all__ = ["Backtrace", "BacktraceError", "DumpError", "DumpPermissionError", "Frame", "GreenletInfo", "Profile", "SpawnChain",
           "Watchdog", "append", "cache", "chain_backtrace", "collect", "decode", "disable_spawn_tracking",
           "disable_switch_timing", "dump_all", "dump_process", "enable_spawn_tracking", "enable_switch_timing",
           "foreach", "gevent_blocking_reports", "profiling", "register_dump_signal", "snapshot", "spawn_backtrace", "spawn_chain",
           "spawn_tracking_enabled", "start_profiler", "start_watchdog", "stop_profiler", "unregister_dump_signal", "write_html"]
__version__ = "0.1.0"


def __getattr__(name):
    # dump_process() reads ELF files through pyelftools, whose import costs
    # ~0.1 s: it is imported on first use, not with btcore.
    if name in ("dump_process", "DumpError", "DumpPermissionError"):
        from . import process
        return getattr(process, name)
    raise AttributeError(f"module 'btcore' has no attribute {name!r}")
