"""The README's two set-up commands: CI runs them verbatim, and the main job
works from the checkout root (where the source tree once shadowed the
installed package: `No module named 'btcore._native'`); its sample output is
what the demo prints."""
import functools
import os
import re
import subprocess
import sys

import pytest

import conftest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme_commands():
    with open(os.path.join(ROOT, "README.md")) as f:
        blocks = re.findall(r"```\n(.*?)\n```", f.read(), re.S)
    return [b for b in blocks if b.startswith("python3 -m venv .venv")]


def test_ci_runs_both_readme_commands_verbatim():
    commands = _readme_commands()
    assert len(commands) == 2, commands
    assert any("python -m btcore demo" in c for c in commands)
    assert any("pytest" in c for c in commands)
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci_lines = f.read().splitlines()
    for command in commands:
        assert command in ci_lines, f"README command not run verbatim by .ci/run: {command}"


@functools.lru_cache(maxsize=None)
def _demo_from_checkout_root():
    # exactly what the README's first command does after its install step
    return subprocess.run([sys.executable, "-m", "btcore", "demo"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_demo_runs_from_the_checkout_root():
    """guards: the README's main job (the gevent showcase, gevent being
    installed here as it is by the README's command)."""
    done = _demo_from_checkout_root()
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("Greenlet dump, pid ") and "sort_by_key" in done.stdout


@pytest.mark.parametrize("how", [
    ["-m", "btcore", "demo", "--greenlet"],
    # gevent absent: sys.modules[name] = None makes every import of it fail
    ["-c", "import runpy, sys; sys.modules['gevent'] = None; sys.argv[1:] = ['demo'];"
           " runpy.run_module('btcore', run_name='__main__')"],
], ids=["--greenlet", "without-gevent"])
def test_plain_greenlet_demo(how):
    """guards: the demo without gevent (asked for, or gevent missing)."""
    done = subprocess.run([sys.executable, *how], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Greenlet <Worker 'sorter'>: suspended" in done.stdout and "_through_sorted" in done.stdout
    assert ("gevent is not installed" in done.stderr) == (how[0] == "-c")


def _normal(line):
    """A line of demo output with what differs between runs and installs
    (thread id, the installed package's path) replaced."""
    line = re.sub(r"\(id \d+\)", "(id N)", line)
    line = re.sub(r"0x[0-9a-f]+", "0xN", line)
    # gevent numbers greenlets when a name is first read, and groups of equal
    # size are numbered in the order the gc lists greenlets: both vary
    line = re.sub(r"Greenlet-\d+", "Greenlet-N", line)
    line = re.sub(r"=== stack \d+:", "=== stack N:", line)
    return re.sub(r'File "[^"]*/btcore/', 'File ".../btcore/', line)


@pytest.mark.skipif(sys.version_info[:2] != (3, 11) or not conftest.INTERPRETER_IS_LIBPYTHON
                    or not conftest.INTERPRETER_HAS_DWARF,
                    reason="the README sample is the demo on CPython 3.11 with a shared libpython with DWARF")
def test_readme_sample_is_the_demo_output():
    """guards: README's sample is what the demo prints today (line for line,
    thread id and install path aside)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        sample = re.findall(r"```\n(=== .*?)\n```", f.read(), re.S)
    assert len(sample) == 1
    sample_lines = sample[0].splitlines()
    printed = [_normal(line) for line in _demo_from_checkout_root().stdout.splitlines()]
    want = [_normal(line) for line in sample_lines]
    windows = (printed[i:i + len(want)] for i in range(len(printed)))
    assert want in windows, "README sample not found in the demo's output:\n" + "\n".join(printed)
