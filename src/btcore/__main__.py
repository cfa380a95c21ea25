"""python -m btcore demo: merged native + Python backtraces, live.

Shows the current stack going Python -> C -> Python, then several greenlets
parked at different places (some inside C code that called back into
Python), each with its own merged stack, in the readable default view; then
the first greenlet again with every frame (format(verbose=True)).
"""
from __future__ import annotations

import argparse
import json
import re
import sys

import greenlet

import btcore


def _park():
    """Suspend the calling greenlet (back to whoever switched into it)."""
    return greenlet.getcurrent().parent.switch()


def _through_sorted():
    # builtin sorted() (C) calls the key function (Python), which parks.
    return sorted([3, 1, 2], key=lambda item: _park() or item)


def _through_regex():
    # the _sre C module calls the replacement function, which parks.
    return re.sub(r"\d", lambda match: _park() or "#", "a1b")


def _through_json():
    # the _json C module calls object_hook, which parks.
    return json.loads('{"a": 1}', object_hook=lambda obj: _park() or obj)


def _deep_python(depth):
    if depth:
        return _deep_python(depth - 1)
    return _park()


class _Worker(greenlet.greenlet):
    """A greenlet with a name, which format()'s header line shows."""

    def __init__(self, name, run):
        super().__init__(run)
        self.name = name

    def __repr__(self):
        return f"<Worker {self.name!r}>"


def _show(title, text):
    print(f"=== {title}")
    print(text)
    print()


def demo() -> int:
    def current_stack(item):
        _show("the current stack, inside sorted()'s key callback", btcore.collect())
        return item

    sorted([1], key=current_stack)   # one item: one call of the key function

    parked = {
        "inside sorted() -> key callback": _Worker("sorter", _through_sorted),
        "inside re.sub() -> replacement callback": _Worker("regex", _through_regex),
        "inside json.loads() -> object_hook": _Worker("json", _through_json),
        "5 Python calls deep": _Worker("deep", lambda: _deep_python(5)),
    }
    for g in parked.values():
        g.switch()
    for title, g in parked.items():
        saved = f"{g._stack_saved} bytes of its stack copied to the heap"
        _show(f"a greenlet parked {title} ({saved})", btcore.collect(g).format())
    first_title, first = next(iter(parked.items()))
    _show(f"the greenlet parked {first_title} again, every frame: format(verbose=True)",
          btcore.collect(first).format(verbose=True))
    for g in parked.values():
        g.throw(greenlet.GreenletExit)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m btcore", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="print merged backtraces of this process and of parked greenlets")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo()
    return 2


if __name__ == "__main__":
    sys.exit(main())
