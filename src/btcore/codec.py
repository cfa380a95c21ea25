"""Compact backtraces for logs: Backtrace.encode() and decode().

A token is one printable word, "btc4." followed by base64url (no padding) of
a bit stream: the module table (a build-id prefix per module, its path only
when a decoder would not find the file by build-id in the places it
searches), then the frames, native pcs relative to their module and
delta-coded against the previous few native frames, Python frames as
(qualified name, file, line) with the strings de-duplicated and Huffman
coded, and runs of frames seen earlier in the token as copies of them.
docs/design.md ("Compact tokens") is the byte-level specification; tokens
of formats 2 and 3 ("btc2.", "btc3.") are still decoded (and the reference
encoder can write them, for tests).  The encoder runs in C
(native/codec/encode.c, also Backtrace.encode() itself, a builtin method);
this file holds the reference implementation it is tested against (and
that encodes backtraces built by decode()), and the decoder.

A token is untrusted input: decoding it reads at most the ELF header and
notes of the files it names or that the search finds, and uses a file for
names only when its build-id is the one in the token; what it decodes to
is bounded (frames by the largest capacity, copies by the frames decoded
before them, strings together by MAX_STRING_BYTES).
"""
from __future__ import annotations

import base64
import binascii
import bisect
import os
import re
import site
import sys
from typing import NamedTuple

from ._native import ffi, lib
from .capture.backtrace import DEFAULT_CAPACITY, F_JOIN, KIND_PYTHON, MAX_CAPACITY, RECORD, Backtrace
from .capture.frame import NATIVE, PYTHON, Frame
from .capture.modules import Module, loaded_modules
from .symbols.resolve import (F_EXACT, FrameCache, cache, file_symbol, module_key, modules_generation, native_frames,
                      open_regular, resolve_python)

_new = object.__new__   # a DecodedBacktrace whose fields are set here, not by __init__
VERSION = lib.BTC_TOKEN_VERSION
PREFIX = f"btc{VERSION}."
READ_VERSIONS = (2, 3, 4)   # formats 2 and 3: the same stream without copies (design.md)
# Any version, so that a token of another format is recognised and refused clearly.
TOKEN = re.compile(r"btc(\d+)\.([A-Za-z0-9_-]*)")
# A token inside text: not the tail of a longer word.
TOKEN_IN_TEXT = re.compile(r"(?<![A-Za-z0-9_.-])btc\d+\.[A-Za-z0-9_-]*")
# What a token is made of, and what may stand before one in a word (TOKEN_IN_TEXT's two classes together).
WORD_CHARACTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-"
MAX_TOKEN_CHARS = 1 << 20
MAX_MODULES = 4096
MAX_STRING_BYTES = 1 << 24  # the new strings of one token, together (names and files)
BUILD_ID_BYTES = lib.BTC_TOKEN_BUILD_ID_BYTES   # the build-id prefix encoders write (decoders: 4 to 15)
MIN_BUILD_ID_BYTES = 4      # 2^-32: the chance that another build matches by accident
HISTORY = 4                 # native frames a repeat or delta may refer back to

KIND_NATIVE = lib.BTC_KIND_NATIVE
KIND_DECODED = lib.BTC_KIND_DECODED

# Unsigned values: a 4-bit width class, then that many bits.
WIDTHS = (0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 28, 32, 64)
_CLASS_OF = [next(c for c, w in enumerate(WIDTHS) if w >= bits) for bits in range(65)]

# Native pcs and deltas (formats 3, 4): bits(4) c, the bit length L = base + c
# (c = 15: L in the next LENGTH_ESCAPE_BITS bits), then L's bits below its
# top bit.  The bases centre the 15 direct lengths where return addresses
# fall: a pc in a module of 64 KiB-16 MiB, a delta of 32 bytes-1 MiB.
ADDRESS_BASE, DELTA_BASE = 10, 6
LENGTH_ESCAPE, LENGTH_ESCAPE_BITS = 15, 7


def length_bits(length: int, base: int) -> int:
    """The bits ulen() writes for a value of bit length `length`."""
    direct = 0 <= length - base < LENGTH_ESCAPE
    return 4 + (0 if direct else LENGTH_ESCAPE_BITS) + max(length - 1, 0)

# Frame codes, read bit by bit (written here as (value, width), LSB first).
REPEAT, DELTA, LITERAL = (0b00, 2), (0b10, 2), (0b01, 2)     # bits 0 0 / 0 1 / 1 0
PYTHON_FRAME = (0b011, 3)                                    # 1 1 0
EXACT_NEXT, JOIN_NEXT = (0b0111, 4), (0b1111, 4)             # 1 1 1 0 / 1 1 1 1 (formats 2, 3)
JOIN_NEXT_4, COPY = (0b01111, 5), (0b11111, 5)               # 1 1 1 1 0 / 1 1 1 1 1 (format 4)

# COPY (format 4): `ulen(COPY_BASE)` L, `ulen(COPY_BASE)` D: the next L
# frames are those D frames back.  L >= MIN_COPY, D <= the frames decoded
# so far, L <= D (a copy never reads frames it writes: each costs one
# record copy, and a run repeated k times takes log2(k) copies of doubling
# length).  Encoders look for a copy among the MAX_CHAIN nearest earlier
# frames equal to the next one.
COPY_BASE = 0
MIN_COPY = 2
MAX_CHAIN = 16

# Strings: 6-bit symbols; 62 = one raw byte follows, 63 = end.
ALPHABET = "/._-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUV"
assert len(ALPHABET) == 62
_SYMBOL_OF = {ord(c): i for i, c in enumerate(ALPHABET)}
_LETTERS = ALPHABET.encode()
ESCAPE, END = 62, 63

# Strings, format 4: a static canonical Huffman code (design.md) over the
# 256 byte values, STRING_END and the WORDS, which a string is cut into
# greedily (the longest word that starts here, else the byte).  Code
# lengths per byte value in base 32 (then STRING_END's and the words'),
# from the frequencies in the qualified names and files of the functions
# of CPython's standard library and a few packages (file paths under
# several usual prefixes), each word's raised to a lowercase letter's: a
# name or path letter costs 4-7 bits instead of 6, '<' and '>' 12 instead
# of 14, a word 6-7.  Every code length is at most 21; the code is
# complete, so any bits decode to symbols.
WORDS = ("<locals>", "<lambda>", "<module>", "<listcomp>", "<genexpr>", "__init__", ".py", "site-packages/",
         "/lib/python3.", "dist-packages/")
_BYTE_CODE_LENGTHS = (
    "LLLLKKKKKKKKKKKKKKKKKKKKKKKKKKKK"
    "CKKKKKKKKKKHKA64C799BEACBGKKCKCK"
    "K998999BA9ED99AA8D988ABAFGDKKKK5"
    "K4756476648756545A444568879KKKKK"
    "KKKKKKKKKKKKKKKKKKKKKKKKKKKKKKKK"
    "KKKKKKKKKKKKKKKKKKKKKKKKKKKKKKKK"
    "KKKKKKKKKKKKKKKKKKKKKKKKKKKKKKKK"
    "KKKKKKKKKKKKKKKKKKKKKKKKKKKKKKKK")
CODE_LENGTHS = tuple(int(c, 32) for c in "".join(_BYTE_CODE_LENGTHS)) + (5, 7, 7, 7, 7, 7, 7, 6, 7, 7, 7)
STRING_END = 256
MAX_CODE_LENGTH = max(CODE_LENGTHS)
_WORD_ORDER = tuple(sorted(range(len(WORDS)), key=lambda w: (-len(WORDS[w]), w)))   # longest first
_WORD_STARTS = {ord(w[0]) for w in WORDS}


def _canonical(lengths: tuple) -> tuple:
    """(symbols sorted by code length then value, count of codes per length,
    each symbol's code with its bits reversed: the stream's first bit is the
    code's most significant)."""
    order = sorted(range(len(lengths)), key=lambda s: (lengths[s], s))
    counts = [0] * (MAX_CODE_LENGTH + 1)
    reversed_codes = [0] * len(lengths)
    code = previous = 0
    for s in order:
        code <<= lengths[s] - previous
        previous = lengths[s]
        counts[previous] += 1
        reversed_codes[s] = int(format(code, f"0{previous}b")[::-1], 2)
        code += 1
    return tuple(order), tuple(counts), tuple(reversed_codes)


_CODE_ORDER, _CODE_COUNTS, _REVERSED_CODES = _canonical(CODE_LENGTHS)
_EXPANSIONS = tuple(bytes([b]) for b in range(256)) + (b"",) + tuple(w.encode() for w in WORDS)


def _string_symbols(data: bytes):
    """data cut into symbols (a word where one starts, else a byte), then STRING_END."""
    at = 0
    while at < len(data):
        byte = data[at]
        if byte in _WORD_STARTS:
            word = next((w for w in _WORD_ORDER if data.startswith(_EXPANSIONS[STRING_END + 1 + w], at)), None)
            if word is not None:
                yield STRING_END + 1 + word
                at += len(WORDS[word])
                continue
        yield byte
        at += 1
    yield STRING_END


# ---- bits ----

class _Writer:
    """Bits LSB first: a small int of fewer than 64 pending bits, flushed to
    bytes 8 at a time (one growing int would make every write copy it);
    strings as the format `version` codes them."""

    __slots__ = ("out", "acc", "nbits", "version")

    def __init__(self, version: int = VERSION):
        self.out = bytearray()
        self.acc = 0
        self.nbits = 0
        self.version = version

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
        cls = _CLASS_OF[value.bit_length()]
        self.put(cls | value << 4, 4 + WIDTHS[cls])

    def ulen(self, value: int, base: int) -> None:
        """value as its bit length (relative to base) and its bits below the top one."""
        length = value.bit_length()
        c = length - base
        if 0 <= c < LENGTH_ESCAPE:
            self.put(c, 4)
        else:
            self.put(LENGTH_ESCAPE | length << 4, 4 + LENGTH_ESCAPE_BITS)
        if length > 1:
            self.put(value ^ 1 << (length - 1), length - 1)

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
        self.symbols(data[prefix:len(data) - suffix])
        earlier.append(data)

    def symbols(self, data: bytes) -> None:
        """data as 6-bit symbols (14 bits for a byte outside ALPHABET), then
        END; format 4: as Huffman codes of its symbols, then STRING_END's."""
        if self.version >= 4:
            for symbol in _string_symbols(data):
                self.put(_REVERSED_CODES[symbol], CODE_LENGTHS[symbol])
            return
        symbols = width = 0   # packed here, written with one put()
        for byte in data:
            symbol = _SYMBOL_OF.get(byte)
            if symbol is None:
                symbols |= (ESCAPE | byte << 6) << width
                width += 14
            else:
                symbols |= symbol << width
                width += 6
        self.put(symbols | END << width, width + 6)

    def bits(self) -> tuple:
        """(value, width): everything written so far, as one field."""
        return int.from_bytes(self.out, "little") | self.acc << (8 * len(self.out)), 8 * len(self.out) + self.nbits

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

    __slots__ = ("data", "pos", "end", "window", "window_pos", "window_end", "version")
    WINDOW = 128

    def __init__(self, data: bytes, version: int = VERSION):
        self.data = data
        self.version = version
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

    def ulen(self, base: int) -> int:
        c = self.get(4)
        length = base + c if c != LENGTH_ESCAPE else self.get(LENGTH_ESCAPE_BITS)
        if length > 64:
            raise ValueError(f"corrupted token: a value of {length} bits")
        return 1 << (length - 1) | self.get(length - 1) if length > 1 else length

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
        earlier.append(base[:prefix] + self.symbols() + base[len(base) - suffix:])
        return earlier[-1]

    def symbols(self) -> bytes:
        """Symbols up to END (see _Writer.symbols)."""
        if self.version >= 4:
            return self.huffman()
        out = bytearray()
        get, letters = self.get, _LETTERS
        while True:
            symbol = get(6)
            if symbol == END:
                return bytes(out)
            out.append(get(8) if symbol == ESCAPE else letters[symbol])

    def huffman(self) -> bytes:
        """Huffman-coded symbols up to STRING_END, read a bit at a time
        (canonical decoding, as zlib's puff.c): every code ends within
        MAX_CODE_LENGTH bits."""
        out = bytearray()
        get, counts, order, expansions = self.get, _CODE_COUNTS, _CODE_ORDER, _EXPANSIONS
        while True:
            code = first = index = 0
            for length in range(1, MAX_CODE_LENGTH + 1):
                code |= get(1)
                count = counts[length]
                if code - first < count:
                    symbol = order[index + code - first]
                    break
                index += count
                first = (first + count) << 1
                code <<= 1
            if symbol == STRING_END:
                return bytes(out)
            out += expansions[symbol]

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

def module_entry_key(mod: Module) -> tuple:
    """What a token says about a module: (build-id prefix or b"", path or
    None).  The path is left out when the decoder's search finds the file
    by its build-id (searched()); a module without a build-id keeps it."""
    return file_module_key(mod.build_id, mod.path)


def file_module_key(build_id: bytes, path: str) -> tuple:
    """module_entry_key() of the file at path with that build-id (b"": none)."""
    build_id = build_id[:BUILD_ID_BYTES] if len(build_id) >= BUILD_ID_BYTES else b""
    return build_id, None if build_id and searched(path) else path


def module_identity(key: tuple, version: int = VERSION, length: int = BUILD_ID_BYTES) -> tuple:
    """A module table entry, (value, width) in bits (design.md), with a
    build-id prefix of `length` bytes (the key's build-id is that long)."""
    build_id, path = key
    w = _Writer(version)
    if version == 2:
        w.put(bool(build_id), 1)
    else:   # the common entry, a build-id alone, costs one flag
        w.put(path is not None, 1)
        if path is not None:
            w.put(bool(build_id), 1)
    if build_id:
        w.put(int.from_bytes(build_id, "little"), 8 * length)
    if version == 2:
        w.put(path is not None, 1)
    if path is not None:
        w.symbols(path.encode("utf-8", "surrogateescape"))
    return w.bits()


class _Places:
    """pc -> (module key, module-relative pc), cached per pc (bounded): the
    module list is listed again only for a pc no listed module contains."""

    MAX = 65536

    def __init__(self):
        self.listed = ([], [])   # (modules, their lo): one attribute, replaced whole (threads)
        self.cache = {}
        self.generation = None   # the core's module-list generation the cache was filled under

    def where(self, pc: int, exact: bool):
        if self.generation != modules_generation():   # modules came or went: a pc may name another now
            self.generation = modules_generation()
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
        return module_entry_key(mod), pc - mod.bias

    def _containing(self, pc: int):
        modules, los = self.listed
        i = bisect.bisect_right(los, pc) - 1
        if i >= 0 and pc < modules[i].hi:
            return modules[i]
        return None


_places = _Places()


# ---- where a decoder looks for a module's file ----

# The places a decoder searches by build-id, and an encoder leaves the path
# out for: the dynamic linker's directories and the interpreter's own (flat:
# every file in them), the Python library and package directories (down to
# SEARCH_DEPTH levels: files whose name has ".so").  Bounded: at most
# MAX_SEARCHED directory entries are looked at.
LINKER_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64", "/usr/local/lib")
SEARCH_DEPTH = 4
MAX_SEARCHED = 200000
SEARCH_PATH_VARIABLE = "BTCORE_SEARCH_PATH"
_SHARED_OBJECT = re.compile(r"\.so(\.|$)")


def _real_dirs(paths) -> tuple:
    seen = {}
    for path in paths:
        if path and os.path.isdir(path):
            seen.setdefault(os.path.realpath(path), None)
    return tuple(seen)


def _python_dirs() -> list:
    import sysconfig   # here: only a token's decoding searches (its import: 0.6 ms of every command)
    paths = sysconfig.get_paths()
    dirs = [paths.get(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")]
    dirs += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    dirs += [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    return dirs


def _flat_dirs() -> list:
    import sysconfig
    multiarch = sysconfig.get_config_var("MULTIARCH")
    flat = [sysconfig.get_config_var("LIBDIR"), os.path.dirname(os.path.realpath(sys.executable))]
    return flat + [os.path.join(d, multiarch) for d in LINKER_DIRS if multiarch] + list(LINKER_DIRS)


def _search_places() -> tuple:
    """(flat directories, deep directories) this process searches (realpaths)."""
    return _real_dirs(_flat_dirs()), _real_dirs(_python_dirs())


_places_searched = []   # [(flat, deep)], computed on first use
_flat_as_named = []     # [the flat directories as named, before realpath]: found without a realpath()


def search_places() -> tuple:
    if not _places_searched:
        _places_searched.append(_search_places())
        _flat_as_named.append(frozenset(_flat_dirs()))
    return _places_searched[0]


def searched(path: str) -> bool:
    """Whether a decoder's search (with the places this process has) finds
    the file at path by build-id, so that a token need not name the path."""
    if not path.startswith("/"):   # the vDSO ("")
        return False
    flat, deep = search_places()
    folder = os.path.dirname(path)
    if folder in _flat_as_named[0]:   # its realpath is that of a flat directory: a flat directory
        return True
    folder = os.path.realpath(folder)
    if folder in flat:
        return True
    if not _SHARED_OBJECT.search(os.path.basename(path)):
        return False
    for top in deep:
        inside = os.path.relpath(folder, top)
        if inside == "." or (not inside.startswith("..") and inside.count(os.sep) < SEARCH_DEPTH):
            return True
    return False


class _SearchIndex:
    """build-id prefix -> paths of the files found in some places, built on
    first need (bounded: MAX_SEARCHED entries looked at)."""

    def __init__(self, flat: tuple, deep: tuple):
        self.by_prefix = {}
        self.budget = MAX_SEARCHED
        for folder in flat:
            self._scan(folder, 0, lambda name: True)
        for folder in deep:
            self._scan(folder, SEARCH_DEPTH, _SHARED_OBJECT.search)

    def _scan(self, folder: str, depth: int, wanted) -> None:
        try:
            entries = os.scandir(folder)
        except OSError:
            return
        with entries:
            for entry in entries:
                self.budget -= 1
                if self.budget < 0:
                    return
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if depth:
                            self._scan(entry.path, depth - 1, wanted)
                    elif entry.is_file() and wanted(entry.name):
                        build_id = file_build_id(entry.path)
                        if build_id and len(build_id) >= MIN_BUILD_ID_BYTES:
                            self.by_prefix.setdefault(build_id[:MIN_BUILD_ID_BYTES], []).append(entry.path)
                except OSError:
                    continue

    def candidates(self, build_id: bytes) -> list:
        return self.by_prefix.get(build_id[:MIN_BUILD_ID_BYTES], [])


_indexes = FrameCache(8)   # (flat, deep) -> (_SearchIndex,)


def search_index(extra: tuple) -> _SearchIndex:
    """The index of the places searched here, plus the directories of
    extra (searched to SEARCH_DEPTH, every file with ".so" in its name)."""
    flat, deep = search_places()
    key = (flat, deep + _real_dirs(extra))
    hit = _indexes.get(key)
    if hit is None:
        hit = _indexes.put(key, (_SearchIndex(*key),))
    return hit[0]


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
            return self._unnamed()
        key = ("decoded", self.module.path, self.module.build_id, -self.vaddr if self.exact else self.vaddr)
        hit = cache.get(key)
        if hit:
            return hit
        named = _frames_from_file(self.module, self.vaddr, self.exact)
        # Not cached unnamed: the file may be back with its build-id later.
        return cache.put(key, named) if named else self._unnamed()

    def _unnamed(self) -> tuple:
        path = self.module.path or None if self.module else None
        offset = self.vaddr if self.module else None
        return (Frame(NATIVE, self.vaddr, path, None, offset, None, None),)


def _frames_from_file(module: DecodedModule, vaddr: int, exact: bool) -> tuple | None:
    """What symbols/resolve.py makes of a loaded module's pc, from the file alone
    (ip is the module-relative pc: there is no load address here); None if
    the file at module.path no longer has the module's build-id.  The file
    is opened once (a regular file only), its build-id checked on that
    descriptor, and read through it: what decode() checked may have been
    swapped since, and what is read is what is checked now."""
    lookup = vaddr if exact else vaddr - 1
    try:
        fd = open_regular(module.path)
    except (OSError, UnicodeEncodeError):
        return None
    try:
        want = bytes.fromhex(module.build_id)
        if (_fd_build_id(fd) or b"")[:len(want)] != want:
            return None
        symbol, start = file_symbol(module.path, lookup, fd)
        return native_frames(vaddr, module.path, symbol, vaddr - start if symbol else vaddr, lookup, fd)
    except OSError:
        return None
    finally:
        os.close(fd)


class DecodedModule(NamedTuple):
    """A module named by a token, and what decode() found for it here."""
    path: str          # the file its frames are named from, else the token's path, else ""
    build_id: str      # hex, the prefix the token keeps
    status: str        # "loaded", "file", "mismatch", "missing", "no build-id"
    detail: str        # in words, for the reader
    named: str | None = None   # the path the token holds (None: left to the search)

    @property
    def usable(self) -> bool:
        return self.status in ("loaded", "file")

    @property
    def key(self) -> tuple:
        """The module as the token named it (module_entry_key())."""
        return bytes.fromhex(self.build_id), self.named


class DecodedBacktrace(Backtrace):
    """What decode() returns: a Backtrace whose `modules` tell, for each
    module the token names, whether its frames could be named here."""

    __slots__ = ("modules",)

    def _header(self) -> list:
        return [f"Module {m.path or '?'} (build-id {m.build_id}): {m.detail}; its frames are not named"
                for m in self.modules if not m.usable]

    def __copy__(self) -> DecodedBacktrace:
        dup = _new(DecodedBacktrace)
        dup._capacity, dup._raw, dup._refs, dup.truncated, dup.modules = (
            self._capacity, bytearray(self._raw), self._refs, self.truncated, self.modules)
        return dup


# ---- encoding ----

def encode(bt: Backtrace) -> str:
    """bt as one printable word (see the module docstring), written by the
    C encoder; a backtrace holding frames decoded from a token, or a string
    the C encoder does not write (not UTF-8), goes through the reference
    encoder below."""
    into = []
    if lib.btc_encode(id(bt), id(into), _need) >= 0:
        return into[0]
    return _encode_teaching(bt, into)


# What the fast path's calls need to be taught: written, never read there.
_need = ffi.new("btc_encode_need *")

# Backtrace.encode() becomes a builtin method (native/codec/encode.c) doing
# what the first line of encode() does, and calling encode() for the rest.
_ENCODE_DOC = "encode($self, /)\n--\n\n" + Backtrace.encode.__doc__   # the text signature, then the docstring
if lib.btc_install_encode(id(Backtrace), id(encode), _ENCODE_DOC.encode()) != 0:
    raise ImportError("btcore: cannot install the builtin Backtrace.encode()")


def _encode_teaching(bt: Backtrace, into: list) -> str:
    """encode() when the C encoder must first be taught modules (up to 16
    per round) or hands the backtrace over.  Its own btc_encode_need: the
    GIL may pass to another encoding thread between rounds."""
    need = ffi.new("btc_encode_need *")
    for _ in range(MAX_MODULES // lib.BTC_ENCODE_MAX_NEED):
        rc = lib.btc_encode(id(bt), id(into), need)
        if rc >= 0:
            return into[0]
        if rc != lib.BTC_ENCODE_NEED_MODULE or \
                not all(_teach(need.module_id[i], need.pc[i]) for i in range(need.count)):
            break
    return _encode(bt)


def _teach(module_id: int, pc: int) -> bool:
    """Give the C encoder the module table entry of the module containing
    pc, where the core found module_id; False if that module may be gone
    since (the module list changed meanwhile, or another module is there)."""
    generation = modules_generation()
    key, _ = _places.where(pc, True)
    if key is None or module_key(pc, True)[0] != module_id or modules_generation() != generation:
        return False
    value, width = module_identity(key)
    lib.btc_encode_module(module_id, value.to_bytes((width + 7) // 8, "little"), width)
    return True


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
    key = module.key if module else None
    return (flags | (F_EXACT if ref.exact else 0), key, ref.vaddr)


def _encode(bt: Backtrace, version: int = VERSION) -> str:
    """The reference encoder (design.md; format 2 for tests of its decoder)."""
    return token(bool(bt.truncated), _items(bt), version)


def token(truncated: bool, items: list, version: int = VERSION) -> str:
    """The token of frames already named: (flags, module key (file_module_key())
    or None, module-relative pc) per native frame, (flags, name, file, line)
    per Python frame, innermost first (another process's stacks: btcore/remote/process.py)."""
    modules = {}
    for item in items:
        if len(item) == 3 and item[1] is not None:
            modules.setdefault(item[1], len(modules))
    w = _Writer(version)
    w.put(truncated, 1)
    w.put(BUILD_ID_BYTES, 4)
    w.varint(len(modules))
    for key in modules:
        w.put(*module_identity(key, version))
    w.varint(len(items))
    _FrameWriter(w, modules, version).frames(items)
    return f"btc{version}." + w.token()[len(PREFIX):]


def _copy_key(item: tuple) -> tuple:
    """What a copy must reproduce of an item: what its frame code writes."""
    if len(item) == 3:
        flags, key, vaddr = item
        return flags & (F_JOIN | F_EXACT), key, vaddr
    flags, name, file, line = item
    return flags & F_JOIN, name, file, 0 if line is None else line + 1


class _Copies:
    """The longest earlier run of frames equal to the frames at i (format 4
    COPY), searched among the MAX_CHAIN nearest earlier frames equal to
    frame i: the first longest, nearest first; a run does not reach i."""

    def __init__(self, keys: list):
        self.keys = keys
        self.earlier = {}   # key -> its positions so far, each appended as longest() passes it
        self.done = 0

    def longest(self, i: int) -> tuple:
        keys, earlier = self.keys, self.earlier
        for at in range(self.done, i):
            earlier.setdefault(keys[at], []).append(at)
        self.done = i
        best = (0, 0)
        for j in reversed(earlier.get(keys[i], ())[-MAX_CHAIN:]):
            most = min(i - j, len(keys) - i)
            n = 1
            while n < most and keys[j + n] == keys[i + n]:
                n += 1
            if n > best[0]:
                best = (n, i - j)
        return best


class _FrameWriter:
    def __init__(self, w: _Writer, modules: dict, version: int):
        self.w = w
        self.modules = modules
        self.version = version
        self.module_bits = len(modules).bit_length()   # index len(modules): no module
        self.seen = 0                                   # modules named by a frame so far (formats 3, 4)
        self.history = []                               # (module index, vaddr), newest first
        self.names, self.files = {}, {}                 # string -> index
        self.name_bytes, self.file_bytes = [], []       # reference lists of new strings

    def frames(self, items: list) -> None:
        w = self.w
        copies = _Copies([_copy_key(item) for item in items]) if self.version >= 4 else None
        i = 0
        while i < len(items):
            length, distance = copies.longest(i) if copies else (0, 0)
            if length >= MIN_COPY:
                w.code(COPY)
                w.ulen(length, COPY_BASE)
                w.ulen(distance, COPY_BASE)
                for item in items[i:i + length]:   # the copied native frames are the latest ones
                    if len(item) == 3:
                        self._remember(item)
                i += length
                continue
            item = items[i]
            if item[0] & F_JOIN:
                w.code(JOIN_NEXT if self.version < 4 else JOIN_NEXT_4)
            if len(item) == 3:
                self.native(item)
            else:
                self.python(item)
            i += 1

    def _remember(self, item: tuple) -> None:
        _, key, vaddr = item
        self.history.insert(0, (len(self.modules) if key is None else self.modules[key], vaddr))
        del self.history[HISTORY:]

    def native(self, item: tuple) -> None:
        flags, key, vaddr = item
        w = self.w
        if flags & F_EXACT:
            w.code(EXACT_NEXT)
        self._address(len(self.modules) if key is None else self.modules[key], vaddr)
        self._remember(item)

    def _address(self, index: int, vaddr: int) -> None:
        if self.version == 2:
            self._address_v2(index, vaddr)
        else:
            self._address_v3(index, vaddr)

    def _repeat_or_nearest(self, index: int, vaddr: int, delta_bits) -> tuple | None:
        """None once REPEAT is written (one of the previous frames had this
        address); else (bits, k, delta) of the delta against a previous frame
        of the same module that costs the fewest delta_bits(its bit length),
        the first on a tie, or () if there is none."""
        best = ()
        for k, (ref_index, ref_vaddr) in enumerate(self.history):
            if ref_index != index:
                continue
            if ref_vaddr == vaddr:
                self.w.code(REPEAT)
                self.w.put(k, 2)
                return None
            delta = vaddr - ref_vaddr
            bits = delta_bits(abs(delta).bit_length())
            if not best or bits < best[0]:
                best = (bits, k, delta)
        return best

    def _address_v3(self, index: int, vaddr: int) -> None:
        """REPEAT (the first k that matches), else the cheaper of DELTA (the k
        of the fewest bits, the first on a tie) and LITERAL (LITERAL on a tie)."""
        w = self.w
        best = self._repeat_or_nearest(index, vaddr, lambda n: length_bits(n, DELTA_BASE))
        if best is None:
            return
        new = index == self.seen < len(self.modules)
        if new:
            module_bits = 1
        else:
            module_bits = (self.seen < len(self.modules)) + self.seen.bit_length()
        if best and 3 + best[0] < module_bits + length_bits(vaddr.bit_length(), ADDRESS_BASE):
            _, k, delta = best
            w.code(DELTA)
            w.put(k | (delta < 0) << 2, 3)
            w.ulen(abs(delta), DELTA_BASE)
            return
        w.code(LITERAL)
        self._module(index, new)
        w.ulen(vaddr, ADDRESS_BASE)

    def _module(self, index: int, new: bool) -> None:
        """A literal's module: the next of the table not named yet (one bit),
        else an index among those named so far, their count meaning no module."""
        w = self.w
        if self.seen < len(self.modules):
            w.put(new, 1)
        if new:
            self.seen += 1
        else:
            w.put(min(index, self.seen), self.seen.bit_length())

    def _address_v2(self, index: int, vaddr: int) -> None:
        w = self.w
        best = self._repeat_or_nearest(index, vaddr, lambda n: WIDTHS[_CLASS_OF[n]])
        if best is None:
            return
        literal_bits = self.module_bits + WIDTHS[_CLASS_OF[vaddr.bit_length()]]
        if best and best[0] + 3 < literal_bits:
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

def _not_a_place(place):
    raise TypeError(f"search holds directories (str or os.PathLike), not {type(place).__name__}")


def decode(token: str, search=None) -> DecodedBacktrace:
    """The Backtrace a token holds, resolvable like any other.

    Native frames of a module loaded in this process with the token's
    build-id are re-based onto its load address here; those of a module not
    loaded are named from a file that has the token's build-id: the path the
    token names, else one the search finds (the places search_places()
    lists, the directories in `search` or, when it is None, in the
    BTCORE_SEARCH_PATH environment variable); other frames stay unnamed and
    the Backtrace's `modules` (and format()'s first lines) say why.
    ValueError for anything that is not a whole, well-formed token of a
    known version.
    """
    if not isinstance(token, str):
        raise TypeError(f"decode() takes a str, not {type(token).__name__}")
    if search is None:
        search = os.environ.get(SEARCH_PATH_VARIABLE, "").split(os.pathsep)
    elif isinstance(search, (str, bytes, os.PathLike)):
        raise TypeError("search is a list of directories: give [directory] for one")
    else:
        search = [os.fsdecode(place) if isinstance(place, (str, bytes, os.PathLike)) else _not_a_place(place)
                  for place in search]
    version, data = _body(token)
    r = _Reader(data, version)
    truncated = bool(r.get(1))
    modules = _read_modules(r, tuple(search), version)
    count = r.varint(MAX_CAPACITY, "frame count")
    records, refs = _FrameReader(r, modules, version).frames(count)
    r.finish()
    bt = _new(DecodedBacktrace)
    bt._capacity = max(count, DEFAULT_CAPACITY)
    bt._raw, bt._refs, bt.truncated = records, tuple(refs), truncated
    bt.modules = [m for m, _ in modules]
    return bt


def _body(token: str) -> tuple:
    """(format version, the bytes of the body)."""
    token = token.strip()
    if len(token) > MAX_TOKEN_CHARS:
        raise ValueError(f"not a btcore token: longer than {MAX_TOKEN_CHARS} characters")
    m = TOKEN.fullmatch(token)
    if m is None:
        raise ValueError(f"not a btcore token: expected {PREFIX} followed by base64url characters")
    version = int(m.group(1))
    if version not in READ_VERSIONS:
        earlier = " (an earlier format, no longer read)" if 0 < version < min(READ_VERSIONS) else ""
        known = ", ".join(map(str, READ_VERSIONS[:-1])) + f" and {READ_VERSIONS[-1]}"
        raise ValueError(f"unknown btcore token version {m.group(1)}{earlier}: this btcore reads versions {known}")
    body = m.group(2)
    if len(body) % 4 == 1:
        raise ValueError("truncated token: its length is not that of a base64 encoding")
    try:
        return version, base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_", validate=True)
    except binascii.Error as e:
        raise ValueError(f"corrupted token: {e}") from None


def _read_modules(r: _Reader, search: tuple, version: int) -> list:
    """(DecodedModule, load bias here or None) per module table entry."""
    length = r.get(4)
    count = r.varint(MAX_MODULES, "module count")
    if count and length < MIN_BUILD_ID_BYTES:
        raise ValueError(f"corrupted token: build-id prefixes of {length} bytes (at least {MIN_BUILD_ID_BYTES})")
    entries = []
    for _ in range(count):
        entries.append(_read_module_v2(r, length) if version == 2 else _read_module(r, length))
    loaded = loaded_modules() if entries else []
    return [identify(build_id, path, loaded, search) for build_id, path in entries]


def _read_module(r: _Reader, length: int) -> tuple:
    """(build-id prefix or b"", path or None): has path, [has build-id], [build-id], [path]."""
    has_path = r.get(1)
    build_id = r.get(8 * length).to_bytes(length, "little") if not has_path or r.get(1) else b""
    return build_id, r.symbols().decode("utf-8", "surrogateescape") if has_path else None


def _read_module_v2(r: _Reader, length: int) -> tuple:
    build_id = r.get(8 * length).to_bytes(length, "little") if r.get(1) else b""
    path = r.symbols().decode("utf-8", "surrogateescape") if r.get(1) else None
    if path is None and not build_id:
        raise ValueError("corrupted token: a module with neither build-id nor path")
    return build_id, path


def identify(build_id: bytes, path: str | None, loaded: list, search: tuple = ()) -> tuple:
    """What this process has for a module of a token: (DecodedModule, load
    bias if it is loaded here, else None)."""
    hexid = build_id.hex()
    if not build_id:
        return DecodedModule(path, hexid, "no build-id", "the token has no build-id for it", path), None
    for m in loaded:
        if m.build_id[:len(build_id)] == build_id:
            return DecodedModule(path or m.path, hexid, "loaded", f"loaded here as {m.path}", path), m.bias
    if path is not None:
        status, detail = _check_file(path, build_id)
        if status == "file":
            return DecodedModule(path, hexid, status, detail, path), None
    for found in search_index(search).candidates(build_id):
        if found != path and _check_file(found, build_id)[0] == "file":
            return DecodedModule(found, hexid, "file", f"named from {found}", path), None
    if path is None:
        detail = (f"no file with this build-id in the places searched (add directories with "
                  f"{SEARCH_PATH_VARIABLE} or decode(search=))")
        return DecodedModule("", hexid, "missing", detail), None
    return DecodedModule(path, hexid, status, detail, path), None


def _check_file(path: str, build_id: bytes) -> tuple:
    """(status, detail): whether the file at path has build_id."""
    try:
        os.fsencode(path)   # what the native layer will be handed: a file system path, no NUL
        if "\0" in path:
            raise OSError(0, "a NUL character in the path")
        on_disk = file_build_id(path)
    except (OSError, UnicodeEncodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else "not a file system path"
        return "missing", f"cannot be read here ({reason})"
    if on_disk is None:
        return "mismatch", "build-id mismatch: the file here has no build-id"
    if on_disk[:len(build_id)] != build_id:
        return "mismatch", f"build-id mismatch: the file here has {on_disk[:len(build_id)].hex()}"
    return "file", "named from the file"


def _pc(pc: int, flags: int) -> int:
    """pc, if it can be a native frame's pc: a return address is looked up
    at pc - 1, so it is not 0."""
    if not (0 if flags & F_EXACT else 1) <= pc < 1 << 64:
        raise ValueError(f"corrupted token: a native frame at {pc:#x}")
    return pc


class _FrameReader:
    def __init__(self, r: _Reader, modules: list, version: int):
        self.r = r
        self.modules = modules
        self.version = version
        self.module_bits = len(modules).bit_length()
        self.seen = 0   # modules named by a literal so far (formats 3, 4)
        self.history = []
        self.names, self.files = [], []                 # decoded strings, in order
        self.name_bytes, self.file_bytes = [], []       # reference lists of new strings
        self.string_budget = MAX_STRING_BYTES

    def frames(self, count: int) -> tuple:
        records, refs = bytearray(), []
        self.decoded = []   # per frame: (its ref or None, its (module index, vaddr) if native)
        while len(self.decoded) < count:
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
            if code is COPY:
                if flags:
                    raise ValueError("corrupted token: a frame modifier before a copy")
                self.copy(count, records, refs)
            elif code is PYTHON_FRAME:
                if flags & F_EXACT:
                    raise ValueError("corrupted token: a Python frame marked exact")
                ref = self.python()
                records += RECORD.pack(id(ref), -1, KIND_DECODED, flags, 0)
                refs.append(ref)
                self.decoded.append((ref, None))
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
        if not get(1):
            return EXACT_NEXT
        if self.version < 4:
            return JOIN_NEXT
        return COPY if get(1) else JOIN_NEXT

    def copy(self, count: int, records: bytearray, refs: list) -> None:
        """A COPY: its frames again, each as it was decoded (records, refs,
        the history of native frames).  Bounded: it reads only frames
        decoded before it and writes no more than the frame count."""
        done = len(self.decoded)
        length = self.r.ulen(COPY_BASE)
        if not MIN_COPY <= length <= count - done:
            raise ValueError(f"corrupted token: a copy of {length} frames after {done} of {count}")
        distance = self.r.ulen(COPY_BASE)
        if distance > done:
            raise ValueError(f"corrupted token: a copy from {distance} frames back, after {done} frames")
        if distance < length:
            raise ValueError(f"corrupted token: a copy of {length} frames from {distance} back overlaps itself")
        start = done - distance
        size = RECORD.size
        records += records[start * size:(start + length) * size]
        for ref, place in self.decoded[start:start + length]:
            if ref is not None:
                refs.append(ref)
            if place is not None:
                self._remember(place)
        self.decoded += self.decoded[start:start + length]

    def _remember(self, place: tuple) -> None:
        self.history.insert(0, place)
        del self.history[HISTORY:]

    def native(self, code: tuple, flags: int, records: bytearray, refs: list) -> None:
        index, vaddr = self._address(code)
        self._remember((index, vaddr))
        if index == len(self.modules):
            ref = DecodedNative(None, vaddr, bool(flags & F_EXACT))
        else:
            module, bias = self.modules[index]
            if bias is not None:   # loaded here: an ordinary native frame, re-based
                records += RECORD.pack(_pc(bias + vaddr, flags), -1, KIND_NATIVE, flags, 0)
                self.decoded.append((None, (index, vaddr)))
                return
            _pc(vaddr, flags)
            ref = DecodedNative(module, vaddr, bool(flags & F_EXACT))
        records += RECORD.pack(id(ref), -1, KIND_DECODED, flags, 0)
        refs.append(ref)
        self.decoded.append((ref, (index, vaddr)))

    def _address(self, code: tuple) -> tuple:
        r = self.r
        if code is LITERAL and self.version == 2:
            index = r.get(self.module_bits)
            if index > len(self.modules):
                raise ValueError(f"corrupted token: module {index} of {len(self.modules)}")
            return index, r.uint()
        if code is LITERAL:
            return self._module(), r.ulen(ADDRESS_BASE)
        k = r.get(2)
        if k >= len(self.history):
            raise ValueError(f"corrupted token: a frame refers to native frame {k + 1} back of {len(self.history)}")
        index, vaddr = self.history[k]
        if code is REPEAT:
            return index, vaddr
        negative = r.get(1)
        delta = r.uint() if self.version == 2 else r.ulen(DELTA_BASE)
        vaddr = vaddr - delta if negative else vaddr + delta
        if not 0 <= vaddr < 1 << 64:
            raise ValueError("corrupted token: a frame address out of range")
        return index, vaddr

    def _module(self) -> int:
        """A literal's module index (see _FrameWriter._module); len(modules): none."""
        r, count = self.r, len(self.modules)
        if self.seen < count and r.get(1):
            self.seen += 1
            return self.seen - 1
        index = r.get(self.seen.bit_length())
        if index > self.seen:
            raise ValueError(f"corrupted token: module {index} of the {self.seen} named so far")
        return index if index < self.seen else count

    def python(self) -> DecodedPython:
        name = self._string(self.names, self.name_bytes)
        file = self._string(self.files, self.file_bytes)
        line = self.r.uint()
        return DecodedPython(name, file, line - 1 if line else None)

    def _string(self, table: list, earlier: list) -> str:
        """A table reference (bit 0 + index) or a new string (bit 1 + text)."""
        r = self.r
        if r.get(1):   # a string taken whole from an earlier one costs a few bits: their sum is bounded
            data = r.string(earlier)
            self.string_budget -= len(data)
            if self.string_budget < 0:
                raise ValueError(f"corrupted token: its strings are longer than {MAX_STRING_BYTES} bytes")
            table.append(_text(data))
            return table[-1]
        if not table:
            raise ValueError("corrupted token: a string reference before any string")
        index = r.get((len(table) - 1).bit_length())
        if index >= len(table):
            raise ValueError(f"corrupted token: string {index} of {len(table)}")
        return table[index]


# ---- reading a module's build-id from a file named by a token ----

_file_ids = FrameCache(256)   # (device, inode, mtime, size) -> build-id


def file_build_id(path: str) -> bytes | None:
    """The NT_GNU_BUILD_ID of the ELF file at path (64-bit little-endian),
    None if it has none.  The path comes from untrusted input: only a
    regular file is opened (open_regular: a FIFO or a device is never
    opened), and at most its header, program headers and notes are read."""
    if not path.startswith("/"):
        raise OSError(0, "not an absolute path")
    fd = open_regular(path)
    try:
        return _fd_build_id(fd)
    finally:
        os.close(fd)


def _fd_build_id(fd: int) -> bytes | None:
    """file_build_id() of the regular file open as fd, cached by the file's
    identity (device, inode, mtime, size)."""
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    hit = _file_ids.get(key)
    if hit is None:
        hit = _file_ids.put(key, (_read_build_id(fd),))
    return hit[0]


def _read_build_id(fd: int) -> bytes | None:
    """The build-id in the file's PT_NOTE segments (native/symbols/elf.c),
    None without one or with one longer than a module's (btc_modinfo)."""
    out = ffi.new("uint8_t[]", lib.BTC_BUILD_ID_MAX)
    n = lib.btc_elf_file_build_id(fd, out, len(out))
    if n < 0:
        raise OSError(0, "not a 64-bit little-endian ELF file")
    return bytes(out[0:n]) if 0 < n <= len(out) else None
