"""Shared fixtures for btcore's tests.

``chain``: the native call-chain fixture (tests/fixtures/chain.cpp), compiled
once per session with cffi (API mode, C++, -O2 -g, no frame pointers) into a
temporary directory.  It unpacks as ``ffi, lib, so_path``; see
tests/fixtures/build_chain.py for the callback helpers.

``chain_symbols``: name -> (start, end) absolute address ranges of the chain's
functions, read from the .so's symbol table with pyelftools (an oracle
independent of btcore's own symbolizer).
"""
import atexit
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

# Running under ci/asan.sh: libasan is preloaded.  Its backtrace()
# interceptor adds a frame to glibc-oracle stacks, and valgrind cannot run
# an ASan process: those tests skip themselves.
with open("/proc/self/maps") as _maps:
    UNDER_ASAN = "libasan" in _maps.read()
# ci/arm64.sh runs the suite under qemu-user and sets QEMU_CPU for every
# program it starts: the few measures of the process itself (RSS, fork
# timing) are then measures of the emulator.
UNDER_QEMU = "QEMU_CPU" in os.environ
# Under ASan, the environment of a child that crashes on purpose: ASan leaves
# the fatal signals to the handlers the program installs, so that btcore's
# crash handler runs instrumented (ASan checks each of its own loads and
# stores; its reads of the crashed process go through process_vm_readv).
ASAN_CRASH_CHILD_ENV = {"ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "") + ":allow_user_segv_handler=1"
                        ":handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_sigill=0:handle_abort=0"
                        } if UNDER_ASAN else {}
# python -m btcore dump parses x86-64's ptrace and core-file registers only
# (docs/platforms.md); elsewhere it refuses before it stops anything.
DUMPS_OTHER_PROCESSES = platform.machine() == "x86_64"
NO_DUMP_HERE = "the dump of another process reads x86-64 registers only"
QEMU_NO_OWN_READS = ("qemu-user: process_vm_readv is not emulated: the crash handler reads its own memory "
                     "with it (a corrupt heap gives EFAULT, not a second fault), so its report has no Python frame")
skip_under_asan = pytest.mark.skipif(UNDER_ASAN, reason="ASan's backtrace() interceptor shifts the glibc oracle")
# Go's own build cache (where `go tool pprof` is built at its first use: tests/test_profile.py), found as Go
# finds it, before the session's XDG_CACHE_HOME below replaces the user's.
GO_CACHE = os.environ.get("GOCACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "go-build")
# A dump remembers the offsets it learned of gevent's fields across runs (remote_names.learned_offsets_file()):
# each test session learns afresh, in a folder of its own, so that a change to the learning is tested.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="btcore-test-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)


def _load_build_chain():
    name = "btfix_build_chain"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "fixtures", "build_chain.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


build_chain = _load_build_chain()


@pytest.fixture(scope="session")
def chain(tmp_path_factory):
    return build_chain.build(tmp_path_factory.mktemp("chain_build"))


@pytest.fixture(scope="session")
def chain_symbols(chain):
    """{symbol name (raw, as in .symtab): (start, end)} absolute, for FUNC symbols."""
    from elftools.elf.elffile import ELFFile

    syms = {}
    with open(chain.so_path, "rb") as f:
        elf = ELFFile(f)
        symtab = elf.get_section_by_name(".symtab")
        assert symtab is not None, "fixture .so has no .symtab"
        for s in symtab.iter_symbols():
            if s["st_info"]["type"] == "STT_FUNC" and s["st_value"]:
                syms[s.name] = (s["st_value"], s["st_value"] + s["st_size"])
    bias = chain.fn_addr(build_chain.FN_CHAIN_ENTRY) - syms["chain_entry"][0]
    return {name: (lo + bias, hi + bias) for name, (lo, hi) in syms.items()}


# ---- the interpreter's own module, found at run time ----
#
# The host's CPython is a shared libpython with full DWARF; Debian's python3.X
# links libpython statically into the executable and strips it (.dynsym only,
# no DWARF).  Tests ask these helpers what they can rely on instead of
# hard-coding either shape.

EVAL_LOOP = "_PyEval_EvalFrameDefault"


def _mapping_of(addr):
    """(path, load bias) of the file mapping containing addr, from /proc/self/maps."""
    first = {}
    found = None
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5]
            if int(parts[2], 16) == 0:
                first.setdefault(path, lo)
            if lo <= addr < hi:
                found = path
    if found is None:
        raise RuntimeError(f"no file mapping contains {addr:#x}")
    from elftools.elf.elffile import ELFFile
    with open(found, "rb") as f:
        elf = ELFFile(f)
        is_exec = elf["e_type"] == "ET_EXEC"
        vaddr0 = min(s["p_vaddr"] for s in elf.iter_segments() if s["p_type"] == "PT_LOAD")
    return os.path.realpath(found), 0 if is_exec else first[found] - (vaddr0 & ~0xfff)


def _interpreter_module():
    import ctypes
    addr = ctypes.cast(ctypes.pythonapi.PyEval_EvalCode, ctypes.c_void_p).value
    return _mapping_of(addr)


INTERPRETER_PATH, INTERPRETER_BIAS = _interpreter_module()


def _sections(path):
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as f:
        return {s.name for s in ELFFile(f).iter_sections()}


_INTERP_SECTIONS = _sections(INTERPRETER_PATH)
# The interpreter module has DWARF (file:line oracles work) / a full symbol
# table (static functions such as thread_run have names).
INTERPRETER_HAS_DWARF = ".debug_info" in _INTERP_SECTIONS
INTERPRETER_HAS_SYMTAB = ".symtab" in _INTERP_SECTIONS
INTERPRETER_IS_LIBPYTHON = "libpython" in os.path.basename(INTERPRETER_PATH)


@pytest.fixture(scope="session", params=["installed", "stripped"])
def interpreter_module(request, tmp_path_factory):
    """The interpreter's module as installed, then a copy stripped the way
    distributions strip theirs (.dynsym kept; .symtab and DWARF gone), so
    that what tests check on Debian's stripped python3.X also runs here."""
    if request.param == "installed":
        return INTERPRETER_PATH
    import subprocess
    stripped = tmp_path_factory.mktemp("stripped") / os.path.basename(INTERPRETER_PATH)
    subprocess.run(["strip", "--strip-all", "-o", str(stripped), INTERPRETER_PATH], check=True)
    return str(stripped)


def _eval_loop_ranges():
    """Absolute [lo, hi) ranges of the eval loop, found independently of
    btcore: the named parts from the symbol table (pyelftools), and, for a
    stripped build, the unnamed parts its direct jumps lead to (objdump
    decodes the jumps; pyelftools gives the FDE covering each target; a
    target whose FDE begins like a function, CFA = rsp + 8, is a tail call)."""
    import re
    import subprocess
    from elftools.elf.elffile import ELFFile
    named = []
    with open(INTERPRETER_PATH, "rb") as f:
        elf = ELFFile(f)
        for secname in (".symtab", ".dynsym"):
            sec = elf.get_section_by_name(secname)
            if sec is None:
                continue
            for s in sec.iter_symbols():
                if (s.name == EVAL_LOOP or s.name.startswith(EVAL_LOOP + ".")) and s["st_size"]:
                    r = (s["st_value"], s["st_value"] + s["st_size"])
                    if r not in named:
                        named.append(r)
        if INTERPRETER_HAS_SYMTAB:
            return [(lo + INTERPRETER_BIAS, hi + INTERPRETER_BIAS) for lo, hi in named]
        targets = set()
        for lo, hi in named:
            out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={lo:#x}",
                                  f"--stop-address={hi:#x}", INTERPRETER_PATH],
                                 capture_output=True, text=True, check=True).stdout
            for m in re.finditer(r"^\s*[0-9a-f]+:\s+j[a-z]+\s+([0-9a-f]+)\b", out, re.M):
                t = int(m.group(1), 16)
                if not any(a <= t < b for a, b in named):
                    targets.add(t)
        parts = []
        for entry in elf.get_dwarf_info().EH_CFI_entries():
            if type(entry).__name__ != "FDE":
                continue
            lo = entry.header["initial_location"]
            hi = lo + entry.header["address_range"]
            if any(lo <= t < hi for t in targets):
                cfa = entry.get_decoded().table[0]["cfa"]
                if not (cfa.reg == 7 and cfa.offset == 8):
                    parts.append((lo, hi))
    return [(lo + INTERPRETER_BIAS, hi + INTERPRETER_BIAS) for lo, hi in named + parts]


_eval_ranges_cache = []


def eval_loop_ranges():
    if not _eval_ranges_cache:
        _eval_ranges_cache.append(_eval_loop_ranges())
    return _eval_ranges_cache[0]


def is_eval_loop(f):
    """A native frame of the eval loop (named, or an unnamed part of it)."""
    if f.kind != "native":
        return False
    if (f.function or "").split(".")[0] == EVAL_LOOP:
        return True
    pc = f.ip - 1   # return addresses (the innermost frame is never the eval loop here)
    return f.function is None and any(lo <= pc < hi for lo, hi in eval_loop_ranges())


def in_interpreter(f):
    """A native frame of the interpreter's module (libpython, or the
    python3.X executable it is linked into)."""
    return f.kind == "native" and bool(f.module) and os.path.realpath(f.module) == INTERPRETER_PATH


# ---- oracles installed on demand ----


def wait_until_ready(proc, ready, timeout):
    """Wait for a target process to write its ready file (non-empty); fail if it exits first or takes
    longer than timeout seconds."""
    import time
    deadline = time.monotonic() + timeout
    while not (ready.exists() and ready.stat().st_size) and proc.poll() is None:
        assert time.monotonic() < deadline, "the target did not get ready"
        time.sleep(0.05)
    assert proc.poll() is None, "the target exited before it was ready"


def apt_install(tools, packages, skip_prefix):
    """None once every tool is on PATH, installing the Debian packages when
    they are not (root with apt only), else why they cannot be: a skip reason
    starting with skip_prefix (listed in ALLOWED_SKIPS)."""
    missing = lambda: [tool for tool in tools if shutil.which(tool) is None]   # noqa: E731
    if not missing():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"{skip_prefix}: {missing()} missing, and apt-get needs root and apt"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *packages]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
        if proc.returncode:
            return f"{skip_prefix}: {' '.join(cmd)} failed: {proc.stderr.strip()[-300:]}"
    return f"{skip_prefix}: still missing after apt-get: {missing()}" if missing() else None




# ---- skips: only for a documented reason ----
#
# A test that silently stops running is a hole nobody sees.  A skip whose
# reason matches none of these (regex, why it is legitimate) fails the
# session, however the run was started.
ALLOWED_SKIPS = [
    # only under ci/asan.sh (UNDER_ASAN)
    (r"ASan's backtrace\(\) interceptor shifts the glibc oracle",
     "ASan's interceptor replaces glibc's backtrace() in the tests that call it from C directly"),
    (r"valgrind cannot run a process that loads ASan", "valgrind and ASan cannot share a process"),
    (r"ASan's quarantine grows RSS without a leak", "RSS is no leak measure under ASan; the plain run measures it"),
    (r"ASan reserves terabytes of address space: no RLIMIT_AS test",
     "an address-space limit cannot be set under ASan's shadow memory; the plain run tests out of memory"),
    (r"^gcore writes ASan's reserved shadow and heap: a 71 GB core$",
     "gdb's gcore copies ASan's terabyte reservations into the core file (71 GB written before the disk "
     "filled); the core-file reader is tested in the plain suite only"),
    (r"greenlet copied part of A \(\d+ bytes\): no unspilled case",
     "the unspilled-greenlet tests need greenlet to leave a stack in place; whether it does "
     "depends on where the stacks happen to lie at run time"),
    (r"^the README sample is the demo on CPython 3.11 with a shared libpython with DWARF$",
     "the README shows the demo's output on the host's interpreter; the chroot's stripped 3.13-3.15 print "
     "other names (the demo itself runs everywhere: test_demo_runs_from_the_checkout_root)"),
    (r"^no native frame has DWARF here$",
     "short source paths need a frame with DWARF; Debian's stripped static python3.X has none"),
    (r"^x86-64's CFI forms$", "PLT-stub and __restore_rt CFA expressions exist on x86-64 only"),
    (r"^aarch64's pointer authentication$", "return-address signing (PAC) exists on aarch64 only"),
    (r"^no vDSO in this process \(qemu-user gives its guest none\)$",
     "qemu-user (the arm64 lane) maps no vDSO for its guest: there is none to name; the x86-64 lanes name "
     "every function of theirs"),
    (r"^exec opens the program at a closed standard input \(qemu-user's AT_EXECFD 0\)$",
     "under qemu-user a program started with descriptor 0 closed finds its own executable there (binfmt_misc's "
     "O flag, and qemu takes AT_EXECFD 0 for none): the closed-input case cannot be set up; the x86-64 lanes "
     "run it"),
    (r"^qemu-user does not emulate /proc/self/map_files$",
     "under qemu-user /proc/self/map_files is the host's qemu process's, not the guest's; the x86-64 lanes "
     "run the upgraded-library and relative-path tests"),
    (r"^opening /proc/self/map_files needs CAP_SYS_ADMIN \(root\)$",
     "the kernel lets only a process with CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE open it; CI runs as root, "
     "and the case without it (frames left unnamed) runs for every user"),
    (r"^setpriv is not installed$",
     "util-linux's setpriv drops root's capabilities for the case without map_files; a non-root run has that "
     "case without it"),
    (r"^CPU without pointer authentication \(run under QEMU_CPU=max\)$",
     "signed return addresses exist only where the CPU implements PAC; ci/arm64.sh runs tests/test_arch.py "
     "under qemu's max model, which does"),
    (r"^3\.11's entry flag is a byte of the frame ",
     "the entry-flag test feeds 3.11's frame layout to the walker: a 3.11 interpreter's frames only; the one "
     "walker is checked against CPython's own view on every lane (tests/test_pylayout.py)"),
    (r"^3\.11's table is pinned to its headers at compile time ",
     "the debug-offsets table is compared with this build's compiled offsets on 3.13-3.15, which publish "
     "_Py_DebugOffsets; 3.11's table is checked by static assertions when btcore is built for 3.11"),
    (r"^the dump of another process reads x86-64 registers only$",
     "python -m btcore dump parses x86-64's ptrace and core-file registers only (docs/platforms.md); "
     "tests/test_arch.py checks that it refuses cleanly elsewhere (and qemu-user, which runs the aarch64 "
     "lane, implements no ptrace at all)"),
    (r"^no separate debug file for libc here \(libc6-dbg\), or no symbol-less address in it$",
     "the test reads libc's first symbol-less address through its separate debug file (libc6-dbg); the host "
     "lane has that file and runs it, the chroot lanes (ci/arm64.sh installs no libc6-dbg) skip it"),
    (r"^qemu-user: ",
     "under ci/arm64.sh's emulation, RSS includes qemu's translated-code cache, a child forked from a "
     "multithreaded process can stall in the emulator, valgrind does not run, and qemu places guest "
     "mappings itself (a freed range is not reused), and process_vm_readv is not emulated (the signal-context "
     "reader probes heap frames, a coroutine's, with it); the host suite runs these tests"),
    (r"^stripped interpreter: the example names its static C functions$",
     "the watchdog and stuck-dump examples assert the regex engine's or time.sleep's C function by name; "
     "Debian's stripped python3.X has no name for them (tests/test_watchdog.py covers the modes there "
     "with a fixture library that keeps its names)"),
    (r"^stripped interpreter: no DWARF to (bound|compress)$",
     "the memory-bound and compressed-section tests use libpython's DWARF (many compile units); Debian's "
     "stripped static python3.X has none (the small libraries built in test_symbolize.py cover compression)"),
    (r"^under ASan its malloc comes first in the process$",
     "the malloc-forbidden crash test preloads a malloc that hangs; under ASan (ci/asan.sh) libasan's malloc "
     "must come first in LD_PRELOAD and would be the one called: the host suite runs it"),
    (r"^3\.14\+'s WeakSet has no pending removals$",
     "WeakSet iterates a copy of its set on 3.14+ and removes at once: the hook's path for a registry with "
     "removals pending runs on 3.11-3.13 only"),
    (r"^no CPython 3\.1[3-5] in a sid chroot here ",
     "the cross-version dump test runs 3.13-3.15 targets from the cached sid chroot (ci/sid-matrix.sh builds it); "
     "without it, or inside the chroot (where the whole dump module skips), it cannot run"),
    (r"^no mount namespace here \(unshare -m refused: ",
     "the FIFO-over-a-library tests bind-mount in a private mount namespace; unshare -m needs root and "
     "fails inside the sid and arm64 chroots (their root is no mount point); the host suite, root in CI, "
     "runs them"),
    (r"^uvloop is not installed$",
     "uvloop (an event loop written in C: the watchdog's rule for a wait with no Python frame) is a test extra "
     "of the host lane only, as the recipe servers below are (pyproject.toml: its wheels lag new CPythons and "
     "a source build needs libuv's toolchain); the other lanes run the same tests on asyncio's own loop"),
    (r"^(locust|celery|uWSGI) is not installed$",
     "the servers of the signal-dump recipes are test extras of the host lane only (CPython 3.11 on x86-64, "
     "pyproject.toml says why); the sid and arm64 lanes skip those recipe tests, the host lane runs them"),
    (r"^Go cannot be installed: ",
     "go tool pprof is the independent reader of the profiler's pprof files; tests/test_profile.py installs "
     "golang-go with apt-get when it runs as root with apt, and skips only where it cannot (the test's own "
     "decoder of the format still runs)"),
    (r"^the matrix's oracle reads core files, which ASan turns off$",
     "the crash matrix compares the report with gdb on the crash's core file; ASan sets disable_coredump "
     "(its shadow memory would make terabyte cores); tests/test_crash.py runs the handler instrumented "
     "under ASan (the fatal signals left to the program's handlers), and the plain run runs the matrix"),
    (r"^LeakSanitizer needs /proc$",
     "the no-/proc fallback test unmounts /proc for the decoding child, where LeakSanitizer cannot run"),
    (r"^ASan's allocator is not fork-safe while another thread allocates \(gcc 12\)$",
     "a child forked while another thread allocates (the profiler's sampler, a thread resolving frames) can hang "
     "in libasan's allocator (gcc 12's takes no allocator locks around fork, docs/safety.md; ci39 saw 1 child of "
     "500); the plain run tests the forked child"),
    (r"^aarch64's integer division by zero does not trap$",
     "the SIGFPE crash is made by an integer division by zero, which only x86-64 traps (aarch64 returns 0)"),
    (r"^no object layout table for this CPython \(robjects\.c: 3\.11, 3\.13-3\.15\)$",
     "greenlet names read from outside need the target's object offsets (native/remote/robjects.c); every "
     "lane's version (3.11 host, 3.13-3.15 sid) has its column, so this fires only on another version"),
    (r"^asyncio\.capture_call_graph is 3\.14\+$",
     "the oracle of the await-chain test is CPython 3.14's own call graph; before 3.14 the same chains are "
     "checked against Task.get_stack() and the awaited functions (tests/test_tasks.py)"),
    (r"^3\.11's task types are static \(found in _asyncio's data\)$",
     "the stripped-_asyncio test guards how an outside dump finds 3.11's static task types without symbols; "
     "3.13-3.15's task types are heap types, found by name among the interpreter's objects (_heap_types), "
     "not in _asyncio's data"),
    (r"^\.AsyncioDebug is 3\.14\+'s$",
     "the outside dump reads 3.14+'s task lists at the offsets _asyncio's .AsyncioDebug section gives: there is "
     "no such section before 3.14 (its tasks are found in the gc lists)"),
    (r"^btcore knows the asyncio objects of 3\.11 and 3\.13-3\.15$",
     "the outside dump reads asyncio's objects at offsets known per version family (native/remote/rtasks.c): "
     "3.11 and 3.13-3.15, the versions this project tests"),
    (r"^the corrupting target locates fields with 3\.11's layout$",
     "the hostile-target corpus corrupts a live 3.11 target at fields its test locates with 3.11's layout; the "
     "readers' bounds are version-independent: the host lane tests them, ci/fuzz.py fuzzes them"),
    (r"^stripped interpreter: the verbose profile names the interpreter's call plumbing$",
     "the profiler's verbose view is checked by a libpython function's name; Debian's stripped python3.X has none"),
    (r"^browser cannot be installed: ",
     "the HTML view's tests need Debian's chromium and chromium-driver; tests/test_html.py installs them "
     "with apt-get when it runs as root with apt, and skips only where it cannot (another system, no root, "
     "no registry)"),
]

_skips = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        _skips.append((report.nodeid, reason.removeprefix("Skipped: ")))


def pytest_sessionfinish(session, exitstatus):
    import re
    unexplained = [(node, reason) for node, reason in _skips
                   if not any(re.search(pattern, reason) for pattern, _ in ALLOWED_SKIPS)]
    if not unexplained:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    reporter.ensure_newline()
    for node, reason in unexplained:
        reporter.write_line(f"SKIP NOT ALLOWED: {node}: {reason} (see ALLOWED_SKIPS in tests/conftest.py)",
                            red=True)
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
