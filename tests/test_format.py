"""The readable default view of format() against the verbose one: what is
shown, what is folded (and that every frame is either shown or counted),
short paths, the greenlet header, start-up frames."""
import gc
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import weakref

import greenlet
import pytest

import btcore
import conftest
from btcore.views.fold import fold
from btcore.capture.frame import short_path

MARKER = re.compile(r"^  \.\.\. (\d+) (interpreter|start-up) frames?$")
PLUMBING_SEEN_HERE = ("_PyEval_Vector", "PyObject_Vectorcall", "_PyObject_VectorcallTstate",
                      "_PyEval_EvalFrame (inlined)", "cfunction_vectorcall_", "method_vectorcall")


def entries(text):
    """The entry lines of a format() text, innermost last: frame lines and
    markers (no header, no source lines, no second lines of verbose frames)."""
    return [ln for ln in text.splitlines() if ln.startswith(("  File ", "  [")) or MARKER.match(ln)]


def align(bt):
    """Walk the default view against frames(): each entry is either the next
    frame, or a marker standing for the next `count` frames.  Returns
    (shown, hidden) frame lists; fails if the two disagree anywhere."""
    frames = bt.frames()[::-1]   # outermost first, as printed
    shown, hidden, i = [], [], 0
    for line in entries(bt.format()):
        m = MARKER.match(line)
        if m:
            count = int(m.group(1))
            assert count > 0
            hidden += frames[i:i + count]
            i += count
            continue
        f = frames[i]
        if f.kind == "python":
            assert line == f'  File "{f.file}", line {f.line}, in {f.function}', (line, f)
        else:
            assert f.function is None or f"] {f.function}" in line, (line, f)
        shown.append(f)
        i += 1
    assert i == len(frames), "the default view lost frames at the outer end"
    return shown, hidden


def assert_folded_only_interpreter_or_start_up(bt, shown, hidden):
    """Folded frames are the interpreter's, or lie outside the outermost Python frame shown."""
    outer = bt.frames()[::-1]
    first_python = next(i for i, f in enumerate(outer) if f.kind == "python" and f in shown)
    for f in hidden:
        assert conftest.in_interpreter(f) or outer.index(f) < first_python, f


def test_gevent_sleep_default_view():
    """guards: the readable view of a gevent greenlet parked in sleep() -- its
    Python frames with source lines, no call plumbing, each hidden frame
    counted by a marker, a header naming the greenlet."""
    gevent = pytest.importorskip("gevent")

    def worker():
        gevent.sleep(30)

    g = gevent.spawn(worker)
    gevent.sleep(0)
    try:
        bt = btcore.collect(g)
        text = bt.format()
        lines = text.splitlines()
        assert lines[0].startswith("Greenlet <Greenlet at 0x") and "worker" in lines[0]
        assert lines[0].endswith(": suspended, thread MainThread (id %d)" % threading.get_ident())
        assert lines[1] == "Backtrace (most recent call last):"
        code = worker.__code__
        frame_line = f'  File "{code.co_filename}", line {code.co_firstlineno + 1}, in {code.co_qualname}'
        i = lines.index(frame_line)
        assert lines[i + 1] == "    gevent.sleep(30)"
        sleep_line = next(ln for ln in lines if ln.startswith('  File "') and ln.endswith(", in sleep"))
        assert "gevent/hub.py" in sleep_line
        for name in PLUMBING_SEEN_HERE:
            assert name not in text
        shown, hidden = align(bt)
        if conftest.INTERPRETER_HAS_SYMTAB:   # stripped: the plumbing has no names, and stays
            assert hidden, "nothing was folded"
        assert_folded_only_interpreter_or_start_up(bt, shown, hidden)
        assert [f.function for f in shown if f.kind == "python"] == [
            f.function for f in bt.frames()[::-1] if f.kind == "python"]

        verbose = bt.format(verbose=True)
        assert verbose.splitlines()[0] == lines[0]
        assert len(entries(verbose)) == len(bt.frames())   # every frame, no marker
        assert not any(MARKER.match(ln) for ln in verbose.splitlines())
        if conftest.INTERPRETER_HAS_SYMTAB:
            assert "_PyEval_Vector" in verbose
    finally:
        g.kill()


def test_called_builtin_and_c_extension_shown(chain):
    """guards: the C function a Python frame called (builtin_sorted) and every
    frame of a C++ extension stay in the default view, between Python frames."""
    ffi, lib, so_path = chain
    got = {}

    def key(item):
        got["bt"] = btcore.collect(capacity=256)
        return item

    def cb(tag):
        sorted([1], key=key)
        return 0

    chain.call(lib.chain_entry, 2, cb)
    bt = got["bt"]
    shown, hidden = align(bt)
    fixture = [f for f in bt.frames() if f.module and os.path.realpath(f.module) == os.path.realpath(so_path)]
    assert len(fixture) >= 3
    assert all(f in shown for f in fixture)
    text = bt.format()
    assert "btfix::Walker<int>::descend(int)" in text
    if conftest.INTERPRETER_HAS_SYMTAB:
        names = [f.function for f in shown]
        assert "builtin_sorted" in names
        i_sorted = names.index("builtin_sorted")
        assert names[i_sorted - 1].endswith(".<locals>.cb") and names[-1].endswith(".<locals>.key")
    assert_folded_only_interpreter_or_start_up(bt, shown, hidden)


def test_fold_never_hides_unnamed_or_foreign_frames():
    """guards: only named frames of the interpreter are folded -- a frame with
    no name (stripped interpreter), of no known module, or of another module
    that happens to carry a plumbing name is always shown."""
    interp = conftest.INTERPRETER_PATH
    py = btcore.Frame("python", None, "x.py", "f", None, "x.py", 1)
    plumbing = btcore.Frame("native", 0x1000, interp, "PyObject_Vectorcall", 3, None, None)
    cold = btcore.Frame("native", 0x1001, interp, "_PyEval_Vector.cold", 3, None, None)
    unnamed = btcore.Frame("native", 0x2000, interp, None, 0x2000, None, None)
    nowhere = btcore.Frame("native", 0x3000, None, None, None, None, None)
    foreign = btcore.Frame("native", 0x4000, "/opt/x/libfoo.so", "PyObject_Vectorcall", 1, None, None)
    frames = [py, plumbing, unnamed, cold, nowhere, foreign, plumbing, py]
    out = fold(frames)
    kept = [f for f in out if isinstance(f, btcore.Frame)]
    assert kept == [py, unnamed, nowhere, foreign, py]
    counts = [f.count for f in out if not isinstance(f, btcore.Frame)]
    assert counts == [1, 1, 1]
    for f in (unnamed, nowhere):
        assert " ?? at " in f.format()

    # start-up, innermost first: an unnamed frame on the way stays shown
    libc = "/usr/lib/x86_64-linux-gnu/libc.so.6"
    module = btcore.Frame("python", None, "x.py", "<module>", None, "x.py", 1)
    start = [module, btcore.Frame("native", 0x10, interp, "PyEval_EvalCode", 1, None, None), unnamed,
             btcore.Frame("native", 0x20, interp, "Py_RunMain", 1, None, None),
             btcore.Frame("native", 0x30, libc, "__libc_start_main", 1, None, None),
             btcore.Frame("native", 0x40, interp, "_start", 1, None, None)]
    out = fold(start)
    assert out[0] is module and out[2] is unnamed
    assert [(f.count, f.start_up) for f in (out[1], out[3])] == [(1, True), (3, True)] and len(out) == 4


def test_short_paths_default_full_paths_verbose():
    """guards: build paths are shortened in the default view only; Frame.file
    and the verbose view keep the full path."""
    assert short_path("/tmp/python-build.1.2/Python-3.11.7/./Include/internal/pycore_call.h") == \
        "Include/internal/pycore_call.h"
    assert short_path("/tmp/python-build.1.2/Python-3.11.7/Objects/call.c") == "Objects/call.c"
    assert short_path("./csu/../csu/libc-start.c") == "csu/libc-start.c"
    assert short_path("/usr/include/c++/12/bits/stl_vector.h") == ".../bits/stl_vector.h"
    assert short_path("/src/a.c") == "/src/a.c"

    bt = btcore.collect(capacity=1024)
    with_file = [f for f in bt.frames() if f.kind == "native" and f.file and not f.inlined]
    if not with_file:
        pytest.skip("no native frame has DWARF here")
    shown, _ = align(bt)
    default, verbose = bt.format(), bt.format(verbose=True)
    for f in with_file:
        if f in shown:
            assert f"] {f.function} at {short_path(f.file)}:{f.line}" in default
        assert f"    {f.file}:{f.line}" in verbose


def _park():
    greenlet.getcurrent().parent.switch()


class Falsy(greenlet.greenlet):
    def __bool__(self):
        return False

    def __repr__(self):
        raise RuntimeError("no repr")


def test_greenlet_header_states():
    """guards: the header reads greenlet's own state at format time (not
    bool(g), which subclasses override), survives a failing __repr__, and
    keeps no greenlet alive."""
    g = Falsy(_park)
    assert btcore.collect(g).format().splitlines()[0].endswith(": not started, thread MainThread (id %d)"
                                                               % threading.get_ident())
    g.switch()
    bt = btcore.collect(g)
    header = bt.format().splitlines()[0]
    assert header.startswith("Greenlet <test_format.Falsy object at 0x") and ": suspended, " in header
    assert ": running, " in btcore.collect(greenlet.getcurrent()).format().splitlines()[0]
    g.throw(greenlet.GreenletExit)
    assert ": dead, " in bt.format().splitlines()[0]      # the state now, not at capture
    alive = weakref.ref(g)
    del g
    gc.collect()
    assert alive() is None, "a Backtrace kept its greenlet alive"
    assert bt.format().splitlines()[0] == "Greenlet (no longer exists)"
    assert btcore.collect().format().splitlines()[0] == "Backtrace (most recent call last):"


START_UP_SCRIPT = """
import json

import btcore

def main():
    return btcore.collect(capacity=256)

bt = main()
print(bt.format())
print("====")
print(json.dumps([f.function for f in bt.frames()]))
"""


@pytest.mark.parametrize("how", ["script", "module"])
def test_start_up_frames_folded(tmp_path, how):
    """guards: the frames from _start down to the program's first frame
    (runpy's, for python -m) are one start-up marker in the default view;
    where some of them have no name (a stripped interpreter or libc), the
    unnamed ones and all inside them stay shown."""
    (tmp_path / "startup_demo.py").write_text(textwrap.dedent(START_UP_SCRIPT))
    cmd = [sys.executable, "startup_demo.py"] if how == "script" else [sys.executable, "-m", "startup_demo"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text, names = done.stdout.split("====\n")
    outer = json.loads(names)[::-1]    # outermost first
    start_up = outer[:outer.index("<module>")]
    lines = text.splitlines()
    assert lines[0] == "Backtrace (most recent call last):"
    m = MARKER.match(lines[1])
    assert m and m.group(2) == "start-up"
    if None not in start_up:
        assert int(m.group(1)) == len(start_up)   # everything outside <module>
        assert lines[2].endswith(", in <module>") and lines[3] == "    bt = main()"
    else:
        assert int(m.group(1)) == start_up.index(None)
        assert sum(" ?? at 0x" in line for line in lines) >= start_up.count(None)
    assert "runpy" not in text


def test_greenlet_header_other_thread():
    """guards: a greenlet of another thread is described as such, with its state."""
    ready, release, box = threading.Event(), threading.Event(), {}

    def thread_main():
        g = greenlet.greenlet(_park)
        g.switch()
        box["g"] = g
        ready.set()
        release.wait()
        g.throw(greenlet.GreenletExit)

    t = threading.Thread(target=thread_main)
    t.start()
    try:
        assert ready.wait(10)
        header = btcore.collect(box["g"]).format().splitlines()[0]
        assert header.startswith("Greenlet <greenlet.greenlet object at 0x")
        assert header.endswith(": suspended, another thread")
    finally:
        release.set()
        t.join()


def test_eval_loop_frames_left_native_stay_shown():
    """guards: an eval-loop frame that is not replaced by Python frames
    (python=False here; an unmerged one alike) stands for Python code and is
    never folded."""
    bt = btcore.collect(python=False, capacity=1024)
    loops = [f for f in bt.frames() if conftest.is_eval_loop(f)]
    assert loops
    shown, hidden = align(bt)
    assert all(f in shown for f in loops)


def test_thread_start_up_folded():
    """guards: a thread's entry (clone3, start_thread, thread_run, threading's
    bootstrap) folds like the process's start-up."""
    out = []
    t = threading.Thread(target=lambda: out.append(btcore.collect(capacity=256)))
    t.start()
    t.join()
    bt = out[0]
    outer = [f.function for f in bt.frames()][::-1]
    lines = bt.format().splitlines()
    if None not in outer[:outer.index("Thread.run")]:   # else a stripped libc or interpreter
        m = MARKER.match(lines[1])
        assert m and m.group(2) == "start-up" and int(m.group(1)) == outer.index("Thread.run")
        assert lines[2].endswith(", in Thread.run")
        assert "_bootstrap" not in bt.format()
    # (on a stripped interpreter the unnamed frames between its named ones
    # stay shown, and the fold of threading's own frames may stop at them)
