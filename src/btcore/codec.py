"""Compact backtraces for logs: Backtrace.encode() and decode().

A token is one printable word, "btc1." followed by base64url (no padding) of
a bit stream: the module table (build-id prefix + path), then the frames,
native pcs relative to their module and delta-coded against the previous
few native frames, Python frames as (qualified name, file, line) with the
strings de-duplicated.  docs/design.md ("Compact tokens") is the byte-level
specification; this file is its reference implementation.

A token is untrusted input: decoding it reads at most the ELF header and
notes of a module path it names, and uses that file for names only when its
build-id is the one in the token.
"""
from __future__ import annotations

import base64
import binascii
import bisect
import os
import re
import stat
import struct
from typing import NamedTuple

from ._native import ffi, lib
from .backtrace import DEFAULT_CAPACITY, F_JOIN, KIND_PYTHON, MAX_CAPACITY, RECORD, Backtrace, _new
from .frame import NATIVE, PYTHON, Frame
from .resolve import F_EXACT, FrameCache, cache, file_symbol, native_frames, resolve_python
from .resolve import _generation   # the core's module-list generation, read in place

VERSION = 1
PREFIX = f"btc{VERSION}."
# Any version, so that a token of a later format is recognised and refused clearly.
TOKEN = re.compile(r"btc(\d+)\.([A-Za-z0-9_-]*)")
# A token inside text: not the tail of a longer word.
TOKEN_IN_TEXT = re.compile(r"(?<![A-Za-z0-9_.-])btc\d+\.[A-Za-z0-9_-]*")
MAX_TOKEN_CHARS = 1 << 20
MAX_MODULES = 4096
BUILD_ID_BYTES = 8          # the prefix of the build-id a token keeps
HISTORY = 4                 # native frames a repeat or delta may refer back to

KIND_NATIVE = lib.BTC_KIND_NATIVE
KIND_DECODED = lib.BTC_KIND_DECODED

# Unsigned values: a 4-bit width class, then that many bits.
WIDTHS = (0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 28, 32, 48)
_CLASS_OF = [next(c for c, w in enumerate(WIDTHS) if w >= bits) for bits in range(49)]

# Frame codes, read bit by bit (written here as (value, width), LSB first).
REPEAT, DELTA, LITERAL = (0b00, 2), (0b10, 2), (0b01, 2)     # bits 0 0 / 0 1 / 1 0
PYTHON_FRAME = (0b011, 3)                                    # 1 1 0
EXACT_NEXT, JOIN_NEXT = (0b0111, 4), (0b1111, 4)             # 1 1 1 0 / 1 1 1 1

# Strings: 6-bit symbols; 62 = one raw byte follows, 63 = end.
ALPHABET = "/._-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUV"
assert len(ALPHABET) == 62
_SYMBOL_OF = {ord(c): i for i, c in enumerate(ALPHABET)}
_LETTERS = ALPHABET.encode()
ESCAPE, END = 62, 63


# ---- bits ----

class _Writer:
    """Bits LSB first: a small int of fewer than 64 pending bits, flushed to
    bytes 8 at a time (one growing int would make every write copy it)."""

    __slots__ = ("out", "acc", "nbits")

    def __init__(self):
        self.out = bytearray()
        self.acc = 0
        self.nbits = 0

    def put(self, value: int, width: int) -> None:
        self.acc |= value << self.nbits
        self.nbits += width
        while self.nbits >= 64:
            self.out += (self.acc & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little")
            self.acc >>= 64
            self.nbits -= 64

    def code(self, code: tuple) -> None:
        self.put(*code)

    def uint(self, value: int) -> None:
        cls = _CLASS_OF[value.bit_length()]   # IndexError past 48 bits
        self.put(cls | value << 4, 4 + WIDTHS[cls])

    def varint(self, value: int) -> None:
        while True:
            more = value > 15
            self.put((value & 15) | more << 4, 5)
            value >>= 4
            if not more:
                return

    def string(self, text: str, earlier: list) -> None:
        """A new string: the earlier string (of its reference list) it shares
        the most with, the length of the prefix and of the suffix taken
        from it, the bytes in between."""
        data = text.encode("utf-8", "surrogatepass")
        prefix = suffix = 0
        if earlier:
            _, ref, prefix, suffix = max(_sharing(data, e, -i) for i, e in enumerate(earlier))
            self.put(-ref, (len(earlier) - 1).bit_length())
        self.varint(prefix)
        self.varint(suffix)
        symbols = width = 0   # packed here, written with one put()
        for byte in data[prefix:len(data) - suffix]:
            symbol = _SYMBOL_OF.get(byte)
            if symbol is None:
                symbols |= (ESCAPE | byte << 6) << width
                width += 14
            else:
                symbols |= symbol << width
                width += 6
        self.put(symbols | END << width, width + 6)
        earlier.append(data)

    def token(self) -> str:
        data = self.out + self.acc.to_bytes((self.nbits + 7) >> 3, "little")
        return PREFIX + base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _sharing(data: bytes, other: bytes, key: int) -> tuple:
    """(bytes shared, key, prefix, suffix): data's common prefix with other,
    then the common suffix of what is left of both."""
    n = min(len(data), len(other))
    prefix = next((i for i in range(n) if data[i] != other[i]), n)
    rest = n - prefix
    suffix = next((i for i in range(rest) if data[-1 - i] != other[-1 - i]), rest)
    return prefix + suffix, key, prefix, suffix


class _Reader:
    """Bits LSB first, through a window of WINDOW bytes as one int: a read
    costs a shift of a small int, whatever the token's length."""

    __slots__ = ("data", "pos", "end", "window", "window_pos", "window_end")
    WINDOW = 128

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0
        self.end = len(data) * 8
        self.window, self.window_pos, self.window_end = 0, 0, 0

    def get(self, width: int) -> int:
        pos = self.pos
        if pos + width > self.window_end:
            if pos + width > self.end:
                raise ValueError("truncated token: it ends in the middle of a frame")
            start = pos >> 3
            chunk = self.data[start:start + self.WINDOW]
            self.window, self.window_pos, self.window_end = \
                int.from_bytes(chunk, "little"), start << 3, (start + len(chunk)) << 3
        self.pos = pos + width
        return (self.window >> (pos - self.window_pos)) & ((1 << width) - 1)

    def uint(self) -> int:
        return self.get(WIDTHS[self.get(4)])

    def varint(self, limit: int, what: str) -> int:
        value = shift = 0
        while True:
            group = self.get(5)
            value |= (group & 15) << shift
            shift += 4
            if value > limit:
                raise ValueError(f"corrupted token: {what} {value} is more than {limit}")
            if not group & 16:
                return value

    def string(self, earlier: list) -> bytes:
        """A new string of a table (see _Writer.string); appended to earlier."""
        ref = self.get((len(earlier) - 1).bit_length()) if earlier else 0
        if earlier and ref >= len(earlier):
            raise ValueError(f"corrupted token: string {ref} of {len(earlier)}")
        base = earlier[ref] if earlier else b""
        prefix = self.varint(len(base), "shared prefix length")
        suffix = self.varint(len(base) - prefix, "shared suffix length")
        out = bytearray(base[:prefix])
        get, letters = self.get, _LETTERS
        while True:
            symbol = get(6)
            if symbol == END:
                out += base[len(base) - suffix:]
                earlier.append(bytes(out))
                return earlier[-1]
            out.append(get(8) if symbol == ESCAPE else letters[symbol])

    def finish(self) -> None:
        left = self.end - self.pos
        if left >= 8 or self.get(left) != 0:
            raise ValueError("corrupted token: data after the last frame")


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise ValueError("corrupted token: a string is not UTF-8") from None


# ---- where a pc is: module identity from the loaded objects ----

class _Module(NamedTuple):
    lo: int
    hi: int
    bias: int
    build_id: bytes
    path: str


def loaded_modules() -> list:
    """The loaded objects with their build-ids (read from memory), sorted by lo."""
    size = 64
    while True:
        out = ffi.new("btc_modinfo[]", size)
        buf = ffi.new("char[]", size * 512)
        n = lib.btc_loaded_modules(out, size, buf, size * 512)
        if 0 <= n <= size:
            break
        size = max(n, size * 2)
    mods = [_Module(m.lo, m.hi, m.bias, bytes(ffi.buffer(m.build_id, m.build_id_len)),
                    ffi.string(m.path).decode("utf-8", "surrogateescape") if m.path != ffi.NULL else "")
            for m in out[0:n]]
    return sorted(mods)


class _Places:
    """pc -> (module key, module-relative pc), cached per pc (bounded): the
    module list is listed again only for a pc no listed module contains."""

    MAX = 65536

    def __init__(self):
        self.listed = ([], [])   # (modules, their lo): one attribute, replaced whole (threads)
        self.cache = {}
        self.generation = None   # the core's module-list generation the cache was filled under

    def where(self, pc: int, exact: bool):
        if self.generation != _generation[0]:   # modules came or went: a pc may name another now
            self.generation = _generation[0]
            self.cache = {}
            self.listed = ([], [])
        key = -pc if exact else pc
        hit = self.cache.get(key)
        if hit is None:
            if len(self.cache) >= self.MAX:
                self.cache.clear()
            hit = self.cache[key] = self._find(pc if exact else pc - 1, pc)
        return hit

    def _find(self, lookup: int, pc: int):
        mod = self._containing(lookup)
        if mod is None:   # loaded since the list was taken?
            modules = loaded_modules()
            self.listed = (modules, [m.lo for m in modules])
            mod = self._containing(lookup)
        if mod is None:
            return None, pc
        return (mod.build_id[:BUILD_ID_BYTES], mod.path), pc - mod.bias

    def _containing(self, pc: int):
        modules, los = self.listed
        i = bisect.bisect_right(los, pc) - 1
        if i >= 0 and pc < modules[i].hi:
            return modules[i]
        return None


_places = _Places()


# ---- decoded frames: what _refs holds for BTC_KIND_DECODED records ----

class DecodedPython(NamedTuple):
    """A Python frame from a token."""
    function: str
    file: str
    line: int | None

    def frames(self) -> tuple:
        return (Frame(PYTHON, None, self.file, self.function, None, self.file, self.line),)


class DecodedNative(NamedTuple):
    """A native frame from a token whose module is not loaded here: named
    from the file at `path` when it has the token's build-id (module.usable),
    else left unnamed."""
    module: DecodedModule | None   # None: the encoder found no module for the pc
    vaddr: int                     # module-relative pc (absolute when module is None)
    exact: bool

    def frames(self) -> tuple:
        if self.module is None or not self.module.usable:
            path = self.module.path if self.module else None
            offset = self.vaddr if self.module else None
            return (Frame(NATIVE, self.vaddr, path, None, offset, None, None),)
        key = ("decoded", self.module.path, self.module.build_id, -self.vaddr if self.exact else self.vaddr)
        return cache.get(key) or cache.put(key, _frames_from_file(self.module.path, self.vaddr, self.exact))


def _frames_from_file(path: str, vaddr: int, exact: bool) -> tuple:
    """What resolve.py makes of a loaded module's pc, from the file alone;
    ip is the module-relative pc (there is no load address here)."""
    lookup = vaddr if exact else vaddr - 1
    symbol, start = file_symbol(path, lookup)
    return native_frames(vaddr, path, symbol, vaddr - start if symbol else vaddr, lookup)


class DecodedModule(NamedTuple):
    """A module named by a token, and what decode() found for it here."""
    path: str
    build_id: str      # hex, the prefix the token keeps
    status: str        # "loaded", "file", "mismatch", "missing", "no build-id"
    detail: str        # in words, for the reader

    @property
    def usable(self) -> bool:
        return self.status in ("loaded", "file")


class DecodedBacktrace(Backtrace):
    """What decode() returns: a Backtrace whose `modules` tell, for each
    module the token names, whether its frames could be named here."""

    __slots__ = ("modules",)

    def _header(self) -> list:
        return [f"Module {m.path} (build-id {m.build_id}): {m.detail}; its frames are not named"
                for m in self.modules if not m.usable]

    def __copy__(self) -> DecodedBacktrace:
        dup = _new(DecodedBacktrace)
        dup._capacity, dup._raw, dup._refs, dup.truncated, dup.modules = (
            self._capacity, bytearray(self._raw), self._refs, self.truncated, self.modules)
        return dup


# ---- encoding ----

_tokens = FrameCache(4096)   # (raw records, truncated, module generation) -> (token, the refs it pins)


def encode(bt: Backtrace) -> str:
    """bt as one printable word (see the module docstring).  A stack encoded
    before (same records) costs one cache probe: its code objects and
    decoded references are pinned by the entry, so the record bytes cannot
    name anything else while it lives; the module list's generation is part
    of the key, since a library loaded where another was gives the same
    pcs another module."""
    key = (bytes(bt._raw), bt.truncated, _generation[0])
    hit = _tokens.get(key)
    if hit is None:
        hit = _tokens.put(key, _encode(bt), pin=bt._refs)
    return hit[0]


def _items(bt: Backtrace) -> list:
    """(flags, module key, vaddr) per native frame, (flags, name, file, line)
    per Python frame."""
    refs = iter(bt._refs)
    items = []
    for addr, lasti, kind, flags, _ in RECORD.iter_unpack(bt._raw):
        if kind == KIND_NATIVE:
            items.append((flags, *_places.where(addr, bool(flags & F_EXACT))))
        elif kind == KIND_PYTHON:
            frame = resolve_python(next(refs), lasti)[0]
            items.append((flags, frame.function or "", frame.file or "", frame.line))
        else:
            items.append(_decoded_item(flags, next(refs)))
    return items


def _decoded_item(flags: int, ref) -> tuple:
    if isinstance(ref, DecodedPython):
        return (flags, ref.function, ref.file, ref.line)
    module = ref.module
    key = (bytes.fromhex(module.build_id), module.path) if module else None
    return (flags | (F_EXACT if ref.exact else 0), key, ref.vaddr)


def _encode(bt: Backtrace) -> str:
    items = _items(bt)
    modules = {}
    for item in items:
        if len(item) == 3 and item[1] is not None:
            modules.setdefault(item[1], len(modules))
    w = _Writer()
    w.put(bool(bt.truncated), 1)
    w.varint(len(modules))
    paths = []   # module paths, then Python files: one reference list
    for build_id, path in modules:
        w.put(len(build_id), 4)
        w.put(int.from_bytes(build_id, "little"), 8 * len(build_id))
        w.string(path, paths)
    w.varint(len(items))
    _FrameWriter(w, modules, paths).frames(items)
    return w.token()


class _FrameWriter:
    def __init__(self, w: _Writer, modules: dict, paths: list):
        self.w = w
        self.modules = modules
        self.module_bits = len(modules).bit_length()   # index len(modules): no module
        self.history = []                               # (module index, vaddr), newest first
        self.names, self.files = {}, {}                 # string -> index
        self.name_bytes, self.file_bytes = [], paths    # reference lists of new strings

    def frames(self, items: list) -> None:
        w = self.w
        for item in items:
            if item[0] & F_JOIN:
                w.code(JOIN_NEXT)
            if len(item) == 3:
                self.native(item)
            else:
                self.python(item)

    def native(self, item: tuple) -> None:
        flags, key, vaddr = item
        w = self.w
        if flags & F_EXACT:
            w.code(EXACT_NEXT)
        index = len(self.modules) if key is None else self.modules[key]
        here = (index, vaddr)
        self._address(index, vaddr)
        self.history.insert(0, here)
        del self.history[HISTORY:]

    def _address(self, index: int, vaddr: int) -> None:
        w = self.w
        best = None   # (bits, k, delta)
        for k, (ref_index, ref_vaddr) in enumerate(self.history):
            if ref_index != index:
                continue
            if ref_vaddr == vaddr:
                w.code(REPEAT)
                w.put(k, 2)
                return
            delta = vaddr - ref_vaddr
            bits = WIDTHS[_CLASS_OF[abs(delta).bit_length()]]
            if best is None or bits < best[0]:
                best = (bits, k, delta)
        literal_bits = self.module_bits + WIDTHS[_CLASS_OF[vaddr.bit_length()]]
        if best is not None and best[0] + 3 < literal_bits:
            _, k, delta = best
            w.code(DELTA)
            w.put(k | (delta < 0) << 2, 3)
            w.uint(abs(delta))
        else:
            w.code(LITERAL)
            w.put(index, self.module_bits)
            w.uint(vaddr)

    def python(self, item: tuple) -> None:
        _, name, file, line = item
        w = self.w
        w.code(PYTHON_FRAME)
        self._string(self.names, self.name_bytes, name)
        self._string(self.files, self.file_bytes, file)
        w.uint(0 if line is None else line + 1)

    def _string(self, table: dict, earlier: list, text: str) -> None:
        """A table reference (bit 0 + index) or a new string (bit 1 + text)."""
        w = self.w
        index = table.get(text)
        if index is not None:
            w.put(0, 1)
            w.put(index, (len(table) - 1).bit_length())
            return
        w.put(1, 1)
        table[text] = len(table)
        w.string(text, earlier)


# ---- decoding ----

def decode(token: str) -> DecodedBacktrace:
    """The Backtrace a token holds, resolvable like any other.

    Native frames of a module loaded in this process with the token's
    build-id are re-based onto its load address here; those of a module not
    loaded are named from the file at the token's path if (and only if) that
    file has the token's build-id; other frames stay unnamed and the
    Backtrace's `modules` (and format()'s first lines) say why.  ValueError
    for anything that is not a whole, well-formed token of a known version.
    """
    if not isinstance(token, str):
        raise TypeError(f"decode() takes a str, not {type(token).__name__}")
    data = _body(token)
    r = _Reader(data)
    truncated = bool(r.get(1))
    modules, paths = _read_modules(r)
    count = r.varint(MAX_CAPACITY, "frame count")
    records, refs = _FrameReader(r, modules, paths).frames(count)
    r.finish()
    bt = _new(DecodedBacktrace)
    bt._capacity = max(count, DEFAULT_CAPACITY)
    bt._raw, bt._refs, bt.truncated = records, tuple(refs), truncated
    bt.modules = [m for m, _ in modules]
    return bt


def _body(token: str) -> bytes:
    token = token.strip()
    if len(token) > MAX_TOKEN_CHARS:
        raise ValueError(f"not a btcore token: longer than {MAX_TOKEN_CHARS} characters")
    m = TOKEN.fullmatch(token)
    if m is None:
        raise ValueError(f"not a btcore token: expected {PREFIX} followed by base64url characters")
    if int(m.group(1)) != VERSION:
        raise ValueError(f"unknown btcore token version {m.group(1)} (this btcore reads version {VERSION})")
    body = m.group(2)
    if len(body) % 4 == 1:
        raise ValueError("truncated token: its length is not that of a base64 encoding")
    try:
        return base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_", validate=True)
    except binascii.Error as e:
        raise ValueError(f"corrupted token: {e}") from None


def _read_modules(r: _Reader) -> tuple:
    """(DecodedModule, load bias here or None) per module table entry, and
    the paths as a reference list for the Python files that follow."""
    entries, paths = [], []
    for _ in range(r.varint(MAX_MODULES, "module count")):
        length = r.get(4)
        if length > BUILD_ID_BYTES:
            raise ValueError(f"corrupted token: a build-id of {length} bytes (at most {BUILD_ID_BYTES})")
        build_id = r.get(8 * length).to_bytes(length, "little")
        entries.append((build_id, _text(r.string(paths))))
    loaded = loaded_modules() if entries else []
    return [identify(build_id, path, loaded) for build_id, path in entries], paths


def identify(build_id: bytes, path: str, loaded: list) -> tuple:
    """What this process has for a module of a token: (DecodedModule, load
    bias if it is loaded here, else None)."""
    hexid = build_id.hex()
    if not build_id:
        return DecodedModule(path, hexid, "no build-id", "the token has no build-id for it"), None
    for m in loaded:
        if m.build_id[:len(build_id)] == build_id:
            return DecodedModule(path, hexid, "loaded", f"loaded here as {m.path}"), m.bias
    try:
        path.encode()   # what the native layer will be handed: no lone surrogates, no NUL
        if "\0" in path:
            raise OSError(0, "a NUL character in the path")
        on_disk = file_build_id(path)
    except (OSError, UnicodeEncodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else "not a UTF-8 path"
        return DecodedModule(path, hexid, "missing", f"cannot be read here ({reason})"), None
    if on_disk is None:
        return DecodedModule(path, hexid, "mismatch", "build-id mismatch: the file here has no build-id"), None
    if on_disk[:len(build_id)] != build_id:
        detail = f"build-id mismatch: the file here has {on_disk[:len(build_id)].hex()}"
        return DecodedModule(path, hexid, "mismatch", detail), None
    return DecodedModule(path, hexid, "file", "named from the file"), None


def _pc(pc: int, flags: int) -> int:
    """pc, if it can be a native frame's pc: a return address is looked up
    at pc - 1, so it is not 0."""
    if not (0 if flags & F_EXACT else 1) <= pc < 1 << 64:
        raise ValueError(f"corrupted token: a native frame at {pc:#x}")
    return pc


class _FrameReader:
    def __init__(self, r: _Reader, modules: list, paths: list):
        self.r = r
        self.modules = modules
        self.module_bits = len(modules).bit_length()
        self.history = []
        self.names, self.files = [], []                 # decoded strings, in order
        self.name_bytes, self.file_bytes = [], paths    # reference lists of new strings

    def frames(self, count: int) -> tuple:
        records, refs = bytearray(), []
        for _ in range(count):
            flags = 0
            while True:   # modifiers, then the frame
                code = self._code()
                if code is JOIN_NEXT and not flags & F_JOIN:
                    flags |= F_JOIN
                elif code is EXACT_NEXT and not flags & F_EXACT:
                    flags |= F_EXACT
                elif code in (JOIN_NEXT, EXACT_NEXT):
                    raise ValueError("corrupted token: a frame modifier repeated")
                else:
                    break
            if code is PYTHON_FRAME:
                if flags & F_EXACT:
                    raise ValueError("corrupted token: a Python frame marked exact")
                ref = self.python()
                records += RECORD.pack(id(ref), -1, KIND_DECODED, flags, 0)
                refs.append(ref)
            else:
                self.native(code, flags, records, refs)
        return records, refs

    def _code(self) -> tuple:
        get = self.r.get
        if not get(1):
            return DELTA if get(1) else REPEAT
        if not get(1):
            return LITERAL
        if not get(1):
            return PYTHON_FRAME
        return JOIN_NEXT if get(1) else EXACT_NEXT

    def native(self, code: tuple, flags: int, records: bytearray, refs: list) -> None:
        index, vaddr = self._address(code)
        self.history.insert(0, (index, vaddr))
        del self.history[HISTORY:]
        if index == len(self.modules):
            ref = DecodedNative(None, vaddr, bool(flags & F_EXACT))
        else:
            module, bias = self.modules[index]
            if bias is not None:   # loaded here: an ordinary native frame, re-based
                records += RECORD.pack(_pc(bias + vaddr, flags), -1, KIND_NATIVE, flags, 0)
                return
            _pc(vaddr, flags)
            ref = DecodedNative(module, vaddr, bool(flags & F_EXACT))
        records += RECORD.pack(id(ref), -1, KIND_DECODED, flags, 0)
        refs.append(ref)

    def _address(self, code: tuple) -> tuple:
        r = self.r
        if code is LITERAL:
            index = r.get(self.module_bits)
            if index > len(self.modules):
                raise ValueError(f"corrupted token: module {index} of {len(self.modules)}")
            return index, r.uint()
        k = r.get(2)
        if k >= len(self.history):
            raise ValueError(f"corrupted token: a frame refers to native frame {k + 1} back of {len(self.history)}")
        index, vaddr = self.history[k]
        if code is REPEAT:
            return index, vaddr
        negative = r.get(1)
        delta = r.uint()
        vaddr = vaddr - delta if negative else vaddr + delta
        if not 0 <= vaddr < 1 << 64:
            raise ValueError("corrupted token: a frame address out of range")
        return index, vaddr

    def python(self) -> DecodedPython:
        name = self._string(self.names, self.name_bytes)
        file = self._string(self.files, self.file_bytes)
        line = self.r.uint()
        return DecodedPython(name, file, line - 1 if line else None)

    def _string(self, table: list, earlier: list) -> str:
        """A table reference (bit 0 + index) or a new string (bit 1 + text)."""
        r = self.r
        if r.get(1):
            table.append(_text(r.string(earlier)))
            return table[-1]
        if not table:
            raise ValueError("corrupted token: a string reference before any string")
        index = r.get((len(table) - 1).bit_length())
        if index >= len(table):
            raise ValueError(f"corrupted token: string {index} of {len(table)}")
        return table[index]


# ---- reading a module's build-id from a file named by a token ----

_ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
PT_NOTE = 4
MAX_NOTES = 1 << 16
_file_ids = FrameCache(256)   # (path, device, inode, mtime, size) -> build-id


def file_build_id(path: str) -> bytes | None:
    """The NT_GNU_BUILD_ID of the ELF file at path (64-bit little-endian),
    None if it has none.  The path comes from untrusted input: only a
    regular file is read (opened non-blocking, so a FIFO cannot hang us),
    and at most its header, program headers and notes."""
    if not path.startswith("/"):
        raise OSError(0, "not an absolute path")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "not a regular file")
        key = (path, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        hit = _file_ids.get(key)
        if hit is None:
            hit = _file_ids.put(key, (_read_build_id(fd),))
        return hit[0]
    finally:
        os.close(fd)


def _read_build_id(fd: int) -> bytes | None:
    header = os.pread(fd, _ELF_HEADER.size, 0)
    if len(header) < _ELF_HEADER.size or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
        raise OSError(0, "not a 64-bit little-endian ELF file")
    fields = _ELF_HEADER.unpack(header)
    phoff, phentsize, phnum = fields[5], fields[9], fields[10]
    if phentsize != _PHDR.size or phnum > 512:
        raise OSError(0, "unexpected ELF program headers")
    table = os.pread(fd, phentsize * phnum, phoff)
    for i in range(len(table) // phentsize):
        p_type, _, p_offset, _, _, p_filesz, _, _ = _PHDR.unpack_from(table, i * phentsize)
        if p_type == PT_NOTE:
            found = _note_build_id(os.pread(fd, min(p_filesz, MAX_NOTES), p_offset))
            if found:
                return found
    return None


def _note_build_id(notes: bytes) -> bytes | None:
    """The GNU build-id note's bytes, as native/capture/modules.c reads them."""
    at = 0
    while len(notes) - at >= 12:
        namesz, descsz, kind = struct.unpack_from("<III", notes, at)
        at += 12
        name_room, desc_room = (namesz + 3) & ~3, (descsz + 3) & ~3
        if at + name_room + desc_room > len(notes):
            return None
        if kind == 3 and notes[at:at + namesz] == b"GNU\0" and 0 < descsz <= 32:
            return notes[at + name_room:at + name_room + descsz]
        at += name_room + desc_room
    return None
