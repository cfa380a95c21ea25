"""The signal dump's writer: one OS thread that does, in order, the work that
signal handlers hand it (register_dump_signal: name, render, write a dump).

Why a thread: a Python signal handler runs in the main thread, between two
bytecodes of whatever it interrupted, in a gevent or eventlet process the
event loop, which waits for the handler.  Capturing 2,000 greenlets takes
~10-20 ms; naming their frames and rendering the text took ~0.5 s.  The
handler keeps only the capture and queues the rest here; the loop runs on
while this thread works (it takes the GIL in turns, Python's switch interval,
and gives it up inside the core's name lookups).  One thread, one FIFO queue:
dumps come out whole and in the order their signals were handled.

It must be a real OS thread even in a monkey-patched process (a greenlet
"thread" would run inside the very loop it should spare), so it is started
with _thread.start_new_thread as it was before gevent or eventlet patched it,
and it waits on _queue.SimpleQueue (C, never patched; put() is safe inside a
signal handler).
"""
from __future__ import annotations

import _queue
import atexit
import os
import weakref
from functools import partial

import greenlet

from ..capture.threads import real_thread

DRAIN_TIMEOUT = 30.0   # seconds unregister and exit wait for queued dumps: bounded, a hung file must not hang exit
MAX_PENDING = 4        # jobs queued behind the one being done, at most (each holds a whole snapshot)
_jobs = None           # the writer's queue of callables (None: no writer; None in it: stop)
_ident = None          # the writer thread's ident
_pid = None            # the process the writer runs in
_root = None           # weak reference to the writer thread's main greenlet


def _real_start_new_thread():
    """_thread.start_new_thread as it was before gevent or eventlet patched it (tests replace it)."""
    return real_thread("start_new_thread")


def start() -> bool:
    """Start the writer thread unless it runs; False if no OS thread can be started."""
    global _jobs, _ident, _pid
    if _running() is not None:
        return True
    jobs = _queue.SimpleQueue()
    try:
        _ident = _real_start_new_thread()(_run, (jobs,))
    except (RuntimeError, MemoryError):   # no threads here (limits, a finalizing interpreter)
        return False
    _jobs, _pid = jobs, os.getpid()
    return True


def _run(jobs) -> None:
    # Made here, known: naming and rendering make this thread's main greenlet
    # anyway (any greenlet call does), and snapshot() must leave it out as it
    # leaves the thread out (running, never switched: no thread to pair with).
    global _root
    _root = weakref.ref(greenlet.getcurrent())
    while True:
        job = jobs.get()
        if job is None:
            return
        try:
            job()
        except BaseException:   # jobs report their own failures; the writer outlives any one of them
            pass


def _running():
    """The writer's queue, if its thread runs in this process.  A child
    forked from C (uWSGI's workers, unless --py-call-osafterfork) runs no
    at-fork hook: it has the queue and no thread to read it."""
    jobs = _jobs
    return jobs if jobs is not None and _pid == os.getpid() else None


def submit(job) -> bool:
    """Queue job (a callable) for the writer; False if no writer runs (the
    caller does the work itself).  Safe in a signal handler: C calls only."""
    jobs = _running()
    if jobs is None:
        return False
    jobs.put(job)
    return True


def backlogged() -> bool:
    """Whether MAX_PENDING jobs wait already: the writer is stuck (on a
    file that blocks, say), and a signal handler should not queue more."""
    jobs = _running()
    return jobs is not None and jobs.qsize() >= MAX_PENDING


def drain(timeout: float | None = None) -> bool:
    """Wait until every job queued so far is done: True, or False after
    timeout seconds (None: DRAIN_TIMEOUT, read now)."""
    jobs = _running()
    if jobs is None:
        return True
    done = _queue.SimpleQueue()
    jobs.put(partial(done.put, True))   # FIFO: done once everything before it is
    try:
        return done.get(timeout=DRAIN_TIMEOUT if timeout is None else timeout)
    except _queue.Empty:
        return False


def stop(timeout: float | None = None) -> bool:
    """Drain, then let the thread end (a later start() starts another)."""
    global _jobs, _ident
    drained = drain(timeout)
    jobs, _jobs, _ident = _running(), None, None
    if jobs is not None:
        jobs.put(None)
    return drained


def root():
    """The writer thread's main greenlet, or None."""
    return _root() if _root is not None and ident() is not None else None


def ident():
    """The writer thread's ident, or None: btcore's own thread, which runs no greenlets."""
    return _ident if _running() is not None else None


def _restart_in_child() -> None:
    """fork() copies only the forking thread: the child has the queue but no
    writer.  It gets a new one; jobs queued before the fork are the parent's
    to write (written twice otherwise)."""
    global _jobs, _ident
    if _jobs is not None:
        _jobs = _ident = None
        start()


os.register_at_fork(after_in_child=_restart_in_child)
atexit.register(drain)
