"""btcore: native C/C++ and Python frames merged in true call order, for the
running stack and for suspended greenlets.

    bt = btcore.collect()          # raw capture: cheap, no strings
    print(bt)                      # resolved lazily, through a shared cache
"""
from .backtrace import Backtrace, append, collect, foreach
from .greenlets import BacktraceError
from .frame import Frame
from .resolve import cache

__all__ = ["Backtrace", "BacktraceError", "Frame", "append", "cache", "collect", "foreach"]
__version__ = "0.1.0"
