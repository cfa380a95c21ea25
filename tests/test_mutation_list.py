"""The mutation list (tests/mutations/run.py) still fits the tree: each
entry's original text is found exactly once in its file (the runner's own
rule, run.stale()), and the test named as its killer exists (a killer may
be a whole file).  The runner refuses a stale entry too, but only at the
end of its ~20 min lane, CI's last host lane: stop 37 was lost to one entry
whose text an edit of report.c had changed.  This finds it in a second.
"""
import ast
import functools
import importlib.util
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _runner():
    spec = importlib.util.spec_from_file_location("mutation_runner", os.path.join(HERE, "mutations", "run.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RUNNER = _runner()


@functools.lru_cache(maxsize=None)
def _test_names(path):
    with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read())
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_entry_applies_to_exactly_one_place():
    found = []
    for m in RUNNER.MUTATIONS:
        with open(os.path.join(ROOT, m.path)) as f:
            why = RUNNER.stale(m, f.read())
        if why:
            found.append(f"{m.path}: {why}: {m.breaks}")
    assert not found, "\n".join(found)


def test_every_entry_names_a_test_that_exists():
    missing = []
    for m in RUNNER.MUTATIONS:
        path, _, name = m.killer.partition("::")
        name = name.split("[")[0].split("::")[-1]
        if not os.path.exists(os.path.join(ROOT, path)) or (name and name not in _test_names(path)):
            missing.append(f"{m.killer}: {m.breaks}")
    assert not missing, "\n".join(missing)


def test_every_parametrized_killer_is_collected():
    """A killer's parameters ([...]) name one collected test: a renamed
    parameter left a killer that pytest ran as no test at all, and the
    mutation lane reported it alive (stop 47's first CI)."""
    wanted = sorted({m.killer for m in RUNNER.MUTATIONS if "[" in m.killer})
    files = sorted({k.partition("::")[0] for k in wanted})
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    collected = set(proc.stdout.split())
    missing = [k for k in wanted if k not in collected]
    assert wanted and not missing, "\n".join(missing) or proc.stdout[-2000:]
