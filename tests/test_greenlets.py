"""btcore.collect(g) for a greenlet g that is not the current one.

What a capture of a suspended greenlet must contain: the merged native and
Python frames of g's own stack, innermost first (the switch() call site
first; greenlet's switching machinery only with internals=True), down to g's
entry, and nothing of the stack below g (no frame of whichever greenlet
first switched into it).

Oracles, all independent of btcore's unwinder:
  * the interpreter's own frame chain of the suspended greenlet
    (g.gr_frame, f_back): names, files and line numbers of its Python frames;
  * the structure of the code that parked g: which functions it went
    through, how deep each recursion was (native recursion in the C++
    fixture, tests/fixtures/chain.cpp, and Python recursion);
  * the fixture's ELF symbol table read with pyelftools (chain_symbols):
    which function a return address falls in;
  * the main greenlet's own stack, captured independently, for "nothing of
    the stack below g".
"""
import collections
import os
import random
import sys
import threading
import time

import greenlet
import pytest

import btcore
import conftest
from conftest import build_chain as bc
from oracles import interp_chain, py_view, short, BIG

EVAL_LOOP = "_PyEval_EvalFrameDefault"
GREENLET_DIR = os.path.dirname(os.path.realpath(greenlet.__file__)) + os.sep
# cffi's wrappers, compared without their C++ parameter list (the demangled
# symbol has one, the DWARF name has none)
CFFI_WRAPPER_RECURSE = "_cffi_f_recurse_then_call"
CFFI_WRAPPER_ENTRY = "_cffi_f_chain_entry"
# Frames only the bottom of a thread's main stack has.
PROCESS_BOTTOM = {"main", "Py_BytesMain", "Py_RunMain", "_start", "__libc_start_main",
                  "__libc_start_call_main", "pymain_run_python"}


# ---------------------------------------------------------------- helpers


def is_eval_loop(f):
    # named, or (stripped interpreters) an unnamed part of the loop: see conftest
    return conftest.is_eval_loop(f)


def is_greenlet_frame(f):
    return f.kind == "native" and bool(f.module) and \
        os.path.realpath(f.module).startswith(GREENLET_DIR)


def in_fn(addr, symbols, name):
    lo, hi = symbols[name]
    return lo < addr <= hi   # a return address may equal the end (call as last insn)


def key(f):
    return (f.kind, f.ip, f.function, f.file, f.line)


def raw_prefix(frames, k):
    """The resolved frames of the first k raw frames: an inlined call comes
    as extra Frames before the frame it was inlined into."""
    out = []
    for f in frames:
        if k == 0:
            break
        out.append(f)
        if not f.inlined:
            k -= 1
    return out


def fixture_marks(frames, so_path):
    """The landmarks of a capture: every Python frame (short name) and every
    native frame of the C++ fixture module, in order."""
    out = []
    for f in frames:
        if f.kind == "python":
            out.append(("py", short(f.function)))
        elif f.module and os.path.realpath(f.module) == so_path:
            out.append(("c", cffi_name(f.function)))
    return out


def cffi_name(name):
    """cffi's wrapper functions without their parameter list."""
    if name and name.startswith("_cffi_f_") and name.endswith("(_object*, _object*)"):
        return name[: -len("(_object*, _object*)")]
    return name


def finish(*greenlets):
    """Let parked greenlets run to their end (they return on a 'stop')."""
    for g in greenlets:
        while g:
            g.switch("stop")


# ---------------------------------------------------------------- Python -> C -> Python -> switch

def test_suspended_through_native_chain_shows_only_its_own_stack(chain, chain_symbols):
    """Python -> chain_entry -> chain_static -> Walker<int>::descend ->
    extern "Python" callback -> deeper Python (4 frames) -> main.switch():
    collect(g) shows all of them in order, and nothing of the main
    greenlet's stack (the test function, pytest, the interpreter's start-up)."""
    ffi, lib, so_path = chain
    main = greenlet.getcurrent()
    lines = {}

    def deeper(k):
        if k == 0:
            lines["switch"] = sys._getframe().f_lineno + 1
            main.switch("parked")
            return 0
        return deeper(k - 1)

    def on_callback(tag):
        return deeper(3)

    def run():
        chain.set_callback(on_callback)
        return lib.chain_entry(1)

    g = greenlet.greenlet(run)
    lib.g_glibc_bt_enabled = 1   # the address oracle (see "address oracle" below)
    try:
        assert g.switch() == "parked"
    finally:
        lib.g_glibc_bt_enabled = 0
    glibc = chain.glibc_backtrace()
    # the main greenlet's stack, for "nothing below g": captured here, with
    # the same callers as the collect(g) below
    main_bt, main_oracle = btcore.collect(capacity=BIG), interp_chain(sys._getframe())
    bt = btcore.collect(g, capacity=BIG)
    try:
        assert g._stack_saved > 0, "precondition: main reused g's stack, so g is spilled"
        frames = bt.frames()
        oracle = interp_chain(g.gr_frame)
        assert not bt.truncated

        # Python frames: exactly the greenlet's own chain, switch() call site first
        assert py_view(frames) == oracle
        assert [short(o[0]) for o in oracle] == \
            ["deeper"] * 4 + ["on_callback", "_chain_dispatch", "run"]
        first_py = next(f for f in frames if f.kind == "python")
        assert (short(first_py.function), first_py.file, first_py.line) == \
            ("deeper", __file__, lines["switch"])

        # switching machinery hidden by default
        assert not [f for f in frames if is_greenlet_frame(f)], \
            [f.function for f in frames if is_greenlet_frame(f)]
        # nothing between the switch() call site and the innermost Python frame
        # but libpython's call path (a structural bound, not an address
        # oracle: these frames are inner to descend, where glibc's trace was
        # taken, so they did not exist when it was)
        i_first_py = frames.index(first_py)
        assert 0 < i_first_py <= 6, [f.function for f in frames[:i_first_py + 1]]
        assert all(conftest.in_interpreter(f)
                   for f in frames[:i_first_py]), [(f.function, f.module) for f in frames[:i_first_py]]

        # every landmark, in order
        assert fixture_marks(frames, so_path) == [
            ("py", "deeper")] * 4 + [
            ("py", "on_callback"), ("py", "_chain_dispatch"),
            ("c", bc.NAME_PY_CALLBACK), ("c", bc.NAME_DESCEND),
            ("c", bc.NAME_CHAIN_STATIC), ("c", bc.NAME_CHAIN_ENTRY),
            ("c", CFFI_WRAPPER_ENTRY),
            ("py", "run")]
        i_cb = next(i for i, f in enumerate(frames) if f.function == bc.NAME_PY_CALLBACK)
        assert [cffi_name(f.function) for f in frames[i_cb:i_cb + 5]] == [
            bc.NAME_PY_CALLBACK, bc.NAME_DESCEND, bc.NAME_CHAIN_STATIC, bc.NAME_CHAIN_ENTRY,
            CFFI_WRAPPER_ENTRY]
        for f, sym in zip(frames[i_cb:i_cb + 4], ["chain_py_callback", "_ZN5btfix6WalkerIiE7descendEi",
                                                  "chain_static", "chain_entry"]):
            assert in_fn(f.ip, chain_symbols, sym), (f, sym)

        # g's entry is the last Python frame; below it only the native call
        # path from greenlet's bootstrap into run() (libpython): exactly
        # glibc's frames down to greenlet's start-up stub (hidden here)
        i_run = max(i for i, f in enumerate(frames) if f.kind == "python")
        assert short(frames[i_run].function) == "run"
        tail = frames[i_run + 1:]
        assert all(conftest.in_interpreter(f) for f in tail), [(f.function, f.module) for f in tail]
        # (native-only: the merged capture shows eval loops as Python frames)
        native = btcore.collect(g, python=False, capacity=BIG).frames()
        ours, theirs = shared_with_glibc(native, glibc, chain_symbols)
        assert [hex(pc) for pc in ours] == [hex(pc) for pc in theirs[:len(ours)]]
        assert in_greenlet_module(theirs[len(ours)]), hex(theirs[len(ours)])

        # nothing of the main greenlet's stack: none of its Python frames ...
        main_py = {(f.function, f.file) for f in main_bt.frames() if f.kind == "python"}
        assert ("test_suspended_through_native_chain_shows_only_its_own_stack", __file__) in main_py
        assert {(o[0], o[1]) for o in main_oracle} == main_py   # the independent oracle agrees
        assert not main_py & {(f.function, f.file) for f in frames if f.kind == "python"}
        assert not [f for f in frames if f.kind == "python" and "pytest" in (f.file or "")]
        # ... nor the bottom of the process's stack
        names = {f.function for f in frames}
        assert not names & PROCESS_BOTTOM, names & PROCESS_BOTTOM
        assert PROCESS_BOTTOM & {f.function for f in main_bt.frames()}  # the main stack has it

        # native only: exactly one eval-loop frame per eval-loop call of g's
        # stack (run() and the callback), none of the main stack's dozens
        nat = btcore.collect(g, python=False, capacity=BIG).frames()
        assert all(f.kind == "native" for f in nat)
        assert sum(map(is_eval_loop, nat)) == 2, [f.function for f in nat]
        assert sum(map(is_eval_loop, btcore.collect(python=False, capacity=BIG).frames())) > 2
        # and the merged capture is the native one with eval loops replaced
        assert [key(f) for f in nat if not is_eval_loop(f)] == \
            [key(f) for f in frames if f.kind == "native"]
    finally:
        finish(g)


# ---------------------------------------------------------------- many greenlets, exact depths

def _park_spec(i):
    """Native recursion depth (None: no native part) and Python depth of greenlet i."""
    native = None if i % 5 == 4 else (i * 7) % 23
    return native, (i * 3) % 11


def parking_run(chain, native, depth):
    """The body of a greenlet that parks `depth` + 1 Python frames deep
    (park), under native + 1 frames of recurse_then_call (native None: no
    native part), switching "parked" to the greenlet that creates it until
    resumed with "stop"."""
    main = greenlet.getcurrent()

    def park(k):
        if k:
            return park(k - 1)
        while main.switch("parked") != "stop":
            pass
        return 0

    def on_callback(tag):
        return park(depth)

    def run():
        if native is None:
            return park(depth)
        chain.set_callback(on_callback)   # read by the callback right away
        return chain.lib.recurse_then_call(native)
    return run


def test_300_greenlets_parked_at_various_depths_exact(chain, chain_symbols):
    """320 greenlets parked at different native recursion depths
    (recurse_then_call(n): n+1 frames) and Python depths (park(k): k+1
    frames): every capture has exactly the expected frames, in order; then
    again after resuming them all in random order (different spills)."""
    ffi, lib, so_path = chain
    specs = [_park_spec(i) for i in range(320)]
    gs = [greenlet.greenlet(parking_run(chain, n, d)) for n, d in specs]
    try:
        for g in gs:
            assert g.switch() == "parked"

        def check(g, native, depth):
            bt = btcore.collect(g, capacity=256)
            assert not bt.truncated
            frames = bt.frames()
            py = [short(f.function) for f in frames if f.kind == "python"]
            expected_py = ["park"] * (depth + 1) + \
                ([] if native is None else ["on_callback", "_chain_dispatch"]) + ["run"]
            assert py == expected_py
            assert py_view(frames) == interp_chain(g.gr_frame)
            rec = [i for i, f in enumerate(frames) if f.function == bc.NAME_RECURSE]
            if native is None:
                assert rec == []
                assert fixture_marks(frames, so_path) == [("py", n) for n in expected_py]
                return
            assert len(rec) == native + 1
            assert rec == list(range(rec[0], rec[0] + native + 1))
            assert all(in_fn(frames[i].ip, chain_symbols, "recurse_then_call") for i in rec)
            assert fixture_marks(frames, so_path) == \
                [("py", "park")] * (depth + 1) + [("py", "on_callback"), ("py", "_chain_dispatch"),
                                                  ("c", bc.NAME_PY_CALLBACK)] + \
                [("c", bc.NAME_RECURSE)] * (native + 1) + [("c", CFFI_WRAPPER_RECURSE), ("py", "run")]
            assert frames[rec[0] - 1].function == bc.NAME_PY_CALLBACK
            assert cffi_name(frames[rec[-1] + 1].function) == CFFI_WRAPPER_RECURSE
            assert not [f for f in frames if is_greenlet_frame(f)]

        for g, (n, d) in zip(gs, specs):
            check(g, n, d)
        assert all(g._stack_saved > 0 for g in gs)
        # resume each once (it parks again at the same place), in random order
        order = list(range(len(gs)))
        random.Random(7).shuffle(order)
        for i in order:
            assert gs[i].switch("again") == "parked"
        for i in reversed(order):
            check(gs[i], *specs[i])
    finally:
        finish(*gs)


# ---------------------------------------------------------------- spilled and unspilled

def test_unspilled_and_spilled_greenlets(chain, chain_symbols):
    """A starts B; B recurses deep through C frames (recurse_then_call) and
    starts C there; C switches back to A; A switches to C.  Now A is
    suspended and C runs far below A's stack: greenlet had no reason to copy
    A anywhere (A._stack_saved == 0), while B was copied to the heap when A
    resumed.  Both captures are exact; A's capture is the same once it has
    been spilled too."""
    ffi, lib, so_path = chain
    native_depth = 2000
    got = {}

    def a_run():
        b.switch()              # returns when C switches to A
        got["a_line"] = sys._getframe().f_lineno + 1
        c.switch()
        return "a done"

    def b_callback(tag):
        c.switch()
        return 0

    def b_run():
        chain.set_callback(b_callback)
        return lib.recurse_then_call(native_depth)

    def c_run():
        a.switch()
        # A is suspended above us, untouched: collect it now
        got["a_saved"], got["b_saved"] = a._stack_saved, b._stack_saved
        got["a"] = btcore.collect(a, capacity=BIG)
        got["a_oracle"] = interp_chain(a.gr_frame)
        got["b"] = btcore.collect(b, capacity=BIG)
        got["main"] = btcore.collect(main, native=False, capacity=BIG)
        main.switch()

    main = greenlet.getcurrent()
    a = greenlet.greenlet(a_run)
    b = greenlet.greenlet(b_run, parent=a)
    c = greenlet.greenlet(c_run)
    a.switch()
    try:
        if got["a_saved"] != 0:
            pytest.skip(f"greenlet copied part of A ({got['a_saved']} bytes): no unspilled case")
        assert got["b_saved"] > 0
        fa = got["a"].frames()
        assert not got["a"].truncated
        assert py_view(fa) == got["a_oracle"]
        assert [short(f.function) for f in fa if f.kind == "python"] == ["a_run"]
        assert next(f for f in fa if f.kind == "python").line == got["a_line"]
        assert not [f for f in fa if is_greenlet_frame(f)]
        assert not {f.function for f in fa} & PROCESS_BOTTOM
        assert not [f for f in fa if f.module and os.path.realpath(f.module) == so_path]

        fb = got["b"].frames()
        assert not got["b"].truncated
        rec = [i for i, f in enumerate(fb) if f.function == bc.NAME_RECURSE]
        assert len(rec) == native_depth + 1
        assert rec == list(range(rec[0], rec[0] + native_depth + 1))
        assert fixture_marks(fb, so_path) == \
            [("py", "b_callback"), ("py", "_chain_dispatch"), ("c", bc.NAME_PY_CALLBACK)] + \
            [("c", bc.NAME_RECURSE)] * (native_depth + 1) + \
            [("c", CFFI_WRAPPER_RECURSE), ("py", "b_run")]
        # nothing of A (B's parent, and the greenlet that started it) below B
        assert "a_run" not in [short(f.function) for f in fb]

        # the main greenlet, suspended, seen from C: the test function is there
        main_py = [short(f.function) for f in got["main"].frames()]
        assert "test_unspilled_and_spilled_greenlets" in main_py

        # now from main: A has been copied (main reuses its stack); same capture
        assert a._stack_saved > 0
        again = btcore.collect(a, capacity=BIG)
        assert [key(f) for f in again.frames()] == [key(f) for f in fa]
    finally:
        finish(a)   # A -> C (returns to main) ...
        finish(c, b)
        assert a.dead and b.dead and c.dead


def test_unspilled_capture_under_python_recursion_through_builtin():
    """The same, with the deep stack made by Python recursion through a C
    builtin (sorted(key=...)), so that every level is a separate eval-loop
    call: A stays unspilled, and B's capture has one eval-loop frame per
    level (python=False) and every Python level (merged)."""
    levels = 60
    got = {}

    def a_run():
        b.switch()
        c.switch()

    def dive(k):
        if k == 0:
            c.switch()
            return 0
        return sorted([k], key=lambda v: dive(v - 1))[0]

    def c_run():
        a.switch()
        got["a_saved"] = a._stack_saved
        got["a"] = btcore.collect(a, capacity=BIG)
        got["b"] = btcore.collect(b, capacity=BIG)
        got["b_nat"] = btcore.collect(b, python=False, capacity=BIG)
        got["b_oracle"] = interp_chain(b.gr_frame)
        main.switch()

    main = greenlet.getcurrent()
    a = greenlet.greenlet(a_run)
    b = greenlet.greenlet(lambda: dive(levels), parent=a)
    c = greenlet.greenlet(c_run)
    a.switch()
    try:
        if got["a_saved"] != 0:
            pytest.skip(f"greenlet copied part of A ({got['a_saved']} bytes): no unspilled case")
        assert [short(f.function) for f in got["a"].frames() if f.kind == "python"] == ["a_run"]
        fb = got["b"].frames()
        assert py_view(fb) == got["b_oracle"]
        assert [short(f.function) for f in fb if f.kind == "python"].count("dive") == levels + 1
        # run's lambda + one eval-loop call per sort key call
        assert sum(map(is_eval_loop, got["b_nat"].frames())) == levels + 1
        if conftest.INTERPRETER_HAS_SYMTAB:   # a static function: stripped builds do not name it
            assert sum(1 for f in fb if f.function == "builtin_sorted") == levels
    finally:
        finish(a)
        finish(c, b)


def test_suspended_main_greenlet():
    """From inside a greenlet, the main greenlet (suspended, no stack_stop of
    its own) shows its frames down to the process's entry."""
    got = {}

    def run():
        main = greenlet.getcurrent().parent
        got["bt"] = btcore.collect(main, capacity=BIG)
        got["oracle"] = interp_chain(main.gr_frame)

    line = sys._getframe().f_lineno + 1
    greenlet.greenlet(run).switch()
    frames = got["bt"].frames()
    assert not got["bt"].truncated
    assert py_view(frames) == got["oracle"]
    first = next(f for f in frames if f.kind == "python")
    assert (short(first.function), first.line) == ("test_suspended_main_greenlet", line)
    assert "Py_BytesMain" in {f.function for f in frames}
    assert not [f for f in frames if is_greenlet_frame(f)]


# ---------------------------------------------------------------- address oracle: glibc backtrace()
#
# Inside Walker<int>::descend the fixture takes glibc's backtrace() (when
# g_glibc_bt_enabled), then calls back into Python, which parks the stack
# (switches away).  A later capture of the parked stack and glibc's trace
# share every frame from descend's caller (chain_static) outward; those must
# be equal address for address.  Not comparable, by definition:
#   * descend itself: glibc's entry [0] is the return address of the call to
#     backtrace(), ours that of the later call to the callback (both are
#     checked to lie in descend);
#   * our frames inner to descend (the callback, the eval loop, the switch):
#     they did not exist when glibc looked.


def glibc_trace_of_parked(chain, park_in_callback):
    """Run chain_entry in the current greenlet with glibc's trace enabled;
    park_in_callback parks the stack from inside the callback.  Read the
    trace (chain.glibc_backtrace()) before the fixture runs again."""
    chain.lib.g_glibc_bt_enabled = 1
    try:
        chain.set_callback(park_in_callback)
        chain.lib.chain_entry(1)
        chain.finish()
    finally:
        chain.lib.g_glibc_bt_enabled = 0


def shared_with_glibc(frames, glibc, chain_symbols):
    """(ours, theirs): the physical native pcs of a capture from descend's
    caller outward, and glibc's trace from the same frame outward."""
    assert 4 <= len(glibc) < 1024, "glibc backtrace() missing or overflowed"
    assert in_fn(glibc[0], chain_symbols, "_ZN5btfix6WalkerIiE7descendEi")
    assert in_fn(glibc[1], chain_symbols, "chain_static")
    pcs = [f.ip for f in frames if f.kind == "native" and not f.inlined]
    k = next(i for i, pc in enumerate(pcs) if in_fn(pc, chain_symbols, "_ZN5btfix6WalkerIiE7descendEi"))
    assert pcs[k] != glibc[0]   # see above: a later call site in the same activation
    return pcs[k + 1:], glibc[1:]


def in_greenlet_module(pc):
    """Is pc in greenlet's extension module (from /proc/self/maps, not btcore)?"""
    return conftest._mapping_of(pc)[0].startswith(GREENLET_DIR)


def test_suspended_greenlet_native_frames_equal_glibc_backtrace(chain, chain_symbols):
    """Guards the suspended-greenlet walk address by address: g's physical
    frames from chain_static down to g's bottom (g_initialstub, shown with
    internals=True) are glibc's, in order.  glibc's trace goes on past g's
    bottom into the stack of the greenlet that first switched into g (this
    test function's g.switch()): those frames are not g's, and btcore must
    stop exactly where they begin."""
    main = greenlet.getcurrent()

    def park(tag):
        main.switch("parked")
        return 0

    g = greenlet.greenlet(lambda: glibc_trace_of_parked(chain, park))
    assert g.switch() == "parked"
    glibc = chain.glibc_backtrace()
    try:
        frames = btcore.collect(g, python=False, internals=True, capacity=BIG).frames()
        ours, theirs = shared_with_glibc(frames, glibc, chain_symbols)
        assert len(theirs) > len(ours)
        assert [hex(pc) for pc in ours] == [hex(pc) for pc in theirs[:len(ours)]]
        # g's last frame is greenlet's start-up stub; the next one glibc saw
        # is the starting greenlet's switch (in greenlet's module too)
        assert "g_initialstub" in (frames[-1].function or "")
        assert in_greenlet_module(theirs[len(ours)]), hex(theirs[len(ours)])
    finally:
        finish(g)


def test_suspended_thread_native_frames_equal_glibc_backtrace(chain, chain_symbols):
    """Guards the walk of another thread's stack address by address: thread T
    runs chain_entry in its main greenlet, the callback switches to a
    greenlet that blocks, so T's main greenlet is suspended in the fixture
    (btcore captures another thread's stack only as a suspended greenlet:
    docs/api.md).  Its physical frames from chain_static down to the
    thread's first frame (clone) are glibc's, all of them, in order."""
    blocked, release = threading.Event(), threading.Event()
    box = {}

    def block():
        blocked.set()
        release.wait(30)

    def park(tag):
        greenlet.greenlet(block).switch()
        return 0

    def thread_main():
        box["tmain"] = greenlet.getcurrent()
        glibc_trace_of_parked(chain, park)

    t = threading.Thread(target=thread_main, daemon=True)
    t.start()
    try:
        assert blocked.wait(10)
        glibc = chain.glibc_backtrace()
        frames = btcore.collect(box["tmain"], python=False, capacity=BIG).frames()
        ours, theirs = shared_with_glibc(frames, glibc, chain_symbols)
        assert [hex(pc) for pc in ours] == [hex(pc) for pc in theirs]
    finally:
        release.set()
        t.join(10)
    assert not t.is_alive()


# ---------------------------------------------------------------- edge cases

def _parked(fn=None, cls=greenlet.greenlet):
    """A greenlet parked in park() (3 Python frames: park, middle, run)."""
    main = greenlet.getcurrent()

    def park():
        while main.switch("parked") != "stop":
            pass

    def middle():
        park()

    g = cls(fn or middle)
    assert g.switch() == "parked"
    return g


def test_not_started_and_dead_are_empty():
    g = greenlet.greenlet(lambda: None)
    for target in (g,):
        bt = btcore.collect(target)
        assert len(bt) == 0 and not bt.truncated and bt.frames() == []
    g.switch()
    assert g.dead
    bt = btcore.collect(g, capacity=8)
    assert len(bt) == 0 and not bt.truncated and bt.frames() == []

    def boom():
        raise ValueError("x")
    h = greenlet.greenlet(boom)
    with pytest.raises(ValueError):
        h.switch()
    assert h.dead and len(btcore.collect(h)) == 0

    k = _parked()
    k.throw(greenlet.GreenletExit)
    assert k.dead and len(btcore.collect(k)) == 0


def test_current_greenlet_is_the_current_stack():
    got = {}

    def run():
        a, b = btcore.collect(capacity=BIG), btcore.collect(greenlet.getcurrent(), capacity=BIG)
        got["a"], got["b"] = a, b

    greenlet.greenlet(run).switch()
    fa, fb = got["a"].frames(), got["b"].frames()
    # the same stack, one line further on
    assert [(f.kind, f.function, f.module) for f in fa] == [(f.kind, f.function, f.module) for f in fb]
    assert [f.ip for f in fa if f.kind == "native"] == [f.ip for f in fb if f.kind == "native"]
    assert fa[0].kind == "python" and short(fa[0].function) == "run"


@pytest.mark.parametrize("target", [42, "g", object(), greenlet.greenlet, threading.current_thread(),
                                    sys._getframe(), 0, 1.5])
def test_non_greenlet_is_a_type_error(target):
    with pytest.raises(TypeError):
        btcore.collect(target)


def test_limit_python_native_capacity_on_a_greenlet():
    def nest(k):
        if k:
            return nest(k - 1)
        main.switch("parked")

    main = greenlet.getcurrent()
    g = greenlet.greenlet(lambda: nest(20))
    assert g.switch() == "parked"
    try:
        full = btcore.collect(g, capacity=BIG)
        assert not full.truncated
        ff = full.frames()
        n = len(full)
        # 21 nest + the lambda + native call paths (3.13+ call Python from
        # the switch with fewer C frames in between)
        assert n >= (25 if sys.version_info < (3, 13) else 23)
        for k in (1, 3, 10, n - 1):
            lim = btcore.collect(g, limit=k, capacity=BIG)
            assert len(lim) == k and lim.truncated
            assert [key(f) for f in lim.frames()] == [key(f) for f in raw_prefix(ff, k)]
            cap = btcore.collect(g, capacity=k)
            assert len(cap) == k and cap.truncated and cap.capacity == k
            assert [key(f) for f in cap.frames()] == [key(f) for f in raw_prefix(ff, k)]
        exact = btcore.collect(g, limit=n, capacity=BIG)
        assert len(exact) == n and not exact.truncated
        assert len(btcore.collect(g, limit=n + 50, capacity=n + 10)) == n
        # limit=0 behaves as on the current stack
        z, zc = btcore.collect(g, limit=0), btcore.collect(limit=0)
        assert (len(z), z.truncated) == (len(zc), zc.truncated) == (0, True)

        py = btcore.collect(g, native=False, capacity=BIG)
        assert py_view(py.frames()) == interp_chain(g.gr_frame) == py_view(ff)
        assert all(f.kind == "python" for f in py.frames())
        py3 = btcore.collect(g, native=False, capacity=3)
        assert py3.truncated and py_view(py3.frames()) == interp_chain(g.gr_frame)[:3]

        nat = btcore.collect(g, python=False, capacity=BIG)
        assert nat.frames() and all(f.kind == "native" for f in nat.frames())
        assert [key(f) for f in nat.frames() if not is_eval_loop(f)] == \
            [key(f) for f in ff if f.kind == "native"]
        # neither kind asked for: nothing, for the current stack and for g
        assert len(btcore.collect(python=False, native=False, capacity=BIG)) == 0
        assert len(btcore.collect(g, python=False, native=False, capacity=BIG)) == 0
    finally:
        finish(g)


def test_internals_shows_greenlet_switching_machinery():
    g = _parked()
    try:
        default = btcore.collect(g, capacity=BIG).frames()
        inner = btcore.collect(g, internals=True, capacity=BIG).frames()
        names = [f.function for f in inner]
        assert names[0] == "slp_switch", names
        assert any("g_switchstack" in (n or "") for n in names), names
        assert any("green_switch" in (n or "") for n in names), names
        # the default capture is the internals one without greenlet's frames
        # at both ends, and contains none of them
        assert not [f for f in default if is_greenlet_frame(f)]
        lo = next(i for i, f in enumerate(inner) if not is_greenlet_frame(f))
        hi = max(i for i, f in enumerate(inner) if not is_greenlet_frame(f)) + 1
        assert all(is_greenlet_frame(f) for f in inner[:lo] + inner[hi:])
        assert [key(f) for f in inner[lo:hi]] == [key(f) for f in default]
        # g's own stack ends in greenlet's start-up stub: the frame below it
        # (g_switch, where the greenlet that started g stored stack_stop)
        # belongs to that other greenlet's stack
        assert "g_initialstub" in (inner[-1].function or ""), names[-4:]
    finally:
        finish(g)


def test_greenlet_subclass():
    class Sub(greenlet.greenlet):
        __slots__ = ("extra", "more")

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.extra, self.more = 1, 2

    class SubRun(greenlet.greenlet):
        def run(self):
            self.note = "ran"
            nested_park()

    main = greenlet.getcurrent()

    def nested_park():
        while main.switch("parked") != "stop":
            pass

    s = _parked(cls=Sub)
    r = SubRun()
    assert r.switch() == "parked"
    try:
        assert [short(f.function) for f in btcore.collect(s).frames() if f.kind == "python"] == \
            ["park", "middle"]
        fr = btcore.collect(r, capacity=BIG).frames()
        assert [short(f.function) for f in fr if f.kind == "python"] == ["nested_park", "run"]
        assert py_view(fr) == interp_chain(r.gr_frame)
    finally:
        finish(s, r)


class _LyingState(greenlet.greenlet):
    """A subclass whose truth value, length, dead and gr_frame all lie, and
    count how often anyone asks: btcore must read greenlet's own state."""
    asked = 0

    def __bool__(self):
        type(self).asked += 1
        return not greenlet.greenlet.__bool__(self)   # the opposite of the truth

    def __len__(self):
        type(self).asked += 1
        return 0

    @property
    def dead(self):
        type(self).asked += 1
        return True

    @property
    def gr_frame(self):
        type(self).asked += 1
        return None


class _RaisingState(greenlet.greenlet):
    """__bool__ and __len__ raise (GreenletExit, and another exception)."""
    exc = greenlet.GreenletExit

    def __bool__(self):
        raise self.exc("from __bool__")

    def __len__(self):
        raise self.exc("from __len__")


class _RaisingOther(_RaisingState):
    exc = KeyError


@pytest.mark.parametrize("cls", [_LyingState, _RaisingState, _RaisingOther])
def test_greenlet_state_is_greenlets_own_never_bool_or_len(cls):
    """Guards issue 8.2 / 9.6: not started / suspended / dead come from greenlet's
    own state; a subclass's __bool__/__len__/dead/gr_frame are never consulted,
    and nothing they raise is swallowed or leaks."""
    _LyingState.asked = 0
    main = greenlet.getcurrent()

    def park():
        main.switch("parked")

    fresh = cls(lambda: None)
    assert len(btcore.collect(fresh)) == 0   # not started: empty
    g = cls(park)
    assert g.switch() == "parked"
    bt = btcore.collect(g, capacity=BIG)     # suspended: its frames
    assert [short(f.function) for f in bt.frames() if f.kind == "python"] == ["park"]
    assert py_view(bt.frames()) == interp_chain(greenlet.greenlet.gr_frame.__get__(g))
    slow = btcore.collect(g, python=1, capacity=BIG)   # not a bool: the Python implementation
    assert py_view(slow.frames()) == py_view(bt.frames())
    assert len(btcore.collect(fresh, python=1)) == 0
    greenlet.greenlet.switch(g)
    assert greenlet.greenlet.dead.__get__(g)
    assert len(btcore.collect(g)) == 0       # dead: empty
    assert _LyingState.asked == 0
    assert sys.exc_info() == (None, None, None)


def test_suspended_greenlet_without_python_frames():
    """A greenlet whose run is a builtin (here: main.switch itself) is
    suspended with no Python frame at all (gr_frame is None), yet owned by
    this thread and not running: it is captured (native frames only), not
    reported as running elsewhere."""
    main = greenlet.getcurrent()
    g = greenlet.greenlet(main.switch)
    g.switch()
    assert g and not g.dead and g.gr_frame is None
    try:
        bt = btcore.collect(g, internals=True, capacity=BIG)
        names = [f.function for f in bt.frames()]
        assert names and names[0] == "slp_switch"
        assert all(f.kind == "native" for f in bt.frames())
        assert "g_initialstub" in (names[-1] or "") or "g_initialstub" in (names[-2] or "")
        btcore.collect(g)   # no exception
    finally:
        g.switch()
        assert g.dead


# ---------------------------------------------------------------- threads

def _pingpong_thread(n_greenlets, stop, started, errors, switches):
    """Switch continuously among n greenlets (each at a different depth)."""
    try:
        ring = []

        def work(i):
            def level(k):
                if k:
                    return level(k - 1)
                while not stop.is_set():
                    switches[0] += 1
                    ring[(i + 1) % n_greenlets].switch()
            level(i % 5)

        ring.extend(greenlet.greenlet(lambda i=i: work(i)) for i in range(n_greenlets))
        started.append(ring)
        ring[0].switch()
    except BaseException as e:  # pragma: no cover - reported by the test
        errors.append(e)


def test_collect_own_greenlets_while_other_threads_switch(chain, chain_symbols):
    ffi, lib, so_path = chain
    stop = threading.Event()
    started, errors = [], []
    switches = [[0] for _ in range(4)]
    threads = [threading.Thread(target=_pingpong_thread, args=(6, stop, started, errors, sw),
                                daemon=True) for sw in switches]

    specs = [(i % 9, i % 6) for i in range(40)]
    gs = [greenlet.greenlet(parking_run(chain, n, d)) for n, d in specs]
    for g in gs:
        assert g.switch() == "parked"
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)   # the other threads run between our captures
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 10
        while len(started) < len(threads) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(started) == len(threads)
        before = [sw[0] for sw in switches]

        def all_switched():
            return all(sw[0] > b + 100 for sw, b in zip(switches, before))

        # At least 25 rounds, and on until every other thread has switched while we captured:
        # on a loaded machine the GIL can starve one thread for a whole 25 rounds (seen on CI).
        checked, rnd = 0, 0
        deadline = time.monotonic() + 60
        while rnd < 25 or (not all_switched() and time.monotonic() < deadline):
            for g, (n, d) in zip(gs, specs):
                bt = btcore.collect(g, capacity=256)
                frames = bt.frames()
                assert not bt.truncated
                assert [short(f.function) for f in frames if f.kind == "python"] == \
                    ["park"] * (d + 1) + ["on_callback", "_chain_dispatch", "run"]
                rec = [i for i, f in enumerate(frames) if f.function == bc.NAME_RECURSE]
                assert len(rec) == n + 1 and rec == list(range(rec[0], rec[0] + n + 1))
                assert all(in_fn(frames[i].ip, chain_symbols, "recurse_then_call") for i in rec)
                checked += 1
            if rnd % 5 == 4:   # re-park some, so spills differ between rounds
                for g in gs[rnd % 3::3]:
                    assert g.switch("again") == "parked"
            rnd += 1
        assert checked == rnd * len(gs) and rnd >= 25
        assert all(t.is_alive() for t in threads) and not errors
        # the other threads really switched while we captured
        assert all_switched(), (before, switches)
    finally:
        sys.setswitchinterval(old)
        stop.set()
        for t in threads:
            t.join(10)
        finish(*gs)
    assert not errors, errors


def test_greenlet_suspended_in_another_thread():
    """Park g (Python -> recursion -> switch) in thread T; T's main greenlet
    then blocks in Event.wait() (running, GIL released).  collect(g) works;
    collect(T's main greenlet) is a RuntimeError.  Then T starts a greenlet
    that blocks: that one is running (RuntimeError), and T's main greenlet,
    now suspended, is captured."""
    step1, step2, go1, go2, done = (threading.Event() for _ in range(5))
    box = {}

    def park(k):
        if k:
            return park(k - 1)
        greenlet.getcurrent().parent.switch("parked")

    def blocker():
        box["blocker_line"] = sys._getframe().f_lineno + 1
        go2.wait()

    def thread_main():
        box["tmain"] = greenlet.getcurrent()
        g = greenlet.greenlet(lambda: park(6))
        assert g.switch() == "parked"
        box["g"] = g
        box["g_oracle"] = interp_chain(g.gr_frame)
        step1.set()
        go1.wait()
        b = greenlet.greenlet(blocker)
        box["b"] = b
        box["switch_line"] = sys._getframe().f_lineno + 2
        step2.set()
        b.switch()
        g.switch()
        done.set()

    t = threading.Thread(target=thread_main, daemon=True)
    t.start()
    try:
        assert step1.wait(10)
        g = box["g"]
        bt = btcore.collect(g, capacity=BIG)
        frames = bt.frames()
        assert py_view(frames) == box["g_oracle"] == interp_chain(g.gr_frame)
        assert [short(f.function) for f in frames if f.kind == "python"] == ["park"] * 7 + ["<lambda>"]
        assert not {f.function for f in frames} & PROCESS_BOTTOM
        # nothing of T's own stack (its main greenlet started g)
        assert not [f for f in frames if short(f.function) in (
            "thread_main", "_bootstrap_inner", "_bootstrap",
            "thread_run", "pythread_wrapper", "start_thread", "clone3", "clone")]
        with pytest.raises(RuntimeError):
            btcore.collect(box["tmain"])   # running in T (blocked in Event.wait)
        go1.set()
        assert step2.wait(10)
        time.sleep(0.05)                   # let T switch into b
        with pytest.raises(RuntimeError):
            btcore.collect(box["b"])
        tm = btcore.collect(box["tmain"], capacity=BIG)
        tf = tm.frames()
        assert py_view(tf) == interp_chain(box["tmain"].gr_frame)
        assert [short(f.function) for f in tf if f.kind == "python"][:2] == ["thread_main", "run"]
        assert next(f for f in tf if f.kind == "python").line == box["switch_line"]
        # g is still captured the same way
        assert [key(f) for f in btcore.collect(g, capacity=BIG).frames()] == [key(f) for f in frames]
    finally:
        go1.set()
        go2.set()
        t.join(10)
    assert done.is_set()
    assert len(btcore.collect(box["g"])) == 0   # dead now


def test_collect_greenlets_switching_in_another_thread_is_safe():
    """Greenlets of another thread that keeps switching between them are
    either running (RuntimeError) or suspended; a capture that succeeds must
    be a correct one, never garbage or an empty backtrace."""
    stop, ready = threading.Event(), threading.Event()
    box, parked = {}, set()

    def pingpong(k, name):
        if k:
            return pingpong(k - 1, name)
        parked.add(name)
        if len(parked) == 2:   # both started: captures may begin
            ready.set()
        while not stop.is_set():
            box[name].switch()

    def thread_main():
        a = greenlet.greenlet(lambda: pingpong(3, "b"))
        b = greenlet.greenlet(lambda: pingpong(3, "a"))
        box.update(a=a, b=b)
        a.switch()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)   # hand the GIL over often
    t = threading.Thread(target=thread_main, daemon=True)
    t.start()
    outcomes = collections.Counter()
    bad = []
    try:
        assert ready.wait(10)
        for i in range(120000):
            g = box["a" if i % 2 else "b"]
            try:
                bt = btcore.collect(g, capacity=128)
            except RuntimeError:
                outcomes["running"] += 1
                continue
            py = [short(f.function) for f in bt.frames() if f.kind == "python"]
            if py == ["pingpong"] * 4 + ["<lambda>"] and not bt.truncated:
                outcomes["ok"] += 1
            else:
                outcomes["bad"] += 1
                if len(bad) < 3:
                    bad.append((len(bt), [(f.kind, f.function) for f in bt.frames()]))
    finally:
        sys.setswitchinterval(old)
        stop.set()
        t.join(10)
    assert outcomes["ok"] > 0 and outcomes["running"] > 0, outcomes
    assert outcomes["bad"] == 0, (dict(outcomes), bad)


def test_collect_inside_a_greenlet_stops_at_its_bottom():
    """collect() in a running greenlet: its own frames only.  Below the
    greenlet's stack_stop lie the frames of whoever first switched into it
    (here creator(), which has moved on by then); they must not appear."""
    def inner():
        return btcore.collect(capacity=BIG), btcore.collect(capacity=BIG, internals=True)

    def creator():
        return greenlet.greenlet(inner).switch()

    bt, with_internals = creator()
    names = [f.function for f in bt.frames()]
    assert [f.function for f in bt.frames() if f.kind == "python"] == [
        "test_collect_inside_a_greenlet_stops_at_its_bottom.<locals>.inner"]
    assert "test_collect_inside_a_greenlet_stops_at_its_bottom.<locals>.creator" not in names
    assert not any(n and ("g_initialstub" in n or n in ("main", "Py_BytesMain")) for n in names)
    # internals=True shows greenlet's start-up frames at the bottom, and still
    # nothing of the creator below them.
    inner_names = [f.function or "" for f in with_internals.frames()]
    assert "g_initialstub" in inner_names[-1] or any("g_initialstub" in n for n in inner_names[-3:])
    assert "test_collect_inside_a_greenlet_stops_at_its_bottom.<locals>.creator" not in inner_names


# ---------------------------------------------------------------- captures inside greenlet.settrace

TRACER_SCRIPT = r"""
import sys
import greenlet, btcore

captures = sys.argv[1].split(",")
seen = []

def tracer(event, args):
    origin, target = args
    got = {}
    for what in captures:   # the very first captures of this process
        bt = btcore.collect() if what == "current" else btcore.collect(origin if what == "origin" else target)
        got[what] = [f.function for f in bt.frames()]
    seen.append((event, greenlet.getcurrent() is not main, got))

greenlet.settrace(tracer)
main = greenlet.getcurrent()

def parked():
    main.switch()

g = greenlet.greenlet(parked)
g.switch()            # into g: the tracer runs in g (not main), origin main is suspended
g.switch()            # g ends
assert greenlet.gettrace() is tracer
greenlet.settrace(None)
assert [(event, in_g) for event, in_g, _ in seen] == [("switch", True), ("switch", False)] * 2, seen
for event, in_g, got in seen:
    for what, names in got.items():
        # the tracer runs in the target: origin is suspended (dead at the last
        # switch: empty), target is the current stack
        assert names or (what == "origin" and in_g is False and got is seen[-1][2]), (event, what)
        if in_g and what != "origin":   # a capture in g stops at g's bottom
            assert not {"Py_BytesMain", "main", "_start"} & set(names), (event, what, names)
if captures == ["current"]:   # the current stack never needs the layout check
    assert btcore.capture.greenlets._learned is None
print("ok", len(seen))
"""


@pytest.mark.parametrize("captures", ["current", "origin", "current,origin,target"])
def test_capture_inside_greenlet_tracer_from_the_first_capture(captures):
    """Guards issue 8.3: a greenlet.settrace() callback that captures (the current
    stack, the origin or the target) works from the first capture of a fresh
    process: greenlet's one-time layout check switches greenlets, and must
    neither re-enter the tracer nor wait on its own lock (it hung)."""
    import subprocess
    done = subprocess.run([sys.executable, "-P", "-c", TRACER_SCRIPT, captures], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("ok 4"), done.stderr[-3000:]


REENTRY_SCRIPT = r"""
import greenlet, btcore
import btcore.capture.greenlets as gl

main = greenlet.getcurrent()
g = greenlet.greenlet(lambda: main.switch())
g.switch()
seen = {}
check = gl._learn_layout

def check_reentered():
    # what a signal handler or finalizer running inside the check would do
    try:
        btcore.collect(g)
    except btcore.BacktraceError as e:
        seen["error"] = str(e)
    seen["current"] = len(btcore.collect())
    return check()

gl._learn_layout = check_reentered
assert len(btcore.collect(g)) > 0
assert "being checked on this thread" in seen["error"], seen
assert seen["current"] > 0
print("ok")
"""


def test_capture_reentering_the_layout_check_raises_instead_of_waiting():
    """Guards issue 8.3: a capture of a suspended greenlet made from inside the
    layout check on the same thread (signal handler, finalizer) raises
    BacktraceError; the current stack is captured there (it never needs the
    check).  It used to wait forever on the check's own lock."""
    import subprocess
    done = subprocess.run([sys.executable, "-P", "-c", REENTRY_SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-3000:]


# ---- the layout check reads only inside greenlet's C++ object (issue 9.1) ----

def _gdb_stack_state_layout():
    """(offset of stack_state, sizeof) in greenlet::UserGreenlet, from gdb and greenlet's DWARF."""
    import re
    import shutil
    import subprocess
    so = greenlet._greenlet.__file__
    if not shutil.which("gdb"):
        pytest.skip("gdb not installed")
    # UserGreenlet's only base is Greenlet, at offset 0; StackState is a member of Greenlet.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}   # no ASan in gdb (ci/asan.sh)
    out = subprocess.run(["gdb", "-batch", "-ex", "ptype/o greenlet::Greenlet",
                          "-ex", "print sizeof(greenlet::UserGreenlet)", so],
                         capture_output=True, text=True, timeout=60, env=env).stdout
    state = re.search(r"/\*\s*(\d+)\s*\|\s*40 \*/\s*class greenlet::StackState", out)
    size = re.search(r"^\$1 = (\d+)$", out, re.M)
    if not state or not size:
        pytest.skip("greenlet's extension has no DWARF for its C++ classes")
    return int(state.group(1)), int(size.group(1))


def test_layout_scan_stays_inside_greenlet_object():
    """Guards issue 9.1: the StackState scan read 32 bytes past greenlet's 192-byte C++ object."""
    from btcore._native import ffi, lib
    g = greenlet.greenlet(lambda: greenlet.getcurrent().parent.switch())
    g.switch()
    btcore.collect(g)   # learns the layout
    off, size, scan_end = ffi.new("size_t *"), ffi.new("size_t *"), ffi.new("size_t *")
    assert lib.btc_greenlet_layout(off, size, scan_end) == 0
    assert (off[0], size[0]) == _gdb_stack_state_layout()
    assert off[0] + 32 <= scan_end[0] <= size[0]
    g.throw(greenlet.GreenletExit)


@pytest.mark.skipif(conftest.UNDER_ASAN, reason="valgrind cannot run a process that loads ASan")
def test_layout_check_under_valgrind_reads_no_foreign_memory(tmp_path):
    """Guards issue 9.1 with an independent checker: valgrind sees every byte the check reads."""
    import shutil
    import subprocess
    if conftest.UNDER_QEMU:
        pytest.skip("qemu-user: valgrind, itself a translator of machine code, does not run under the emulator")
    if not shutil.which("valgrind"):
        pytest.skip("valgrind not installed")
    script = ("import greenlet, btcore\n"
              "g = greenlet.greenlet(lambda: greenlet.getcurrent().parent.switch()); g.switch()\n"
              "assert btcore.collect(g)\n")
    env = dict(os.environ, PYTHONMALLOC="malloc")   # pymalloc's pools would hide over-reads
    done = subprocess.run(["valgrind", "-q", sys.executable, "-P", "-c", script], capture_output=True,
                          text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Invalid read" not in done.stderr, done.stderr[-5000:]
