"""The crash matrix (issue 27): each way a C extension can crash, inside a
greenlet reached through a C callback, with 100 other greenlets parked in C
and in Python, in the main thread or in another thread.

The fixture is tests/fixtures/crash.c built as C++ (std::terminate).  Each
crash runs once, with btcore's crash report and faulthandler both enabled
and core dumps on, and is checked against oracles that do not use btcore's
in-process code:

- the exit status is the crash's own signal, and the kernel wrote a core
  file in which gdb finds the crashing thread stopped where it crashed,
  killed by that signal (what it would be without btcore);
- gdb's backtrace of that thread from the core: its physical frames, as
  module + offset, are the report's native frames, in order, and where the
  report has a run of Python frames gdb has the eval loop's C frames that
  ran them, in the interpreter (gdb's own DWARF unwinder, read from the
  core file);
- faulthandler's report in the same run has the report's Python frames;
- `python -m btcore dump --core` of the core: its crashing thread has the
  report's Python frames, and its suspended greenlets are the 100 parked
  ones in two groups, as the helper showed them from the live process.

Each crash also runs once without btcore: the signal it ends with there is
the one expected (Py_FatalError's is SIGSEGV on CPython 3.13, which faults
in its own faulthandler teardown before it aborts).

Seven crashes, each in one place (main thread or another thread,
alternating, so both are covered by crashes of each signal) and in one
order (faulthandler enabled before btcore, whose handler then runs first,
or after it, whose handler then runs first and passes the signal on: both
are covered by crashes of SIGSEGV and SIGABRT): the whole matrix runs in
~20-40 s here.
"""
import glob
import os
import re
import resource
import shutil
import signal
import subprocess
import sys

import pytest
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

import conftest
from test_crash import (OUTSIDE_HEADER, PASSED_ON, btcore_python_frames, build_crash_fixture, faulthandler_frames,
                        ours, outside_groups)

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = "_btfix_crashmx"

pytestmark = [
    pytest.mark.skipif(conftest.UNDER_ASAN, reason="the matrix's oracle reads core files, which ASan turns off"),
    pytest.mark.skipif(not conftest.DUMPS_OTHER_PROCESSES, reason=conftest.NO_DUMP_HERE),
    pytest.mark.skipif(shutil.which("gdb") is None, reason="the core-file oracle is gdb, which is not installed"),
]


def core_pattern_problem() -> str | None:
    """Why this machine's kernel will not write a core file into the crashed
    process's directory, or None."""
    try:
        with open("/proc/sys/kernel/core_pattern") as f:
            pattern = f.read().strip()
    except OSError as e:
        return f"cannot read /proc/sys/kernel/core_pattern: {e}"
    if pattern.startswith("|") or "/" in pattern or not pattern:
        return f"core_pattern is {pattern!r}: cores go to a handler or another folder, not the crashed process's"
    return None


@pytest.fixture(scope="session")
def matrix_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("crash_matrix_build"))
    build_crash_fixture(out, MODULE, cplusplus=True)
    return out


PROGRAM = """
import faulthandler, functools, sys, threading
sys.path.insert(0, sys.argv[1])
import greenlet
from _btfix_crashmx import ffi, lib
crashes = {"null_write": lib.crash_null_write, "wild_read": lib.crash_wild_read,   # partial: no Python frame
           "sigfpe": functools.partial(lib.crash_divide, 0), "stack_overflow": functools.partial(lib.crash_recurse, 0),
           "abort": lib.crash_abort, "terminate": lib.crash_terminate, "fatal_error": lib.crash_fatal_error}
crash = crashes[sys.argv[2]]

@ffi.callback("int(int)")
def park(arg):
    greenlet.getcurrent().parent.switch()   # parked with the fixture's C frames below it
    return 0

@ffi.callback("int(int)")
def in_callback(arg):
    crash()
    return 0

def parked_in_c():
    lib.crash_through_callback(park, 0)

def parked_in_python():
    greenlet.getcurrent().parent.switch()

def crasher():
    lib.crash_through_callback(in_callback, 0)

def run():
    if sys.argv[5] == "faulthandler_first":   # then btcore's handler runs first, from the fault's context
        faulthandler.enable()
    if sys.argv[4] == "btcore":   # else the same crash without btcore: the exit status it would have
        import btcore
        btcore.enable_crash_report()   # this thread's crashes
    if sys.argv[5] == "btcore_first":
        # faulthandler's handler runs first and passes the signal on from its own (btcore's report finds the
        # fault's context in the kernel's signal frame); Py_FatalError on 3.11 and 3.13 disables faulthandler,
        # which puts back the disposition it found: btcore's here (the guide's "What to know").
        faulthandler.enable()
    parked = [greenlet.greenlet(parked_in_c if i % 2 else parked_in_python) for i in range(100)]
    for g in parked:
        g.switch()
    with open("maps", "w") as f, open("/proc/self/maps") as maps:   # where each module is, for gdb's pcs
        f.write(maps.read())
    greenlet.greenlet(crasher).switch()

if sys.argv[3] == "thread":
    t = threading.Thread(target=run)
    t.start()
    t.join()
else:
    run()
"""

def crash(kind, sig, where, function, order):
    return pytest.param(kind, sig, where, function, order, id=f"{kind}-{where}-{order}")


CRASHES = [   # kind, signal, where, the fixture function that crashed, whose handler was enabled first
    crash("null_write", signal.SIGSEGV, "main", "crash_null_write", "faulthandler_first"),
    crash("wild_read", signal.SIGSEGV, "thread", "crash_wild_read", "btcore_first"),
    crash("sigfpe", signal.SIGFPE, "main", "crash_divide", "btcore_first"),
    crash("stack_overflow", signal.SIGSEGV, "thread", "crash_recurse", "faulthandler_first"),
    crash("abort", signal.SIGABRT, "main", "crash_abort", "faulthandler_first"),
    crash("terminate", signal.SIGABRT, "thread", "crash_terminate", "btcore_first"),
    crash("fatal_error", signal.SIGABRT, "main", "crash_fatal_error", "btcore_first"),
]


def crash_alone(matrix_dir, folder, kind, where, order) -> int:
    """The signal that ends the same crash without btcore.  Py_FatalError's is SIGABRT, except on CPython
    3.13, which faults first (SIGSEGV at 0x10 in PyMem_Free, under Py_FatalError's teardown of faulthandler:
    with or without a greenlet, btcore or a callback; docs/design.md): what the interpreter does, not btcore."""
    folder.mkdir()
    alone = subprocess.run([sys.executable, "-c", PROGRAM, matrix_dir, kind, where, "alone", order], capture_output=True,
                           text=True, timeout=120, cwd=folder, preexec_fn=disable_cores)
    return -alone.returncode


def function_range(folder: str, function: str):
    """[start, end) of function in the fixture built in folder, from its symbol table (pyelftools)."""
    so = next(os.path.join(folder, n) for n in os.listdir(folder) if n.startswith(MODULE) and n.endswith(".so"))
    with open(so, "rb") as f:
        symbol = ELFFile(f).get_section_by_name(".symtab").get_symbol_by_name(function)[0]
    return symbol["st_value"], symbol["st_value"] + symbol["st_size"]


def enable_cores():
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def disable_cores():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def module_offsets(maps_text: str):
    """pc -> (module file name, offset from its load bias) in the crashed process (its /proc/self/maps).
    A position-dependent executable (ET_EXEC: Debian's python3.13-3.15) is not moved: its bias is 0, not
    where its first page is mapped."""
    starts = {}
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            base = lo - int(parts[2], 16)
            starts.setdefault(parts[5], []).append((lo, hi, base))
    spans = [(lo, hi, 0 if position_dependent(path) else min(b for _, _, b in ranges), path)
             for path, ranges in starts.items() for lo, hi, _ in ranges]

    def where(pc):
        return next(((unversioned(path), pc - base) for lo, hi, base, path in spans if lo <= pc < hi), None)
    return where


def position_dependent(path: str) -> bool:
    """Is the file at path an ET_EXEC executable (pyelftools, the tests' independent ELF reader)?"""
    try:
        with open(path, "rb") as f:
            return ELFFile(f).header.e_type == "ET_EXEC"
    except (OSError, ELFError):
        return False


def unversioned(path: str) -> str:
    """A library's file name without its version (the loader's name libstdc++.so.6 is the file
    libstdc++.so.6.0.30)."""
    return re.sub(r"\.so(\.\d+)*$", ".so", os.path.basename(path))


# The crashing thread's physical frames, newest first, each with whether its pc is exact (the newest, and
# the one a signal interrupted) rather than a return address.  Above the fault, the core shows where the
# default action ended the process: faulthandler's handler (run after btcore's, re-raising the signal) and
# the signal trampoline; the frames after the last trampoline are the fault's.
GDB_FRAMES = """
f = gdb.newest_frame()
n, after_signal = 0, True
while f is not None and n < 300:   # more than a sample holds (BTC_SIGNAL_NATIVE)
    if f.type() == gdb.SIGTRAMP_FRAME:
        print("SIGNAL")
        after_signal = True
    elif f.type() not in (gdb.INLINE_FRAME, gdb.TAILCALL_FRAME):   # gdb's own, from DWARF: not on the stack
        print("FRAME", f.pc(), int(after_signal))
        after_signal = False
        n += 1
    try:
        f = f.older()
    except gdb.error:
        break
"""


def gdb_frames(core: str, folder: str):
    """(the signal that ended the process, [(pc, exact)] of the crashing thread from the fault, newest
    first) by gdb."""
    script = os.path.join(folder, "frames.py")
    with open(script, "w") as f:
        f.write(GDB_FRAMES)
    out = subprocess.run(["gdb", "-batch", "-nx", "-ex", "set debuginfod enabled off", "-ex", f"source {script}",
                          sys.executable, core], capture_output=True, text=True, timeout=120).stdout
    killed = re.search(r"Program terminated with signal (SIG[A-Z]+)", out)
    frames = out.split("SIGNAL\n")[-1] if "SIGNAL\n" in out else out
    return killed.group(1) if killed else None, [(int(pc), exact == "1")
                                                  for pc, exact in re.findall(r"^FRAME (\d+) (\d)$", frames, re.M)]


def report_frames(lines):
    """The report's frames, innermost first: ("native", (module, offset)) for a native frame, ("python", n) for
    a run of n Python frames."""
    out = []
    for line in lines:
        m = re.match(r"\s+\[(.*?)\] \+0x([0-9a-f]+)$", line)
        if m:
            out.append(("native", (unversioned(m.group(1)), int(m.group(2), 16))))
        elif line.lstrip().startswith("File "):
            n = out.pop()[1] if out and out[-1][0] == "python" else 0
            out.append(("python", n + 1))
    return out


def interpreter_module(module: str) -> bool:
    """Is module the interpreter's code: its executable (Debian's static python3.X) or libpython?"""
    return re.match(r"(lib)?python3\.\d+", module) is not None


def unmatched(report, theirs) -> str | None:
    """Where the report's frames part from gdb's physical frames (innermost first), or None.  Each native frame
    is gdb's next one; each run of Python frames stands where gdb has the eval-loop C frames that ran them: at
    least one, at most one per Python frame (a C frame of the eval loop runs one or more), all in the
    interpreter, up to the report's next native frame.  The report may end first (a greenlet's bottom, a
    sample's capacity), gdb may not."""
    j = 0
    for i, (kind, what) in enumerate(report):
        if kind == "native":
            if j >= len(theirs) or theirs[j] != what:
                return f"report frame {i} {what}: gdb has {theirs[j] if j < len(theirs) else 'nothing'} (gdb frame {j})"
            j += 1
            continue
        following = next((w for k, w in report[i + 1:] if k == "native"), None)
        ran = 0
        while j < len(theirs) and theirs[j] != following and theirs[j] and interpreter_module(theirs[j][0]):
            j, ran = j + 1, ran + 1
        if not 1 <= ran <= what:
            return f"report frame {i}, {what} Python frame(s): {ran} eval-loop frames in gdb from gdb frame {j - ran}"
    return None


@pytest.mark.parametrize("kind, sig, where, function, order", CRASHES)
def test_crash(matrix_dir, tmp_path, kind, sig, where, function, order):
    # guards: the whole crash report against independent oracles, for each way of crashing (see the docstring).
    problem = core_pattern_problem()
    if problem:
        pytest.skip(problem)
    alone = crash_alone(matrix_dir, tmp_path / "alone", kind, where, order)
    assert alone == sig or (kind == "fatal_error" and alone == signal.SIGSEGV), alone
    sig = signal.Signals(alone)
    out = subprocess.run([sys.executable, "-c", PROGRAM, matrix_dir, kind, where, "btcore", order], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path, preexec_fn=enable_cores)
    assert out.returncode == -sig, out.stderr   # as without btcore
    assert f"\nFatal signal {sig.name} ({int(sig)})" in out.stderr, out.stderr   # the report is of that signal
    if order == "btcore_first" and kind != "fatal_error":   # (Py_FatalError disables faulthandler on 3.11, 3.13)
        assert PASSED_ON in out.stderr, out.stderr   # faulthandler's handler ran first: ours is passed the signal
    cores = glob.glob(str(tmp_path / "core*"))
    if not cores:
        pytest.skip("no core file was written (RLIMIT_CORE raised, core_pattern 'core': a container's limit?)")
    lines = ours(out.stderr)

    # The report's native frames are gdb's physical frames of the crashing thread in the core, in order.
    killed, frames = gdb_frames(cores[0], str(tmp_path))
    assert killed == sig.name, frames
    where_is = module_offsets((tmp_path / "maps").read_text())
    theirs = [where_is(pc if exact else pc - 1) for pc, exact in frames]
    mine = report_frames(lines)
    assert unmatched(mine, theirs) is None, (unmatched(mine, theirs), mine, theirs, out.stderr)
    assert mine[0][0] == "native" and len(mine) >= 3, mine   # the faulting frame first; not a stub
    fixture = [what[1] for frame_kind, what in mine if frame_kind == "native" and what[0].startswith(MODULE)]
    lo, hi = function_range(matrix_dir, function)
    assert fixture and lo <= fixture[0] < hi, (function, mine)   # the fixture's first frame: the crashing function

    # faulthandler ran after us in the same run: the same Python frames.
    python = btcore_python_frames(out.stderr)
    if kind != "stack_overflow":   # there the sample holds the innermost 128 frames: no Python frame
        assert python == faulthandler_frames(out.stderr) != []
        assert [f[2] for f in python] == ["in_callback", "crasher"]

    # The helper's part and the core's dump agree: the crashing thread's Python frames, the parked greenlets.
    helper = outside_groups(out.stderr)
    dumped = subprocess.run([sys.executable, "-m", "btcore", "dump", "--core", cores[0], "--exe",
                             os.path.realpath(sys.executable)],
                            capture_output=True, text=True, timeout=120)
    assert dumped.returncode == 0, dumped.stderr
    core_groups = outside_groups(OUTSIDE_HEADER + dumped.stdout)
    parked = sorted((n, functions[-1]) for n, _, functions in core_groups if n > 1)
    assert parked == [(50, "park"), (50, "parked_in_python")], dumped.stdout   # in C: under the callback
    assert sorted((n, f) for n, _, f in helper) == sorted((n, f) for n, _, f in core_groups)
    tid = re.search(r"^Fatal signal .*, thread (\d+)$", out.stderr, re.M).group(1)
    assert thread_python(dumped.stdout, tid) == [f[2] for f in reversed(faulthandler_frames(out.stderr))] != []


def thread_python(dump_text: str, tid: str) -> list:
    """The Python functions, outermost first, of thread tid's stack in a dump's text."""
    block = next(b for b in dump_text.split("\n=== stack ")[1:] if f"e.g. Thread {tid} " in b.split("\nBacktrace")[0])
    return re.findall(r'^  File ".*", line \d+, in (\S+)$', block, re.M)
