"""Spawn tracking (issue 11): enable_spawn_tracking(), spawn_backtrace().

Oracles: the interpreter's own frame chain at the creating call (names of
the Python frames of each spawn site), glibc's backtrace() taken inside the
native fixture (native frames of a site created in a C callback), the
fixture's symbol table read with pyelftools, gc.get_objects() (records
alive), and the type's tp_new slot read before and after (creation restored).
"""
import gc
import subprocess
import sys
import textwrap
import threading

import gevent
import greenlet
import pytest
from greenlet import greenlet as EarlyGreenlet   # imported before tracking is ever enabled

import btcore
from btcore._native import ffi, lib
from btcore.capture.spawn import GENERATIONS, _counts, raw_spawn_chain

from conftest import in_interpreter
from oracles import short
from test_collect import in_fn


class EarlySub(greenlet.greenlet):
    """A subclass made before tracking is enabled, with its own __init__."""

    def __init__(self, run, tag=None):
        super().__init__(run)
        self.tag = tag


@pytest.fixture
def tracking():
    btcore.enable_spawn_tracking(capacity=256)
    try:
        yield
    finally:
        btcore.disable_spawn_tracking()


def park():
    greenlet.getcurrent().parent.switch()


def parts(bt):
    """[(header, [frames])] of a spawn backtrace, newest generation first."""
    frames = bt.frames()
    joins = bt.joins() + [len(frames)]
    headers = [line.strip() for line in bt.format(most_recent_first=True).splitlines()
               if line.startswith("  spawned by ")]
    assert len(headers) == len(joins) - 1
    return [(headers[i], frames[joins[i]:joins[i + 1]]) for i in range(len(headers))]


def python_names(frames):
    """Short names (the last part of the qualified name) of the Python frames."""
    return [short(f.function) for f in frames if f.kind == "python"]


# ---- what is recorded ----

def test_gevent_three_generations_in_order(tracking):
    """The leaf lists the spawn sites of all 3 generations, newest first,
    each with its Python frames and the native frames between them."""
    seen = {}

    def leaf():
        seen["leaf"] = gevent.getcurrent()

    def mid():
        seen["mid"] = gevent.getcurrent()
        gevent.spawn(leaf).join()

    def top():
        seen["top"] = gevent.getcurrent()
        gevent.spawn(mid).join()

    def start():
        return gevent.spawn(top)

    start().join()
    bt = btcore.spawn_backtrace(seen["leaf"])
    (h_leaf, leaf_site), (h_mid, mid_site), (h_top, top_site) = parts(bt)
    assert h_leaf == f"spawned by {seen['mid']!r} at:"
    assert h_mid == f"spawned by {seen['top']!r} at:"
    assert h_top.startswith("spawned by <greenlet.greenlet object") and " main>" in h_top
    assert python_names(leaf_site) == ["mid"]
    assert python_names(mid_site) == ["top"]
    names = python_names(top_site)
    assert names[:2] == ["start", "test_gevent_three_generations_in_order"]
    # The oracle for the main greenlet's part: the interpreter's own chain.
    outer, frame = [], sys._getframe()
    while frame is not None:
        outer.append(short(frame.f_code.co_qualname))
        frame = frame.f_back
    assert names[1:] == outer
    for site in (leaf_site, mid_site):
        first_python = next(i for i, f in enumerate(site) if f.kind == "python")
        # between the spawn and the creating Python frame: the interpreter's
        # class call (type_call, ...: unnamed in a stripped interpreter) ...
        assert any(in_interpreter(f) for f in site[:first_python])
        # ... and below it, gevent's Greenlet.run (Cython) that runs the spawner
        native = [f.function or "" for f in site[first_python:] if f.kind == "native"]
        assert any(n.startswith("gevent._gevent_cgreenlet.Greenlet.run") for n in native)
    assert not any((f.module or "").endswith(("_native.cpython-311-x86_64-linux-gnu.so",))
                   for f in bt.frames()), "btcore's own frames leaked into a spawn site"


DEEP = 40   # Python frames of a handler's stack (a gunicorn + Flask one is ~30-40)


def descend(depth, then):
    """`depth` Python frames, every 4th one entered from C (sorted()'s key
    function): a deep handler's stack of Python and native frames."""
    if depth == 0:
        return then()
    if depth % 4:
        return descend(depth - 1, then)
    out = []
    sorted([0], key=lambda _: out.append(descend(depth - 1, then)))
    return out[0]


def spawn_here(fn, oracle):
    """gevent.spawn(fn), noting the interpreter's own Python frames here
    (innermost first, down to this greenlet's first one): the oracle."""
    names, frame = [], sys._getframe()
    while frame is not None:
        names.append(short(frame.f_code.co_qualname))
        frame = frame.f_back
    oracle.append(names)
    return gevent.spawn(fn)


def test_deep_three_generations_complete_by_default():
    """Issue 24: with the default settings, a chain of three generations of
    real gevent spawns, each made 40 Python frames deep through C, is
    complete: every Python frame at each spawn point, in order, nothing
    truncated (capacity 32 kept 32 frames of the newest site only)."""
    oracle, seen = [], {}
    gevent.sleep(0)   # earlier tests' greenlets let go by gevent
    gc.collect()
    records_before = _counts()[0]

    def grandchild():
        seen["leaf"] = gevent.getcurrent()

    def child():
        descend(DEEP, lambda: spawn_here(grandchild, oracle)).join()

    def handler():
        descend(DEEP, lambda: spawn_here(child, oracle)).join()

    def acceptor():   # created before tracking is on: the chain ends at it
        btcore.enable_spawn_tracking()
        try:
            descend(DEEP, lambda: spawn_here(handler, oracle)).join()
        finally:
            btcore.disable_spawn_tracking()

    gevent.spawn(acceptor).join()
    chain = btcore.spawn_chain(seen["leaf"])
    assert len(chain.links) == 3 and not chain.cut
    for site, _, _ in chain.links:
        assert len(site) > 2 * DEEP and not site.truncated
    bt = btcore.spawn_backtrace(seen["leaf"])
    assert not bt.truncated and bt.capacity == btcore.capture.spawn.DEFAULT_CAPACITY
    got = parts(bt)
    assert [python_names(frames) for _, frames in got] == oracle[::-1]
    assert all(sum(f.kind == "native" for f in frames) >= DEEP // 4 for _, frames in got)   # sorted()'s C frames
    assert got[-1][0].startswith("spawned by <Greenlet at 0x") and "acceptor" in got[-1][0]
    del seen["leaf"], chain, bt, got
    gevent.sleep(0)   # gevent lets go of the acceptor in its next loop run
    gc.collect()
    assert _counts()[0] == records_before   # every record freed with its greenlet


def make_parked(event):
    return gevent.spawn(event.wait)


def spawn_at_one(event):
    return make_parked(event)


def spawn_at_two(event):
    return make_parked(event)


def test_dump_group_lists_distinct_spawn_sites_with_counts(tracking):
    """Issue 24: greenlets with one stack, spawned from two places by two
    creators: the group lists both sites, most greenlets first, with counts
    and the creators' names with counts (text and JSON); a creator that has
    ended is named by its repr taken when it spawned."""
    import io
    import json
    event, made = gevent.event.Event(), {}

    def creator(key, plan):   # one function: a site is the same whichever creator runs it
        made[key + "_repr"] = repr(gevent.getcurrent())   # what the hook takes when it first spawns
        made[key] = [spawn_at(event) for spawn_at in plan]
        if key != "c":   # c ends before the dump
            event.wait()

    plans = {"a": [spawn_at_one, spawn_at_one, spawn_at_two], "b": [spawn_at_one] * 3, "c": [spawn_at_two]}
    a, b, c = [gevent.spawn(creator, key, plan) for key, plan in plans.items()]   # one site for the three
    gevent.sleep(0)   # the creators run, then the seven they made start and park in event.wait()
    gevent.sleep(0)
    try:
        text, doc = io.StringIO(), io.StringIO()
        btcore.dump_all(text, tree=False)
        btcore.dump_all(doc, format="json")
    finally:
        event.set()
        gevent.joinall(made["a"] + made["b"] + made["c"] + [a, b])
    name_a, name_b = f"{a.name} (creator)", f"{b.name} (creator)"
    name_c = made["c_repr"] if len(made["c_repr"]) <= 60 else made["c_repr"][:57] + "..."
    group = next(g for g in text.getvalue().split("\n=== stack ")[1:] if g.split(":")[1].startswith(" 7 greenlets"))
    lines = group.splitlines()
    first = lines.index("Spawned at (site 1 of 2, 5 greenlets):")
    second = lines.index("Spawned at (site 2 of 2, 2 greenlets):")
    assert lines[first + 1] == f"  by 2 greenlets: {name_b} x3, {name_a} x2"
    # a tie, in snapshot order; the text keeps to 80 columns ("(+1 more)"), the JSON has both
    assert lines[second + 1] in (f"  by 2 greenlets: {name_a} (+1 more)", f"  by 2 greenlets: {name_c} (+1 more)")
    one, two = "\n".join(lines[first:second]), "\n".join(lines[second:])
    assert ", in spawn_at_one" in one and ", in spawn_at_two" not in one
    assert ", in spawn_at_two" in two and ", in spawn_at_one" not in two
    assert sum(line.startswith("Spawned at") for line in lines) == 2
    stack = next(s for s in json.loads(doc.getvalue())["stacks"] if s["count"] == 7)
    sites = [(site["count"], sorted((w["name"], w["count"]) for w in site["spawners"]))
             for site in stack["spawn_sites"]]
    assert sites == [(5, sorted([(name_b, 3), (name_a, 2)])), (2, sorted([(name_a, 1), (name_c, 1)]))]
    assert [short(f["function"]) for f in stack["spawn_sites"][1]["frames"] if f["kind"] == "python"][:2] == [
        "make_parked", "spawn_at_two"]
    assert stack["spawn_frames"] == stack["spawn_sites"][0]["frames"]


def test_site_created_in_a_c_callback_has_the_c_frames(chain, chain_symbols, tracking):
    """A greenlet created inside a C extension's callback: its spawn site
    holds the extension's frames, address for address as glibc's backtrace()
    saw them from inside the chain."""
    ffi, lib_chain, so_path = chain
    made = []
    lib_chain.g_glibc_bt_enabled = 1
    try:
        chain.set_callback(lambda tag: made.append(greenlet.greenlet(park)) or 0)
        lib_chain.chain_entry(0)
        chain.finish()
    finally:
        lib_chain.g_glibc_bt_enabled = 0
    glibc = chain.glibc_backtrace()
    in_chain = [a for a in glibc[1:] if any(lo <= a - 1 < hi for lo, hi in chain_symbols.values())]
    assert len(in_chain) >= 2   # chain_static, chain_entry (and cffi's wrapper)

    frames = btcore.spawn_backtrace(made[0]).frames()
    ours = [f.ip for f in frames if f.kind == "native" and not f.inlined and f.module == so_path]
    k = next(i for i, ip in enumerate(ours) if in_fn(ip, chain_symbols, "_ZN5btfix6WalkerIiE7descendEi"))
    assert in_fn(ours[k - 1], chain_symbols, "chain_py_callback")
    assert [hex(a) for a in ours[k + 1:k + 1 + len(in_chain)]] == [hex(a) for a in in_chain]
    # and the Python frame that created the greenlet comes before the C frames
    first_python = next(f for f in frames if f.kind == "python")
    assert short(first_python.function) == "<lambda>"


# ---- sites seen before (spawn.c: a proof instead of a walk) ----

# Calls before a place settles: the interpreter specializes a call
# instruction after its first few runs, and its native path changes.
WARM_UP = 64


def memo_since_last():
    """(captures the memo answered since the last call, the last capture's place)."""
    place = ffi.new("uintptr_t *")
    hits = lib.btc_test_spawn_memo(place)
    return hits, place[0]


def test_a_site_seen_before_is_not_taken_for_one_whose_c_frames_differ(chain, chain_symbols, tracking):
    """Greenlets made at one place (the same stack depth, pc and Python
    frames) under two C frames alike but for the return addresses a walk
    reads there: each site holds its own frame; the memo answers the
    repeats of one, never the other from its proof."""
    _, lib_chain, so_path = chain
    made, places, hits = [], [], []
    twins = [i % 2 for i in range(WARM_UP)] + [0] * 6 + [(i + 1) % 2 for i in range(20)]

    def spawner():   # in a greenlet of its own: its sites end at its start
        for which in twins:
            lib_chain.chain_twins(which)
            hit, place = memo_since_last()
            hits.append(hit)
            places.append(place)

    chain.set_callback(lambda tag: made.append(greenlet.greenlet(park)) or 0)
    try:
        greenlet.greenlet(spawner).switch()
    finally:
        chain.finish()
    del places[:WARM_UP], hits[:WARM_UP]
    assert len(set(places)) == 1   # one place: only the twins' frames tell the sites apart
    assert sum(hits[:6]) >= 3 and sum(hits[6:]) == 0, hits
    for which, g in zip(twins, made):
        ips = [f.ip for f in btcore.spawn_backtrace(g).frames() if f.kind == "native" and f.module == so_path]
        twin = [name for name in ("twin_a", "twin_b") if any(in_fn(ip, chain_symbols, name) for ip in ips)]
        assert twin == ["twin_b" if which else "twin_a"]


def spawn_at_line(k):
    """A greenlet made at one of five call instructions: the same stack,
    another innermost Python instruction, so another place of the memo."""
    if k == 0:
        return greenlet.greenlet(park)
    if k == 1:
        return greenlet.greenlet(park)
    if k == 2:
        return greenlet.greenlet(park)
    if k == 3:
        return greenlet.greenlet(park)
    return greenlet.greenlet(park)


def test_two_places_of_one_memo_set_keep_a_proof_each(tracking):
    """The memo is two-way: two places whose hashes pick the same set,
    spawning in turn, each keep their entry (direct-mapped, each evicted
    the other's at every capture: no proof ever, a walk at every spawn).
    Of five places two share a set (four sets); which ones, ASLR decides."""
    def place_at(k):
        for _ in range(WARM_UP):   # the calls' specialization settles
            spawn_at_line(k)
        memo_since_last()
        spawn_at_line(k)
        return memo_since_last()[1]

    sets_log2 = 2   # spawn.c's MEMO_SETS_LOG2: a place's set is its top 2 bits
    set_of = {k: place_at(k) >> (8 * ffi.sizeof("uintptr_t") - sets_log2) for k in range(5)}
    a, b = next((a, b) for a in set_of for b in set_of if a < b and set_of[a] == set_of[b])
    hits = []
    for k in [a, b] * 20:
        spawn_at_line(k)
        hits.append(memo_since_last()[0])
    assert sum(hits[4:]) == len(hits) - 4, (a, b, hits)   # each proven by its second capture in the turns


def spawn_at_one_place():
    return greenlet.greenlet(park)


def started_by_a():
    return spawn_at_one_place()


def started_by_b():
    return spawn_at_one_place()


def test_a_site_seen_before_serves_other_greenlets_on_the_same_path_only(tracking):
    """Greenlets that each create one greenlet at one place, started from
    two functions in turn: each site names its own outer function, the
    greenlets on one path share the site the memo answers, the other path
    is never answered from its proof."""
    bodies = [(started_by_a, started_by_b)[i % 2] for i in range(WARM_UP)] + [started_by_a] * 6 + \
             [(started_by_b, started_by_a)[i % 2] for i in range(20)]
    made, places, hits = [], [], []
    for body in bodies:
        runner = greenlet.greenlet(body)
        memo_since_last()   # (runner's own site left out)
        made.append(runner.switch())
        hit, place = memo_since_last()
        hits.append(hit)
        places.append(place)
    del places[:WARM_UP], hits[:WARM_UP]
    assert len(set(places)) == 1
    assert sum(hits[:6]) >= 3 and sum(hits[6:]) == 0, hits
    sites = []
    for body, g in zip(bodies, made):
        site = raw_spawn_chain(g, 1)[0][0][0]
        sites.append(site)
        assert [short(f.function) for f in site.frames() if f.kind == "python"] == ["spawn_at_one_place", body.__name__]
    assert len({id(site) for body, site in zip(bodies[WARM_UP:WARM_UP + 6], sites[WARM_UP:])}) == 1


class Numbered(greenlet.greenlet):
    def __repr__(self):
        return f"<gen {self.n}>"


def test_ten_thousand_generations_bounded_newest_kept():
    """Each generation creates the next and dies: with the default settings
    the leaf keeps the newest GENERATIONS generations, says older ones were
    dropped, and what it keeps alive stays bounded."""
    btcore.enable_spawn_tracking(native=False)
    try:
        main = greenlet.getcurrent()

        def step(n):
            child = Numbered(step, main)   # not parent=g (the default): that would keep g alive
            child.n = n + 1
            return child

        g = Numbered(step)
        g.n = 0
        records_before = _counts()[0]
        for n in range(10_000):
            spawner, g = g, g.switch(g.n)     # g runs, creates its successor and dies
            # the spawner is n + 1 generations below main: all of them, or the newest kept
            chain = btcore.spawn_chain(spawner)
            assert (len(chain.links), chain.cut) == (min(n + 1, GENERATIONS), n + 1 > GENERATIONS), n
        del spawner
        leaf = g
        assert len(raw_spawn_chain(leaf, 1 << 30)[0]) <= 2 * GENERATIONS   # generations kept alive
        assert _counts()[0] - records_before <= 2   # the leaf's (and main's) record, not 10 000
        bt = btcore.spawn_backtrace(leaf)
        assert len(bt) == GENERATIONS and bt.truncated   # one Python frame per site
        headers = [h for h, _ in parts(bt)]
        expected = [f"spawned by <gen {9_999 - i}> at:" for i in range(GENERATIONS)]
        expected[-1] = expected[-1][:-1] + f" (older generations not kept: {GENERATIONS} at most):"
        assert headers == expected
        # a capacity smaller than the chain keeps the newest frames
        small = btcore.chain_backtrace(btcore.spawn_chain(leaf), capacity=8)
        assert len(small) == 8 and small.truncated and [h for h, _ in parts(small)] == headers[:8]
    finally:
        btcore.disable_spawn_tracking()


def test_class_imported_before_enabling_is_tracked(tracking):
    g = EarlyGreenlet(park)
    assert btcore.spawn_backtrace(g) is not None
    assert python_names(btcore.spawn_backtrace(g).frames())[0] == "test_class_imported_before_enabling_is_tracked"


def test_subclasses_with_own_init_or_new_are_tracked(tracking):
    class LateSub(greenlet.greenlet):
        def __init__(self, run):
            super().__init__(run)

    class WithNew(greenlet.greenlet):
        def __new__(cls, *args, **kwargs):
            return super().__new__(cls, *args, **kwargs)

    class UnderGevent(gevent.Greenlet):
        def __init__(self):
            super().__init__(park)

    here = "test_subclasses_with_own_init_or_new_are_tracked"
    for g in (EarlySub(park, tag=1), LateSub(park), UnderGevent()):
        assert python_names(btcore.spawn_backtrace(g).frames())[0] == here, type(g)
    # __new__ runs before the object exists: it is part of the creating stack
    assert python_names(btcore.spawn_backtrace(WithNew(park)).frames())[:2] == ["__new__", here]


def test_gevent_creation_paths(tracking):
    from gevent.pool import Group, Pool

    def where():
        return python_names(btcore.spawn_backtrace(made).frames())

    group, pool = Group(), Pool(2)
    for made in (gevent.spawn(lambda: None), gevent.Greenlet(lambda: None), group.spawn(lambda: None),
                 pool.spawn(lambda: None), gevent.spawn_later(0, lambda: None)):
        assert "test_gevent_creation_paths" in where(), made
    gevent.wait()


def test_created_before_enabling_or_after_disabling_has_none():
    before = greenlet.greenlet(park)
    btcore.enable_spawn_tracking()
    assert btcore.spawn_tracking_enabled()
    during = greenlet.greenlet(park)
    btcore.disable_spawn_tracking()
    assert not btcore.spawn_tracking_enabled()
    after = greenlet.greenlet(park)
    assert btcore.spawn_backtrace(before) is None
    assert btcore.spawn_backtrace(during) is not None   # records stay with their greenlets
    assert btcore.spawn_backtrace(after) is None


def test_disable_restores_creation_exactly():
    """The tp_new slot of greenlet, of subclasses made before, during and
    after tracking, and of gevent's Cython Greenlet, is what it was."""
    types = [greenlet.greenlet, EarlySub, gevent.Greenlet]
    original = {t: lib.btc_type_new_slot(id(t)) for t in types}
    btcore.enable_spawn_tracking()
    hooked = lib.btc_type_new_slot(id(greenlet.greenlet))
    assert hooked != original[greenlet.greenlet]
    assert lib.btc_type_new_slot(id(EarlySub)) == hooked
    assert lib.btc_type_new_slot(id(gevent.Greenlet)) == original[gevent.Greenlet]   # its own tp_new

    class DuringSub(greenlet.greenlet):
        pass
    assert lib.btc_type_new_slot(id(DuringSub)) == hooked
    btcore.enable_spawn_tracking(capacity=16)   # again: settings only
    btcore.disable_spawn_tracking()
    for t in types:
        assert lib.btc_type_new_slot(id(t)) == original[t]
    assert lib.btc_type_new_slot(id(DuringSub)) == original[greenlet.greenlet]
    btcore.disable_spawn_tracking()   # twice: harmless
    assert lib.btc_type_new_slot(id(greenlet.greenlet)) == original[greenlet.greenlet]


# ---- lifetime ----

def spawn_records():
    return sum(1 for o in gc.get_objects() if type(o).__name__ == "_SpawnRecord")


def test_parent_dies_before_child(tracking):
    kids = []

    def parent():
        kids.append(greenlet.greenlet(park))

    p = greenlet.greenlet(parent)
    p.switch()
    assert p.dead
    del p
    (h_kid, kid_site), (h_parent, parent_site) = parts(btcore.spawn_backtrace(kids[0]))
    assert h_kid.startswith("spawned by <greenlet.greenlet object") and "dead" not in h_kid
    assert python_names(kid_site) == ["parent"]
    assert python_names(parent_site)[0] == "test_parent_dies_before_child"


def test_child_dies_before_parent(tracking):
    gc.collect()
    base = spawn_records()

    def parent():
        child = greenlet.greenlet(lambda: None)
        child.switch()
        assert child.dead
        del child
        park()

    p = greenlet.greenlet(parent)
    p.switch()
    assert spawn_records() == base + 1   # p's own; its dead child's is gone
    assert btcore.spawn_backtrace(p) is not None
    p.throw(greenlet.GreenletExit)
    del p
    assert spawn_records() == base


def test_no_growth_over_100_000_spawns(tracking):
    """Records die with their greenlets; sites with the last record using
    them (but for a small bounded set kept for reuse)."""
    gc.collect()
    records, sites = _counts()
    objects = spawn_records()
    for i in range(100_000):
        greenlet.greenlet(park)
        if i % 7 == 0:
            (lambda: greenlet.greenlet(park))()   # another site
    gc.collect()
    assert spawn_records() == objects
    assert _counts()[0] == records
    assert _counts()[1] <= sites + 16


def test_a_site_dies_with_its_last_greenlet(tracking):
    import weakref

    def make():
        return [greenlet.greenlet(park) for _ in range(50)]

    # The first calls may take another native path than the later ones (the
    # interpreter specialises the call after a few runs: 3.15 does): the
    # same line then gives two sites.  Once warm, one.
    gs = make()[-20:]
    site = btcore.spawn_chain(gs[0]).links[0][0]
    assert all(btcore.spawn_chain(g).links[0][0] is site for g in gs)   # interned: one site
    ref = weakref.ref(site)
    del site, gs
    for _ in range(16):                                  # push it out of the reuse ring
        exec("greenlet.greenlet(park)", {"greenlet": greenlet, "park": park})
    gc.collect()
    assert ref() is None


# ---- format ----

def test_format_headers_and_append_keeps_them(tracking):
    kids = []

    def parent():
        kids.append(greenlet.greenlet(park))
        park()

    p = greenlet.greenlet(parent)
    p.switch()
    kid = kids[0]
    spawn = btcore.spawn_backtrace(kid)
    assert spawn.joins() == [0, len(spawn.frames()) - len(parts(spawn)[-1][1])][:len(spawn.joins())]
    last = spawn.format().splitlines()
    first = spawn.format(most_recent_first=True).splitlines()
    # p's repr taken when it spawned (it was running then: greenlet's repr
    # says "current"; it says "suspended" now)
    header = f"  spawned by {p!r} at:".replace(" suspended ", " current ")
    # Each header comes right before the frames it names, in either order.
    following = next(j for j in range(2, len(first)) if first[j].startswith("  spawned by"))
    assert first[1] == header and any(line.endswith("<locals>.parent") for line in first[2:following])
    i = last.index(header)
    assert any(line.endswith("<locals>.parent") for line in last[i + 1:]) and not any(
        line.startswith("  spawned by") for line in last[i + 1:])
    assert "==== appended backtrace boundary ====" not in spawn.format()

    full = btcore.collect(kid, capacity=512)   # the kid's own stack, then where it came from
    n = len(full)
    btcore.append(full, spawn)
    assert full.joins()[0] == len(btcore.collect(kid, capacity=512).frames())
    # (kid has not started: its own part is empty; no greenlet header line)
    text = full.format(most_recent_first=True, header=False).splitlines()
    assert n == 0 and header in text and text.index(header) == 1
    p.throw(greenlet.GreenletExit)


def test_spawn_backtrace_rejects_non_greenlets():
    with pytest.raises(TypeError):
        btcore.spawn_backtrace(object())


def test_enable_rejects_bad_arguments():
    with pytest.raises(ValueError):
        btcore.enable_spawn_tracking(capacity=0)
    with pytest.raises(TypeError):
        btcore.enable_spawn_tracking(capacity=8.0)
    with pytest.raises(TypeError):
        btcore.enable_spawn_tracking(native=1)
    assert not btcore.spawn_tracking_enabled()


# ---- robustness ----

class BadRepr(greenlet.greenlet):
    def __repr__(self):
        raise RuntimeError("no repr")


class SpawningRepr(greenlet.greenlet):
    def __repr__(self):
        greenlet.greenlet(park)   # creates a greenlet from inside the hook
        return "<spawning repr>"


def test_spawner_repr_failing_or_spawning(tracking):
    got = []

    def run():
        got.append(greenlet.greenlet(park))

    for cls in (BadRepr, SpawningRepr):
        cls(run).switch()   # dead now, and gone: gevent's tree tests list live greenlets
    bad, spawning = (parts(btcore.spawn_backtrace(g))[0][0] for g in got)
    assert bad.startswith("spawned by <BadRepr object at 0x")
    assert spawning == "spawned by <spawning repr> at:"


def test_threads(tracking):
    got = []

    def in_thread():
        def child():
            got.append(greenlet.greenlet(park))
        greenlet.greenlet(child).switch()

    threads = [threading.Thread(target=in_thread) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g in got:
        (h, site), (h_outer, outer) = parts(btcore.spawn_backtrace(g))
        assert python_names(site) == ["child"]
        assert python_names(outer)[0] == "in_thread"


# A gevent Greenlet is made by its Cython tp_new, which calls greenlet's
# (the hook) first and fills its own fields after: NULL until then, and its
# spawning_greenlet getter reads them unchecked.  Python code run inside the
# hook after greenlet's tp_new could find the half-made object (a signal's
# dump at the next bytecode, as in a loaded gunicorn worker, which died of
# SIGSEGV at 0): the hook must run none there.  Each child dumps from such
# Python code; a crash is its exit status.
_DUMP_WHILE_SPAWNING = """
    import gc, sys, gevent, greenlet, btcore
    btcore.enable_spawn_tracking()
    dumps = []
    def dump(*_):
        if armed:
            dumps.append(sum(1 for info in btcore.snapshot() if isinstance(info.greenlet, gevent.Greenlet)))
    armed = False
    {setup}
    def spawner():
        global armed
        armed = True
        g = gevent.spawn(lambda: None)
        armed = False
        lines = btcore.spawn_backtrace(g).format().splitlines()
        print(len(dumps) > 0, [line.strip() for line in lines if "spawned by" in line][-1])   # g's spawner
    {spawner}
"""


def test_a_dump_run_by_the_spawners_repr_sees_no_half_made_greenlet():
    """The spawner's repr, the hook's first Python code, runs before the
    greenlet is made (it is what a dump sees then)."""
    r = run_child(_DUMP_WHILE_SPAWNING.format(
        setup="class Dumping(greenlet.greenlet):\n        def __repr__(self):\n"
              "            dump()\n            return '<dumping spawner>'",
        spawner="Dumping(spawner).switch()"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[0] == "True spawned by <dumping spawner> at:", r.stdout


def test_a_dump_run_by_a_collection_while_recording_sees_no_half_made_greenlet():
    """A collection set off by the record's allocation runs gc.callbacks
    (Python code): the collector is held off while the record is made.
    With a threshold of 1 every allocation collects."""
    r = run_child(_DUMP_WHILE_SPAWNING.format(
        setup="gc.callbacks.append(dump)",
        spawner="gc.set_threshold(1)\n    greenlet.greenlet(spawner).switch()"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[0].startswith("True spawned by <greenlet.greenlet object at 0x"), r.stdout
    assert " main>" not in r.stdout, r.stdout   # the greenlet that ran spawner(), not the main one


# ---- gevent's own tracking ----

@pytest.mark.parametrize("gevent_tree", [True, False])
def test_with_gevents_own_tracking(tracking, gevent_tree):
    import io
    from gevent import config, util
    saved = config.track_greenlet_tree
    config.track_greenlet_tree = gevent_tree
    try:
        g = gevent.spawn(gevent.sleep, 0.01)
        assert (g.spawning_stack is not None) == gevent_tree
        assert btcore.spawn_backtrace(g) is not None
        out = io.StringIO()
        util.print_run_info(file=out)
        assert "Greenlets" in out.getvalue() and "<Greenlet" in out.getvalue()
        tree = util.GreenletTree.current_tree()
        assert tree.format()
        g.join()
    finally:
        config.track_greenlet_tree = saved


# ---- other processes: fork, eventlet ----

def run_child(code):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120)


def test_fork_while_tracking():
    """No lock to inherit: a forked child spawns and resolves as usual."""
    r = run_child("""
        import os, greenlet, btcore
        btcore.enable_spawn_tracking()
        keep = [greenlet.greenlet(lambda: None) for _ in range(100)]
        pid = os.fork()
        if pid == 0:
            g = greenlet.greenlet(lambda: None)
            ok = btcore.spawn_backtrace(g) is not None and btcore.spawn_backtrace(keep[0]) is not None
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0"]


def test_eventlet_spawn():
    pytest.importorskip("eventlet", reason="eventlet is optional: pip install eventlet to test its spawn")
    r = run_child("""
        import warnings
        warnings.simplefilter("ignore")
        import eventlet, btcore
        btcore.enable_spawn_tracking()
        got = []
        def leaf():
            pass
        def parent():
            got.append(eventlet.spawn(leaf))
        def start():
            return eventlet.spawn(parent)
        start().wait()
        got[0].wait()
        bt = btcore.spawn_backtrace(got[0])
        print([f.function for f in bt.frames() if f.kind == "python"])
    """)
    assert r.returncode == 0, r.stderr
    names = eval(r.stdout.strip().splitlines()[-1])
    assert names[:2] == ["spawn", "parent"] and "start" in names   # eventlet.spawn creates the GreenThread


def test_reloading_the_module_while_tracking():
    """Guards: reloading btcore.capture.spawn while the hook is installed keeps the
    original constructor (it used to take the hook for it and fail)."""
    r = run_child("""
        import importlib, greenlet, btcore, btcore.capture.spawn
        from btcore._native import lib
        original = lib.btc_type_new_slot(id(greenlet.greenlet))
        btcore.enable_spawn_tracking()
        spawn = importlib.reload(btcore.capture.spawn)
        assert spawn.spawn_backtrace(greenlet.greenlet(lambda: 0)) is not None
        spawn.disable_spawn_tracking()
        assert lib.btc_type_new_slot(id(greenlet.greenlet)) == original
        print("ok")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok"]


def test_nothing_is_resolved_at_creation(tracking):
    """Spawning stores raw frames only: the shared name cache stays empty
    until somebody looks."""
    btcore.cache.clear()
    gs = [gevent.Greenlet(park) for _ in range(100)]
    assert len(btcore.cache) == 0
    btcore.spawn_backtrace(gs[0]).frames()
    assert len(btcore.cache) > 0
