"""collect() from 8 threads at once, many times each: every result is that
thread's own stack (each thread recurses to its own depth), checked against
the interpreter's frame chain, with and without native frames, and through
the native fixture at a per-thread native depth."""
import os
import sys
import threading

import btcore
import conftest
from conftest import build_chain as bc
from oracles import interp_chain, py_view, BIG

NTHREADS = 8
ITERATIONS = 400


def descend(n, fn):
    if n <= 0:
        return fn()
    return descend(n - 1, fn)


def check_here(depth, tid):
    """At the bottom of this thread's recursion: three captures, each must be
    exactly this thread's stack."""
    merged, oracle = btcore.collect(capacity=BIG), interp_chain(sys._getframe())
    pyonly = btcore.collect(native=False, capacity=BIG)
    native = btcore.collect(python=False, capacity=BIG)

    assert not merged.truncated and not pyonly.truncated and not native.truncated
    mf = merged.frames()
    assert py_view(mf) == oracle, f"thread {tid}: merged python frames differ"
    pf = pyonly.frames()
    assert py_view(pf)[1:] == oracle[1:] and len(pf) == len(oracle)
    assert pf[0].function == "check_here"
    assert sum(1 for f in pf if f.function == "descend") == depth + 1
    nf = native.frames()
    assert nf and all(f.kind == "native" for f in nf)
    # the thread's own bottom: thread start machinery, not the main thread's
    names = [f.function or "" for f in nf]
    assert "main" not in names and "Py_BytesMain" not in names, names
    # libpython's thread entry points (static symbols, in its .symtab; a
    # stripped interpreter does not name them: then the walk must at least
    # end in libc's thread start, under the interpreter's frames)
    if conftest.INTERPRETER_HAS_SYMTAB:
        assert "thread_run" in names and "pythread_wrapper" in names, names
    else:
        assert "libc.so" in os.path.basename(nf[-1].module or ""), [(f.function, f.module) for f in nf[-4:]]
        assert any(conftest.in_interpreter(f) for f in nf[-6:]), [(f.function, f.module) for f in nf[-6:]]
    # merged native frames are those of the native-only capture (minus the eval loop)
    return len(mf)


def test_collect_from_8_threads(chain):
    ffi, lib, so_path = chain
    barrier = threading.Barrier(NTHREADS)
    errors = []
    done = [0] * NTHREADS

    def worker(tid):
        depth = 3 + 9 * tid          # a different Python depth per thread
        ndepth = tid * 3             # and a different native depth
        try:
            barrier.wait()
            for it in range(ITERATIONS):
                descend(depth, lambda: check_here(depth, tid))
                if it % 5 == 0:
                    got = {}

                    def cb(tag):
                        bt, oracle = btcore.collect(capacity=BIG), interp_chain(sys._getframe())
                        got["bt"], got["oracle"] = bt, oracle
                        return 0

                    descend(depth, lambda: chain.call(lib.recurse_then_call, ndepth, cb))
                    frames = got["bt"].frames()
                    assert py_view(frames) == got["oracle"], f"thread {tid}"
                    rec = [f for f in frames if f.function == bc.NAME_RECURSE]
                    assert len(rec) == ndepth + 1, f"thread {tid}: {len(rec)} != {ndepth + 1}"
                done[tid] += 1
        except BaseException as e:   # reported by the main thread
            errors.append((tid, e))
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,), name=f"bt-{i}") for i in range(NTHREADS)]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)   # switch threads often: interleave captures and resolutions
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
    finally:
        sys.setswitchinterval(old)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        tid, e = errors[0]
        raise AssertionError(f"{len(errors)} thread(s) failed; first: thread {tid}: {e!r}") from e
    assert done == [ITERATIONS] * NTHREADS


def test_greenlets_of_an_exited_thread_are_reported_dead():
    """Guards collect() and snapshot() on greenlets whose thread has exited: empty, dead, never read from its stack."""
    import time
    import greenlet
    kept = []

    def run():
        kept.append(greenlet.getcurrent())
        parked = greenlet.greenlet(lambda: greenlet.getcurrent().parent.switch())
        parked.switch()
        kept.append(parked)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    main, parked = kept
    # greenlet marks them dead when the thread's state is destroyed, which
    # may finish just after join() returns; until then greenlet itself calls
    # them live, and so does btcore (collect(main): "running in another thread").
    deadline = time.monotonic() + 30   # a hang bound, not a timing assertion
    while not greenlet.greenlet.dead.__get__(main) and time.monotonic() < deadline:
        time.sleep(0.01)
        greenlet.getcurrent()
    assert greenlet.greenlet.dead.__get__(main) and greenlet.greenlet.dead.__get__(parked)
    assert len(btcore.collect(main)) == 0 and len(btcore.collect(parked)) == 0
    listed = [info for info in btcore.snapshot() if info.greenlet is main or info.greenlet is parked]
    assert listed == []   # snapshot() lists live greenlets only


def test_os_threads_are_the_interpreters_threads_named_as_threading_named_them():
    """Guards btcore.capture.threads.os_threads(): every thread with its real ident and
    kernel id (oracle: the thread's own threading.get_ident() and
    get_native_id(), unpatched here), named as threading named it; a thread
    threading never saw (started with _thread) named from its kernel id."""
    import _thread
    from btcore.capture import threads
    release, seen = threading.Event(), {}
    named_ready, raw_ready = threading.Event(), threading.Event()

    def named():
        seen["named"] = (threading.get_ident(), threading.get_native_id())
        named_ready.set()
        release.wait()

    def raw():   # never calls threading.current_thread(): no _DummyThread for it
        seen["raw"] = (_thread.get_ident(), _thread.get_native_id())
        raw_ready.set()
        release.wait()

    t = threading.Thread(target=named, name="named-worker")
    t.start()
    _thread.start_new_thread(raw, ())
    try:
        assert named_ready.wait(60) and raw_ready.wait(60)
        listed = {thread.ident: thread for thread in threads.os_threads()}
        assert (listed[seen["named"][0]].native_id, listed[seen["named"][0]].name) == \
            (seen["named"][1], "named-worker")
        assert (listed[seen["raw"][0]].native_id, listed[seen["raw"][0]].name) == \
            (seen["raw"][1], f"native thread {seen['raw'][1]}")
        me = listed[threading.get_ident()]
        assert (me.native_id, me.name) == (os.getpid(), threading.main_thread().name)
        assert threads.current_ident() == threading.get_ident() and threads.is_main_thread()
        # each thread's stack range is its own: no two overlap
        ranges = sorted((t.stack_lo, t.stack_hi) for t in listed.values())
        assert all(lo < hi for lo, hi in ranges) and all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))
    finally:
        release.set()
        t.join()


def test_after_fork_from_a_thread_the_forking_thread_is_the_main_thread():
    """Guards the main-thread rule (kernel id == pid): in a child forked by a
    non-main thread, that thread is the main thread, under its own name."""
    from btcore.capture import threads
    out = []

    def fork_here():
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.write(w, f"{threads.is_main_thread()} {threads.current_name()}".encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            out.append(f.read())
        os.waitpid(pid, 0)
        out.append(threads.is_main_thread())

    t = threading.Thread(target=fork_here, name="forker")
    t.start()
    t.join()
    assert out == ["True forker", False]


ENDED_BY_A_FINALIZER = r'''
import gc, sys, threading, time
from btcore.capture.threads import thread_clocks

class Ender:
    """Cyclic garbage whose finalizer ends every other thread and waits until
    their states are freed: what a collection inside an allocation runs."""
    def __init__(self, stop, threads):
        self.me, self.stop, self.threads = self, stop, threads
    def __del__(self):
        self.stop.set()
        for t in self.threads:
            t.join()
        time.sleep(0.02)

inside = 0
for attempt in range(40):
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(0.02)   # each thread in stop.wait(): it has a frame
    gc.collect()
    Ender(stop, threads)
    # the collection comes at the (attempt % 8)-th allocation from here
    gc.set_threshold(max(1, gc.get_count()[0] + attempt % 8))
    try:
        clocks = thread_clocks()
    finally:
        ran_inside = stop.is_set()
        gc.set_threshold(700, 10, 10)
        gc.collect()
    inside += ran_inside
    # read before the finalizer ended them: every one is listed, with its clock
    assert {t.ident for t in threads} <= set(clocks), (attempt, clocks)
    assert all(clocks[t.ident][0] > 0 for t in threads), clocks
print("finalizer inside:", inside)
'''


def test_thread_clocks_survive_a_finalizer_that_ends_the_threads_read():
    """Guards _thread_clocks() (the profiler's per-tick read of every thread)
    against a collection inside its own allocations whose finalizer lets the
    threads being read end, freeing their states: they were walked while
    objects were made (a SIGSEGV on 3.11, which collects inside an allocation;
    3.12+ collects at the next bytecode, after the call, and only the result
    is checked there)."""
    import subprocess
    done = subprocess.run([sys.executable, "-c", ENDED_BY_A_FINALIZER], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    inside = int(done.stdout.split("finalizer inside:")[1])
    if sys.version_info < (3, 12):
        assert inside > 0, done.stdout   # else the test tested nothing
