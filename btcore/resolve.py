"""Resolution of raw frames into Frames, through one shared bounded cache.

Capture stores only addresses and (code object, instruction offset) pairs;
names, files and lines are looked up here, the first time an address is
seen, and kept: a second resolution of the same address reads no ELF data.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from ._native import ffi, lib
from .frame import NATIVE, PYTHON, Frame

DEFAULT_CACHE_SIZE = 65536
_NAME_BUFFER = 16384
KIND_PYTHON = lib.BTC_KIND_PYTHON
F_EXACT = lib.BTC_F_EXACT


class FrameCache:
    """Bounded, thread-safe map: native pc or (code address, offset) -> Frames.

    Least recently used entries are evicted past `maxsize`.  A Python entry
    also holds its code object, so that the address in its key cannot be
    reused by another object while the entry lives.
    """

    def __init__(self, maxsize: int = DEFAULT_CACHE_SIZE):
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.maxsize = maxsize

    def get(self, key):
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key, frames: tuple, pin=None) -> tuple:
        with self._lock:
            entry = self._entries.setdefault(key, (frames, pin))
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
            return entry[0]

    def resize(self, maxsize: int) -> None:
        """Change the bound (entries past it are evicted now)."""
        if not isinstance(maxsize, int) or isinstance(maxsize, bool) or maxsize < 1:
            raise ValueError(f"cache size must be a positive int, got {maxsize!r}")
        with self._lock:
            self.maxsize = maxsize
            while len(self._entries) > maxsize:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


cache = FrameCache()
_tls = threading.local()


def _buffer():
    buf = getattr(_tls, "buf", None)
    if buf is None:
        buf = _tls.buf = ffi.new("char[]", _NAME_BUFFER)
    return buf


def _text(p) -> str | None:
    return ffi.string(p).decode("utf-8", "replace") if p != ffi.NULL else None


def demangle(name: str | None) -> str | None:
    """Readable form of a symbol name (C++ Itanium); the name itself otherwise."""
    if not name or not name.startswith("_Z"):
        return name
    buf = _buffer()
    if lib.btc_demangle(name.encode(), buf, _NAME_BUFFER) == 0:
        return ffi.string(buf).decode("utf-8", "replace")
    return name


def _resolve_native(pc: int, exact: bool) -> tuple:
    info = ffi.new("btc_syminfo *")
    if lib.btc_describe_native(pc if exact else pc - 1, info, _buffer(), _NAME_BUFFER) != 0:
        return (Frame(NATIVE, pc, None, None, None, None, None),)
    module = _text(info.module)
    symbol = _text(info.symbol)
    offset = pc - info.symbol_addr if symbol else pc - info.module_base
    return (Frame(NATIVE, pc, module, demangle(symbol), offset, None, None),)


def _line_of(code, lasti: int) -> int | None:
    for start, end, line in code.co_lines():
        if start <= lasti < end:
            return line
    return None


def _resolve_python(code, lasti: int) -> tuple:
    filename = code.co_filename
    return (Frame(PYTHON, None, filename, code.co_qualname, None, filename, _line_of(code, lasti)),)


def resolve_native(pc: int, flags: int) -> tuple:
    """The Frames at a native pc (more than one when calls were inlined)."""
    exact = bool(flags & F_EXACT)
    key = -pc if exact else pc
    frames = cache.get(key)
    if frames is None:
        frames = cache.put(key, _resolve_native(pc, exact))
    return frames


def resolve_python(code, lasti: int) -> tuple:
    """The Frame of a Python code object at an instruction offset."""
    key = (id(code), lasti)
    frames = cache.get(key)
    if frames is None:
        frames = cache.put(key, _resolve_python(code, lasti), pin=code)
    return frames
