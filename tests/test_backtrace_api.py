"""The Backtrace object and the functions around it: capacity, limit,
append(), foreach(), format(), Frame, targets, lifetime of references."""
import copy
import gc
import os
import sys
import weakref

import greenlet
import pytest

import btcore
import conftest

BIG = 4096


def recurse(n, fn):
    """fn() at the bottom of n extra Python frames named recurse."""
    if n <= 0:
        return fn()
    return recurse(n - 1, fn)


def key(f):
    """What identifies a resolved frame (ip for native, name+line for Python)."""
    return (f.kind, f.ip, f.module, f.function, f.offset, f.file, f.line, f.inlined)


# ---------------------------------------------------------------- capacity

def test_default_capacity_is_64_and_truncates_outer_frames():
    bt = recurse(100, btcore.collect)
    assert bt.capacity == 64
    assert len(bt) == 64
    assert bt.truncated is True
    frames = bt.frames()
    assert frames[0].function == "recurse"        # innermost kept
    assert frames[-1].function == "recurse"       # the outer ones dropped


def test_not_truncated_when_it_fits():
    bt = btcore.collect(capacity=BIG)
    assert bt.capacity == BIG
    assert bt.truncated is False
    assert 0 < len(bt) < BIG


@pytest.mark.parametrize("capacity", [1, 3, 10])
@pytest.mark.parametrize("native", [True, False])
def test_capacity_keeps_innermost_frames(capacity, native):
    def take():
        # both on one line: the innermost frame's line is the same
        full, small = btcore.collect(capacity=BIG, native=native), btcore.collect(capacity=capacity, native=native)  # noqa: E501
        return full, small

    full, small = recurse(20, take)
    assert small.capacity == capacity
    assert len(small) == capacity
    assert small.truncated is True and full.truncated is False
    ff, fs = full.frames(), small.frames()
    assert [key(f) for f in fs] == [key(f) for f in ff[:len(fs)]]
    assert fs[0].kind == "python" and fs[0].function.endswith("take")


@pytest.mark.parametrize("bad, exc", [
    ("64", TypeError), (64.0, TypeError), ([64], TypeError),
    (0, ValueError), (-1, ValueError),
])
def test_bad_capacity(bad, exc):
    with pytest.raises(exc):
        btcore.collect(capacity=bad)


# ---------------------------------------------------------------- limit

@pytest.mark.parametrize("limit", [0, 1, 2, 5, 17])
def test_limit_keeps_innermost(limit):
    def take():
        full, lim = btcore.collect(capacity=BIG), btcore.collect(capacity=BIG, limit=limit)
        return full, lim

    full, lim = recurse(20, take)
    assert len(lim) == limit
    assert lim.capacity == BIG
    ff, fl = full.frames(), lim.frames()
    assert [key(f) for f in fl] == [key(f) for f in ff[:len(fl)]]


def test_limit_none_and_large_limit_are_everything():
    def take():
        return btcore.collect(capacity=BIG), btcore.collect(capacity=BIG, limit=None), btcore.collect(capacity=BIG, limit=10 ** 9)  # noqa: E501
    a, b, c = recurse(3, take)
    assert len(a) == len(b) == len(c)
    assert [key(f) for f in a.frames()] == [key(f) for f in b.frames()] == [key(f) for f in c.frames()]


@pytest.mark.parametrize("bad, exc", [
    ("3", TypeError), (2.5, TypeError), ([1], TypeError), (-1, ValueError), (-100, ValueError),
])
def test_bad_limit(bad, exc):
    with pytest.raises(exc):
        btcore.collect(limit=bad)


# ---------------------------------------------------------------- targets

@pytest.mark.parametrize("target", [42, "main", object(), sys._getframe, 0])
def test_non_greenlet_target_is_a_type_error(target):
    with pytest.raises(TypeError):
        btcore.collect(target)


# ---------------------------------------------------------------- append

def site_a():
    return btcore.collect(capacity=BIG)


def site_b(capacity=BIG):
    return btcore.collect(capacity=capacity)


def test_append_copies_frames_and_marks_the_join():
    a, b = site_a(), recurse(2, site_b)
    before_a, fb = [key(f) for f in a.frames()], [key(f) for f in b.frames()]
    la, lb = len(a), len(b)
    n = btcore.append(a, b)
    assert n == lb
    assert len(a) == la + lb
    assert [key(f) for f in a.frames()] == before_a + fb
    assert len(b) == lb and [key(f) for f in b.frames()] == fb   # add is untouched
    assert a.truncated is False


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy])
def test_copies_are_independent(how):
    """Guards issue 8.4: a copy shared the frame buffer, so append() to the
    copy grew the original (whose format() then failed)."""
    original = recurse(2, site_a)
    before, n = [key(f) for f in original.frames()], len(original)
    dup = how(original)
    assert dup is not original and type(dup) is btcore.Backtrace
    assert (len(dup), dup.capacity, dup.truncated) == (n, original.capacity, original.truncated)
    assert [key(f) for f in dup.frames()] == before
    added = btcore.append(dup, site_b())
    assert added > 0 and len(dup) == n + added and dup.joins()
    dup.truncated = True
    assert len(original) == n and not original.truncated and original.joins() == []
    assert [key(f) for f in original.frames()] == before
    assert original.format()   # used to raise StopIteration
    # and the other way round
    dup2 = how(original)
    btcore.append(original, site_b())
    assert len(dup2) == n and [key(f) for f in dup2.frames()] == before



@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy])
def test_copy_of_a_greenlet_backtrace_keeps_its_header(how):
    """A copy prints the same greenlet header line as the original."""
    g = greenlet.greenlet(lambda: greenlet.getcurrent().parent.switch())
    g.switch()
    try:
        original = btcore.collect(g)
        header = original.format().splitlines()[0]
        assert header.startswith("Greenlet ") and "suspended" in header
        assert how(original).format().splitlines()[0] == header
    finally:
        g.throw(greenlet.GreenletExit)

def py_site_a():
    return btcore.collect(capacity=BIG, native=False)


def py_site_b():
    return btcore.collect(capacity=BIG, native=False)


def test_append_join_shows_in_format():
    """format() shows where the appended backtrace begins.  With Python frames
    only, every frame is one 'File' line in verbose form; "most recent call last" prints the
    appended (outer) backtrace first: ... site_b, <join>, <module> ... site_a.
    Without a join no other line sits between two frame lines."""
    def frame_line(ln):
        return ln.startswith('  File "')

    a, b = py_site_a(), recurse(2, py_site_b)
    def body_of(text):   # every line but the header
        return [ln for ln in text.splitlines() if ln.strip() and "most recent call" not in ln]

    body = body_of(a.format(verbose=True))
    assert all(frame_line(ln) for ln in body), "a fresh capture has only frame lines"
    assert sum(map(frame_line, body)) == len(a)

    assert btcore.append(a, b) == len(b)
    lines = body_of(a.format(verbose=True))
    i_b = next(i for i, ln in enumerate(lines) if ln.endswith(" in py_site_b"))
    i_next = next(i for i in range(i_b + 1, len(lines)) if frame_line(lines[i]))
    between = [ln for ln in lines[i_b + 1:i_next] if ln.strip()]
    assert between, "no join marker between the appended backtrace and the original"
    # and only there
    others = [ln for ln in lines if not frame_line(ln)]
    assert others == between
    assert lines[-1].endswith(" in py_site_a")
    assert sum(map(frame_line, lines)) == len(a)


def test_append_respects_capacity():
    a = btcore.collect(capacity=BIG)
    b = recurse(10, site_b)
    assert len(b) > 5
    room = 3
    to = btcore.collect(capacity=len(a) + room, limit=len(a))
    assert len(to) == len(a)
    n = btcore.append(to, b)
    assert n == room
    assert len(to) == to.capacity
    assert to.truncated is True
    # b's first `room` raw frames, resolved (one raw frame may resolve to
    # several Frames when calls were inlined): an independent copy of them.
    head = btcore.Backtrace(room)
    assert btcore.append(head, b) == room
    appended = to.frames()[to.joins()[0]:]
    assert [key(f) for f in appended] == [key(f) for f in head.frames()]
    # full: nothing more fits
    assert btcore.append(to, b) == 0
    assert len(to) == to.capacity


def test_append_keeps_code_alive():
    a = btcore.collect(capacity=BIG)
    ns = {"btcore": btcore}
    exec(compile("def appended_fn():\n    return btcore.collect()\n", "<appended>", "exec"), ns)
    b = ns["appended_fn"]()
    wr = weakref.ref(ns["appended_fn"].__code__)
    btcore.append(a, b)
    del b, ns
    gc.collect()
    assert wr() is not None
    f = a.frames()[a.joins()[-1]]
    assert (f.function, f.file, f.line) == ("appended_fn", "<appended>", 2)


@pytest.mark.parametrize("args", [
    ("x", None), (None, "x"), ([], []), (1, 2),
])
def test_append_rejects_non_backtraces(args):
    bt = btcore.collect()
    to, add = (bt if a is None else a for a in args)
    with pytest.raises(TypeError):
        btcore.append(to, add)


# ---------------------------------------------------------------- foreach

def test_foreach_visits_all_in_order():
    bt = recurse(5, lambda: btcore.collect(capacity=BIG))
    seen = []
    n = btcore.foreach(bt, seen.append)   # returns None: never stops
    assert n == len(seen) == len(bt.frames())
    assert [key(f) for f in seen] == [key(f) for f in bt.frames()]
    assert all(isinstance(f, btcore.Frame) for f in seen)


@pytest.mark.parametrize("stop_at", [1, 2, 5])
def test_foreach_stops_when_callback_returns_true(stop_at):
    bt = recurse(10, lambda: btcore.collect(capacity=BIG))
    seen = []

    def cb(f):
        seen.append(f)
        return len(seen) == stop_at

    assert btcore.foreach(bt, cb) == stop_at
    assert len(seen) == stop_at
    assert [key(f) for f in seen] == [key(f) for f in bt.frames()[:stop_at]]


def test_foreach_propagates_exceptions_unchanged():
    class Boom(Exception):
        pass

    bt = recurse(5, lambda: btcore.collect(capacity=BIG))
    boom = Boom("x")
    calls = []

    def cb(f):
        calls.append(f)
        if len(calls) == 3:
            raise boom

    with pytest.raises(Boom) as info:
        btcore.foreach(bt, cb)
    assert info.value is boom
    assert len(calls) == 3
    # the backtrace is still usable
    assert btcore.foreach(bt, lambda f: None) == len(bt.frames())


def test_foreach_rejects_non_backtrace():
    with pytest.raises(TypeError):
        btcore.foreach([], lambda f: None)


# ---------------------------------------------------------------- format

def formatted_leaf():
    return btcore.collect(capacity=BIG), sys._getframe().f_lineno


def test_format_python_style(chain):
    ffi, lib, so_path = chain
    got = {}

    def cb(tag):
        got["bt"], got["line"] = formatted_leaf()
        return 0

    chain.call(lib.chain_entry, 0, cb)
    bt, line = got["bt"], got["line"]
    text = bt.format()
    assert str(bt) == text
    assert "most recent call last" in text
    lines = text.splitlines()
    # innermost last, in the traceback module's words
    leaf = f'  File "{__file__}", line {line}, in formatted_leaf'
    assert leaf in lines
    assert lines.index(leaf) > max(i for i, ln in enumerate(lines) if "test_format_python_style" in ln)
    # native frames: the default view names the module without its ABI tag
    # and the function; the verbose view adds the full file name and address
    descend = next(f for f in bt.frames() if f.function == "btfix::Walker<int>::descend(int)")
    dl = [ln for ln in lines if "btfix::Walker<int>::descend(int)" in ln]
    assert len(dl) == 1
    assert dl[0].startswith("  [_btfix_chain.so] btfix::Walker<int>::descend(int) at ")
    assert f"{descend.ip:x}" not in dl[0]
    verbose = [ln for ln in bt.format(verbose=True).splitlines() if "btfix::Walker<int>::descend(int)" in ln]
    assert len(verbose) == 1
    assert os.path.basename(so_path) in verbose[0]
    assert f"{descend.ip:#x}" in verbose[0]
    # outer frames come first
    i_desc = lines.index(dl[0])
    i_static = next(i for i, ln in enumerate(lines) if "chain_static" in ln)
    i_entry = next(i for i, ln in enumerate(lines) if "chain_entry" in ln and "_cffi_f" not in ln)
    assert i_entry < i_static < i_desc < lines.index(leaf)


def test_format_mentions_truncation():
    bt = recurse(100, btcore.collect)
    assert bt.truncated
    full = recurse(100, lambda: btcore.collect(capacity=BIG))
    assert bt.format() != full.format()
    assert bt.format().count("\n") < full.format().count("\n")


# ---------------------------------------------------------------- Frame

def test_frame_is_immutable():
    f = btcore.collect().frames()[0]
    for attr, value in [("function", "x"), ("line", 1), ("kind", "native"), ("ip", 0),
                        ("module", "m"), ("offset", 1), ("file", "f"), ("inlined", True)]:
        with pytest.raises((AttributeError, TypeError)):
            setattr(f, attr, value)
    with pytest.raises((AttributeError, TypeError)):
        f.extra = 1
    with pytest.raises((AttributeError, TypeError)):
        del f.function
    assert f.function == "test_frame_is_immutable"


GOOD_NATIVE = dict(kind="native", ip=0x1000, module="/lib/x.so", function="f", offset=4, file="x.c", line=3)
GOOD_PYTHON = dict(kind="python", ip=None, module="m.py", function="f", offset=None, file="m.py", line=3)


@pytest.mark.parametrize("base, change, exc", [
    (GOOD_NATIVE, dict(ip=None), TypeError),          # format() did `None:#x`
    (GOOD_NATIVE, dict(ip="0x10"), TypeError),
    (GOOD_NATIVE, dict(ip=True), TypeError),
    (GOOD_NATIVE, dict(ip=-1), ValueError),
    (GOOD_NATIVE, dict(kind="c"), ValueError),
    (GOOD_NATIVE, dict(kind=None), ValueError),
    (GOOD_NATIVE, dict(module=b"/lib/x.so"), TypeError),
    (GOOD_NATIVE, dict(function=1), TypeError),
    (GOOD_NATIVE, dict(offset=1.5), TypeError),
    (GOOD_NATIVE, dict(offset=-4), ValueError),
    (GOOD_NATIVE, dict(file=0), TypeError),
    (GOOD_NATIVE, dict(line="3"), TypeError),
    (GOOD_NATIVE, dict(inlined=1), TypeError),
    (GOOD_PYTHON, dict(ip=0x1000), ValueError),
    (GOOD_PYTHON, dict(offset=0), ValueError),
    (GOOD_PYTHON, dict(line=False), TypeError),
])
def test_frame_constructor_validates(base, change, exc):
    """Guards issue 8.6: Frame() accepted anything, and format() broke later."""
    with pytest.raises(exc):
        btcore.Frame(**{**base, **change})


def test_frame_constructor_accepts_what_format_handles():
    for fields in (GOOD_NATIVE, GOOD_PYTHON,
                   dict(GOOD_NATIVE, module=None, function=None, offset=None, file=None, line=None),
                   dict(GOOD_NATIVE, offset=None, inlined=True)):
        f = btcore.Frame(**fields)
        assert f.format() and f == btcore.Frame(**fields)


def test_frame_fields():
    bt, line = btcore.collect(capacity=BIG), sys._getframe().f_lineno
    frames = bt.frames()
    py = frames[0]
    assert (py.kind, py.function, py.module, py.file, py.line, py.inlined) == (
        "python", "test_frame_fields", __file__, __file__, line, False)
    natives = [f for f in frames if f.kind == "native"]
    assert natives
    for f in natives:
        assert isinstance(f.ip, int) and f.ip > 0
        assert f.inlined in (True, False)
    named = [f for f in natives if f.function and not f.inlined]
    assert named
    for f in named:
        assert f.module and os.path.isabs(f.module) or f.module == ""
        if f.offset is None:   # named by DWARF alone: no symbol gives its start
            assert f.file is not None
        else:
            assert isinstance(f.offset, int) and f.offset >= 0
    # the interpreter's exported functions are named, with offsets (libpython,
    # or a stripped python3.X executable's .dynsym)
    assert any(f.offset is not None and conftest.in_interpreter(f) for f in named)


# ---------------------------------------------------------------- lifetime

def test_backtrace_keeps_code_objects_valid():
    """Collect inside an exec'd code object and a lambda, drop every other
    reference, collect garbage (and churn new code objects into the freed
    memory), then resolve: names, files and lines still right."""
    ns = {"btcore": btcore}
    src = (
        "def exec_fn():\n"
        "    return btcore.collect(capacity=64)\n"
        "lam = lambda: (\n"
        "    btcore.collect(capacity=64))\n"
    )
    exec(compile(src, "<exec-src>", "exec"), ns)
    wr = weakref.ref(ns["exec_fn"].__code__)
    wl = weakref.ref(ns["lam"].__code__)
    bt1 = ns["exec_fn"]()
    bt2 = ns["lam"]()
    bt3 = eval(compile("btcore.collect()", "<eval-src>", "eval"), {"btcore": btcore})
    del ns
    gc.collect()
    assert wr() is not None and wl() is not None, "the Backtrace must hold its code objects"
    # reuse freed memory with other code objects
    junk = [compile(f"def junk_{i}(): return {i}\n", f"<junk{i}>", "exec") for i in range(2000)]
    f1, f2, f3 = bt1.frames()[0], bt2.frames()[0], bt3.frames()[0]
    assert (f1.function, f1.file, f1.line) == ("exec_fn", "<exec-src>", 2)
    assert (f2.function, f2.file, f2.line) == ("<lambda>", "<exec-src>", 4)
    assert (f3.function, f3.file, f3.line) == ("<module>", "<eval-src>", 1)
    del junk


def test_released_backtrace_frees_code_objects_it_alone_held():
    """Without resolution (which caches by design), dropping the Backtrace
    drops its references: no leak of code objects."""
    ns = {"btcore": btcore}
    exec(compile("def leak_fn():\n    return btcore.collect()\n", "<leak-src>", "exec"), ns)
    wr = weakref.ref(ns["leak_fn"].__code__)
    bt = ns["leak_fn"]()
    del ns
    gc.collect()
    assert wr() is not None
    del bt
    gc.collect()
    assert wr() is None


# ---- errors ----

def test_backtrace_error_is_one_class_defined_beside_backtrace():
    """Guards where BacktraceError lives: btcore.errors (imported by capture/backtrace.py,
    no import cycle), the same class under btcore and btcore.capture.greenlets."""
    import btcore.errors
    import btcore.capture.greenlets
    assert btcore.BacktraceError is btcore.errors.BacktraceError is btcore.capture.greenlets.BacktraceError
    assert btcore.BacktraceError.__module__ == "btcore.errors"


_OUT_OF_MEMORY = r"""
import resource, btcore
btcore.collect(capacity=65536, limit=65536)   # warm: every import and one-time setup done

def vm_size():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))

resource.setrlimit(resource.RLIMIT_AS, (vm_size() + (256 << 10), resource.RLIM_INFINITY))
try:
    btcore.collect(capacity=65536, limit=65536)   # ~1 MiB of frame records: more than is left
    print("no error")
except MemoryError as e:
    print("MemoryError", e)
except Exception as e:
    print(type(e).__name__, e)
"""


@pytest.mark.skipif(conftest.UNDER_ASAN, reason="ASan reserves terabytes of address space: no RLIMIT_AS test")
@pytest.mark.skipif(conftest.UNDER_QEMU, reason="qemu-user: it accepts RLIMIT_AS but does not apply it (the limit "
                                                "would hit the emulator's own allocations)")
def test_out_of_memory_is_a_memory_error():
    """Guards how a failed allocation in the capture is reported: MemoryError,
    not BacktraceError("unsupported")."""
    import subprocess
    out = subprocess.run([sys.executable, "-c", _OUT_OF_MEMORY], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "MemoryError out of memory", out.stdout + out.stderr   # btcore's, not Python's


_AT_MODULE_TEARDOWN = r"""
import os, greenlet, btcore
collect, error, write = btcore.collect, btcore.BacktraceError, os.write   # held: globals go at teardown
gs = []
def park(gs=gs):
    gs[0].parent.switch(1)
gs.append(greenlet.greenlet(park))   # never started
gs.append(greenlet.greenlet(park))
gs[1].switch()                       # suspended

class AtTeardown:
    def __del__(self, gs=gs):
        for target in (gs[0], gs[1], None):
            try:
                write(1, b"Backtrace %d\n" % len(collect(target)))
            except error as e:
                write(1, b"BacktraceError " + str(e).encode() + b"\n")
            except BaseException as e:
                write(1, type(e).__name__.encode() + b" " + str(e).encode() + b"\n")

greenlet._greenlet.with_del = AtTeardown()   # finalized while modules are torn down (as greenlet's own test)
"""


def test_collect_during_interpreter_shutdown_is_a_backtrace_or_backtrace_error():
    """Guards collect() from a finalizer at module teardown (greenlet's
    test_switch_no_error_at_module_gc_time): a Backtrace or BacktraceError
    with a clear message, never the TypeError of torn-down module globals."""
    import subprocess
    out = subprocess.run([sys.executable, "-c", _AT_MODULE_TEARDOWN], capture_output=True, text=True, timeout=120)
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and out.returncode == 0, out.stdout + out.stderr
    for line in lines:
        assert line.startswith("Backtrace ") or line.startswith("BacktraceError btcore cannot capture during "
                                                                  "interpreter shutdown"), line


def _fresh(source: str) -> str:
    """stdout of source run in a fresh interpreter (-P: the installed btcore, not a checkout's src)."""
    import subprocess
    done = subprocess.run([sys.executable, "-P", "-c", source], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def test_import_btcore_loads_no_part_until_a_name_is_used():
    # guards: btcore/__init__.py imports each part on first use (a tool that only dumps another process does not
    # pay for the capture side); a name found once is then a plain attribute, and dir() lists every public name.
    out = _fresh(
        "import sys, btcore\n"
        "print(sorted(m for m in sys.modules if m.startswith('btcore.') and m != 'btcore._native'))\n"
        "btcore.collect\n"
        "print('btcore.capture.backtrace' in sys.modules, 'btcore.profile.sampler' in sys.modules, 'collect' in vars(btcore))\n"
        "print(set(btcore.__all__) <= set(dir(btcore)))\n")
    assert out.splitlines() == ["[]", "True False True", "True"], out


def test_every_public_name_and_every_module_imports_on_its_own():
    # guards: the lazy table names the module that defines each name, and no import cycle shows when a part
    # is the first one imported (backtrace <-> codec did); a part as an attribute works, a missing name says so.
    import pkgutil
    modules = [m.name for m in pkgutil.walk_packages(btcore.__path__) if m.name not in ("__main__", "_build")]
    out = _fresh(
        "import importlib, subprocess, sys\n"
        f"names, modules = {btcore.__all__!r}, {modules!r}\n"
        "def alone(statement):\n"
        "    done = subprocess.run([sys.executable, '-P', '-c', statement], capture_output=True, text=True)\n"
        "    return done.returncode == 0 or print(statement, done.stderr[-2000:])\n"
        "print(all([alone(f'import btcore; btcore.{n}') for n in names] +\n"
        "          [alone(f'import btcore.{m}') for m in modules] + [alone('import btcore; btcore.web.serve')]))\n"
        "import btcore\n"
        "try:\n"
        "    btcore.no_such_part\n"
        "except AttributeError as e:\n"
        "    print(e)\n")
    assert out.splitlines()[-2:] == ["True", "module 'btcore' has no attribute 'no_such_part'"], out
