"""btcore.collect(): what a capture of the calling thread contains, and in
which order.

Oracles, all independent of btcore:
  * the interpreter's own frame chain (sys._getframe / f_back): names, files
    and f_lineno of every Python frame;
  * glibc's backtrace() taken inside the native fixture (tests/fixtures/chain.cpp):
    the return addresses of every native frame from the fixture to the
    bottom of the stack;
  * the fixture's ELF symbol table read with pyelftools (chain_symbols):
    which function a return address falls in.
"""
import contextlib
import os
import sys

import greenlet
import pytest

import btcore
import conftest
from conftest import build_chain as bc
from oracles import interp_chain, py_view, BIG

BTCORE_DIR = os.path.dirname(os.path.realpath(btcore.__file__)) + os.sep
EVAL_LOOP = "_PyEval_EvalFrameDefault"


# ---------------------------------------------------------------- helpers


@contextlib.contextmanager
def oracle_at_collect(into):
    """Records into[] the interpreter's frame chain of collect()'s caller at
    the moment it calls collect() (a profile hook on the builtin's 'c_call'
    event, whose frame is the caller's), so that the innermost frame's
    f_lineno is known exactly too."""
    def hook(frame, event, arg):
        if event == "c_call" and arg is btcore.collect and not into:
            into.append(interp_chain(frame))

    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(None)


def collect_in_callback(chain, cfunc, arg):
    """collect() and the interpreter's own chain, both taken inside the
    fixture's Python callback while cfunc(arg) runs."""
    got = {}

    def in_callback(tag):
        got["bt"], got["oracle"] = btcore.collect(capacity=BIG), interp_chain(sys._getframe())
        return 0

    chain.call(cfunc, arg, in_callback)
    return got["bt"], got["oracle"]


def cffi_name(name):
    """cffi's wrapper functions without their parameter list: whether the
    C++ compiler gives the static wrapper a mangled linkage name (g++ 12
    does, so addr2line-style names carry "(_object*, _object*)") or not
    (g++ 16) is the toolchain's choice."""
    if name and name.startswith("_cffi_f_") and name.endswith("(_object*, _object*)"):
        return name[: -len("(_object*, _object*)")]
    return name


def is_eval_loop(f):
    # named, or (stripped interpreters) an unnamed part of the loop: see conftest
    return conftest.is_eval_loop(f)


def assert_no_btcore_frames(frames):
    """btcore's own frames, Python or native, never appear."""
    for f in frames:
        for path in (f.module, f.file):
            assert not (path and os.path.realpath(path).startswith(BTCORE_DIR)), f"btcore frame: {f}"
        name = f.function or ""
        assert not name.startswith(("btc_", "_cffi_f_btc", "_cffi_d_btc")), f"btcore frame: {f}"


def in_fn(addr, symbols, name):
    lo, hi = symbols[name]
    return lo < addr <= hi   # a return address may equal the end (call as last insn)


# ---------------------------------------------------------------- basics

def test_first_frame_is_the_caller():
    bt, line = btcore.collect(), sys._getframe().f_lineno
    frames = bt.frames()
    assert frames, "empty backtrace"
    first = frames[0]
    assert first.kind == "python"
    assert (first.function, first.file, first.line) == (
        "test_first_frame_is_the_caller", __file__, line)
    assert_no_btcore_frames(frames)


def test_python_only_matches_interpreter_frame_chain():
    def level3():
        bt, oracle = btcore.collect(native=False, capacity=BIG), interp_chain(sys._getframe())
        return bt, oracle

    def level2():
        return level3()

    def level1():
        return level2()

    bt, oracle = level1()
    frames = bt.frames()
    assert all(f.kind == "python" for f in frames), [f for f in frames if f.kind != "python"]
    assert not bt.truncated
    # names, files and line numbers, frame by frame, down to the outermost
    assert py_view(frames) == oracle
    assert [f.function.rsplit(".", 1)[-1] for f in frames] == [
        name.rsplit(".", 1)[-1] for name, _, _ in oracle]


def test_merged_python_frames_match_interpreter_frame_chain():
    def inner():
        bt, oracle = btcore.collect(capacity=BIG), interp_chain(sys._getframe())
        return bt, oracle

    bt, oracle = inner()
    frames = bt.frames()
    assert not bt.truncated
    assert py_view(frames) == oracle
    assert frames[0].kind == "python" and frames[0].function.endswith("inner")
    # the merge replaced every eval-loop frame by the Python frames it runs
    assert not [f for f in frames if is_eval_loop(f)]
    assert_no_btcore_frames(frames)


def test_native_only():
    bt = btcore.collect(python=False, capacity=BIG)
    frames = bt.frames()
    assert frames and not bt.truncated
    assert all(f.kind == "native" for f in frames), [f for f in frames if f.kind != "native"]
    assert all(isinstance(f.ip, int) and f.ip > 0 for f in frames)
    assert any(is_eval_loop(f) for f in frames), [f.function for f in frames]
    assert_no_btcore_frames(frames)
    # the bottom of the stack is reached: the program's entry point
    names = [f.function for f in frames if not f.inlined]
    assert "main" in names or "Py_BytesMain" in names, names


def test_current_greenlet_target_is_the_same_as_none():
    a, b = btcore.collect(capacity=BIG), btcore.collect(greenlet.getcurrent(), capacity=BIG)
    fa, fb = a.frames(), b.frames()
    assert [(f.kind, f.function, f.module, f.line) for f in fa] == \
        [(f.kind, f.function, f.module, f.line) for f in fb]
    assert [f.ip for f in fa] == [f.ip for f in fb]


def test_inside_a_greenlet_python_frames_match_interpreter():
    result = {}

    def run():
        def deeper():
            a, oracle = btcore.collect(native=False, capacity=BIG), interp_chain(sys._getframe())
            b = btcore.collect(greenlet.getcurrent(), native=False, capacity=BIG)
            m = btcore.collect(capacity=BIG)
            result.update(a=a, b=b, m=m, oracle=oracle)
        deeper()

    greenlet.greenlet(run).switch()
    oracle = result["oracle"]
    assert py_view(result["a"].frames()) == oracle
    # same frames, the innermost one line (b) and two lines (m) further on
    name, file, line = oracle[0]
    assert py_view(result["b"].frames()) == [(name, file, line + 1)] + oracle[1:]
    merged = result["m"].frames()
    assert py_view(merged) == [(name, file, line + 2)] + oracle[1:]
    assert_no_btcore_frames(merged)


# ---------------------------------------------------------------- through native code

def test_merged_order_through_native_chain(chain, chain_symbols):
    """Python -> chain_entry -> chain_static -> btfix::Walker<int>::descend
    -> (cffi extern "Python") -> Python -> collect(): every frame in order."""
    ffi, lib, so_path = chain
    got = {}

    def in_callback(tag):
        bt, oracle = btcore.collect(capacity=BIG), interp_chain(sys._getframe())
        got["bt"], got["oracle"] = bt, oracle
        return 0

    chain.set_callback(in_callback)
    lib.chain_entry(1)
    chain.finish()

    frames, oracle = got["bt"].frames(), got["oracle"]
    assert not got["bt"].truncated
    assert_no_btcore_frames(frames)

    # Python frames: exactly the interpreter's chain, across the native part
    assert py_view(frames) == oracle
    assert [o[0] for o in oracle[:3]] == [
        "test_merged_order_through_native_chain.<locals>.in_callback",
        "_dispatch_factory.<locals>._chain_dispatch",
        "test_merged_order_through_native_chain"]

    # Landmarks: all Python frames + the native frames of the fixture module
    def landmark(f):
        if f.kind == "python":
            return ("py", f.function)
        if f.module and os.path.realpath(f.module) == so_path:
            return ("c", cffi_name(f.function))
        return None

    marks = [m for m in map(landmark, frames) if m]
    expected = [("py", oracle[0][0]), ("py", oracle[1][0]),
                ("c", bc.NAME_PY_CALLBACK),
                ("c", bc.NAME_DESCEND),
                ("c", bc.NAME_CHAIN_STATIC),
                ("c", bc.NAME_CHAIN_ENTRY),
                ("c", "_cffi_f_chain_entry")]
    expected += [("py", o[0]) for o in oracle[2:]]
    assert marks == expected

    # Adjacency in the full list: the fixture's frames are consecutive ...
    i_cb = next(i for i, f in enumerate(frames)
                if landmark(f) == ("c", bc.NAME_PY_CALLBACK))
    assert [cffi_name(frames[i].function) for i in range(i_cb, i_cb + 5)] == [
        bc.NAME_PY_CALLBACK, bc.NAME_DESCEND, bc.NAME_CHAIN_STATIC, bc.NAME_CHAIN_ENTRY,
        "_cffi_f_chain_entry"]
    assert all(f.kind == "native" and not f.inlined for f in frames[i_cb:i_cb + 5])
    # ... their return addresses lie in the functions the ELF symtab names
    for f, sym in zip(frames[i_cb:i_cb + 4],
                      ["chain_py_callback", "_ZN5btfix6WalkerIiE7descendEi", "chain_static", "chain_entry"]):
        assert in_fn(f.ip, chain_symbols, sym), (f, sym, chain_symbols[sym])
        assert f.offset == f.ip - chain_symbols[sym][0]
        assert os.path.realpath(f.module) == so_path
    # ... between the callback's Python frames and the fixture: native only
    # (cffi's callback machinery and libpython's call path), at least one
    i_disp = next(i for i, f in enumerate(frames) if f.kind == "python"
                  and f.function == oracle[1][0])
    between = frames[i_disp + 1:i_cb]
    assert between and all(f.kind == "native" for f in between)
    # ... and between the cffi wrapper and the test function: native only
    i_test = next(i for i, f in enumerate(frames) if f.kind == "python"
                  and f.function == oracle[2][0])
    # (3.14+ specialises calls of C functions: the eval loop may call the
    # cffi wrapper directly, with no libpython frame in between)
    assert i_test > i_cb + 5 or (sys.version_info >= (3, 14) and i_test == i_cb + 5)
    assert all(f.kind == "native" for f in frames[i_cb + 5:i_test])

    # demangled names, exactly
    assert bc.NAME_DESCEND == "btfix::Walker<int>::descend(int)"
    assert bc.NAME_CHAIN_STATIC == "chain_static"


def test_eval_calls_longer_than_a_read_ahead_keep_every_frame_in_place(chain):
    """Eval-loop calls running more Python frames than the merge reads from
    the chain at once (capture.c's PY_AHEAD, 32), on both sides of native
    code: 70 frames of one eval-loop call inside the fixture's callback, 100
    of another outside it.  Every Python frame is there, in order, on its
    side of the fixture's C frames: frames lost or misplaced where one batch
    ends and the next begins would show."""
    ffi, lib, so_path = chain
    got = {}

    def deep(n, fn):
        return fn() if n == 0 else deep(n - 1, fn)

    def in_callback(tag):
        def capture():
            got["bt"], got["oracle"] = btcore.collect(capacity=BIG), interp_chain(sys._getframe())
        deep(70, capture)
        return 0

    chain.set_callback(in_callback)
    deep(100, lambda: lib.chain_entry(1))
    chain.finish()

    frames, oracle = got["bt"].frames(), got["oracle"]
    assert not got["bt"].truncated
    assert py_view(frames) == oracle
    fixture = [i for i, f in enumerate(frames) if f.kind == "native" and f.module
               and os.path.realpath(f.module) == so_path]
    assert fixture and fixture == list(range(fixture[0], fixture[-1] + 1))
    inner = [f for f in frames[:fixture[0]] if f.kind == "python"]
    outer = [f for f in frames[fixture[-1] + 1:] if f.kind == "python"]
    assert [f.function.rsplit(".", 1)[-1] for f in inner] == \
        ["capture"] + ["deep"] * 71 + ["in_callback", "_chain_dispatch"]
    assert [f.function.rsplit(".", 1)[-1] for f in outer[:102]] == \
        ["<lambda>"] + ["deep"] * 101
    assert len(inner) + len(outer) == len(oracle)


@conftest.skip_under_asan
def test_native_addresses_match_glibc_backtrace(chain, chain_symbols):
    """Differential test against glibc's backtrace().

    Inside btfix::Walker<int>::descend, the fixture calls glibc backtrace()
    (g_glibc_bt), then the Python callback, where we take
    collect(python=False).  Both captures share every frame from the caller
    of descend outward: glibc's entries [1:] are the return addresses into
    chain_static, chain_entry, _cffi_f_chain_entry, libpython, ... down to
    the bottom of the stack, and they must equal the outer suffix of ours,
    address by address, with nothing extra after it.  glibc's entry [0] is
    not compared as an address: it is the return address of the call to
    backtrace() inside descend, while ours is the return address of the call
    to chain_py_callback in the same activation of descend; we check that
    both lie in descend.  Our frames inner to that are the callback path
    (cffi, libpython, the eval loop running the callback), which glibc
    never saw.
    """
    ffi, lib, so_path = chain
    got = {}

    def in_callback(tag):
        got["bt"] = btcore.collect(python=False, capacity=BIG)
        return 0

    lib.g_glibc_bt_enabled = 1
    try:
        chain.set_callback(in_callback)
        lib.chain_entry(0)
        chain.finish()
    finally:
        lib.g_glibc_bt_enabled = 0

    glibc = chain.glibc_backtrace()
    assert 4 <= len(glibc) < 1024, "glibc backtrace() missing or overflowed"
    # the oracle itself is sane
    assert in_fn(glibc[0], chain_symbols, "_ZN5btfix6WalkerIiE7descendEi")
    assert in_fn(glibc[1], chain_symbols, "chain_static")
    assert in_fn(glibc[2], chain_symbols, "chain_entry")

    bt = got["bt"]
    assert not bt.truncated
    frames = bt.frames()
    assert all(f.kind == "native" for f in frames)
    assert_no_btcore_frames(frames)
    ours = [f.ip for f in frames if not f.inlined]

    shared = glibc[1:]
    assert len(ours) > len(shared)
    k = len(ours) - len(shared)   # our index of descend's frame
    assert [hex(a) for a in ours[k:]] == [hex(a) for a in shared], \
        "collect(python=False) disagrees with glibc backtrace() on the shared outer frames"
    assert in_fn(ours[k - 1], chain_symbols, "_ZN5btfix6WalkerIiE7descendEi")
    assert ours[k - 1] != glibc[0]
    assert in_fn(ours[k - 2], chain_symbols, "chain_py_callback")
    # the callback path holds an eval loop (the Python callback runs in one)
    assert any(is_eval_loop(f) for f in frames[:k])


@pytest.mark.parametrize("depth", [0, 1, 7, 40])
def test_native_recursion_depth(chain, chain_symbols, depth):
    """recurse_then_call(n): n+1 frames of recurse_then_call, all present and
    consecutive, between the callback and the test function."""
    ffi, lib, so_path = chain
    bt, oracle = collect_in_callback(chain, lib.recurse_then_call, depth)
    frames = bt.frames()
    assert py_view(frames) == oracle
    rec = [i for i, f in enumerate(frames) if f.function == bc.NAME_RECURSE]
    assert len(rec) == depth + 1
    assert rec == list(range(rec[0], rec[0] + depth + 1))
    assert all(in_fn(frames[i].ip, chain_symbols, "recurse_then_call") for i in rec)
    assert frames[rec[0] - 1].function == bc.NAME_PY_CALLBACK
    assert cffi_name(frames[rec[-1] + 1].function) == "_cffi_f_recurse_then_call"
    assert_no_btcore_frames(frames)


def test_python_frame_lines_in_multiline_calls():
    """Line numbers come from the instruction offset of each frame, as the
    interpreter computes f_lineno (a call spread over several lines)."""
    seen = []

    def leaf(*args):
        with oracle_at_collect(seen):
            bt = btcore.collect(
                native=False,
                capacity=BIG,
            )
        return bt

    bt = leaf(
        1,
        2,
        (lambda: 3)(),
    )
    assert seen, "profile hook did not see collect()"
    assert py_view(bt.frames()) == seen[0]


def main_stack_address():
    with open("/proc/self/maps") as maps:
        line = next(m for m in maps if m.rstrip().endswith("[stack]"))
    return int(line.split("-")[1].split()[0], 16) - 64


@pytest.mark.parametrize("garbage", [0, 0xdeadbeef, 1 << 63, "text", "heap", "stack"])
def test_corrupt_return_address_ends_the_walk(chain, garbage):
    """A saved return address overwritten with garbage (null, unmapped,
    non-canonical, the middle of a function, a stack address): capture still
    returns, with every frame up to the corrupt one, and the Python frames
    (kept even though the eval-loop frames below could not be reached).
    Run in this process: a crash fails the whole session, loudly."""
    ffi, lib, _ = chain
    kind = garbage
    if garbage == "text":     # inside a function: a row exists, the rest is nonsense
        garbage = chain.fn_addr(bc.FN_CHAIN_STATIC) + 3
    elif garbage == "heap":   # readable data, no code
        keep = ffi.new("char[64]")
        garbage = int(ffi.cast("uintptr_t", keep))
    elif garbage == "stack":  # inside the main thread's stack
        garbage = main_stack_address()
    bt, oracle = collect_in_callback(chain, lib.corrupt_return_address_then_call, garbage)
    frames = bt.frames()
    names = [f.function for f in frames if f.kind == "native"]
    assert "corrupt_return_address_then_call" in names
    assert names.index("corrupt_return_address_then_call") > names.index(bc.NAME_PY_CALLBACK)
    # Nothing of the real callers (the cffi wrapper, the interpreter below
    # it) can be reached through a return address in no function.  (From the
    # middle of a function the walk may go on through leftovers on the
    # stack: bounded, but its frames are not an oracle.)
    if kind != "text":
        assert names[-1] == "corrupt_return_address_then_call"
    # ...and no Python frame is lost.
    assert py_view(frames) == oracle


def test_eval_loop_ranges_match_an_independent_reading():
    """The native frames the merge gives to Python are the eval loop's: its
    named parts (symbol table) and, in a stripped interpreter, the unnamed
    parts its direct jumps lead to (objdump + pyelftools in conftest)."""
    from btcore._native import ffi, lib
    lo, hi = ffi.new("uintptr_t[16]"), ffi.new("uintptr_t[16]")
    n = lib.btc_eval_ranges(lo, hi, 16)
    assert 0 < n <= 16
    assert sorted(zip(lo[0:n], hi[0:n])) == sorted(conftest.eval_loop_ranges())


def test_builtin_and_python_paths_capture_the_same_frames():
    """collect() does plain calls in C and hands the others (here python=1,
    not a bool) to its Python implementation; both must hide btcore's own
    frames alike and capture the same stack from the same call site."""
    def site(**kw):
        return btcore.collect(capacity=BIG, **kw)

    fast, slow = site(python=True), site(python=1)
    key = [(f.kind, f.function, f.file, f.line, f.ip) for f in fast.frames()]
    assert key == [(f.kind, f.function, f.file, f.line, f.ip) for f in slow.frames()]
    assert fast.frames()[0].function.endswith("site")


def test_builtin_collect_carries_the_real_docstring_and_signature():
    """Guards issue 8.7: help(btcore.collect) showed only a pointer to a source
    file; the builtin must carry the Python implementation's docstring and
    signature (inspect.signature works, pydoc shows both)."""
    import inspect
    import pydoc
    from btcore.capture import backtrace

    builtin, python = btcore.collect, backtrace._python_collect
    assert type(builtin).__name__ == "builtin_function_or_method" and python is not builtin
    want = inspect.signature(python).replace(return_annotation=inspect.Signature.empty)
    assert inspect.signature(builtin) == want
    assert [(p.name, p.kind, p.default) for p in inspect.signature(builtin).parameters.values()] == [
        ("target", inspect.Parameter.POSITIONAL_OR_KEYWORD, None),
        ("limit", inspect.Parameter.KEYWORD_ONLY, None),
        ("python", inspect.Parameter.KEYWORD_ONLY, True),
        ("native", inspect.Parameter.KEYWORD_ONLY, True),
        ("capacity", inspect.Parameter.KEYWORD_ONLY, 64),
        ("internals", inspect.Parameter.KEYWORD_ONLY, False)]
    assert inspect.getdoc(builtin) == inspect.getdoc(python)
    assert "A greenlet not started, or dead: an empty" in builtin.__doc__
    shown = pydoc.render_doc(builtin, renderer=pydoc.plaintext)
    # (3.14's pydoc wraps a long signature over several lines)
    assert "collect(" in shown and all(f"{p}=" in shown for p in ("target", "limit", "capacity", "internals"))
    assert inspect.getdoc(python).splitlines()[0] in shown
