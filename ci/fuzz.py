#!/usr/bin/env python3
"""Coverage-guided fuzzing of btcore's parsers of outside bytes, with atheris
(libFuzzer) over the native core built with clang, ASan and libFuzzer's
coverage counters (ci/fuzz.sh builds it and calls this).

Targets, each fed through the core's cffi entry points:
  cfi       .eh_frame bytes -> the CFI table builder (btc_cfi_selftest_garbage:
            the linear walk, the rows, the invariants lookups rely on)
  elf       a whole file -> ELF headers and sections, symbol tables, DWARF
            info/abbrev/lines/ranges, compressed sections (btc_symbolize_file
            at addresses of the seeds' functions)
            and, on the same file, symbols by name and the PT_NOTE build-id
  core      a core file -> its program headers and notes (btc_core_read) and
            the build-id reader (tests/fuzz_core.py's check)
  demangle  a symbol name -> the Itanium/Rust demanglers (btc_demangle)
  codec     "d" (format 4), "3" or "2" (formats 3, 2) + bytes -> a token of that body -> btcore.decode() and the
            frames; other bytes -> a backtrace (a record per 4 bytes: real
            pcs, code objects, flags) -> the C encoder, checked against the
            reference encoder and decoded back (tests/fuzz_codec.py)
  remote    bytes -> a target's memory (a segment at a fixed address) walked
            as a dump walks it: gc lists, greenlets' states, the saved-stack
            plan, both frame walkers, code objects, names, line tables; every
            result within its bound (tests/fuzz_remote.py's check)
Seeds come from the machine's real libraries (and a small library compiled
with DWARF 4, DWARF 5 and zlib-compressed sections).

    python ci/fuzz.py SECONDS_PER_TARGET WORKDIR     run every target, print the figures
    python ci/fuzz.py --target NAME CORPUS... [-- libFuzzer options]   one target (internal)
    python ci/fuzz.py --codec-seeds DIR                                  the codec seeds (internal)
    python ci/fuzz.py --remote-seeds DIR                                 the remote seeds (internal)
    python ci/fuzz.py --core-seeds DIR                                   the core seeds (internal)
"""
import os
import subprocess
import sys

LIBS = ["/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libm.so.6",
        "/lib/x86_64-linux-gnu/libz.so.1", "/lib/x86_64-linux-gnu/libstdc++.so.6",
        "/lib/x86_64-linux-gnu/libgcc_s.so.1"]
SMALL_LIBS = ["/lib/x86_64-linux-gnu/libdl.so.2", "/lib/x86_64-linux-gnu/libutil.so.1",
              "/lib/x86_64-linux-gnu/librt.so.1", "/lib/x86_64-linux-gnu/libpthread.so.0"]
C_SOURCE = r"""
static int counter;
static inline __attribute__((always_inline)) int helper(int x) { counter += x * 3; return counter ^ x; }
__attribute__((noinline)) static int hidden(int x) { return helper(x) + 7; }
int outer(int x) { int r = helper(x + 1); return r + hidden(r); }
"""
NAMES = [b"_ZNSt6vectorIiSaIiEE9push_backERKi", b"_ZN3std2rt10lang_start17h9a1b2c3d4e5f6a7bE",
         b"_RNvXCs1234_5helloNtB2_3FooNtNtCsk_4core3fmt5Debug3fmt", b"_RINvCs1_1a1fTRShmEE",
         b"_ZZN1A1fEvE1x", b"_ZN9__gnu_cxx13new_allocatorIcED2Ev", b"_ZTVN10__cxxabiv117__class_type_infoE"]
MAX_LEN = {"cfi": 1 << 20, "elf": 1 << 16, "demangle": 256, "codec": 4096, "remote": 1 << 16, "core": 4096}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- seeds ----

def section(path, name):
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as f:
        s = ELFFile(f).get_section_by_name(name)
        return s.data() if s is not None else b""


def write_seeds(work):
    """{target: corpus directory}, filled from the machine's libraries."""
    dirs = {t: os.path.join(work, "corpus-" + t) for t in MAX_LEN}
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
    for lib in LIBS + SMALL_LIBS:
        data = section(lib, ".eh_frame") if os.path.exists(lib) else b""
        if 0 < len(data) <= MAX_LEN["cfi"]:
            with open(os.path.join(dirs["cfi"], os.path.basename(lib)), "wb") as f:
                f.write(data)
    src = os.path.join(work, "g.c")
    with open(src, "w") as f:
        f.write(C_SOURCE)
    for name, flags in [("dwarf5", ["-gdwarf-5"]), ("dwarf4", ["-gdwarf-4"]),
                        ("zlib", ["-gdwarf-5", "-Wl,--compress-debug-sections=zlib"])]:
        out = os.path.join(dirs["elf"], "g-%s.so" % name)
        subprocess.run(["gcc", "-O2", "-g", "-shared", "-fPIC", *flags, "-o", out, src], check=True)
    for lib in SMALL_LIBS:   # stripped distribution libraries: .dynsym only
        if os.path.exists(lib) and os.path.getsize(lib) <= MAX_LEN["elf"]:
            with open(lib, "rb") as f, open(os.path.join(dirs["elf"], os.path.basename(lib)), "wb") as g:
                g.write(f.read())
    for i, name in enumerate(NAMES):
        with open(os.path.join(dirs["demangle"], "name%d" % i), "wb") as f:
            f.write(name)
    # tokens are made by btcore itself: in a process that can load the fuzzing build
    subprocess.run([sys.executable, os.path.abspath(__file__), "--codec-seeds", dirs["codec"]],
                   env=fuzzer_env(), check=True, timeout=600)
    subprocess.run([sys.executable, os.path.abspath(__file__), "--remote-seeds", dirs["remote"]],
                   env=fuzzer_env(), check=True, timeout=600)
    subprocess.run([sys.executable, os.path.abspath(__file__), "--core-seeds", dirs["core"]],
                   env=fuzzer_env(), check=True, timeout=600)
    return dirs


def write_codec_seeds(folder):
    """Real tokens' bodies ("d" + bytes; "3", "2" + bytes for formats 3, 2) and
    backtraces of a few records."""
    import base64
    import random
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import fuzz_codec
    for i, token in enumerate(fuzz_codec.seeds()):
        prefix, body = token.split(".", 1)
        with open(os.path.join(folder, "token%d" % i), "wb") as f:
            f.write({"btc2": b"2", "btc3": b"3"}.get(prefix, b"d"))
            f.write(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    rng = random.Random(1)
    for i in range(8):
        with open(os.path.join(folder, "records%d" % i), "wb") as f:
            f.write(b"x" + rng.randbytes(4 * rng.choice((1, 5, 20, 60))))


def write_remote_seeds(folder):
    """Well-formed target images (tests/fuzz_remote.py's seed())."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import fuzz_remote
    for i, (greenlets, depth) in enumerate([(3, 2), (1, 1), (6, 4)]):
        with open(os.path.join(folder, "image%d" % i), "wb") as f:
            f.write(fuzz_remote.seed(greenlets, depth))


def write_core_seeds(folder):
    """Small well-formed cores (tests/fuzz_core.py's seeds())."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import fuzz_core
    for i, core in enumerate(fuzz_core.seeds()):
        with open(os.path.join(folder, "core%d" % i), "wb") as f:
            f.write(core)


def seed_addresses(corpus):
    """Function addresses of the ELF seeds: where btc_symbolize_file looks."""
    from elftools.elf.elffile import ELFFile
    addrs = set()
    for name in os.listdir(corpus):
        with open(os.path.join(corpus, name), "rb") as f:
            elf = ELFFile(f)
            for secname in (".symtab", ".dynsym"):
                sec = elf.get_section_by_name(secname)
                for s in (sec.iter_symbols() if sec else ()):
                    if s["st_info"]["type"] == "STT_FUNC" and s["st_value"]:
                        addrs.add(s["st_value"] + s["st_size"] // 2)
    return sorted(addrs)[:24]


# ---- the targets (run in the child, under atheris) ----

def target_cfi():
    from btcore._native import ffi, lib

    def one(data):
        buf = ffi.from_buffer(bytearray(data))   # a copy: the parser must never write
        assert lib.btc_cfi_selftest_garbage(buf, len(data)) != -2, "table invariants broken"
    return one


def target_elf(corpus):
    from btcore._native import ffi, lib
    addrs = seed_addresses(corpus)
    out = ffi.new("btc_srcframe[8]")
    buf = ffi.new("char[4096]")
    path = "/dev/shm/btcore-fuzz-%d.so" % os.getpid()
    counter = [0]
    value = ffi.new("uint64_t *")
    build_id = ffi.new("uint8_t[32]")

    def one(data):
        # a new name each time: the engine caches files by path and inode/size/mtime
        counter[0] += 1
        name = "%s.%d" % (path, counter[0])
        with open(name, "wb") as f:
            f.write(data)
        try:
            for a in addrs:
                n = lib.btc_symbolize_file(name.encode(), a, out, len(out), buf, len(buf))
                assert -1 <= n <= len(out), n
                for k in range(max(n, 0)):
                    if out[k].function != ffi.NULL:
                        ffi.string(out[k].function)
                    if out[k].file != ffi.NULL:
                        ffi.string(out[k].file)
            lib.btc_symbolize_reset()
            e = lib.btc_elf_open(name.encode())
            if e != ffi.NULL:
                for symbol in (b"outer", b"hidden", b"counter", b"memcpy"):
                    assert lib.btc_elf_symbol_value(e, symbol, value) in (0, -1)
                lib.btc_elf_close(e)
            fd = os.open(name, os.O_RDONLY)
            assert lib.btc_elf_file_build_id(fd, build_id, len(build_id)) >= -1
            os.close(fd)
        finally:
            os.unlink(name)
    return one


def target_demangle():
    from btcore._native import ffi, lib
    buf = ffi.new("char[256]")

    def one(data):
        name = data.split(b"\0", 1)[0]
        for size in (256, 9):
            assert lib.btc_demangle(name, buf, size) in (0, -1)
    return one


def target_codec():
    import base64
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import btcore
    import fuzz_codec
    from btcore import codec
    pcs, codes = fuzz_codec.encoder_pools()

    def one(data):
        if data[:1] in (b"d", b"3", b"2"):   # a token body: format 4 ("d"), 3 or 2
            prefix = codec.PREFIX if data[:1] == b"d" else f"btc{data[:1].decode()}."
            token = prefix + base64.urlsafe_b64encode(data[1:]).rstrip(b"=").decode()
            try:
                btcore.decode(token).frames()
            except ValueError:
                pass
        else:
            fuzz_codec.check_backtrace(fuzz_codec.backtrace_from_bytes(data, pcs, codes))
    return one


def target_remote():
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import fuzz_remote
    return fuzz_remote.check


def target_core():
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import fuzz_core
    return fuzz_core.check


def run_target(name, argv):
    import atheris
    corpora = [a for a in argv if not a.startswith("-")]
    one = {"cfi": target_cfi, "demangle": target_demangle, "codec": target_codec, "remote": target_remote,
           "core": target_core}.get(name)
    one = one() if one else target_elf(corpora[0])
    atheris.Setup([sys.argv[0], *argv], one)
    atheris.Fuzz()


# ---- the driver ----

def fuzzer_env():
    """The environment of a process that imports the fuzzing build of btcore."""
    import atheris
    return dict(os.environ, LD_PRELOAD=os.path.join(atheris.path(), "asan_with_fuzzer.so"),
                PYTHONMALLOC="malloc",
                ASAN_OPTIONS="detect_leaks=0:replace_intrin=0:allocator_may_return_null=1")


def fuzz(target, corpus, seconds, work):
    """(ok, executions, coverage, features, output tail)."""
    env = fuzzer_env()
    artifacts = os.path.join(work, "artifacts-%s" % target) + "/"
    os.makedirs(artifacts, exist_ok=True)
    cmd = [sys.executable, os.path.abspath(__file__), "--target", target, corpus,
           "-max_total_time=%d" % seconds, "-timeout=30", "-rss_limit_mb=2048",
           "-max_len=%d" % MAX_LEN[target], "-print_final_stats=1", "-artifact_prefix=" + artifacts]
    done = subprocess.run(cmd, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", timeout=seconds + 600)
    log = done.stdout
    import re
    found = re.search(r"^stat::number_of_executed_units:\s*(\d+)", log, re.M)
    execs = int(found.group(1)) if found else 0
    progress = re.findall(r"cov: (\d+) ft: (\d+)", log)   # libFuzzer's status lines; the last is the final one
    cov, ft = progress[-1] if progress else ("?", "?")
    ok = done.returncode == 0 and not os.listdir(artifacts)
    return ok, execs, cov, ft, log[-4000:]


def main():
    if sys.argv[1] == "--codec-seeds":
        write_codec_seeds(sys.argv[2])
        return 0
    if sys.argv[1] == "--remote-seeds":
        write_remote_seeds(sys.argv[2])
        return 0
    if sys.argv[1] == "--core-seeds":
        write_core_seeds(sys.argv[2])
        return 0
    if sys.argv[1] == "--target":
        run_target(sys.argv[2], [a for a in sys.argv[3:] if a != "--"])
        return 0
    seconds, work = int(sys.argv[1]), os.path.abspath(sys.argv[2])
    os.makedirs(work, exist_ok=True)
    dirs = write_seeds(work)
    failed = []
    total = 0
    for target in MAX_LEN:
        ok, execs, cov, ft, tail = fuzz(target, dirs[target], seconds, work)
        total += execs
        print("fuzz: %-8s %s: %d inputs in %d s, coverage %s edges, %s features, corpus %d files"
              % (target, "ok" if ok else "FAILED", execs, seconds, cov, ft, len(os.listdir(dirs[target]))))
        if not ok:
            print(tail)
            failed.append(target)
    print("fuzz: %s: %d inputs, %d targets, crashes/hangs/oom in: %s"
          % ("FAILED" if failed else "OK", total, len(MAX_LEN), ", ".join(failed) or "none"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
