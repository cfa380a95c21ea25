"""Compact tokens (btcore/codec.py): Backtrace.encode(), btcore.decode(),
`python -m btcore decode`.

Oracles: the backtrace the encoder resolved itself, in its own process;
addr2line on the fixture's file for native frames decoded in another
process (another load address); the text of the log around each token.
"""
import copy
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from elftools.elf.elffile import ELFFile

import btcore
from btcore import codec

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TIMEOUT = 120


def view(frames):
    """What must survive a round trip, frame by frame."""
    return [(f.kind, f.function, f.file, f.line, f.inlined) for f in frames]


def capture_in_chain(chain, **kw):
    """A merged backtrace taken inside the C++ fixture's callback."""
    got = {}

    def in_callback(tag):
        got["bt"] = btcore.collect(capacity=256, **kw)
        return 0

    chain.call(chain.lib.chain_entry, 1, in_callback)
    return got["bt"]


def run_python(code, *args, stdin=None):
    proc = subprocess.run([sys.executable, "-P", "-c", code, *args], capture_output=True, text=True,
                          input=stdin, timeout=TIMEOUT, cwd=HERE)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


# ---- round trip in one process ----

def test_round_trip_keeps_frames_joins_and_truncation(chain):
    """Guards: a decoded Backtrace resolves to the same frames (kinds, names,
    files, lines, inline chains), the same append() joins and truncation."""
    merged = capture_in_chain(chain)
    spawn_site = btcore.collect(limit=3)
    both = btcore.Backtrace(512)
    btcore.append(both, merged)
    btcore.append(both, spawn_site)
    both.truncated = True
    decoded = btcore.decode(both.encode())
    assert isinstance(decoded, btcore.Backtrace)
    assert view(decoded.frames()) == view(both.frames())
    assert decoded.frames() == both.frames()      # loaded here: native frames re-based to the same pcs
    assert decoded.joins() == both.joins() and len(decoded.joins()) == 2
    assert decoded.truncated and len(decoded) == len(both)
    assert str(decoded) == str(both)
    assert {m.status for m in decoded.modules} == {"loaded"}


def test_native_only_and_python_only_round_trip(chain):
    """Guards: each kind alone round-trips, exact pcs included (the innermost
    frame of a suspended greenlet is an exact pc, not a return address)."""
    import greenlet
    g = greenlet.greenlet(lambda: greenlet.getcurrent().parent.switch())
    g.switch()
    for bt in (capture_in_chain(chain, python=False), capture_in_chain(chain, native=False),
               btcore.collect(g, internals=True)):
        decoded = btcore.decode(bt.encode())
        assert view(decoded.frames()) == view(bt.frames())
    g.throw(greenlet.GreenletExit)


def test_decoded_backtrace_encodes_to_the_same_token_and_appends(chain):
    """Guards: a decoded Backtrace is a Backtrace like any other: it
    re-encodes to the same token, copies and appends with its frames."""
    token = capture_in_chain(chain).encode()
    decoded = btcore.decode(token)
    assert decoded.encode() == token
    host = btcore.Backtrace(512)
    btcore.append(host, btcore.collect(limit=2))
    btcore.append(host, decoded)
    assert host.frames()[host.joins()[-1]:] == decoded.frames()
    assert copy.copy(decoded).frames() == decoded.frames()


# A format 2 token written by btcore before format 3 (the commit before it):
# module 01020304 at /nonexistent/libgone.so, its pcs 0x1234 and 0x1200, an
# exact pc 0x7f0000001000 in no module, a Python frame f at /x/app.py:7.
FORMAT_2_TOKEN = "btc2.KAwQGCAIbNwmlRYYSlsIZNZDcZsUgNxPcjSSHPr6ABAAAAB_AAALwPQHACgBp-uCzvwFAQ"


def test_format_2_tokens_still_decode(chain):
    """Guards: tokens already in logs (format 2) decode after the format
    changed: a frozen one to its frames, and fresh ones (the reference
    encoder's format 2) to the frames of the backtrace they were taken from."""
    old = btcore.decode(FORMAT_2_TOKEN)
    assert [(m.path, m.build_id) for m in old.modules] == [("/nonexistent/libgone.so", "01020304")]
    assert [(r.vaddr, r.exact) for r in old._refs[:3]] == [(0x1234, False), (0x1200, False), (0x7f0000001000, True)]
    assert old._refs[3] == codec.DecodedPython("f", "/x/app.py", 7)
    assert old.encode().startswith(codec.PREFIX) and btcore.decode(old.encode()).format() == old.format()
    for bt in (capture_in_chain(chain), capture_in_chain(chain, python=False)):
        token = codec._encode(bt, version=2)
        assert token.startswith("btc2.") and len(token) > len(bt.encode())
        assert btcore.decode(token).frames() == bt.frames()


# A format 3 token written by btcore before format 4 (its reference
# encoder, the same bits as its C encoder): the frames of FORMAT_2_TOKEN, then
# the Python frame again beginning an append()ed backtrace, then the first
# two native frames again (format 4 would copy them).
FORMAT_3_TOKEN = "btc3.KBwgMEAAbNwmlRYYSlsIZNZDcZsUgNx_OjQigV7_BQABAADwLwDTHwCgBJyuCzrzF_whiAg"


def long_names_token(frames, length):
    """A hostile token: a Python frame named by `length` bytes, then frames
    whose new names each take that name whole and add one letter (a few
    bits per frame for `length` bytes of string)."""
    w = codec._Writer()
    w.put(0, 1)
    w.put(codec.BUILD_ID_BYTES, 4)
    w.varint(0)
    w.varint(frames)
    for i in range(frames):
        w.code(codec.PYTHON_FRAME)
        w.put(1, 1)   # a new name
        if i:
            w.put(0, (i - 1).bit_length())   # made from the first one
        w.varint(length if i else 0)
        w.varint(0)
        w.symbols(b"a" * (0 if i else length) + b"b")
        if i:
            w.put(0, 1)   # the file: a reference to the first one
        else:
            w.put(1, 1)
            w.varint(0)
            w.varint(0)
            w.symbols(b"f")
        w.uint(1)
    return w.token()


def test_strings_taken_whole_from_earlier_ones_are_bounded():
    """Guards the decoder's bound on strings: a token of 100 k characters whose names
    copy a 100 kB name 200 times (20 MB) is refused, not decoded into
    memory; below the bound the same construction decodes."""
    token = long_names_token(200, 100_000)
    assert len(token) < 140_000
    with pytest.raises(ValueError, match="strings are longer than"):
        btcore.decode(token)
    fine = btcore.decode(long_names_token(20, 100_000))
    assert [len(r.function) for r in fine._refs] == [100_001] * 20


def test_format_3_tokens_still_decode():
    """Guards: tokens of format 3 (in logs before format 4) decode, their
    append modifier (1 1 1 1, a copy's prefix in format 4) included."""
    old = btcore.decode(FORMAT_3_TOKEN)
    assert [(m.path, m.build_id) for m in old.modules] == [("/nonexistent/libgone.so", "01020304")]
    natives = [(r.vaddr, r.exact) for r in old._refs if isinstance(r, codec.DecodedNative)]
    assert natives == [(0x1234, False), (0x1200, False), (0x7f0000001000, True), (0x1234, False), (0x1200, False)]
    pythons = [r for r in old._refs if isinstance(r, codec.DecodedPython)]
    assert pythons == [codec.DecodedPython("f", "/x/app.py", 7)] * 2
    assert old.joins() == [4] and len(old) == 7
    again = btcore.decode(old.encode())
    assert old.encode().startswith(codec.PREFIX) and again.format() == old.format() and again.joins() == [4]


# ---- copies (format 4): runs of frames seen earlier in the token ----

def through_fixture(chain, depth, **kw):
    """A backtrace taken depth times deep in Python -> the C++ fixture ->
    Python: every level the same frames."""
    got = {"left": depth}

    def callback(tag):
        if got["left"]:
            got["left"] -= 1
            return chain.lib.chain_entry(1)
        got["bt"] = btcore.collect(capacity=1024, **kw)
        return 0

    chain.call(chain.lib.chain_entry, 1, callback)
    return got["bt"]


def parked_in_recursion(depth):
    """A greenlet parked depth levels deep in sorted() -> key -> sorted() ..."""
    import greenlet

    def level(n):
        return sorted([n], key=lambda item: level(n - 1) if n else greenlet.getcurrent().parent.switch())

    g = greenlet.greenlet(lambda: level(depth))
    g.switch()
    return g


def test_repetitive_traces_round_trip_through_copies(chain):
    """Guards COPY: deep recursions through a compiled C extension and
    greenlets parked at the bottom of a recursion (merged and native-only)
    decode to the frames they were taken from, written by the C encoder as
    by the reference; 8 more levels of recursion cost format 3 their frames
    again, and format 4 a copy or two (under a tenth of that)."""
    import greenlet
    parked = {depth: parked_in_recursion(depth) for depth in (4, 12)}
    makers = [lambda depth: through_fixture(chain, depth),
              lambda depth: through_fixture(chain, depth, python=False),
              lambda depth: btcore.collect(parked[depth], capacity=1024),
              lambda depth: btcore.collect(parked[depth], python=False, capacity=1024)]
    for make in makers:
        sizes = {}
        for depth in (4, 12):
            bt = make(depth)
            token = bt.encode()
            assert token == codec._encode(bt)
            decoded = btcore.decode(token)
            assert decoded.frames() == bt.frames() and len(decoded) == len(bt)
            sizes[depth] = (len(bt), len(token), len(codec._encode(bt, version=3)))
        (frames4, v4_4, v3_4), (frames12, v4_12, v3_12) = sizes[4], sizes[12]
        assert frames12 >= frames4 + 40 and v3_12 - v3_4 > 10 * (v4_12 - v4_4), sizes
    for g in parked.values():
        g.throw(greenlet.GreenletExit)


def test_copies_of_frames_named_from_a_file_decode_in_another_process(chain):
    """Guards: a copy repeats frames of a module that is not loaded where
    the token is decoded (DecodedNative references, not re-based records):
    the other process names every frame as this one does."""
    bt = through_fixture(chain, 8)
    decoded = json.loads(run_python(DECODER, bt.encode()))
    assert dict(decoded["modules"])[chain.so_path] == "file"
    assert [tuple(f[:5]) for f in decoded["frames"]] == view(bt.frames())


def frames_token(count, *frames):
    """A token of no modules and count frames, written by frames (callables
    of a _Writer): hostile tokens, exactly as written."""
    w = codec._Writer()
    w.put(0, 1)
    w.put(codec.BUILD_ID_BYTES, 4)
    w.varint(0)
    w.varint(count)
    for write in frames:
        write(w)
    return w.token()


def literal(pc):
    return lambda w: (w.code(codec.LITERAL), w.ulen(pc, codec.ADDRESS_BASE))


def copy_of(length, distance):
    return lambda w: (w.code(codec.COPY), w.ulen(length, codec.COPY_BASE), w.ulen(distance, codec.COPY_BASE))


def test_copies_outside_the_decoded_frames_overlapping_or_past_the_count_are_refused():
    """Guards the decoder's bounds on COPY: a copy reads only frames decoded
    before it, never the frames it writes, and writes no more than the
    token's frame count; a valid copy decodes to the frames it names."""
    three = [literal(0x1000), literal(0x2000), literal(0x3000)]
    good = btcore.decode(frames_token(5, *three, copy_of(2, 3)))
    assert [r.vaddr for r in good._refs] == [0x1000, 0x2000, 0x3000, 0x1000, 0x2000]
    bad = {"frames back": (5, *three, copy_of(2, 4)),
           "overlaps itself": (6, *three, copy_of(3, 2)),
           "a copy of 3 frames after 3 of 5": (5, *three, copy_of(3, 3)),
           "a copy of 1 frames": (4, *three, copy_of(1, 1)),
           f"a copy of {1 << 40} frames": (5, *three, copy_of(1 << 40, 3)),
           "a frame modifier before a copy": (5, *three, lambda w: w.code(codec.EXACT_NEXT), copy_of(2, 3))}
    for message, (count, *frames) in bad.items():
        with pytest.raises(ValueError, match=message):
            btcore.decode(frames_token(count, *frames))


def test_copies_double_up_to_the_largest_capacity_in_linear_time():
    """Guards: copies cannot blow up: a token of 16 copies, each of all the
    frames before it, holds the largest capacity's frames (and one frame
    more is refused, not decoded)."""
    doubling = [copy_of(1 << k, 1 << k) for k in range(1, 16)]
    token = frames_token(btcore.capture.backtrace.MAX_CAPACITY, literal(0x1000), literal(0x2000), *doubling)
    assert len(token) < 120
    decoded = btcore.decode(token)
    assert len(decoded) == btcore.capture.backtrace.MAX_CAPACITY
    assert {r.vaddr for r in decoded._refs} == {0x1000, 0x2000}
    with pytest.raises(ValueError, match="frame count"):
        btcore.decode(frames_token(btcore.capture.backtrace.MAX_CAPACITY + 1, literal(0x1000)))


def test_token_is_one_printable_word(chain):
    """Guards: a token survives log pipelines: one word of URL-safe
    characters after the versioned prefix, nothing a formatter escapes."""
    token = capture_in_chain(chain).encode()
    assert re.fullmatch(r"btc4\.[A-Za-z0-9_-]+", token) and token.startswith(codec.PREFIX)
    assert codec.TOKEN_IN_TEXT.findall(f'msg="x {token}" {token}.') == [token, token]


def test_c_encoder_writes_the_reference_token_cold_and_warm(chain):
    """Guards: the C encoder (native/codec/encode.c) writes, bit for bit,
    the token of the reference encoder (codec._encode), whether it must
    first be taught every module (cold) or knows them (warm)."""
    traces = [capture_in_chain(chain), capture_in_chain(chain, python=False),
              capture_in_chain(chain, native=False), btcore.collect(capacity=512)]
    for bt in traces:
        codec.lib.btc_encode_forget(1, 1)
        cold = bt.encode()
        assert cold == bt.encode() == codec._encode(bt)


def test_c_encoder_writes_pcs_in_no_module_and_modules_named_again_as_the_reference(chain):
    """Guards the C encoder's one pass over the pcs (module found, table
    index, module switches): pcs in no module (the first frame, between
    modules, exact and not), a module named again after others, and the
    same tokens as the reference encoder, decoding to absolute pcs for the
    frames in no module."""
    from btcore.capture.backtrace import KIND_NATIVE, RECORD, Backtrace
    real = [r[0] for r in RECORD.iter_unpack(capture_in_chain(chain, python=False)._raw) if r[2] == KIND_NATIVE]
    outside = [0x1000, (1 << 64) - 1, 0x1000, 0x1008]
    pcs = [(outside[0], 0), (real[0], 0), (real[-1], 0), (outside[1], codec.F_EXACT), (real[0], 0), (real[1], 0),
           (outside[2], codec.F_EXACT), (real[-1], 0), (outside[3], 0)]
    bt = object.__new__(Backtrace)
    bt._capacity, bt._refs, bt.truncated = 16, (), False
    bt._raw = bytearray(b"".join(RECORD.pack(pc, -1, KIND_NATIVE, flags, 0) for pc, flags in pcs))
    for warm in (False, True):
        if not warm:
            codec.lib.btc_encode_forget(1, 1)
        token = bt.encode()
        assert token == codec._encode(bt)
    decoded = btcore.decode(token)
    assert [(r.vaddr, r.exact) for r in decoded._refs if r.module is None] == \
        [(outside[0], False), (outside[1], True), (outside[2], True), (outside[3], False)]
    assert len(decoded) == len(pcs)


def test_c_encoder_codes_a_name_again_when_it_shares_another_part_of_an_earlier_one():
    """Guards the C encoder's cache of coded strings: a name coded against
    different earlier names in different tokens (another prefix and suffix
    taken from them), and names too long to keep, are written as the
    reference writes them, whatever was cached before."""
    from btcore.capture.backtrace import KIND_PYTHON, RECORD, Backtrace
    base = test_c_encoder_codes_a_name_again_when_it_shares_another_part_of_an_earlier_one.__code__
    codes = {name: base.replace(co_qualname=name, co_filename=f"/srv/{name}.py")
             for name in ("alpha_beta", "alpha_gamma", "delta_beta", "x" * 300 + "_beta")}

    def trace(*names):
        bt = object.__new__(Backtrace)
        bt._capacity, bt.truncated, bt._refs = 16, False, tuple(codes[n] for n in names)
        bt._raw = bytearray(b"".join(RECORD.pack(id(codes[n]), 0, KIND_PYTHON, 0, 0) for n in names))
        return bt

    long = "x" * 300 + "_beta"
    orders = [("alpha_gamma", "alpha_beta"), ("delta_beta", "alpha_beta"), ("alpha_beta",), (long, "alpha_beta"),
              ("alpha_beta", long), (long,), ("delta_beta", long)]
    codec.lib.btc_encode_forget(0, 1)
    for names in orders + orders:
        bt = trace(*names)
        for _ in range(2):   # the second from the cache, as coded for this token
            assert bt.encode() == codec._encode(bt), names


def every_utf8_byte() -> str:
    """A str whose UTF-8 holds every byte value valid UTF-8 can hold (all
    but 0xC0, 0xC1, 0xF5-0xFF), and every word of the string code."""
    chars = [chr(c) for c in range(0, 0x80)] + [chr(c) for c in range(0x80, 0xC0)]   # continuation bytes
    chars += [chr((lead & 0x1F) << 6) for lead in range(0xC2, 0xE0)]
    chars += [chr(0x800 if lead == 0xE0 else (lead & 0x0F) << 12) for lead in range(0xE0, 0xF0)]
    chars += [chr(0x10000 if lead == 0xF0 else (lead & 0x07) << 18) for lead in range(0xF0, 0xF5)]
    return "".join(chars) + "".join(codec.WORDS) + "x".join(codec.WORDS)


def test_c_encoder_codes_every_byte_and_word_as_the_reference():
    """Guards the C encoder's copy of the string code: a name and a file
    holding every byte value and every word are written as the reference
    writes them (the same code lengths, the same canonical codes, the same
    cutting into words) and decode to themselves."""
    text = every_utf8_byte()
    assert {b for b in text.encode()} == set(range(0, 0xC0)) | set(range(0xC2, 0xF5))
    code = every_utf8_byte.__code__.replace(co_qualname=text, co_filename="/x/" + text[::-1])
    bt = btcore.capture.backtrace._new(btcore.Backtrace)
    bt._capacity, bt._raw, bt._refs, bt.truncated = 1, bytearray(
        btcore.capture.backtrace.RECORD.pack(id(code), 0, btcore.capture.backtrace.KIND_PYTHON, 0, 0)), (code,), False
    token = bt.encode()
    assert token == codec._encode(bt)
    [frame] = btcore.decode(token)._refs
    assert (frame.function, frame.file) == (text, "/x/" + text[::-1])


def test_module_paths_are_kept_only_outside_the_searched_places(chain):
    """Guards: a module in a place the decoder searches by build-id (libc,
    libpython) is named by build-id alone; the fixture, built in a
    temporary directory, keeps its path."""
    decoded = btcore.decode(capture_in_chain(chain).encode())
    named = {m.path: m.named for m in decoded.modules}
    assert named[chain.so_path] == chain.so_path
    libc = [p for p in named if os.path.basename(p).startswith("libc.so")]
    assert libc and named[libc[0]] is None


def test_a_module_without_path_is_found_by_build_id_in_the_search_path(tmp_path, monkeypatch):
    """Guards: a token naming a module by build-id alone is named from a
    file with that build-id found in a directory of search= (or of
    BTCORE_SEARCH_PATH); a file of another build in that place is never
    used, and the module is reported missing with the way to add places."""
    path = str(tmp_path / "found" / "libcodec.so")
    os.makedirs(os.path.dirname(path))
    build_library(tmp_path, path, "")
    build_id = codec.file_build_id(path)[:codec.BUILD_ID_BYTES]
    token = token_with_module(None, build_id, vaddr=symbol_vaddr(path, "codec_entry") + 4)
    decoded = btcore.decode(token, search=[str(tmp_path / "found")])
    assert [(m.path, m.status, m.named) for m in decoded.modules] == [(path, "file", None)]
    assert decoded.frames()[0].function is not None
    monkeypatch.setenv(codec.SEARCH_PATH_VARIABLE, str(tmp_path / "found"))
    assert btcore.decode(token).modules[0].status == "file"
    monkeypatch.delenv(codec.SEARCH_PATH_VARIABLE)
    build_library(tmp_path, path, PADDING)   # another build where the first one was
    [missing] = btcore.decode(token, search=[str(tmp_path / "found")]).modules
    assert missing.status == "missing" and codec.SEARCH_PATH_VARIABLE in missing.detail
    assert "padding_fn_" not in btcore.decode(token, search=[str(tmp_path / "found")]).format()


# ---- in another process: another load address, the fixture not loaded ----

ENCODER = r"""
import importlib.util, json, sys
import btcore
spec = importlib.util.spec_from_file_location("_btfix_chain", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
got = {}
@mod.ffi.def_extern(name="chain_py_callback")
def chain_py_callback(tag):
    got["bt"] = btcore.collect(capacity=256)
    return 0
mod.lib.chain_entry(1)
bt = got["bt"]
print(json.dumps({"token": bt.encode(),
                  "frames": [[f.kind, f.function, f.file, f.line, f.inlined, f.module, f.ip] for f in bt.frames()]}))
"""

DECODER = r"""
import json, sys
import btcore
bt = btcore.decode(sys.argv[1])
print(json.dumps({"modules": [[m.path, m.status] for m in bt.modules],
                  "frames": [[f.kind, f.function, f.file, f.line, f.inlined, f.module, f.ip] for f in bt.frames()]}))
"""


def addr2line(path, addr):
    """[(function, file, line)] innermost first: `addr2line -f -i -C`."""
    out = subprocess.run(["addr2line", "-f", "-i", "-C", "-e", path, "%x" % addr],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    levels = []
    for function, location in zip(out[::2], out[1::2]):
        file, _, line = re.sub(r" \(discriminator \d+\)$", "", location).rpartition(":")
        levels.append((function, file, int(line) if line.isdigit() else 0))
    return levels


def physical_groups(frames):
    """Native frames grouped per raw frame: its inlined calls, then itself."""
    groups, current = [], []
    for f in frames:
        if f[0] == "native":
            current.append(f)
            if not f[4]:
                groups.append(current)
                current = []
    return groups


def _position_independent(path) -> bool:
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as f:
        return ELFFile(f).header["e_type"] == "ET_DYN"


def _libraries_move_between_processes() -> bool:
    """Does ASLR load libc at another address in each process?  (Not under
    qemu-user, which maps a guest's libraries at the same places every run.)"""
    probe = "import ctypes; print(ctypes.cast(ctypes.CDLL(None).printf, ctypes.c_void_p).value)"
    a, b = (subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
            for _ in range(2))
    return a != b


def test_decoded_in_another_process_names_like_the_encoder_and_addr2line(chain):
    """Guards: native pcs are module-relative: after the encoder exited, a
    process with other load addresses (and without the fixture loaded)
    names every frame as the encoder did, and the fixture's frames as
    addr2line names the file at the module-relative address."""
    encoded = json.loads(run_python(ENCODER, chain.so_path))
    decoded = json.loads(run_python(DECODER, encoded["token"]))
    assert [f[:5] for f in decoded["frames"]] == [f[:5] for f in encoded["frames"]]
    statuses = dict(decoded["modules"])
    assert statuses[chain.so_path] == "file"          # not loaded there: named from the file
    assert "loaded" in statuses.values()              # libpython, libc: re-based
    # libpython is loaded at another address there: same names, other pcs
    # (a non-PIE executable, such as Debian's static python3.X, loads at the
    # same address in every process: nothing to re-base there)
    rebased = [(e, d) for e, d in zip(encoded["frames"], decoded["frames"])
               if d[0] == "native" and d[5] != chain.so_path and _position_independent(d[5])]
    assert rebased
    if _libraries_move_between_processes():
        assert all(e[6] != d[6] for e, d in rebased)
    fixture = [g for g in physical_groups(decoded["frames"]) if g[-1][5] == chain.so_path]
    assert len(fixture) >= 4   # chain_entry, chain_static, descend, the callback stub (+ cffi's wrapper)
    for group in fixture:
        vaddr = group[-1][6]   # the module-relative pc: no load address in the decoder
        theirs = addr2line(chain.so_path, vaddr - 1)
        mine = [(f[1], f[2], f[3] or 0) for f in group]
        assert [(fn, ln) for fn, _, ln in mine] == [(fn, ln) for fn, _, ln in theirs], (hex(vaddr), mine, theirs)
        assert [os.path.basename(fi) for _, fi, _ in mine] == [os.path.basename(fi) for _, fi, _ in theirs]


# ---- a module rebuilt since: reported, never named wrongly ----

LIBRARY = r"""
typedef int (*callback)(int);
%s
__attribute__((noinline)) int codec_leaf(callback cb, int x) { int r = cb(x); return r + x; }
__attribute__((noinline)) int codec_entry(callback cb, int x) { int r = codec_leaf(cb, x + 1); return r * 3; }
"""

# The rebuilt library: other functions where codec_leaf and codec_entry were.
PADDING = "\n".join(f"__attribute__((noinline)) int padding_fn_{i}(int x) {{ return x * {i} + (x >> 3); }}"
                    for i in range(40))

CAPTURE_IN_LIBRARY = r"""
import ctypes, sys
import btcore
lib = ctypes.CDLL(sys.argv[1])
CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)
got = {}
def in_library(x):
    got["bt"] = btcore.collect(python=False)
    return 0
lib.codec_entry(CALLBACK(in_library), 1)
print(got["bt"].encode())
"""


def symbol_vaddr(path, name):
    """Where name is in the file at path (not a fixed address: layouts differ between architectures)."""
    with open(path, "rb") as f:
        return ELFFile(f).get_section_by_name(".symtab").get_symbol_by_name(name)[0]["st_value"]


def build_library(tmp_path, path, padding):
    source = tmp_path / "codec_lib.c"
    source.write_text(LIBRARY % padding)
    built = tmp_path / "building.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-g", "-o", str(built), str(source)], check=True)
    os.replace(built, path)   # a new file at the same path, as an upgrade installs it


def test_rebuilt_module_is_reported_as_a_build_id_mismatch(tmp_path):
    """Guards: a module whose file no longer has the token's build-id is
    reported as such and its frames stay unnamed, never named from the new
    file; with the original file they are named from it."""
    path = str(tmp_path / "libcodec.so")
    build_library(tmp_path, path, "")
    token = run_python(CAPTURE_IN_LIBRARY, path).strip()

    before = btcore.decode(token)   # the file the encoder ran
    names = [f.function for f in before.frames() if f.module == path]
    assert names[:2] == ["codec_leaf", "codec_entry"]
    assert [m.status for m in before.modules if m.path == path] == ["file"]

    build_library(tmp_path, path, PADDING)
    after = btcore.decode(token)
    [module] = [m for m in after.modules if m.path == path]
    assert module.status == "mismatch" and "build-id mismatch" in module.detail
    ours = [f for f in after.frames() if f.module == path]
    assert len(ours) == len(names) and all(f.function is None and f.file is None for f in ours)
    text = after.format()
    assert text.splitlines()[0].startswith(f"Module {path} (build-id {module.build_id}): build-id mismatch")
    assert "padding_fn_" not in text and "codec_leaf" not in text


def token_with_module(path, build_id=b"\x01\x02\x03\x04", vaddr=0x1234):
    """A well-formed token naming one module (as a hostile log line could);
    path None: the decoder searches for the file."""
    return codec.token(False, [(0, (build_id, path), vaddr)])


def test_a_build_id_prefix_too_short_to_tell_builds_apart_is_refused():
    """Guards the minimum prefix (4 bytes): a token whose module is named
    by the first 2 bytes of libc's build-id (which another build shares
    once in 65,536) is a ValueError, not frames named from libc; its first
    4 bytes are accepted (and name libc, loaded here)."""
    libc = next(m for m in codec.loaded_modules() if os.path.basename(m.path).startswith("libc.so"))
    prefix = libc.build_id[:4]

    def token(length):
        w = codec._Writer()
        w.put(0, 1)
        w.put(length, 4)
        w.varint(1)
        w.put(*codec.module_identity((prefix[:length], None), length=length))
        w.varint(1)
        w.code(codec.LITERAL)
        w.put(1, 1)   # the module not named yet
        w.ulen(0x1234, codec.ADDRESS_BASE)
        return w.token()

    assert btcore.decode(token(4)).modules[0].status == "loaded"
    for length in (2, 3):
        with pytest.raises(ValueError, match=f"build-id prefixes of {length} bytes [(]at least 4[)]"):
            btcore.decode(token(length))


def test_module_paths_in_tokens_are_untrusted(tmp_path):
    """Guards: a path from a token is only read if it is a regular ELF file
    with the token's build-id: a FIFO (whose open would block), a device,
    a missing file, a non-ELF file give an unnamed frame and a reason."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    text = tmp_path / "text.so"
    text.write_text("not an ELF file")
    cases = {str(fifo): "missing", "/dev/zero": "missing", str(tmp_path / "absent.so"): "missing",
             str(text): "missing", "relative/lib.so": "missing", sys.executable: "mismatch",
             "/lib/\0libc.so.6": "missing", "/lib/\udc80.so": "missing"}
    for path, status in cases.items():
        decoded = btcore.decode(token_with_module(path))
        assert [(m.path, m.status) for m in decoded.modules] == [(path, status)]
        [frame] = decoded.frames()
        assert (frame.module, frame.function, frame.offset) == (path, None, 0x1234)


def test_a_return_address_of_zero_is_refused_not_looked_up_at_minus_one(tmp_path):
    """Guards: a hostile token with a valid module and a return address of 0
    is a ValueError (it was an OverflowError from the lookup at pc - 1)."""
    path = str(tmp_path / "libcodec.so")
    build_library(tmp_path, path, "")
    build_id = codec.file_build_id(path)[:codec.BUILD_ID_BYTES]
    assert btcore.decode(token_with_module(path, build_id, vaddr=0x1100)).modules[0].status == "file"
    with pytest.raises(ValueError, match="a native frame at 0x0"):
        btcore.decode(token_with_module(path, build_id, vaddr=0)).frames()


def test_literal_modules_and_lengths_of_every_size_round_trip():
    """Guards format 3's literal coding: a module named again after others,
    pcs in no module before and after every module was named, and pcs and
    deltas whose bit lengths are outside the direct range (escaped) decode
    to the module and pc they were written with."""
    a, b = (b"\x01\x02\x03\x04", "/nonexistent/liba.so"), (b"\x05\x06\x07\x08", None)
    pcs = [(a, 0x1234), (None, 0x5000), (b, 0x9999), (a, 0x400000), (None, (1 << 64) - 1), (b, 0x10),
           (a, 0x1235), (b, 0x10 + (1 << 40)), (None, 0x7f00), (a, 1)]
    decoded = btcore.decode(codec.token(False, [(0, key, vaddr) for key, vaddr in pcs]))
    assert [(r.module.key if r.module else None, r.vaddr) for r in decoded._refs] == pcs


# ---- bad tokens ----

def test_truncated_corrupted_and_unknown_tokens_raise_value_error(chain):
    """Guards: anything but a whole token of a known version is a ValueError
    that says what is wrong."""
    token = capture_in_chain(chain).encode()
    for cut in range(len("btc3."), len(token) - 1):
        with pytest.raises(ValueError):
            btcore.decode(token[:cut])
    with pytest.raises(ValueError, match="unknown btcore token version 5: this btcore reads versions 2, 3 and 4"):
        btcore.decode("btc5." + token[5:])
    with pytest.raises(ValueError, match="version 1 [(]an earlier format, no longer read[)]"):
        btcore.decode("btc1." + token[5:])
    with pytest.raises(ValueError, match="truncated token"):
        btcore.decode(token[:len(token) // 2])
    with pytest.raises(ValueError, match="not a btcore token"):
        btcore.decode(token.replace(token[10], "*"))
    with pytest.raises(ValueError, match="data after the last frame"):
        btcore.decode(token + "AAAA")
    with pytest.raises(TypeError):
        btcore.decode(token.encode())


def test_fuzzed_tokens_only_raise_value_error():
    """Guards: decoding garbage never crashes, hangs or raises anything but
    ValueError (a child process, so a crash fails the test; 100 000 here,
    a million with `python tests/fuzz_codec.py 1000000`)."""
    proc = subprocess.run([sys.executable, os.path.join(HERE, "fuzz_codec.py"), "100000", "--encoder", "5000"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "decoded" in proc.stdout


# ---- python -m btcore decode ----

def test_cli_resolves_every_token_in_place_and_keeps_the_rest(chain, tmp_path):
    """Guards: the filter replaces each token (several per line, any place
    in a line) by its backtrace and leaves every other character as it was;
    a bad token stays, followed by the reason."""
    merged = capture_in_chain(chain).encode()
    native = capture_in_chain(chain, python=False).encode()
    python = btcore.collect().encode()
    log = textwrap.dedent(f"""\
        2026-11-23T06:00:01Z INFO  request id=17 spawned_at={merged} took=3.2s
        2026-11-23T06:00:02Z WARN  slow: {{"where": "{native}", "n": 2}}
        no token here, but btc and btc1 and abtc1.AAAA words
        two on a line: {python} and {merged}.
        broken: btc3.AAAAx end
        {python}
        """)
    (tmp_path / "app.log").write_text(log)
    printed = subprocess.run([sys.executable, "-m", "btcore", "decode", str(tmp_path / "app.log")],
                             capture_output=True, text=True, timeout=TIMEOUT, check=True).stdout
    resolved = json.loads(run_python(
        "import btcore, json, sys; print(json.dumps({t: btcore.decode(t).format() for t in sys.argv[1:]}))",
        merged, native, python))
    expected = log.replace("btc3.AAAAx", "btc3.AAAAx (btcore: truncated token: its length is not that of a base64 encoding)")
    for token, text in resolved.items():
        expected = expected.replace(token, text)
    assert printed == expected
    assert "descend(int)" in printed and "in capture_in_chain" in printed
    from_stdin = subprocess.run([sys.executable, "-m", "btcore", "decode"], input=log, capture_output=True,
                                text=True, timeout=TIMEOUT, check=True).stdout
    assert from_stdin == printed

# glibc's malloc with a fixed mmap threshold: a block of 64 KiB or more is
# mapped on its own and unmapped when freed, so a read of it after its free
# faults, whatever the process freed before (the dynamic threshold would
# otherwise rise past the blocks these tests free and leave them readable).
UNMAPPED_WHEN_FREED = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.mmap_threshold=65536")


def test_encode_survives_a_truncated_flag_whose_release_rebinds_the_records():
    """Guards read_backtrace() (encode.c) against Python code run while it
    reads a Backtrace: a subclass's truncated flag whose release rebinds
    _raw.  The records were read before that and the bytearray released
    after it: the encoder then read a freed buffer (a SIGSEGV).  In a
    subprocess; the token decodes to the records _raw held when encode()
    began (the encoder holds them to its end)."""
    script = textwrap.dedent('''
        import struct
        import btcore
        from btcore.capture.backtrace import Backtrace

        class Flag:
            def __init__(self, bt):
                self.bt = bt
            def __bool__(self):
                return False
            def __del__(self):
                self.bt._raw = bytearray()   # the old records are now held by the encoder only

        class Sub(Backtrace):
            __slots__ = ()
            truncated = property(lambda self: Flag(self))

        bt = Sub.__new__(Sub)
        bt._capacity, bt._refs = 65536, ()
        bt._raw = bytearray(struct.pack("<QiBBH", 0x1000, -1, 1, 0, 0) * 60000)   # ~960 kB: unmapped when freed
        token = bt.encode()
        print("frames:", len(btcore.decode(token)))
    ''')
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=UNMAPPED_WHEN_FREED)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "frames: 60000" in done.stdout, done.stdout
