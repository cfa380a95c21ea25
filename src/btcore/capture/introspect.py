"""snapshot(): every live greenlet of the process, with its state, thread and stack.

How greenlets are found: a gc scan (gc.get_objects() filtered for greenlets,
as gevent.util does), in live_greenlets(), the one place a live-greenlet
registry would plug in.  Each greenlet is then classified from greenlet's own
state (state_of) and captured with collect(); a greenlet that changes under
the snapshot (another thread ends it, starts it, switches into it) gives an
entry marked with an error, never an exception.
"""
from __future__ import annotations

import gc
import os
import sys
import time

import greenlet

from ..views import dumpwriter
from .._native import ffi, lib
from .backtrace import KIND_PYTHON, RECORD, Backtrace, collect
from ..errors import BacktraceError
from .greenlets import layout_known
from .switchclock import switched_out_at
from .threads import current_ident, os_threads

RUNNING = "running"
SUSPENDED = "suspended"
NOT_STARTED = "not started"
DEAD = "dead"

CAPACITY = 128           # raw frames kept per greenlet (16 bytes each)
GONE = "<gone>"          # the greenlet ended while the snapshot looked at it
PAUSE_EVERY = 500        # greenlets between two pauses of snapshot(pause=): ~5-10 ms of capture and naming
_WANT_SUSPENDED = lib.BTC_WANT_PYTHON | lib.BTC_WANT_NATIVE | lib.BTC_WANT_OWN_THREAD
_WANT_THREAD = lib.BTC_WANT_PYTHON | lib.BTC_WANT_THREAD

_base_bool = greenlet.greenlet.__bool__              # greenlet's own "active", not a subclass's
base_dead = greenlet.greenlet.dead.__get__          # gevent.Greenlet overrides `dead`
base_frame = greenlet.greenlet.gr_frame.__get__
_base_parent = greenlet.greenlet.parent.__get__
# Files whose frames are btcore's own introspection code, hidden from the caller's stack.
_OWN_FILES = frozenset(os.path.join(os.path.dirname(os.path.dirname(__file__)), name)
                       for name in ("capture/introspect.py", "views/dump.py", "views/html.py", "web.py",
                                    "capture/tasks.py"))


class Entry:
    """What a snapshot's entries share (GreenletInfo, tasks.TaskInfo): a
    spawn backtrace built from the spawn chain on first use (the snapshot
    itself only takes the chain: cheap)."""

    __slots__ = ()

    @property
    def spawn_backtrace(self):
        if self._spawn_backtrace is None and self.spawn_chain is not None:
            from .spawn import chain_backtrace
            self._spawn_backtrace = chain_backtrace(self.spawn_chain)
        return self._spawn_backtrace


class GreenletInfo(Entry):
    """One live greenlet, as snapshot() saw it.

    greenlet     the greenlet object (the snapshot keeps it alive)
    thread_id    ident of the OS thread it belongs to (threading's ident before any
                 monkey-patching: pthread_self(), the same in every dump), or None if unknown
    thread_name  that thread's name as `threading` knew it before patching ("ThreadPool
                 worker" for a gevent threadpool thread, "native thread <tid>" for a thread
                 `threading` never named), or None if the thread is unknown
    state        "running", "suspended" or "not started"
    parent       greenlet's `parent`
    spawned_by   the greenlet that spawned it (gevent's spawning_greenlet; else, with spawn
                 tracking on, the greenlet that created it), else None
    under        the greenlet it is drawn under in the tree: its spawner if alive and in the
                 same thread, else its parent, but never eventlet's hub (the parent of every
                 eventlet green thread); None for a top of its thread's tree
    name         gevent name and function ("Greenlet-3 (handler)"), else "<type at 0xADDR>",
                 followed by the function it runs when known ("<...GreenThread at 0x..> (handler)")
    backtrace    its merged Backtrace (raw, resolved on demand), or None (see error)
    python_only  True when backtrace holds only the Python frames the interpreter
                 reports (a greenlet running in another thread)
    spawn_chain  its raw spawn chain (btcore.SpawnChain: interned sites, creators),
                 when spawn tracking is on and it was tracked, else None
    spawn_backtrace  where it was spawned (btcore.chain_backtrace of spawn_chain),
                 built on first use, or None
    last_ran     seconds since it last ran (0.0 while running), when switch timing
                 (enable_switch_timing) saw it switch out; else None
    error        None, or why there is no backtrace ("<gone>", an error message)
    """

    __slots__ = ("greenlet", "thread_id", "thread_name", "state", "parent", "spawned_by", "name",
                 "backtrace", "python_only", "spawn_chain", "_spawn_backtrace", "last_ran", "error",
                 "under")

    def __init__(self, g, state):
        self.greenlet = g
        self.state = state
        self.thread_id = self.thread_name = self.under = None
        self.parent = _base_parent(g)
        # gevent's attributes, read through the subclass: its code must not fail the snapshot
        self.spawned_by = read_optional(_spawner_of, g)
        self.name = name_of(g)
        self.backtrace = self.spawn_chain = self._spawn_backtrace = self.last_ran = self.error = None
        self.python_only = False

    def __repr__(self) -> str:
        return f"<GreenletInfo {self.name} {self.state} thread={self.thread_name}>"


if lib.btc_install_greenlet_objects(id(globals()), id(greenlet.greenlet)) != 0:
    raise ImportError("btcore: cannot install the greenlet filter")
# Installed above (native/capture/greenlet_objects.c):
# _greenlets_among(objects): the greenlets of a list, by a C type check per
# object (a few ns; no code of the object runs, as isinstance() would ask a
# proxy for its __class__).
# _known_states(known, current, phases, phase): the profiler's greenlets
# (known: key -> (weakref, ...)) by state_of()'s rule: (turn: [(key, g)]
# suspended in phase (id >> 4 modulo phases), running: [(key, g)], gone: the
# keys of the dead and the collected).
# _state_of(g, current): RUNNING, SUSPENDED, NOT_STARTED or DEAD, from
# greenlet's own state only, read from current (the calling thread's
# greenlet); the rule and why it is so: greenlet_objects.c.
# _parked_unmoved(parked, stacks, counted, unplaced, now): the profiler's
# looks at parked greenlets that have not moved, counted in C; returns the
# others (profile/sampler.py, Profiler._parked()).
_greenlets_among = globals()["_greenlets_among"]
known_states = globals()["_known_states"]
state_of = globals()["_state_of"]
parked_unmoved = globals()["_parked_unmoved"]


def live_greenlets(generation: int | None = None) -> list:
    """Every greenlet object the gc knows about (dead ones included), or
    those of one gc generation (the profiler's scan of new greenlets).

    The single source of greenlets: a live-greenlet registry, when one
    exists, replaces this gc scan here.  The scan holds the GIL: no thread
    creates or frees greenlets while it runs.
    """
    return _greenlets_among(gc.get_objects() if generation is None else gc.get_objects(generation))


def root_of(g):
    parent = _base_parent(g)
    while parent is not None:
        g, parent = parent, _base_parent(parent)
    return g


def _spawner_of(g):
    """The greenlet that spawned g (gevent keeps a weak reference; else spawn
    tracking's record of its creator), if known."""
    ref = getattr(type(g), "spawning_greenlet", None) and getattr(g, "spawning_greenlet", None)
    if callable(ref):
        return ref()
    spawn = sys.modules.get("btcore.capture.spawn")
    return spawn._spawn_creator(g) if spawn is not None else None


def gevent_name_of(g) -> str | None:
    """gevent's name and function ("Greenlet-3 (handler)"), if g has a name."""
    name = getattr(g, "name", None) if hasattr(type(g), "name") else None
    if not isinstance(name, str) or not name:
        return None
    function = getattr(getattr(g, "_run", None), "__name__", None)
    return f"{name} ({function})" if isinstance(function, str) else name


def name_of(g) -> str:
    """What a dump calls g: gevent's name and function, else its type and
    address and the function it runs."""
    return read_optional(gevent_name_of, g) or plain_name_of(g, read_optional(function_of, g))


def plain_name_of(g, function=None) -> str:
    """"<module.Type at 0xADDR>", with " main" for a thread's main greenlet,
    then " (function)" when the function it runs is known."""
    kind = type(g)
    main = " main" if _base_parent(g) is None else ""
    runs = f" ({function})" if function else ""
    return f"<{kind.__module__}.{kind.__qualname__} at 0x{id(g):x}{main}>{runs}"


def function_of(g, frame=None) -> str | None:
    """The function a plain greenlet runs: its `run` until it starts (greenlet
    drops `run` then), afterwards its outermost Python frame's; for an
    eventlet GreenThread, the function its `main` was given.  frame: g's
    innermost frame when g runs in another thread (greenlet does not show
    those frames: None is returned without it)."""
    if _base_parent(g) is None:
        return None   # a thread's main greenlet runs the thread, not a function
    main = eventlet_main_code()
    if not _base_bool(g):
        run = getattr(g, "run", None)
        return None if getattr(run, "__code__", None) is main else getattr(run, "__name__", None)
    if frame is None:
        frame = sys._getframe() if g is greenlet.getcurrent() else base_frame(g)
    if frame is None:
        return None   # running in another thread: its frames are not g's to read
    return outermost_function(frame, main)


def outermost_function(frame, eventlet_main) -> str | None:
    """The function a greenlet runs, from any of its frames: its outermost
    frame's, or for an eventlet GreenThread the function given to its main."""
    while frame.f_back is not None:
        frame = frame.f_back
    if frame.f_code is eventlet_main:
        return getattr(frame.f_locals.get("function"), "__name__", None)
    return frame.f_code.co_name


def eventlet_main_code():
    greenthread = sys.modules.get("eventlet.greenthread")
    return getattr(getattr(getattr(greenthread, "GreenThread", None), "main", None), "__code__", None)


def _spawn_chain_reader():
    """btcore.spawn_chain when spawn ancestry is available and on, else None."""
    import btcore
    reader = getattr(btcore, "spawn_chain", None)
    enabled = getattr(btcore, "spawn_tracking_enabled", None)
    if reader is None or (enabled is not None and not enabled()):
        return None
    return reader


def threads_of_greenlets(greenlets) -> dict:
    """thread ident -> OSThread, for every thread the interpreter knows but
    btcore's own dump writer (no greenlets; it would spoil
    thread_of_roots' pairing of the one chain and the one thread left)."""
    writer = dumpwriter.ident()
    return {t.ident: t for t in os_threads(greenlets) if t.ident != writer}


def thread_of_roots(roots: dict, current_root, threads: dict) -> dict:
    """root (a thread's main greenlet) -> thread ident, where it can be told.

    greenlet does not say which thread a greenlet belongs to, only that all
    greenlets of a parent chain share one, on that thread's stack.  Known:
    the calling thread's root; a root whose stack mark lies on exactly one
    thread's stack (exact, the first rule that applies); a gevent hub
    records its thread's ident.  A single root and a single
    thread left unmatched belong together.  Anything else stays unknown.
    """
    found = {current_root: current_ident()}
    for root, members in roots.items():
        # A dead root's thread has exited: its stack may be another thread's now.
        if root not in found and not base_dead(root):
            ident = _thread_by_stack(root, threads) or _thread_by_hub(members, threads)
            if ident is not None:
                found[root] = ident
    # A root whose thread has exited since the scan is dead now: not paired.
    left_roots = [r for r in roots if r not in found and not base_dead(r)]
    left_threads = set(threads) - set(found.values())
    if len(left_roots) == 1 and len(left_threads) == 1:
        found[left_roots[0]] = left_threads.pop()
    return found


def _thread_by_stack(root, threads: dict):
    """The thread whose stack holds root's stack mark, if exactly one does.
    (A thread that started any other greenlet has suspended its main one.)"""
    mark = lib.btc_greenlet_stack_mark(id(root))
    owners = [ident for ident, t in threads.items() if t.owns(mark)] if mark else ()
    return owners[0] if len(owners) == 1 else None


def _thread_by_hub(members, threads: dict):
    """A gevent hub's record of its thread, if it names a live thread."""
    for g in members:
        ident = getattr(g, "thread_ident", None) if is_hub(g) else None
        if ident in threads:
            return ident
    return None


def is_hub(g) -> bool:
    hub_module = sys.modules.get("gevent.hub")
    return hub_module is not None and isinstance(g, hub_module.Hub)


def python_frames_of_thread(ident) -> Backtrace | None:
    """The Python frames a thread of this interpreter runs, walked in C from
    its thread state (no native frames: its registers are its own); None if
    no thread has that ident.  ~1 us where sys._current_frames() and an
    f_back walk in Python took ~6 us for a 20-frame stack (the profiler does
    this for every thread at every tick).  ident None (a thread that could
    not be identified) gives None too."""
    if type(ident) is not int or not 0 <= ident < 1 << 64:
        return None
    bt = Backtrace(CAPACITY)
    return bt if lib.btc_collect(ident, id(bt), CAPACITY, CAPACITY, _WANT_THREAD) == 0 else None


def python_backtrace(frames, truncated: bool) -> Backtrace:
    """A Backtrace of Python frames only (innermost first) from frame objects."""
    bt = Backtrace(CAPACITY)
    bt._raw = bytearray(b"".join(RECORD.pack(id(f.f_code), f.f_lasti, KIND_PYTHON, 0, 0) for f in frames))
    bt._refs, bt.truncated = tuple(f.f_code for f in frames), truncated
    return bt


def without_own_frames(bt: Backtrace) -> Backtrace:
    """bt minus its innermost Python frames that are btcore's introspection
    code.  Native frames below them stay: when a signal handler dumps, they
    are where the signal was handled (say, a C call or gevent's loop)."""
    size, refs, skip = RECORD.size, bt._refs, 0
    for _, _, kind, _, _ in RECORD.iter_unpack(bt._raw):
        if kind != KIND_PYTHON or refs[skip].co_filename not in _OWN_FILES:
            break
        skip += 1
    trimmed = Backtrace(bt.capacity)
    trimmed._raw, trimmed._refs, trimmed.truncated = bt._raw[skip * size:], refs[skip:], bt.truncated
    return trimmed


def _capture(info: GreenletInfo, current) -> None:
    """Fill info.backtrace; a greenlet that changed meanwhile gets info.error."""
    g = info.greenlet
    try:
        if g is current:
            info.backtrace = without_own_frames(collect(capacity=CAPACITY))
        elif info.state == RUNNING:
            info.backtrace = python_frames_of_thread(info.thread_id)
            info.python_only = True
            if info.backtrace is None:
                info.error = "running in a thread that cannot be identified"
        else:
            info.backtrace = collect_suspended(g)
            if base_dead(g):
                info.error = GONE
    except BacktraceError as e:
        info.error = f"BacktraceError: {e}"
    except RuntimeError:   # it started running in another thread meanwhile
        info.error = "started running in another thread during the snapshot"


def collect_suspended(g) -> Backtrace:
    """collect(g) for a greenlet state_of() found suspended.

    collect() applies greenlet's rule, so it refuses a greenlet of another
    thread suspended without Python frames; state_of() knows it is
    suspended, so it is captured as collect() captures one of this thread.
    """
    if base_frame(g) is not None or not layout_known():
        return collect(g, capacity=CAPACITY)
    bt = Backtrace(CAPACITY)
    rc = lib.btc_collect(id(g), id(bt), CAPACITY, CAPACITY, _WANT_SUSPENDED)
    if rc < 0:
        raise BacktraceError(ffi.string(lib.btc_last_error()).decode())
    return bt


def snapshot(*, pause=None) -> list[GreenletInfo]:
    """Every live greenlet of the process, in every thread (dead ones excluded),
    and every pending asyncio task (btcore.capture.tasks.TaskInfo entries).

    Ordered by thread (the calling thread first), then as found.  Raw
    backtraces only: nothing is resolved here.

    pause: None (one step: the snapshot of one moment), or a callable run
    after every PAUSE_EVERY greenlets, e.g. gevent.sleep(0), to let the
    event loop run in between (a view serving requests from that loop); a
    greenlet's state, name and stack are still taken together, one greenlet
    at a time, and one that ended meanwhile is left out.
    """
    current = greenlet.getcurrent()
    current_root = root_of(current)
    writer_root = dumpwriter.root()   # btcore's own thread: left out, as threads_of_greenlets() leaves it out
    try:
        # greenlet's layout (learned once) tells which greenlet each thread runs, and stack marks
        layout_known()
    except BacktraceError:   # being learned on this thread: the fallback rule, and threads told without marks
        pass
    found, roots = [], {}
    for g in live_greenlets():
        state = state_of(g, current)
        if state != DEAD and g is not writer_root:
            found.append((g, state))
            roots.setdefault(root_of(g), []).append(g)
    threads = threads_of_greenlets([g for g, _ in found])
    thread_of = thread_of_roots(roots, current_root, threads)
    spawn_chain = _spawn_chain_reader()
    now, infos = time.monotonic(), []
    for done, (g, state) in enumerate(found):
        if pause is not None and done and done % PAUSE_EVERY == 0:
            pause()
            now = time.monotonic()
        if pause is not None and done >= PAUSE_EVERY:
            state = state_of(g, current)   # as it is now, after the pauses
            if state == DEAD:
                continue
        info = GreenletInfo(g, state)
        info.thread_id = thread_of.get(root_of(g))
        thread = threads.get(info.thread_id)
        info.thread_name = thread.name if thread is not None else None
        _capture(info, current)
        if spawn_chain is not None:
            info.spawn_chain = read_optional(spawn_chain, g)
        info.last_ran = _last_ran(info, now)
        infos.append(info)
    tasks = _asyncio_tasks()
    if tasks is not None:
        infos.extend(tasks.task_infos(threads))
    mine = current_ident()
    infos.sort(key=lambda info: (info.thread_id != mine, info.thread_id is None, info.thread_id or 0))
    place_in_tree(infos)
    if tasks is not None:
        tasks.place_tasks(infos)
    _name_scheduled_green_threads(infos)
    return infos


def _asyncio_tasks():
    """btcore.capture.tasks (asyncio tasks as entries) when the program uses asyncio:
    a snapshot does not import asyncio itself."""
    if "asyncio.tasks" not in sys.modules:
        return None
    try:
        from . import tasks
    except ImportError:   # asyncio half imported: a signal's dump came during its import
        return None
    if getattr(tasks.__spec__, "_initializing", False):
        return None   # a dump run inside this thread's import of tasks (a signal's): it is half made
    return tasks


def place_in_tree(infos) -> None:
    """Set each info's `under`: its spawner if alive and in its thread, else
    its parent; never eventlet's hub (the parent of every green thread: the
    tree would put all of them under it, whoever spawned them)."""
    by_greenlet = {id(info.greenlet): info for info in infos}
    hubs = _eventlet_hubs(infos)
    for info in infos:
        for above in (info.spawned_by, info.parent):
            found = by_greenlet.get(id(above)) if above is not None else None
            if found is not None and found.thread_id == info.thread_id and id(above) not in hubs:
                info.under = found.greenlet
                break


def _name_scheduled_green_threads(infos) -> None:
    """An eventlet GreenThread that has not started yet gets its function
    only at its first switch: until then the function is an argument of the
    hub's timer that will make that switch (the calling thread's hub; other
    threads' hubs are not read while they run)."""
    kind = getattr(sys.modules.get("eventlet.greenthread"), "GreenThread", None)
    waiting = {id(info.greenlet): info for info in infos
               if info.state == NOT_STARTED and kind is not None and isinstance(info.greenlet, kind)}
    hub = getattr(getattr(sys.modules.get("eventlet.hubs"), "_threadlocal", None), "hub", None)
    if not waiting or hub is None:
        return
    for entry in read_optional(_eventlet_timers, hub) or ():
        cb, args = entry
        info = waiting.get(id(getattr(cb, "__self__", None)))
        if info is not None and getattr(cb, "__name__", None) == "switch" and args:
            info.name = plain_name_of(info.greenlet, getattr(args[0], "__name__", None))


def _eventlet_timers(hub) -> list:
    """(callback, args) of every timer an eventlet hub holds."""
    timers = []
    for _, timer in list(hub.timers) + list(hub.next_timers):
        cb, args, _ = getattr(timer, "tpl", (None, (), None))
        timers.append((cb, args))
    return timers


def _eventlet_hubs(infos) -> set:
    """ids of eventlet hubs' greenlets: the parent of every eventlet
    GreenThread, and the calling thread's hub."""
    greenthread = sys.modules.get("eventlet.greenthread")
    kind = getattr(greenthread, "GreenThread", None)
    if kind is None:
        return set()
    hubs = {id(info.parent) for info in infos if isinstance(info.greenlet, kind) and info.parent is not None}
    hub = getattr(getattr(sys.modules.get("eventlet.hubs"), "_threadlocal", None), "hub", None)
    if getattr(hub, "greenlet", None) is not None:
        hubs.add(id(hub.greenlet))
    return hubs


def _last_ran(info, now) -> float | None:
    """Seconds since info's greenlet last ran (0 while it runs), when switch timing saw it."""
    stamp = switched_out_at(info.greenlet)
    if stamp is None:
        return None
    return 0.0 if info.state == RUNNING else max(0.0, now - stamp)


def read_optional(reader, g, *more):
    """reader(g, *more), or None if it raises: optional data must not fail the snapshot."""
    try:
        return reader(g, *more)
    except Exception:
        return None

