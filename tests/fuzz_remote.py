#!/usr/bin/env python3
"""Fuzz the remote readers: a target's memory made of garbage, walked as a
dump walks it (the gc lists, greenlets' states, which saved stacks to copy,
their frame chains (with 3.11's table and as 3.14's are walked), code objects, names, line tables), must
give results within the bounds (btcore/remote/bounds.py, native/remote/) and
nothing else: no crash, no exception, no hang.

An image is the bytes of a target's memory at BASE (read as a core file's
segment is), laid out as CPython 3.11 and greenlet lay them out: gc list
heads at BASE, then greenlet objects, their C++ objects' StackStates, frame
objects, interpreter frames, code objects, their names and line tables,
and a span of "stack" the StackStates point into.  seed() builds a
well-formed one; mutate() corrupts one (words set to sentinels or to other
objects' addresses, bytes flipped, a truncation).

    python tests/fuzz_remote.py [COUNT] [--seed N]

ci/fuzz.py runs check() coverage-guided (its "remote" target);
tests/test_hostile_dump.py runs COUNT seeded mutations in a child process.
"""
import argparse
import contextlib
import os
import random
import struct
import sys

from btcore.remote import bounds

from btcore.remote import greenlet_offsets
from btcore._native import ffi, lib
from btcore.capture.records import PYFRAME
from btcore.remote.snapshot import Memory

BASE = 0x7f1200000000
SIZE = 1 << 16
STACK = (BASE + 0xc000, BASE + SIZE)   # the span greenlets' stacks lie in: the image's "thread stack"
NHEADS = 4
GREENLET_TYPE, FRAME_TYPE, CODE_TYPE = BASE + 0x100, BASE + 0x200, BASE + 0x300
LAY = ffi.new("btc_remote_layout *")   # the one layout table (native/remote/pylayout.c)
lib.btc_remote_layout_of(0x030B07F0, LAY)
# The same image walked as a 3.14 target's frames are walked: no entry flag, shims (owner 3 and up), tagged
# code references, the links greenlet saves in a frame object (here wherever its spare storage would be).
# Spawn tracking's records (native/remote/rspawn.c): their types, and the layout the target's export describes
RECORD_TYPE, TUPLE_TYPE, BYTEARRAY_TYPE, BACKTRACE_TYPE = BASE + 0x340, BASE + 0x360, BASE + 0x380, BASE + 0x3a0
TRUE, ELLIPSIS = BASE + 0x3c0, BASE + 0x3e0
SPAWN = {"record_size": 56, "record_object": 16, "record_site": 24, "record_spawner": 32, "record_parent": 40,
         "record_next": 48, "object_type": 8, "var_size": 16, "tuple_items": 24, "bytearray_start": 24,
         "backtrace_raw": 16, "backtrace_truncated": 24, "generations": 8, "capacity": 64}
LAY_SHIMS = ffi.new("btc_remote_layout *", LAY[0])
LAY_SHIMS.frame_is_entry, LAY_SHIMS.shim_owner, LAY_SHIMS.executable_tag_bits = -1, 3, 3
LAY_SHIMS.frame_object_data, LAY_SHIMS.code_type = 32, CODE_TYPE
PIMPL, STATE, TOP_FRAME = greenlet_offsets.local()
_W = struct.Struct("<Q")


def _sample_code():
    def sample(x):
        y = x + 1
        return y * 2
    return sample.__code__


class _Image:
    def __init__(self):
        self.data, self.at = bytearray(SIZE), 0x400

    @classmethod
    def of(cls, image: bytes):
        img = cls()
        img.data[:] = image
        return img

    def new(self, size):
        at, self.at = self.at, (self.at + size + 15) & ~15
        return BASE + at

    def put(self, addr, *words):
        for i, w in enumerate(words):
            _W.pack_into(self.data, addr - BASE + 8 * i, w)

    def put_bytes(self, addr, raw):
        self.data[addr - BASE: addr - BASE + len(raw)] = raw


def _string(img, text):
    obj = img.new(LAY.ascii_data + len(text) + 1)
    img.put(obj + LAY.unicode_length, len(text))
    img.put(obj + LAY.unicode_state, 0xE4)   # ready, ascii, compact, kind 1
    img.put_bytes(obj + LAY.ascii_data, text.encode())
    return obj


def _code(img, sample):
    table = img.new(LAY.bytes_data + len(sample.co_linetable) + 1)
    img.put(table + LAY.bytes_size, len(sample.co_linetable))
    img.put_bytes(table + LAY.bytes_data, sample.co_linetable)
    code = img.new(LAY.code_adaptive + len(sample.co_code))
    img.put(code + 8, CODE_TYPE)
    img.put(code + 16, len(sample.co_code) // 2)
    img.put(code + LAY.code_qualname, _string(img, sample.co_qualname))
    img.put(code + LAY.code_filename, _string(img, sample.co_filename))
    img.put(code + LAY.code_linetable, table)
    struct.pack_into("<i", img.data, code + LAY.code_firstlineno - BASE, sample.co_firstlineno)
    return code


def seed(greenlets=3, depth=2) -> bytes:
    """A well-formed image: greenlets in the first gc list, each suspended
    with `depth` Python frames of one code object and part of its stack
    saved (the third all of it)."""
    img, sample = _Image(), _sample_code()
    code = _code(img, sample)
    heads = [BASE + 24 * i for i in range(NHEADS)]
    for h in heads:
        img.put(h, h, h)   # empty lists
    prev = heads[0]
    for i in range(greenlets):
        frames = 0
        for k in range(depth):
            iframe = img.new(80)
            img.put(iframe + LAY.frame_executable, code)
            img.put(iframe + LAY.frame_previous, frames)
            img.put(iframe + LAY.frame_instr_ptr, code + LAY.code_adaptive + 2 * (k + 1))
            img.data[iframe - BASE + LAY.frame_is_entry] = int(k == 0)
            frames = iframe
        frame_object = img.new(64)
        img.put(frame_object + 8, FRAME_TYPE)
        img.put(frame_object + LAY.frame_object_f_frame, frames)
        pimpl = img.new(max(STATE, TOP_FRAME) + 32)   # all a dump reads of it: the heap copy lies apart
        start = STACK[0] + 0x800 * i
        size, saved = (0x100, 0x100) if i == 2 else (0x400, 0x80)   # the third saved whole, the others in part
        copy = img.new(saved)
        img.put(pimpl + STATE, start, start + size, copy, saved)
        img.put(pimpl + TOP_FRAME, frame_object)
        gc_head = img.new(16 + 48)
        g = gc_head + 16
        img.put(g + 8, GREENLET_TYPE)
        img.put(g + PIMPL, pimpl)
        img.put(prev, gc_head)         # prev._gc_next
        img.put(gc_head + 8, prev)     # _gc_prev
        prev = gc_head
    img.put(prev, heads[0])
    img.put(heads[0] + 8, prev)
    _spawn_records(img, [gc + 16 for gc in _gc_list(img, heads[0])])
    return bytes(img.data)


def _gc_list(img, head) -> list:
    out, at = [], _W.unpack_from(img.data, head - BASE)[0]
    while at != head:
        out.append(at)
        at = _W.unpack_from(img.data, at - BASE)[0]
    return out


def _spawn_records(img, greenlets) -> None:
    """A live list at SPAWN_HEAD of one record per greenlet: two sites (one truncated), each chain two
    generations deep (a record, then a tuple copy ending in Ellipsis), as spawn.c keeps them."""
    sites = []
    for i, frames in enumerate((3, 2)):
        raw = img.new(32 + 16 * frames)
        img.put(raw + 8, BYTEARRAY_TYPE, 16 * frames, raw + 32)
        for k in range(frames):
            img.put(raw + 32 + 16 * k, 0x400000 + k, 0)
        bt = img.new(32)
        img.put(bt + 8, BACKTRACE_TYPE, raw, TRUE if i else 0)
        sites.append(bt)
    spawner = _string(img, "<Greenlet spawner>")
    older = img.new(48)
    img.put(older + 8, TUPLE_TYPE, 3, sites[1], spawner, ELLIPSIS)
    head = SPAWN_HEAD
    img.put(head + SPAWN["record_next"], head)
    prev = head
    for i, g in enumerate(greenlets):
        r = img.new(SPAWN["record_size"])
        img.put(r + 8, RECORD_TYPE, g, sites[i % 2], spawner, older, head)
        img.put(prev + SPAWN["record_next"], r)
        prev = r


SPAWN_HEAD = BASE + 0x80   # the live list's head: a record-sized span between the gc heads and the types


def mutate(rng: random.Random, image: bytes) -> bytes:
    data = bytearray(image)
    for _ in range(rng.choice((1, 1, 2, 4, 16))):
        at = rng.randrange(0, len(data) - 8) & ~7
        kind = rng.randrange(4)
        if kind == 0:     # a sentinel
            _W.pack_into(data, at, rng.choice([0, (1 << 64) - 1, 1 << 63, (1 << 64) - 16, 0x7ffff000,
                                               _W.unpack_from(data, at)[0] + rng.choice((1, 3, 8, 0x7ffff000))]
                                              ) & ((1 << 64) - 1))
        elif kind == 1:   # another place of the image (a link to anything, a loop)
            _W.pack_into(data, at, BASE + (rng.randrange(len(data)) & ~rng.choice((0, 7))))
        elif kind == 2:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        else:
            _W.pack_into(data, at, rng.getrandbits(64))
    if rng.random() < 0.05:
        del data[rng.randrange(1, len(data)):]
    return bytes(data)


def check(image: bytes) -> None:
    """Walk the image as a dump walks a target; assert every result is within its bound."""
    if len(image) < 8:
        return
    with _memory(image) as memory:
        _walk(memory)


@contextlib.contextmanager
def _memory(image: bytes):
    """The image as a target's memory (a core file's segment at BASE)."""
    fd = os.memfd_create("btcore-fuzz-remote")
    keep = os.fdopen(fd, "wb")
    keep.write(image)
    keep.flush()
    memory = Memory(lib.btc_rmem_open_segments(), [keep])
    try:
        lib.btc_rmem_add_segment(memory.handle, BASE, len(image), fd, 0)
        yield memory
    finally:
        memory.close()


def read_spawn(image: bytes) -> tuple:
    """(chains [(object, [(site, spawner)], cut)], sites [(first pcs, truncated, read)]) the image's
    spawn records give (for a test of the seed's)."""
    with _memory(image) as memory:
        out, _ = _spawn_chains(memory)
        chains = [(c.object, [(link.site, link.spawner) for link in out.links[c.first:c.first + c.n]], bool(c.cut))
                  for c in out.chains[0:out.nchains]]
        sites = [([f.addr for f in out.frames[s.first:s.first + s.n]], bool(s.truncated), bool(s.read))
                 for s in out.sites[0:out.nsites]]
    return chains, sites


def read_greenlets(image: bytes) -> list:
    """[(bad, copied, saved whole, Python frames)] of the image's suspended greenlets, read as a dump reads a
    target's (for a test of the seed's)."""
    with _memory(image) as memory:
        return _walk(memory)


def _walk(memory: Memory) -> list:
    """Walk memory as a dump walks a target's, checking each bound; returns read_greenlets()'s list (the
    frames as 3.11's table walks them)."""
    most = 64
    heads = ffi.new("uintptr_t[]", [BASE + 24 * i for i in range(NHEADS)])
    found, visited, broken = ffi.new("uintptr_t[]", most), ffi.new("uint64_t *"), ffi.new("int *")
    n = lib.btc_remote_gc_instances(memory.handle, heads, NHEADS, GREENLET_TYPE, found, most, visited, broken)
    assert -1 <= n <= most and visited[0] <= lib.BTC_REMOTE_MAX_OBJECTS and 0 <= broken[0] <= NHEADS
    n = most if n < 0 else n
    states = ffi.new("btc_remote_greenlet[]", max(n, 1))
    kept = lib.btc_remote_greenlet_states(memory.handle, found, n, ffi.new("size_t[3]", (PIMPL, STATE, TOP_FRAME)),
                                          states)
    assert 0 <= kept <= n
    budget = 0x200
    total = lib.btc_remote_greenlet_fit(states, kept, ffi.new("uintptr_t[]", [STACK[0]]),
                                        ffi.new("uintptr_t[]", [STACK[1]]), 1, budget)
    assert total <= budget
    assert total == sum(g.saved for g in states[0:kept] if not g.bad)
    spill = ffi.new("uint8_t[]", max(total, 1))
    room = 64 * kept + 64
    frames = ffi.new("btc_remote_pyframe[]", room)
    names = bounds.Names(memory, LAY, bounds.Types(code=CODE_TYPE), budget=1 << 16)
    maps = ffi.new("uintptr_t[]", [STACK[0]]), ffi.new("uintptr_t[]", [STACK[1]]), 1
    read = []
    for lay in (LAY, LAY_SHIMS):
        nframes = lib.btc_remote_greenlet_copies(memory.handle, lay, states, kept, spill, total, frames, room, *maps)
        read = read or [(g.bad, g.copied, g.start + g.saved == g.stop, g.nframes) for g in states[0:kept]]
        assert 0 <= nframes <= room
        for g in states[0:kept]:
            assert g.bad in (0, lib.BTC_REMOTE_BAD_UNREADABLE, lib.BTC_REMOTE_BAD_INCONSISTENT,
                             lib.BTC_REMOTE_BAD_SKIPPED, lib.BTC_REMOTE_BAD_FRAME)
            assert 0 <= g.frames_at and g.frames_at + g.nframes <= nframes
            chain = [(f.code, f.lasti) for f in frames[g.frames_at: g.frames_at + g.nframes]]
            assert all(code for code, _ in chain[:-1]), "a cut marker inside a chain"
            _name(names, chain)
        _stacks(states, kept, spill, total, frames, nframes)
    assert names.left > -(bounds.MAX_LINETABLE + 2 * 4 * bounds.MAX_STRING)
    _spawn_chains(memory)
    return read


def _stacks(states, kept: int, spill, total: int, frames, nframes: int) -> None:
    """The walk's input filled from garbage states (btc_remote_greenlet_stacks): every copy it points at lies
    in spill, every Python-frame range in the frames walked, every greenlet left to the caller is one."""
    stacks, left = ffi.new("btc_remote_stack[]", max(kept, 1)), ffi.new("int32_t[]", max(kept, 1))
    rows = ffi.new("int32_t[]", list(range(kept)) or [0])
    nleft = lib.btc_remote_greenlet_stacks(states, rows, kept, spill, total, frames, nframes, 1, stacks, left)
    assert 0 <= nleft <= kept and all(0 <= i < kept for i in left[0:nleft])
    lo, py = int(ffi.cast("uintptr_t", spill)), int(ffi.cast("uintptr_t", frames))
    for st in stacks[0:kept]:
        at = int(ffi.cast("uintptr_t", st.copy))
        assert st.size == 0 or lo <= at and at + st.size <= lo + total
        first = (int(ffi.cast("uintptr_t", st.py)) - py) // PYFRAME.size if st.npy else 0
        assert 0 <= first and first + st.npy <= nframes
    stale = ffi.new("btc_remote_greenlet[]", max(kept, 1))   # rows of another stop: past these buffers' ends
    ffi.memmove(stale, states, ffi.sizeof(stale))
    for g in stale[0:kept]:
        g.spill_at, g.frames_at = total + 1 - (g.saved > 0), nframes - g.nframes + 1
    stacks = ffi.new("btc_remote_stack[]", max(kept, 1))
    lib.btc_remote_greenlet_stacks(stale, rows, kept, spill, total, frames, nframes, 1, stacks, left)
    assert all(st.size == 0 and st.npy == 0 for st in stacks[0:kept])


def _spawn_chains(memory: Memory) -> None:
    """The records of the image read as a dump reads a target's: within the room given, every index in
    bounds, each chain at most the generations the export says."""
    x = ffi.new("btc_spawn_export *", dict(SPAWN, magic=lib.BTC_SPAWN_EXPORT_MAGIC, live=SPAWN_HEAD,
                                             record_type=RECORD_TYPE, tuple_type=TUPLE_TYPE,
                                             bytearray_type=BYTEARRAY_TYPE, backtrace_type=BACKTRACE_TYPE,
                                             true_object=TRUE, ellipsis=ELLIPSIS))
    room = {"chains": 8, "links": 12, "sites": 2, "frames": 8}
    types = {"chains": "btc_remote_chain", "links": "btc_remote_link", "sites": "btc_remote_site", "frames": "btc_frame"}
    keep = {part: ffi.new(f"{types[part]}[]", n) for part, n in room.items()}
    out = ffi.new("btc_remote_spawn_out *", {**keep, **{"max_" + part: n for part, n in room.items()}})
    assert lib.btc_remote_spawn_chains(memory.handle, x, out) in (0, -1)
    assert 0 <= out.nchains <= 8 and 0 <= out.nlinks <= 12 and 0 <= out.nsites <= 2 and 0 <= out.nframes <= 8
    for c in out.chains[0:out.nchains]:
        assert 0 <= c.n <= SPAWN["generations"] and 0 <= c.first and c.first + c.n <= out.nlinks
    assert all(0 <= link.site < out.nsites for link in out.links[0:out.nlinks])
    assert all(0 <= s.first and s.first + s.n <= out.nframes for s in out.sites[0:out.nsites])
    return out, keep


def _name(names: bounds.Names, chain: list) -> None:
    for code, lasti in chain:
        if not code:
            assert bounds.cut_reason(lasti)
            continue
        named = names.code(code)
        assert named.qualname is None or len(named.qualname) <= bounds.MAX_STRING
        assert named.units <= bounds.MAX_CODE_UNITS
        number = bounds.line(named, lasti)
        assert number is None or isinstance(number, int)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("count", type=int, nargs="?", default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    seeds = [seed(), seed(greenlets=1, depth=1), seed(greenlets=6, depth=4)]
    for s in seeds:
        check(s)
    for _ in range(args.count):
        check(mutate(rng, rng.choice(seeds)))
    print(f"fuzz_remote: {args.count} images, every result within its bounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
