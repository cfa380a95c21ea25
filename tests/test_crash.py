"""Crash reports (issue 27, in-process part): enable_crash_report().

Each test runs a subprocess that crashes in a compiled C fixture
(tests/fixtures/crash.c, built with cffi) reached from a greenlet through a
C callback.  Oracles: the exit status (the signal, as without btcore),
faulthandler's report in the same run (its Python frames equal ours), and the
fixture's symbol table read with pyelftools (the crashing native frame's
offset lies in the function that crashed).
"""
import os
import re
import signal
import subprocess
import sys
import textwrap

import platform
import sysconfig

import pytest
from cffi import FFI

import conftest

pytestmark = [pytest.mark.skipif(conftest.UNDER_QEMU, reason=conftest.QEMU_NO_OWN_READS)]

ASAN_CHILD = conftest.ASAN_CRASH_CHILD_ENV

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = "_btfix_crash"
BTCORE_HEADER = "btcore crash report (most recent call first):"


def build_crash_fixture(out: str, module: str, cplusplus: bool = False) -> None:
    """tests/fixtures/crash.c built with cffi into out as module: as C, or as C++ (crash_terminate)."""
    ffi = FFI()
    ffi.cdef("""
        void crash_null_write(void);
        int crash_wild_read(void);
        int crash_divide(int zero);
        void crash_abort(void);
        void crash_fatal_error(void);
        int crash_recurse(int n);
        int crash_through_callback(int (*callback)(int), int arg);
        void crash_with_malloc_forbidden(void);
        int crash_install_reraising_handler(void);
    """ + ("void crash_terminate(void);" if cplusplus else ""))
    with open(os.path.join(HERE, "fixtures", "crash.c")) as f:
        ffi.set_source(module, f.read(), source_extension=".cpp" if cplusplus else ".c",
                       extra_compile_args=["-O2", "-g", "-fomit-frame-pointer", "-Wno-infinite-recursion"])
    ffi.compile(tmpdir=out)


@pytest.fixture(scope="session")
def fixture_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("crash_build"))
    build_crash_fixture(out, MODULE)
    return out


@pytest.fixture(scope="session")
def fixture_symbols(fixture_dir):
    """{function: (start, end)} of the fixture .so, offsets from its load bias."""
    from elftools.elf.elffile import ELFFile
    so = next(os.path.join(fixture_dir, n) for n in os.listdir(fixture_dir) if n.startswith(MODULE) and n.endswith(".so"))
    with open(so, "rb") as f:
        symtab = ELFFile(f).get_section_by_name(".symtab")
        return {s.name: (s["st_value"], s["st_value"] + s["st_size"]) for s in symtab.iter_symbols()
                if s["st_info"]["type"] == "STT_FUNC" and s["st_value"]}


PROGRAM = """
import faulthandler, sys, threading
sys.path.insert(0, {dir!r})
import greenlet
from _btfix_crash import ffi, lib
{faulthandler}
import btcore
{setup}

def in_callback(arg):
    {action}
    return 0

callback = ffi.callback("int(int)", in_callback)

def in_greenlet():
    lib.crash_through_callback(callback, 0)

{run}
"""
IN_MAIN_THREAD = "greenlet.greenlet(in_greenlet).switch()"


def crash(fixture_dir, action, setup="btcore.enable_crash_report()", env=None, run=IN_MAIN_THREAD,
          faulthandler="faulthandler.enable()"):
    code = PROGRAM.format(dir=fixture_dir, setup=textwrap.dedent(setup).strip(), action=action, run=run,
                          faulthandler=faulthandler)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **ASAN_CHILD, **(env or {})})


def ours(stderr):
    """Our report's frame lines (empty if there is none)."""
    if BTCORE_HEADER not in stderr:
        return []
    lines = stderr.split(BTCORE_HEADER, 1)[1].lstrip("\n").split("\n\n", 1)[0].splitlines()
    return [line for line in lines if not line.startswith("qemu: ")]   # qemu-user's own word on the signal


def python_frames(lines, pattern):
    return [m.groups() for m in map(re.compile(pattern).match, lines) if m]


def faulthandler_frames(stderr):
    # The Python frames' block: 3.14's faulthandler adds a block of C frames
    # ("Current thread's C stack trace (most recent call first):") after it.
    blocks = [b.split("\n\n")[0].splitlines() for b in stderr.split("most recent call first):\n")[1:]]
    frames = (python_frames(b, r'\s+File "(.*)", line (\d+) in (.*)$') for b in blocks)
    return next((found for found in frames if found), [])


def btcore_python_frames(stderr):
    return python_frames(ours(stderr), r'\s+File "(.*)", line (\d+), in (.*)$')


def native_offset(line, module):
    m = re.match(r"\s+\[(.*?)\] \+0x([0-9a-f]+)$", line)
    return int(m.group(2), 16) if m and m.group(1).startswith(module) else None


@pytest.mark.parametrize("action, sig, function", [
    ("lib.crash_null_write()", signal.SIGSEGV, "crash_null_write"),
    pytest.param("lib.crash_divide(0)", signal.SIGFPE, "crash_divide",
                 marks=pytest.mark.skipif(platform.machine() != "x86_64",
                                          reason="aarch64's integer division by zero does not trap")),
])
def test_fault_in_c_reached_from_a_greenlet(fixture_dir, fixture_symbols, action, sig, function):
    out = crash(fixture_dir, action)
    assert out.returncode == -sig, out.stderr          # dies as it would have
    assert f"Fatal signal {sig.name} ({int(sig)}) at address 0x" in out.stderr
    lines = ours(out.stderr)
    first = native_offset(lines[0], MODULE)            # the faulting frame first
    lo, hi = fixture_symbols[function]
    assert first is not None and lo <= first < hi, lines
    callback = [native_offset(line, MODULE) for line in lines]
    lo, hi = fixture_symbols["crash_through_callback"]
    assert any(off is not None and lo <= off < hi for off in callback), lines   # C between the Python frames
    # faulthandler ran after us, in the same run: the same Python frames.
    assert btcore_python_frames(out.stderr) == faulthandler_frames(out.stderr) != []
    assert [f[2] for f in btcore_python_frames(out.stderr)] == ["in_callback", "in_greenlet"]
    assert out.stderr.index(BTCORE_HEADER) < out.stderr.index("Fatal Python error")


def test_abort(fixture_dir, fixture_symbols):
    out = crash(fixture_dir, "lib.crash_abort()")
    assert out.returncode == -signal.SIGABRT, out.stderr
    assert "Fatal signal SIGABRT (6), sent by the process" in out.stderr
    lines = ours(out.stderr)
    lo, hi = fixture_symbols["crash_abort"]
    offsets = [native_offset(line, MODULE) for line in lines]
    assert any(off is not None and lo <= off < hi for off in offsets), lines   # under libc's abort()
    assert lines[0].startswith("  [libc")
    assert btcore_python_frames(out.stderr) == faulthandler_frames(out.stderr) != []


def test_stack_overflow_reported_from_the_alternate_stack(fixture_dir, fixture_symbols):
    out = crash(fixture_dir, "lib.crash_recurse(0)")
    assert out.returncode == -signal.SIGSEGV, out.stderr
    lines = ours(out.stderr)
    lo, hi = fixture_symbols["crash_recurse"]
    recursing = [off for off in (native_offset(line, MODULE) for line in lines) if off is not None]
    assert len(recursing) > 50 and all(lo <= off < hi for off in recursing), lines
    assert "  (partial: more frames than a sample holds)" in lines
    assert "Fatal Python error: Segmentation fault" in out.stderr   # faulthandler still runs after us


def test_second_crash_during_the_report_ends_the_process(fixture_dir):
    out = crash(fixture_dir, "lib.crash_null_write()", setup="""
        btcore.enable_crash_report()
        btcore._native.lib.btc_test_crash_fault_in_report(1)
    """)
    assert out.returncode == -signal.SIGSEGV, out.stderr
    assert out.stderr.count("Fatal signal SIGSEGV") == 1 and BTCORE_HEADER in out.stderr
    assert ours(out.stderr) == []   # it died in the report: no frame written, no loop


def test_disabled_and_environment_switch(fixture_dir):
    out = crash(fixture_dir, "lib.crash_null_write()", setup="""
        btcore.enable_crash_report()
        assert btcore._native.lib.btc_test_crash_handler_is_ours()
        btcore.disable_crash_report()
        assert not btcore.crash_report_enabled()
        assert not btcore._native.lib.btc_test_crash_handler_is_ours()   # faulthandler's is back
    """)
    assert out.returncode == -signal.SIGSEGV and BTCORE_HEADER not in out.stderr
    assert "Fatal Python error: Segmentation fault" in out.stderr
    out = crash(fixture_dir, "lib.crash_null_write()", setup="assert btcore.crash_report_enabled()",
                env={"BTCORE_CRASH_REPORT": "1"})
    assert out.returncode == -signal.SIGSEGV and BTCORE_HEADER in out.stderr, out.stderr
    assert btcore_python_frames(out.stderr) == faulthandler_frames(out.stderr) != []


PASSED_ON = ("(passed on by a handler that ran first, faulthandler's if enabled after btcore: the frames are the "
             "fault's, from the kernel's first signal frame)")
IN_A_THREAD = """
def in_thread():
    btcore.enable_crash_report()
    faulthandler.enable()
    greenlet.greenlet(in_greenlet).switch()
t = threading.Thread(target=in_thread)
t.start()
t.join()
"""


@pytest.mark.parametrize("action, sig, function, run", [
    ("lib.crash_null_write()", signal.SIGSEGV, "crash_null_write", IN_MAIN_THREAD),
    ("lib.crash_abort()", signal.SIGABRT, "crash_abort", IN_A_THREAD),
    ("lib.crash_recurse(0)", signal.SIGSEGV, "crash_recurse", IN_A_THREAD),
], ids=["null_write-main", "abort-thread", "stack_overflow-thread"])
def test_faulthandler_enabled_after_us_passes_the_signal_on(fixture_dir, fixture_symbols, action, sig, function, run):
    # guards: crash.c first_delivery: faulthandler enabled after the crash report (and never before: its own,
    # smaller alternate stack replaces ours) runs first, then raises the signal again from its handler, which
    # hands it to ours; our report is still of the fault's own context (the kernel's frame of the first
    # delivery, found above ours on that stack), native frames from the faulting function on, after
    # faulthandler's, and the process dies by its signal.
    setup = "btcore.enable_crash_report()\nfaulthandler.enable()" if run == IN_MAIN_THREAD else ""   # else in_thread
    out = crash(fixture_dir, action, faulthandler="", run=run, setup=setup)
    assert out.returncode == -sig, out.stderr
    assert out.stderr.index("Fatal Python error") < out.stderr.index(PASSED_ON) < out.stderr.index(BTCORE_HEADER)
    lines = ours(out.stderr)
    offsets = [off for off in (native_offset(line, MODULE) for line in lines) if off is not None]
    lo, hi = fixture_symbols[function]
    assert offsets and lo <= offsets[0] < hi, lines   # the fixture's innermost frame: the function that crashed
    if function == "crash_recurse":
        assert len(offsets) > 50 and all(lo <= off < hi for off in offsets), lines
    else:
        assert lines[0].startswith(f"  [{MODULE}" if sig == signal.SIGSEGV else "  [libc"), lines   # the fault first
        assert btcore_python_frames(out.stderr) == faulthandler_frames(out.stderr) != []


# The thread's alternate stack as faulthandler left it (its size), moved above a page no one may touch: a
# handler that needs more than that size faults on the guard page instead of writing into whatever the heap
# holds below faulthandler's malloc'd one.
GUARDED_ALTERNATE_STACK = """
import ctypes, mmap
class stack_t(ctypes.Structure):
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
current = stack_t()
assert libc.sigaltstack(None, ctypes.byref(current)) == 0 and current.ss_size, "no alternate stack"
size = -(-current.ss_size // mmap.PAGESIZE) * mmap.PAGESIZE
# 64 KB of PROT_NONE below it: a 16 KB line table on the stack lies entirely below its bottom, where one guard
# page missed it when the handler's frames above it took more than 4 KB; its copy (process_vm_readv) then
# wrote into whatever mapping came next, without a fault (the mutation lane: survived 1 run in 6 under load)
guard = 64 * 1024
base = libc.mmap(None, guard + size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
assert base not in (None, ctypes.c_void_p(-1).value) and libc.mprotect(base, guard, 0) == 0   # PROT_NONE
guarded = stack_t(base + guard, 0, current.ss_size)
assert libc.sigaltstack(ctypes.byref(guarded), None) == 0
print("alternate stack:", current.ss_size, "bytes", file=sys.stderr, flush=True)
"""


def test_the_report_fits_on_faulthandler_s_alternate_stack(fixture_dir):
    # guards: report.c add_python_crashed's line table in static memory: faulthandler enabled after us puts its
    # own alternate stack in place (SIGSTKSZ * 2, malloc'd: ~16 KB here), and our handler runs on it; a line
    # table copied onto that stack (16 KB) wrote below its bottom into the heap: a parked greenlet's saved
    # stack, whose walk the core's dump then cut short (test_crash_matrix, 1 run in 5 with some builds).
    out = crash(fixture_dir, "lib.crash_null_write()", faulthandler="",
                setup="btcore.enable_crash_report()\nfaulthandler.enable()\n" + GUARDED_ALTERNATE_STACK)
    assert out.returncode == -signal.SIGSEGV, out.stderr
    assert "alternate stack:" in out.stderr and PASSED_ON in out.stderr, out.stderr
    assert btcore_python_frames(out.stderr) == faulthandler_frames(out.stderr) != [], out.stderr   # with lines


def test_a_reraising_handler_s_siginfo_gives_the_fault_address(fixture_dir, fixture_symbols):
    # guards: arch btc_siginfo_beside (where the kernel puts the siginfo beside a frame's ucontext): a handler
    # installed after ours that asked for a siginfo (SA_SIGINFO, as in-process crash reporters do; faulthandler
    # does not) and raises the signal again: our header has the fault address that handler was given, from the
    # first delivery's siginfo, and the frames are the fault's.
    out = crash(fixture_dir, "lib.crash_wild_read()", faulthandler="", setup="""
        btcore.enable_crash_report()
        assert lib.crash_install_reraising_handler() == 0
    """)
    assert out.returncode == -signal.SIGSEGV, out.stderr
    given = int(re.search(r"^reraising handler: (0x[0-9a-f]+)$", out.stderr, re.M).group(1), 16)
    reported = re.search(r"^Fatal signal SIGSEGV \(11\) at address (0x[0-9a-f]+), thread \d+$", out.stderr, re.M)
    assert reported and int(reported.group(1), 16) == given != 0, out.stderr
    assert PASSED_ON in out.stderr
    lo, hi = fixture_symbols["crash_wild_read"]
    first = native_offset(ours(out.stderr)[0], MODULE)
    assert first is not None and lo <= first < hi, out.stderr


def test_crash_holding_btcore_s_lock_does_not_hang(fixture_dir):
    # guards: the handler only tries the module list lock (modules.c btc_modules_try_acquire_prebuilt, report.c):
    # a crash inside btcore's own capture, which holds it, is reported (Python frames, saying why there is no
    # native one, then the helper's part) and ends the process by its signal instead of waiting for itself.
    out = crash(fixture_dir, "btcore._native.lib.btc_test_crash_holding_modules_lock()")
    assert out.returncode == -signal.SIGSEGV, out.stderr
    lines = ours(out.stderr)
    assert "  (partial: the module list was busy: Python frames only)" in lines, out.stderr
    assert btcore_python_frames(out.stderr) == faulthandler_frames(out.stderr) != []
    if conftest.DUMPS_OTHER_PROCESSES:
        assert OUTSIDE_HEADER in out.stderr, out.stderr


def test_thread_not_registered_says_so(fixture_dir):
    """A crash in a thread that did not enable the report: a line says why
    there are no frames; faulthandler's report follows."""
    out = crash(fixture_dir, "lib.crash_null_write()", run="""
t = threading.Thread(target=lambda: greenlet.greenlet(in_greenlet).switch())
t.start()
t.join()
""")
    assert out.returncode == -signal.SIGSEGV, out.stderr
    assert ours(out.stderr) == ["  (this thread is not registered with btcore: enable_crash_report() registers "
                                "the thread calling it)"]
    assert " in in_callback\n" in out.stderr.split("Fatal Python error")[1]   # faulthandler's, every thread


def test_forked_child_reports_and_dies_by_its_signal(fixture_dir):
    """A fork child inherits the handlers and the forking thread's
    registration (the same pthread_t): it reports its own crash."""
    out = crash(fixture_dir, "lib.crash_null_write()", run="""
import os
pid = os.fork()
if pid == 0:
    greenlet.greenlet(in_greenlet).switch()
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child killed by", os.WTERMSIG(status) if os.WIFSIGNALED(status) else None, file=sys.stderr)
""")
    assert out.returncode == 0, out.stderr
    assert f"child killed by {int(signal.SIGSEGV)}" in out.stderr
    assert [f[2] for f in btcore_python_frames(out.stderr)] == ["in_callback", "in_greenlet"]
    assert btcore_python_frames(out.stderr) == faulthandler_frames(out.stderr.split("child killed")[0])


OUTSIDE_HEADER = "btcore crash report, the rest read from outside (every thread and greenlet):"
PARKED = """
import ctypes, os, sys
import gevent, btcore
btcore.enable_crash_report({options})

def parked_in_python(n):
    gevent.sleep(60)

def parked_on_event(event):
    event.wait()

def crasher():
    gevent.sleep(0.05)
    for g in parked:   # CPython's own view of each parked greenlet, its frames outermost first
        chain, f = [], g.gr_frame
        while f is not None:
            chain.append(f.f_code.co_name)
            f = f.f_back
        print("PARKED", hex(id(g)), ",".join(reversed(chain)), file=sys.stderr, flush=True)
    {crash}

import gevent.event
parked = [gevent.spawn(parked_in_python, n) for n in range(12)] + \
    [gevent.spawn(parked_on_event, gevent.event.Event()) for n in range(8)]
{run}
"""


def crash_parked(options="", crash="ctypes.string_at(0)", run="gevent.spawn(crasher).join()"):
    code = PARKED.format(options=options, crash=crash, run=run)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **ASAN_CHILD})


def outside_groups(stderr):
    """[(greenlets in the group, the addresses it names, its Python functions outermost first)] of the
    helper's part: its suspended groups."""
    part = stderr.split(OUTSIDE_HEADER, 1)[1]
    groups = []
    for block in part.split("\n=== stack ")[1:]:
        count = re.match(r"\d+: (\d+) greenlets?, suspended ===", block)
        if count:
            groups.append((int(count.group(1)), re.findall(r" at (0x[0-9a-f]+)>", block.split("\n")[1]),
                           [f.rsplit(".", 1)[-1] for f in re.findall(r'^  File ".*", line \d+, in (\S+)$', block, re.M)]))
    return groups


@pytest.mark.skipif(not conftest.DUMPS_OTHER_PROCESSES, reason=conftest.NO_DUMP_HERE)
def test_the_helper_shows_every_parked_greenlet_as_cpython_sees_it():
    # guards: the helper part of the report (crash.c run_helper, watch/crash.py helper_command): after the crashing
    # thread's frames, every greenlet parked in the crashed process, each with the Python frames CPython's own
    # gr_frame chain has (printed by the target just before the crash); the process dies by its signal.
    out = crash_parked()
    assert out.returncode == -signal.SIGSEGV, out.stderr
    assert out.stderr.index(BTCORE_HEADER) < out.stderr.index(OUTSIDE_HEADER), out.stderr
    assert f"process {out.stderr.split('thread ')[1].split()[0].rstrip(',')}:" in out.stderr   # its own pid
    parked = dict(line.split()[1:] for line in out.stderr.splitlines() if line.startswith("PARKED "))
    by_chain = {}
    for address, chain in parked.items():
        by_chain.setdefault(tuple(chain.split(",")), set()).add(address)
    assert len(parked) == 20 and len(by_chain) == 2, out.stderr
    groups = outside_groups(out.stderr)
    for chain, addresses in by_chain.items():   # one group each: all of its greenlets, their frames
        group = [g for g in groups if tuple(g[2][-len(chain):]) == chain]
        assert len(group) == 1 and group[0][0] == len(addresses), (chain, out.stderr)
        assert set(group[0][1]) <= addresses and group[0][1], (chain, out.stderr)


@pytest.mark.skipif(not conftest.DUMPS_OTHER_PROCESSES, reason=conftest.NO_DUMP_HERE)
def test_the_helper_is_off_bounded_and_run_for_a_fork_child():
    # guards: helper=False writes the crashing thread's part alone; a helper that outlives helper_timeout is
    # killed and the process still dies by its signal; a fork child's helper dumps the child (the pid is
    # written at crash time).
    off = crash_parked(options="helper=False")
    assert off.returncode == -signal.SIGSEGV and BTCORE_HEADER in off.stderr and OUTSIDE_HEADER not in off.stderr
    stalled = crash_parked(options="helper_timeout=0.001")   # killed long before its dump is written
    # (its header line may come first: on a loaded machine the crashed process, woken to kill it after 1 ms,
    # was not run before the helper had started Python and printed it: CI run 46's 3.15 lane)
    assert stalled.returncode == -signal.SIGSEGV and "Process dump, process" not in stalled.stderr, stalled.stderr
    forked = crash_parked(run="""
pid = os.fork()
if pid == 0:
    gevent.spawn(crasher).join()
    os._exit(0)
status = os.waitpid(pid, 0)[1]   # the signal alone: with core dumps on, the status has the core flag too
print("CHILD", pid, "STATUS", os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1, file=sys.stderr)
""")
    child = forked.stderr.split("CHILD ")[1].split()[0]
    assert f"STATUS {int(signal.SIGSEGV)}" in forked.stderr, forked.stderr
    assert f"Process dump, process {child}:" in forked.stderr, forked.stderr
    assert sum(n for n, _, _ in outside_groups(forked.stderr)) >= 20


def test_enable_crash_report_checks_the_helper_timeout():
    import btcore
    with pytest.raises(ValueError):
        btcore.enable_crash_report(helper_timeout=-1)


def test_the_handler_finds_the_running_greenlet():
    # guards: spawn.c running_record: the crash handler's search of the live records for the greenlet running on
    # the crashed thread (saved 0, its stop in this thread's stack above sp) finds greenlet.getcurrent(), at every
    # depth, in a greenlet that has switched out and back, while the main thread runs a tracked greenlet too (its
    # stack lies above this thread's); none in a main greenlet (no site: nothing to show).
    code = """
import threading, greenlet, btcore
from btcore._native import ffi, lib
btcore.enable_spawn_tracking()
btcore.enable_crash_report(helper=False)
def here():
    g = ffi.new("uint64_t *")
    n = lib.btc_test_crash_chain_here(g)
    print(n, g[0] == id(greenlet.getcurrent()), flush=True)
def inner():
    here()
    greenlet.getcurrent().parent.switch()
    here()
def outer():
    here()
    child = greenlet.greenlet(inner)
    child.switch()
    here()
    child.switch()
def checks():
    btcore.enable_crash_report(helper=False)   # registers this thread
    greenlet.greenlet(outer).switch()
done = threading.Event()
def main_thread_greenlet():
    other = threading.Thread(target=lambda: (checks(), done.set()))
    other.start()
    done.wait()
    other.join()
here()
greenlet.greenlet(main_thread_greenlet).switch()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **ASAN_CHILD})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n") == ["-1 False", "1 True", "2 True", "1 True", "2 True", ""]


def spawn_sites(stderr):
    """[(spawner, [Python functions innermost first])] of our report's spawn chain."""
    part = stderr.split("The crashing greenlet: ", 1)[1].split("\n\n", 1)[0]
    sites = []
    for block in part.split("\nspawned by ")[1:]:
        spawner, frames = block.split(" at:\n", 1) if " at:\n" in block else (block, "")
        sites.append((spawner, [f for _, _, f in python_frames(frames.splitlines(), r'\s+File "(.*)", line (\d+), in (.*)$')]))
    return sites


def test_the_crashing_greenlet_and_its_spawn_chain(fixture_dir):
    # guards: crash.c greenlet_chain (the crashing greenlet's name and each generation's site, from the records
    # read with btc_read_own): three generations, each site's Python frames equal to traceback.extract_stack()
    # taken where the greenlet was created (CPython's own view), newest generation first.
    out = crash(fixture_dir, "lib.crash_null_write()", setup="""
        import traceback
        btcore.enable_spawn_tracking()
        btcore.enable_crash_report()
        def spawned(function):
            print("SITE", ",".join(f.name for f in reversed(traceback.extract_stack())), file=sys.stderr)
            g = greenlet.greenlet(function)
            print("GREENLET", hex(id(g)), file=sys.stderr, flush=True)
            return g
    """, run="""
def second():
    spawned(in_greenlet).switch()
def first():
    spawned(second).switch()
spawned(first).switch()
""")
    assert out.returncode == -signal.SIGSEGV, out.stderr
    sites = [line.split()[1].split(",") for line in out.stderr.splitlines() if line.startswith("SITE ")]
    crashing = [line.split()[1] for line in out.stderr.splitlines() if line.startswith("GREENLET ")][-1]
    assert f"The crashing greenlet: <greenlet.greenlet at {crashing}>\n" in out.stderr
    chain = spawn_sites(out.stderr)
    assert [frames for _, frames in chain] == [site[:len(frames)] for site, (_, frames) in zip(reversed(sites), chain)]
    assert [len(frames) for _, frames in chain] == [2, 2, 2]   # spawned, then second | first | <module>: to its greenlet's bottom
    assert [spawner.split()[0] for spawner, _ in chain] == ["<greenlet.greenlet"] * 3
    assert out.stderr.index("The crashing greenlet") < out.stderr.index("Fatal Python error")


def test_no_chain_without_spawn_tracking(fixture_dir):
    out = crash(fixture_dir, "lib.crash_null_write()")
    assert out.returncode == -signal.SIGSEGV and BTCORE_HEADER in out.stderr
    assert "The crashing greenlet" not in out.stderr


def token_sections(part):
    """[(title, its frame lines, its token)] of the helper's text: each stack's text ends with its token."""
    sections, lines = [], []
    for line in part.splitlines():
        if line.startswith("  token: "):
            title = "\n".join(x for x in lines if x.strip() and not x.startswith(" "))
            sections.append((title, lines, line.split("token: ")[1]))
            lines = []
        else:
            lines.append(line)
    return sections


@pytest.mark.skipif(not conftest.DUMPS_OTHER_PROCESSES, reason=conftest.NO_DUMP_HERE)
def test_the_helper_names_the_record_and_encodes_every_stack():
    # guards: remote/process.py _crash_text and RemoteBacktrace.encode (the helper reads the handler's record from the
    # crashed process: the crashing thread at the fault and its greenlet's spawn sites, named, and a token after
    # every stack): the named crashing thread has faulthandler's Python frames; each token decodes (here, as
    # `python -m btcore decode` would) to the Python frames printed above it.
    import btcore
    out = crash_parked(options="", crash="ctypes.string_at(0)",
                       run="btcore.enable_spawn_tracking()\ngevent.spawn(lambda: gevent.spawn(crasher).join()).join()")
    assert out.returncode == -signal.SIGSEGV, out.stderr
    part = out.stderr.split(OUTSIDE_HEADER, 1)[1]
    sections = token_sections(part)
    named = part.split("The crashing thread at the fault, named (the handler's record):\n", 1)[1]
    named_python = re.findall(r'^  File ".*", line \d+, in (\S+)$', named.split("  token: ")[0], re.M)
    theirs = [f[2] for f in faulthandler_frames(out.stderr.split(OUTSIDE_HEADER)[1])] or \
        [f[2] for f in btcore_python_frames(out.stderr)]
    assert named_python == theirs != [], out.stderr
    assert "The crashing greenlet: <gevent._gevent_cgreenlet.Greenlet at 0x" in part
    assert sum("spawned by " in title for title, _, _ in sections) == 2, part   # two generations, each encoded
    assert len(sections) >= 2 + 3 + 3, part    # the record's 3 stacks, and the dump's groups
    for title, lines, token in sections:
        printed = re.findall(r'^  File ".*", line \d+, in (\S+)$', "\n".join(lines), re.M)
        decoded = [f.function for f in btcore.decode(token).frames() if f.kind == "python"]
        assert decoded[::-1] == printed or decoded == printed, (title, token)


@pytest.fixture(scope="session")
def malloc_forbidden(tmp_path_factory):
    """A preloadable library whose malloc, calloc, realloc and free never return once the crash fixture's
    crash_with_malloc_forbidden() sets its flag."""
    out = str(tmp_path_factory.mktemp("malloc_forbidden") / "malloc_forbidden.so")
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", out, os.path.join(HERE, "fixtures", "malloc_forbidden.c")],
                   check=True, capture_output=True)
    return out


@pytest.mark.skipif(conftest.UNDER_ASAN, reason="under ASan its malloc comes first in the process")
def test_the_report_allocates_nothing_after_the_crash(fixture_dir, malloc_forbidden):
    # guards: the whole handler is allocation-free (crash.c, report.c, the spawn chain's reads, the helper's
    # clone and execve): with every malloc/free hanging from the moment of the crash, as if another thread held
    # malloc's lock, the report is written, with the crashing greenlet's spawn chain and the helper's part
    # where the dump runs, and the process dies by its signal instead of hanging.
    out = crash(fixture_dir, "lib.crash_with_malloc_forbidden()", setup="""
        faulthandler.disable()   # its report is not the subject (and it is not ours to keep allocation-free)
        btcore.enable_spawn_tracking()
        btcore.enable_crash_report()
    """, env={"LD_PRELOAD": malloc_forbidden})
    assert out.returncode == -signal.SIGSEGV, out.stderr
    assert [f[2] for f in btcore_python_frames(out.stderr)] == ["in_callback", "in_greenlet"]
    assert "The crashing greenlet: <greenlet.greenlet at 0x" in out.stderr and "spawned by " in out.stderr
    if conftest.DUMPS_OTHER_PROCESSES:   # the helper is a new process: its allocator is its own
        assert OUTSIDE_HEADER in out.stderr and "The crashing thread at the fault, named" in out.stderr
