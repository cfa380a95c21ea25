"""Bounds on what a dump reads from another process (a live target or a core
file).  The target's memory may hold anything: a bug that scribbled on it,
or a hostile program.  Every address, size, count, offset and line-table
position read there is checked here, before it sizes an allocation or a
loop; one place per value, whichever engine walks the target.  The native
walks bound their own (native/remote/: frame chains and gc lists end at a
loop, greenlet states greenlet never writes are marked bad).

A value that fails is not an error of the dump: the stack that holds it is
shown shorter, with a note saying why (docs/safety.md, "hostile targets").

What the dumper holds of a target, whatever it holds (the figure
docs/safety.md documents, measured by benchmarks/bench_hostile_dump.py):
  the chunk cache of its memory        <= 128 MiB (native/remote/rmem.c)
  each thread's stack copy             <= MAX_READ
  greenlets' saved stacks, in all      <= SPILL_BUDGET (btc_remote_greenlet_fit: each
                                          on one stack of the target, then in order)
  names and line tables, in all        <= NAME_BUDGET
  Python frames                        <= MAX_FRAMES per stack
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from .._native import lib

ADDRESS_END = 1 << 64
MAX_READ = 8 << 20            # one read: at most a thread's stack copy
MAX_FRAMES = 4096             # Python frames of one stack
MAX_STRING = 4096             # characters of a name (a qualname, a file name)
MAX_LINETABLE = 1 << 18       # bytes of a code object's line table
MAX_CODE_UNITS = 1 << 20      # instructions of a code object
SPILL_BUDGET = 256 << 20      # greenlets' saved stacks copied by one dump (gevent's: ~3.6 KiB each)
NAME_BUDGET = 16 << 20        # names and line tables read by one dump
MAX_TYPE_NAME = 128           # bytes of a type's name
BAD_LASTI = -(1 << 31)        # an instruction offset that fits no frame record: refused by line()

# Why a frame chain was cut (a frame with code 0 ends it: native/btcore_api.h BTC_REMOTE_CUT_*).
CUT_UNREADABLE, CUT_LOOP, CUT_SKIPPED = (lib.BTC_REMOTE_CUT_UNREADABLE, lib.BTC_REMOTE_CUT_LOOP,
                                         lib.BTC_REMOTE_CUT_SKIPPED)
_CUT = {CUT_UNREADABLE: "a frame of its chain is unreadable",
        CUT_LOOP: "its frame chain loops", CUT_SKIPPED: "a frame of its chain has no code object: left out"}

_OB_TYPE = 8    # PyObject.ob_type, PyVarObject.ob_size: one place in every default build (3.8-3.15)
_OB_SIZE = 16


def readable(addr: int, n: int) -> bool:
    """May [addr, addr + n) be asked of the target's memory?"""
    return 0 < addr and 0 <= n <= MAX_READ and addr + n <= ADDRESS_END


def lasti_field(value: int) -> int:
    """An instruction offset as a frame record (int32) holds it: BAD_LASTI when it fits none."""
    return value if -(1 << 31) < value < 1 << 31 else BAD_LASTI


def cut_reason(lasti: int) -> str:
    return _CUT.get(lasti, "its frame chain is cut")


def linetable_ok(table: bytes) -> bool:
    """Does every entry of a location table (3.11+'s format) end inside it?
    CPython's own reader of co_lines trusts the table it is given."""
    at, n = 0, len(table)
    while at < n:
        head = table[at]
        at += 1
        if not head & 0x80:
            return False
        code = (head >> 3) & 15
        if code in (13, 14):
            for _ in range(1 if code == 13 else 4):   # varints: 6 bits a byte, 0x40 continues
                while at < n and table[at] & 0x40:
                    at += 1
                at += 1
        elif code in (10, 11, 12):
            at += 2
        elif code < 10:
            at += 1
        if at > n:
            return False
    return True


@dataclass(frozen=True)
class Types:
    """The target's type objects an object read there is checked against
    before its fields are trusted (0: not known, that kind is not checked):
    a corrupt pointer to some other object would otherwise be read through
    the wrong layout, and its words taken for a length, flags and text."""
    code: int = 0    # PyCode_Type
    str: int = 0     # PyUnicode_Type: co_qualname and co_filename are exact str
    bytes: int = 0   # PyBytes_Type: co_linetable is exact bytes
    frame: int = 0   # PyFrame_Type


@dataclass
class Code:
    qualname: str | None
    filename: str | None
    firstlineno: int | None
    linetable: bytes | None
    units: int                 # its instructions (2 bytes each)
    error: str | None = None   # why it is not named (not a code object, the name budget spent)


class Names:
    """The target's code objects and names, read within the bounds: a code
    object whose type is not the target's code type is not read; strings,
    line tables and code sizes past their bounds are refused; all of them
    together within NAME_BUDGET (then codes are left unnamed)."""

    def __init__(self, memory, layout, types: Types, budget: int = NAME_BUDGET):
        self._m, self._lay, self._types, self.left = memory, layout, types, budget
        self._codes = {}

    def code(self, addr: int) -> Code:
        found = self._codes.get(addr)
        if found is None:
            found = self._codes[addr] = self._read_code(addr)
        return found

    def _read_code(self, addr: int) -> Code:
        m, lay = self._m, self._lay
        if not self._is(addr, self._types.code):
            return Code(None, None, None, None, 0, "not a code object")
        if self.left <= 0:
            return Code(None, None, None, None, 0, "names not read: the dump's name budget is spent")
        units = m.word(addr + _OB_SIZE)
        first = m.read(addr + lay.code_firstlineno, 4)
        code = Code(self.string(m.word(addr + lay.code_qualname)), self.string(m.word(addr + lay.code_filename)),
                    struct.unpack("<i", first)[0] if first else None, self._linetable(m.word(addr + lay.code_linetable)),
                    units if units is not None and 0 < units <= MAX_CODE_UNITS else 0)
        wrong = [what for what, value in (("name", code.qualname), ("file name", code.filename),
                                          ("line table", code.linetable), ("size", code.units or None))
                 if value is None]
        code.error = wrong and f"its {', '.join(wrong)} unreadable or out of bounds" or None
        return code

    def _is(self, obj: int, type_: int) -> bool:
        """Is obj's type type_ (when type_ is known)?"""
        return not type_ or self._m.word(obj + _OB_TYPE) == type_

    def string(self, obj: int | None) -> str | None:
        """A compact str object's text (None: unreadable, not a str, not compact, or longer than MAX_STRING)."""
        lay, m = self._lay, self._m
        if not obj or not self._is(obj, self._types.str):
            return None
        state = m.word(obj + lay.unicode_state)
        length = m.word(obj + lay.unicode_length)
        if state is None or length is None or length > MAX_STRING:
            return None
        kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
        if not compact or kind not in (1, 2, 4) or ascii_ and kind != 1:
            return None
        raw = m.read(obj + (lay.ascii_data if ascii_ else lay.compact_data), length * kind)
        if raw is None:
            return None
        self.left -= len(raw)
        codec = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind]
        try:   # exactly the target's text: a path's undecodable bytes are lone surrogates there too
            return raw.decode(codec, "surrogatepass")
        except UnicodeDecodeError:   # not text (beyond U+10FFFF): garbage memory
            return raw.decode(codec, "replace")

    def _linetable(self, obj: int | None) -> bytes | None:
        size = self._m.word(obj + self._lay.bytes_size) if obj and self._is(obj, self._types.bytes) else None
        if size is None or size > MAX_LINETABLE:
            return None
        table = self._m.read(obj + self._lay.bytes_data, size)
        if table is None or not linetable_ok(table):
            return None
        self.left -= len(table)
        return table


def lasti_ok(code: Code, lasti: int) -> bool:
    """Is lasti an instruction of code (2 bytes each; -2: a frame that has not started)?"""
    return -2 <= lasti < 2 * code.units and not lasti & 1


def line(code: Code, lasti: int) -> int | None:
    """The line of instruction offset lasti in code (None: unknown, or
    lasti outside the code: -2 is a frame that has not started)."""
    if code.firstlineno is None or code.linetable is None or not lasti_ok(code, lasti):
        return None
    try:
        probe = _LINE_PROBE.replace(co_firstlineno=code.firstlineno, co_linetable=code.linetable,
                                    co_code=bytes([9, 0]) * code.units)
        for start, end, number in probe.co_lines():
            if start <= max(lasti, 0) < end:
                return number
    except (ValueError, TypeError, SystemError):
        pass
    return None


_LINE_PROBE = compile("pass", "<line probe>", "exec")
