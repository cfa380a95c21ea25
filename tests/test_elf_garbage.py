"""Garbage in, no crash out: ELF and DWARF readers (native/symbols/elf.c, dwarf.c)
and the demangler on truncated and mutated input (core files: tests/fuzz_core.py).

Each batch runs in a child process so that a crash shows up as a failed
test with the seed to reproduce it, not as a dead test session.  Every
variant is written to a new path: the engine caches files by path and
inode/size/mtime, and a rewrite within one mtime tick could look unchanged.
"""
import os
import subprocess
import sys
import textwrap

import pytest


C_SOURCE = r"""
static int counter;
static inline __attribute__((always_inline)) int helper(int x) { counter += x * 3; return counter ^ x; }
__attribute__((noinline)) static int hidden(int x) { return helper(x) + 7; }
int outer(int x) { int r = helper(x + 1); return r + hidden(r); }
int split(int x) { if (__builtin_expect(x == 12345, 0)) { counter++; __builtin_trap(); } return helper(x); }
"""

CHILD = textwrap.dedent(r"""
    import os, random, sys
    from elftools.elf.elffile import ELFFile
    from btcore._native import ffi, lib

    original, workdir, seed, variants = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    data = open(original, "rb").read()
    with open(original, "rb") as f:
        elf = ELFFile(f)
        # what the symbolizer reads: DWARF, else (stripped) the symbol tables
        debug = [(s["sh_offset"], s["sh_size"]) for s in elf.iter_sections()
                 if s.name.startswith((".debug", ".zdebug")) and s["sh_size"]] or \
                [(s["sh_offset"], s["sh_size"]) for s in elf.iter_sections()
                 if s.name in (".symtab", ".strtab", ".dynsym", ".dynstr") and s["sh_size"]]
        headers = [(0, 64), (elf["e_shoff"], elf["e_shnum"] * elf["e_shentsize"])]
        symtab = elf.get_section_by_name(".symtab") or elf.get_section_by_name(".dynsym")
        funcs = [(s["st_value"], s["st_size"]) for s in symtab.iter_symbols()
                 if s["st_info"]["type"] == "STT_FUNC" and s["st_size"]]
    addrs = sorted({lo + k for lo, size in funcs for k in range(0, size, 3)})
    out = ffi.new("btc_srcframe[8]")
    buf = ffi.new("char[4096]")
    rng = random.Random(seed)

    def mutate():
        b = bytearray(data)
        kind = rng.choice(["truncate", "debug", "debug", "headers", "anywhere"])
        if kind == "truncate":
            return bytes(b[:rng.randrange(len(b))])
        regions = debug if kind == "debug" else headers if kind == "headers" else [(0, len(b))]
        for _ in range(rng.randint(1, 40)):
            off, size = rng.choice(regions)
            at = off + rng.randrange(size)
            b[at] = rng.choice([0, 0xff, 0x80, 0x7f, rng.randrange(256)])
        return bytes(b)

    value = ffi.new("uint64_t *")
    id_out = ffi.new("uint8_t[32]")

    def check_lookups(path):
        # what the dump of another process reads: symbols by name, the build-id of PT_NOTE segments
        e = lib.btc_elf_open(path.encode())
        if e != ffi.NULL:
            for name in (b"outer", b"split", b"counter", b"hidden", b"_PyRuntime", b"PyEval_EvalCode"):
                assert lib.btc_elf_symbol_value(e, name, value) in (0, -1)
            lib.btc_elf_close(e)
        fd = os.open(path, os.O_RDONLY)
        assert lib.btc_elf_file_build_id(fd, id_out, len(id_out)) >= -1
        os.close(fd)

    for i in range(variants):
        path = os.path.join(workdir, "v%d_%d.so" % (seed, i))
        with open(path, "wb") as f:
            f.write(mutate())
        for a in addrs:
            n = lib.btc_symbolize_file(path.encode(), a, out, len(out), buf, len(buf))
            assert -1 <= n <= len(out), n
            for k in range(max(n, 0)):   # the strings must be readable
                if out[k].function != ffi.NULL:
                    ffi.string(out[k].function)
                if out[k].file != ffi.NULL:
                    ffi.string(out[k].file)
        lib.btc_symbolize_reset()
        check_lookups(path)
        os.unlink(path)
    print("ok")
""")

DEMANGLE_CHILD = textwrap.dedent(r"""
    import random, sys
    from btcore._native import ffi, lib
    rng = random.Random(int(sys.argv[1]))
    seeds = [b"_RNvCs1234_7mycrate3foo", b"_RNvXCs1234_5helloNtB2_3FooNtNtCsk_4core3fmt5Debug3fmt",
             b"_RINvCs1_1a1fTRShmEE", b"_ZN3std2rt10lang_start17h9a1b2c3d4e5f6a7bE",
             b"_ZN4core3ptr13drop_in_place$LT$u8$GT$17h0123456789abcdefE", b"_ZNSt6vectorIiSaIiEE9push_backERKi"]
    alphabet = b"0123456789_$.ENCMXYIBKLRQPOSATpsuvhj" + bytes(range(97, 123))
    buf = ffi.new("char[256]")
    for _ in range(20000):
        name = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 6)):
            op, at = rng.randrange(3), rng.randrange(len(name))
            if op == 0:
                name[at] = rng.choice(alphabet)
            elif op == 1:
                name.insert(at, rng.choice(alphabet))
            elif len(name) > 2:
                del name[at]
        for size in (256, 9):
            assert lib.btc_demangle(bytes(name), buf, size) in (0, -1)
    print("ok")
""")


def run_child(script, *args):
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    # -P: the current directory (a source checkout, whose btcore/ has no
    # compiled core) must not shadow the installed package.
    done = subprocess.run([sys.executable, "-P", "-c", script, *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (args, done.returncode, done.stderr[-3000:])


@pytest.fixture(scope="module", params=[("-gdwarf-5",), ("-gdwarf-4",), ("-gdwarf-5", "-Wl,--compress-debug-sections=zlib")],
                ids=["dwarf5", "dwarf4", "zlib"])
def library(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("garbage")
    src = d / "g.c"
    src.write_text(C_SOURCE)
    so = d / "g.so"
    subprocess.run(["gcc", "-O2", "-g", "-shared", "-fPIC", *request.param, "-o", str(so), str(src)], check=True)
    return str(so)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_mutated_and_truncated_files(library, tmp_path, seed):
    run_child(CHILD, library, tmp_path, seed, 150)


def test_mutated_interpreter_module(interpreter_module, tmp_path):
    """A few variants of a big real file: DWARF 5 with every form gcc uses,
    or (stripped) its .dynsym."""
    lib = interpreter_module
    script = CHILD.replace("range(0, size, 3)", "range(0, size, max(1, size // 2))")
    run_child(script, lib, tmp_path, 9, 6)


@pytest.mark.parametrize("seed", [1, 2])
def test_mutated_mangled_names(seed):
    run_child(DEMANGLE_CHILD, seed)


# Each name is copied so that its NUL is the last byte before an unreadable
# page: a demangler that reads one byte past the end of its input crashes.
GUARDED_DEMANGLE_CHILD = textwrap.dedent(r"""
    import ctypes, mmap, random, sys
    from btcore._native import ffi, lib
    page = mmap.PAGESIZE
    area = mmap.mmap(-1, 2 * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mprotect(ctypes.c_void_p(base + page), page, 0) == 0   # PROT_NONE
    valid = [b"_RNvCs1234_7mycrate3foo", b"_RNvNtCs1234_7mycrate3bar3baz", b"_RINvCsabc_5hello6returnhE",
             b"_RNCNvCs1234_4main4main0B3_", b"_RNvMNtCs1234_5hello3fooNtB2_3Bar3new",
             b"_RNvXCs1234_5helloNtB2_3FooNtNtCsk_4core3fmt5Debug3fmt", b"_RINvCs1_1a1fAhj4_E",
             b"_RINvCs1_1a1fTRShmEE", b"_RINvCs1_1a1fKj1f_E", b"_RINvCs1_1a1fLs_E", b"_RYhNtCs1_1a1T",
             b"_ZN3std2rt10lang_start17h9a1b2c3d4e5f6a7bE"]
    names = [b"_RCs", b"_RMs", b"_RIC1aRL", b"_RXs", b"_RNvCs", b"_RICs_1aKj", b"_RIC1aKB"]
    names += [v[:k] for v in valid for k in range(2, len(v) + 1)]
    rng = random.Random(int(sys.argv[1]))
    alphabet = b"0123456789_sBLKRQPOSATEpuhj"
    for _ in range(3000):
        name = bytearray(rng.choice(valid))
        for _ in range(rng.randint(1, 3)):
            name[rng.randrange(2, len(name))] = rng.choice(alphabet)
        names.append(bytes(name[:rng.randint(2, len(name))]))
    buf = ffi.new("char[256]")
    for name in names:
        at = base + page - len(name) - 1
        ctypes.memmove(at, name + b"\0", len(name) + 1)
        assert lib.btc_demangle(ffi.cast("char *", at), buf, len(buf)) in (0, -1), name
    print("ok")
""")


def test_demangler_reads_nothing_past_the_name():
    """Guards issue 9.2: truncated v0 names ("_RCs", "_RMs", "_RIC1aRL", ...) read past their NUL."""
    run_child(GUARDED_DEMANGLE_CHILD, 3)
