"""python -m btcore demo: merged native + Python backtraces, live.

Shows the current stack going Python -> C -> Python, then several greenlets
parked at different places (some inside C code that called back into
Python), each with its own merged stack.
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


def _show(title, bt):
    print(f"=== {title}: {len(bt)} frames")
    print(bt.format())
    print()


def demo() -> int:
    def current_stack(item):
        _show("current stack, inside sorted()'s key callback", btcore.collect())
        return item

    sorted([1], key=current_stack)   # one item: one call of the key function

    parked = {
        "parked inside sorted() -> key callback": greenlet.greenlet(_through_sorted),
        "parked inside re.sub() -> replacement callback": greenlet.greenlet(_through_regex),
        "parked inside json.loads() -> object_hook": greenlet.greenlet(_through_json),
        "parked 5 Python calls deep": greenlet.greenlet(lambda: _deep_python(5)),
    }
    for g in parked.values():
        g.switch()
    for title, g in parked.items():
        _show(f"greenlet {title} (stack_saved={g._stack_saved})", btcore.collect(g))
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
