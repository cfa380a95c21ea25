#!/usr/bin/env python3
"""Fuzz the core-file reader (native/symbols/elf_core.c over elf.c's program
headers and note walker): a core made of garbage must give a refusal or
counts and entries within the room given, never a crash or a read past a
note.  The build-id reader (btc_elf_file_build_id) reads the same headers
and notes: it is fed each input too.

tiny_core() builds a well-formed x86-64 core: an ELF header, a PT_NOTE
segment with NT_PRSTATUS (two threads), NT_FILE and NT_AUXV notes, and a
PT_LOAD segment; mutate() corrupts one (header fields, note sizes and
counts, bytes anywhere, a truncation).

    python tests/fuzz_core.py [COUNT] [--seed N]

ci/fuzz.py runs check() coverage-guided (its "core" target);
tests/test_elf_reader.py runs COUNT seeded mutations in a child process.
"""
import argparse
import os
import random
import struct
import sys

from btcore._native import ffi, lib

LOAD_VADDR = 0x7f0000000000
# NT_FILE's description is 98 bytes: 2 bytes of padding before the next note
FILES = [(0x400000, 0x401000, 0, b"/usr/bin/python3"), (0x7f0000001000, 0x7f0000003000, 2, b"/lib64/libc.so.6")]
THREADS = [(4242, 0x401234, 0x7ffc0000, 0x7ffc0100, 7), (4243, 0x401250, 0x7ffd0000, 0x7ffd0100, 9)]
VDSO = 0x7fff00000000
ROOM = (8, 8, 8, 256)   # segments, threads, files, path bytes


def _note(kind: int, name: bytes, desc: bytes) -> bytes:
    pad = lambda b: b + b"\0" * (-len(b) % 4)
    return struct.pack("<III", len(name), len(desc), kind) + pad(name) + pad(desc)


def _prstatus(tid, ip, sp, bp, bx) -> bytes:
    regs = [0] * 27
    regs[16], regs[19], regs[4], regs[5] = ip, sp, bp, bx
    return bytes(32) + struct.pack("<i", tid) + bytes(112 - 36) + struct.pack("<27Q", *regs) + bytes(8)


def _nt_file() -> bytes:
    head = struct.pack("<QQ", len(FILES), 4096)
    return head + b"".join(struct.pack("<QQQ", lo, hi, pages) for lo, hi, pages, _ in FILES) + \
        b"".join(path + b"\0" for *_, path in FILES)


def tiny_core(threads=THREADS, xnum=False) -> bytes:
    """xnum: the program headers counted as a core with 65 535 or more
    mappings counts them (e_phnum PN_XNUM, the count in section 0's sh_info)."""
    notes = b"".join(_note(1, b"CORE\0", _prstatus(*t)) for t in threads)
    notes += _note(0x46494c45, b"CORE\0", _nt_file())
    notes += _note(6, b"CORE\0", struct.pack("<6Q", 6, 4096, 33, VDSO, 0, 0))   # AT_PAGESZ, AT_SYSINFO_EHDR, AT_NULL
    phoff, nph = 64, 2
    notes_at = phoff + nph * 56
    load_at = notes_at + len(notes)
    load = b"\x7fELF" + bytes(60)
    shoff = load_at + len(load) if xnum else 0
    header = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 4, 62, 1, 0, phoff, shoff, 0, 64, 56,
                                                               0xffff if xnum else nph, 64, 1 if xnum else 0, 0)
    section0 = struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, nph, 0, 0) if xnum else b""
    phdrs = struct.pack("<IIQQQQQQ", 4, 0, notes_at, 0, 0, len(notes), 0, 4)
    phdrs += struct.pack("<IIQQQQQQ", 1, 5, load_at, LOAD_VADDR, 0, len(load), 0x1000, 0x1000)
    return header + phdrs + notes + load + section0


def seeds() -> list:
    return [tiny_core(), tiny_core(THREADS[:1]), tiny_core([]), tiny_core(xnum=True)]


def mutate(rng: random.Random, core: bytes) -> bytes:
    data = bytearray(core)
    for _ in range(rng.randint(1, 8)):
        kind = rng.randrange(4)
        if kind == 0:    # a header or program-header field
            at = rng.randrange(0, 176, 2)
            data[at:at + 2] = rng.choice([b"\0\0", b"\xff\xff", b"\x00\x80", rng.randbytes(2)])
        elif kind == 1:  # a word in the notes (sizes, counts, page size, offsets)
            at = rng.randrange(176, max(177, len(data) - 8), 4)
            data[at:at + 8] = rng.choice([bytes(8), b"\xff" * 8, struct.pack("<Q", rng.randrange(1 << 32)),
                                          struct.pack("<Q", 1 << 63)])
        elif kind == 2:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif len(data) > 1:
            del data[rng.randrange(1, len(data)):]
    return bytes(data[:len(core) + 64])


def read(fd: int, room=ROOM):
    """(rc, btc_core, the arrays it points into) of the core open as fd."""
    c = ffi.new("btc_core *")
    keep = [ffi.new("btc_core_segment[]", room[0]), ffi.new("btc_core_thread[]", room[1]),
            ffi.new("btc_core_file[]", room[2]), ffi.new("char[]", room[3])]
    c.segments, c.threads, c.files, c.paths = keep
    c.max_segments, c.max_threads, c.max_files, c.paths_size = room
    return lib.btc_core_read(fd, c), c, keep


def check(data: bytes) -> None:
    """Read the bytes as a core file and as an ELF file's build-id: every result within its bound."""
    fd = os.memfd_create("btcore-fuzz-core")
    try:
        os.write(fd, data)
        rc, c, _keep = read(fd)
        assert rc in (0, -1, -2, -3), rc
        if rc == 0:
            assert 0 <= c.nsegments <= ROOM[0] and 0 <= c.nthreads <= ROOM[1] and 0 <= c.nfiles <= ROOM[2]
            assert c.paths_used <= ROOM[3]
            for e in c.files[0:c.nfiles]:
                assert e.path_at < c.paths_used
                ffi.string(c.paths + e.path_at, c.paths_used - e.path_at)
        if rc == 0:   # too little room: the same counts, nothing written past the room given
            small, c2, _keep2 = read(fd, (1, 1, 1, 8))
            assert small in (0, -3) and (c2.nsegments, c2.nthreads, c2.nfiles, c2.paths_used) == \
                (c.nsegments, c.nthreads, c.nfiles, c.paths_used)
        out = ffi.new("uint8_t[32]")
        n = lib.btc_elf_file_build_id(fd, out, len(out))
        assert n >= -1, n
    finally:
        os.close(fd)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("count", type=int, nargs="?", default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    for s in seeds():
        check(s)
    for _ in range(args.count):
        check(mutate(rng, rng.choice(seeds())))
    print(f"fuzz_core: {args.count} cores, every result within its bounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
