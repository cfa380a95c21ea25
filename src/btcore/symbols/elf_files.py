"""ELF files on disk (a target's modules, this process's own): symbols and
sections, read through the native ELF reader (native/symbols/elf.c), each
file opened once while it is cached."""
from __future__ import annotations

import functools
import os

from .._native import ffi, lib


@functools.lru_cache(maxsize=8)
def _elf(path: str, mtime: float):
    """The file's btc_elf (sections and symbol tables, read once), kept open
    while cached; None if it is not a readable ELF file."""
    e = lib.btc_elf_open(os.fsencode(path))
    return None if e == ffi.NULL else ffi.gc(e, lib.btc_elf_close)


def symbol_value(path: str, name: str) -> int | None:
    """A defined symbol's module-relative value (.dynsym, then .symtab) in the ELF file at path."""
    e = _elf(path, os.stat(path).st_mtime)
    value = ffi.new("uint64_t *")
    return value[0] if e is not None and lib.btc_elf_symbol_value(e, name.encode(), value) == 0 else None


def section_head(path: str, name: str, most: int) -> bytes | None:
    """The first bytes (at most most) of section name of the ELF file at path; None if it has no such
    section (or only a compressed one) or cannot be read."""
    try:
        e = _elf(path, os.stat(path).st_mtime)
    except OSError:
        return None
    out = ffi.new("uint8_t[]", most)
    n = lib.btc_elf_section_head(e, name.encode(), out, most) if e is not None else -1
    return ffi.buffer(out, n)[:] if n >= 0 else None
