"""Names and parents of another process's greenlets, from outside
(btcore/remote/names.py), against what btcore.snapshot() names them inside
that process (tests/fixtures/names_target.py writes it: the oracle)."""
import json
import os
import re
import subprocess
import sys

import pytest

import conftest
import test_process_dump as process_dump

from btcore.remote import names as remote_names
from btcore._native import ffi, lib

KNOWN = lib.btc_remote_pyobjects(sys.hexversion, ffi.new("btc_remote_objlayout *")) == 0
pytestmark = [pytest.mark.skipif(not conftest.DUMPS_OTHER_PROCESSES, reason=conftest.NO_DUMP_HERE),
              pytest.mark.skipif(not KNOWN, reason="no object layout table for this CPython (robjects.c: 3.11, "
                                 "3.13-3.15)")]
TARGET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "names_target.py")
WAIT = 120   # seconds: hang detection only


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("names")
    oracle, ready = folder / "oracle.json", folder / "ready"
    proc = subprocess.Popen([sys.executable, TARGET, str(oracle), str(ready)])
    try:
        conftest.wait_until_ready(proc, ready, WAIT)
        yield proc, json.loads(oracle.read_text())
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)


def dump(pid, *args):
    done = subprocess.run([sys.executable, "-m", "btcore", "dump", *args, str(pid)], capture_output=True,
                          text=True, timeout=WAIT, cwd="/")
    assert done.returncode == 0, done.stderr
    return done.stdout


def members(pid) -> dict:
    """{address (hex): member} of the JSON dump's suspended greenlets."""
    doc = json.loads(dump(pid, "--json"))
    return {hex(g["id"]): g for g in doc["greenlets"] if g["state"] == "suspended"}


def test_outside_names_are_the_in_process_names(target):
    # guards: gevent's Greenlet-N (function), a custom name, a Python subclass, a plain greenlet's
    # "<type at 0x..> (function)", a main greenlet's " main": as snapshot() names them in the target.
    proc, oracle = target
    dumped = members(proc.pid)
    skip = set(oracle["fallback"]) | {oracle["huge"]}
    compared = {a: o["name"] for a, o in oracle["in_process"].items() if a not in skip and a in dumped}
    assert len(compared) >= 11, compared   # 3 workers, spawner, 2 children, custom, hostile, subclass, 2 plain
    assert {a: dumped[a]["name"] for a in compared} == {a: remote_names.shown(n) for a, n in compared.items()}
    names = set(compared.values())
    # gevent numbers a Greenlet when its name is first asked for: which worker is Greenlet-0 is not fixed
    assert "custom <b>name</b> (worker)" in names and any(re.fullmatch(r"Greenlet-\d+ \(worker\)", n) for n in names)
    assert any(n.startswith("<greenlet.greenlet at 0x") and n.endswith("> (parked)") for n in names)
    assert any(n.startswith("<__main__.Plain at 0x") and n.endswith("> (parked)") for n in names)
    # the main greenlet runs in-process (not in the oracle); outside it is parked while the hub runs
    assert any(m["name"] == f"<greenlet.greenlet at {a} main>" and m["parent"] is None for a, m in dumped.items())


def test_outside_parents_are_the_in_process_parents(target):
    # guards: the parent read from greenlet's C++ object (learned offset) is the greenlet's parent.
    proc, oracle = target
    dumped = members(proc.pid)
    parents = {a: o["parent"] for a, o in oracle["in_process"].items() if a in dumped}
    assert {a: dumped[a]["parent"] and hex(dumped[a]["parent"]) for a in parents} == parents
    assert sum(p is not None for p in parents.values()) >= 12


def test_outside_spawners_are_the_in_process_spawners(target):
    # guards: gevent's spawning_greenlet (a weak reference in a field learned through its getter) read from
    # outside is the greenlet snapshot() gives as spawned_by; one spawned by another greenlet than main.
    proc, oracle = target
    dumped = members(proc.pid)
    spawners = {a: o["spawned_by"] for a, o in oracle["in_process"].items() if a in dumped}
    assert {a: dumped[a]["spawned_by"] and hex(dumped[a]["spawned_by"]) for a in spawners} == spawners
    by_other = [a for a, s in spawners.items() if s is not None and dumped[s]["name"].endswith("(spawner)")]
    assert len(by_other) == 1 and dumped[by_other[0]]["parent"] != dumped[by_other[0]]["spawned_by"]
    orphans = [a for a, s in spawners.items() if s is None and dumped[a]["name"].endswith(" (worker)")]
    assert len(orphans) == 1   # spawned by a greenlet freed since: its weak reference points at None


def test_corrupt_name_fields_fall_back_to_the_plain_label(target):
    # guards: an ident of the wrong type, a dict pointer to a list, a function whose name is an int,
    # a name past MAX_STRING, a Greenlet gevent never gave an ident: shown plainly, no crash.
    proc, oracle = target
    dumped = members(proc.pid)
    expected = dict(oracle["fallback"])
    expected[oracle["huge"]] = f"<gevent._gevent_cgreenlet.Greenlet at {oracle['huge']}> (worker)"
    assert {a: dumped[a]["name"] for a in expected} == expected


def test_hostile_names_are_bounded_and_escaped_in_the_text_dump(target):
    # guards: a name with markup, an escape sequence and line breaks cannot forge lines or move the cursor,
    # and is cut to MAX_NAME characters.
    proc, oracle = target
    hostile = members(proc.pid)[oracle["hostile"]]["name"]
    assert len(hostile) == remote_names.MAX_NAME and hostile.endswith("...")
    assert hostile.startswith("\\x1b[31m<script>alert('x')</script>&amp;\\n=== stack 99: forged ===\\r")
    text = dump(proc.pid, "--no-native")
    assert "\x1b" not in text and "\r" not in text
    assert not any(line.startswith("=== stack 99") for line in text.splitlines())


def test_a_plain_label_is_the_whole_text_shown_whatever_the_type_name():
    # guards: labels of unnamed greenlets escape the text around the address once (remote_names._plain); the
    # label is still shown() of the whole text: a type name with control characters, one that must be cut.
    for type_name in ("greenlet.greenlet", "evil\x1b[31m\nname", "t" * 190, "\x07" * 60):
        for main, suffix in ((False, ""), (True, ""), (False, " (worker\r)")):
            label = remote_names._plain(type_name, main, suffix, "f", 16)(0xdeadbeef)
            assert label == (remote_names.shown(remote_names.plain_label(0xdeadbeef, main, type_name) + suffix),
                             "f", 16, None)
            assert len(label.name) <= remote_names.MAX_NAME and label.name.isprintable()


def test_shown_escapes_and_bounds():
    # guards: shown(): printable text unchanged; control characters escaped; cut with "..." at MAX_NAME.
    assert remote_names.shown("Greenlet-3 (handler)") == "Greenlet-3 (handler)"
    assert remote_names.shown("a\nb\x00c\u202e") == "a\\nb\\x00c\\u202e"
    cut = remote_names.shown("x" * 10_000)
    assert len(cut) == remote_names.MAX_NAME and cut.endswith("...")
    assert remote_names.shown("y" * remote_names.MAX_NAME) == "y" * remote_names.MAX_NAME


REMEMBERING_DUMPER = """
import io, json, sys, btcore
from btcore.remote import process
snap, stacks = process.process_stacks(int(sys.argv[1]))
print(json.dumps({"names": sorted(s.name for s in stacks if s.kind == "greenlet"),
                  "imported gevent": "gevent" in sys.modules}))
"""


def test_learned_gevent_fields_are_remembered_per_build_and_checked(target, tmp_path):
    # guards: a dump remembers gevent's field offsets per build-id (a cold dump then need not import gevent:
    # ~0.1 s), names as the learning dump did; implausible remembered values are not used: learned again.
    proc, _ = target
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}

    def dumped():
        done = subprocess.run([sys.executable, "-c", REMEMBERING_DUMPER, str(proc.pid)], capture_output=True,
                              text=True, timeout=WAIT, env=env, cwd="/", check=True)
        return json.loads(done.stdout)

    learning, remembering = dumped(), dumped()
    assert learning["imported gevent"] and not remembering["imported gevent"]
    assert remembering["names"] == learning["names"]
    assert any(re.match(r"Greenlet-\d+ \(worker\)$", n) for n in learning["names"])
    kept = tmp_path / "btcore" / "gevent-fields.json"
    fields = json.loads(kept.read_text())
    assert len(fields) == 1 and set(next(iter(fields.values()))) == {"ident", "spawner"}
    kept.write_text(json.dumps({build: {"ident": 3, "spawner": "x"} for build in fields}))   # garbage
    relearning = dumped()
    assert relearning["imported gevent"] and relearning["names"] == learning["names"]
    assert json.loads(kept.read_text()) == fields


EVENTLET_TARGET = """
import json, sys, eventlet, btcore

def leaf():
    eventlet.sleep(3600)

class Handler:
    def handle(self, n):
        leaf()

threads = [eventlet.spawn(leaf) for _ in range(2)] + [eventlet.spawn(Handler().handle, 1)]
eventlet.sleep(0)
print(json.dumps({hex(id(i.greenlet)): i.name for i in btcore.snapshot() if i.greenlet in threads}), flush=True)
eventlet.sleep(3600)
"""


def test_eventlet_green_threads_are_named_as_in_process():
    # guards: eventlet's GreenThread runs its function from GreenThread.main, whose locals are not read from
    # outside: the function is the one of the frame main called (not "main"), as dump_all() names it inside.
    proc = subprocess.Popen([sys.executable, "-W", "ignore", "-c", EVENTLET_TARGET], stdout=subprocess.PIPE,
                            text=True)
    try:
        oracle = json.loads(proc.stdout.readline())
        dumped = members(proc.pid)
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)
    assert {a: dumped[a]["name"] for a in oracle} == oracle
    assert sorted(n.rsplit(" ", 1)[1] for n in oracle.values()) == ["(handle)", "(leaf)", "(leaf)"], oracle


CROSS_TARGET = """
import json, threading, time, greenlet, btcore

class Plain(greenlet.greenlet):   # a heap type: its qualname lies at another offset on each version
    pass

def parked():
    greenlet.getcurrent().parent.switch()

parked_ones = [greenlet.greenlet(parked), Plain(parked)]
for g in parked_ones:
    g.switch()
threading.main_thread().name = "main <i>thread</i>"
named = {hex(id(i.greenlet)): i.name for i in btcore.snapshot() if i.greenlet in parked_ones}
print(json.dumps({"greenlets": named, "thread": threading.main_thread().name}), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("version", ["3.13", "3.14", "3.15"])
def test_a_target_on_another_cpython_is_named_through_its_versions_table(version):
    # guards: robjects.c's table is chosen by the target's version, not btcore's: a 3.13-3.15 target (the sid
    # chroot's) dumped by this btcore names a plain greenlet and a subclass made in Python (module and qualname:
    # heap-type offsets that differ per version) as btcore.snapshot() names them inside it, and its main thread
    # by the name threading gives it (sys.modules in the interpreter state, a Thread's inline values on 3.13+).
    python = process_dump.sid_python(version, f"/opt/btcore-venv-{version}/bin/python")
    _, oracle, doc = process_dump.dump_in_chroot(python, CROSS_TARGET)
    names = {hex(g["id"]): g["name"] for g in doc["greenlets"] if hex(g["id"]) in oracle["greenlets"]}
    assert names == oracle["greenlets"] and any(n.startswith("<__main__.Plain at 0x") for n in names.values())
    assert [t["name"] for t in doc["threads"]] == [oracle["thread"]]


THREADS_TARGET = """
import sys, threading
PATCHED = sys.argv[1] == "patched"
if PATCHED:
    from gevent import monkey
    monkey.patch_all()
import gevent, greenlet, btcore

def park_in_a_greenlet(started):
    main = greenlet.getcurrent()
    greenlet.greenlet(main.switch).switch()   # parked: this thread has a greenlet dump_all() lists
    started.set()
    threading.Event().wait() if not PATCHED else None

if not PATCHED:   # (patched, a Thread is a greenlet of the main thread)
    for name in ("worker-1", "plain <b>two</b>"):
        started = threading.Event()
        threading.Thread(target=park_in_a_greenlet, args=(started,), name=name, daemon=True).start()
        started.wait()
workers = [gevent.spawn(gevent.sleep, 600) for _ in range(2)]
gevent.sleep(0)
with open(sys.argv[2], "w") as f:
    btcore.dump_all(f)
print("ready", flush=True)
gevent.sleep(600)
"""


def thread_labels(text: str) -> set:
    """The thread labels of a text dump's group headers ("name (0xident)")."""
    labels = set()
    for line in text.splitlines():
        if line.startswith(("  thread: ", "  threads: ")):
            labels.update(line.split(": ", 1)[1].split(", "))
    return labels


@pytest.mark.parametrize("patched", [False, True], ids=["threads", "gevent-patched"])
def test_outside_thread_names_are_the_in_process_names(tmp_path, patched):
    # guards: thread names read from threading's _active (ident -> Thread, each Thread's _name in its managed
    # dict or values) and _main_thread, through sys.modules: the labels dump_all() gives inside; under gevent's
    # patching the main thread keeps its real name; no thread is "None".
    inside = tmp_path / "inside.txt"
    proc = subprocess.Popen([sys.executable, "-c", THREADS_TARGET, "patched" if patched else "plain", str(inside)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        outside = dump(proc.pid, "--no-native")
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)
    labels = thread_labels(inside.read_text())
    assert len(labels) == (1 if patched else 3) and any(label.startswith("MainThread (0x") for label in labels)
    assert labels <= thread_labels(outside), outside
    assert not any(label.startswith(("None", "native thread")) for label in thread_labels(outside)), outside


HOSTILE_THREADS_TARGET = """
import sys, threading, json

def park(started):
    started.set()
    threading.Event().wait()

def start(name):
    started = threading.Event()
    t = threading.Thread(target=park, args=(started,), name=name, daemon=True)
    t.start()
    started.wait()
    return t

forged = start("\\x1b[31m<i>x</i>\\n=== thread forged ===\\r" + "A" * 1000)
huge = start("B" * 100_000)   # past bounds.MAX_STRING: not read
spoofed = start("spoofed")
spoofed._ident = 12345        # its Thread no longer carries its thread's ident
threading._active["junk"] = 2.5           # a key that is no int
threading._active[99] = object()          # a value that is no Thread
threading._active[98] = threading._active # a dict that holds itself
print(json.dumps({name: t.native_id for name, t in (("forged", forged), ("huge", huge), ("spoofed", spoofed))}),
      flush=True)
threading.Event().wait()
"""


def test_hostile_thread_names_are_bounded_escaped_or_left_out():
    # guards: a thread name read from outside is escaped and cut to MAX_NAME; one past MAX_STRING, or whose Thread
    # does not carry its thread's ident, is not used (the fallback name); junk in _active is passed over.
    proc = subprocess.Popen([sys.executable, "-c", HOSTILE_THREADS_TARGET], stdout=subprocess.PIPE, text=True)
    try:
        tids = json.loads(proc.stdout.readline())
        doc = json.loads(dump(proc.pid, "--json"))
        text = dump(proc.pid, "--no-native")
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)
    names = {t["name"] for t in doc["threads"]}
    forged = next(n for n in names if n.startswith("\\x1b[31m"))
    assert len(forged) == remote_names.MAX_NAME and forged.startswith("\\x1b[31m<i>x</i>\\n=== thread forged ===\\r")
    assert {f"native thread {tids['huge']}", f"native thread {tids['spoofed']}", "MainThread"} <= names, names
    assert "\x1b" not in text and "\r" not in text
    assert not any(line.startswith("=== thread forged") for line in text.splitlines())


class NoTable:
    """btcore's native library, with no object table for any version (as for a target on one it lacks)."""

    def __getattr__(self, name):
        return getattr(lib, name)

    def btc_remote_pyobjects(self, version_hex, out):
        return -1


def test_a_target_of_a_version_with_no_table_keeps_the_plain_labels(target, monkeypatch):
    # guards: with no column for the target's version, greenlets keep type and address and threads their
    # fallback names: no object is read through a missing table (no exception, no guessed offsets).
    from btcore.remote.process import process_stacks
    proc, oracle = target
    monkeypatch.setattr(remote_names, "lib", NoTable())
    _, stacks = process_stacks(proc.pid)
    greenlets = [s for s in stacks if s.kind == "greenlet"]
    assert greenlets and all(s.name.startswith("<") and s.parent is None for s in greenlets)
    assert all(s.thread_name is None for s in stacks)
