"""Resolution of raw frames into Frames, through one shared bounded cache.

Capture stores only addresses and (code object, instruction offset) pairs;
names, files and lines are looked up here, the first time an address is
seen, and kept: a second resolution of the same address reads no ELF data.
"""
from __future__ import annotations

import ctypes   # here, not where it is used: renderers run in threads of monkey-patched programs (profile/sampler.py)
import errno
import os
import stat
import threading

from .._native import ffi, lib
from ..capture.frame import NATIVE, PYTHON, Frame

DEFAULT_CACHE_SIZE = 65536
_NAME_BUFFER = 16384
F_EXACT = lib.BTC_F_EXACT
# A native frame named at its pc, not at pc - 1: an exact pc, or a signal
# return stub (the interrupted code "returns" to its first instruction).
_AT_PC = lib.BTC_F_EXACT | lib.BTC_F_SIGNAL


class FrameCache:
    """Bounded, thread-safe map: (module id, offset, exact) or (code address,
    offset) -> Frames.

    No lock at all: every read and write is a single dict operation, atomic
    under the GIL, so a signal handler or another thread that resolves while
    this thread is inside put() never waits.  A hit costs one dict probe;
    past `maxsize` the oldest entries are evicted first (insertion order),
    by an eviction that tolerates the dict changing under it.  A Python
    entry also pins its code object, so that the address in its key cannot
    be reused by another object while the entry lives: its value is the pair
    (frames, code), so one dict operation stores or drops both.
    """

    def __init__(self, maxsize: int = DEFAULT_CACHE_SIZE):
        self._frames: dict = {}
        self._maxsize = _check_size(maxsize)
        self.get = self._frames.get

    def put(self, key, frames: tuple, pin=None):
        """Store frames, or (frames, pin), unless key has a value already;
        returns the value the cache holds for key (what get() returns)."""
        kept = self._frames.setdefault(key, frames if pin is None else (frames, pin))
        self._evict(self._maxsize)
        return kept

    def _evict(self, keep: int) -> None:
        frames = self._frames
        while len(frames) > keep:
            try:
                frames.pop(next(iter(frames)), None)
            except (RuntimeError, StopIteration):
                pass   # changed between iter() and next() by a re-entrant call: look again

    @property
    def maxsize(self) -> int:
        return self._maxsize

    @maxsize.setter
    def maxsize(self, maxsize: int) -> None:
        self.resize(maxsize)

    def resize(self, maxsize: int) -> None:
        """Change the bound (entries past it are evicted now)."""
        self._maxsize = _check_size(maxsize)
        self._evict(self._maxsize)

    def clear(self) -> None:
        self._frames.clear()

    def __len__(self) -> int:
        return len(self._frames)


def _check_size(maxsize) -> int:
    if not isinstance(maxsize, int) or isinstance(maxsize, bool) or maxsize < 1:
        raise ValueError(f"cache size must be a positive int, got {maxsize!r}")
    return maxsize


cache = FrameCache()
_tls = threading.local()


def _buffer():
    buf = getattr(_tls, "buf", None)
    if buf is None:
        buf = _tls.buf = ffi.new("char[]", _NAME_BUFFER)
    return buf


def _text(p) -> str | None:
    return ffi.string(p).decode("utf-8", "replace") if p != ffi.NULL else None


def _path(p) -> str | None:
    """A file's path: its bytes as Python keeps paths (os.fsdecode), so that the
    file can be opened again by that name."""
    return os.fsdecode(ffi.string(p)) if p != ffi.NULL else None


def demangle(name: str | None) -> str | None:
    """Readable form of a symbol name: C++ (Itanium) and Rust demangled,
    Cython-generated names as dotted paths; the name itself otherwise."""
    if not name:
        return name
    buf = _buffer()
    if lib.btc_demangle(name.encode(), buf, _NAME_BUFFER) == 0:
        return ffi.string(buf).decode("utf-8", "replace")
    return name


_MAX_INLINE_LEVELS = 32


def source_levels(module: str, vaddr: int, fd: int = -1) -> list:
    """(function, file, line) per level from DWARF, innermost inlined call
    first; read from the file open as fd (named module), else from module."""
    out = ffi.new("btc_srcframe[]", _MAX_INLINE_LEVELS)
    n = lib.btc_symbolize_fd(fd, os.fsencode(module), vaddr, out, _MAX_INLINE_LEVELS, _buffer(), _NAME_BUFFER)
    return [(_text(f.function), _path(f.file), f.line or None) for f in out[0:max(n, 0)]]


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: str) -> int:
    """A read descriptor (the caller closes it) on the regular file path
    names; OSError for anything else, which is never opened: a FIFO's
    writer stays blocked, a device's driver is not called, a procfs file
    (size 0: smaller than an ELF header) is not read (btc_open_regular:
    O_PATH, fstat, then a reopen of that very object)."""
    if "\0" in path:
        raise OSError(0, "a NUL character in the path", path)
    mode = ffi.new("uint32_t *")
    fd = lib.btc_open_regular(os.fsencode(path), mode)
    if fd >= 0:
        return fd
    err = ffi.errno
    if err == errno.ENOEXEC:
        raise OSError(err, "not an ELF file: smaller than its header", path)
    if mode[0] and not stat.S_ISREG(mode[0]):
        kind = next((name for test, name in _KINDS if test(mode[0])), "a special file")
        raise OSError(err, f"not a regular file: {kind}", path)
    raise OSError(err, os.strerror(err), path)


def _resolve_native(pc: int, flags: int) -> tuple:
    """(the id of the module that named pc, 0 if none; its Frames), from one
    call into the core."""
    # Fresh out-parameters, not per-thread ones: a Python signal handler that
    # resolves may run between this call and the reads below.
    info, levels = ffi.new("btc_native_info *"), ffi.new("btc_srcframe[]", _MAX_INLINE_LEVELS)
    buf = ffi.new("char[]", _NAME_BUFFER)
    n = lib.btc_resolve_native(pc, flags, info, levels, _MAX_INLINE_LEVELS, buf, _NAME_BUFFER)
    if n < 0:   # in no loaded module (or, never in practice, names longer than the buffer)
        return info.module_id, (Frame(NATIVE, pc, _path(info.module) if n == -1 else None,
                                      None, None, None, None),)
    module, symbol = _path(info.module), _text(info.symbol)
    offset = pc - info.symbol_addr if symbol else pc - info.module_base
    return info.module_id, _frames(pc, module, symbol, offset,
                                   [(_text(f.function), _path(f.file), f.line or None) for f in levels[0:n]])


def native_frames(pc: int, module: str | None, symbol: str | None, offset: int, vaddr: int, fd: int = -1) -> tuple:
    """The Frames of the native pc found in module at module-relative vaddr
    (pc - 1 for return addresses): symbol (raw) names the physical frame, and
    offset is pc minus its start (minus the module's load address without
    one); DWARF adds the inlined calls and file:line, read from the file
    open as fd when one is given."""
    levels = source_levels(module, vaddr, fd) if module else []
    return _frames(pc, module, demangle(symbol), offset, [(demangle(f), fl, ln) for f, fl, ln in levels])


def _frames(pc: int, module: str | None, symbol: str | None, offset: int, levels: list) -> tuple:
    """Frames from a pc's (demangled) symbol and its source levels."""
    if not levels or levels[-1][1] is None:   # no DWARF: the symbol table's name
        return (Frame(NATIVE, pc, module, symbol, offset, None, None),)
    *inlined, (function, file, line) = levels
    frames = [Frame(NATIVE, pc, module, f, None, fl, ln, inlined=True) for f, fl, ln in inlined]
    # The physical frame is named like addr2line names it: by its symbol
    # (whose demangled form carries C++ parameter types), else by DWARF; its
    # offset is from the symbol's start, unknown when only DWARF names it.
    frames.append(Frame(NATIVE, pc, module, symbol or function, offset if symbol else None, file, line))
    return tuple(frames)


def file_symbol(path: str, vaddr: int, fd: int = -1) -> tuple:
    """(raw symbol name, its start) covering module-relative vaddr in the
    ELF file at path (a module that need not be loaded), or in the file
    open as fd (named path), or (None, None)."""
    start = ffi.new("uintptr_t *")
    if lib.btc_file_symbol_fd(fd, os.fsencode(path), vaddr, _buffer(), _NAME_BUFFER, start) != 0:
        return None, None
    return _text(_buffer()), start[0]


def _line_of(code, lasti: int) -> int | None:
    for start, end, line in code.co_lines():
        if start <= lasti < end:
            return line
    return None


def _resolve_python(code, lasti: int) -> tuple:
    filename = code.co_filename
    return (Frame(PYTHON, None, filename, code.co_qualname, None, filename, _line_of(code, lasti)),)


# Native frames are cached by what names them, (module id, offset, exact),
# not by pc: a library loaded where an unloaded one was has new ids, so the
# old names are never served for it.  Finding a pc's module takes a call into
# the core; its answer is kept here, per pc, for as long as the module list's
# generation says it holds.
_module_keys: dict = {}   # pc (negated if exact) -> (generation, cache key)
# btc_modules_generation, read in place: ~40 ns against ~300 through lib.
_generation = memoryview(ffi.buffer(ffi.addressof(lib, "btc_modules_generation"), 8)).cast("Q")


def modules_generation() -> int:
    """Changes whenever the core's module list is rebuilt (dlopen/dlclose):
    what was learnt about a pc under another generation may be stale."""
    return _generation[0]


def _module_key(pc: int, exact: bool) -> tuple:
    module_id, offset = ffi.new("uint64_t *"), ffi.new("uintptr_t *")
    generation = lib.btc_module_key(pc if exact else pc - 1, module_id, offset)
    key = (module_id[0], offset[0], exact)
    if len(_module_keys) >= cache.maxsize:   # bounded like the cache it serves
        _module_keys.clear()
    _module_keys[-pc if exact else pc] = (generation, key)
    return key


def module_key(pc: int, exact: bool) -> tuple:
    """(module id, offset, exact): what names the native pc (module id 0:
    no loaded module contains it)."""
    known = _module_keys.get(-pc if exact else pc)
    return known[1] if known is not None and known[0] == _generation[0] else _module_key(pc, exact)


def interpreter_module_id() -> int:
    """The module id of the interpreter's own code (libpython, or the
    python3.X executable it is linked into); 0 if not found."""
    return module_key(ctypes.cast(ctypes.pythonapi.Py_Initialize, ctypes.c_void_p).value, True)[0]


def resolve_native(pc: int, flags: int) -> tuple:
    """The Frames at a native pc (more than one when calls were inlined)."""
    exact = flags & _AT_PC != 0
    known = _module_keys.get(-pc if exact else pc)   # module_key(), inlined: this is the warm path
    key = known[1] if known is not None and known[0] == _generation[0] else _module_key(pc, exact)
    frames = cache.get(key)
    if frames:
        return frames
    module_id, frames = _resolve_native(pc, flags)
    # A module swapped in since the key was taken named pc: right now, but
    # not what the key stands for.
    return cache.put(key, frames) if module_id == key[0] else frames


def resolve_python(code, lasti: int) -> tuple:
    """The Frame of a Python code object at an instruction offset."""
    key = (id(code), lasti)
    return (cache.get(key) or cache.put(key, _resolve_python(code, lasti), pin=code))[0]
