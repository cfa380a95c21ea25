"""dump_all(): what every greenlet is doing, as text for humans or JSON for tools;
register_dump_signal(): the same on a signal, the way faulthandler.register works."""
from __future__ import annotations

import atexit
import gc
import json
import os
import signal
import sys
from collections import Counter
from functools import partial

import greenlet

from . import dumpwriter
from .._native import lib

from ..symbols import resolve

from . import schema
from ..capture.backtrace import KIND_NATIVE, KIND_PYTHON, RECORD
from ..symbols.resolve import F_EXACT
from ..capture.greenlets import layout_known
from ..capture.introspect import base_dead, name_of, snapshot
from ..watch.watchdog import install_stuck_dump, uninstall_stuck_dump

JSON_VERSION = schema.VERSION
_MAX_NAMES = 3        # greenlet names listed in a group's header
_WIDTH = 80           # columns the dump's own lines keep to
_MAX_INDENT = 16      # tree levels drawn; deeper ones are shown with their depth
_MAX_REPR = 60        # an ended creator is named by its repr, cut to this many characters


class _Group:
    """Greenlets with identical stacks: shown once, with a count, and with
    each distinct spawn chain of its members (`sites`, most members first)."""

    __slots__ = ("number", "infos", "states", "sites")

    def __init__(self, number):
        self.number, self.infos, self.states, self.sites = number, [], Counter(), []

    def add(self, info) -> None:
        self.infos.append(info)
        self.states[info.state] += 1

    @property
    def first(self):
        return self.infos[0]


def _stack_key(bt, memo: dict):
    """What makes two stacks the same stack to a reader: their Python frames
    by code and line, and every native frame outside the interpreter's own
    code.  Left out: the interpreter's frames and instruction offsets, since
    the same Python call runs through other C paths, and leaves another
    offset in its frame, when it calls out to C, or before and after the
    interpreter specialises it (3.12+; 3.15's first runs), which would split
    one stack in two.  memo: raw bytes -> key (a dump sees the same raw
    stacks again and again), the key a small int standing for the tuple of
    those frames (memo: that tuple -> its int too), so that grouping 10,000
    stacks hashes an int each, not a tuple of their frames.  Names come
    from where bt's records were captured (bt._space: this process's
    resolve module, or another process's names: btcore/remote/process.py)."""
    if bt is None:
        return None
    raw = bytes(bt._raw)
    key = memo.get(raw)
    if key is None:
        space, codes, key = bt._space, iter(bt._refs), []
        interpreter = space.interpreter_module_id()
        for addr, lasti, kind, flags, _ in RECORD.iter_unpack(raw):
            if kind == KIND_NATIVE:
                if space.module_key(addr, bool(flags & F_EXACT))[0] not in (interpreter, 0):
                    key.append(addr)
                continue
            ref = next(codes)   # every other record holds a reference, in order
            key.append((addr, space.resolve_python(ref, lasti)[0].line) if kind == KIND_PYTHON else (addr, lasti))
        key = memo[raw] = memo.setdefault(tuple(key), len(memo))   # (bytes and tuples never compare equal)
    return key, bt.truncated


def _group(infos, group: bool) -> list:
    """Groups, largest first (ties: in snapshot order); one per greenlet if not group."""
    groups, memo = {}, {}
    for info in infos:
        key = ((_stack_key(info.backtrace, memo), info.python_only, info.error)
               if group else id(info))
        if key not in groups:
            groups[key] = _Group(len(groups))
        groups[key].add(info)
    ordered = sorted(groups.values(), key=lambda g: (-len(g.infos), g.number))
    site_keys = {}
    for number, g in enumerate(ordered, 1):
        g.number = number
        g.sites = _spawn_sites(g.infos, lambda site: _site_key(site, site_keys, memo))
    return ordered


class _Site:
    """Members of a group spawned through one chain of sites: how many, the
    first of them (whose chain is shown) and their creators."""

    __slots__ = ("first", "count", "creators")

    def __init__(self, first):
        self.first, self.count, self.creators = first, 0, {}   # creator identity -> [name, count]

    def add(self, chain) -> None:
        self.count += 1
        _, spawner, ref = chain.links[0]
        identity = id(ref) if ref is not None else spawner
        who = self.creators.get(identity)
        if who is None:
            who = self.creators[identity] = [_creator_name(ref, spawner), 0]
        who[1] += 1

    def creator_counts(self) -> list:
        """[(name, count)], most members first (ties: first seen)."""
        return sorted(self.creators.values(), key=lambda who: -who[1])


def _creator_name(ref, spawner: str) -> str:
    """A live creator as the dump names greenlets; one that has ended (its
    gevent name no longer says what it ran) by its repr from when it spawned."""
    creator = ref() if ref is not None else None
    if isinstance(creator, greenlet.greenlet) and not base_dead(creator):
        return name_of(creator)
    if type(creator) is schema.RemoteGreenlet:   # one of another process's dump (remote/process.py)
        return creator.name or _shortened(spawner)
    if creator is not None and _pending_task(creator):   # an asyncio task (btcore.capture.tasks)
        return f"{creator.get_name()} ({getattr(creator.get_coro(), '__qualname__', '?')})"
    return _shortened(spawner)


def _pending_task(creator) -> bool:
    try:
        return not creator.done()
    except Exception:
        return False


def _spawn_sites(infos, site_key) -> list:
    """The distinct spawn chains of infos (keyed site by site, as stacks are
    keyed: see _stack_key), most members first (ties: first seen); members
    with no chain (created while tracking was off) are in none."""
    sites = {}
    for info in infos:
        chain = info.spawn_chain
        if chain is None:
            continue
        key = (tuple(site_key(site) for site, _, _ in chain.links), chain.cut)
        if key not in sites:
            sites[key] = _Site(info)
        sites[key].add(chain)
    return sorted(sites.values(), key=lambda site: -site.count)


def _site_key(site, site_keys: dict, memo: dict):
    """_stack_key of an interned site, once per site object (the chains of a
    dump share their sites; a snapshot keeps them alive, so ids are stable)."""
    key = site_keys.get(id(site))
    if key is None:
        key = site_keys[id(site)] = _stack_key(site, memo)
    return key


def _shortened(text: str) -> str:
    return text if len(text) <= _MAX_REPR else text[:_MAX_REPR - 3] + "..."


def stack_text(bt) -> str:
    """A stack's frames as the text dump prints them (render_text's default stack renderer)."""
    return bt.format(header=False)   # the dump prints its own greenlet headers


def _unresolved_text(bt) -> str:
    return "  (stack not resolved: the signal interrupted btcore's own name resolution)"


# ---- text ----

def _group_header(group: _Group, grouped: bool) -> str:
    first, count = group.first, len(group.infos)
    states = ", ".join(f"{n} {state}" if len(group.states) > 1 else state
                       for state, n in group.states.most_common())
    what = f"{_counted(group.infos)}, {states}" if grouped else f"{first.name}, {states}"
    lines = [f"=== stack {group.number}: {what} ==="]
    if grouped:
        lines.append(_fitting("  e.g. ", [info.name for info in group.infos[:_MAX_NAMES]], count))
    threads = sorted({_thread_label(info) for info in {(i.thread_id, i.thread_name): i for i in group.infos}.values()})
    lines.append(_fitting(f"  thread{'s' if len(threads) > 1 else ''}: ", threads, len(threads)))
    ran = [info.last_ran for info in group.infos if info.last_ran is not None]
    if ran:
        span = f"{min(ran):.3f} to {max(ran):.3f}" if len(ran) > 1 else f"{ran[0]:.3f}"
        lines.append(f"  last ran: {span} s ago")
    return "\n".join(lines)


def _fitting(prefix: str, names: list, total: int) -> str:
    """prefix + "name, name (+N more)" for a list of `total` names whose first
    ones are `names`: at most _MAX_NAMES, as many as fit in _WIDTH columns
    (at least one)."""
    line, shown = prefix + names[0], 1
    for name in names[1:_MAX_NAMES]:
        more = total - shown - 1
        if len(line) + 2 + len(name) + (len(f" (+{more} more)") if more else 0) > _WIDTH:
            break
        line += f", {name}"
        shown += 1
    return line + (f" (+{total - shown} more)" if total > shown else "")


def _greenlets(count: int) -> str:
    return f"{count} greenlet{'s' if count != 1 else ''}"


def _counted(infos) -> str:
    """"3 greenlets", or with asyncio tasks among infos "1 greenlet, 2 tasks"."""
    tasks = len(infos) - [getattr(info, "task", None) for info in infos].count(None)   # _is_task() of each, at once
    greenlets, counted = len(infos) - tasks, f"{tasks} task{'s' if tasks != 1 else ''}"
    return _greenlets(greenlets) if not tasks else f"{_greenlets(greenlets)}, {counted}" if greenlets else counted


def _is_task(info) -> bool:
    return getattr(info, "task", None) is not None   # btcore.capture.tasks.TaskInfo


def _thread_label(info) -> str:
    """The OS thread: its name and ident as `threading` knew them before patching."""
    if info.thread_id is None:
        return "unknown thread"
    return f"{info.thread_name} (0x{info.thread_id:x})"


def _group_text(group: _Group, grouped: bool, stack_text) -> str:
    first = group.first
    parts = [_group_header(group, grouped)]
    if first.python_only:
        parts.append("  (running in another thread: Python frames only, from the interpreter)")
    if first.error is not None:
        parts.append(f"  no stack: {first.error}")
    if first.backtrace is not None:
        parts.append(stack_text(first.backtrace))
    parts.extend(_spawn_text(group, stack_text))
    return "\n".join(parts)


def _spawn_text(group: _Group, stack_text) -> list:
    """Each distinct spawn chain of the group: its count (when there are
    several), its creators with counts, the chain of its first member."""
    lines, sites = [], group.sites
    for k, site in enumerate(sites, 1):
        lines.append(f"Spawned at (site {k} of {len(sites)}, {_greenlets(site.count)}):" if len(sites) > 1
                     else "Spawned at:")
        names = [f"{name} x{n}" if n > 1 else name for name, n in site.creator_counts()]
        lines.append(_fitting(f"  by {len(names)} greenlets: " if len(names) > 1 else "  by ", names, len(names)))
        lines.append(stack_text(site.first.spawn_backtrace))
    unrecorded = len(group.infos) - sum(site.count for site in sites)
    if sites and unrecorded:
        lines.append(f"  (and {_greenlets(unrecorded)} with no spawn site: created while tracking was off)")
    return lines


def _tree_lines(infos, stack_of: dict) -> list:
    """One tree per thread, its main greenlet first: below each greenlet
    those drawn under it (GreenletInfo.under: the greenlets it spawned, else
    those it is the parent of, such as every greenlet a gevent hub runs)."""
    children, tops = {}, []
    for info in infos:
        if info.under is None:
            tops.append(info)
        else:
            children.setdefault(id(info.under), []).append(info)
    of_thread = {}   # threads in snapshot order (the calling thread first) -> their infos
    for info in infos:
        of_thread.setdefault(info.thread_id, []).append(info)
    order = {thread: n for n, thread in enumerate(of_thread)}
    tops.sort(key=lambda info: (order[info.thread_id], info.parent is not None))
    lines, shown = [], set()
    thread = object()
    for top in tops:
        if top.thread_id != thread:
            thread = top.thread_id
            lines.append(f"=== thread {_thread_label(top)}: {_counted(of_thread[thread])} ===")
        _draw(top, children, stack_of, lines, shown)
    unreached = [info for info in infos if id(info.greenlet) not in shown]   # cycles of spawners
    for info in unreached:
        if id(info.greenlet) not in shown:
            _draw(info, children, stack_of, lines, shown)
    return lines


def _draw(top, children, stack_of, lines, shown) -> None:
    """Iterative (spawn trees can be deeper than Python's recursion limit)."""
    todo = [(top, "", "", 0)]
    while todo:
        info, lead, rest, depth = todo.pop()
        key = id(info.greenlet)
        if key in shown:
            continue
        shown.add(key)
        lines.append(f"{lead}{_node_label(info, stack_of[key], depth)}")
        kids = children.get(key)
        if not kids:
            continue
        indent = depth < _MAX_INDENT
        todo.append((kids[-1], *((rest + "`- ", rest + "   ") if indent else (rest, rest)), depth + 1))
        middle = (rest + "|- ", rest + "|  ") if indent else (rest, rest)   # the same for every other kid
        todo.extend((kid, *middle, depth + 1) for kid in reversed(kids[:-1]))


def _node_label(info, stack: int, depth: int) -> str:
    extra = f", last ran {info.last_ran:.3f} s ago" if info.last_ran is not None else ""
    deep = f" (depth {depth})" if depth > _MAX_INDENT else ""
    return f"{info.name}{deep}  {info.state}  [stack {stack}{extra}]"


def render_text(infos, group: bool, tree: bool, stack_text, title=None, tail="", notes=()) -> str:
    """The text dump of infos (GreenletInfos, or entries with their attributes: another process's);
    stack_text(bt) prints a stack; title: whose dump (default: this process's); tail: the end of the
    first line; notes: lines after it."""
    groups = _group(infos, group)
    # The tree is drawn before the stacks are named (it names none): an outside dump names its native frames
    # in a thread of its own meanwhile (process._Ahead).
    tree_lines = _tree_lines(infos, {id(info.greenlet): g.number for g in groups for info in g.infos}) if tree \
        else None
    threads = {info.thread_id for info in infos}
    out = [f"{title or f'Greenlet dump, pid {os.getpid()}'}: {_counted(infos)} in {len(threads)} "
           f"thread{'s' if len(threads) != 1 else ''}, {len(groups)} distinct stacks{tail}"]
    out.extend(f"note: {note}" for note in notes)
    out.extend("\n" + _group_text(g, group, stack_text) for g in groups)
    if tree:
        out.append("")
        out.extend(tree_lines)
    return "\n".join(out) + "\n"


# ---- JSON ----

def json_frames(bt):
    """A stack's frames as the JSON document lists them."""
    return [{"kind": f.kind, "function": f.function, "file": f.file, "line": f.line, "module": f.module,
             "ip": f.ip, "offset": f.offset, "inlined": f.inlined} for f in bt.frames()]


def _json(infos, group: bool) -> str:
    return json.dumps(json_document(infos, group), indent=1) + "\n"


def json_document(infos, group: bool, frames_json=json_frames, pid=None, **more) -> dict:
    """The JSON schema's document (btcore/views/schema.py); frames_json(bt) renders
    a stack's frames (the HTML page adds fields to them); pid, more: another
    process's dump (schema.document)."""
    groups = _group(infos, group)
    stack_of = {id(info.greenlet): g.number for g in groups for info in g.infos}
    threads = Counter((info.thread_id, info.thread_name) for info in infos)
    return schema.document(
        os.getpid() if pid is None else pid,
        [{"id": ident, "name": name, "greenlets": n} for (ident, name), n in threads.items()],
        [_stack_json(g, frames_json) for g in groups],
        [_greenlet_json(info, stack_of) for info in infos],
        [_task_json(info) for info in infos if _is_task(info)], **more)


def _stack_json(group: _Group, frames_json) -> dict:
    first = group.first
    bt, sites = first.backtrace, [_site_json(site, frames_json) for site in group.sites]
    return {
        "id": group.number,
        "count": len(group.infos),
        "state": group.states.most_common(1)[0][0],
        "states": dict(group.states),
        "python_only": first.python_only,
        "error": first.error,
        "frames": frames_json(bt) if bt is not None else [],
        "truncated": bt.truncated if bt is not None else False,
        "spawn_frames": sites[0]["frames"] if sites else None,
        "spawn_sites": sites,
    }


def _site_json(site: _Site, frames_json) -> dict:
    spawn = site.first.spawn_backtrace
    return {"count": site.count,
            "spawners": [{"name": name, "count": n} for name, n in site.creator_counts()],
            "frames": frames_json(spawn), "truncated": spawn.truncated}


def _greenlet_json(info, stack_of) -> dict:
    return {
        "id": schema.greenlet_id(info.greenlet),
        "name": info.name,
        "type": schema.greenlet_type(info.greenlet),
        "thread_id": info.thread_id,
        "state": info.state,
        "parent": schema.greenlet_id(info.parent),
        "spawned_by": schema.greenlet_id(info.spawned_by),
        "under": schema.greenlet_id(info.under),
        "stack": stack_of[id(info.greenlet)],
        "error": info.error,
        "last_ran": info.last_ran,
    }


def _task_json(info) -> dict:
    """What an asyncio task's entry in "greenlets" does not say (same id)."""
    return {"id": schema.greenlet_id(info.task), "loop": schema.greenlet_id(info.loop), "coroutine": info.coroutine,
            "awaited_by": [schema.greenlet_id(task) for task in info.awaited_by]}


# ---- public ----

def dump_all(file=None, *, group: bool = True, tree: bool = True, format: str = "text") -> None:
    """Write what every greenlet of the process is doing to file (default: sys.stderr).

    text: identical stacks grouped with their count and states, largest
    group first (group=False: one entry per greenlet), then each thread's
    greenlets as a tree (tree=False: no tree).  json: the schema in
    docs/api.md (version JSON_VERSION); `tree` does not apply.  html: one
    self-contained page (btcore/views/html.py), always grouped, with the tree.
    """
    check_file(file)
    _write(file, render(snapshot(), group, tree, format, stack_text))


def render(infos, group, tree, format, stack_text) -> str:
    """infos as dump_all() writes them in format ("text", "json", "html")."""
    if format == "text":
        return render_text(infos, group, tree, stack_text)
    if format == "json":
        return _json(infos, group)
    if format == "html":
        from .html import page
        return page(infos)
    raise ValueError(f"format must be 'text', 'json' or 'html', not {format!r}")


def check_file(file) -> None:
    """TypeError unless file (None: sys.stderr) can be written to."""
    out = sys.stderr if file is None else file
    if not callable(getattr(out, "write", None)):
        raise TypeError("file must have a write() method" if file is not None else
                        "sys.stderr is None (no standard error): give a file")


def write_text(file, text: str) -> None:
    """text written to file, then flushed.  Paths in it are the file system's
    bytes, an undecodable one a lone surrogate as Python keeps it (os.fsdecode):
    where file's codec cannot write one, the text is written with it escaped
    (\\udce9), as Python's own tracebacks are."""
    try:
        file.write(text)
    except UnicodeEncodeError:
        encoding = getattr(file, "encoding", None) or "utf-8"
        file.write(text.encode(encoding, "backslashreplace").decode(encoding))
    file.flush()


def _write(file, text: str) -> None:
    write_text(sys.stderr if file is None else file, text)


_registered = {}   # signum -> (file, chain, previous handler), or _STUCK (a C handler, watch/watchdog.py)
_STUCK = ("stuck",)
# Used by none of gunicorn (arbiter and worker), uWSGI, Celery (and billiard),
# Locust, gevent, eventlet, nor btcore's own capture signal; its default
# action, like SIGUSR1's, ends a process that has no handler (docs/guide.md).
DEFAULT_DUMP_SIGNAL = signal.SIGPWR


# A fault's signal comes back at once if its handler returns (the faulting instruction runs again): a dump
# there loops for ever; enable_crash_report() is what reports a fault.  SIGKILL and SIGSTOP cannot be handled.
_NOT_DUMP_SIGNALS = {signal.SIGSEGV: "a fault", signal.SIGBUS: "a fault", signal.SIGILL: "a fault",
                     signal.SIGFPE: "a fault", signal.SIGKILL: "not catchable", signal.SIGSTOP: "not catchable"}


def _check_dump_signal(signum) -> None:
    if isinstance(signum, bool) or not isinstance(signum, int):
        raise TypeError(f"signum must be a signal number, not {type(signum).__name__}")
    if signum in _NOT_DUMP_SIGNALS:
        raise ValueError(f"{signal.Signals(signum).name} cannot be the dump's signal ({_NOT_DUMP_SIGNALS[signum]}"
                         + ("; btcore.enable_crash_report() reports faults)" if "fault" in _NOT_DUMP_SIGNALS[signum]
                            else ")"))
    if not 0 < signum < signal.NSIG:
        raise ValueError(f"signum must be a signal number from 1 to {signal.NSIG - 1}, not {signum}")


def register_dump_signal(signum: int = DEFAULT_DUMP_SIGNAL, file=None, *, chain: bool = False,
                         stuck: bool = False) -> None:
    """Dump every greenlet (dump_all) to file (default: sys.stderr at that time) on signal signum.

    Python runs signal handlers in the main thread, between two bytecodes:
    a main thread waiting (a sleep, an idle event loop) is interrupted for
    it (native/watch/prompt_signal.c); one blocked inside C code dumps only
    when it returns to Python.  The handler only captures (snapshot()); a writer thread of
    btcore's names, renders and writes the dump, in signal order, while the
    interrupted code (the event loop) goes on.  Must be called from the
    main thread (signal.signal's rule).

    A handler somebody else installed is never replaced silently:
    RuntimeError naming it, unless chain=True, which calls it after each
    dump's capture (Python handlers only; stuck=True chains C ones).

    stuck=True: the dump is written at once by a C thread, even while a
    thread is stuck in C (holding the GIL or in a blocking call): the
    running stack of the calling thread, then of every other thread that
    existed when this was called (or registered since), native and Python
    frames, each sampled in its own thread by signal and named without the
    GIL (not every greenlet: that needs the interpreter).  file must have a
    fileno().
    """
    _check_dump_signal(signum)
    if stuck:
        unregister_dump_signal(signum)
        _refuse_foreign(signum, chain, c_chainable=True)
        install_stuck_dump(signum, file, chain)
        _registered[signum] = _STUCK
        return
    if _registered.get(signum) is _STUCK:
        unregister_dump_signal(signum)
    if signum not in _registered:
        _refuse_foreign(signum, chain, c_chainable=False)
    layout_known()   # learn greenlet's layout now: learning takes a lock a handler must not wait for
    dumpwriter.start()   # now, not in the handler: no thread start inside a signal
    _unwrap(signum)
    previous = signal.signal(signum, _on_signal)
    lib.btc_prompt_signal_install(signum)   # if it cannot, dumps still come, when the main thread next runs Python
    if signum in _registered:   # re-registering: keep the handler from before the first call
        previous = _registered[signum][2]
    _registered[signum] = (file, chain, previous)


def _unwrap(signum: int) -> None:
    """Python's own C handler back on signum (native/watch/prompt_signal.c),
    before Python changes signum's handler."""
    if lib.btc_prompt_signal_uninstall(signum) < 0:
        raise ValueError("signal only works in main thread of the main interpreter")


@atexit.register
def _unwrap_at_exit() -> None:
    # Before the interpreter's end puts SIG_DFL back on every signal it handled: a nudge
    # still armed then (a dump signalled just before, its handler not run) would end the
    # process by the signal's default action.  Python's handler stays until then.
    for signum, entry in list(_registered.items()):
        if entry is not _STUCK:
            lib.btc_prompt_signal_uninstall(signum)


def _refuse_foreign(signum: int, chain: bool, c_chainable: bool) -> None:
    """RuntimeError if signum has a handler somebody else installed and it
    cannot be chained: replacing it silently breaks its owner (gunicorn's
    worker reopens its logs on SIGUSR1)."""
    previous = signal.getsignal(signum)
    if previous is _on_signal:
        return
    if previous is None or (previous in (signal.SIG_DFL, signal.SIG_IGN) and _installed_from_c(signum)):
        # a C handler (faulthandler.register, libev's signal watchers, ...): Python cannot call it
        if not (chain and c_chainable):
            raise RuntimeError(f"{_signal_name(signum)} already has a handler installed from C (not from "
                               "Python), which a Python handler cannot call; pass stuck=True, chain=True "
                               "(a C handler that calls it after the dump), or choose another signal")
    elif previous not in (signal.SIG_DFL, signal.SIG_IGN) and not chain:
        default = (f" (the default, {_signal_name(DEFAULT_DUMP_SIGNAL)}, is free in gunicorn, uWSGI and Celery)"
                   if signum != DEFAULT_DUMP_SIGNAL else "")
        raise RuntimeError(f"{_signal_name(signum)} already has a handler, {_handler_name(previous)}; pass "
                           f"chain=True to call it after the dump, or choose another signal{default}")


def _installed_from_c(signum: int) -> bool:
    """Whether the kernel's handler for signum is a function although Python
    reports SIG_DFL or SIG_IGN: C code installed it after Python started
    (Python only learns of handlers at start-up).  glibc's struct sigaction
    starts with the handler on every Linux ABI; 512 bytes hold any of them."""
    import ctypes
    old = ctypes.create_string_buffer(512)
    if ctypes.CDLL(None).sigaction(signum, None, old) != 0:
        return False
    return (ctypes.c_void_p.from_buffer(old).value or 0) not in (0, 1)   # SIG_DFL, SIG_IGN


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:   # real-time signals have no name
        return f"signal {signum}"


def _handler_name(handler) -> str:
    """"Worker.handle_usr1 (from gunicorn.workers.base)", else its repr."""
    name = getattr(handler, "__qualname__", None)
    if not isinstance(name, str):
        return repr(handler)
    module = getattr(handler, "__module__", None)
    return f"{name} (from {module})" if isinstance(module, str) else name


def unregister_dump_signal(signum: int = DEFAULT_DUMP_SIGNAL) -> bool:
    """Restore the handler signum had before register_dump_signal(), after
    the dumps already signalled are written (at most dumpwriter.DRAIN_TIMEOUT
    seconds); False if none was registered."""
    entry = _registered.get(signum)
    if entry is None:
        return False
    if entry is _STUCK:
        del _registered[signum]
        return uninstall_stuck_dump(signum)
    _unwrap(signum)
    del _registered[signum]
    signal.signal(signum, entry[2])
    if any(other is not _STUCK for other in _registered.values()):
        dumpwriter.drain()
    else:
        dumpwriter.stop()   # the last one: its thread goes too
    return True


def _on_signal(signum, frame) -> None:
    """Only the capture here (it is what must see the greenlets as they are
    now); naming and writing go to the writer thread, else are done here."""
    lib.btc_prompt_signal_seen(signum)   # no more nudges: the main thread is here
    file, chain, previous = _registered.get(signum, (None, False, None))
    out = sys.stderr if file is None else file
    try:
        if dumpwriter.backlogged():   # the writer is stuck (a blocked file): count it, keep memory bounded
            _skipped[0] += 1
        else:
            _dump_now(out, frame)
    except Exception as e:   # a signal must not raise into whatever code it interrupted
        _write_quietly(out, f"btcore: greenlet dump failed: {type(e).__name__}: {e}\n")
    if chain and callable(previous):
        previous(signum, frame)


_skipped = [0]   # signals not dumped since the last dump (writer backlogged): said in the next one


def _dump_now(out, frame) -> None:
    infos = _capture()
    skipped, _skipped[0] = _skipped[0], 0
    if not dumpwriter.submit(partial(_write_dump, out, infos, stack_text, skipped)):
        _write_dump(out, infos, _unresolved_text if _inside_resolution(frame) else stack_text, skipped)


def _capture() -> list:
    """snapshot() with the cyclic GC held off: its thousands of small
    objects would otherwise set off a collection of the whole heap in the
    middle of the capture, and the loop would wait for both at once (the
    first dump of a process: ~70 -> ~50 ms with 2,000 greenlets,
    benchmarks/bench_signal_dump.py).  The collection runs later, apart."""
    with GCHeld():   # a with block, not a call: the capture's frames stay as capture/introspect.py trims them
        return snapshot()


class GCHeld:
    """The cyclic GC held off in a with block (see _capture)."""

    def __enter__(self):
        self.enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc):
        if self.enabled:
            gc.enable()


def _write_dump(file, infos, stack_text, skipped: int) -> None:
    note = (f"btcore: {skipped} dump signal{'s' if skipped > 1 else ''} skipped: earlier dumps were still "
            "being written\n" if skipped else "")
    try:
        _write(file, note + render(infos, True, True, "text", stack_text))
    except Exception as e:   # the writer thread's jobs, like the handler, report and go on
        _write_quietly(file, f"btcore: greenlet dump failed: {type(e).__name__}: {e}\n")


def _write_quietly(file, text: str) -> None:
    try:
        _write(file, text)
    except Exception:
        pass


def _inside_resolution(frame) -> bool:
    """Whether the interrupted code is resolving names (btcore/symbols/resolve.py),
    for a dump written in the handler itself (no writer thread): it may be
    between filling and reading its name buffer (a nested resolution would
    overwrite it).  The writer thread resolves in its own thread, with its
    own buffers: it needs no such guard."""
    while frame is not None:
        if frame.f_code.co_filename == _RESOLVE_FILE:
            return True
        frame = frame.f_back
    return False


_RESOLVE_FILE = resolve.__file__
