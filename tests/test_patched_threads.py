"""Thread labels and the tree in monkey-patched processes (real gevent and
eventlet, each in its own subprocess: patching must not leak into pytest).

Under patching threading.get_ident() is the current greenlet's id, so a
label built from it changes with the greenlet that dumps.  Oracles here are
the unpatched module's own answers, taken in the target: the original
get_ident in each thread, the unpatched threading's main_thread() and
current_thread().name.  Each target dumps twice, from its hub and from a
green thread, and prints what it found and what the dumps said as JSON.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("gevent")

TIMEOUT = 120

GEVENT_TARGET = r"""
from gevent import monkey
monkey.patch_all()
import io, json, threading
import gevent
import btcore

real_ident = monkey.get_original("_thread", "get_ident")
allocate_lock = monkey.get_original("_thread", "allocate_lock")
release = allocate_lock(); release.acquire()
ready = [allocate_lock() for _ in range(2)]
for lock in ready:
    lock.acquire()
pool_idents = []

def blocked_in_pool(i):
    pool_idents.append(real_ident())
    ready[i].release()
    release.acquire()     # the pool thread stays busy (an unpatched lock)
    release.release()

pool = gevent.get_hub().threadpool
pool.maxsize = 2
tasks = [pool.spawn(blocked_in_pool, i) for i in range(2)]
for lock in ready:        # both pool threads run a task: two roots, two threads to pair
    while not lock.acquire(False):
        gevent.sleep(0.01)

def handler():
    gevent.sleep(1000)

workers = [gevent.spawn(handler) for _ in range(3)]
gevent.sleep(0)

def dump(fmt):
    out = io.StringIO()
    btcore.dump_all(out, format=fmt)
    return out.getvalue()

from_hub = []
gevent.get_hub().loop.run_callback(lambda: from_hub.append((dump("json"), dump("text"))))
gevent.sleep(0.01)
from_greenlet = gevent.spawn(lambda: (dump("json"), dump("text"), dump("html"))).get()
import signal, os
by_signal = io.StringIO()
btcore.register_dump_signal(signal.SIGUSR2, by_signal)
os.kill(os.getpid(), signal.SIGUSR2)
while not by_signal.getvalue():
    gevent.sleep(0.01)
described = btcore.collect(workers[0]).format().splitlines()[0]
release.release()
for t in tasks:
    t.get()
print(json.dumps({
    "main_ident": real_ident(), "main_name": threading.main_thread().name,
    "patched_ident": threading.get_ident(), "pool_idents": pool_idents,
    "hub_json": json.loads(from_hub[0][0]), "hub_text": from_hub[0][1],
    "greenlet_json": json.loads(from_greenlet[0]), "greenlet_text": from_greenlet[1],
    "html": from_greenlet[2], "described": described, "signal_text": by_signal.getvalue(),
    "workers": [id(w) for w in workers], "hub": id(gevent.get_hub()),
}))
"""

EVENTLET_TARGET = r"""
import warnings
warnings.simplefilter("ignore")
import eventlet
eventlet.monkey_patch()
import io, json
from eventlet import patcher, tpool
import eventlet.hubs
import btcore

original_thread = patcher.original("_thread")
original_threading = patcher.original("threading")

def leaf():
    eventlet.sleep(1000)

early = eventlet.spawn(leaf)   # before tracking: its spawner is unknown, its parent is the hub
btcore.enable_spawn_tracking()
kids = []

def spawner():
    kids.extend(eventlet.spawn(leaf) for _ in range(2))
    eventlet.sleep(1000)

top = eventlet.spawn(spawner)
release = original_thread.allocate_lock(); release.acquire()
in_tpool = []

def blocked_in_tpool():
    in_tpool.append((original_thread.get_ident(), original_threading.current_thread().name))
    release.acquire()
    release.release()

busy = eventlet.spawn(tpool.execute, blocked_in_tpool)

def never_started():
    pass
while not in_tpool:
    eventlet.sleep(0.01)

def dump(fmt):
    out = io.StringIO()
    btcore.dump_all(out, format=fmt)
    return out.getvalue()

hub = eventlet.hubs.get_hub()
scheduled = eventlet.spawn_after(1000, never_started)   # not started while the dumps run
from_hub = []
hub.schedule_call_global(0, lambda: from_hub.append((dump("json"), dump("text"))))
while not from_hub:
    eventlet.sleep(0.01)
from_greenlet = eventlet.spawn(lambda: (dump("json"), dump("text"))).wait()
from btcore.capture.threads import os_threads
named = [[t.ident, t.name] for t in os_threads()]
release.release()
busy.wait()
print(json.dumps({
    "main_ident": original_thread.get_ident(), "main_name": original_threading.main_thread().name,
    "tpool": in_tpool[0], "os_threads": named,
    "hub_json": json.loads(from_hub[0][0]), "hub_text": from_hub[0][1],
    "greenlet_json": json.loads(from_greenlet[0]), "greenlet_text": from_greenlet[1],
    "hub": id(hub.greenlet), "early": id(early), "scheduled": id(scheduled), "top": id(top), "kids": [id(k) for k in kids],
}))
"""


def run_target(source):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(source)], capture_output=True, text=True,
                          timeout=TIMEOUT, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def thread_labels(text):
    """The text tree's thread headers, without their greenlet counts."""
    labels = sorted(line.split(":")[0] for line in text.splitlines() if line.startswith("=== thread "))
    assert labels, text[-2000:]
    return labels


def threads_of(doc):
    return sorted((t["id"], t["name"]) for t in doc["threads"])


@pytest.fixture(scope="module")
def gevent_target():
    return run_target(GEVENT_TARGET)


def test_gevent_labels_are_the_os_threads_in_every_dump(gevent_target):
    """Guards the OS-thread mapping: from the hub, from a green thread and on a signal,
    the main thread's greenlets carry the real ident and MainThread, never
    the patched get_ident (a greenlet's id) or '?'."""
    t = gevent_target
    assert t["main_ident"] != t["patched_ident"]   # the target really is patched
    for which in ("hub", "greenlet"):
        doc = t[f"{which}_json"]
        by_id = {g["id"]: g for g in doc["greenlets"]}
        for gid in t["workers"] + [t["hub"]]:
            assert by_id[gid]["thread_id"] == t["main_ident"], which
        assert (t["main_ident"], t["main_name"]) in threads_of(doc)
        label = f"=== thread {t['main_name']} (0x{t['main_ident']:x}):"
        assert label in t[f"{which}_text"], t[f"{which}_text"][-2000:]
        assert "?" not in "".join(line for line in t[f"{which}_text"].splitlines() if "thread" in line)
    assert threads_of(t["hub_json"]) == threads_of(t["greenlet_json"])   # stable from dump to dump
    assert thread_labels(t["signal_text"]) == thread_labels(t["hub_text"]) == thread_labels(t["greenlet_text"])


def test_gevent_threadpool_threads_are_named_and_known(gevent_target):
    """Guards the stack-mark mapping and the threadpool name: two busy pool
    threads (two roots, two threads: no pairing by elimination) each get
    their own real ident and the name 'ThreadPool worker'."""
    t = gevent_target
    for which in ("hub", "greenlet"):
        doc = t[f"{which}_json"]
        threads = dict(threads_of(doc))
        for ident in t["pool_idents"]:
            assert threads.get(ident) == "ThreadPool worker", (which, threads)
        assert None not in threads, "a greenlet of an unknown thread"
        workers = [g for g in doc["greenlets"] if g["type"].endswith("_WorkerGreenlet")]
        assert sorted({g["thread_id"] for g in workers}) == sorted(t["pool_idents"])


def test_gevent_html_and_describe_name_the_os_thread(gevent_target):
    """Guards the HTML page's data and collect(g).format()'s header: the same OS thread."""
    t = gevent_target
    html = t["html"]
    start = html.index(">", html.index('<script type="application/json"')) + 1
    doc = json.loads(html[start:html.index("</script>", start)])
    assert threads_of(doc) == threads_of(t["greenlet_json"])
    greenlets = [dict(zip(doc["greenlet_fields"], row)) for row in doc["greenlet_rows"]]
    by_id = {g["id"]: g for g in greenlets}
    assert all(by_id[gid]["thread_id"] == t["main_ident"] for gid in t["workers"])
    assert t["described"].endswith(f"suspended, thread {t['main_name']} (id {t['main_ident']})"), t["described"]


@pytest.fixture(scope="module")
def eventlet_target():
    pytest.importorskip("eventlet")
    return run_target(EVENTLET_TARGET)


def test_eventlet_tree_is_by_spawner_never_under_the_hub(eventlet_target):
    """Guards GreenletInfo.under for eventlet: a green thread is drawn under
    the green thread that spawned it (spawn tracking's creator), one with an
    unknown spawner at the top of its thread, never under the hub (the
    parent of all of them)."""
    t = eventlet_target
    for which in ("hub", "greenlet"):
        doc = t[f"{which}_json"]
        by_id = {g["id"]: g for g in doc["greenlets"]}
        for kid in t["kids"]:
            assert by_id[kid]["under"] == t["top"], which
            assert by_id[kid]["parent"] == t["hub"]
        assert by_id[t["early"]]["under"] is None, which
        assert not [g for g in doc["greenlets"] if g["under"] == t["hub"]], which
        text = t[f"{which}_text"]
        tree = text[text.index("\n=== thread "):]
        assert " main>  " in tree.splitlines()[2], tree   # the thread's main greenlet first
        top_line = next(line for line in tree.splitlines() if f"0x{t['top']:x}>" in line)
        kid_lines = [line for line in tree.splitlines() if any(f"0x{k:x}>" in line for k in t["kids"])]
        indent = len(top_line) - len(top_line.lstrip("|`- "))
        assert all(len(line) - len(line.lstrip("|`- ")) == indent + 3 for line in kid_lines), tree


def test_eventlet_names_carry_the_function_and_threads_are_real(eventlet_target):
    """Guards eventlet naming (GreenThread.main's function) and the thread
    label: MainThread with the real ident; a tpool thread (no greenlet runs
    there, so no dump lists it) has the name the unpatched threading gave it."""
    t = eventlet_target
    tpool_ident, tpool_name = t["tpool"]
    for which in ("hub", "greenlet"):
        doc = t[f"{which}_json"]
        by_id = {g["id"]: g for g in doc["greenlets"]}
        assert by_id[t["top"]]["name"] == f"<eventlet.greenthread.GreenThread at 0x{t['top']:x}> (spawner)"
        assert by_id[t["scheduled"]]["state"] == "not started"
        assert by_id[t["scheduled"]]["name"].endswith("> (never_started)"), which   # from the hub's timer
        for kid in t["kids"] + [t["early"]]:
            assert by_id[kid]["name"].endswith("> (leaf)")
            assert by_id[kid]["thread_id"] == t["main_ident"]
        assert dict(threads_of(doc)) == {t["main_ident"]: t["main_name"]}   # the tpool runs no greenlet
        assert f"=== thread {t['main_name']} (0x{t['main_ident']:x}):" in t[f"{which}_text"]
    assert threads_of(t["hub_json"]) == threads_of(t["greenlet_json"])
    named = dict(t["os_threads"])
    assert named[tpool_ident] == tpool_name and tpool_name.startswith("tpool_thread_")
    assert named[t["main_ident"]] == t["main_name"]
