"""Spawn chains from outside: where each greenlet and asyncio task of another
process was created, and by whom, read from the records of the target's own
btcore when spawn tracking was on there (native/remote/rspawn.c).

The target's btcore describes its records itself (btc_spawn_exported, found
by that symbol in its _native module); every live record's chain and each
distinct site are read once, as the stop left them (from the chunks it
read, which the rehearsal's read of them named), and named afterwards: the
sites are RemoteBacktraces (the frames the target recorded, named through
the dump's names), the chains btcore.SpawnChain, as spawn_chain() gives them
inside, so views/dump.py groups and prints them as dump_all() does.
"""
from __future__ import annotations

import os
import weakref

from .._native import ffi, lib
from ..symbols.elf_files import symbol_value
from ..capture.backtrace import MAX_CAPACITY, RECORD
from ..capture.records import SPAWN_CHAIN as _CHAIN, SPAWN_LINK as _LINK
from ..capture.spawn import SpawnChain

_EXPORT = "btc_spawn_exported"
_EXPORT_SIZE = ffi.sizeof("btc_spawn_export")
# Room for the stop's copies: first guesses, doubled while the target has more, up to these bounds.
_FIRST = {"chains": 1 << 12, "links": 1 << 14, "sites": 1 << 10, "frames": 1 << 16}
_MOST = {"chains": 1 << 20, "links": 1 << 22, "sites": 1 << 16, "frames": 1 << 22}
_TYPES = {"chains": "btc_remote_chain", "links": "btc_remote_link", "sites": "btc_remote_site",
          "frames": "btc_frame"}

_exports = weakref.WeakKeyDictionary()    # Target -> the address of its btc_spawn_exported, or 0
_gathered = weakref.WeakKeyDictionary()   # the target's Memory -> _Copied (chains() takes it)


class _Copied:
    __slots__ = ("out", "buffers", "capacity", "note")

    def __init__(self, out, buffers, capacity: int, note: str | None):
        self.out, self.buffers, self.capacity, self.note = out, buffers, capacity, note


def _export_address(target) -> int:
    """Where the target's btcore describes its spawn records, or 0 (no btcore there, or one without them)."""
    at = _exports.get(target)
    if at is None:
        at = 0
        for mod in target.modules.list:
            name = os.path.basename(mod.path)
            if name.startswith("_native.") and os.path.basename(os.path.dirname(mod.path)) == "btcore":
                value = symbol_value(mod.path, _EXPORT)
                at = mod.bias + value if value else 0
                break
        _exports[target] = at
    return at


def gather(target, room) -> None:
    """Read the target's spawn chains for chains() (nothing when its btcore never tracked spawns): after a
    stop, from the chunks it read (remote.spawn_chains()); in a rehearsal, only to learn those chunks."""
    at = _export_address(target)
    raw = target.memory.read(at, _EXPORT_SIZE) if at else None
    if not raw:
        _gathered.pop(target.memory, None)
        return
    export = ffi.new("btc_spawn_export *")
    ffi.memmove(export, raw, _EXPORT_SIZE)
    if export.magic == 0:   # tracking never enabled there
        _gathered.pop(target.memory, None)
        return
    if export.magic != lib.BTC_SPAWN_EXPORT_MAGIC:
        _gathered[target.memory] = _Copied(None, None, 0, "the target's btcore keeps its spawn records in "
                                                          "another layout (another version): spawn sites not shown")
        return
    if not 1 <= export.capacity <= MAX_CAPACITY:   # a corrupt export: its chains would be joined to no bound
        _gathered[target.memory] = _Copied(None, None, 0, f"the target's spawn records claim chains of "
                                                          f"{export.capacity} frames (btcore's hold 1 to "
                                                          f"{MAX_CAPACITY}): spawn sites not shown")
        return
    copied = _read(target, room, export)
    if room.rehearsal:   # read for the chunks it touches: the stop reads them again, chains() what was read after it
        _gathered.pop(target.memory, None)
    else:
        _gathered[target.memory] = copied


def _read(target, room, export) -> _Copied:
    room_of = {part: max(_FIRST[part], room.size(("spawn", part)) // ffi.sizeof(_TYPES[part])) for part in _FIRST}
    while True:
        out = ffi.new("btc_remote_spawn_out *")
        buffers = {part: room.get(("spawn", part), n * ffi.sizeof(_TYPES[part])) for part, n in room_of.items()}
        for part, buf in buffers.items():
            setattr(out, part, ffi.cast(_TYPES[part] + " *", ffi.from_buffer(buf)))
            setattr(out, "max_" + part, room_of[part])
        if lib.btc_remote_spawn_chains(target.memory.handle, export, out) != 0:
            return _Copied(None, None, 0, "the target's spawn records cannot be read: spawn sites not shown")
        full = [part for part, used in (("chains", out.more), ("links", out.nlinks == out.max_links),
                                        ("sites", out.nsites == out.max_sites),
                                        ("frames", out.nframes == out.max_frames)) if used]
        grow = [part for part in full if room_of[part] < _MOST[part]]
        if not grow:
            note = f"more spawn records than btcore reads ({', '.join(full)}): some spawn sites are cut" \
                if full else None
            return _Copied(out, buffers, export.capacity, note)
        for part in grow:
            room_of[part] *= 2


def chains(snap, merger) -> dict:
    """{the address of a greenlet or task: (its SpawnChain, the target's chain capacity)} from what the stop
    read, the sites RemoteBacktraces named through merger's names (remote/process.py's _Merger).  The links'
    third items are the creators' addresses in the target (0: not known): the dump turns them into references
    (remote/process.py)."""
    copied = _gathered.pop(snap.memory, None)
    if copied is None:
        return {}
    if copied.note:
        snap.notes.append(copied.note)
    out = copied.out
    if out is None:
        return {}
    frames = ffi.buffer(out.frames, out.nframes * RECORD.size)
    sites = [merger.backtrace(frames[s.first * RECORD.size:(s.first + s.n) * RECORD.size], bool(s.truncated))[0]
             for s in out.sites[0:out.nsites]]
    links = ffi.buffer(out.links, out.nlinks * _LINK.size)
    spawners, found, shared = {}, {}, {}
    for address, first, n, cut in _CHAIN.iter_unpack(ffi.buffer(out.chains, out.nchains * _CHAIN.size)):
        if n == 0 and not cut:
            continue   # a record without a site: a spawner created while tracking was off
        raw = (links[first * _LINK.size:(first + n) * _LINK.size], cut)   # chains spawned alike: one SpawnChain
        chain = shared.get(raw)
        if chain is None:
            chain = shared[raw] = SpawnChain(tuple((sites[site], _spawner(merger.names, spawners, spawner), creator)
                                                   for site, spawner, creator in _LINK.iter_unpack(raw[0])), bool(cut))
        found[address] = (chain, copied.capacity)
    return found

def _spawner(names, seen: dict, address: int) -> str:
    text = seen.get(address)
    if text is None:
        text = seen[address] = names.string(address) or "?"
    return text

