"""The loaded ELF objects, as the capture's module list has them
(native/capture/modules.c, btc_loaded_modules: from dl_iterate_phdr, the
build-ids read from memory)."""
from __future__ import annotations

from typing import NamedTuple

from .._native import ffi, lib


class Module(NamedTuple):
    """lo, hi: the span of its executable PT_LOAD segments (absolute); bias: its load bias."""
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
    mods = [Module(m.lo, m.hi, m.bias, bytes(ffi.buffer(m.build_id, m.build_id_len)),
                   ffi.string(m.path).decode("utf-8", "surrogateescape") if m.path != ffi.NULL else "")
            for m in out[0:n]]
    return sorted(mods)
