"""The one ELF reader (native/symbols/elf.c, elf_core.c) against pyelftools,
the independent oracle: symbols by name, build-ids from PT_NOTE segments,
and a core file's segments, threads, auxiliary vector and mapped files.
These are what the dump of another process reads (btcore/remote/snapshot.py,
btcore/remote/process.py, btcore/codec.py); pyelftools is not among btcore's
run-time dependencies."""
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap

import greenlet
import pytest
from elftools.elf.elffile import ELFFile

import conftest
from btcore._native import ffi, lib
from btcore.remote.snapshot import symbol_value

FIXTURE = r"""
int foobar(void) { return 2; }
int bar(void) { return 1; }           /* its name is the tail of foobar's: the linker shares the string */
int data_object = 5;
static int hidden_static(int x) { return x * 3; }
int (*keep)(int) = hidden_static;
extern int undefined_elsewhere(void);
int calls_out(void) { return undefined_elsewhere(); }
"""


@pytest.fixture(scope="module")
def fixture_so(tmp_path_factory):
    d = tmp_path_factory.mktemp("elfreader")
    (d / "f.c").write_text(FIXTURE)
    so = d / "f.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(so), str(d / "f.c")], check=True)
    return str(so)


def _oracle_values(path):
    """name -> value of the first defined symbol of that name, .dynsym before .symtab."""
    values = {}
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for name in (".dynsym", ".symtab"):
            table = elf.get_section_by_name(name)
            for s in table.iter_symbols() if table is not None else ():
                if s.name and s["st_shndx"] != "SHN_UNDEF":
                    values.setdefault(s.name, s["st_value"])
    return values


def _native_value(path, name):
    e = lib.btc_elf_open(path.encode())
    assert e != ffi.NULL
    try:
        value = ffi.new("uint64_t *")
        return value[0] if lib.btc_elf_symbol_value(e, name.encode(), value) == 0 else None
    finally:
        lib.btc_elf_close(e)


def test_symbol_values_equal_pyelftools_in_a_fixture(fixture_so):
    # guards: btc_elf_symbol_value finds every defined symbol (functions, data, statics), a name stored as the
    # tail of another's (which a search for "\0name\0" in the string table misses), and no undefined one
    oracle = _oracle_values(fixture_so)
    for name in ("foobar", "bar", "data_object", "hidden_static", "calls_out"):
        assert name in oracle, name
        assert symbol_value(fixture_so, name) == oracle[name], name
    assert symbol_value(fixture_so, "undefined_elsewhere") is None
    assert symbol_value(fixture_so, "no_such_symbol") is None


def test_symbol_values_equal_pyelftools_in_the_interpreter(interpreter_module):
    # guards: .dynsym first, then .symtab (a stripped copy keeps .dynsym only), over a big real file
    oracle = _oracle_values(interpreter_module)
    names = ["_PyRuntime", "Py_Version", "PyCode_Type", "PyEval_EvalCode"]
    names += random.Random(26).sample(sorted(oracle), 300)
    for name in names:
        assert _native_value(interpreter_module, name) == oracle.get(name), name


def _oracle_build_id(path):
    with open(path, "rb") as f:
        for seg in ELFFile(f).iter_segments():
            if seg["p_type"] == "PT_NOTE":
                for note in seg.iter_notes():
                    if note["n_type"] == "NT_GNU_BUILD_ID":
                        return bytes.fromhex(note["n_desc"])
    return None


def _native_build_id(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        out = ffi.new("uint8_t[64]")
        n = lib.btc_elf_file_build_id(fd, out, len(out))
        return None if n == 0 else n if n < 0 else bytes(out[0:n])
    finally:
        os.close(fd)


def test_build_ids_equal_pyelftools(fixture_so, tmp_path):
    # guards: btc_elf_file_build_id reads the GNU note of the PT_NOTE segments (not another note, not none)
    paths = [conftest.INTERPRETER_PATH, greenlet._greenlet.__file__, fixture_so, os.path.realpath(sys.executable)]
    for path in paths:
        assert _native_build_id(path) == _oracle_build_id(path), path
    assert _native_build_id(fixture_so) is not None
    (tmp_path / "n.c").write_text("int f(void) { return 1; }\n")
    none = tmp_path / "n.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,--build-id=none", "-o", str(none), str(tmp_path / "n.c")],
                   check=True)
    assert _oracle_build_id(str(none)) is None and _native_build_id(str(none)) is None
    (tmp_path / "text").write_bytes(b"not an ELF file at all, but long enough for a header" * 4)
    assert _native_build_id(str(tmp_path / "text")) == -1


CORE_TARGET = textwrap.dedent("""
    import sys, threading, time
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
    print("ready", flush=True)
    time.sleep(600)
""")


@pytest.fixture(scope="module")
def core_file(tmp_path_factory):
    if not shutil.which("gcore"):
        pytest.skip("gcore (gdb) is not installed")
    if conftest.UNDER_ASAN:
        pytest.skip("gcore writes ASan's reserved shadow and heap: a 71 GB core")
    if not conftest.DUMPS_OTHER_PROCESSES:
        pytest.skip(conftest.NO_DUMP_HERE)
    d = tmp_path_factory.mktemp("core")
    proc = subprocess.Popen([sys.executable, "-c", CORE_TARGET], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        subprocess.run(["gcore", "-o", str(d / "core"), str(proc.pid)], check=True, capture_output=True,
                       timeout=120)
    finally:
        proc.kill()
        proc.wait()
    return str(d / f"core.{proc.pid}"), proc.pid


def _native_core(path, room=(4096, 64, 4096, 1 << 20)):
    c = ffi.new("btc_core *")
    keep = [ffi.new("btc_core_segment[]", room[0]), ffi.new("btc_core_thread[]", room[1]),
            ffi.new("btc_core_file[]", room[2]), ffi.new("char[]", room[3])]
    c.segments, c.threads, c.files, c.paths = keep
    c.max_segments, c.max_threads, c.max_files, c.paths_size = room
    with open(path, "rb") as f:
        rc = lib.btc_core_read(f.fileno(), c)
    return rc, c, keep


def _raw(desc):
    return desc if isinstance(desc, bytes) else bytes(desc, "latin-1")


def _oracle_core(path):
    segments, threads, files, vdso = [], [], [], None
    with open(path, "rb") as f:
        for seg in ELFFile(f).iter_segments():
            if seg["p_type"] == "PT_LOAD" and seg["p_filesz"]:
                segments.append((seg["p_vaddr"], seg["p_filesz"], seg["p_memsz"], seg["p_offset"]))
            for note in seg.iter_notes() if seg["p_type"] == "PT_NOTE" else ():
                if note["n_type"] == "NT_PRSTATUS":
                    threads.append(int.from_bytes(_raw(note["n_desc"])[32:36], "little", signed=True))
                elif note["n_type"] == "NT_AUXV":
                    raw = _raw(note["n_desc"])
                    pairs = [(int.from_bytes(raw[i:i + 8], "little"), int.from_bytes(raw[i + 8:i + 16], "little"))
                             for i in range(0, len(raw) - 15, 16)]
                    vdso = next(value for kind, value in pairs if kind == 33)   # AT_SYSINFO_EHDR
                elif note["n_type"] == "NT_FILE":
                    page = note["n_desc"]["page_size"]
                    for entry, name in zip(note["n_desc"]["Elf_Nt_File_Entry"], note["n_desc"]["filename"]):
                        files.append((entry["vm_start"], entry["vm_end"], entry["page_offset"] * page,
                                      name.decode() if isinstance(name, bytes) else name))
    return segments, threads, files, vdso


def test_core_notes_equal_pyelftools(core_file):
    # guards: btc_core_read's PT_LOAD segments, NT_PRSTATUS threads (the process's first), NT_AUXV's vDSO and
    # NT_FILE's mappings, each as pyelftools decodes them
    path, pid = core_file
    rc, c, _keep = _native_core(path)
    assert rc == 0
    segments, threads, files, vdso = _oracle_core(path)
    assert [(s.vaddr, s.filesz, s.memsz, s.offset) for s in c.segments[0:c.nsegments]] == segments
    assert [t.tid for t in c.threads[0:c.nthreads]] == threads and threads[0] == pid and len(threads) == 2
    assert [(e.lo, e.hi, e.offset, ffi.string(c.paths + e.path_at).decode()) for e in c.files[0:c.nfiles]] == files
    assert c.vdso == vdso and vdso
    with open(path, "rb") as f:   # the vDSO is an ELF image the core holds
        f.seek(next(off + vdso - vaddr for vaddr, size, _, off in segments if vaddr <= vdso < vaddr + size))
        assert f.read(4) == b"\x7fELF"
    assert any(os.path.realpath(p) == os.path.realpath(sys.executable) or "libpython" in p for *_, p in files)


def test_core_registers_are_the_threads_own(core_file):
    # guards: the register words taken from elf_prstatus.pr_reg (user_regs_struct's rip, rsp, rbp, rbx), from
    # each thread's own note: both threads sleep in libc, on a stack the core holds
    path, _ = core_file
    rc, c, _keep = _native_core(path)
    segments, _, files, _ = _oracle_core(path)
    with open(path, "rb") as f:
        notes = [_raw(n["n_desc"]) for seg in ELFFile(f).iter_segments() if seg["p_type"] == "PT_NOTE"
                 for n in seg.iter_notes() if n["n_type"] == "NT_PRSTATUS"]
    libc = [(lo, hi) for lo, hi, _, p in files if os.path.basename(p).startswith("libc.so")]
    assert libc and len(notes) == c.nthreads == 2
    for t, raw in zip(c.threads[0:c.nthreads], notes):
        words = [int.from_bytes(raw[112 + 8 * i:120 + 8 * i], "little") for i in range(27)]
        assert tuple(t.regs) == (words[16], words[19], words[4], words[5])
        ip, sp = t.regs[0], t.regs[1]
        assert any(lo <= ip < hi for lo, hi in libc), hex(ip)
        assert any(vaddr <= sp < vaddr + filesz for vaddr, filesz, _, _ in segments), hex(sp)


def test_core_read_asks_for_room_it_needs(core_file):
    # guards: counts beyond the capacity give -3 and the room needed, never a write past the arrays
    path, _ = core_file
    rc, c, _keep = _native_core(path)
    need = (c.nsegments, c.nthreads, c.nfiles, c.paths_used)
    rc, small, _keep2 = _native_core(path, (1, 1, 1, 8))
    assert rc == -3
    assert (small.nsegments, small.nthreads, small.nfiles, small.paths_used) == need
    rc, exact, _keep3 = _native_core(path, need)
    assert rc == 0
    for short in range(4):   # each capacity is checked
        rc, _, _keep4 = _native_core(path, tuple(n - (k == short) for k, n in enumerate(need)))
        assert rc == -3, short


def test_the_dump_reads_a_core_that_needs_more_room_than_its_first_guess(core_file, monkeypatch):
    # guards: remote/process.py's second read of the notes, with the room the first read asked for
    from btcore.remote import process
    from btcore.remote.snapshot import Memory
    path, pid = core_file

    def read():
        f = open(path, "rb")
        memory = Memory(lib.btc_rmem_open_segments(), [f])
        try:
            return process._read_core(path, f, memory)
        finally:
            memory.close()
    mappings, regs_of, vdso, cut = read()
    monkeypatch.setattr(process, "_CORE_ROOM", (1, 1, 1, 8))
    assert read() == (mappings, regs_of, vdso, None) and cut is None
    assert next(iter(regs_of)) == pid and len(mappings) > 10 and vdso


def test_core_read_refuses_what_is_not_a_core(fixture_so, tmp_path):
    with open(fixture_so, "rb") as f:
        c = ffi.new("btc_core *")
        assert lib.btc_core_read(f.fileno(), c) == -2
    (tmp_path / "text").write_bytes(b"x" * 200)
    with open(tmp_path / "text", "rb") as f:
        assert lib.btc_core_read(f.fileno(), c) == -1


def test_a_cut_core_or_another_elf_file_is_named_for_what_it_is(core_file, fixture_so, tmp_path):
    # guards: remote/process.py's core messages: a core cut inside its headers, or before its notes, said
    # "process 0 is not a CPython process" or "not a core file"; an executable "not a core file of an x86-64
    # process" (it is x86-64: it is not a core).
    path, _ = core_file
    data = open(path, "rb").read()

    def dump(name, content):
        (tmp_path / name).write_bytes(content)
        return subprocess.run([sys.executable, "-m", "btcore", "dump", "--core", str(tmp_path / name)],
                              capture_output=True, text=True, timeout=120)
    headers = dump("headers", data[:int.from_bytes(data[32:40], "little") + 2 * 56])   # e_phoff: 2 headers of many
    assert headers.returncode == 1 and "is a core file cut short (truncated) before the end of its headers" \
        in headers.stderr, headers.stderr
    notes = dump("notes", data[:len(data) // 2])
    assert notes.returncode == 1 and "holds no thread (no NT_PRSTATUS note): it is truncated (" in notes.stderr, \
        notes.stderr
    other = dump("so", open(fixture_so, "rb").read())
    assert other.returncode == 1 and "is not a core file (it is a shared object or executable)" in other.stderr


@pytest.mark.parametrize("xnum", [False, True], ids=["phnum", "PN_XNUM"])
def test_a_small_core_is_read_as_built(xnum):
    # guards: the decoding of each note's description on a core whose contents are known (fuzz_core's seed);
    # PN_XNUM: the count of program headers a core with >= 65 535 mappings keeps in section 0
    import fuzz_core
    fd = os.memfd_create("btcore-core")
    try:
        os.write(fd, fuzz_core.tiny_core(xnum=xnum))
        rc, c, _keep = fuzz_core.read(fd)
    finally:
        os.close(fd)
    assert rc == 0
    assert [(t.tid, *t.regs) for t in c.threads[0:c.nthreads]] == fuzz_core.THREADS
    assert [(e.lo, e.hi, e.offset, ffi.string(c.paths + e.path_at)) for e in c.files[0:c.nfiles]] == \
        [(lo, hi, pages * 4096, path) for lo, hi, pages, path in fuzz_core.FILES]
    assert [(s.vaddr, s.filesz) for s in c.segments[0:c.nsegments]] == [(fuzz_core.LOAD_VADDR, 64)]
    assert c.vdso == fuzz_core.VDSO


def test_garbage_cores_and_headers():
    # guards: every bound of btc_core_read and btc_elf_file_build_id on mutated and truncated cores (a child
    # process: a crash is a failed test with its seed, not a dead session; ci/fuzz.py runs it coverage-guided)
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-P", os.path.join(here, "fuzz_core.py"), "20000", "--seed", "26"],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONFAULTHANDLER="1"))
    assert done.returncode == 0 and "every result within its bounds" in done.stdout, done.stderr[-3000:]


NO_PYELFTOOLS = textwrap.dedent("""
    import sys
    sys.modules["elftools"] = None   # any import of pyelftools now fails
    import btcore.__main__
    sys.exit(btcore.__main__.main(sys.argv[1:]))
""")


def test_a_core_dump_needs_no_pyelftools(core_file):
    # guards: pyelftools is a test dependency only (pyproject.toml): the dump of a core reads it with elf.c
    path, pid = core_file
    done = subprocess.run([sys.executable, "-P", "-c", NO_PYELFTOOLS, "dump", "--json", "--core", path, "--exe",
                           sys.executable], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "elftools" not in done.stderr
    doc = json.loads(done.stdout)
    stacks = {st["id"]: st for st in doc["stacks"]}
    threads = [stacks[g["stack"]] for g in doc["greenlets"] if g["state"] == "running"]   # one a thread
    assert doc["pid"] == pid and len(threads) == 2 and all(len(st["frames"]) > 3 for st in threads)
