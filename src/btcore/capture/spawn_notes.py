"""Exception notes: with spawn tracking on, an exception that escapes a
greenlet carries that greenlet's spawn chain as a PEP 678 note, so
tracebacks, logging.exception, pytest and error trackers show where the
greenlet came from without any btcore call.

Where a note is added (nothing runs on paths where nothing fails):
- plain greenlet and eventlet: the exception leaves the dead greenlet
  through the switch() or throw() call that resumed it, in its parent
  (native/capture/spawn_notes.c replaces those two methods);
- gevent: a Greenlet catches what its run raises and reports it through
  Hub.handle_error(context, type, value, tb), which is wrapped here (at
  enabling if gevent.hub is imported, else when it is).

The note is the first greenlet's chain only (an exception that goes on
escaping its spawners keeps the note of the greenlet it came from),
rendered as spawn_backtrace(g).format(most_recent_first=True), at most
NOTE_LINES lines of at most NOTE_LINE_CHARS characters.  Rendering resolves
names; a rendered chain is kept for the next error from the same chain
(NOTE_CACHE chains at most, all dropped when full), and a kept text is
added in C (native/capture/spawn_notes.c: _note_if_kept), without running
Python: an escaping exception's note costs about 1 us.
"""
from __future__ import annotations

import importlib.util
import sys

import greenlet

from .._native import lib
from ..errors import BacktraceError
from .spawn import GENERATIONS, SpawnChain, raw_spawn_chain, chain_backtrace

NOTE_HEADER = "Greenlet spawn chain (btcore, most recent call first):"
NOTE_LINES = 40          # lines of a note, its header and its "... more" line included
NOTE_LINE_CHARS = 240    # characters of one line (a spawner's repr can be long)
NOTE_CACHE = 64          # rendered chains kept

_rendered: dict = {}     # btc_spawn_chain_key's (cut, site, spawner, site, spawner, ...) -> note text
_on = False

if lib.btc_spawn_notes_install(id(globals())) != 0:
    raise ImportError("btcore: cannot install exception notes")
# _note_if_kept(exc, g) (installed above): adds g's chain's kept note to exc
# and returns None, also when there is nothing to add (exc is no exception
# or carries a spawn chain already: it escaped a greenlet g spawned, whose
# chain contains g's; g is untracked); else returns the key under which
# the text, rendered now, is kept in _rendered.
_note_if_kept = globals()["_note_if_kept"]


def _render(chain) -> str:
    lines = chain_backtrace(chain).format(most_recent_first=True, header=False).split("\n")[1:]
    lines = [line if len(line) <= NOTE_LINE_CHARS else line[:NOTE_LINE_CHARS - 3] + "..." for line in lines]
    room = NOTE_LINES - 1   # the header's line
    if len(lines) > room:
        lines[room - 1:] = [f"  ... {len(lines) - room + 1} more lines (btcore.spawn_backtrace(g) has them all)"]
    return "\n".join([NOTE_HEADER, *lines])


def _render_note(exc, g, key) -> None:
    """Note exc with g's chain, rendered now and kept under key (the first
    failure of this chain, or the kept texts were dropped).  The C switch
    calls this when _note_if_kept returned a key."""
    raw = raw_spawn_chain(g, GENERATIONS)
    if raw is None:
        return
    text = _render(SpawnChain(*raw))
    if len(_rendered) >= NOTE_CACHE:
        # All at once: clear() is one step under the GIL, where finding
        # the oldest entry could race another thread's note.
        _rendered.clear()
    _rendered[key] = text
    exc.add_note(text)


def _note(exc, g) -> None:
    """Add g's spawn chain to exc, which escaped g (gevent's errors)."""
    if _on:
        key = _note_if_kept(exc, g)
        if key is not None:
            _render_note(exc, g, key)


def _note_quietly(exc, g) -> None:
    try:
        _note(exc, g)
    except Exception:   # an error handler must not fail because of its note
        pass


# ---- gevent ----

def _wrap_handle_error(hub_class) -> None:
    original = hub_class.__dict__.get("handle_error")
    if original is None or getattr(original, "_btcore_notes", False):
        return

    def handle_error(self, context, type, value, tb):
        if isinstance(context, greenlet.greenlet):
            _note_quietly(value, context)
        return original(self, context, type, value, tb)

    handle_error.__doc__, handle_error.__wrapped__, handle_error._btcore_notes = original.__doc__, original, True
    hub_class.handle_error = handle_error


def _patch_gevent(module) -> None:
    hub = getattr(module, "Hub", None)
    if isinstance(hub, type):
        _wrap_handle_error(hub)


class _PatchOnImport:
    """A meta path finder that wraps gevent.hub's loader, so that Hub is
    patched as soon as gevent.hub is imported (after notes were enabled).
    It finds nothing itself, and leaves sys.meta_path after its one use."""

    def find_spec(self, name, path=None, target=None):
        if name != "gevent.hub":
            return None
        _forget_finder()
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is not None:
            def exec_and_patch(module):
                exec_module(module)
                _patch_gevent(module)
            loader.exec_module = exec_and_patch
        return spec


_finder = _PatchOnImport()


def _forget_finder() -> None:
    try:
        sys.meta_path.remove(_finder)
    except ValueError:
        pass


# ---- switch ----

def set_exception_notes(on: bool) -> None:
    """Turn exception notes on or off (enable_spawn_tracking's
    exception_notes, and disable_spawn_tracking)."""
    global _on
    if lib.btc_spawn_notes(id(greenlet.greenlet), id(_render_note) if on else 0) != 0 and on:
        raise BacktraceError(f"cannot add exception notes with greenlet {greenlet.__version__}: its switch and "
                             "throw methods are not as expected (use exception_notes=False)")
    _on = on
    gevent_hub = sys.modules.get("gevent.hub")
    if on and gevent_hub is not None:
        _patch_gevent(gevent_hub)
    elif on and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    elif not on:
        _forget_finder()   # a patched Hub stays patched: its wrapper does nothing while off


def spawn_exception_notes_enabled() -> bool:
    """Do exceptions escaping tracked greenlets get spawn-chain notes?"""
    return _on
