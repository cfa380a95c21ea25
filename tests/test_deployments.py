"""Real deployments (issue 24): gunicorn + Flask with a gevent worker, and an
eventlet program, each run in its own process on loopback under a small
bounded load from the test, dumped by signal and through btcore's web view.

The targets: tests/fixtures/flask_app.py + gunicorn_conf.py and
tests/fixtures/eventlet_app.py, driven by tests/fixtures/deployment.py.  The
oracles come from the targets themselves, not from btcore: the worker writes
the OS thread's ident as threading knew it before patching, the names of the
functions that spawn are the fixture's own, the eventlet program gives the
ids of the green threads its handler made.  Each target runs once per module
(the dumps every test reads are taken in one run); every wait has a deadline.
"""
import json
import os
import re
import sys
import threading

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
import deployment  # noqa: E402  (tests/fixtures)

MAIN_THREAD = "MainThread"     # the OS thread's name as threading knew it before patching
LOAD = ["/io", "/sleep", "/convoy", "/cpu", "/fanout"]
LOAD_THREADS, LOAD_ROUNDS = 4, 5                    # 100 requests beside the dumps
GROUP_EACH = 3                                      # /group: greenlets per site
PARKED = 20                                         # /park
WATCHDOG_S, STUCK_S = 0.3, 1.0                      # reports at 0.3 and 0.6 s of one stuck call

# ---- reading dumps (dump_all's text) ----

_PY_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line \d+, in (?P<function>\S+)$')
_STACK_HEADER = re.compile(r"^=== stack \d+: (?P<count>\d+) greenlets?, ")
_THREAD_LABELS = re.compile(r"^(?:  threads?: (?P<group>.*)|=== thread (?P<tree>.*): \d+ greenlets? ===)$")


class Section:
    """One stack of the dump: its header, its stack, its "Spawned at:" part."""

    def __init__(self, lines):
        self.header = lines[0]
        # "Spawned at:" today; a group listing several sites may head each one with its count
        spawn_at = next((i for i, line in enumerate(lines) if line.startswith("Spawned at")), len(lines))
        self.stack, self.spawn = lines[1:spawn_at], lines[spawn_at + 1:]
        match = _STACK_HEADER.match(self.header)   # ungrouped dumps name one greenlet instead
        self.count = int(match.group("count")) if match else 1

    def functions(self, part):
        """(file basename, function's last dotted name) of the Python frames of a part."""
        found = (_PY_FRAME.match(line) for line in part)
        return [(os.path.basename(m.group("file")), m.group("function").rpartition(".")[2]) for m in found if m]

    def calls(self, part, function) -> bool:
        return any(name == function for _, name in self.functions(part))


def sections(text):
    """The dump's stacks (text before its first "=== thread" line)."""
    out, current = [], None
    for line in text.splitlines():
        if line.startswith("=== thread "):
            break
        if line.startswith("=== stack "):
            current = [line]
            out.append(current)
        elif current is not None:
            current.append(line)
    return [Section(lines) for lines in out]


def thread_labels(text):
    """Every thread label of a text dump: those of the stacks' headers and of the tree."""
    labels = []
    for line in text.splitlines():
        match = _THREAD_LABELS.match(line)
        if match and match.group("group") is not None:
            labels.extend(_split_labels(match.group("group")))
        elif match:
            labels.append(match.group("tree"))
    return labels


def _split_labels(joined):
    """"A (0x1), B (0x2) (+1 more)" -> ["A (0x1)", "B (0x2)"]."""
    return re.findall(r"[^,]+? \(0x[0-9a-f]+\)|unknown thread", joined)


def tree(text):
    """{node line: parent node line (None for a thread's top)} of the dump's tree,
    node lines without their drawing ("|- ", "`- ", indents of 3)."""
    parents, path = {}, []
    in_tree = False
    for line in text.splitlines():
        if line.startswith("=== thread "):
            in_tree, path = True, []
            continue
        if not in_tree or not line.strip():
            continue
        label = line.lstrip("|`- ")
        depth = (len(line) - len(label)) // 3
        del path[depth:]
        parents[label] = path[-1] if path else None
        path.append(label)
    return parents


def node(parents, name):
    """The tree's node line of the greenlet named name (a node line is its name, two spaces, ...)."""
    found = [label for label in parents if label.startswith(name + "  ")]
    assert len(found) == 1, f"{len(found)} tree nodes named {name!r}: {list(parents)}"
    return found[0]


def watchdog_episodes(text):
    """The watchdog's stuck episodes: each a list of reports (lists of lines),
    the last one its "switched again" line."""
    episodes, reports = [], []
    for line in text.splitlines():
        if line.startswith("btcore watchdog: "):
            reports.append([])
        if reports:
            reports[-1].append(line)
        if line.startswith("btcore watchdog: ") and "switched again" in line:
            episodes.append(reports)
            reports = []
    return episodes


# ---- gunicorn + Flask ----


@pytest.fixture(scope="module")
def gunicorn_run(tmp_path_factory):
    """gunicorn + Flask under load: the stuck call first (the watchdog's
    reports), then while 100 requests run, a 3-generation chain, a group from
    two sites and 20 parked greenlets, dumped by signal and by the web view."""
    for module in ("gevent", "gunicorn", "flask"):   # gunicorn's gevent worker serving Flask
        pytest.importorskip(module, reason=f"pip install '.[test]': the gunicorn target needs {module}")
    out = tmp_path_factory.mktemp("gunicorn")
    run = {}
    with deployment.Gunicorn(out, watchdog=WATCHDOG_S) as target:
        run["info"] = target.info
        target.get_ok(f"/stuck?seconds={STUCK_S}")
        path = os.path.join(out, "watchdog.txt")
        target.wait_for(lambda: "switched again" in _read(path), "watchdog's 'switched again' line")
        run["watchdog"] = _read(path)

        loaded = []
        load = threading.Thread(target=lambda: loaded.extend(target.load(LOAD, LOAD_THREADS, LOAD_ROUNDS)))
        chained = []
        chain = threading.Thread(target=lambda: chained.append(target.get("/chain")))
        load.start()
        chain.start()
        try:
            target.get_ok(f"/group?n={GROUP_EACH}")
            target.get_ok(f"/park?n={PARKED}")
            target.wait_for(lambda: target.status() == {"chain": 1, "group": 2 * GROUP_EACH, "park": PARKED},
                            "greenlets parked")
            run["signal"] = target.signal_dump()
            run["web_text"] = target.get_ok("/btcore/?format=text").decode()
            run["web_json"] = json.loads(target.get_ok("/btcore/?format=json"))
        finally:
            target.get("/release")
            chain.join(deployment.REQUEST_S)
            load.join(deployment.REQUEST_S * LOAD_ROUNDS)
        run["chain"], run["load"] = chained, loaded
    return run


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def test_gunicorn_serves_every_request(gunicorn_run):
    assert gunicorn_run["chain"] == [(200, b"joined")]
    assert gunicorn_run["load"] == [200] * (len(LOAD) * LOAD_ROUNDS)


@pytest.mark.parametrize("dump", ["signal", "web_text"])
def test_gunicorn_thread_label_is_the_os_thread(gunicorn_run, dump):
    """Item 1: the worker's thread is MainThread with its OS ident (not "?" and
    the id of whichever greenlet ran the dump), the same in the signal dump
    and on the web page; every thread named (threadpool threads too)."""
    want = f"{MAIN_THREAD} (0x{gunicorn_run['info']['ident']:x})"
    text = gunicorn_run[dump]
    labels = thread_labels(text)
    assert f"=== thread {want}: " in text, labels
    chain = [s for s in sections(text) if s.calls(s.stack, "route_chain")]
    assert chain and all(_thread_line(s) == f"  thread: {want}" for s in chain), [_thread_line(s) for s in chain]
    assert not _unnamed(labels), labels


def _thread_line(section):
    """The "  thread: ..." line of a section's header part (it precedes the stack)."""
    return next((line for line in section.stack if line.startswith("  thread")), None)


def _unnamed(labels):
    return [label for label in labels if label.startswith("? ") or label == "unknown thread"]


def test_gunicorn_json_threads_are_os_threads(gunicorn_run):
    doc, ident = gunicorn_run["web_json"], gunicorn_run["info"]["ident"]
    threads = {t["id"]: t["name"] for t in doc["threads"]}
    assert threads.get(ident) == MAIN_THREAD, doc["threads"]
    assert None not in threads and None not in threads.values(), doc["threads"]
    running_here = [g for g in doc["greenlets"] if g["state"] == "running" and g["thread_id"] == ident]
    assert len(running_here) == 1, "the greenlet serving the page runs in the worker's thread"


def test_gunicorn_thread_label_stable_across_dumps(gunicorn_run):
    def main_labels(text):
        return {label for label in thread_labels(text) if label.startswith(f"{MAIN_THREAD} ")}
    assert main_labels(gunicorn_run["signal"]) == main_labels(gunicorn_run["web_text"])
    assert len(main_labels(gunicorn_run["signal"])) == 1


@pytest.mark.parametrize("dump", ["signal", "web_text"])
def test_gunicorn_spawn_chain_of_three_generations_complete(gunicorn_run, dump):
    """Item 2, default settings: chain_third's spawn chain holds the three
    spawn points the handler made (chain_second, chain_first, route_chain),
    the request's own stack below the handler down to gunicorn's handle()
    (where a truncated copy stopped: handle_request), and the request
    greenlet's spawn in gevent's server (do_handle): nothing truncated."""
    leaf = [s for s in sections(gunicorn_run[dump]) if s.calls(s.stack, "chain_third")]
    assert len(leaf) == 1, [s.header for s in sections(gunicorn_run[dump])]
    spawn = leaf[0].spawn
    functions = leaf[0].functions(spawn)
    for site in ("chain_second", "chain_first", "route_chain"):
        assert ("flask_app.py", site) in functions, "\n".join(spawn)
    assert ("base_async.py", "handle") in functions, "\n".join(spawn)
    assert ("baseserver.py", "do_handle") in functions, "\n".join(spawn)
    assert not [line for line in spawn if "truncated" in line], "\n".join(spawn)


def test_gunicorn_group_lists_distinct_spawn_sites(gunicorn_run):
    """Item 4: greenlets with one stack, spawned through one shared helper
    from site_alpha and from site_beta: the stacks they are grouped in list
    both sites (one group listing both, or a group per site), all 6 counted."""
    grouped = [s for s in sections(gunicorn_run["signal"])
               if s.calls(s.stack, "parked_wait") and s.calls(s.spawn, "spawn_through")]
    assert sum(s.count for s in grouped) == 2 * GROUP_EACH, [s.header for s in grouped]
    sites = {name for s in grouped for _, name in s.functions(s.spawn)}
    assert {"site_alpha", "site_beta"} <= sites, "\n\n".join("\n".join(s.spawn) for s in grouped)


def test_gunicorn_watchdog_second_report_shorter(gunicorn_run):
    """Item 5: one stuck call (/stuck, a sleep that does not switch): the
    first report has the full stack (route_stuck in it), the next one is
    shorter, and the "switched again" line ends the episode.  Episodes of
    other stalls (a slow boot, say) are not this one."""
    stuck = [reports for reports in watchdog_episodes(gunicorn_run["watchdog"])
             if any("route_stuck" in line for line in reports[0])]
    assert len(stuck) == 1 and len(stuck[0]) >= 3, gunicorn_run["watchdog"]   # 2 reports, "switched again"
    first, second = stuck[0][:2]
    assert len(second) < len(first), "\n".join(second)


def test_gunicorn_register_over_its_sigusr1_refused(gunicorn_run):
    """Item 6: register_dump_signal(SIGUSR1) in a gunicorn worker, whose own
    handler (log reopening) is installed: refused with a RuntimeError that
    names that handler, and gunicorn's handler stays."""
    info = gunicorn_run["info"]
    assert info["usr1_handler"].endswith("handle_usr1"), info
    assert (info["usr1"], info["usr1_error"]) == ("refused", "RuntimeError"), info
    assert "handle_usr1" in info["usr1_message"], info
    assert info["usr1_handler_kept"], info


# ---- eventlet ----


@pytest.fixture(scope="module")
def eventlet_run(tmp_path_factory):
    """The eventlet program: a handler's two generations of green threads
    (the handler joins them) and 3 GreenPool workers parked, dumped by signal
    and by the web view."""
    pytest.importorskip("eventlet", reason="pip install '.[test]': the eventlet target needs eventlet")
    out = tmp_path_factory.mktemp("eventlet")
    run = {}
    with deployment.Eventlet(out) as target:
        run["info"] = target.info
        chained = []
        chain = threading.Thread(target=lambda: chained.append(target.get("/chain")))
        chain.start()
        try:
            target.get_ok("/pool?n=3")
            status = target.wait_for(lambda: _all_parked(target.status()), "green threads parked")
            run["made"] = status["made"]
            run["signal"] = target.signal_dump()
            run["web_text"] = target.get_ok("/btcore/?format=text").decode()
            run["web_json"] = json.loads(target.get_ok("/btcore/?format=json"))
        finally:
            target.get("/release")
            chain.join(deployment.REQUEST_S)
        assert chained == [(200, b'"joined"')]
    return run


def _all_parked(status):
    return status if (status["chain"], status["pool"]) == (1, 3) else None


def _names(run):
    return {g["id"]: g["name"] for g in run["web_json"]["greenlets"]}


def test_eventlet_green_threads_named_with_their_function(eventlet_run):
    names, made = _names(eventlet_run), eventlet_run["made"]
    assert "gen_one" in names[made["gen_one"]] and "gen_two" in names[made["gen_two"]], names
    assert sum("pool_worker" in name for name in names.values()) == 3, names


@pytest.mark.parametrize("dump", ["signal", "web_text"])
def test_eventlet_tree_by_spawner(eventlet_run, dump):
    """Item 7: gen_two is drawn under gen_one, gen_one under the handler's
    green thread that spawned it, not under the hub."""
    names, made = _names(eventlet_run), eventlet_run["made"]
    parents = tree(eventlet_run[dump])
    gen_one, gen_two = node(parents, names[made["gen_one"]]), node(parents, names[made["gen_two"]])
    assert parents[gen_two] == gen_one, parents
    assert parents[gen_one] == node(parents, names[made["handler"]]), parents


@pytest.mark.parametrize("dump", ["signal", "web_text"])
def test_eventlet_thread_label_is_the_os_thread(eventlet_run, dump):
    want = f"{MAIN_THREAD} (0x{eventlet_run['info']['ident']:x})"
    labels = thread_labels(eventlet_run[dump])
    assert f"=== thread {want}: " in eventlet_run[dump], labels
    assert not _unnamed(labels), labels
