"""The native core's records (native/btcore_api.h) as struct formats.

Each format is read from cffi's declared layout of its C type (fields in order,
arrays as repeated items, padding where the compiler put some), so no module
keeps a second, hand-written copy of btcore_api.h that could drift from it.
"""
from __future__ import annotations

import struct

from .._native import ffi

_CODES = {(1, False): "B", (2, False): "H", (4, False): "I", (8, False): "Q",
          (1, True): "b", (2, True): "h", (4, True): "i", (8, True): "q"}


def record_struct(name: str, *only: str) -> struct.Struct:
    """The struct format of the C type called name, in the byte order and padding of this build; with field
    names `only`, of those fields alone (in the type's order, the others skipped as padding)."""
    ctype = ffi.typeof(name)
    fmt, at = "=", 0
    for field_name, field in ctype.fields:
        if only and field_name not in only:
            continue
        fmt += "x" * (field.offset - at) + _codes(field.type)
        at = field.offset + ffi.sizeof(field.type)
    return struct.Struct(fmt + "x" * (ffi.sizeof(ctype) - at))


def _codes(ctype) -> str:
    if ctype.kind == "array":
        return f"{ctype.length}{_codes(ctype.item)}"
    return _CODES[ffi.sizeof(ctype), ctype.cname.startswith("int")]


FRAME = record_struct("btc_frame")                  # addr, lasti, kind, flags, reserved
PYFRAME = record_struct("btc_remote_pyframe")       # code, lasti, entry
GREENLET = record_struct("btc_remote_greenlet")
LABEL = record_struct("btc_remote_label")
TASK = record_struct("btc_remote_task")
SPAWN_CHAIN = record_struct("btc_remote_chain")   # object, first, n, cut
SPAWN_LINK = record_struct("btc_remote_link")     # site, spawner, creator
