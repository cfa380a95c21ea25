"""Opt-in switch timing: when each greenlet last ran, for snapshot()'s last_ran.

A greenlet trace function (greenlet.settrace, per thread) stamps the
greenlet being switched away from with time.monotonic(), in the greenlet's
own __dict__ (so the stamp lives and dies with the greenlet: nothing to
bound, nothing to clean up).  The tracer takes no lock and calls no btcore
code, so it cannot deadlock against anything a switch interrupts; it chains
to the tracer that was installed before it.
"""
from __future__ import annotations

import threading
import time

import greenlet

STAMP = "_btcore_switched_out"   # attribute name of the stamp in a greenlet's __dict__

_base_dict = greenlet.greenlet.__dict__["__dict__"].__get__   # greenlet's own, not a subclass's
_base_getattr = greenlet.greenlet.__getattribute__
_clock = time.monotonic
_installed = threading.local()   # .tracer: the _Stamper this thread installed, if on
_ever_enabled = False


class _Stamper:
    """The trace function: stamp the origin of every switch, then chain."""

    __slots__ = ("previous", "on")

    def __init__(self, previous):
        self.previous, self.on = previous, True

    def __call__(self, event, args):
        if self.on:
            _base_dict(args[0])[STAMP] = _clock()
        if self.previous is not None:
            self.previous(event, args)


def enable_switch_timing() -> None:
    """Record when greenlets of the calling thread switch out (greenlet's
    tracer is per thread: call it in each thread to time).  Costs about one
    Python call per switch.  Calling it again while on does nothing."""
    global _ever_enabled
    if getattr(_installed, "tracer", None) is not None:
        return
    _installed.tracer = _Stamper(greenlet.gettrace())
    greenlet.settrace(_installed.tracer)
    _ever_enabled = True


def disable_switch_timing() -> bool:
    """Stop recording in the calling thread; False if it was not on.

    The previous tracer is put back when btcore's is still the installed
    one; if another tracer was installed on top of it since, btcore's stays
    in that chain, passing events through."""
    tracer = getattr(_installed, "tracer", None)
    if tracer is None:
        return False
    tracer.on = False
    _installed.tracer = None
    if greenlet.gettrace() is tracer:
        greenlet.settrace(tracer.previous)
    return True


def switched_out_at(g) -> float | None:
    """time.monotonic() when g last switched out, if recorded."""
    if not _ever_enabled:
        return None
    try:
        return _base_getattr(g, STAMP)
    except AttributeError:
        return None
