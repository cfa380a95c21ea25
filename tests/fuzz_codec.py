#!/usr/bin/env python3
"""Fuzz btcore.decode(): mutated and random tokens must raise ValueError or
decode; nothing else, no crash, no hang.

    python tests/fuzz_codec.py [COUNT] [--seed N]

Seeds are real tokens (merged, native-only, Python-only, with an append
join) taken here; each input is a seed with random bit flips, byte
insertions/deletions, truncation, a splice of two seeds, or random bytes,
re-encoded as a token (so the body is valid base64 and the decoder itself is
exercised), plus some raw text mutations of the token string.  Decoded
backtraces are also resolved (frames()).  tests/test_codec.py runs 100 000;
a million takes about ten times as long.
"""
import argparse
import base64
import json
import os
import random
import sys
import time

import btcore
from btcore import codec

def _libc_dir() -> str:
    with open("/proc/self/maps") as maps:
        return next(os.path.dirname(line.split()[-1]) for line in maps if line.rstrip().endswith("/libc.so.6"))


LIBDIR = _libc_dir()   # /lib/x86_64-linux-gnu, /usr/lib/aarch64-linux-gnu, ...


def seeds() -> list:
    def leaf():
        return btcore.collect()

    merged = json.loads('{"a": 1}', object_hook=lambda obj: leaf())
    joined = btcore.Backtrace(256)
    btcore.append(joined, merged)
    btcore.append(joined, btcore.collect(native=False))
    tokens = [bt.encode() for bt in (merged, btcore.collect(python=False), btcore.collect(native=False), joined)]
    return tokens + [token_from_a_file()]


def token_from_a_file() -> str:
    """A token of frames in functions of a library this process has not
    loaded: decoding names them from the file (btc_file_symbol, DWARF)."""
    from elftools.elf.elffile import ELFFile
    loaded = {os.path.realpath(m.path) for m in codec.loaded_modules()}
    candidates = [os.path.realpath(os.path.join(LIBDIR, name)) for name in sorted(os.listdir(LIBDIR))
                  if name.startswith(("libsqlite3.so", "libexpat.so", "libbz2.so", "liblzma.so", "libffi.so"))]
    path = next(p for p in candidates if p not in loaded and codec.file_build_id(p))
    with open(path, "rb") as f:
        symbols = ELFFile(f).get_section_by_name(".dynsym").iter_symbols()
        starts = sorted(s["st_value"] for s in symbols if s["st_info"]["type"] == "STT_FUNC" and s["st_value"])
    key = (codec.file_build_id(path)[:codec.BUILD_ID_BYTES], path)
    w = codec._Writer()
    w.put(0, 1)
    w.varint(1)
    w.put(len(key[0]), 4)
    w.put(int.from_bytes(key[0], "little"), 8 * len(key[0]))
    w.string(path, [])
    items = [(0, key, start + 5) for start in starts[:8]]
    w.varint(len(items))
    codec._FrameWriter(w, {key: 0}, []).frames(items)
    return w.token()


def body(token: str) -> bytearray:
    text = token[5:]
    return bytearray(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def as_token(data: bytes) -> str:
    return "btc1." + base64.urlsafe_b64encode(bytes(data)).rstrip(b"=").decode()


def mutate(rng: random.Random, tokens: list) -> str:
    token = rng.choice(tokens)
    data = body(token)
    how = rng.randrange(8)
    if how == 0:
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif how == 1:
        del data[rng.randrange(len(data)):]
    elif how == 2:
        at = rng.randrange(len(data))
        data[at:at] = rng.randbytes(rng.randint(1, 8))
    elif how == 3:
        at = rng.randrange(len(data))
        del data[at:at + rng.randint(1, 8)]
    elif how == 4:
        other = body(rng.choice(tokens))
        data = data[:rng.randrange(len(data))] + other[rng.randrange(len(other)):]
    elif how == 5:
        data = bytearray(rng.randbytes(rng.randint(0, 64)))
    elif how == 6:
        data[rng.randrange(len(data))] = rng.randrange(256)
    else:
        text = list(token)
        text[rng.randrange(len(text))] = rng.choice("AZaz09-_.*=btc1 ")
        return "".join(text)
    return as_token(data)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("count", type=int, nargs="?", default=100000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    tokens = seeds()
    decoded = refused = 0
    t0 = time.perf_counter()
    for i in range(args.count):
        token = mutate(rng, tokens)
        try:
            btcore.decode(token).frames()
            decoded += 1
        except ValueError:
            refused += 1
        except BaseException:
            print(f"input {i}: {token!r}", file=sys.stderr)
            raise
    elapsed = time.perf_counter() - t0
    print(f"{args.count} inputs in {elapsed:.1f} s: decoded {decoded}, ValueError {refused}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
