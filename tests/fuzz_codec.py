#!/usr/bin/env python3
"""Fuzz the codec: btcore.decode() of mutated and random tokens must raise
ValueError or decode, nothing else, no crash, no hang; the C encoder
(Backtrace.encode()) of random backtraces must write the reference
encoder's token (codec._encode()), bit for bit, and that token must decode
to the same frames.

    python tests/fuzz_codec.py [COUNT] [--seed N] [--encoder COUNT]

Decoder seeds are real tokens (merged, native-only, Python-only, with an
append join, of a library not loaded here, deep repetitive ones that hold
copies; format 2 and 3 tokens of the first two, the formats still read)
taken here; each input is a seed
with random bit flips, byte insertions/deletions, truncation, a splice of
two seeds, or random bytes, re-encoded as a token (so the body is valid
base64 and the decoder itself is exercised), plus some raw text mutations
of the token string.  Decoded backtraces are also resolved (frames()).
Encoder inputs are backtraces of random records: pcs of real frames, inside
loaded modules, in none, 0 and 2^64 - 1; code objects (some with names that
are not UTF-8) at random instruction offsets; random flags; a third of them
a few runs repeated with changes, for the copy search.
tests/test_codec.py runs 100 000 and 20 000; a million takes about ten
times as long.
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
from btcore.capture.backtrace import KIND_NATIVE, KIND_PYTHON, RECORD, Backtrace, _new
from btcore.symbols.resolve import resolve_python

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
    backtraces = (merged, btcore.collect(python=False), btcore.collect(native=False), joined)
    tokens = [bt.encode() for bt in backtraces] + [token_from_a_file(path=True), token_from_a_file(path=False)]
    tokens += [repetitive().encode(), repetitive(python=False).encode()]   # copies
    return tokens + [codec._encode(bt, version=v) for v in (2, 3) for bt in backtraces[:2]]   # formats still read


def repetitive(**kw):
    """A backtrace 12 levels deep in Python -> sorted() (C) -> Python."""
    got = []

    def level(n):
        return sorted([n], key=lambda item: level(n - 1) if n else got.append(btcore.collect(capacity=256, **kw)))

    level(12)
    return got[0]


def token_from_a_file(path: bool) -> str:
    """A token of frames in functions of a library this process has not
    loaded: decoding names them from the file (btc_file_symbol, DWARF),
    found at the path the token names, or by the search."""
    from elftools.elf.elffile import ELFFile
    loaded = {os.path.realpath(m.path) for m in codec.loaded_modules()}
    candidates = [os.path.realpath(os.path.join(LIBDIR, name)) for name in sorted(os.listdir(LIBDIR))
                  if name.startswith(("libsqlite3.so", "libexpat.so", "libbz2.so", "liblzma.so", "libffi.so"))]
    found = next(p for p in candidates if p not in loaded and codec.file_build_id(p))
    with open(found, "rb") as f:
        symbols = ELFFile(f).get_section_by_name(".dynsym").iter_symbols()
        starts = sorted(s["st_value"] for s in symbols if s["st_info"]["type"] == "STT_FUNC" and s["st_value"])
    key = (codec.file_build_id(found)[:codec.BUILD_ID_BYTES], found if path else None)
    return codec.token(False, [(0, key, start + 5) for start in starts[:8]])


def body(token: str) -> bytearray:
    text = token[5:]
    return bytearray(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def as_token(data: bytes, prefix: str = codec.PREFIX) -> str:
    return prefix + base64.urlsafe_b64encode(bytes(data)).rstrip(b"=").decode()


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
        text[rng.randrange(len(text))] = rng.choice("AZaz09-_.*=btc123 ")
        return "".join(text)
    return as_token(data, token[:5])   # the seed's format


# ---- the C encoder against the reference ----

MARKS = btcore.capture.backtrace.F_JOIN | codec.F_EXACT   # the flags a token keeps
JOIN = btcore.capture.backtrace.F_JOIN
FLAGS = (0, 0, 0, JOIN, codec.F_EXACT, codec.F_EXACT | JOIN, 2, 4, 16, 32)


def encoder_pools() -> tuple:
    """(pcs, code objects): what random backtraces are made of."""
    pcs = set()
    for bt in (btcore.collect(python=False), json.loads('{"a": 1}', object_hook=lambda o: btcore.collect())):
        pcs.update(addr for addr, _, kind, _, _ in RECORD.iter_unpack(bt._raw) if kind == KIND_NATIVE)
    rng = random.Random(0)
    for m in codec.loaded_modules():
        pcs.update(m.lo + rng.randrange(max(m.hi - m.lo, 1)) for _ in range(4))
    pcs.update((0, 1, 2, 0x1000, (1 << 64) - 1, 1 << 63, 0xffffffffff600000))
    codes = [f.__code__ for f in (seeds, mutate, json.loads, json.dumps, random.Random.randrange, os.path.join)]
    codes += [codes[0].replace(co_qualname="caf\xe9.\u2603<lambda>", co_filename="/tmp/\u00fcber pfad.py"),
              codes[1].replace(co_qualname="lone\udc80surrogate"),   # the C encoder hands it over
              codes[2].replace(co_filename=""), codes[3].replace(co_qualname="x" * 300)]
    return sorted(pcs), codes


def random_record(rng: random.Random, pcs: list, codes: list) -> bytes:
    flags = rng.choice(FLAGS)
    if rng.random() < 0.35:
        code = rng.choice(codes)
        lasti = rng.choice((-1, 0, 2, rng.randrange(len(code.co_code) + 8)))
        return RECORD.pack(id(code), lasti, KIND_PYTHON, flags & ~codec.F_EXACT, 0)
    pc = rng.choice(pcs) if rng.random() < 0.8 else rng.choice(pcs) + rng.randrange(-64, 64)
    return RECORD.pack(pc % (1 << 64), -1, KIND_NATIVE, flags, 0)


def random_backtrace(rng: random.Random, pcs: list, codes: list) -> Backtrace:
    """Random records; a third of the backtraces are a few random runs
    repeated with changes (what recursion leaves), for the copy search:
    several earlier runs to choose from, of different lengths."""
    raw = bytearray()
    if rng.random() < 0.33:
        runs = [[random_record(rng, pcs, codes) for _ in range(rng.randrange(1, 8))] for _ in range(3)]
        for _ in range(rng.randrange(2, 30)):
            for record in rng.choice(runs):
                raw += record if rng.random() < 0.95 else random_record(rng, pcs, codes)
    else:
        for _ in range(rng.choice((0, 1, 2, 5, 20, 40, 120))):
            raw += random_record(rng, pcs, codes)
    by_address = {id(c): c for c in codes}
    refs = [by_address[r[0]] for r in RECORD.iter_unpack(raw) if r[2] == KIND_PYTHON]
    bt = _new(Backtrace)
    bt._capacity, bt._raw, bt._refs, bt.truncated = max(len(raw) // 16, 1), raw, tuple(refs), rng.random() < 0.2
    return bt


def backtrace_from_bytes(data: bytes, pcs: list, codes: list) -> Backtrace:
    """A backtrace of a record per 4 bytes (for coverage-guided fuzzing,
    ci/fuzz.py): byte 0 picks Python or native and the flags, bytes 1-3
    the pc (of the pool, plus a small offset) or the code object and its
    offset."""
    raw, refs = bytearray(), []
    for at in range(1, len(data) - 3, 4):
        head, a, b, c = data[at:at + 4]
        flags = FLAGS[(head >> 1) % len(FLAGS)]
        if head & 1:
            code = codes[a % len(codes)]
            refs.append(code)
            raw += RECORD.pack(id(code), (b << 8 | c) - 2, KIND_PYTHON, flags & ~codec.F_EXACT, 0)
        else:
            raw += RECORD.pack((pcs[(a << 8 | b) % len(pcs)] + c - 128) % (1 << 64), -1, KIND_NATIVE, flags, 0)
    bt = _new(Backtrace)
    bt._capacity, bt._raw, bt._refs, bt.truncated = max(len(raw) // 16, 1), raw, tuple(refs), bool(data[:1] == b"t")
    return bt


def check_encoder(rng: random.Random, pcs: list, codes: list) -> None:
    if rng.random() < 0.01:
        codec.lib.btc_encode_forget(1, 1)   # a cold encoder: modules taught again, lines looked up
    check_backtrace(random_backtrace(rng, pcs, codes))


def check_backtrace(bt: Backtrace) -> None:
    """The C encoder's token is the reference's and decodes to the same records."""
    token = bt.encode()
    assert token == codec._encode(bt), "the C encoder differs from the reference"
    decoded = btcore.decode(token)
    assert (len(decoded), decoded.truncated) == (len(bt), bt.truncated)
    assert [r[3] & MARKS for r in RECORD.iter_unpack(decoded._raw)] == [r[3] & MARKS for r in RECORD.iter_unpack(bt._raw)]
    assert decoded.encode() == token, "a decoded token encodes to another token"
    python = iter(bt._refs)
    python = [resolve_python(next(python), r[1])[0] for r in RECORD.iter_unpack(bt._raw) if r[2] == KIND_PYTHON]
    assert [(f.function, f.file, f.line) for f in python] == \
        [(r.function, r.file, r.line) for r in decoded._refs if isinstance(r, codec.DecodedPython)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("count", type=int, nargs="?", default=100000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--encoder", type=int, default=20000, help="random backtraces encoded")
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
    pcs, codes = encoder_pools()
    t0 = time.perf_counter()
    for i in range(args.encoder):
        check_encoder(random.Random(args.seed * 1000003 + i), pcs, codes)
    print(f"{args.encoder} random backtraces encoded in {time.perf_counter() - t0:.1f} s: "
          f"the C encoder equals the reference, every token decodes to the same frames")
    return 0


if __name__ == "__main__":
    sys.exit(main())
