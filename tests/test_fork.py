"""fork() while another thread resolves frames: every child must capture and
resolve, never wait forever for a lock the other thread held at fork time.

btcore's native locks (the module list, the DWARF file cache) are held with
the GIL released, so a thread that forks (holding the GIL) can do so while
another thread is inside them; so can its Python locks (the frame cache,
greenlet layout learning).  The whole run happens in a child interpreter so
that a hang fails the test instead of freezing the session; each forked
child gets a time bound, and a child that misses it is killed and counted.
"""
import os
import subprocess
import sys
import textwrap

import pytest

import conftest

FORKS = 500

SCRIPT = textwrap.dedent(r"""
    import os, signal, sys, threading, time
    import greenlet
    import btcore
    from btcore._native import lib

    forks, bound = int(sys.argv[1]), float(sys.argv[2])
    stop = threading.Event()

    def resolve_forever():
        # Each round empties btcore's frame cache and the native file cache,
        # so that resolution goes through the native symbol and DWARF
        # lookups, and holds their lock for a file's cold read: a fork then
        # finds that lock held in most rounds (with a warm file cache, in few
        # of 500 forks: its mutant once survived this test).
        while not stop.is_set():
            btcore.cache.clear()
            lib.btc_symbolize_reset()
            assert "resolve_forever" in btcore.collect().format()

    def in_child():
        btcore.cache.clear()
        frames = btcore.collect().frames()
        g = greenlet.greenlet(lambda: greenlet.getcurrent().parent.switch())
        g.switch()
        return (frames[0].function == "in_child" and any(f.kind == "native" and f.function for f in frames)
                and len(btcore.collect(g).frames()) > 0)

    def wait_bounded(pid):
        # A blocking wait (it returns as soon as the child exits); the timer
        # kills a child that misses the bound, which ends the wait.
        hung = []
        def kill(signum, frame):
            hung.append(pid)
            os.kill(pid, signal.SIGKILL)
        signal.signal(signal.SIGALRM, kill)
        signal.setitimer(signal.ITIMER_REAL, bound)
        _, status = os.waitpid(pid, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        return "hung" if hung else os.waitstatus_to_exitcode(status)

    parked = greenlet.greenlet(lambda: greenlet.getcurrent().parent.switch())
    parked.switch()
    btcore.collect(parked)   # greenlet's layout is learned once, here, not in every child
    worker = threading.Thread(target=resolve_forever, daemon=True)
    worker.start()
    outcomes = {}
    for _ in range(forks):
        pid = os.fork()
        if pid == 0:
            try:
                os._exit(0 if in_child() else 3)
            except BaseException:
                os._exit(4)
        outcome = wait_bounded(pid)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if outcome != 0:   # one failed child proves it: don't wait out the rest
            break
    stop.set()
    worker.join()
    print(outcomes)
""")


@pytest.mark.skipif(conftest.UNDER_QEMU, reason="qemu-user: a child forked from a multithreaded emulated "
                    "process can stall in the emulator (1 child in 291 did, ci/arm64.sh)")
@pytest.mark.skipif(conftest.UNDER_ASAN, reason="ASan's allocator is not fork-safe while another thread "
                    "allocates (gcc 12)")
def test_forks_under_a_resolving_thread_never_hang():
    """Guards issue 9.4: children forked while another thread held a btcore lock hung."""
    done = subprocess.run([sys.executable, "-P", "-c", SCRIPT, str(FORKS), "10"], capture_output=True,
                          text=True, timeout=240, env=dict(os.environ, PYTHONFAULTHANDLER="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "{0: %d}" % FORKS, done.stdout


def test_a_fork_finds_every_part_of_btcore_imported():
    # guards: btcore/__init__.py's before-fork hook imports every part first.  A part is imported on first use,
    # and a fork while another thread was importing one left the child waiting for that import's lock forever.
    source = textwrap.dedent(r"""
        import os, sys
        import btcore
        before = sorted(m for m in sys.modules if m.startswith("btcore."))
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        after = {m for m in sys.modules if m.startswith("btcore.")}
        print(before == [] or before, all(f"btcore.{m}" in after for m in btcore._EXPORTS))
    """)
    done = subprocess.run([sys.executable, "-P", "-c", source], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "True"], done.stdout
