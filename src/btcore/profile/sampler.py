"""start_profiler() / stop_profiler(): a sampling profiler that sees every greenlet.

A sampler thread (a real OS thread, also in a monkey-patched process) wakes
`rate` times a second and, holding the GIL, records for every thread the
stack it is running (its running greenlet: Python frames, from the
interpreter) and, for the parked greenlets whose turn it is (each is looked
at PARKED_RATE times a second: see Profiler._parked), their merged
native + Python stack (btcore.collect()).  A sample is the raw record of a stack: no name is
looked up while sampling.  Equal samples are counted once: the profile maps
(raw stack, greenlet group, state) to a count, bounded by max_stacks (new
keys past the bound are counted in one "(other)" entry).  Names are looked
up after sampling, once per distinct raw frame (Profile.stacks()).

Each sample weighs the time since the previous tick ended (microseconds), not 1:
a sampler that wants the GIL waits until the running thread drops it (up to
the switch interval, 5 ms), so a greenlet that computes delays the ticks
that fall in its run; counting ticks would under-count it (a greenlet
computing half the time got 23% of the ticks here, and 50% of the time).

Two views of the same samples:
  cpu   what the running greenlet of each thread was executing
  wall  every greenlet, running or parked: where each spends its time
"""
from __future__ import annotations

import atexit
import os
import re
import sys
import time
import weakref

import greenlet

from .._native import lib
from ..capture.backtrace import KIND_NATIVE, KIND_PYTHON, RECORD
from ..errors import BacktraceError
from ..views.fold import is_plumbing
from ..capture.introspect import (RUNNING, SUSPENDED, base_frame, collect_suspended, function_of,
                                  gevent_name_of, known_states, live_greenlets, parked_unmoved,
                                  read_optional, plain_name_of, python_frames_of_thread, root_of, state_of, thread_of_roots,
                                  threads_of_greenlets)
from .rates import DEFAULT_RATE, MAX_RATE
from ..symbols.resolve import resolve_native, resolve_python
from ..capture.greenlets import layout_known
from ..capture.spawn import spawn_chain, take_created
from ..capture.threads import MAX_THREADS, thread_clocks

RUNNING_STATE = "running"
PARKED_STATE = "parked"
OTHER = "(other)"            # the bucket of samples past max_stacks
DEFAULT_MAX_STACKS = 4096
CAPACITY = 128               # raw frames kept per sampled stack
SLICE = 64                   # greenlets captured per hold of the GIL
PARKED_RATE = 20             # looks per second at each parked greenlet, at most (see Profiler._parked)
PROGRESS_EVERY = 30.0        # seconds between progress calls (python -m btcore profile's line)
MAIN_EVERY = 10              # ticks a parked main greenlet's stack may be reused (see parked_stack)
_GREENLET_N = re.compile(r"^(\S+?)-\d+\b")   # gevent's "Greenlet-12": one group per function
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")

_profiler = None             # the running Profiler, if any
_base_parent = greenlet.greenlet.parent.__get__


def group_name(name: str) -> str:
    """A greenlet's name without what differs between greenlets running the
    same function: gevent's counter ("Greenlet-3 (handler)" -> "Greenlet
    (handler)") and object addresses."""
    return _ADDRESS.sub("", _GREENLET_N.sub(r"\1", name))


class Profile:
    """What a profiler recorded: raw stacks and their counts.

    rate        samples per second asked for
    ticks       samples taken (each a look at every thread and greenlet)
    sampled     microseconds the samples stand for (the sum of their weights)
    busy        seconds the sampler spent taking samples (holding the GIL, mostly: the
                program is paused meanwhile), wall-clock
    busy_cpu    the same in the sampler thread's CPU time (busy minus the time the
                OS ran other work: on a loaded machine much less than busy)
    missed      ticks skipped because the previous one ran late
    duration    seconds from start to stop
    max_stacks  distinct (stack, group, state) keys kept
    other       microseconds counted in the "(other)" bucket once max_stacks was reached

    Both samplers fill it: this process's (start_profiler) and the outside one
    (btcore/profile/remote.py), whose records name another process's frames:
    frames_of(addr, lasti, kind, flags, ref) gives the Frames of one raw
    record (default: this process's resolution).
    """

    def __init__(self, rate: int, max_stacks: int, frames_of=None):
        self.rate, self.max_stacks = rate, max_stacks
        self._frames_of = frames_of or _local_frames
        self.ticks = self.missed = self.sampled = 0
        self._other = {}   # state -> microseconds past max_stacks
        self.duration = self.busy = self.busy_cpu = 0.0
        self.start_time = time.time()
        # (raw bytes, name group, spawn site or None, state) -> [count, code refs]
        self._counts = {}

    def add(self, bt, name: str, site, state: str, weight: int) -> bool:
        """Count weight (microseconds) for stack bt (a Backtrace, raw) of group
        name in state; True when it made a new key."""
        return self.count((bytes(bt._raw), name, site, state), bt._refs, weight)

    def entry(self, key: tuple):
        """The [count, refs] of a key counted before (its count may be raised in
        place), or None (not counted, or in "(other)")."""
        return self._counts.get(key)

    def count(self, key: tuple, refs: tuple, weight: int) -> bool:
        """add() of a key made before: (raw bytes, name group, spawn site or
        None, state), refs its Backtrace's; a stack counted again and again
        keeps its key (its bytes' hash is kept with them)."""
        entry = self._counts.get(key)
        if entry is not None:
            entry[0] += weight
        elif len(self._counts) < self.max_stacks:
            # The code objects keep the Python records' ids valid until resolved.
            self._counts[key] = [weight, refs]
            return True
        else:
            self._other[key[3]] = self._other.get(key[3], 0) + weight
        return False

    @property
    def other(self) -> int:
        return sum(self._other.values())

    def __len__(self) -> int:
        """Distinct raw (stack, group, state) keys recorded."""
        return len(self._counts)

    def stacks(self, mode: str = "wall", group_by: str | None = "name", verbose: bool = False) -> dict:
        """{(frame name, ...) outermost first: microseconds} for mode "cpu" (the
        running greenlet of each thread) or "wall" (every greenlet).

        group_by "name" (greenlet name without its number), "spawn" (the
        spawn site, when spawn tracking was on) or None: the group is the
        first item of each stack, then in wall mode the state ("running" or
        "parked").  verbose=False leaves out the interpreter's call
        plumbing (btcore.views.fold), as the readable backtrace view does.
        Names are looked up here, once per distinct raw frame."""
        _check_view(mode, group_by)
        names, out = {}, {}
        for (raw, name, site, state), (count, refs) in self._counts.items():
            if mode == "cpu" and state != RUNNING_STATE:
                continue
            prefix = _group_prefix(name, site, group_by, names)
            if mode == "wall":
                prefix += (state,)
            key = prefix + _stack_names(raw, refs, names, verbose, self._frames_of)
            out[key] = out.get(key, 0) + count
        other = self._other.get(RUNNING_STATE, 0) if mode == "cpu" else self.other
        if other:
            out[(OTHER,)] = other
        return out

    def write(self, path, format: str | None = None, *, mode: str = "wall", group_by: str | None = "name",
              verbose: bool = False) -> str:
        """Write the profile to path as "pprof", "collapsed" or "html"
        (default: from the file name: .pb.gz/.pprof, .txt/.collapsed, .html);
        returns the format.  mode ("wall" or "cpu") picks the collapsed view:
        pprof and HTML hold both; group_by and verbose as in stacks()."""
        from . import formats as profile_formats
        _check_view(mode, group_by)
        return profile_formats.write(self, path, format, mode, group_by, verbose)

    def __repr__(self) -> str:
        return f"<btcore.Profile {self.ticks} samples at {self.rate} Hz, {len(self)} stacks>"


def _check_view(mode, group_by) -> None:
    if mode not in ("cpu", "wall"):
        raise ValueError(f"mode must be 'cpu' or 'wall', got {mode!r}")
    if group_by not in ("name", "spawn", None):
        raise ValueError(f"group_by must be 'name', 'spawn' or None, got {group_by!r}")


def _group_prefix(name, site, group_by, names) -> tuple:
    if group_by == "name":
        return (name,)
    if group_by == "spawn":
        return (_site_name(site, names),)
    return ()


def _site_name(site, names: dict) -> str:
    """"spawned at file:line (function)" of a site's innermost Python frame."""
    if site is None:
        return "spawn site unknown"
    key = ("site", id(site))
    if key not in names:
        frame = next((f for f in site.frames() if f.kind == "python"), None)
        names[key] = (f"spawned at {frame.file}:{frame.line} ({frame.function})" if frame is not None
                      else "spawn site without Python frames")
    return names[key]


def _stack_names(raw: bytes, refs, names: dict, verbose: bool, frames_of) -> tuple:
    """The frame names of a raw stack, outermost first; names: memo per raw record."""
    out, codes = [], iter(refs)
    for addr, lasti, kind, flags, _ in RECORD.iter_unpack(raw):
        ref = next(codes) if kind != KIND_NATIVE else None
        key = (addr, lasti, kind, flags, verbose)
        found = names.get(key)
        if found is None:
            found = names[key] = tuple(frame_name(f) for f in frames_of(addr, lasti, kind, flags, ref)
                                       if verbose or not is_plumbing(f))
        out.extend(found)
    out.reverse()
    return tuple(out)


def _local_frames(addr, lasti, kind, flags, ref) -> tuple:
    """The Frames of one raw record of this process, innermost first (an
    inlined call is a frame of its own)."""
    if kind == KIND_NATIVE:
        return resolve_native(addr, flags)
    if kind == KIND_PYTHON:
        return resolve_python(ref, lasti)
    return ref.frames()


def frame_name(frame) -> str:
    """One frame as a profile names it: "function (file:line)" for Python,
    "function [module]" for native code (the module's address when unnamed)."""
    if frame.kind == "python":
        return f"{frame.function} ({frame.file}:{frame.line})"
    module = os.path.basename(frame.module) if frame.module else "??"
    if frame.function is None:
        return f"[{module}+{frame.offset:#x}]" if frame.offset is not None else f"[{module}] {frame.ip:#x}"
    return f"{frame.function} [{module}]"


class _Greenlets:
    """The greenlets the sampler knows, by weak reference, with their group
    names.  The whole heap is scanned once, at the first tick (the greenlets
    made before the profiler started: ~40-70 ns per object in a server's
    heap, gc.get_objects() touching every object; the filter is
    introspect.live_greenlets()'s C type check, ~2 ns).  Later ones come from
    greenlet's creation hook (spawn.take_created(): a weak reference per
    greenlet made, kept while the profiler watches): a tick's cost no longer
    grows with what the program allocates.  The young-generation scan at every
    tick this replaced cost 35-110 us a tick in a loaded gunicorn worker.  When
    the hook kept too few (more than 10,000 creations between two ticks), the
    heap is scanned again."""

    def __init__(self):
        self.known = {}            # id -> (weakref, name group, spawn site)
        self.thread_of_root = {}   # id(root) -> thread ident
        self.scanned = False       # the heap's greenlets were found (the first tick)
        self.stacks = {}           # id -> (stamp, Backtrace, Profile entry or None) of a parked greenlet:
                                   # see parked_stack() and keep_entry()
        self.counted = {}          # id -> Profile.sampled up to which its time is counted: see Profiler._parked()
        self.unplaced = {}         # id -> us it spent parked before a look saw it parked: see Profiler._unlooked_parked()

    def refresh(self, sampler_current, since: int) -> None:
        """Learn the greenlets made since the last refresh; their time is counted from since (Profile.sampled)."""
        created, lost = take_created()
        if lost or not self.scanned:
            found = live_greenlets()
            self.scanned = True
            self.known = {i: v for i, v in self.known.items() if v[0]() is not None}
            self.stacks = {i: v for i, v in self.stacks.items() if i in self.known}
            self.counted = {i: v for i, v in self.counted.items() if i in self.known}
            self.unplaced = {i: v for i, v in self.unplaced.items() if i in self.known}
        else:
            found = [g for g in (ref() for ref in created) if g is not None]
        mine = root_of(sampler_current)
        new_roots = False
        for g in found:
            key, entry = id(g), self.known.get(id(g))
            if entry is not None and entry[0]() is g:
                continue
            root = root_of(g)
            if root is not mine:
                self.known[key] = (weakref.ref(g), None, None)
                self.stacks.pop(key, None)
                self.counted[key] = since
                new_roots = new_roots or id(root) not in self.thread_of_root
        if new_roots:
            self._map_threads(sampler_current)

    def _map_threads(self, sampler_current) -> None:
        roots = {}
        for ref, _, _ in self.known.values():
            g = ref()
            if g is not None:
                roots.setdefault(root_of(g), []).append(g)
        threads = threads_of_greenlets([g for members in roots.values() for g in members])
        found = thread_of_roots(roots, root_of(sampler_current), threads)
        self.thread_of_root = {id(root): ident for root, ident in found.items()}

    def forget(self, key: int) -> None:
        self.known.pop(key, None)
        self.stacks.pop(key, None)
        self.counted.pop(key, None)
        self.unplaced.pop(key, None)

    def last_parked(self, key: int):
        """The Backtrace g had when last captured parked, or None."""
        known = self.stacks.get(key)
        return known[1] if known is not None else None

    def keep_entry(self, key: int, bt, entry) -> None:
        """Keep with greenlet key's parked stack bt the Profile entry it was
        just counted under, once its labels are complete (they name the
        entry's key for good): a later look that finds the same stamp adds
        to it in C (introspect.parked_unmoved)."""
        known = self.stacks.get(key)
        if known is not None and known[1] is bt and entry is not None and self.known[key][1] is not None:
            self.stacks[key] = (known[0], bt, entry)

    def parked_stack(self, key: int, g, tick: int):
        """g's stack (g is parked): the one captured at an earlier tick when
        its stamp is unchanged, else a new capture (~2-10 us).  The stamp
        (lib.btc_greenlet_stamp, ~1.1 us): a hash of its Python frames (code
        and instruction of each, btcore's interpreter-frame walk, no
        unwinding) and of where its native stack stopped (saved sp and saved
        size).  Frame object ids would not do: a greenlet that parks in turn
        at two places through gevent.sleep() gets a new frame at the same
        address each time.  A thread's main greenlet is another thread's for
        the sampler, and any capture of it reads /proc/self/maps for its
        stack's end (~0.1-0.2 ms): it is stamped by its innermost frame and
        offset only, and captured again at least every MAIN_EVERY ticks."""
        frame = base_frame(g)
        if frame is None:   # parked in C with no Python frame: nothing to stamp
            bt = collect_suspended(g)
            self.stacks[key] = (None, bt, None)
            return bt
        if _base_parent(g) is None:
            stamp = (id(frame), frame.f_lasti, tick // MAIN_EVERY)
        else:
            stamp = lib.btc_greenlet_stamp(id(g)) or None   # 0: unreadable, captured (and refused) below
        known = self.stacks.get(key)
        if known is not None and stamp is not None and known[0] == stamp:
            return known[1]
        bt = collect_suspended(g)
        self.stacks[key] = (stamp, bt, None)
        return bt

    def labels(self, key: int, g, frame=None) -> tuple:
        """(name group, spawn site) of g, kept once complete.  frame: g's
        innermost frame when g runs in another thread (where greenlet does
        not show its frames).  A plain greenlet's name holds its function,
        known once it has started, and only if g ran where it was looked
        for: a greenlet read as parked may run by now in the program's
        thread (the sampler gives up the GIL during a tick), and its name
        without its function ("<gevent.hub.Hub>", not "<gevent.hub.Hub>
        (run)") is looked up again next time, not kept for the profile."""
        ref, name, site = self.known[key]
        if name is None:
            gevent_name = read_optional(gevent_name_of, g)
            function = None if gevent_name else read_optional(function_of, g, frame)
            name = group_name(gevent_name or plain_name_of(g, function))
            site = _spawn_site(g)
            if _state_is_started(g) and (gevent_name or function or _base_parent(g) is None):
                self.known[key] = (ref, name, site)
        return name, site


def _state_is_started(g) -> bool:
    return greenlet.greenlet.__bool__(g) or greenlet.greenlet.dead.__get__(g)


def _spawn_site(g):
    """The interned site where g was created, if spawn tracking recorded it."""
    chain = read_optional(spawn_chain, g)
    return chain.links[0][0] if chain is not None and chain.links else None


class Profiler:
    """The sampler thread and the profile it fills; see start_profiler()."""

    def __init__(self, rate: int, max_stacks: int, threads_only: bool, duration: float | None):
        self.profile = Profile(rate, max_stacks)
        self.threads_only = threads_only
        self.duration = duration
        # Called in the sampler thread (python -m btcore profile sets them): with
        # the profile when the duration ends; every PROGRESS_EVERY s while sampling.
        self.on_duration_end = self.on_progress = None
        self._interval = 1.0 / rate
        self._greenlets = _Greenlets()
        # Parked greenlets are looked at in turns: phase p's at ticks p, p + phases, ...: see _parked().
        self._phases = -(-rate // PARKED_RATE)   # ceil: at most PARKED_RATE looks a second at each
        # thread ident -> (sample, greenlet key or None, CPU ns, its Profile entry or None) at the previous tick
        self._previous = {}
        self._thread_labels = {}
        # A wait for the GIL this long (us) was ended by a forced switch (see _running_threads).
        self._forced_switch = int(sys.getswitchinterval() * 0.8 * 1e6)
        # Taken now: the sampler may run while gevent.monkey is half imported.
        self._sleep = _original("time", "sleep")
        self._stop = _original("_thread", "allocate_lock")()
        self._stop.acquire()            # released by stop(): the sampler's sleep ends at once
        self._done = _original("_thread", "allocate_lock")()
        self._done.acquire()            # released by the sampler when it exits
        self._started = self._last = time.monotonic()
        self._pid = os.getpid()
        self.error = None

    def start(self) -> None:
        # What the sampler thread will import, imported here: an import takes the module's
        # import lock, which gevent's monkey-patching makes a gevent lock (importlib allocates it
        # from _thread at each import); taken from the sampler, a real thread, the duration's
        # write failed with gevent's "cannot release un-acquired lock" (3.13, and 3.11 under ASan).
        from . import formats as profile_formats
        from ..capture import threads  # noqa: F401
        from ..views import html  # noqa: F401  (formats.html() imports it: the duration's .html write, seen on CI)
        if not self.threads_only and lib.btc_spawn_watch_creation(1) != 0:   # before the first tick's heap scan
            raise RuntimeError("btcore profiler: cannot watch greenlet creation (out of memory?)")
        _original("_thread", "start_new_thread")(self._run, ())

    def _run(self) -> None:
        try:
            if not self.threads_only:
                # greenlet's layout, learned before the first tick (here: the sampler's thread has a
                # main greenlet anyway, the caller's may have none): it tells which greenlet each
                # thread runs; until then one parked without Python frames reads as running
                layout_known()
            ended = self._loop()
            self._parked_rest()
            if ended:   # the duration ended
                profile = self._finish()
                if self.on_duration_end is not None:
                    self.on_duration_end(profile)
        except BaseException as e:   # the sampler must end quietly; stop() reports it
            self.error = e
        finally:
            self.stop_watching()
            self._done.release()

    def stop_watching(self) -> None:
        """Stop watching greenlet creation (sampling has ended)."""
        if not self.threads_only:
            lib.btc_spawn_watch_creation(0)

    def _loop(self) -> bool:
        """Sample until stopped (False) or until the duration ends (True)."""
        deadline = time.monotonic()
        end = deadline + self.duration if self.duration is not None else float("inf")
        progress = deadline + PROGRESS_EVERY
        while not self._stop.acquire(timeout=max(0.0, deadline - time.monotonic())):
            if deadline >= end:
                return True
            self.sample(deadline)
            if self.on_progress is not None and deadline >= progress:
                progress += PROGRESS_EVERY
                self.on_progress(self.profile)
            deadline = past_missed(self.profile, deadline + self._interval, self._interval)
        return False

    def sample(self, due: float) -> None:
        """One tick (due at `due`): every thread's running stack, then every
        parked greenlet's, each weighing the time since the previous tick
        ended (the program is paused while a tick holds the GIL: that time
        is nobody's)."""
        now, cpu, current = time.monotonic(), time.thread_time(), greenlet.getcurrent()
        weight = int((now - self._last) * 1e6)
        waited = min(weight, int((now - max(due, self._last)) * 1e6))
        self.profile.ticks += 1
        self.profile.sampled += weight
        parked = self._running_threads(current, weight, max(0, waited))
        self._parked(current, parked)
        self._last = time.monotonic()
        self.profile.busy += self._last - now
        self.profile.busy_cpu += time.thread_time() - cpu

    def _thread_label(self, ident) -> str:
        """"thread NAME" of a thread with no greenlet known, once per ident
        (listing the threads costs; at most MAX_THREADS kept)."""
        label = self._thread_labels.get(ident)
        if label is None:
            if len(self._thread_labels) >= MAX_THREADS:
                self._thread_labels.clear()
            label = self._thread_labels[ident] = _thread_label(ident)
        return label

    def _running_threads(self, current, weight: int, waited: int) -> None:
        """Record each thread's running stack, named by its running greenlet
        when known.  waited: the part of weight the sampler waited for the
        GIL.  A wait shorter than the switch interval ended because the
        holder blocked (gevent's hub entering its loop, after a greenlet's
        run ended): the wait goes to what each thread ran at the previous
        tick.  A longer one was ended by the interpreter forcing the holder
        to drop the GIL: the holder still runs, and the wait is its time.
        Returns the parked greenlets [(key, greenlet)] (their state is
        read once per tick, here)."""
        # Every thread's CPU clock and switch count, read before the states and stacks: a thread
        # that runs after this read is read again at the next tick.
        clocks = thread_clocks()
        running = dict.fromkeys(clocks)
        parked = []
        if not self.threads_only:
            self._greenlets.refresh(current, self.profile.sampled - weight)
            parked = self._parked_states(current, running, (self.profile.ticks - 1) % self._phases)
        previous, self._previous = self._previous, {}
        for ident, found in running.items():
            before, (cpu, switches) = previous.get(ident), clocks[ident]
            if before is not None and cpu >= 0 and cpu == before[2] and before[1] == (found[0] if found else None):
                if self._still(before, weight):   # it ran no instruction since: the same stack, counted
                    self._previous[ident] = before
                    continue
                sample, key = before[0], before[1]
            else:
                sample, key = self._thread_sample(ident, found, current, switches)
                if sample is None:
                    continue
            early = before is not None and 0 < waited < self._forced_switch
            if early:
                self.profile.count(*before[0], waited)
                self._counted_more(before[1], waited)
            ran = weight - waited if early else weight
            stack, refs = sample
            if key is not None:
                self._unlooked_parked(key, stack[1], stack[2], self.profile.sampled - ran)
            self.profile.count(stack, refs, ran)
            self._previous[ident] = (sample, key, cpu, self.profile.entry(stack))
        return parked

    @staticmethod
    def _still(before, weight: int) -> bool:
        """Count a tick of a thread that ran nothing since the previous one
        and runs no known greenlet (before: what was recorded for it then)
        in place, if its stack has an entry: the whole weight goes to the
        stack it had (the part a short wait for the GIL gives the previous
        tick's stack is the same stack).  Most threads of a server are such
        at most ticks (a gunicorn worker's resolver threads).  A known
        greenlet's thread takes the general path: that greenlet's time is
        kept count of (_unlooked_parked)."""
        entry = before[3]
        if entry is None or before[1] is not None:
            return False
        entry[0] += weight
        return True

    def _thread_sample(self, ident, found, current, switches) -> tuple:
        """(((raw, name, site, RUNNING_STATE), code refs): the Profile key of
        its running stack, key of the known greenlet it runs or None) of
        thread ident now, or (None, None) if it has gone (or runs no Python
        code).  found: the known greenlet read as running there, (key,
        greenlet) or None; switches: the thread's switch count before the
        states were read."""
        # Its innermost frame, where a name is still to be found; read, as the stack, between the
        # states and the switch count's second read, which tells whether the thread switched since.
        frame = sys._current_frames().get(ident) if found and self._greenlets.known[found[0]][1] is None else None
        bt = python_frames_of_thread(ident)
        if found and lib.btc_thread_switch_count(ident) != switches:
            found, bt, frame = self._unswitched_sample(ident, current)
        if bt is None or not len(bt):
            return None, None
        name, site = self._greenlets.labels(*found, frame) if found else (self._thread_label(ident), None)
        return ((bytes(bt._raw), name, site, RUNNING_STATE), bt._refs), found[0] if found else None

    def _counted_more(self, key, us: int) -> None:
        """us more of greenlet key's time was counted (as running)."""
        if key in self._greenlets.counted:
            self._greenlets.counted[key] += us

    def _unlooked_parked(self, key: int, name: str, site, upto: int) -> None:
        """Greenlet key is recorded running at this tick: its time not counted
        yet, up to upto (Profile.sampled where this tick's running part
        begins), it spent parked where no look saw it (its phase's turn had
        not come): counted at the stack it was last seen parked at.  A
        greenlet never seen parked yet keeps that time unplaced, for the
        first look that sees it parked (_parked()): with ticks running late
        under load, the first look that finds the greenlet parked can come
        several phase rounds (hundreds of ms) after it was made.  Then its
        time is counted up to now."""
        counted = self._greenlets.counted
        pending = upto - counted.get(key, upto)
        if pending > 0:
            bt = self._greenlets.last_parked(key)
            if bt is not None:
                self.profile.add(bt, name, site, PARKED_STATE, pending)
            else:
                self._greenlets.unplaced[key] = self._greenlets.unplaced.get(key, 0) + pending
        counted[key] = self.profile.sampled

    def _parked_states(self, current, running: dict, phase: int) -> list:
        """The known greenlets parked in phase, [(key, greenlet)]; each thread
        ident of running gets the known greenlet it runs, (key, greenlet);
        dead ones are forgotten.  The states are read in C (introspect's
        known_states(), state_of()'s rule): ~1 ms a tick at 1,000
        greenlets through state_of()."""
        turn, runs, gone = known_states(self._greenlets.known, current, self._phases, phase)
        for key, g in runs:
            ident = self._greenlets.thread_of_root.get(id(root_of(g)))
            if ident in running:
                running[ident] = (key, g)
        for key in gone:
            self._greenlets.forget(key)
        return turn

    def _unswitched_sample(self, ident, current) -> tuple:
        """(key and greenlet running in thread ident or None, its frames, the
        thread's frame) read with no switch of the thread between them.  The
        sampler may lose the GIL between any two of its steps: a greenlet
        read as running, then the hub's frames captured, then that greenlet
        running again was the hub's stack under the greenlet's name (seen
        under qemu).  After 3 tries: the thread's own label (None)."""
        for _ in range(3):
            before = lib.btc_thread_switch_count(ident)
            found = self._running_greenlet_of(ident, current)
            frame, bt = sys._current_frames().get(ident), python_frames_of_thread(ident)
            if lib.btc_thread_switch_count(ident) == before:
                return found, bt, frame
        return None, python_frames_of_thread(ident), sys._current_frames().get(ident)

    def _running_greenlet_of(self, ident, current):
        """(key, greenlet) of the known greenlet running in thread ident now, or None."""
        for key, (ref, _, _) in self._greenlets.known.items():
            g = ref()
            if (g is not None and self._greenlets.thread_of_root.get(id(root_of(g))) == ident
                    and state_of(g, current) == RUNNING):
                return key, g
        return None

    def _parked_rest(self) -> None:
        """At the sampler's end: the parked greenlets of every phase get their time not counted yet."""
        if not self.threads_only and self.profile.ticks:
            current = greenlet.getcurrent()
            for phase in range(self._phases):
                self._parked(current, self._parked_states(current, {}, phase))

    def _parked(self, current, parked: list) -> None:
        """Record the stacks of the parked greenlets [(key, greenlet)] of
        this tick's phase (see _parked_states()).  A tick looks at 1/phases
        of them (each is looked at PARKED_RATE times a second at most), so
        that a tick's cost is the running stacks' plus a fraction of the
        parked ones': in a loaded gunicorn worker most parked greenlets have
        moved since the previous tick, and their captures were most of a
        tick.  A look weighs the greenlet's time not counted yet (since it
        was made, last looked at or last seen running: _Greenlets.counted),
        so each greenlet's time adds up to the time sampled, running or
        parked, as when every greenlet was looked at every tick: the
        sampler's end looks at every phase (_parked_rest()); a greenlet
        seen running first gives the time it spent parked unseen to the
        stack it was last seen parked at, or, never seen parked yet, to the
        first stack it is seen parked at (_unlooked_parked()).  Those that
        have not moved since their last look (the same stamp) are counted
        first, in C, under the entry kept with their stack (keep_entry());
        the others are looked at here."""
        counted, now = self._greenlets.counted, self.profile.sampled
        parked = parked_unmoved(parked, self._greenlets.stacks, counted, self._greenlets.unplaced, now)
        for n, (key, g) in enumerate(parked):
            if n and n % SLICE == 0:
                self._sleep(0)   # let the program run between slices: it is paused while the sampler holds the GIL
            if n >= SLICE and state_of(g, current) != SUSPENDED:   # it may have run during a slice's pause
                continue
            weight = now - counted.get(key, now) + self._greenlets.unplaced.get(key, 0)
            if weight <= 0:
                continue
            try:
                bt = self._greenlets.parked_stack(key, g, self.profile.ticks)
            except (BacktraceError, RuntimeError):   # it changed under the sample: skipped
                continue
            name, site = self._greenlets.labels(key, g)
            self.profile.add(bt, name, site, PARKED_STATE, weight)
            self._greenlets.keep_entry(key, bt, self.profile.entry((bytes(bt._raw), name, site, PARKED_STATE)))
            counted[key] = now
            self._greenlets.unplaced.pop(key, None)

    def _finish(self) -> Profile:
        if not self.profile.duration:
            self.profile.duration = time.monotonic() - self._started
        return self.profile

    def stop(self) -> Profile:
        """Stop sampling (if the duration has not ended it) and return the profile."""
        self._stop.release()
        self._done.acquire()
        self._finish()
        if self.error is not None:
            raise RuntimeError(f"btcore profiler: the sampler failed: {self.error!r}") from self.error
        return self.profile


def past_missed(profile: Profile, deadline: float, interval: float) -> float:
    """The next tick's deadline: deadline, or when the sampler is already more
    than an interval late, the first one still ahead (the ticks skipped are
    counted in profile.missed)."""
    late = time.monotonic() - deadline
    if late > interval:
        skipped = int(late / interval)
        profile.missed += skipped
        deadline += skipped * interval
    return deadline


def _thread_label(ident) -> str:
    from ..capture.threads import os_threads
    for thread in os_threads():
        if thread.ident == ident:
            return f"thread {thread.name}"
    return f"thread 0x{ident:x}"


def _original(module: str, name: str):
    """module.name as it was before gevent's monkey-patching (the sampler
    needs a real thread, real locks and a real sleep)."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None:
        return monkey.get_original(module, name)
    return getattr(__import__(module), name)


def start_profiler(rate: int = DEFAULT_RATE, *, duration: float | None = None,
                   max_stacks: int = DEFAULT_MAX_STACKS, threads_only: bool = False) -> Profiler:
    """Start sampling every thread and greenlet `rate` times a second (1 to
    MAX_RATE) in a sampler thread; stop_profiler() returns the Profile.
    duration: seconds after which sampling ends by itself (stop_profiler()
    is still what returns the profile); None: until stop_profiler().

    max_stacks bounds the distinct (stack, group, state) keys kept (memory:
    at most ~2 KB each); samples past it are counted as "(other)".
    threads_only: only the running stack of each thread (no parked greenlets:
    the cost of a tick no longer grows with the number of greenlets).
    One profiler at a time per process."""
    global _profiler
    if type(rate) is not int or not 1 <= rate <= MAX_RATE:
        raise ValueError(f"rate must be an int from 1 to {MAX_RATE} (samples per second), got {rate!r}")
    if type(max_stacks) is not int or max_stacks < 1:
        raise ValueError(f"max_stacks must be a positive int, got {max_stacks!r}")
    if duration is not None and not (type(duration) in (int, float) and 0 < duration < float("inf")):
        raise ValueError(f"duration must be a positive number of seconds or None, got {duration!r}")
    if _profiler is not None:
        raise RuntimeError("a btcore profiler is already running in this process")
    _profiler = Profiler(rate, max_stacks, threads_only, duration)
    _profiler.start()
    return _profiler


def running_profiler() -> Profiler | None:
    """The profiler start_profiler() started and that is still running, or None."""
    return _profiler


def stop_profiler() -> Profile:
    """Stop the profiler start_profiler() started; returns its Profile."""
    global _profiler
    if _profiler is None:
        raise RuntimeError("no btcore profiler is running")
    running, _profiler = _profiler, None
    return running.stop()


class profiling:
    """with btcore.profiling(rate=100) as p: ...  then p.profile is the Profile."""

    def __init__(self, rate: int = DEFAULT_RATE, **options):
        self._args = (rate, options)
        self.profile = None

    def __enter__(self) -> profiling:
        rate, options = self._args
        start_profiler(rate, **options)
        return self

    def __exit__(self, *exc) -> None:
        self.profile = stop_profiler()


def _stop_at_exit() -> None:
    # A profiler left running: its sampler must not run Python code while
    # the interpreter tears down (python -m btcore profile's own exit
    # handler, registered later, runs before this one and writes first).
    if _profiler is not None:
        try:
            _profiler.stop()
        except RuntimeError:
            pass


atexit.register(_stop_at_exit)


def _forget_in_child() -> None:
    # The sampler thread does not exist in a fork child: its profiler is gone.
    global _profiler
    if _profiler is not None:
        _profiler.stop_watching()
    _profiler = None


os.register_at_fork(after_in_child=_forget_in_child)
