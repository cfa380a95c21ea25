"""btcore.collect() on a gevent hub and the greenlets parked in it.

gevent's greenlets (gevent.Greenlet, a Cython subclass of greenlet) park by
switching to the hub, through Cython-compiled code (no Python frames of its
own); the hub runs libev's (or libuv's) loop in native code.  Oracles: the
interpreter's frame chain of each parked greenlet (gr_frame, f_back), the
code that parked it, and which modules gevent's native frames live in.
"""
import os
import sys
import threading

import pytest

gevent = pytest.importorskip("gevent")
import gevent.event  # noqa: E402
import gevent.hub  # noqa: E402
import gevent.queue  # noqa: E402
import greenlet  # noqa: E402

import btcore  # noqa: E402
from conftest import build_chain as bc  # noqa: E402
from oracles import interp_chain, py_view, short, BIG

GEVENT_DIR = os.path.dirname(os.path.realpath(gevent.__file__)) + os.sep
GREENLET_DIR = os.path.dirname(os.path.realpath(greenlet.__file__)) + os.sep
LOOP_FUNCTIONS = ("ev_run", "uv_run")


def in_dir(f, d):
    path = f.module if f.kind == "native" else f.file
    return bool(path) and os.path.realpath(path).startswith(d)


def check_parked(g, site, callers, test_name):
    """g's capture: exactly its Python frames, with the call site `site`
    (the function that called into gevent to wait) and its `callers`; gevent's
    native frames (Cython) between the switch and the site; nothing of greenlet,
    nothing of the test function that spawned it."""
    bt = btcore.collect(g, capacity=BIG)
    assert not bt.truncated
    frames = bt.frames()
    assert py_view(frames) == interp_chain(g.gr_frame)
    names = [short(f.function) for f in frames if f.kind == "python" and f.file == __file__]
    assert names == [site] + callers, names
    i_site = next(i for i, f in enumerate(frames) if f.kind == "python" and short(f.function) == site)
    assert any(f.kind == "native" and in_dir(f, GEVENT_DIR) for f in frames[:i_site]), \
        [(f.function, f.module) for f in frames[:i_site]]
    assert not [f for f in frames if in_dir(f, GREENLET_DIR)]
    assert test_name not in {short(f.function) for f in frames}
    assert not [f for f in frames if f.kind == "python" and "pytest" in (f.file or "")]
    return frames


def check_hub(hub, test_name):
    bt = btcore.collect(hub, capacity=BIG)
    frames = bt.frames()
    assert frames and not bt.truncated
    assert py_view(frames) == interp_chain(hub.gr_frame)
    py = [(f.function, os.path.basename(f.file or "")) for f in frames if f.kind == "python"]
    assert ("Hub.run", "hub.py") in py, py
    assert any(f.kind == "python" and in_dir(f, GEVENT_DIR) for f in frames)
    nat = [f.function for f in frames if f.kind == "native" and in_dir(f, GEVENT_DIR)]
    assert any(n in LOOP_FUNCTIONS for n in nat), nat
    # the loop's native frames come before (inside) Hub.run
    i_loop = next(i for i, f in enumerate(frames) if f.function in LOOP_FUNCTIONS)
    i_run = next(i for i, f in enumerate(frames) if f.function == "Hub.run")
    assert i_loop < i_run
    assert test_name not in {short(f.function) for f in frames}
    assert not [f for f in frames if f.kind == "python" and "pytest" in (f.file or "")]
    assert not [f for f in frames if in_dir(f, GREENLET_DIR)]
    return frames


# ---------------------------------------------------------------- parked greenlets

def sleeper_site():
    gevent.sleep(1000)


def sleeper(k):
    if k:
        return sleeper(k - 1)
    sleeper_site()


def waiter_site(ev):
    ev.wait()


def getter_site(q):
    return q.get()


def native_site():
    gevent.sleep(1000)
    return 0


def test_hub_and_parked_greenlets(chain, chain_symbols):
    ffi, lib, so_path = chain
    ev = gevent.event.Event()
    q = gevent.queue.Queue()

    def through_native():
        chain.set_callback(lambda tag: native_site())
        return lib.recurse_then_call(5)

    gs = [gevent.spawn(sleeper, 3), gevent.spawn(waiter_site, ev), gevent.spawn(getter_site, q),
          gevent.spawn(through_native)]
    gevent.sleep(0)   # every greenlet runs until it parks, then we are back
    hub = gevent.get_hub()
    try:
        assert all(g and not g.dead and g.gr_frame is not None for g in gs)
        assert isinstance(gs[0], greenlet.greenlet) and type(gs[0]) is not greenlet.greenlet
        name = "test_hub_and_parked_greenlets"

        check_hub(hub, name)
        fr = check_parked(gs[0], "sleeper_site", ["sleeper"] * 4, name)
        # gevent.sleep itself is Python (gevent/hub.py), innermost
        first_py = next(f for f in fr if f.kind == "python")
        assert (first_py.function, os.path.basename(first_py.file)) == ("sleep", "hub.py")
        check_parked(gs[1], "waiter_site", [], name)
        check_parked(gs[2], "getter_site", [], name)
        fr = check_parked(gs[3], "native_site", ["<lambda>", "through_native"], name)
        rec = [f for f in fr if f.function == bc.NAME_RECURSE]
        assert len(rec) == 6
        assert [short(f.function) for f in fr if f.kind == "python"][-4:] == \
            ["native_site", "<lambda>", "_chain_dispatch", "through_native"]

        # again after the greenlets ran once more (new spills)
        ev.set()
        q.put(1)
        gevent.sleep(0)
        assert gs[1].dead and gs[2].dead
        assert len(btcore.collect(gs[1])) == 0 and len(btcore.collect(gs[2])) == 0
        check_hub(hub, name)
        check_parked(gs[0], "sleeper_site", ["sleeper"] * 4, name)
    finally:
        gevent.killall(gs)
    assert all(g.dead for g in gs)
    assert all(len(btcore.collect(g)) == 0 for g in gs)


def test_many_gevent_greenlets():
    """All greenlets of a hub, at various depths, each captured exactly."""
    ev = gevent.event.Event()

    def nest(k):
        if k:
            return nest(k - 1)
        ev.wait()

    gs = [gevent.spawn(nest, i % 13) for i in range(200)]
    gevent.sleep(0)
    try:
        for i, g in enumerate(gs):
            bt = btcore.collect(g, capacity=BIG)
            frames = bt.frames()
            assert py_view(frames) == interp_chain(g.gr_frame)
            assert [short(f.function) for f in frames if f.kind == "python"] == ["nest"] * (i % 13 + 1)
        check_hub(gevent.get_hub(), "test_many_gevent_greenlets")
    finally:
        ev.set()
        gevent.joinall(gs)


def test_hub_in_another_thread():
    """A thread's hub that waits in its loop (epoll, GIL released) is
    running: RuntimeError.  The thread's main greenlet and the greenlets
    parked in that hub are suspended: captured.  A hub not started yet is
    empty."""
    box = {}
    ready = threading.Event()

    def parked_site():
        gevent.sleep(1000)

    def thread_main():
        hub = gevent.get_hub()
        box["fresh_hub"] = len(btcore.collect(hub))   # not started yet
        box["hub"] = hub
        box["tmain"] = greenlet.getcurrent()
        box["gs"] = [gevent.spawn(parked_site) for _ in range(3)]
        gevent.sleep(0)
        ready.set()
        box["line"] = sys._getframe().f_lineno + 1
        box["stop_ev"].wait()

    box["stop_ev"] = gevent.event.Event()   # a gevent Event bound to no hub yet
    t = threading.Thread(target=thread_main, daemon=True)
    t.start()
    try:
        assert ready.wait(10)
        import time
        time.sleep(0.05)   # the thread's main greenlet is now parked in the hub
        assert box["fresh_hub"] == 0
        with pytest.raises(RuntimeError):
            btcore.collect(box["hub"])
        for g in box["gs"]:
            fr = btcore.collect(g, capacity=BIG).frames()
            assert py_view(fr) == interp_chain(g.gr_frame)
            assert [short(f.function) for f in fr if f.kind == "python" and f.file == __file__] == \
                ["parked_site"]
        tm = btcore.collect(box["tmain"], capacity=BIG).frames()
        assert py_view(tm) == interp_chain(box["tmain"].gr_frame)
        site = next(f for f in tm if f.kind == "python" and f.file == __file__)
        assert (short(site.function), site.line) == ("thread_main", box["line"])
    finally:
        hub = box.get("hub")
        if hub is not None:
            # wake the other thread's loop from here: its async watcher is
            # thread-safe; the callback runs in that thread
            def stop():
                box["stop_ev"].set()
            hub.loop.run_callback_threadsafe(stop)
        t.join(10)
    assert not t.is_alive()


# ---------------------------------------------------------------- not started yet

@pytest.mark.parametrize("make", [
    lambda f: gevent.spawn(f),
    lambda f: gevent.spawn_later(0.01, f),
    lambda f: gevent.Greenlet(f),                        # created, never started
    lambda f: (lambda g: (g.start(), g)[1])(gevent.Greenlet(f)),
])
def test_greenlet_not_started_yet_is_empty_then_parked_then_dead(make):
    """Guards issue 8.2: gevent's Greenlet is true once scheduled, before it
    has run; a capture before it runs is an empty Backtrace (not an error),
    then its stack once parked, then empty again once dead."""
    release = gevent.event.Event()
    g = make(lambda: release.wait())
    bt = btcore.collect(g)
    assert len(bt) == 0 and not bt.truncated and bt.frames() == []
    if not g.started:
        g.start()
    while not greenlet.greenlet.__bool__(g):   # greenlet-level: has it run yet?
        gevent.sleep(0.005)
    names = [short(f.function) for f in btcore.collect(g, capacity=BIG).frames() if f.kind == "python"]
    assert "<lambda>" in names, names
    release.set()
    g.join()
    assert len(btcore.collect(g)) == 0
