"""Backtrace, collect(), append() and foreach(): the public capture API."""
from __future__ import annotations

import sys
import weakref

from .._native import ffi, lib
from ..views.fold import fold
from .frame import Frame
from ..errors import BacktraceError
from .greenlets import CURRENT, NOTHING, describe, target_of
from .records import FRAME
from ..symbols import resolve
from ..symbols.resolve import resolve_native, resolve_python

DEFAULT_CAPACITY = lib.BTC_DEFAULT_CAPACITY
MAX_CAPACITY = lib.BTC_MAX_CAPACITY
JOIN_MARKER = "  ==== appended backtrace boundary ===="

# One btc_frame record (native/btcore_api.h): addr, lasti, kind, flags, reserved.
RECORD = FRAME
_KIND_AT, _FLAGS_AT = ffi.offsetof("btc_frame", "kind"), ffi.offsetof("btc_frame", "flags")

KIND_NATIVE = lib.BTC_KIND_NATIVE
KIND_PYTHON = lib.BTC_KIND_PYTHON
F_JOIN = lib.BTC_F_JOIN
_WANT_PYTHON = lib.BTC_WANT_PYTHON
_WANT_NATIVE = lib.BTC_WANT_NATIVE
_WANT_INTERNALS = lib.BTC_WANT_INTERNALS
_WANT_HIDE_CALLER = lib.BTC_WANT_HIDE_CALLER


class Backtrace:
    """A fixed-capacity array of raw frames, innermost first.

    Holds only addresses, instruction offsets and the code objects of its
    Python frames (so they stay valid for resolution later, whatever happens
    to the functions); names are resolved lazily by frames(), format() and
    foreach().  Memory: 16 bytes per frame held, plus one reference per
    Python frame; never more than `capacity` frames.
    """

    # The capture fills these slots directly (native/capture.c): keep the
    # names in step with btc_bind_backtrace().  Unset until needed:
    # _target: a weak reference to the greenlet given to collect(), for
    # format()'s header line;
    # _labels: {raw index of a join: header line} for joins that have their
    # own header (spawn_backtrace's "spawned by ...").
    __slots__ = ("_raw", "_refs", "_capacity", "truncated", "_target", "_labels", "__weakref__")
    # Where its records are named (module keys, Python lines): this process.
    # A backtrace of another process has its own (btcore/remote/process.py).
    _space = resolve

    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        """An empty backtrace, e.g. to append() others into."""
        self._capacity = check_capacity(capacity)
        self._raw = bytearray()
        self._refs = ()
        self.truncated = False

    def __len__(self) -> int:
        return len(self._raw) >> 4

    def __copy__(self) -> Backtrace:
        """An independent copy: append() to either never changes the other.
        The code objects are shared (immutable); the frame buffer is not."""
        dup = _new(Backtrace)
        dup._capacity, dup._raw, dup._refs, dup.truncated = (
            self._capacity, bytearray(self._raw), self._refs, self.truncated)
        if hasattr(self, "_target"):   # the greenlet header goes with the copy
            dup._target = self._target
        if getattr(self, "_labels", None):   # and the joins' headers
            dup._labels = dict(self._labels)
        return dup

    def __deepcopy__(self, memo) -> Backtrace:
        return self.__copy__()   # nothing else it holds is mutable

    @property
    def capacity(self) -> int:
        return self._capacity

    def _resolved(self) -> list:
        """(flags, Frames) for each raw frame, innermost first."""
        refs = iter(self._refs)   # a code object per Python record, a decoded frame per decoded one
        return [(flags, resolve_native(addr, flags) if kind == KIND_NATIVE else
                 resolve_python(next(refs), lasti) if kind == KIND_PYTHON else next(refs).frames())
                for addr, lasti, kind, flags, _ in RECORD.iter_unpack(self._raw)]

    def frames(self) -> list[Frame]:
        """The resolved frames, innermost first (a native frame whose code
        had calls inlined into it resolves to several Frames)."""
        return [frame for _, frames in self._resolved() for frame in frames]

    def joins(self) -> list[int]:
        """Indexes into frames() where a backtrace added by append() begins."""
        starts, count = [], 0
        for flags, frames in self._resolved():
            if flags & F_JOIN:
                starts.append(count)
            count += len(frames)
        return starts

    def format(self, most_recent_first: bool = False, verbose: bool = False, *, header: bool = True) -> str:
        """Readable text, Python-style "most recent call last" by default.

        The default view prints Python frames with their source line and
        folds the interpreter's call plumbing and start-up frames into
        counted marker lines (see btcore/views/fold.py); verbose=True prints every
        frame with its address and full source path.  A backtrace of a
        greenlet starts with a line describing that greenlet as it is now
        (header=False leaves it out, for callers that print their own).
        """
        entries = []   # innermost first
        for joined, label, frames in self._parts():
            if joined and not label:
                entries.append(JOIN_MARKER)
            if label and most_recent_first:   # a label heads its part in the order printed
                entries.append(f"  {label}")
            shown = frames if verbose else fold(frames)
            entries.extend(f.format(verbose) if isinstance(f, Frame) else f.format() for f in shown)
            if label and not most_recent_first:   # (the list is reversed below)
                entries.append(f"  {label}")
        if self.truncated:
            entries.append("  ... (outer frames truncated)")
        if not most_recent_first:
            entries.reverse()
        order = "most recent call first" if most_recent_first else "most recent call last"
        return "\n".join((self._header() if header else []) + [f"Backtrace ({order}):"] + entries)

    def _parts(self) -> list:
        """(begins with an append() join, its header line or None, Frames
        innermost first) per part."""
        labels = getattr(self, "_labels", None) or {}
        parts = [(False, None, [])]
        for index, (flags, frames) in enumerate(self._resolved()):
            if flags & F_JOIN:
                parts.append((True, labels.get(index), []))
            parts[-1][2].extend(frames)
        return parts

    def _header(self) -> list:
        target = getattr(self, "_target", None)
        if target is None:
            return []
        g = target()
        return [f"Greenlet {describe(g)}" if g is not None else "Greenlet (no longer exists)"]

    def encode(self) -> str:
        """This backtrace as one printable word for a log line ("btc4." and
        base64url characters); btcore.decode() turns it back into a
        Backtrace, later and in another process.  See btcore/codec.py."""
        return _codec.encode(self)

    __str__ = format

    def __repr__(self) -> str:
        more = " truncated" if self.truncated else ""
        return f"<btcore.Backtrace {len(self)}/{self.capacity} frames{more}>"




def check_capacity(capacity) -> int:
    if type(capacity) is not int:
        raise TypeError(f"capacity must be an int, not {type(capacity).__name__}")
    if not 1 <= capacity <= MAX_CAPACITY:
        raise ValueError(f"capacity must be between 1 and {MAX_CAPACITY}, got {capacity}")
    return capacity


def _check_limit(limit, capacity: int) -> int:
    if limit is None:
        return capacity
    if type(limit) is not int:
        raise TypeError(f"limit must be an int or None, not {type(limit).__name__}")
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return min(limit, capacity)


_ERRORS = {
    lib.BTC_E_UNSUPPORTED: BacktraceError,
    lib.BTC_E_LAYOUT: BacktraceError,
    lib.BTC_E_RUNNING: RuntimeError,
    lib.BTC_E_NOMEMORY: MemoryError,
}

if lib.btc_bind_backtrace(id(Backtrace)) != 0:
    raise ImportError(ffi.string(lib.btc_last_error()).decode())

_btc_collect = lib.btc_collect
_new = object.__new__


def collect(target=None, *, limit=None, python=True, native=True, capacity=DEFAULT_CAPACITY,
            internals=False) -> Backtrace:
    """Capture the raw frames of the calling thread's stack, or of greenlet `target`.

    Current stack: the first frame is the caller of collect(); btcore's own
    frames never appear; in a greenlet, down to that greenlet's entry.  A
    suspended greenlet: from its switch() call site (greenlet's switching
    machinery shown only with internals=True) down to its entry, nothing of
    the stack below it.  A greenlet not started, or dead: an empty
    Backtrace.  No names are looked up here: see Backtrace.frames() and
    foreach().
    """
    # The Python implementation: the builtin installed below does the plain
    # calls itself and hands this function every other one.
    if type(capacity) is not int or not 0 < capacity <= MAX_CAPACITY:
        check_capacity(capacity)
    limit = capacity if limit is None else _check_limit(limit, capacity)
    where, want = (CURRENT, 0) if target is None else target_of(target)
    if where is CURRENT:   # this stack: hide collect() itself
        want = _WANT_HIDE_CALLER
    want |= (_WANT_PYTHON if python else 0) | (_WANT_NATIVE if native else 0)
    if internals:
        want |= _WANT_INTERNALS
    bt = _new(Backtrace)
    if target is not None:   # for format()'s header; weak: a Backtrace keeps no greenlet alive
        bt._target = weakref.ref(target)
    if where is NOTHING or not (python or native):
        bt.__init__(capacity)
        return bt
    rc = _btc_collect(where, id(bt), capacity, limit, want)
    if rc < 0:
        raise _ERRORS.get(rc, BacktraceError)(ffi.string(lib.btc_last_error()).decode())
    return bt


def _builtin_doc(fn) -> bytes:
    """fn's signature as a builtin's text signature, then fn's docstring:
    what help() and inspect.signature() show for the builtin.  Written from
    fn's code object: importing inspect for it cost ~20 ms of every import
    of btcore (a command's start-up)."""
    code, defaults, kwdefaults = fn.__code__, fn.__defaults__ or (), fn.__kwdefaults__ or {}
    positional = code.co_varnames[:code.co_argcount]
    keyword = code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount]
    first_default = len(positional) - len(defaults)
    params = [name if i < first_default else f"{name}={defaults[i - first_default]!r}"
              for i, name in enumerate(positional)]
    params += ["*"] * bool(keyword) + [f"{name}={kwdefaults[name]!r}" if name in kwdefaults else name
                                       for name in keyword]
    return f"{fn.__name__}($module, /, {', '.join(params)})\n--\n\n{fn.__doc__ or ''}".encode()


# btcore.collect is a builtin (native/capture/collect_builtin.c) doing the calls with plain
# arguments in C, and handing every other call to the function above: a
# Python-level call costs about as much as the capture itself.
_python_collect = collect
if lib.btc_install_collect(id(sys.modules[__name__]), id(collect), id(Backtrace), _builtin_doc(collect)) != 0:
    raise ImportError("btcore: cannot install the builtin collect()")


def append(to: Backtrace, add: Backtrace) -> int:
    """Copy add's frames after to's, as far as to's capacity allows.

    Returns how many frames were appended; the first of them is marked so
    that format() shows where the appended backtrace begins.
    """
    if not isinstance(to, Backtrace) or not isinstance(add, Backtrace):
        raise TypeError("append() takes two Backtrace objects")
    size = RECORD.size
    have = len(to)
    n = min(len(add), to._capacity - have)
    if len(add) > n:
        to.truncated = True
    if n <= 0:
        return 0
    copied = add._raw[: n * size]
    copied[_FLAGS_AT] |= F_JOIN
    with_refs = sum(1 for i in range(n) if copied[i * size + _KIND_AT] != KIND_NATIVE)
    to._raw += copied
    to._refs += add._refs[:with_refs]
    to.truncated = to.truncated or add.truncated
    _carry_labels(to, add, have, n)
    return n


def _carry_labels(to: Backtrace, add: Backtrace, offset: int, copied: int) -> None:
    """Keep the headers of add's labelled joins that were copied."""
    labels = {offset + i: text for i, text in (getattr(add, "_labels", None) or {}).items() if i < copied}
    if labels:
        to._labels = {**(getattr(to, "_labels", None) or {}), **labels}


def append_labelled(to: Backtrace, add: Backtrace, label: str) -> int:
    """append(), with `label` as the header of the new join in format()."""
    have = len(to)
    n = append(to, add)
    if n:
        to._labels = {**(getattr(to, "_labels", None) or {}), have: label}
    return n


def foreach(bt: Backtrace, callback) -> int:
    """Resolve bt's frames innermost first, calling callback(frame) for each.

    A callback returning True stops the walk.  Returns the number of frames
    visited (inlined calls count as frames).  Exceptions from the callback
    propagate unchanged.
    """
    if not isinstance(bt, Backtrace):
        raise TypeError(f"foreach() needs a Backtrace, not {type(bt).__name__}")
    visited = 0
    for _, frames in bt._resolved():
        for frame in frames:
            visited += 1
            if callback(frame) is True:
                return visited
    return visited


from .. import codec as _codec   # noqa: E402  (codec builds on the names above; imported first, it imports this module)
