"""The showcase (btcore.views.showcase.run, to become `python -m btcore demo`): it
exits 0 and its dump shows each parked greenlet where the program parked it.

Oracle: the showcase's own source (which function parks where, how many
connection handlers, the spawn tree it builds); the dump is read in both of
its forms.
"""
import json
import re
import subprocess
import sys

import pytest

pytest.importorskip("gevent")

TIMEOUT = 120


def run_showcase(*args):
    proc = subprocess.run([sys.executable, "-P", "-c",
                           "import sys; from btcore.views.showcase import run; sys.exit(run(sys.argv[1:]))", *args],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr    # every greenlet ended cleanly
    return proc.stdout


def short(name):
    return (name or "").rsplit(".", 1)[-1]


def python_names(stack):
    return [short(f["function"]) for f in stack["frames"] if f["kind"] == "python"]


def test_json_dump_shows_every_parking_place():
    """Guards the showcase's content: Python code, C callbacks, recv, Queue, Lock, sleep, spawn tree."""
    doc = json.loads(run_showcase("--format", "json"))
    stacks = {s["id"]: s for s in doc["stacks"]}
    by_function = {}
    for g in doc["greenlets"]:
        m = re.match(r"Greenlet-\d+ \((\w+)\)$", g["name"])
        if m:
            by_function.setdefault(m.group(1), []).append(stacks[g["stack"]])
    assert python_names(by_function["handle_request"][0])[:3] == ["validate", "parse", "handle_request"]
    for parker in ("sort_by_key", "substitute", "decode"):       # parked inside C code's callback
        [stack] = by_function[parker]
        frames = stack["frames"]
        names = [short(f["function"]) for f in frames]
        i_lambda = names.index("<lambda>")
        i_parker = names.index(parker)
        assert i_lambda < i_parker
        assert any(f["kind"] == "native" for f in frames[i_lambda + 1:i_parker]), (parker, names)
    connections = by_function["serve_connection"]
    assert len(connections) == 5 and connections[0]["count"] == 5
    assert "recv" in python_names(connections[0])
    assert "consume" in python_names(by_function["consume"][0])
    assert "update_shared_state" in python_names(by_function["update_shared_state"][0])
    assert len(by_function["worker"]) == 2 and len(by_function["task"]) == 2
    assert all(s["state"] == "suspended" for found in by_function.values() for s in found)


def test_text_dump_draws_the_three_generation_spawn_tree():
    """Guards the tree: supervisor -> workers -> tasks under the main greenlet."""
    text = run_showcase()
    tree = text.split("\n=== thread ", 1)[1].splitlines()
    depth = {}
    for line in tree:
        m = re.match(r"^([|` ]*[|`]- )?Greenlet-\d+ \((\w+)\)", line)
        if m:
            depth.setdefault(m.group(2), set()).add(len(m.group(1) or "") // 3)
    assert depth["supervisor"] == {1} and depth["worker"] == {2} and depth["task"] == {3}
    assert re.search(r"^=== stack \d+: 5 greenlets, suspended ===$", text, re.M)
