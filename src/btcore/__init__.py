"""btcore: native C/C++ and Python frames merged in true call order, for the
running stack and for suspended greenlets.

    bt = btcore.collect()          # raw capture: cheap, no strings
    print(bt)                      # resolved lazily, through a shared cache
"""
from .backtrace import Backtrace, append, collect, foreach
from .greenlets import BacktraceError
from .frame import Frame
from .resolve import cache
from .spawn import disable_spawn_tracking, enable_spawn_tracking, spawn_backtrace, spawn_tracking_enabled

__all__ = ["Backtrace", "BacktraceError", "Frame", "append", "cache", "collect", "disable_spawn_tracking",
           "enable_spawn_tracking", "foreach", "spawn_backtrace", "spawn_tracking_enabled"]
__version__ = "0.1.0"
