"""btcore.snapshot(), dump_all() and register_dump_signal(): every greenlet of the process.

Oracles: the greenlets each test builds (how many, parked where, in which
thread), the interpreter's own frame chains (gr_frame / f_back for suspended
greenlets, sys._current_frames() for threads), and the dump's two forms
checked against each other (text against JSON).
"""
import inspect
import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import greenlet
import pytest

import btcore
import conftest
from oracles import interp_chain, py_view

gevent = pytest.importorskip("gevent")
import gevent.event  # noqa: E402
import gevent.lock  # noqa: E402
import gevent.queue  # noqa: E402
import gevent.socket  # noqa: E402

HEADER = re.compile(r"^=== stack (\d+): (\d+) greenlets?, (.*) ===$", re.M)
TIMEOUT = 120


def _park():
    greenlet.getcurrent().parent.switch()


def park_in_a():
    _park()


def park_in_b():
    _park()


def park_in_c():
    _park()


def mine(infos, greenlets):
    wanted = {id(g) for g in greenlets}
    return [info for info in infos if id(info.greenlet) in wanted]


def text_groups(text):
    """{stack number: (count, the group's text)} from a text dump."""
    heads = list(HEADER.finditer(text))
    out = {}
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        out[int(m.group(1))] = (int(m.group(2)), text[m.start():end])
    return out


def finish(greenlets):
    for g in greenlets:
        if not g.dead:
            g.throw(greenlet.GreenletExit)


def run_it(fn):
    return fn()


def test_stacks_differing_only_in_interpreter_frames_are_one_group():
    """Guards grouping by what a reader sees: the same Python stack reached
    through other C paths of the interpreter (here functools.partial's call,
    as specialised and unspecialised calls do on 3.12+) is one group, while
    the native frames really differ (checked on the raw records)."""
    import functools
    greenlets = [greenlet.greenlet(run_it), greenlet.greenlet(run_it)]
    greenlets[0].switch(park_in_a)
    greenlets[1].switch(functools.partial(park_in_a))
    try:
        assert bytes(btcore.collect(greenlets[0])._raw) != bytes(btcore.collect(greenlets[1])._raw)
        out = io.StringIO()
        btcore.dump_all(out, tree=False)
    finally:
        finish(greenlets)
    groups = text_groups(out.getvalue())
    assert [count for count, body in groups.values() if ", in park_in_a\n" in body] == [2]


def test_100_greenlets_in_3_stacks_give_3_groups_and_json_agrees():
    """Guards grouping: identical stacks shown once with their count, the same in text and JSON."""
    # distinct counts: groups of equal size are ordered as the gc lists them, which a
    # collection between the text and the JSON snapshot may change
    parks = [park_in_a] * 35 + [park_in_b] * 33 + [park_in_c] * 32
    greenlets = [greenlet.greenlet(fn) for fn in parks]
    for g in greenlets:
        g.switch()
    try:
        out = io.StringIO()
        btcore.dump_all(out, tree=False)
        text = out.getvalue()
        out = io.StringIO()
        btcore.dump_all(out, format="json")
        doc = json.loads(out.getvalue())
    finally:
        finish(greenlets)
    groups = text_groups(text)
    ours = {fn.__name__: [(n, count) for n, (count, body) in groups.items() if f", in {fn.__name__}\n" in body]
            for fn in (park_in_a, park_in_b, park_in_c)}
    assert {name: [count for _, count in found] for name, found in ours.items()} == {
        "park_in_a": [35], "park_in_b": [33], "park_in_c": [32]}
    stacks = {s["id"]: s for s in doc["stacks"]}
    assert doc["version"] == 2
    for name, [(number, count)] in ours.items():
        stack = stacks[number]
        assert stack["count"] == count and stack["state"] == "suspended"
        assert name in [f["function"] for f in stack["frames"] if f["kind"] == "python"]
        members = [g for g in doc["greenlets"] if g["stack"] == number]
        assert len(members) == count and {g["id"] for g in members} <= {id(g) for g in greenlets}
    assert len(groups) == len(doc["stacks"])


def test_ungrouped_dump_has_one_entry_per_greenlet():
    """Guards group=False: identical stacks are not merged; each entry is headed by its greenlet."""
    greenlets = [greenlet.greenlet(park_in_c) for _ in range(4)]
    for g in greenlets:
        g.switch()
    try:
        out = io.StringIO()
        btcore.dump_all(out, group=False, tree=False)
    finally:
        finish(greenlets)
    text = out.getvalue()
    for g in greenlets:
        head = re.search(rf"^=== stack (\d+): <greenlet.greenlet at 0x{id(g):x}> \(park_in_c\), suspended ===$", text, re.M)
        assert head and ", in park_in_c\n" in text[head.end():].split("\n===", 1)[0]
    assert "  e.g. " not in text and "\n=== thread " not in text


def test_group_members_have_the_interpreters_frames():
    """Guards snapshot()'s backtraces: each suspended greenlet's Python frames are its gr_frame chain."""
    greenlets = [greenlet.greenlet(fn) for fn in (park_in_a, park_in_b, park_in_b)]
    for g in greenlets:
        g.switch()
    try:
        infos = mine(btcore.snapshot(), greenlets)
        assert len(infos) == 3
        for info in infos:
            assert info.state == "suspended" and info.error is None and not info.python_only
            assert info.thread_id == threading.get_ident()
            assert info.thread_name == threading.current_thread().name
            assert py_view(info.backtrace.frames()) == interp_chain(info.greenlet.gr_frame)
    finally:
        finish(greenlets)


def test_snapshot_takes_the_raw_spawn_chain_and_builds_the_spawn_backtrace_on_use():
    """Guards GreenletInfo's spawn fields: the snapshot holds each greenlet's
    raw chain (its interned site, not a copy), the Backtrace is built only
    when read, and equals spawn_backtrace()'s."""
    btcore.enable_spawn_tracking()
    try:
        gs = [greenlet.greenlet(park_in_a) for _ in range(30)][-3:]   # warm: one native path (3.15)
        for g in gs:
            g.switch()
        infos = mine(btcore.snapshot(), gs)
    finally:
        btcore.disable_spawn_tracking()
    try:
        assert len(infos) == 3
        sites = {id(info.spawn_chain.links[0][0]) for info in infos}
        assert sites == {id(btcore.spawn_chain(gs[0]).links[0][0])}   # one interned site, shared
        for info in infos:
            assert info._spawn_backtrace is None                       # nothing built by the snapshot
            built = info.spawn_backtrace
            assert built is info.spawn_backtrace                       # built once
            assert built.format() == btcore.spawn_backtrace(info.greenlet).format()
    finally:
        finish(gs)


def test_states_come_from_greenlets_own_state_not_bool():
    """Guards the state rule: gevent's __bool__ (true once scheduled) and `dead` overrides are ignored."""
    scheduled = gevent.spawn(gevent.sleep, 0)            # bool() True, not started at greenlet level
    killed_early = gevent.spawn(gevent.sleep, 0)
    killed_early.kill(block=False)                        # gevent's `dead` True, greenlet's False
    raw_new = greenlet.greenlet(_park)
    finished = greenlet.greenlet(lambda: None)
    finished.switch()
    assert scheduled and killed_early.dead
    infos = {id(i.greenlet): i for i in btcore.snapshot()}
    assert infos[id(scheduled)].state == "not started"
    assert infos[id(killed_early)].state == "not started"
    assert infos[id(raw_new)].state == "not started"
    assert id(finished) not in infos                      # dead but referenced: excluded
    here = infos[id(greenlet.getcurrent())]
    assert here.state == "running" and not here.python_only
    scheduled.join()


class _Proxy:
    """Like werkzeug's LocalProxy outside its context: asking for __class__ raises."""

    @property
    def __class__(self):
        raise RuntimeError("working outside of context")


def test_finding_greenlets_runs_no_code_of_other_objects():
    """Guards the gc scan: it checks each object's real type, never its __class__ attribute."""
    proxy = _Proxy()
    infos = btcore.snapshot()
    assert any(info.greenlet is greenlet.getcurrent() for info in infos)
    del proxy


class _BrokenGreenlet(greenlet.greenlet):
    """A subclass whose name and parent properties raise."""

    @property
    def name(self):
        raise RuntimeError("no name")

    @property
    def spawning_greenlet(self):
        raise RuntimeError("no spawner")

    @property
    def parent(self):
        raise RuntimeError("no parent")


def test_a_subclass_raising_from_its_attributes_does_not_fail_the_snapshot():
    """Guards snapshot(): greenlet's own parent, and a subclass's name/spawner read as optional."""
    here = greenlet.getcurrent()
    g = _BrokenGreenlet(here.switch, parent=here)
    g.switch()
    try:
        [info] = mine(btcore.snapshot(), [g])
        assert info.state == "suspended" and info.parent is greenlet.getcurrent()
        assert info.name.startswith("<test_introspect._BrokenGreenlet at 0x") and info.spawned_by is None
        btcore.dump_all(io.StringIO())
    finally:
        g.switch()   # here.switch() returns: g finishes


def test_current_stack_starts_at_the_caller():
    """Guards the trimming of btcore's own frames from the calling greenlet's stack."""
    def caller():
        return btcore.snapshot()
    here = next(i for i in caller() if i.greenlet is greenlet.getcurrent())
    python = [f.function for f in here.backtrace.frames() if f.kind == "python"]
    assert python[0].endswith("caller"), python[:3]
    assert not any("snapshot" in (name or "") for name in python)


def test_gevent_hub_tree_with_greenlets_parked_in_sleep_recv_event_queue_lock():
    """Guards the gevent view: each parked greenlet found with its own frames, under its spawner in the tree."""
    event, queue, lock = gevent.event.Event(), gevent.queue.Queue(), gevent.lock.BoundedSemaphore()
    lock.acquire()
    a, b = gevent.socket.socketpair()

    def in_sleep():
        gevent.sleep(60)

    def in_recv():
        a.recv(1)

    def in_event():
        event.wait()

    def in_queue():
        queue.get()

    def in_lock():
        lock.acquire()

    def grandchild():
        event.wait()

    def child():
        gevent.spawn(grandchild)
        event.wait()

    def parent():
        gevent.spawn(child)
        event.wait()

    parked = [gevent.spawn(fn) for fn in (in_sleep, in_recv, in_event, in_queue, in_lock, parent)]
    gevent.sleep(0.01)
    try:
        infos = btcore.snapshot()
        by_id = {id(i.greenlet): i for i in infos}
        for g in parked:
            info = by_id[id(g)]
            assert info.state == "suspended" and info.error is None
            assert py_view(info.backtrace.frames()) == interp_chain(g.gr_frame)
        hub = by_id[id(gevent.get_hub())]
        assert hub.state == "suspended"
        assert "Hub.run" in [f.function for f in hub.backtrace.frames() if f.kind == "python"]
        out = io.StringIO()
        btcore.dump_all(out)
        tree = out.getvalue().split("\n=== thread ", 1)[1]
    finally:
        event.set()
        queue.put(None)
        lock.release()
        b.send(b"x")
        gevent.killall(parked)
        a.close()
        b.close()
    lines = tree.splitlines()
    depth = {}
    for line in lines:
        m = re.match(r"^([|` ]*[|`]- )?(Greenlet-\d+) \((\w+)\)", line)
        if m:
            depth[m.group(3)] = len(m.group(1) or "") // 3
    for fn in ("in_sleep", "in_recv", "in_event", "in_queue", "in_lock", "parent"):
        assert depth[fn] == 1, (fn, tree)
    assert depth["child"] == 2 and depth["grandchild"] == 3, tree


def test_snapshots_survive_greenlets_created_and_killed_by_another_thread():
    """Guards 'no exception from btcore' while another thread creates, runs and kills greenlets."""
    stop = threading.Event()
    errors = []

    def churn():
        try:
            while not stop.is_set():
                g = greenlet.greenlet(park_in_a)
                g.switch()
                g.throw(greenlet.GreenletExit)
                spawned = gevent.spawn(gevent.sleep, 0)
                spawned.kill()
        except BaseException as e:   # the test's own thread must not die silently
            errors.append(e)

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        for _ in range(50):
            infos = btcore.snapshot()
            btcore.dump_all(io.StringIO(), tree=False)
            for info in infos:
                assert info.backtrace is not None or info.error is not None
    finally:
        stop.set()
        thread.join(TIMEOUT)
    assert not errors


_DUMP_WHILE_A_GREENLET_IS_MADE = """
    import gc, io, threading, greenlet, btcore
    from btcore.capture import introspect
    creating, seen = [False], []
    main_threads = greenlet.getcurrent()   # running in another thread than the dump's: collect() refuses it

    def dump():   # what a dump from a finalizer does, and what a user's scan of gc.get_objects() may do
        listed = {id(info.greenlet) for info in btcore.snapshot()}
        btcore.dump_all(io.StringIO())
        here = greenlet.getcurrent()
        for o in gc.get_objects():
            if isinstance(o, greenlet.greenlet) and o is not here:
                introspect.state_of(o, here)
                if o is not main_threads:
                    btcore.collect(o)
        seen.append((creating[0], listed))

    def parked():
        try:
            greenlet.getcurrent().parent.switch()
        finally:
            dump()   # runs when the thread kills it: as its next greenlet is made

    holder, parked_there, go = [], threading.Event(), threading.Event()

    def thread():
        g = greenlet.greenlet(parked)
        g.switch()
        holder.append(g)
        del g
        parked_there.set()
        go.wait()
        creating[0] = True
        made = greenlet.greenlet(lambda: "ran")   # green_new clears the thread's deleteme list
        creating[0] = False
        print(seen[0][0], id(made) in seen[0][1], made.switch())

    t = threading.Thread(target=thread)
    t.start()
    parked_there.wait()
    holder.clear()   # the last reference, dropped in another thread: queued for its own thread to kill
    go.set()
    t.join()
"""


def test_a_dump_run_while_greenlet_makes_a_greenlet_leaves_it_out():
    """Guards the made check (btc_greenlet_made): greenlet's tp_new runs
    the finalizers of greenlets other threads dropped after the new object
    is in the gc's lists, before it has its C++ object, whose absence
    greenlet's own accessors do not check.  A dump there, from snapshot(),
    state_of() or collect(), died with SIGSEGV."""
    r = _run_child(_DUMP_WHILE_A_GREENLET_IS_MADE)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["True", "False", "ran"], r.stdout   # the dump ran inside; the new one not listed


def test_several_threads_each_with_its_own_hub():
    """Guards thread attribution: every thread's greenlets under that thread, its running greenlet's
    Python frames from the interpreter."""
    counts = {"t-one": 2, "t-two": 3, "t-three": 4}
    gate = threading.Lock()
    gate.acquire()
    made = {}

    def thread_main(n):
        event = gevent.event.Event()
        made[threading.get_ident()] = [gevent.spawn(event.wait) for _ in range(n)]
        gevent.sleep(0)
        gate.acquire()          # BLOCKED: this thread waits in C; its hub stays suspended
        gate.release()
        event.set()
        gevent.joinall(made[threading.get_ident()])

    source = inspect.getsource(thread_main).splitlines()
    blocked_line = thread_main.__code__.co_firstlineno + next(
        i for i, line in enumerate(source) if "# BLOCKED" in line)

    def blocked(ident):
        frame = sys._current_frames().get(ident)
        return frame is not None and frame.f_code is thread_main.__code__ and frame.f_lineno == blocked_line

    threads = [threading.Thread(target=thread_main, args=(n,), name=name) for name, n in counts.items()]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + TIMEOUT      # hang guard only
        while not all(blocked(t.ident) for t in threads) and time.monotonic() < deadline:
            time.sleep(0.001)
        infos = btcore.snapshot()
        frames_now = sys._current_frames()
    finally:
        gate.release()
        for t in threads:
            t.join(TIMEOUT)
    for t in threads:
        ours = [i for i in infos if i.thread_id == t.ident]
        assert {i.thread_name for i in ours} == {t.name}
        assert {id(g) for g in made[t.ident]} <= {id(i.greenlet) for i in ours}
        assert len(ours) == counts[t.name] + 2          # + the hub + the thread's main greenlet
        running = [i for i in ours if i.state == "running"]
        assert len(running) == 1 and running[0].python_only and running[0].greenlet.parent is None
        expected = [name for name, _, _ in interp_chain(frames_now[t.ident])]
        got = [f.function for f in running[0].backtrace.frames()]
        assert got == expected
        assert any(name.endswith(".thread_main") for name in got)
        for info in ours:   # parked in Cython (no Python frames) or in the hub: captured all the same
            if info.state == "suspended":
                assert info.error is None and info.backtrace.frames(), info


def test_snapshot_from_another_thread_shows_the_main_thread_running():
    """Guards snapshots taken off the main thread: the main thread's running greenlet has its
    Python frames from the interpreter, the worker's own greenlet is the current one."""
    main_ident = threading.get_ident()
    box = {}

    def take():
        box["infos"] = btcore.snapshot()
        box["frames"] = interp_chain(sys._current_frames()[main_ident])
        box["me"] = greenlet.getcurrent()

    thread = threading.Thread(target=take)
    thread.start()
    thread.join(TIMEOUT)
    infos = box["infos"]
    main = next(i for i in infos if i.greenlet is greenlet.getcurrent())
    assert main.state == "running" and main.python_only and main.thread_id == main_ident
    assert [f.function for f in main.backtrace.frames()] == [name for name, _, _ in box["frames"]]
    mine = next(i for i in infos if i.greenlet is box["me"])
    assert mine.state == "running" and not mine.python_only and mine.thread_id == thread.ident
    assert infos[0] is mine                              # the calling thread's greenlets first


def test_of_two_greenlets_without_python_frames_in_another_thread_the_one_it_runs_is_running():
    """Guards the state rule's thread-state read: in a thread whose main greenlet is
    switched away from (it has a frame), a greenlet parked in C and one running C code have
    no Python frame either (greenlet's own rule calls both running); the one the thread runs
    is running, the other suspended, captured with its native frames.  Oracle: the thread's
    own switches."""
    ready, blocked, there = threading.Event(), threading.Lock(), {}
    blocked.acquire()

    def two_without_frames():
        there["parked"] = greenlet.greenlet(greenlet.getcurrent().switch)   # parks inside switch(), in C
        there["parked"].switch()
        there["runner"] = greenlet.greenlet(blocked.acquire)               # runs C, no Python frame
        ready.set()
        there["runner"].switch()

    thread = threading.Thread(target=two_without_frames)
    thread.start()
    try:
        assert ready.wait(TIMEOUT)
        deadline = time.monotonic() + TIMEOUT
        while not there["runner"] and time.monotonic() < deadline:
            time.sleep(0.001)   # until the thread has switched into it
        infos = {id(i.greenlet): i for i in btcore.snapshot()}
        parked, runner = infos[id(there["parked"])], infos[id(there["runner"])]
        assert (parked.state, runner.state) == ("suspended", "running"), (parked, runner)
        assert parked.thread_id == runner.thread_id == thread.ident
        assert any(f.kind == "native" for f in parked.backtrace.frames()), parked.backtrace.frames()
    finally:
        blocked.release()
        thread.join(TIMEOUT)


def test_switch_timing_records_when_each_greenlet_last_ran():
    """Guards enable_switch_timing(): the greenlet parked first has waited longest; the tracer
    installed before still sees every switch, and comes back on disable."""
    seen = []

    def previous(event, args):
        seen.append(event)

    old = greenlet.settrace(previous)
    early, late = greenlet.greenlet(park_in_a), greenlet.greenlet(park_in_b)
    try:
        btcore.enable_switch_timing()
        early.switch()
        time.sleep(0.01)
        late.switch()
        infos = {id(i.greenlet): i for i in btcore.snapshot()}
        out = io.StringIO()
        btcore.dump_all(out)
        assert btcore.disable_switch_timing()
        assert greenlet.gettrace() is previous
        assert not btcore.disable_switch_timing()
    finally:
        greenlet.settrace(old)
        finish([early, late])
    assert infos[id(early)].last_ran > infos[id(late)].last_ran >= 0.0
    assert infos[id(greenlet.getcurrent())].last_ran == 0.0
    assert seen.count("switch") == 4          # into and out of each greenlet
    assert "  last ran: " in out.getvalue() and " s ago]" in out.getvalue()


def _run_child(source):
    return subprocess.run([sys.executable, "-P", "-c", textwrap.dedent(source)], capture_output=True,
                          text=True, timeout=TIMEOUT)


def test_signal_triggered_dump_in_a_subprocess():
    """Guards register_dump_signal(): a dump on SIGUSR1, then the previous handler (chain=True)."""
    proc = _run_child("""
        import os, signal, sys, time
        import gevent, gevent.event
        import btcore

        done = []
        signal.signal(signal.SIGUSR1, lambda signum, frame: done.append(signum))
        btcore.register_dump_signal(signal.SIGUSR1, chain=True)
        from btcore.capture import greenlets
        assert greenlets._learned == ""      # learned now, never inside the handler
        event = gevent.event.Event()
        def parked_here():
            event.wait()
        workers = [gevent.spawn(parked_here) for _ in range(5)]
        gevent.sleep(0)
        os.kill(os.getpid(), signal.SIGUSR1)
        while not done:
            time.sleep(0.01)
        assert btcore.unregister_dump_signal(signal.SIGUSR1)
        assert not btcore.unregister_dump_signal(signal.SIGUSR1)
        assert signal.getsignal(signal.SIGUSR1).__name__ == "<lambda>"
        print("previous handler ran")
    """)
    assert proc.returncode == 0, proc.stderr
    assert "previous handler ran" in proc.stdout
    groups = text_groups(proc.stderr)
    assert [count for count, body in groups.values() if ", in parked_here\n" in body] == [5]
    assert "=== thread MainThread" in proc.stderr
    # the main greenlet's stack keeps the C frames where the signal was handled (inside os.kill)
    [main] = [body for count, body in groups.values() if "running ===" in body.splitlines()[0]]
    # (os_kill is a static function: a stripped interpreter has no name for it)
    assert "_on_signal" not in main and "snapshot" not in main
    assert "] os_kill" in main or not conftest.INTERPRETER_HAS_SYMTAB


def test_signal_inside_btcore_cache_update_does_not_deadlock():
    """Guards the signal path: a signal landing inside btcore's name resolution (here inside the
    cache's eviction) neither deadlocks nor loses the dump (the writer thread resolves it; without
    a writer thread: tests/test_signal_dump.py)."""
    proc = _run_child("""
        import os, signal
        import greenlet
        import btcore

        btcore.register_dump_signal(signal.SIGUSR1)

        class Bound(int):
            # compared with the cache size inside FrameCache._evict, lock held
            def __lt__(self, other):
                signal.raise_signal(signal.SIGUSR1)   # this thread: at once
                return False

        g = greenlet.greenlet(lambda: greenlet.getcurrent().parent.switch())
        g.switch()
        bt = btcore.collect(g)
        btcore.cache.maxsize = Bound(65536)
        bt.frames()
        btcore.cache.maxsize = 65536
        print("survived")
    """)
    assert proc.returncode == 0, proc.stderr
    assert "survived" in proc.stdout
    # the writer thread resolves in a thread of its own: the dump is whole
    assert "stack not resolved" not in proc.stderr and "=== stack 1:" in proc.stderr
    assert "Backtrace (most recent call last):" in proc.stderr


def test_json_schema():
    """Guards the documented JSON schema (version 2)."""
    g = greenlet.greenlet(park_in_a)
    g.switch()
    try:
        out = io.StringIO()
        btcore.dump_all(out, format="json")
    finally:
        finish([g])
    doc = json.loads(out.getvalue())
    assert set(doc) == {"version", "pid", "time", "threads", "stacks", "greenlets", "tasks"}
    assert doc["version"] == 2 and doc["pid"] == os.getpid()
    stack_ids = {s["id"] for s in doc["stacks"]}
    for s in doc["stacks"]:
        assert set(s) == {"id", "count", "state", "states", "python_only", "error", "frames", "truncated",
                          "spawn_frames", "spawn_sites"}
        for f in s["frames"]:
            assert set(f) == {"kind", "function", "file", "line", "module", "ip", "offset", "inlined"}
    for entry in doc["greenlets"]:
        assert set(entry) == {"id", "name", "type", "thread_id", "state", "parent", "spawned_by", "under", "stack",
                              "error", "last_ran"}
        assert entry["stack"] in stack_ids
    assert sum(s["count"] for s in doc["stacks"]) == len(doc["greenlets"])
    with pytest.raises(ValueError):
        btcore.dump_all(io.StringIO(), format="xml")


def test_register_and_unregister_restore_the_previous_handler():
    """Guards unregister_dump_signal(): the handler from before the (first) registration comes back."""
    before = signal.getsignal(signal.SIGUSR2)
    try:
        btcore.register_dump_signal(signal.SIGUSR2)
        btcore.register_dump_signal(signal.SIGUSR2)      # twice: still restores `before`
        assert signal.getsignal(signal.SIGUSR2) is not before
        assert btcore.unregister_dump_signal(signal.SIGUSR2)
        assert signal.getsignal(signal.SIGUSR2) == before
    finally:
        signal.signal(signal.SIGUSR2, before)


def test_a_snapshot_in_steps_pauses_and_leaves_out_greenlets_that_ended():
    """Guards snapshot(pause=): the pause runs after every PAUSE_EVERY greenlets
    (what lets a gevent loop run during a view's snapshot), and a greenlet that
    ended during a pause is left out while every other one is still taken whole."""
    from btcore.capture.introspect import PAUSE_EVERY
    here = greenlet.getcurrent()
    parked = [greenlet.greenlet(park_in_a, parent=here) for _ in range(2 * PAUSE_EVERY + 10)]
    for g in parked:
        g.switch()
    ended, survivors = parked[::2], parked[1::2]
    pauses = []

    def pause():
        if not pauses:
            finish(ended)
        pauses.append(len(pauses))

    try:
        infos = btcore.snapshot(pause=pause)
        total = len(infos) + sum(1 for g in ended if all(info.greenlet is not g for info in infos))
        assert len(pauses) == (total - 1) // PAUSE_EVERY >= 2
        kept = mine(infos, survivors)
        assert len(kept) == len(survivors)
        for info in kept:
            assert info.state == "suspended" and info.error is None
            assert "park_in_a" in [f.function for f in info.backtrace.frames() if f.kind == "python"]
        # Those ended before their turn are gone; at most the first step's were taken alive.
        assert len(mine(infos, ended)) <= PAUSE_EVERY
        assert all(not info.greenlet.dead or info.state == "suspended" for info in mine(infos, ended))
    finally:
        finish(survivors)


def test_greenlets_of_a_subclass_made_after_import_are_found():
    """Guards the gc scan's set of greenlet classes: it holds today's subclasses, at any depth."""
    Late = type("Late", (gevent.Greenlet,), {})
    Later = type("Later", (Late,), {})
    g = Later(_park)
    g.start()
    gevent.sleep(0)
    try:
        [info] = mine(btcore.snapshot(), [g])
        assert info.state == "suspended"
    finally:
        g.kill()


def test_the_web_views_snapshot_pauses_let_the_loops_timers_run():
    """Guards the pause the web view's gevent callers give snapshot(): between
    two steps the loop runs its due timers (gevent.sleep(0) would only run
    callbacks: a ticker, a timeout, a socket's deadline waited for the whole
    snapshot)."""
    from btcore import web
    ran = []
    timer = gevent.spawn_later(0.0005, ran.append, True)

    def viewer():
        pause = web._renders_here()._pause
        time.sleep(0.005)      # the timer is due, the loop has not polled since
        pause()
        return bool(ran)

    try:
        assert gevent.spawn(viewer).get(timeout=TIMEOUT) is True
    finally:
        timer.kill()


def test_live_greenlets_finds_subclasses_and_runs_no_object_code():
    """live_greenlets()'s filter (a C type check) takes every greenlet, of
    greenlet's own class and of subclasses (gevent's Greenlet, a class made
    here), and only them; an object whose __class__ raises is not asked
    (isinstance() would ask it).  Oracle: the objects this test made."""
    import gc
    from btcore.capture import introspect

    class Mine(greenlet.greenlet):
        pass

    class Liar:
        @property
        def __class__(self):
            raise AssertionError("the filter ran the object's code")

    made = [greenlet.greenlet(lambda: None), Mine(lambda: None), gevent.Greenlet(lambda: None)]
    liar = Liar()
    found = introspect.live_greenlets()
    assert all(any(g is f for f in found) for g in made)
    assert all(isinstance(f, greenlet.greenlet) for f in found) and not any(f is liar for f in found)
    assert introspect._greenlets_among([1, liar, made[1], "x", made[2]]) == [made[1], made[2]]
    young = introspect.live_greenlets(0)
    assert all(isinstance(f, greenlet.greenlet) for f in young) and len(young) <= len(gc.get_objects(0))
    with pytest.raises(TypeError, match="takes a list"):
        introspect._greenlets_among((made[0],))


def test_known_states_sorts_the_profilers_greenlets_as_they_are():
    """_known_states() (the profiler's state read at every tick, in C), read
    from a greenlet that is not its thread's main one (the sampler's case):
    the greenlets made here in each state land in the phase turns
    (suspended, each in the phase of its address; parked without Python
    frames too, in Cython here, in C in a thread whose main greenlet runs
    and in one where another greenlet runs), running (the reader; a
    greenlet running in another thread) or gone (ended; collected), a not-started one in none;
    gevent's Greenlet, whose __bool__ and dead are its own, is read by
    greenlet's rule.  Bad arguments raise TypeError.  Oracle: the states
    this test made."""
    import weakref
    from btcore.capture import introspect
    assert introspect.layout_known()   # greenlet's layout, which tells each thread's current greenlet
    parked = [greenlet.greenlet(lambda: greenlet.getcurrent().parent.switch()) for _ in range(16)]
    for g in parked:
        g.switch()
    sleeper, in_cython = gevent.spawn(gevent.sleep, 30), gevent.spawn(gevent.event.Event().wait)
    gevent.sleep(0)
    assert in_cython.gr_frame is None   # parked, no Python frame: the rule's frameless case
    fresh, ended, collected = (greenlet.greenlet(lambda: None) for _ in range(3))
    ended.switch()
    ready, release, there = threading.Semaphore(0), threading.Event(), {}

    def a_child_runs():
        def child():
            there["running"] = greenlet.getcurrent()
            ready.release()
            release.wait()
        greenlet.greenlet(child).switch()

    def the_main_greenlet_runs():
        there["frameless"] = greenlet.greenlet(greenlet.getcurrent().switch)   # runs C: parks with no frame
        there["frameless"].switch()
        ready.release()
        release.wait()

    blocked = threading.Lock()
    blocked.acquire()

    def two_without_frames():   # one parked in C, and a non-main greenlet running
        there["parked frameless"] = greenlet.greenlet(greenlet.getcurrent().switch)
        there["parked frameless"].switch()
        there["running frameless"] = greenlet.greenlet(lambda: ready.release() or blocked.acquire())
        there["running frameless"].switch()

    def read(known, phases):
        return [introspect.known_states(known, greenlet.getcurrent(), phases, phase) for phase in range(phases)]

    threads = [threading.Thread(target=f) for f in (a_child_runs, the_main_greenlet_runs, two_without_frames)]
    for thread in threads:
        thread.start()
    try:
        assert all(ready.acquire(timeout=10) for _ in threads)
        child, frameless, here = there["running"], there["frameless"], greenlet.getcurrent()
        its_main = child.parent
        assert frameless.gr_frame is None and frameless and not frameless.dead
        # both frameless to greenlet's own rule (a running greenlet's frames are its thread's), and the
        # thread's main greenlet has its frame: only the thread's state tells which of the two runs
        parked_frameless, runner = there["parked frameless"], there["running frameless"]
        assert parked_frameless.gr_frame is None and parked_frameless and runner.gr_frame is None
        reader = greenlet.greenlet(read)
        every = parked + [sleeper, in_cython, fresh, ended, collected, child, its_main, frameless, here, reader,
                          parked_frameless, runner]
        known = {id(g): (weakref.ref(g), None, None) for g in every}
        del collected, every
        suspended = {id(g) for g in parked + [sleeper, in_cython, its_main, frameless, here, parked_frameless]}
        turns = reader.switch(known, 4)
        for phase, (turn, running, gone) in enumerate(turns):
            assert all(key == id(g) and (key >> 4) % 4 == phase for key, g in turn)
            assert {key for key, _ in running} == {id(reader), id(child), id(runner)}
            assert all(key == id(g) for key, g in running)
            assert set(gone) == set(known) - suspended - {id(fresh), id(reader), id(child), id(runner)}
            assert id(ended) in gone
        assert sorted(key for turn, _, _ in turns for key, _ in turn) == sorted(suspended)
        for bad in [([], here, 1, 0), (known, here, 0, 0), (known, here, 2, 2), (known, 1, 1, 0), (known, here, 1),
                    ({1: (weakref.ref(threads[0]), None)}, here, 1, 0), ({1: 2}, here, 1, 0)]:
            with pytest.raises(TypeError):
                introspect.known_states(*bad)
    finally:
        release.set()
        blocked.release()
        for thread in threads:
            thread.join()
        gevent.killall([sleeper, in_cython])


def test_parked_unmoved_counts_only_the_greenlets_whose_stamp_is_kept_with_an_entry():
    """_parked_unmoved() (the profiler's looks at parked greenlets, in C for
    those that have not moved): a greenlet whose stamp is the one kept with
    its Profile entry gets its time not counted yet (now - counted, plus its
    unplaced time) added to that entry, is marked counted up to now and its
    unplaced time dropped; one that moved (a new stamp), one kept with no
    entry, one whose stamp is a main greenlet's (a tuple) is returned for a
    Python look, untouched; one with no time to count is neither.  One
    parked with no Python frame (stamped None) is counted when a capture of
    it now is the kept one, else returned.  Oracle: the stamps of
    lib.btc_greenlet_stamp() and the captures of collect_suspended() (the
    Python look's), the arithmetic of sampler.Profiler._parked()."""
    from btcore._native import lib
    from btcore.capture import introspect
    assert introspect.layout_known()   # greenlet's layout, without which no greenlet is stamped

    def park_twice():
        greenlet.getcurrent().parent.switch()   # first place
        greenlet.getcurrent().parent.switch()   # second place

    still, moving, entryless, tupled = (greenlet.greenlet(park_twice) for _ in range(4))
    for g in (still, moving, entryless, tupled):
        g.switch()
    stamp = {g: lib.btc_greenlet_stamp(id(g)) for g in (still, moving, entryless)}
    assert all(stamp.values())
    moving.switch()   # parked at its second place now
    assert lib.btc_greenlet_stamp(id(moving)) not in (0, stamp[moving])
    entries = {key: [100, ()] for key in range(1, 6)}
    stacks = {1: (stamp[still], None, entries[1]), 2: (stamp[moving], None, entries[2]),
              3: (stamp[entryless], None, None), 4: ((1, 2, 3), None, entries[4]), 5: (stamp[still], None, entries[5])}
    counted, unplaced = {1: 40, 2: 40, 3: 40, 4: 40, 5: 1000}, {1: 5, 2: 7}
    parked = [(1, still), (2, moving), (3, entryless), (4, tupled), (5, still)]
    rest = introspect.parked_unmoved(parked, stacks, counted, unplaced, 1000)
    assert rest == parked[1:4] and all(a is b for a, b in zip(rest, parked[1:4]))
    assert entries[1][0] == 100 + (1000 - 40 + 5) and counted[1] == 1000 and 1 not in unplaced
    assert [entries[k][0] for k in (2, 4, 5)] == [100, 100, 100]   # moved, not an int stamp, no time to count
    assert counted == {1: 1000, 2: 40, 3: 40, 4: 40, 5: 1000} and unplaced == {2: 7}
    # a greenlet never counted before: its time is counted from now (none yet)
    assert introspect.parked_unmoved([(6, still)], {6: (stamp[still], None, entries[1])}, {}, {}, 1000) == []
    assert entries[1][0] == 1065
    # parked with no Python frame (inside switch()): nothing to stamp, its capture compared with the kept one
    frameless = greenlet.greenlet(greenlet.getcurrent().switch)
    frameless.switch()
    assert frameless.gr_frame is None and frameless
    kept, other = introspect.collect_suspended(frameless), introspect.collect_suspended(still)
    assert len(kept) and bytes(kept._raw) != bytes(other._raw)
    entries = {7: [0, ()], 8: [0, ()]}
    stacks = {7: (None, kept, entries[7]), 8: (None, other, entries[8])}
    rest = introspect.parked_unmoved([(7, frameless), (8, frameless)], stacks, {7: 10, 8: 10}, {}, 30)
    assert [key for key, _ in rest] == [8] and entries == {7: [20, ()], 8: [0, ()]}
    frameless.switch()
    for bad in [([(1, 2)], stacks, counted, unplaced, 1000), ([1], stacks, counted, unplaced, 1000),
                (parked, stacks, counted, unplaced, -1), (parked, stacks, counted, unplaced),
                (parked, [], counted, unplaced, 1000), ([(1, still)], stacks, {1: "x"}, unplaced, 1000)]:
        with pytest.raises(TypeError):
            introspect.parked_unmoved(*bad)
    for g in (still, moving, entryless, tupled):
        while g:
            g.switch()


def test_known_states_before_greenlets_layout_is_learned_take_a_frameless_main_greenlet_as_its_runner():
    """Guards the state rule's fallback, used until greenlet's layout (and with it each thread's
    current greenlet) is learned, and wherever it cannot be: one greenlet runs per thread, and in
    a thread started from Python a frameless main greenlet is that one.  A fresh process, which
    has learned nothing: in a thread whose main greenlet runs, the greenlet parked in C is
    suspended and the main greenlet running; in the reader's own thread, whose main greenlet is
    switched away (it has a frame), one parked in C is suspended too: there only the reader
    runs.  Oracle: the threads' own switches."""
    proc = _run_child("""
        import threading, weakref
        import greenlet
        from btcore.capture import greenlets, introspect
        ready, release, there = threading.Event(), threading.Event(), {}

        def the_main_greenlet_runs():
            there["parked"] = greenlet.greenlet(greenlet.getcurrent().switch)   # parks inside switch()
            there["parked"].switch()
            there["main"] = greenlet.getcurrent()
            ready.set()
            release.wait()

        thread = threading.Thread(target=the_main_greenlet_runs)
        thread.start()
        assert ready.wait(60)
        parked, main = there["parked"], there["main"]
        own = greenlet.greenlet(greenlet.getcurrent().switch)   # parked in C in the reader's own thread
        own.switch()
        names = {id(parked): "parked", id(main): "main", id(own): "own"}
        known = {id(g): (weakref.ref(g), None, None) for g in (parked, main, own)}
        turn, running, gone = greenlet.greenlet(introspect.known_states).switch(known, greenlet.getcurrent(), 1, 0)
        assert greenlets._learned is None, "learned already: this test would not read the fallback"
        print(sorted((names[id(g)], state) for state, pairs in (("suspended", turn), ("running", running))
                     for _, g in pairs))
        release.set()
        thread.join()
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "[('main', 'running'), ('own', 'suspended'), ('parked', 'suspended')]", \
        proc.stdout


def test_python_frames_of_another_thread_are_cpythons_chain():
    """python_frames_of_thread() (the capture's C walk of another thread's
    state) gives the code object and instruction offset of every frame of
    the thread, innermost first, as the interpreter's own frame chain
    (sys._current_frames(), f_back) has them; None for an ident no thread has."""
    from btcore.capture import introspect
    from btcore.capture.backtrace import RECORD

    release, parked = threading.Event(), threading.Event()

    def deep(n):
        if n:
            return deep(n - 1)
        parked.set()
        release.wait()

    thread = threading.Thread(target=deep, args=(20,))
    thread.start()
    try:
        assert parked.wait(TIMEOUT)
        frame, chain = sys._current_frames()[thread.ident], []
        bt = introspect.python_frames_of_thread(thread.ident)   # blocked in release.wait(): its frames stand still
        while frame is not None:
            chain.append((frame.f_code, frame.f_lasti))
            frame = frame.f_back
        ours = list(zip(bt._refs, [lasti for _, lasti, _, _, _ in RECORD.iter_unpack(bt._raw)]))
        assert len(chain) >= 21 and ours == chain
        assert introspect.python_frames_of_thread(max(sys._current_frames()) + 1) is None
        assert introspect.python_frames_of_thread(None) is None   # a thread not identified
    finally:
        release.set()
        thread.join(TIMEOUT)
