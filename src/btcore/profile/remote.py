"""ProcessProfiler / profile_process(): the sampling profiler from outside
(python -m btcore profile PID): every thread and every greenlet of another
process, with no agent inside it.

Each sample is one stop of the target on the dump's engine
(btcore/remote/snapshot.py's stop_and_copy(): the threads' registers and stacks,
every suspended greenlet's saved state and Python frames), reusing what
the previous sample learned: the target's modules and layout (read once),
the buffers the stop copies into and the list of memory chunks it read
(read again at the next stop in a few syscalls).  After the target runs
again its stacks are walked and merged in C (process.Walker: collect()'s
merge) into raw records, and counted into a btcore.profile.sampler.Profile, the
inside profiler's aggregation: interned raw stacks, max_stacks keys, the
same views (on-CPU: each thread's running stack; wall: every greenlet,
running or parked) and the same files.  Nothing is named per sample: a
Python record is named once, when its stack is first counted (its code
object lives in the target, which may exit before the recording ends),
native records once each after sampling, from the files on disk.

Groups: a parked greenlet is named by remote/names.py (gevent's name or
function, its type), read once per (address, outermost Python function).
Which greenlet a thread runs is not read from outside: a running stack
takes the group of the parked greenlets whose outermost Python function
is the same code (the greenlet it runs was seen parked there), else the
thread's ("thread TID").
"""
from __future__ import annotations

import collections
import dataclasses
import os
import random
import signal
import sys
import time

from ..capture.backtrace import KIND_NATIVE, RECORD
from ..errors import Terminated
from ..remote.process import DumpError, Walker, check_architecture
from .sampler import DEFAULT_MAX_STACKS, PARKED_STATE, RUNNING_STATE, Profile, group_name, past_missed
from .formats import write_somewhere
from .rates import MAX_RATE, OUTSIDE_RATE
from ..remote.snapshot import exited, open_live, rehearse, stop_and_copy
from ..remote.names import Labels
from .._native import ffi

DEFAULT_RATE = OUTSIDE_RATE  # samples per second: each one stops the target (5-20 ms at 1,000 greenlets)
MAX_LABELS = 1 << 16         # greenlet labels kept (then forgotten and read again)
MAX_NOTES = 16               # distinct notes of the target's reads kept
MAX_STOPS = 1 << 14          # stop times kept for the figures
JITTER = 0.5                 # each interval between samples is the period times 1 +- this, at random
_PYFRAME_SIZE = ffi.sizeof("btc_remote_pyframe")
ENDED_DURATION, ENDED_EXITED, ENDED_INTERRUPTED, ENDED_TERMINATED = "duration", "exited", "interrupted", "terminated"
STALE_COPY = ("a parked greenlet ran and parked again with the same saved state between two samples: it was left "
              "out of a sample, and its stack read whole at the next")


class TargetExited(DumpError):
    """The target exited while it was being profiled."""


class ProcessProfiler:
    """Samples process pid from outside into self.profile (a Profile).

    stops       the target's stop per sample, seconds (the last MAX_STOPS)
    cpu         seconds of this process's CPU time spent recording
    notes       what the reads of the target noted (distinct, at most MAX_NOTES)
    """

    def __init__(self, pid: int, rate: int = DEFAULT_RATE, *, max_stacks: int = DEFAULT_MAX_STACKS,
                 native: bool = True, timeout: float = 5.0):
        _check_settings(pid, rate, max_stacks)
        check_architecture()
        self.pid, self.timeout, self._interval = pid, timeout, 1.0 / rate
        self.target = open_live(pid)
        try:
            self._chunks, self._room = rehearse(self.target, False, spawns=False)   # (groups by site: not from outside)
            self._room.alternate()   # an unchanged greenlet's saved stack is copied from the previous sample's
            self._walker = None
            self._native = native
            self.profile = Profile(rate, max_stacks, frames_of=self._frames_of)
        except BaseException:
            self.close()
            raise
        self.stops, self.cpu, self.notes = collections.deque(maxlen=MAX_STOPS), 0.0, []
        self._labels = {}         # (greenlet address, outermost code) -> group
        self._previous = {}       # a parked greenlet's state at the last sample -> its stack
        self._code_groups = {}    # outermost code address -> group of the parked greenlets running it
        self._last = None         # when the previous sample's stop ended (perf_counter)
        self._started = time.monotonic()   # (again when recording starts)

    def _frames_of(self, addr, lasti, kind, flags, ref) -> tuple:
        return self._walker.names.frames(addr, lasti, kind, flags)

    def record(self, duration: float | None = None, on_progress=None, progress_every: float = 30.0) -> str:
        """Sample until duration seconds have passed (ENDED_DURATION; None: until
        interrupted, KeyboardInterrupt propagates) or the target exits
        (ENDED_EXITED).  on_progress(self) every progress_every seconds."""
        deadline = time.monotonic()
        end = deadline + duration if duration is not None else float("inf")
        if self._last is None:
            self._last, self._started = time.perf_counter(), time.monotonic()
        progress = deadline + progress_every
        cpu = time.process_time()
        try:
            while deadline < end:
                time.sleep(max(0.0, deadline - time.monotonic()))
                try:
                    self.sample()
                except TargetExited:
                    return ENDED_EXITED
                if on_progress is not None and time.monotonic() >= progress:
                    progress += progress_every
                    on_progress(self)
                deadline = self._next(deadline)
            return ENDED_DURATION
        finally:
            self.cpu += time.process_time() - cpu
            self.profile.duration = time.monotonic() - self._started

    def _next(self, deadline: float) -> float:
        # Jittered: a fixed period aliases with a program's own periods (a loop of 20 ms turns sampled at 50 Hz
        # hits the same phase every time: 66% of a greenlet's time read for 45%); the weights are measured times.
        return past_missed(self.profile, deadline + self._interval * random.uniform(1 - JITTER, 1 + JITTER),
                           self._interval)

    def sample(self) -> None:
        """One stop of the target: every thread's running stack and every parked
        greenlet's, counted with the time since the previous stop ended (the
        stops themselves are nobody's time: the target is paused)."""
        snap = self._stop()
        ended = time.perf_counter()
        weight = max(0, int(((ended - (self._last or ended)) - snap.stopped_for) * 1e6))
        self._last = ended
        if self._walker is None:
            self._walker = Walker(snap, self._native)
        threads, parked = self._walk(snap)
        profile = self.profile
        profile.ticks += 1
        profile.sampled += weight
        profile.busy += snap.stopped_for
        profile.busy_cpu += snap.stopped_cpu
        self.stops.append(snap.stopped_for)
        labels = _LazyLabels(snap)
        for g, bt in parked:
            self._count(bt, self._parked_group(g, labels), PARKED_STATE, weight)
        for t, bt in zip(snap.threads, threads):
            self._count(bt, self._running_group(t), RUNNING_STATE, weight)

    def _walk(self, snap) -> tuple:
        """([RemoteBacktrace] of snap's threads, [(GreenletCopy, RemoteBacktrace)] of its greenlets).  A
        greenlet whose saved state and Python frames are those of the previous sample has not run since
        (or ran and parked again at the very same place): its previous stack is reused, not walked again.
        One whose state is the same but whose Python frames differ ran and parked again with the same state:
        the stop took its saved stack from the previous sample's copy (g.reused), which may not be its stack
        now, so it is left out of this sample (a note) and its stack read from the target at the next."""
        previous, self._previous = self._previous, {}
        keys = [(g.address, g.start, g.stop, g.saved, g.spill is None, bytes(g.pyframes)) for g in snap.greenlets]
        walked = [g for g, key in zip(snap.greenlets, keys) if key not in previous and not g.reused]
        backtraces = self._walker.walk(dataclasses.replace(snap, greenlets=walked))
        fresh = iter(backtraces[len(snap.threads):])
        parked = []
        for g, key in zip(snap.greenlets, keys):
            bt = previous.get(key)
            if bt is None and g.reused:
                self._room.recopy.add(g.address)
                self._note(STALE_COPY)
                continue
            bt = bt or next(fresh)
            self._previous[key] = bt
            parked.append((g, bt))
        return backtraces[:len(snap.threads)], parked

    def _stop(self):
        """The next snapshot; TargetExited when the target has gone."""
        memory = self.target.memory
        # Read again first, together: what the rehearsal read (the first stop), else what the previous stop read.
        chunks, self._chunks = self._chunks or memory.chunks(), None
        memory.forget()
        noted = len(self.target.notes)
        try:
            snap = stop_and_copy(self.target, chunks, self._room, False, self.timeout)
        except DumpError:
            if exited(self.pid):
                raise TargetExited(f"process {self.pid} exited") from None
            raise
        finally:
            self._keep_notes(noted)
        if not any(t.regs is not None for t in snap.threads) and exited(self.pid):
            raise TargetExited(f"process {self.pid} exited")
        return snap

    def _keep_notes(self, noted: int) -> None:
        """The notes this stop added, kept once each; the target's list stays its first notes."""
        for note in self.target.notes[noted:]:
            self._note(note)
        del self.target.notes[noted:]

    def _note(self, note: str) -> None:
        if note not in self.notes and len(self.notes) < MAX_NOTES:
            self.notes.append(note)

    def _count(self, bt, group: str, state: str, weight: int) -> None:
        if bt._raw and self.profile.add(bt, group, None, state, weight):
            self._name_python(bt)

    def _name_python(self, bt) -> None:
        """Name a new stack's Python records now, while their code objects can be read (cached per record)."""
        frames = self._walker.names.frames
        for addr, lasti, kind, flags, _ in RECORD.iter_unpack(bt._raw):
            if kind != KIND_NATIVE:
                frames(addr, lasti, kind, flags)

    def _parked_group(self, g, labels) -> str:
        code = _outermost_code(g.pyframes)
        key = (g.address, code)
        group = self._labels.get(key)
        if group is None:
            if len(self._labels) >= MAX_LABELS:
                self._labels.clear()
                self._code_groups.clear()
            group = self._labels[key] = group_name(labels.get().label(g).name)
        if code is not None:
            self._code_groups[code] = group
        return group

    def _running_group(self, t) -> str:
        code = t.pyframes[-1][0] if t.pyframes else None
        group = self._code_groups.get(code)
        if group is not None:
            return group
        return f"thread {t.tid}" + (" (main thread)" if t.tid == self.pid else "")

    def stop_figures(self) -> str:
        """"target stopped X ms per sample (median; max Y ms; Z ms of CPU)" of the recording: Z, the mean
        CPU time this process spent in a stop, is what a stop costs on a machine with a CPU to spare."""
        if not self.stops:
            return "no sample taken"
        ordered = sorted(self.stops)
        return (f"target stopped {ordered[len(ordered) // 2] * 1e3:.1f} ms per sample (median; max "
                f"{ordered[-1] * 1e3:.1f} ms; {self.profile.busy_cpu / self.profile.ticks * 1e3:.1f} ms of CPU)")

    def close(self) -> None:
        """Let go of the target (its memory reader and temporary files): after the profile is written."""
        self.target.memory.close()


class _LazyLabels:
    """remote_names.Labels of one snapshot, made on first use (most samples label no new greenlet)."""

    def __init__(self, snap):
        self._snap, self._labels = snap, None

    def get(self) -> Labels:
        if self._labels is None:
            self._labels = Labels(self._snap)
        return self._labels


def _outermost_code(pyframes) -> int | None:
    """The code address of the outermost of a greenlet's packed Python frame records (innermost first)."""
    if len(pyframes) < _PYFRAME_SIZE:
        return None
    return int.from_bytes(pyframes[len(pyframes) - _PYFRAME_SIZE:len(pyframes) - _PYFRAME_SIZE + 8], "little")


def _check_settings(pid, rate, max_stacks) -> None:
    if type(pid) is not int or pid <= 0:
        raise ValueError(f"pid must be a positive int, got {pid!r}")
    if pid == os.getpid():
        raise ValueError("a process cannot profile itself from outside: use btcore.start_profiler()")
    if type(rate) is not int or not 1 <= rate <= MAX_RATE:
        raise ValueError(f"rate must be an int from 1 to {MAX_RATE} (samples per second), got {rate!r}")
    if type(max_stacks) is not int or max_stacks < 1:
        raise ValueError(f"max_stacks must be a positive int, got {max_stacks!r}")


def profile_process(pid: int, duration: float, rate: int = DEFAULT_RATE, **options) -> Profile:
    """Sample process pid from outside for duration seconds (or until it
    exits) at rate samples per second; returns the Profile, its Python
    frames named (native ones are named from the files on disk when asked).
    options: max_stacks, native, timeout (as ProcessProfiler).  Raises
    DumpPermissionError (what to change) or DumpError (no such process, not
    a CPython process, ...)."""
    if not (type(duration) in (int, float) and 0 < duration < float("inf")):
        raise ValueError(f"duration must be a positive number of seconds, got {duration!r}")
    profiler = ProcessProfiler(pid, rate, **options)
    try:
        profiler.record(duration)
        profiler.profile.stacks()   # names every native record while the vDSO's copy exists
        return profiler.profile
    finally:
        profiler.close()


# ---- python -m btcore profile PID ----


def profile_command_outside(pid: int, settings: dict) -> int:
    """python -m btcore profile PID (settings: as profile_run.run's): record
    until the duration ends, Ctrl-C or the target exits, then write what was
    recorded and say on stderr how it ended.  Returns the exit status."""
    try:
        profiler = ProcessProfiler(pid, settings["rate"])
    except (DumpError, ValueError) as e:
        print(f"btcore profile: {e}", file=sys.stderr)
        return 1
    output = settings["output"]
    print(f"btcore profile: recording process {pid} at {settings['rate']} Hz (Ctrl-C writes {output})",
          file=sys.stderr, flush=True)
    try:
        try:
            ended = profiler.record(settings["duration"], on_progress=lambda p: _progress(p, output))
        except KeyboardInterrupt as e:   # Ctrl-C, or SIGTERM (Terminated: __main__._as_a_tool)
            ended = ENDED_TERMINATED if isinstance(e, Terminated) else ENDED_INTERRUPTED
        # a second Ctrl-C or SIGTERM does not cut the file short
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            fmt, output, unwritten = write_somewhere(profiler.profile, output, settings["format"],
                                                     settings["mode"], settings["group_by"])
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        profiler.close()
    if unwritten:
        print(f"btcore profile: {unwritten}; what was recorded is in {output} instead", file=sys.stderr)
    _report(profiler, output, fmt, ended)
    return 0 if profiler.profile.ticks and not unwritten else 1


def _progress(profiler: ProcessProfiler, output: str) -> None:
    p = profiler.profile
    print(f"btcore profile: recording process {profiler.pid}, {p.ticks} samples, {len(p)} stacks, "
          f"{profiler.stop_figures()} (Ctrl-C writes {output})", file=sys.stderr)


def _report(profiler: ProcessProfiler, output: str, fmt: str, ended: str) -> None:
    p = profiler.profile
    other = f", {p.other / 1e6:.3f} s past max_stacks in (other)" if p.other else ""
    lines = [f"wrote {output} ({fmt}): {p.ticks} samples of process {profiler.pid} over {p.duration:.1f} s, "
             f"{len(p)} stacks{other}; {profiler.stop_figures()}; the profiler's CPU "
             f"{100 * profiler.cpu / max(p.duration, 1e-9):.0f}% of one core"]
    if ended == ENDED_EXITED:
        lines.append(f"process {profiler.pid} exited after {p.duration:.1f} s: the profile holds what was "
                     "recorded until then")
    elif ended in (ENDED_INTERRUPTED, ENDED_TERMINATED):
        how = "interrupted (Ctrl-C)" if ended == ENDED_INTERRUPTED else "terminated (SIGTERM)"
        lines.append(f"{how}: the profile holds what was recorded until then")
    lines += [f"note: {note}" for note in profiler.notes]
    for line in lines:
        print(f"btcore profile: {line}", file=sys.stderr)
