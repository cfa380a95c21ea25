"""btcore.cache: bounded, validated, and never blocking a re-entrant resolver.

Oracles: the cache's documented bound (len <= maxsize after every
operation), the documented errors, and a process that must finish within a
time bound while a signal handler resolves frames (a hang is a timeout).
"""
import gc
import subprocess
import sys
import weakref

import pytest

import btcore


@pytest.fixture
def small_cache():
    old = btcore.cache.maxsize
    yield btcore.cache
    btcore.cache.resize(old)


@pytest.mark.parametrize("bad", [-1, 0, "x", None, True, False, 1.5, "64"])
def test_maxsize_is_validated_on_assignment_as_in_resize(small_cache, bad):
    """Guards issue 8.5: maxsize = -1 / 'x' / None was accepted and broke frames() later."""
    before = small_cache.maxsize
    with pytest.raises(ValueError):
        small_cache.maxsize = bad
    with pytest.raises(ValueError):
        small_cache.resize(bad)
    assert small_cache.maxsize == before
    assert btcore.collect().frames()


def test_maxsize_assignment_evicts_now(small_cache):
    btcore.collect().frames()
    small_cache.maxsize = 2
    assert small_cache.maxsize == 2 and len(small_cache) <= 2


def _distinct_sites(n):
    """A function capturing at n call sites: n distinct (code, offset) keys per call."""
    namespace = {"c": btcore.collect}
    exec("def sites():\n    out = []\n" + "    out.append(c(capacity=8).frames())\n" * n + "    return out\n",
         namespace)
    return namespace["sites"]


@pytest.mark.parametrize("maxsize", [1, 7, 100])
def test_len_never_exceeds_maxsize_after_many_distinct_captures(small_cache, maxsize):
    """Guards issue 8.5: the bound holds after every resolution, and after resize."""
    small_cache.resize(maxsize)
    sites = _distinct_sites(40)
    for _ in range(5):
        for frames in sites():
            assert frames
            assert len(small_cache) <= maxsize
    small_cache.resize(1)
    assert len(small_cache) <= 1
    small_cache.clear()
    assert len(small_cache) == 0


def test_python_entry_pins_its_code_object_until_evicted(small_cache):
    namespace = {"c": btcore.collect}
    exec("def f():\n    return c(native=False, capacity=1)\n", namespace)
    bt = namespace["f"]()
    code = weakref.ref(namespace["f"].__code__)
    assert bt.frames()[0].function == "f"
    del namespace["f"], bt
    gc.collect()
    assert code() is not None     # the cache entry keeps it: its address is in the key
    small_cache.clear()
    gc.collect()
    assert code() is None


SIGNAL_SCRIPT = r"""
import signal
import btcore

btcore.cache.resize(8)
handled = busy = 0

def on_alarm(signum, frame):
    global handled, busy
    if busy:            # Python handlers nest; one at a time is enough
        return
    busy = 1
    try:
        assert btcore.collect().format()
        handled += 1
    finally:
        busy = 0

# 64 call sites: distinct (code, offset) keys, far more than the cache holds,
# so the main thread is nearly always inside put() (evicting)
namespace = {"c": btcore.collect}
exec("def distinct():\n" + "    c(native=False).frames()\n" * 64, namespace)
distinct = namespace["distinct"]

btcore.collect().format()   # the first resolution reads libpython's DWARF: not under the timer
signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
done = 0
try:
    while handled < 150 or done < 300:
        distinct()
        done += 1
        assert len(btcore.cache) <= btcore.cache.maxsize
finally:
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
print("ok", handled, done)
"""


def test_signal_handler_resolving_during_put_never_blocks():
    """Guards issue 9.3: a 1 kHz SIGALRM handler doing collect().format() while the
    main thread resolves (and evicts) hung on the cache's non-reentrant lock."""
    done = subprocess.run([sys.executable, "-P", "-c", SIGNAL_SCRIPT], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-3000:]
