"""The JSON document of a dump: one shape, whoever made it.

dump_all(format="json") inside a process, python -m btcore dump PID (or
--core) from outside, and the HTML page (which embeds it) all build their
document here; docs/api.md ("JSON schema") describes each field.  VERSION
changes whenever a field changes meaning or goes away (a new field does not
change it): version 1 had two unrelated shapes, the outside dump's and
dump_all's; version 2 is dump_all's, for both.
"""
from __future__ import annotations

import time

VERSION = 2


class RemoteGreenlet:
    """A greenlet of another process, as its document names it: by its
    address there and its type's name (tp_name)."""

    __slots__ = ("address", "type_name", "name")

    def __init__(self, address: int, type_name: str):
        self.address, self.type_name = address, type_name
        self.name = None   # the dump's name of it, once named (a spawn chain's creator: views/dump.py)


def greenlet_id(g) -> int | None:
    """A greenlet's "id": id() in this process, its address in another one."""
    if g is None:
        return None
    return g.address if type(g) is RemoteGreenlet else id(g)   # type(): never a greenlet's own __getattr__


def greenlet_type(g) -> str:
    if type(g) is RemoteGreenlet:
        return g.type_name
    kind = type(g)
    return f"{kind.__module__}.{kind.__qualname__}"


def document(pid: int, threads: list, stacks: list, greenlets: list, tasks: list, **more) -> dict:
    """The document: its version, whose dump it is and when, then the parts
    views/dump.py renders; `more`: what a dump from outside adds (source,
    stopped_ms, notes)."""
    return {"version": VERSION, "pid": pid, "time": time.time(), **more, "threads": threads, "stacks": stacks,
            "greenlets": greenlets, "tasks": tasks}
