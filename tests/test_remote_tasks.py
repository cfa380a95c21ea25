"""asyncio tasks in the dump of another process (btcore/remote/tasks.py,
native/remote/rtasks.c).  Oracle: the target's own dump_all() (whose
tasks tests/test_tasks.py checks against Task.get_stack() and, on 3.14+,
asyncio.capture_call_graph()), written while its tasks were parked as they
are when the outside dump reads them: names, states, frames, awaiters and
the tree must agree.  The layout table is pinned here against this
version's own objects (each sid lane runs it on its version)."""
import ctypes
import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

import conftest

from btcore.symbols import asyncio_debug

from btcore.remote import names as remote_names
from btcore._native import ffi, lib

pytestmark = pytest.mark.skipif(not conftest.DUMPS_OTHER_PROCESSES, reason=conftest.NO_DUMP_HERE)
HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "fixtures", "asyncio_target.py")
WAIT = 120   # seconds: hang detection only
KNOWN = sys.version_info[:2] in ((3, 11), (3, 13), (3, 14), (3, 15))


def start(folder, *args, env=None):
    oracle, ready = folder / "oracle.json", folder / "ready"
    proc = subprocess.Popen([sys.executable, TARGET, str(oracle), str(ready), *args], env=env)
    conftest.wait_until_ready(proc, ready, WAIT)
    return proc, json.loads(oracle.read_text())


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    proc, inside = start(tmp_path_factory.mktemp("tasks"), "8")
    try:
        yield proc, inside
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    proc, inside = start(tmp_path_factory.mktemp("hostile"), "0", "hostile")
    try:
        yield proc, inside
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)


def dump(pid, *args) -> str:
    """`python -m btcore dump PID args` (pid None: the args name a core file)."""
    where = [] if pid is None else [str(pid)]
    done = subprocess.run([sys.executable, "-m", "btcore", "dump", *where, *args], capture_output=True,
                          text=True, timeout=WAIT, cwd="/")
    assert done.returncode == 0, done.stderr
    return done.stdout


def tasks_of(doc) -> dict:
    """name -> (state, its stack's Python frames (function, file, line), the name it is drawn under, the names
    awaiting it) for every task of a dump's JSON."""
    stacks = {s["id"]: s for s in doc["stacks"]}
    entries = {g["id"]: g for g in doc["greenlets"]}
    out = {}
    for task in doc["tasks"]:
        g = entries[task["id"]]
        frames = tuple((f["function"], f["file"], f["line"]) for f in stacks[g["stack"]]["frames"]
                       if f["kind"] == "python")
        under = entries[g["under"]]["name"] if g["under"] in entries else None
        awaiting = tuple(entries[a]["name"] for a in task["awaited_by"] if a in entries)
        out[g["name"]] = (g["state"], frames, under, awaiting)
    return out


def parked_tasks(doc) -> dict:
    """tasks_of(doc) less the main task (it moved on after the inside view)."""
    return {name: entry for name, entry in tasks_of(doc).items() if not name.endswith(" (main)")}


@pytest.mark.skipif(not KNOWN, reason="btcore knows the asyncio objects of 3.11 and 3.13-3.15")
def test_outside_tasks_equal_dump_all_inside(target):
    proc, inside = target
    outside = json.loads(dump(proc.pid, "--format", "json"))
    expected = parked_tasks(inside)
    assert {"sleeper (leaf)", "locked (locked)", "queued (reads_queue)", "gatherer (gathers)",
            "chain-top (chain)", "chain-0 (chain)", "grouper (grouped)", "member-0 (leaf)", "waiter (waits_for)"} <= set(expected)
    assert expected["member-0 (leaf)"][2:] == expected["member-1 (leaf)"][2:] == ("grouper (grouped)",
                                                                                  ("grouper (grouped)",))
    waited = [entry for entry in expected.values() if entry[3] == ("waiter (waits_for)",)]
    assert len(waited) == (1 if sys.version_info < (3, 12) else 0)   # 3.12+'s wait_for awaits the coroutine itself
    assert expected["watched (leaf)"][3] == ()   # a method of an object, not a TaskGroup's, is no await
    assert parked_tasks(outside) == expected
    # the nine parked, gather's two, the group's two, the chain's three, extra, wait_for's (3.11)
    assert len(expected) == 9 + 2 + 2 + 3 + 8 + len(waited)


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="3.11's task types are static (found in _asyncio's data)")
@pytest.mark.skipif(not shutil.which("strip"), reason="binutils' strip is not installed (it strips a copy)")
def test_tasks_are_listed_when_asyncio_is_stripped_of_its_local_symbols(tmp_path):
    # guards: _static_types() in btcore/remote/tasks.py.  A distribution's _asyncio (Debian's) keeps no
    # .symtab, so TaskType and FutureType have no symbol there: a copy stripped as Debian strips it
    # shadows this interpreter's own, and the outside dump must list the same tasks as dump_all().
    import importlib.util
    original = importlib.util.find_spec("_asyncio").origin   # not imported: 3.11's _asyncio imported before
    folder = tmp_path / "stripped"                            # asyncio has no current task
    folder.mkdir()
    copy = folder / os.path.basename(original)
    subprocess.run(["strip", "--strip-unneeded", "-o", str(copy), original], check=True)
    assert b"TaskType" not in subprocess.run(["nm", str(copy)], capture_output=True).stdout
    proc, inside = start(tmp_path, "0", env={**os.environ, "PYTHONPATH": str(folder)})
    try:
        with open(f"/proc/{proc.pid}/maps") as maps:
            assert str(copy) in maps.read()   # the stripped copy is the one the target runs
        expected = parked_tasks(inside)
        assert len(expected) >= 9
        assert parked_tasks(json.loads(dump(proc.pid, "--format", "json"))) == expected
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)


def spawn_sites(doc) -> dict:
    """{the names of a stack's members: its spawn sites as (count, creators, Python frames (function, line))}
    for every stack of a dump's JSON with spawn sites but the main task's (it moved on after the inside view)."""
    members = {}
    for g in doc["greenlets"]:
        members.setdefault(g["stack"], []).append(g["name"])
    return {tuple(sorted(members[s["id"]])): sorted(   # (sites of equal counts come in the order their members do)
        (site["count"], sorted((c["name"], c["count"]) for c in site["spawners"]),
         [(f["function"], f["line"]) for f in site["frames"] if f["kind"] == "python"]) for site in s["spawn_sites"])
            for s in doc["stacks"] if s["id"] in members and s["spawn_sites"]
            and not any(n.endswith(" (main)") for n in members[s["id"]])}


@pytest.mark.skipif(not KNOWN, reason="btcore knows the asyncio objects of 3.11 and 3.13-3.15")
def test_outside_spawn_sites_of_tasks_equal_dump_all_inside(target):
    # guards: spawn chains read from outside (native/remote/rspawn.c, btcore/remote/spawn.py): every group's
    # spawn sites, their counts, creators and frames over the generations, as dump_all() gave them inside.
    proc, inside = target
    expected = spawn_sites(inside)
    chained = [sites for sites in expected.values() if sites and any(f == "chain" for _, _, frames in sites
                                                                       for f, _ in frames)]
    assert chained, "no task spawned by a task inside"
    assert all(sites for names, sites in expected.items() if any("(leaf)" in n for n in names)), expected
    assert spawn_sites(json.loads(dump(proc.pid, "--format", "json"))) == expected


@pytest.mark.skipif(not KNOWN, reason="btcore knows the asyncio objects of 3.11 and 3.13-3.15")
def test_outside_text_groups_and_draws_tasks_as_inside(target):
    proc, _ = target
    text = dump(proc.pid)
    assert " tasks in 1 thread," in text.splitlines()[0]
    assert "=== stack 1: 10 tasks, suspended ===" in text   # the sleeper, the watched one and the eight extra ones
    assert "  awaited by chain-1 (chain):" in text
    tree = text[text.index("=== thread "):]
    assert "chain-top (chain)  suspended" in tree and "`- chain-0 (chain)  suspended" in tree
    assert "unknown thread" not in text   # every loop's thread found (3.11: by its frames' self)


@pytest.mark.skipif(not KNOWN, reason="btcore knows the asyncio objects of 3.11 and 3.13-3.15")
@pytest.mark.skipif(conftest.UNDER_ASAN, reason="gcore writes ASan's reserved shadow and heap: a 71 GB core")
def test_tasks_of_a_core_file_equal_the_live_ones(target, tmp_path):
    # guards: a core file of an asyncio program (gdb's gcore) lists its tasks, their states, await chains, who
    # awaits whom and where each was spawned as dump_all() did inside the living process, and draws the same tree.
    if not shutil.which("gcore"):
        pytest.skip("gcore (gdb) is not installed")
    proc, inside = target
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}   # no ASan in gdb (ci/asan.sh)
    subprocess.run(["gcore", "-o", str(tmp_path / "core"), str(proc.pid)], check=True, capture_output=True,
                   timeout=WAIT, env=env)
    core = str(tmp_path / f"core.{proc.pid}")
    doc = json.loads(dump(None, "--core", core, "--format", "json"))
    assert parked_tasks(doc) == parked_tasks(inside)
    assert spawn_sites(doc) == spawn_sites(inside)   # the spawn records, read from the core as from the process
    text = dump(None, "--core", core)
    assert " tasks in 1 thread," in text.splitlines()[0] and "  awaited by chain-1 (chain):" in text
    assert "`- chain-0 (chain)  suspended" in text[text.index("=== thread "):]


@pytest.mark.skipif(not KNOWN, reason="btcore knows the asyncio objects of 3.11 and 3.13-3.15")
def test_a_cycle_in_an_await_chain_is_cut_with_a_note(hostile):
    proc, _ = hostile
    doc = json.loads(dump(proc.pid, "--format", "json"))
    entries = {g["name"]: g for g in doc["greenlets"]}
    stacks = {s["id"]: s for s in doc["stacks"]}
    for name in ("self-loop (looped)", "two-loop (looped)"):
        stack = stacks[entries[name]["stack"]]
        assert stack["error"] == "its await chain loops"
        assert 1 <= len(stack["frames"]) <= 3   # each coroutine once before the loop is seen


@pytest.mark.skipif(not KNOWN, reason="btcore knows the asyncio objects of 3.11 and 3.13-3.15")
def test_absurd_names_are_bounded_and_escaped(hostile):
    proc, inside = hostile
    text = dump(proc.pid)
    names = {g["name"] for g in json.loads(dump(proc.pid, "--format", "json"))["greenlets"]}
    cut = "L" * (remote_names.MAX_NAME - 3) + "... (leaf)"
    assert cut in names
    assert "Task (leaf)" in names   # 100,000 characters: past what a dump reads of a name
    assert "Task (looped)" in names   # bent-name's name points nowhere
    assert "evil\\n=== stack 1: 9 tasks ===\\x1b[2J (leaf)" in names
    assert not any(line.startswith("=== stack 1: 9 tasks") for line in text.splitlines())
    healthy = {name: entry for name, entry in parked_tasks(inside).items()
               if name in names and not name.endswith("-loop (looped)")}
    assert {"sleeper (leaf)", "chain-0 (chain)"} <= set(healthy)
    outside = parked_tasks(json.loads(dump(proc.pid, "--format", "json")))
    assert {name: outside[name] for name in healthy} == healthy


# ---- the layout table, pinned to this version's own objects ----

def layout():
    lay = ffi.new("btc_remote_tasklayout *")
    assert lib.btc_remote_task_layout_of(sys.hexversion, lay) == 0
    return lay


def frame_layout():
    """The interpreter-frame offsets of this build (3.11's known table, else what btcore compiled in)."""
    frames = ffi.new("btc_remote_layout *")
    if lib.btc_remote_layout_compiled(frames) != 0:
        assert lib.btc_remote_layout_of(sys.hexversion, frames) == 0
    return frames


def word(address: int) -> int:
    return ctypes.c_uint64.from_address(address).value


def awaited_by_the_table(lay, coro) -> int:
    """What rtasks.c's awaited() reads as coro's awaited object (its frame suspended in an await)."""
    frame = id(coro) + lay.gen_iframe
    if lay.frame_stackpointer >= 0:
        top = word(frame + lay.frame_stackpointer)
    else:
        top = frame + lay.frame_localsplus + 8 * ctypes.c_int32.from_address(frame + lay.frame_stacktop).value
    return word(top - 8 * lay.yield_from_depth) & ~3


@pytest.mark.skipif(not KNOWN, reason="btcore knows the asyncio objects of 3.11 and 3.13-3.15")
def test_the_task_layout_is_this_versions():
    import asyncio
    import functools
    lay = layout()
    state = lambda coro: ctypes.c_int8.from_address(id(coro) + lay.gen_frame_state).value  # noqa: E731
    seen = {}

    async def inner(fut):
        await fut

    async def outer(fut):
        seen["running"] = state(asyncio.current_task().get_coro())
        await inner(fut)

    async def awaits(task):
        await task

    async def main():
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        coro = outer(fut)
        seen["created"] = state(coro)
        task = asyncio.create_task(coro, name="pinned")
        waiter = asyncio.create_task(awaits(task))
        for _ in range(3):
            await asyncio.sleep(0)
        assert word(id(task) + lay.task_coro) == id(coro)
        assert word(id(task) + lay.task_name) == id(task.get_name())
        assert word(id(task) + lay.fut_loop) == id(loop)
        assert ctypes.c_int32.from_address(id(task) + lay.fut_state).value == 0   # PENDING
        assert word(id(coro) + lay.gen_qualname) == id(coro.__qualname__)
        assert word(id(coro) + lay.gen_iframe + frame_layout().frame_executable) & ~3 == id(coro.cr_code)
        assert state(coro) == (lay.frame_suspended if lay.resume_opcode else lay.frame_yield_from)
        assert awaited_by_the_table(lay, coro) == id(coro.cr_await)
        wakeup = word(id(task) + lay.fut_callback0)
        assert word(wakeup + 8) == id(type(task._callbacks[0][0])) and word(wakeup + 24) == id(waiter)
        task.add_done_callback(print)
        assert word(word(id(task) + lay.fut_callbacks) + 8) == id(list)
        method, partial = fut.set_result, functools.partial(print, fut)   # a bound method, a partial's arguments
        assert word(id(method) + lay.method_self) == id(fut) and word(id(partial) + lay.partial_args) == id(partial.args)
        assert word(id(coro) + lay.gen_iframe + lay.frame_localsplus) & ~3 == id(fut)   # the first local
        if lay.thread_running_loop and sys.version_info < (3, 14):
            ctypes.pythonapi.PyThreadState_Get.restype = ctypes.c_void_p
            assert word(ctypes.pythonapi.PyThreadState_Get() + lay.thread_running_loop) == id(loop)
        fut.set_result(None)
        await task
        assert ctypes.c_int32.from_address(id(task) + lay.fut_state).value != 0
        await waiter

    asyncio.run(main())
    assert seen["created"] == lay.frame_created and seen["running"] == lay.frame_executing
    if sys.version_info[:2] == (3, 11):
        import dis
        assert (lay.resume_opcode, lay.resume_quick) == (dis.opmap["RESUME"], dis._all_opmap["RESUME_QUICK"])


def test_an_asyncio_debug_section_is_read_without_pyelftools(tmp_path):
    # guards: the offsets of a .AsyncioDebug section (compiled here, as _asynciomodule.c declares it) are read by
    # btcore's own ELF reader, in an install without pyelftools (a test extra only), as pyelftools reads them.
    src, so = tmp_path / "debug.c", tmp_path / "debug.so"
    values = [8 * i + 3 for i in range(len(asyncio_debug.FIELDS))]
    src.write_text('__attribute__((used, section(".AsyncioDebug"))) const unsigned long long offsets[] = {'
                   + ", ".join(map(str, values)) + "};\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    script = ("import sys; sys.modules['elftools'] = None\n"   # (an import of it fails)
              "from btcore.symbols import asyncio_debug\n"
              f"print(list(asyncio_debug.offsets({str(so)!r}).values()), asyncio_debug.offsets({sys.executable!r}))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=WAIT, cwd="/")
    assert done.returncode == 0, done.stderr
    from elftools.elf.elffile import ELFFile
    with open(so, "rb") as f:
        oracle = list(struct.unpack(f"={len(values)}Q", ELFFile(f).get_section_by_name(".AsyncioDebug").data()))
    here = "None" if sys.version_info < (3, 14) else ""   # the interpreter's own section is 3.14's
    assert done.stdout.startswith(f"{oracle} {here}") and oracle == values


@pytest.mark.skipif(sys.version_info < (3, 14), reason=".AsyncioDebug is 3.14+'s")
def test_the_asyncio_debug_section_agrees_with_the_table():
    import _asyncio
    lay = layout()
    files = [getattr(_asyncio, "__file__", None) or sys.executable]   # 3.15: built into the interpreter
    offsets = next(o for o in map(asyncio_debug.offsets, files) if o)
    assert (offsets["task_coro"], offsets["task_name"]) == (lay.task_coro, lay.task_name)
    from elftools.elf.elffile import ELFFile   # an independent reader of the section
    with open(next(f for f in files if asyncio_debug.offsets(f)), "rb") as f:
        data = ELFFile(f).get_section_by_name(asyncio_debug.SECTION).data()
    assert list(offsets.values()) == list(struct.unpack_from(f"={len(offsets)}Q", data))
