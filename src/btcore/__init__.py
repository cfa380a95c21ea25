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
from .switchclock import disable_switch_timing, enable_switch_timing
from .spawn import disable_spawn_tracking, enable_spawn_tracking, spawn_backtrace, spawn_tracking_enabled

__all__ = ["Backtrace", "BacktraceError", "Frame", "GreenletInfo", "append", "cache", "collect", "decode",
           "disable_spawn_tracking", "disable_switch_timing", "dump_all", "enable_spawn_tracking",
           "enable_switch_timing", "foreach", "register_dump_signal", "snapshot", "spawn_backtrace",
           "spawn_tracking_enabled", "unregister_dump_signal", "write_html"]
__version__ = "0.1.0"
