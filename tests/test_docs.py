"""Every ```python block of docs/guide.md runs as is, in a fresh interpreter.

Each block is a complete program; the blocks check their own output with
assert statements, so a change in behaviour that the guide describes makes
this test fail.  Blocks run with `python -P -c` (the source tree is not put
on sys.path: the installed btcore, the one with the compiled core, is used)
from an empty temporary directory.
"""
import importlib.util
import os
import re
import subprocess
import sys

import pytest

import conftest

GUIDE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "guide.md")
TIMEOUT = 120
# The interpreter's own static C functions some examples name (the regex
# engine, time.sleep): only its symbol table has them, and Debian strips it.
INTERPRETER_STATIC_FUNCTIONS = ("sre_ucs1_match", "time_sleep")

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def _blocks():
    with open(GUIDE, encoding="utf-8") as f:
        text = f.read()
    out = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        heading = ""
        for h in re.finditer(r"^#+ (.*)$", text[: m.start()], re.M):
            heading = h.group(1)
        out.append(pytest.param(m.group(1), id=f"line{line}-{re.sub(r'[^A-Za-z0-9]+', '_', heading)[:40]}"))
    return out


BLOCKS = _blocks()


def test_guide_has_examples():
    assert len(BLOCKS) >= 10


def test_guide_fences_are_balanced():
    with open(GUIDE, encoding="utf-8") as f:
        fences = [ln for ln in f.read().splitlines() if ln.startswith("```")]
    assert len(fences) % 2 == 0
    assert all(fence == "```" for fence in fences[1::2]), "a code block is not closed"


@pytest.mark.parametrize("source", BLOCKS)
def test_guide_example_runs(source, tmp_path):
    if "import gevent" in source:
        pytest.importorskip("gevent")
    for server in ("locust", "celery"):   # the signal-dump recipes for servers the suite may not have
        if f"from {server} import" in source and importlib.util.find_spec(server) is None:
            pytest.skip(f"{server} is not installed")   # (not imported here: Locust monkey-patches on import)
    if any(name in source for name in INTERPRETER_STATIC_FUNCTIONS) and not conftest.INTERPRETER_HAS_SYMTAB:
        pytest.skip("stripped interpreter: the example names its static C functions")
    if "enable_crash_report" in source and conftest.UNDER_QEMU:
        pytest.skip(conftest.QEMU_NO_OWN_READS)
    if "os.fork()" in source and "threading.Thread" in source and conftest.UNDER_ASAN:
        # the fork example's child hung in libasan's malloc once (ci34): its resolving thread allocates all the time
        pytest.skip("ASan's allocator is not fork-safe while another thread allocates (gcc 12)")
    if "dump_process(" in source and not conftest.DUMPS_OTHER_PROCESSES:
        pytest.skip(conftest.NO_DUMP_HERE)
    proc = subprocess.run([sys.executable, "-P", "-c", source], cwd=tmp_path, capture_output=True, text=True,
                          timeout=TIMEOUT, env={**os.environ, **conftest.ASAN_CRASH_CHILD_ENV})
    assert proc.returncode == 0, (
        f"exit code {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
