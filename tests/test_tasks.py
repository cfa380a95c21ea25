"""asyncio tasks in snapshot(), dump_all() and JSON (btcore/capture/tasks.py), on real
asyncio: tasks parked in sleep, a lock, a queue, a socket read, gather,
wait_for, a TaskGroup and a chain of tasks awaiting tasks.  Oracles: each
task's Task.get_stack() (its outermost coroutine frame, as asyncio reports
it) and the functions the program awaits through."""
from __future__ import annotations

import asyncio
import gc
import io
import json
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import greenlet
import pytest

import btcore
from btcore.capture.introspect import RUNNING, SUSPENDED, NOT_STARTED
from btcore.capture.tasks import TaskInfo

import conftest

WAIT_FOR_TASK = sys.version_info < (3, 12)   # asyncio.wait_for runs its awaitable in a task of its own


async def leaf():
    await asyncio.sleep(60)


async def gathers():
    await asyncio.gather(leaf(), leaf())


async def locked(lock):
    async with lock:
        pass


async def reads_queue(queue):
    await queue.get()


async def reads_socket(port):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await reader.read(1)
    finally:
        writer.close()


async def waits_for():
    await asyncio.wait_for(leaf(), 60)


async def grouped():
    async with asyncio.TaskGroup() as tg:
        tg.create_task(leaf(), name="member-1")
        tg.create_task(leaf(), name="member-2")


async def chain(depth):
    if depth == 0:
        await leaf()
    else:
        await asyncio.create_task(chain(depth - 1), name=f"chain-{depth - 1}")


async def scenario(probe):
    """Park one task of each kind, let them all reach their await, then call probe()."""
    lock = asyncio.Lock()
    await lock.acquire()
    accepted = []   # the server's writers, kept: 3.13+ closes a connection whose writer is collected
    server = await asyncio.start_server(lambda r, w: accepted.append(w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    made = {
        "sleep": asyncio.create_task(leaf(), name="sleeper"),
        "lock": asyncio.create_task(locked(lock), name="locked"),
        "queue": asyncio.create_task(reads_queue(asyncio.Queue()), name="queued"),
        "socket": asyncio.create_task(reads_socket(port), name="reader"),
        "gather": asyncio.create_task(gathers(), name="gathers"),
        "wait_for": asyncio.create_task(waits_for(), name="waits"),
        "group": asyncio.create_task(grouped(), name="grouped"),
        "chain": asyncio.create_task(chain(2), name="chain-2"),
        "new": None,
    }
    for _ in range(10):
        await asyncio.sleep(0.01)
    made["new"] = asyncio.create_task(leaf(), name="not-yet")   # runs at the next iteration
    try:
        return probe(made)
    finally:
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        server.close()


def run(probe):
    return asyncio.run(scenario(probe))


def _own_frames(info):
    frames, joins = info.backtrace.frames(), info.backtrace.joins()
    return frames[:joins[0]] if joins else frames


def _tasks(infos):
    return {info.task.get_name(): info for info in infos if isinstance(info, TaskInfo)}


def test_every_task_is_listed_with_its_state():
    def probe(made):
        return _tasks(btcore.snapshot()), {t.get_name() for t in asyncio.all_tasks()}

    tasks, expected = run(probe)
    assert set(tasks) == expected   # every pending task, no more
    assert tasks["not-yet"].state == NOT_STARTED
    assert tasks["sleeper"].state == SUSPENDED
    assert [info.state for info in tasks.values()].count(RUNNING) == 1
    assert tasks["sleeper"].name == "sleeper (leaf)"
    assert tasks["locked"].coroutine == "locked"


def test_own_frames_match_get_stack_and_the_awaits():
    """Each suspended task's own frames: innermost first, its outermost one
    is what Task.get_stack() returns; inside it the functions it awaits through."""
    def probe(made):
        infos = _tasks(btcore.snapshot())
        oracle = {name: [(f.f_code.co_qualname, f.f_lineno) for f in info.task.get_stack()]
                  for name, info in infos.items()}
        own = {name: [(f.function, f.line) for f in _own_frames(info)]
               for name, info in infos.items() if info.state == SUSPENDED}
        return oracle, own

    oracle, own = run(probe)
    for name, frames in own.items():
        assert frames[-1] == oracle[name][0], name
    functions = {name: [f for f, _ in frames] for name, frames in own.items()}
    assert functions["sleeper"] == ["sleep", "leaf"]
    assert functions["locked"] == ["Lock.acquire", "_ContextManagerMixin.__aenter__", "locked"]
    assert functions["queued"] == ["Queue.get", "reads_queue"]
    assert functions["reader"] == ["StreamReader._wait_for_data", "StreamReader.read", "reads_socket"]
    assert functions["gathers"] == ["gathers"]
    # 3.12+'s wait_for awaits the coroutine itself (a timeout scope), 3.11's wraps it in a task
    assert functions["waits"] == (["wait_for", "waits_for"] if WAIT_FOR_TASK else
                                  ["sleep", "leaf", "wait_for", "waits_for"])
    # 3.13+'s TaskGroup.__aexit__ waits in a helper of its own
    assert functions["grouped"] == (["TaskGroup.__aexit__", "grouped"] if sys.version_info < (3, 13) else
                                    ["TaskGroup._aexit", "TaskGroup.__aexit__", "grouped"])
    assert functions["chain-2"] == ["chain"]



@pytest.mark.skipif(not hasattr(asyncio, "capture_call_graph"), reason="asyncio.capture_call_graph is 3.14+")
def test_await_chains_match_capture_call_graph():
    """3.14+'s own view is the oracle: each suspended task's own frames are
    its call_stack (innermost first, same lines), the tasks awaiting it are
    the futures of its awaited_by (asyncio records those edges itself)."""
    def probe(made):
        infos = _tasks(btcore.snapshot())
        ours, oracle = {}, {}
        for name, info in infos.items():
            if info.state != SUSPENDED:
                continue
            graph = asyncio.capture_call_graph(info.task)
            ours[name] = ([(f.function, f.line) for f in _own_frames(info)],
                          sorted(t.get_name() for t in info.awaited_by))
            oracle[name] = ([(e.frame.f_code.co_qualname, e.frame.f_lineno) for e in graph.call_stack],
                            sorted(g.future.get_name() for g in graph.awaited_by))
        return ours, oracle

    ours, oracle = run(probe)
    assert len(ours) >= 14 and ours == oracle


async def deep(n):
    if n:
        await deep(n - 1)
    else:
        await asyncio.sleep(60)


def test_a_deep_await_chain_keeps_its_innermost_frames():
    """Bounded: a chain deeper than the capacity keeps its innermost frames
    (where the task waits) and says its outer ones were cut."""
    from btcore.capture.introspect import CAPACITY

    async def main():
        task = asyncio.create_task(deep(CAPACITY + 50), name="deep")
        await asyncio.sleep(0.01)
        info = _tasks(btcore.snapshot())["deep"]
        task.cancel()
        return info

    info = asyncio.run(main())
    functions = [f.function for f in info.backtrace.frames()]
    assert len(functions) == CAPACITY and info.backtrace.truncated
    assert functions[:2] == ["sleep", "deep"] and set(functions[1:]) == {"deep"}

class _RunningCoroutine:
    """A coroutine as coroutine_frames() reads one, running: its cr_await
    must not be read (3.11-3.12's getter misreads a running frame)."""
    cr_running = True

    def __init__(self, frame):
        self.cr_frame = frame

    @property
    def cr_await(self):
        raise AssertionError("cr_await of a running coroutine read")


def test_a_running_coroutines_await_is_not_read():
    """Guards coroutine_frames(): a running coroutine ends the chain at its
    own frame, its cr_await unread (the SIGSEGV of a snapshot from a
    collection inside a running task: 3.11 took a specialized call's inline
    cache for a RESUME and returned a word below the frame's stack)."""
    from btcore.capture.tasks import coroutine_frames
    here = sys._getframe()
    assert coroutine_frames(_RunningCoroutine(here)) == ([here], False)


def test_a_snapshot_inside_the_import_of_its_task_reader_leaves_tasks_out():
    """A dump run while the first snapshot imports btcore.capture.tasks (a
    signal's handler, here a trace function, runs between the module's
    lines) finds that module half made: it lists no tasks instead of
    failing (AttributeError: partially initialized module, before)."""
    r = subprocess.run([sys.executable, "-P", "-c", textwrap.dedent("""
        import asyncio, sys, btcore
        nested = []
        def local(frame, event, arg):
            if event == "line" and not nested and "TaskInfo" in frame.f_globals:   # partway through
                try:
                    nested.append([type(i).__name__ for i in btcore.snapshot()])
                except Exception as e:
                    nested.append(repr(e))
            return local
        def tracer(frame, event, arg):
            code = frame.f_code
            return local if code.co_name == "<module>" and code.co_filename.endswith("tasks.py") else None
        async def main():
            sys.settrace(tracer)
            infos = btcore.snapshot()   # imports the task reader
            sys.settrace(None)
            return [i.task.get_name() for i in infos if type(i).__name__ == "TaskInfo"]
        names = asyncio.run(main())
        print(nested, names)
    """)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "[['GreenletInfo']] ['Task-1']", r.stdout   # the dump inside: no tasks


def test_await_chain_follows_awaiters():
    """After its own frames, a task's stack holds the frames of the task awaiting
    it, and of the one awaiting that: through a task, gather, wait_for, a TaskGroup."""
    def probe(made):
        infos = btcore.snapshot()
        by_name = _tasks(infos)
        under = {name: (info.under.get_name() if isinstance(info.under, asyncio.Task) else None)
                 for name, info in by_name.items()}
        labels = {name: [label for _, label, _ in info.backtrace._parts()[1:]]
                  for name, info in by_name.items() if info.state == SUSPENDED}
        awaited = {name: sorted(t.get_name() for t in info.awaited_by) for name, info in by_name.items()}
        return under, labels, awaited

    under, labels, awaited = run(probe)
    assert labels["chain-0"] == ["awaited by chain-1 (chain):", "awaited by chain-2 (chain):"]
    assert under["chain-0"] == "chain-1" and under["chain-1"] == "chain-2"
    gathered = [name for name, above in under.items() if above == "gathers"]
    assert len(gathered) == 2 and awaited[gathered[0]] == ["gathers"]
    assert labels[gathered[0]] == ["awaited by gathers (gathers):"]
    assert under["member-1"] == under["member-2"] == "grouped"
    assert labels["member-1"] == ["awaited by grouped (grouped):"]
    waited = [name for name, above in under.items() if above == "waits"]
    if WAIT_FOR_TASK:
        assert len(waited) == 1 and labels[waited[0]] == ["awaited by waits (waits_for):"]
    else:
        assert not waited
    assert awaited["sleeper"] == [] and labels["sleeper"] == []


def test_dump_groups_tasks_and_draws_who_awaits_whom():
    def probe(made):
        text, data = io.StringIO(), io.StringIO()
        btcore.dump_all(text)
        btcore.dump_all(data, format="json")
        return text.getvalue(), json.loads(data.getvalue())

    text, doc = run(probe)
    # the two tasks gather runs, and the TaskGroup's two members: one stack each pair
    assert "2 tasks, suspended ===" in text
    assert "1 greenlet, 1 task, running ===" in text   # the main greenlet runs the main task
    tree = text[text.index("=== thread "):]
    lines = tree.splitlines()
    chain2 = next(i for i, line in enumerate(lines) if line.startswith("chain-2 (chain)"))
    assert lines[chain2 + 1].startswith("`- chain-1 (chain)")
    assert lines[chain2 + 2].startswith("   `- chain-0 (chain)")
    tasks = {entry["id"]: entry for entry in doc["tasks"]}
    names = {entry["id"]: entry["name"] for entry in doc["greenlets"]}
    assert set(tasks) <= set(names) and len(tasks) == (17 if WAIT_FOR_TASK else 16)
    chain0 = next(t for t in tasks.values() if names[t["id"]] == "chain-0 (chain)")
    assert [names[i] for i in chain0["awaited_by"]] == ["chain-1 (chain)"]
    assert chain0["coroutine"] == "chain"



def test_html_page_lists_tasks():
    """The HTML page embeds the JSON document: tasks are rows of its greenlet
    table, with their await edges in "tasks"."""
    import re

    from btcore.views.html import page

    def probe(made):
        return page(), {id(t): t.get_name() for t in asyncio.all_tasks()}

    html, names = run(probe)
    data = json.loads(re.search(r'<script type="application/json"[^>]*>(.*?)</script>', html, re.S).group(1))
    fields = data["greenlet_fields"]
    rows = [dict(zip(fields, row)) for row in data["greenlet_rows"]]
    listed = {row["id"] for row in rows if row["type"] == "_asyncio.Task"}
    assert listed == set(names)
    chain0 = next(t for t in data["tasks"] if names[t["id"]] == "chain-0")
    assert [names[i] for i in chain0["awaited_by"]] == ["chain-1"]


def test_a_task_whose_methods_fail_is_left_out():
    """A Task subclass whose own methods raise costs its entry, never the snapshot."""
    class Broken(asyncio.Task):
        def get_coro(self):
            raise RuntimeError("broken")

    async def main():
        broken = Broken(leaf(), name="broken")
        fine = asyncio.create_task(leaf(), name="fine")
        await asyncio.sleep(0.01)
        names = set(_tasks(btcore.snapshot()))
        broken.cancel()
        fine.cancel()
        return names

    names = asyncio.run(main())
    assert "fine" in names and "broken" not in names

def test_a_loop_in_another_thread():
    """Tasks of a loop running in another thread carry that thread; its
    running task (here in time.sleep) is read as the interpreter reports it."""
    started, stop = threading.Event(), threading.Event()

    async def busy():
        started.set()
        while not stop.is_set():
            time.sleep(0.005)

    async def other():
        parked = asyncio.create_task(leaf(), name="parked-there")
        await asyncio.sleep(0)
        await asyncio.create_task(busy(), name="busy-there")
        parked.cancel()

    thread = threading.Thread(target=asyncio.run, args=(other(),))
    thread.start()
    try:
        assert started.wait(10)
        tasks = _tasks(btcore.snapshot())
    finally:
        stop.set()
        thread.join()
    busy_info, parked = tasks["busy-there"], tasks["parked-there"]
    assert busy_info.thread_id == parked.thread_id == thread.ident
    assert busy_info.state == RUNNING and busy_info.python_only
    assert busy_info.backtrace.frames()[0].function.endswith("<locals>.busy")
    assert parked.state == SUSPENDED and not parked.python_only


def test_tasks_left_by_a_thread_that_ended():
    """A loop stopped in a thread that then ended leaves its pending tasks
    behind (3.14+ moves them from the thread's list to the interpreter's):
    they are still listed, with no thread."""
    loop = asyncio.new_event_loop()

    def leave_one():
        async def start():
            return asyncio.create_task(leaf(), name="left-behind")
        made.append(loop.run_until_complete(start()))

    made = []
    thread = threading.Thread(target=leave_one)
    thread.start()
    thread.join()
    try:
        tasks = _tasks(btcore.snapshot())
    finally:
        made[0].cancel()
        loop.run_until_complete(asyncio.gather(*made, return_exceptions=True))
        loop.close()
    assert tasks["left-behind"].state != RUNNING and tasks["left-behind"].thread_id is None


def test_ended_tasks_are_gone():
    async def main():
        await asyncio.create_task(asyncio.sleep(0))
    asyncio.run(main())
    assert not [info for info in btcore.snapshot() if isinstance(info, TaskInfo)]


# ---- creation ancestry (spawn tracking) ----

async def third_generation():
    await asyncio.sleep(60)


async def second_generation():
    async with asyncio.TaskGroup() as tg:
        tg.create_task(third_generation(), name="third")


async def first_generation():
    await asyncio.create_task(second_generation(), name="second")


def _ancestry(setup=None):
    """spawn chains of the three generations, read while they are parked."""
    async def main():
        if setup is not None:
            setup(asyncio.get_running_loop())
        first = asyncio.create_task(first_generation(), name="first")
        for _ in range(5):
            await asyncio.sleep(0)
        # (3.14+'s C all_tasks() leaves out pure-Python tasks: asyncio's Python one lists those)
        everything = asyncio.all_tasks() | getattr(asyncio.tasks, "_py_all_tasks", lambda: set())()
        tasks = {t.get_name(): t for t in everything}
        tasks["main"] = asyncio.current_task()
        chains = {name: btcore.spawn_chain(task) for name, task in tasks.items()}
        texts = {name: str(btcore.spawn_backtrace(task)) for name, task in tasks.items() if chains[name]}
        infos = _tasks(btcore.snapshot())
        dump = io.StringIO()
        btcore.dump_all(dump)
        texts["dump"] = dump.getvalue()
        first.cancel()
        return tasks, chains, texts, infos

    return asyncio.run(main())


def _site_functions(chain, generation):
    site = chain.links[generation][0]
    return [f.function for f in site.frames() if f.kind == "python"]


def test_three_generations_of_tasks_record_their_creators():
    btcore.enable_spawn_tracking()
    try:
        tasks, chains, texts, infos = _ancestry()
    finally:
        btcore.disable_spawn_tracking()
    third = chains["third"]
    # newest first: third made by second (TaskGroup.create_task), second by first, first by the main task
    creators = [ref() for _, _, ref in third.links]
    assert creators[:3] == [tasks["second"], tasks["first"], tasks["main"]]
    assert creators[3] is greenlet.getcurrent() and len(creators) == 4   # asyncio.run() made the main task
    assert _site_functions(third, 0)[:2] == ["BaseEventLoop.create_task", "TaskGroup.create_task"]
    # a site ends at its creating task's coroutine: the loop's frames below it are not repeated
    assert _site_functions(third, 0)[-1] == "second_generation"
    assert _site_functions(third, 1)[-1] == "first_generation"
    assert _site_functions(third, 2)[-1] == "_ancestry.<locals>.main"
    assert "test_three_generations_of_tasks_record_their_creators" in _site_functions(third, 3)   # the whole stack
    assert "spawned by <Task pending name='second'" in texts["third"]
    third_group = texts["dump"][texts["dump"].index("e.g. third (third_generation)"):]
    assert third_group.index("Spawned at:\n  by second (second_generation)") < third_group.index("=== ")
    assert infos["third"].spawned_by is tasks["second"] and infos["third"].spawn_chain.links == third.links
    assert infos["first"].spawned_by is infos["first"].spawn_chain.links[0][2]()


def test_a_sites_walk_ends_in_the_eval_loop_call_of_its_creator():
    """What bounds the native walk of a task's site (capture.c): the C-stack
    address of the eval-loop call running the creating coroutine (3.11: its
    _PyCFrame; 3.12+: the shim frame it pushed).  A frame run by a nested
    eval-loop call (through sorted(), a C function) lies deeper on the stack;
    a frame of another thread's chain has none."""
    from btcore._native import lib

    def address(frame):
        return lib.btc_test_eval_call_address(id(frame))

    async def coroutine():
        outer = sys._getframe()
        inner = []
        sorted([1, 2], key=lambda x: inner.append(address(sys._getframe())) or x)
        return address(outer), inner[0]

    outer, inner = asyncio.run(coroutine())
    assert 0 < inner < outer, (hex(inner), hex(outer))
    other = []
    thread = threading.Thread(target=lambda: other.append(sys._getframe()) or time.sleep(0.5))
    thread.start()
    while not other:
        time.sleep(0.01)
    assert address(other[0]) == 0   # not in the calling thread's chain
    thread.join()


def create_here():
    return asyncio.create_task(leaf())


def created_under_a():
    return create_here()


def created_under_b():
    return create_here()


def test_a_task_site_seen_before_is_not_taken_for_one_made_under_another_function():
    """Tasks made by one task at one place (spawn.c's sites seen before:
    the same stack depth, the same innermost instruction) under two
    functions in turn: each site names its own, the repeats of one are
    answered without a walk, the other never from its proof."""
    from btcore._native import ffi, lib

    makers = [(created_under_a, created_under_b)[i % 2] for i in range(64)] + [created_under_a] * 6 + \
             [(created_under_b, created_under_a)[i % 2] for i in range(20)]   # 64: calls specialized by then
    place = ffi.new("uintptr_t *")

    async def creator():
        made, places, hits = [], [], []
        for make in makers:
            made.append(make())
            hits.append(lib.btc_test_spawn_memo(place))
            places.append(place[0])
        for task in made:
            task.cancel()
        return made, places[64:], hits[64:]

    btcore.enable_spawn_tracking()
    try:
        made, places, hits = asyncio.run(creator())
    finally:
        btcore.disable_spawn_tracking()
    assert len(set(places)) == 1
    assert sum(hits[:6]) >= 3 and sum(hits[6:]) == 0, hits
    for make, task in zip(makers, made):
        site = btcore.spawn_chain(task).links[0][0]
        names = [f.function for f in site.frames() if f.kind == "python"]
        assert make.__name__ in names and {"created_under_a", "created_under_b"} - {make.__name__} - set(names)


def test_direct_construction_and_custom_factories_are_tracked():
    """The hook sits where every Task registers: Task(...) itself, any task factory,
    the pure-Python Task as well as the C one."""
    made = []

    def factory(loop, coro, **kwargs):
        # first and third pure-Python, second C (3.14's TaskGroup needs a C parent task)
        kind = asyncio.Task if len(made) % 2 else asyncio.tasks._PyTask
        task = kind(coro, loop=loop, **kwargs)
        made.append(task)
        return task

    btcore.enable_spawn_tracking()
    try:
        tasks, chains, _, infos = _ancestry(lambda loop: loop.set_task_factory(factory))
    finally:
        btcore.disable_spawn_tracking()
    assert made and all(chains[t.get_name()] is not None for t in made if not t.done())
    assert {type(t) for t in made} == {asyncio.Task, asyncio.tasks._PyTask}
    assert type(tasks["first"]) is type(tasks["third"]) is asyncio.tasks._PyTask
    assert [ref() for _, _, ref in chains["third"].links][:3] == [tasks["second"], tasks["first"], tasks["main"]]
    assert infos["third"].awaited_by == [tasks["second"]] and infos["second"].awaited_by == [tasks["first"]]
    # (a pure-Python task registers from its own __init__, 3.14+ through a function of asyncio's)
    site = _site_functions(chains["third"], 0)
    factory_at = next(i for i, f in enumerate(site) if f.endswith("<locals>.factory"))
    assert site[:factory_at] in (["Task.__init__"], ["_register_task", "Task.__init__"])
    assert _site_functions(chains["second"], 0)[0].endswith("<locals>.factory")   # a C task: the factory first


def test_tracking_off_records_nothing():
    tasks, chains, texts, infos = _ancestry()
    assert set(chains.values()) == {None} and list(texts) == ["dump"] and "Spawned at" not in texts["dump"]
    assert all(info.spawn_chain is None and info.spawned_by is None for info in infos.values())


def test_disable_restores_the_registry():
    import asyncio.tasks as asyncio_tasks
    name = "_all_tasks" if hasattr(asyncio_tasks, "_all_tasks") else "_scheduled_tasks"   # 3.11; 3.12-3.13
    registry = getattr(asyncio_tasks, name)
    btcore.enable_spawn_tracking()
    assert "add" in vars(registry)
    btcore.disable_spawn_tracking()
    assert "add" not in vars(registry)


def _registry_and_task_type():
    """asyncio's WeakSet registry, and a Task type that registers there
    (3.14+: only the pure-Python Task does; C tasks are hooked at tp_new)."""
    import asyncio.tasks as asyncio_tasks
    registry = asyncio_tasks._all_tasks if hasattr(asyncio_tasks, "_all_tasks") else asyncio_tasks._scheduled_tasks
    return registry, asyncio.tasks._PyTask if sys.version_info >= (3, 14) else asyncio.Task


def _entries_of(registry, task) -> list:
    return [ref for ref in registry.data if ref() is task]


def test_a_tracked_tasks_record_is_its_registry_entry():
    """The hook adds the task's record (a weak reference to it) to asyncio's
    registry as its entry, instead of calling WeakSet.add(): all_tasks()
    lists the task, and its death removes the entry and frees the record."""
    from btcore.capture.spawn import _counts
    registry, task_type = _registry_and_task_type()

    async def main():
        made = task_type(asyncio.sleep(60), loop=asyncio.get_running_loop(), name="entry")
        await asyncio.sleep(0)
        entries = _entries_of(registry, made)
        listed = made in asyncio.all_tasks() or made in getattr(asyncio.tasks, "_py_all_tasks", set)()
        made_by_me = btcore.spawn_chain(made).links[0][2]() is asyncio.current_task()
        made.cancel()
        await asyncio.gather(made, return_exceptions=True)
        return entries, listed, made_by_me, weakref.ref(made)

    btcore.enable_spawn_tracking()
    try:
        asyncio.run(main())   # first: the main greenlet's record (asyncio.run's task's creator), kept
        gc.collect()
        before = len(registry.data), _counts()[0]
        entries, listed, made_by_me, gone = asyncio.run(main())
    finally:
        btcore.disable_spawn_tracking()
    assert [type(e).__name__ for e in entries] == ["_SpawnRecord"]   # the record itself, and only it
    assert listed and made_by_me
    del entries
    gc.collect()
    assert gone() is None
    assert (len(registry.data), _counts()[0]) == before   # the entry went with the task, the record too


def test_a_task_made_while_the_registry_has_removals_pending_is_added_by_weakset():
    """While the registry is iterated, a dying task's entry waits in its
    pending removals, which WeakSet.add() commits first: the hook leaves
    that registration to add() and still records the task."""
    registry, task_type = _registry_and_task_type()
    if not hasattr(registry, "_pending_removals"):
        pytest.skip("3.14+'s WeakSet has no pending removals")

    class Gone:
        pass

    async def main():
        gone = Gone()
        entry = weakref.ref(gone)
        hash(entry)   # as a set's entry's is
        del gone
        registry._pending_removals.append(entry)   # a dead entry, as _remove leaves one
        made = task_type(asyncio.sleep(0), loop=asyncio.get_running_loop())
        state = list(registry._pending_removals), [type(e).__name__ for e in _entries_of(registry, made)]
        await made
        return state, btcore.spawn_chain(made)

    btcore.enable_spawn_tracking()
    try:
        (pending, entries), chain = asyncio.run(main())
    finally:
        btcore.disable_spawn_tracking()
    assert pending == [] and entries == ["ReferenceType"]   # committed, then WeakSet's own entry
    assert chain is not None


# ---- the watchdog on an asyncio loop (child processes, as in test_watchdog.py) ----

from test_watchdog import first_report, run_child, stuck_so  # noqa: E402,F401  (stuck_so: a fixture)

LOOP_WATCHED = r"""
    import asyncio

    async def blocked():
        globals()[sys.argv[3]]()

    async def main():
        with btcore.start_watchdog(threshold=0.2, file=sys.stderr) as dog:
            await asyncio.sleep(0.5)                               # idle: waits in the selector
            await asyncio.create_task(blocked(), name="blocker")   # one callback that does not return
            os.write(2, b"RETURNED\n")
            for _ in range(20000):                                 # busy, but callback after callback
                await asyncio.sleep(0)
            await asyncio.sleep(0.5)
        print("REPORTS", dog.reports, file=sys.stderr)

    asyncio.run(main())
"""

# The loops: asyncio's own, and uvloop's, written in C (libuv): its idle wait has no Python frame of its own.
LOOPS = ["asyncio", "uvloop"]


def on_loop(body, loop):
    """body run on `loop` (its asyncio.run(main()) replaced for uvloop)."""
    if loop == "asyncio":
        return body
    pytest.importorskip("uvloop", reason="uvloop is not installed")
    return body.replace("asyncio.run(main())", "import uvloop; uvloop.run(main())")


def outer_loop_frame(loop):
    """What names the loop's own frames in a report, outside the stuck task."""
    return "in BaseEventLoop._run_once" if loop == "asyncio" else "[loop.cpython-"


def stuck_seconds(loop):
    """How long a loop stays stuck: the report, due after 0.2 s, must come while it is.  1 s, and 3 s where
    the first report names frames slowly: under ASan on a slow machine it took longer than the rest of the
    second (ci16); on uvloop it also reads the DWARF of uvloop's 13 MB module, and came after the loop
    recovered 2 times in 40 on a loaded 2-core machine."""
    return 3.0 if conftest.UNDER_ASAN or loop == "uvloop" else 1.0


def assert_reported_only_while_stuck(err):
    """Every report came before RETURNED (none while idle after it), and the count the watchdog gives is theirs."""
    lines = err.splitlines()
    reports = [line for line in lines if " has not switched greenlets" in line or " still has not switched" in line]
    assert int(lines[-1].split()[-1]) == len(reports), err
    assert all(lines.index(line) < lines.index("RETURNED") for line in reports), err


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("function, innermost", [
    ("stuck_in_c", "stuck_busy_loop"),      # C code holding the GIL
    ("stuck_in_syscall", "stuck_sleep"),    # a blocking call, the GIL released
    ("stuck_in_python", None),              # a CPU loop
    ("time.sleep", None),                   # a blocking call of the standard library
])
def test_watchdog_reports_a_loop_stuck_in_one_callback(stuck_so, function, innermost, loop):
    """Guards the asyncio rules: an idle loop (in its selector, or in uvloop's
    libuv wait) and a loop running many short callbacks are not stuck; one
    stuck in a task is reported while stuck, with the task's coroutine and
    the blocking function in the stack."""
    if function == "time.sleep" and not conftest.INTERPRETER_HAS_SYMTAB:
        pytest.skip("stripped interpreter: the example names its static C functions")   # time_sleep
    if conftest.UNDER_QEMU and sys.version_info >= (3, 12):
        # a coroutine's frame lies in its object, on the heap: the signal-context reader reads it only after
        # probing it with process_vm_readv, which qemu-user does not emulate (the chain ends, noted partial)
        pytest.skip("qemu-user: process_vm_readv is not emulated: a coroutine's frame is not read in a signal")
    body = on_loop(LOOP_WATCHED, loop)
    if function == "time.sleep":
        body = body.replace("globals()[sys.argv[3]]()", "time.sleep(seconds)")
    err = run_child(body, stuck_so, seconds=stuck_seconds(loop), args=[function])
    lines = err.splitlines()
    report = first_report(err)
    assert lines.index(report[0]) < lines.index("RETURNED"), err   # written while stuck
    blocked = next(i for i, line in enumerate(report) if "in blocked" in line)
    if innermost:
        assert next(i for i, line in enumerate(report) if f"] {innermost}+" in line) < blocked, report
    elif function == "stuck_in_python":
        assert any("in stuck_in_python" in line for line in report[:blocked]), report
    else:
        assert any("time_sleep" in line or "clock_nanosleep" in line for line in report[:blocked]), report
    assert any(outer_loop_frame(loop) in line for line in report[blocked:]), report
    assert_reported_only_while_stuck(err)


C_CALLBACK_WATCHED = r"""
    import asyncio

    async def main():
        with btcore.start_watchdog(threshold=0.2, file=sys.stderr) as dog:
            await asyncio.sleep(0.5)                                   # idle
            asyncio.get_running_loop().call_soon(time.sleep, seconds)  # a callback in C: no Python frame
            await asyncio.sleep(0)                                     # it runs before this task again
            os.write(2, b"RETURNED\n")
            await asyncio.sleep(0.5)                                   # idle
        print("REPORTS", dog.reports, file=sys.stderr)

    asyncio.run(main())
"""


@pytest.mark.parametrize("loop", LOOPS)
def test_watchdog_reports_a_loop_stuck_in_a_callback_written_in_c(stuck_so, loop):
    """Guards the rule for uvloop's wait: a C callback (time.sleep given to
    call_soon) that blocks uvloop's loop leaves no Python frame either, so the
    innermost one is the frame that runs the loop, as when it waits for
    events; it is stuck all the same (its sleep is called through the
    interpreter, not from the loop's own code), and reported while stuck."""
    if conftest.UNDER_QEMU and sys.version_info >= (3, 12):
        pytest.skip("qemu-user: process_vm_readv is not emulated: a coroutine's frame is not read in a signal")
    err = run_child(on_loop(C_CALLBACK_WATCHED, loop), stuck_so, seconds=stuck_seconds(loop))
    report = first_report(err)
    assert err.splitlines().index(report[0]) < err.splitlines().index("RETURNED"), err   # written while stuck
    assert any("clock_nanosleep" in line or "time_sleep" in line for line in report[1:4]), report
    assert_reported_only_while_stuck(err)
