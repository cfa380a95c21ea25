"""Shorter module ids for tokens, checked at decode: what a check of the
return addresses would be worth (issue 29; design.md, "Issue 29, second
round").  Nothing here is in btcore: it measures a design not built.

A token's module is named by 32 bits of its build-id because a decoder
without the module's file must not name frames from another file that
shares a shorter prefix (design.md, "Why not fewer").  A decoder that has
a candidate file could check the token's return addresses against its
code: a return address follows a call instruction.  This prints
  - for a few loaded libraries, the share of random offsets of .text that
    the check would pass (how strong it is against a wrong file);
  - for every non-exact native frame of bench_codec.py's traces, whether
    the check passes on its own module's file (it must, always);
  - each trace's characters per frame now, and with a prefix of
    32 - 5 min(k, 3) bits for a module with k distinct return addresses
    in the token (the bound of 32 bits kept at ~5 bits a checked address).
x86-64 only (the check decodes E8 rel32 and FF /2 calls).  Needs pyelftools
and the installed btcore; the showcase rows need gevent.
Usage: python benchmarks/token_ids.py
"""
import collections
import math
import platform
import random

from elftools.elf.elffile import ELFFile

import btcore
from btcore import codec

import bench_codec

SAMPLES = 100000
BITS_PER_CHECKED_ADDRESS = 5
MAX_CHECKED = 3


def operand_length(code: bytes, at: int) -> int:
    """Bytes of a ModRM operand starting at code[at] (64-bit mode)."""
    modrm = code[at]
    mod, rm = modrm >> 6, modrm & 7
    length = 1
    base = None
    if mod != 3 and rm == 4:   # a SIB byte
        length += 1
        base = code[at + 1] & 7
    if mod == 0 and (rm == 5 or base == 5):
        length += 4
    elif mod == 1:
        length += 1
    elif mod == 2:
        length += 4
    return length


def ends_a_call(code: bytes, end: int) -> bool:
    """Whether the bytes before code[end] are a call: E8 rel32, or FF /2
    (with a REX or notrack prefix) whose operand ends at end."""
    if end >= 5 and code[end - 5] == 0xE8:
        return True
    for start in range(max(end - 9, 0), end - 1):
        if code[start] != 0xFF or (code[start + 1] >> 3) & 7 != 2:
            continue
        if start + 1 + operand_length(code, start + 1) == end:
            return True
    return False


class Text:
    """A file's .text, by module-relative address."""

    def __init__(self, path: str):
        with open(path, "rb") as f:
            section = ELFFile(f).get_section_by_name(".text")
            self.code, self.start = section.data(), section["sh_addr"]

    def passes(self, vaddr: int) -> bool | None:
        """The check for a return address; None outside .text."""
        at = vaddr - self.start
        return ends_a_call(self.code, at) if 9 <= at <= len(self.code) else None


def random_offsets(path: str) -> float:
    text = Text(path)
    rng = random.Random(1)
    return sum(ends_a_call(text.code, rng.randrange(9, len(text.code))) for _ in range(SAMPLES)) / SAMPLES


def native_items(bt) -> list:
    """(flags, (build-id prefix, path), vaddr) of the frames in a module."""
    return [item for item in codec._items(bt) if len(item) == 3 and item[1] is not None]


def projected_chars(bt) -> int:
    """The token's length with each module's prefix shortened by its checks."""
    addresses = collections.defaultdict(set)
    for flags, key, vaddr in native_items(bt):
        addresses[key].update(() if flags & codec.F_EXACT else (vaddr,))
    saved = sum(BITS_PER_CHECKED_ADDRESS * min(len(a), MAX_CHECKED) for a in addresses.values())
    token = bt.encode()
    return len(codec.PREFIX) + math.ceil((6 * (len(token) - len(codec.PREFIX)) - saved) / 6)


def main():
    if platform.machine() != "x86_64":
        print("token_ids: the call check is written for x86-64 only")
        return
    merged, native, release = bench_codec.showcase_stacks()
    rows = dict((name, [bt]) for name, bt in bench_codec.traces().items())
    if merged is not None:
        rows.update({"showcase merged": merged, "showcase native-only": native})
    modules = {m.build_id[:codec.BUILD_ID_BYTES]: m.path for m in codec.loaded_modules()}
    print("random offsets of .text that end a call:")
    for path in sorted({modules[key[0]] for bts in rows.values() for bt in bts for _, key, _ in native_items(bt)}):
        print(f"  {random_offsets(path):6.2%}  {path}")
    texts, outcome = {}, collections.Counter()
    for bts in rows.values():
        for bt in bts:
            for flags, key, vaddr in native_items(bt):
                path = modules[key[0]]
                text = texts.setdefault(path, Text(path))
                outcome["exact (not checked)" if flags & codec.F_EXACT else text.passes(vaddr)] += 1
    print(f"return addresses of the traces: {dict(outcome)} (True: the check passes)")
    print(f"\n{'trace':<28} {'chars/frame':>11} {'checked ids':>11}")
    for name, bts in rows.items():
        frames = sum(len(bt) for bt in bts)
        now, then = sum(len(bt.encode()) for bt in bts), sum(projected_chars(bt) for bt in bts)
        print(f"{name:<28} {now / frames:>11.2f} {then / frames:>11.2f}")
    if release:
        release()


if __name__ == "__main__":
    main()
