"""register_dump_signal(): a dump on a signal that does not stall the event
loop, never silently replaces another handler, and comes out whole and in
order.

Oracles: gunicorn's real Worker (its own SIGNALS lists and init_signals()),
a handler installed from C by the standard library (faulthandler.register),
the OS thread that actually writes (a file object that records it and waits
for the main thread), the greenlets each child program built (how many in
each dump), and fork's child writing a dump that names its own pid.
Every scenario runs in a child interpreter: signal handlers, the writer
thread and fork stay out of pytest's process.
"""
import re
import signal
import subprocess
import sys
import textwrap

import pytest

import btcore

TIMEOUT = 120
DUMP = re.compile(r"^Greenlet dump, pid (\d+): (\d+) greenlets? in .*?, (\d+) distinct stacks$", re.M)
GROUP = re.compile(r"^=== stack (\d+): (\d+) greenlets?, .* ===$", re.M)


def _run_child(source, *args):
    return subprocess.run([sys.executable, "-P", "-c", textwrap.dedent(source), *args], capture_output=True,
                          text=True, timeout=TIMEOUT)


def _dumps(text):
    """[(pid, greenlets, body)] of each dump in text, checked whole: its
    groups numbered 1..distinct, their counts summing to its greenlets."""
    starts = [m.start() for m in DUMP.finditer(text)]
    out = []
    for start, end in zip(starts, starts[1:] + [len(text)]):
        body = text[start:end]
        pid, count, distinct = map(int, DUMP.match(body).groups())
        groups = [(int(n), int(c)) for n, c in GROUP.findall(body)]
        assert [n for n, _ in groups] == list(range(1, distinct + 1)), body[-2000:]
        assert sum(c for _, c in groups) == count, body[-2000:]
        assert "=== thread " in body and body.endswith("\n")
        out.append((pid, count, body))
    return out


# A bare gunicorn worker with its own signal handling installed (what its
# run loop does first), a log that records what the worker asks of it.
GUNICORN_WORKER = """
    import os, signal, sys
    import btcore
    import btcore.views.dumpwriter
    from gunicorn.workers.base import Worker

    class Log:
        reopened = 0
        def reopen_files(self):
            Log.reopened += 1

    worker = Worker.__new__(Worker)
    worker.log, worker.PIPE = Log(), os.pipe()
    for fd in worker.PIPE:
        os.set_blocking(fd, False)   # as Worker.init_process() makes them
    worker.init_signals()
    assert signal.getsignal(signal.SIGUSR1) == worker.handle_usr1
"""


def test_refuses_to_replace_gunicorns_handler():
    """Guards the refusal: SIGUSR1 belongs to gunicorn's worker (log reopening);
    registering over it is a RuntimeError that names the handler, and the
    handler stays."""
    pytest.importorskip("gunicorn")
    proc = _run_child(GUNICORN_WORKER + """
    try:
        btcore.register_dump_signal(signal.SIGUSR1)
    except RuntimeError as e:
        print(e)
    assert signal.getsignal(signal.SIGUSR1) == worker.handle_usr1
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("SIGUSR1 already has a handler, Worker.handle_usr1 (from gunicorn.workers.base)"
                                  "; pass chain=True"), proc.stdout


def test_chain_calls_gunicorns_handler_after_the_dump():
    """Guards chain=True: the dump, then gunicorn's own handler (its log reopened);
    unregistering gives the handler back."""
    pytest.importorskip("gunicorn")
    proc = _run_child(GUNICORN_WORKER + """
    btcore.register_dump_signal(signal.SIGUSR1, sys.stdout, chain=True)
    signal.raise_signal(signal.SIGUSR1)
    assert btcore.unregister_dump_signal(signal.SIGUSR1)
    assert signal.getsignal(signal.SIGUSR1) == worker.handle_usr1
    print("reopened", Log.reopened)
    """)
    assert proc.returncode == 0, proc.stderr
    assert len(_dumps(proc.stdout)) == 1
    assert proc.stdout.endswith("reopened 1\n")


def test_default_signal_is_free_in_a_gunicorn_worker():
    """Guards DEFAULT_DUMP_SIGNAL: none of the signals gunicorn's arbiter or worker
    handle (their own lists), nor btcore's capture signal; registering it in a
    worker needs no chain."""
    pytest.importorskip("gunicorn")
    from gunicorn.arbiter import Arbiter
    from gunicorn.workers.base import Worker
    assert btcore.DEFAULT_DUMP_SIGNAL not in set(Arbiter.SIGNALS) | set(Worker.SIGNALS) | {signal.SIGCHLD}
    from btcore._native import lib
    assert btcore.DEFAULT_DUMP_SIGNAL != lib.btc_capture_signal()
    proc = _run_child(GUNICORN_WORKER + """
    btcore.register_dump_signal(file=sys.stdout)
    signal.raise_signal(btcore.DEFAULT_DUMP_SIGNAL)
    assert btcore.unregister_dump_signal()
    assert signal.getsignal(signal.SIGUSR1) == worker.handle_usr1
    """)
    assert proc.returncode == 0, proc.stderr
    assert len(_dumps(proc.stdout)) == 1


def test_refuses_a_handler_installed_from_c():
    """Guards the refusal of a C handler Python reports as SIG_DFL
    (faulthandler.register installs one with sigaction): Python cannot call
    it, so even chain=True is refused; stuck=True, chain=True (a C handler
    that chains) is accepted."""
    proc = _run_child("""
    import faulthandler, signal, sys
    import btcore
    import btcore.views.dumpwriter

    faulthandler.register(btcore.DEFAULT_DUMP_SIGNAL)
    assert signal.getsignal(btcore.DEFAULT_DUMP_SIGNAL) == signal.SIG_DFL   # Python does not know
    for chain in (False, True):
        try:
            btcore.register_dump_signal(chain=chain)
        except RuntimeError as e:
            print(e)
    btcore.register_dump_signal(file=sys.stdout, stuck=True, chain=True)
    assert btcore.unregister_dump_signal()
    """)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("SIGPWR already has a handler installed from C") for line in lines)


def test_refuses_a_gevent_signal_handler():
    """Guards the same refusal for gevent.signal_handler (Locust's SIGTERM):
    libev installs it from C, Python reports SIG_DFL."""
    proc = _run_child("""
    import signal
    import gevent
    import btcore
    import btcore.views.dumpwriter

    gevent.signal_handler(btcore.DEFAULT_DUMP_SIGNAL, lambda: None)
    gevent.sleep(0)
    try:
        btcore.register_dump_signal()
    except RuntimeError as e:
        print(e)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("SIGPWR already has a handler installed from C"), proc.stdout


# A file whose write() records the OS thread that writes and waits until the
# main thread, back from the handler, lets it go: a dump written inside the
# handler would wait for the main thread, which waits for the handler.
BLOCKING_FILE = """
    import gevent.monkey
    gevent.monkey.patch_all()
    import os, signal, sys
    import gevent, gevent.event
    import btcore
    import btcore.views.dumpwriter

    real_lock = gevent.monkey.get_original("_thread", "allocate_lock")
    real_ident = gevent.monkey.get_original("_thread", "get_ident")

    class File:
        def __init__(self):
            self.released, self.parts, self.writers, self.waited = real_lock(), [], [], []
            self.released.acquire()
        def write(self, text):
            self.waited.append(self.released.acquire(timeout=20))
            self.writers.append(real_ident())
            self.parts.append(text)
        def flush(self):
            pass
"""


def test_the_handler_only_captures_a_real_thread_writes():
    """Guards the off-loop writer in a monkey-patched process: the handler
    returns before anything is written, an OS thread other than the main one
    writes (not a greenlet of the loop), and unregister waits for it."""
    proc = _run_child(BLOCKING_FILE + """
    btcore.views.dumpwriter.DRAIN_TIMEOUT = 10
    gate = gevent.event.Event()
    parked = [gevent.spawn(gate.wait) for _ in range(20)]
    gevent.sleep(0)
    out = File()
    btcore.register_dump_signal(file=out)
    signal.raise_signal(btcore.DEFAULT_DUMP_SIGNAL)
    out.released.release()            # back from the handler: the writer may go on
    assert btcore.unregister_dump_signal()
    print("waited", out.waited, "main wrote", real_ident() in out.writers)
    sys.stdout.write("".join(out.parts))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("waited [True] main wrote False\n"), proc.stdout[:300]
    [(_, count, body)] = _dumps(proc.stdout)
    assert count >= 20 and "Event.wait" in body


def test_two_signals_two_dumps_whole_and_in_order():
    """Guards the writer's order and unregister's drain: a big dump (2,000
    greenlets) whose write is held until a second, small one (the greenlets
    were killed in between) has been signalled; both are written, whole, big
    first, when unregister returns."""
    proc = _run_child("""
    import _thread, os, signal, sys
    import gevent, gevent.event
    import btcore
    import btcore.views.dumpwriter

    class File:
        def __init__(self):
            self.parts, self.gate = [], _thread.allocate_lock()
            self.gate.acquire()
        def write(self, text):
            if not self.parts:
                self.gate.acquire(timeout=20)   # the first dump waits for the second signal
            self.parts.append(text)
        def flush(self):
            pass

    gate = gevent.event.Event()
    parked = [gevent.spawn(gate.wait) for _ in range(2000)]
    gevent.sleep(0)
    out = File()
    btcore.register_dump_signal(file=out)
    signal.raise_signal(btcore.DEFAULT_DUMP_SIGNAL)
    gevent.killall(parked)
    signal.raise_signal(btcore.DEFAULT_DUMP_SIGNAL)
    out.gate.release()
    assert btcore.unregister_dump_signal()
    sys.stdout.write("".join(out.parts))
    """)
    assert proc.returncode == 0, proc.stderr
    counts = [count for _, count, _ in _dumps(proc.stdout)]
    assert len(counts) == 2 and counts[0] >= 2000 > counts[1], counts


SIGNAL_IN_RESOLUTION = """
    import os, signal
    import greenlet
    import btcore
    import btcore.views.dumpwriter

    class Bound(int):
        # compared with the cache size inside FrameCache._evict: mid-resolution
        def __lt__(self, other):
            signal.raise_signal(btcore.DEFAULT_DUMP_SIGNAL)
            return False

    btcore.register_dump_signal()
    g = greenlet.greenlet(lambda: greenlet.getcurrent().parent.switch())
    g.switch()
    bt = btcore.collect(g)
    btcore.cache.maxsize = Bound(65536)
    bt.frames()
    btcore.cache.maxsize = 65536
    assert btcore.unregister_dump_signal()
    print("survived")
"""


def test_signal_during_resolution_without_a_writer_thread():
    """Guards the fallback when no thread can be started: the handler writes
    the dump itself, and inside btcore's own resolution it leaves the stacks
    unresolved rather than nest a resolution."""
    proc = _run_child(textwrap.dedent("""
        import btcore.views.dumpwriter
        def no_threads():
            raise RuntimeError("can't start new thread")
        btcore.views.dumpwriter._real_start_new_thread = no_threads
    """) + textwrap.dedent(SIGNAL_IN_RESOLUTION))
    assert proc.returncode == 0, proc.stderr
    assert "survived" in proc.stdout
    assert _dumps(proc.stderr) and "stack not resolved" in proc.stderr


def test_fork_child_gets_its_own_writer(tmp_path):
    """Guards the writer's restart after fork(): the child's dump is written
    (by a writer of its own: the parent's thread is not copied) and names the
    child's pid; the parent's writer still works."""
    proc = _run_child("""
    import os, signal, sys
    import greenlet
    import btcore
    import btcore.views.dumpwriter

    btcore.views.dumpwriter.DRAIN_TIMEOUT = 10
    parked = greenlet.greenlet(lambda: greenlet.getcurrent().parent.switch())
    parked.switch()
    path = sys.argv[1]
    btcore.register_dump_signal(file=open(path, "w"))
    pid = os.fork()
    if pid == 0:
        has_writer = btcore.views.dumpwriter.ident() is not None
        signal.raise_signal(btcore.DEFAULT_DUMP_SIGNAL)
        btcore.unregister_dump_signal()
        with open(path) as f:
            ok = has_writer and f"Greenlet dump, pid {os.getpid()}: " in f.read()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status), "parent", os.getpid())
    signal.raise_signal(btcore.DEFAULT_DUMP_SIGNAL)
    assert btcore.unregister_dump_signal()
    with open(path) as f:
        sys.stdout.write(f.read())
    """, str(tmp_path / "dump.txt"))
    assert proc.returncode == 0, proc.stderr
    first, written = proc.stdout.split("\n", 1)
    assert first.startswith("child 0 parent "), proc.stdout[:300]
    parent = int(first.split()[-1])
    pids = [pid for pid, _, _ in _dumps(written)]
    assert len(pids) == 2 and pids[0] != parent and pids[1] == parent, (pids, parent)


def test_no_collection_during_the_capture_and_gc_state_kept():
    """Guards _capture(): the cyclic GC does not run inside the handler's
    snapshot (with a threshold of 1 it would run at every allocation), and
    the GC's own state (enabled, or disabled by the program) is as before."""
    proc = _run_child("""
    import gc, os, signal, sys
    import greenlet
    import btcore
    import btcore.views.dumpwriter

    parked = [greenlet.greenlet(lambda: greenlet.getcurrent().parent.switch()) for _ in range(50)]
    for g in parked:
        g.switch()
    inside = []
    def seen(phase, info):
        frame = sys._getframe()
        while frame is not None:
            if frame.f_code.co_name == "snapshot" and frame.f_code.co_filename.endswith("capture/introspect.py"):
                inside.append(info["generation"])
            frame = frame.f_back
    btcore.register_dump_signal(file=sys.stdout)
    gc.callbacks.append(seen)
    gc.set_threshold(1)
    signal.raise_signal(btcore.DEFAULT_DUMP_SIGNAL)
    enabled_after = gc.isenabled()
    gc.disable()
    signal.raise_signal(btcore.DEFAULT_DUMP_SIGNAL)
    disabled_after = not gc.isenabled()
    gc.enable()
    assert btcore.unregister_dump_signal()
    gc.callbacks.remove(seen)
    print("collections inside", len(inside), enabled_after, disabled_after)
    """)
    assert proc.returncode == 0, proc.stderr
    assert len(_dumps(proc.stdout)) == 2
    assert proc.stdout.endswith("collections inside 0 True True\n"), proc.stdout[-300:]


def test_a_dump_signalled_just_before_exit_is_written():
    """Guards the drain at exit: the process ends right after the signal,
    without unregistering; the interpreter's exit waits for the writer."""
    proc = _run_child("""
    import os, signal, sys
    import gevent, gevent.event
    import btcore
    import btcore.views.dumpwriter

    gate = gevent.event.Event()
    parked = [gevent.spawn(gate.wait) for _ in range(2000)]
    gevent.sleep(0)
    btcore.register_dump_signal(file=sys.stdout)
    signal.raise_signal(btcore.DEFAULT_DUMP_SIGNAL)
    """)
    assert proc.returncode == 0, proc.stderr
    [(_, count, _)] = _dumps(proc.stdout)
    assert count >= 2000


def test_signals_while_the_writer_is_stuck_are_counted_not_queued():
    """Guards the writer's bound: while it is stuck on a file that blocks,
    at most MAX_PENDING dumps wait behind the one it writes; the signals
    past that are not captured, and the next dump says how many there were."""
    proc = _run_child("""
    import _thread, os, signal, sys
    import greenlet
    import btcore
    import btcore.views.dumpwriter

    class File:
        def __init__(self):
            self.parts, self.gate, self.entered = [], _thread.allocate_lock(), _thread.allocate_lock()
            self.gate.acquire()
            self.entered.acquire()
        def write(self, text):
            if not self.parts:
                self.entered.release()
                self.gate.acquire(timeout=20)   # stuck, as on a pipe nobody reads
            self.parts.append(text)
        def flush(self):
            pass

    parked = greenlet.greenlet(lambda: greenlet.getcurrent().parent.switch())
    parked.switch()
    out = File()
    btcore.register_dump_signal(file=out)
    signal.raise_signal(btcore.DEFAULT_DUMP_SIGNAL)
    assert out.entered.acquire(timeout=20)        # the writer is inside the first write
    for _ in range(btcore.views.dumpwriter.MAX_PENDING + 5):
        signal.raise_signal(btcore.DEFAULT_DUMP_SIGNAL)
    out.gate.release()
    assert btcore.views.dumpwriter.drain()
    signal.raise_signal(btcore.DEFAULT_DUMP_SIGNAL)
    assert btcore.unregister_dump_signal()
    print(btcore.views.dumpwriter.MAX_PENDING)
    sys.stdout.write("".join(out.parts))
    """)
    assert proc.returncode == 0, proc.stderr
    pending, text = proc.stdout.split("\n", 1)
    assert len(_dumps(text)) == 1 + int(pending) + 1
    assert text.count("btcore: 5 dump signals skipped: earlier dumps were still being written\n") == 1
    last = text.rindex("Greenlet dump, pid ")
    assert text.index("btcore: 5 dump signals skipped") < last


# The main thread blocked in a wait (time.sleep, gevent's idle hub, asyncio's
# selector) while the dump signal's C handler runs in another thread: Python
# then owes the main thread a handler call, but nothing interrupts its wait.
# The same happens when the signal lands in the main thread just after the
# loop last checked for signals and before it blocks (seen 1 signal in 200
# on uWSGI's idle gevent worker, tests/test_signal_recipes.py): libev then
# sleeps up to a minute.
WAITS = {
    "time.sleep": "signal_from_another_thread(); time.sleep(10)",
    "gevent": "import gevent; signal_from_another_thread(); gevent.sleep(10)",
    "asyncio": "import asyncio; signal_from_another_thread(); asyncio.run(asyncio.sleep(10))",
    # the child of a fork, whose main thread is the one that forked (the timer is made again there)
    "fork": "pid = os.fork()\n"
            "if pid == 0:\n"
            "    signal_from_another_thread(); time.sleep(10)\n"
            "else:\n"
            "    sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))",
}


@pytest.mark.parametrize("wait", WAITS)
def test_a_pending_dump_interrupts_the_main_threads_wait(wait):
    """Guards the nudge (native/watch/prompt_signal.c): the handler is owed to
    a main thread blocked in a wait, and the dump is written while that wait
    still has most of its 10 s to go (the process leaves as soon as the dump
    is whole)."""
    if wait in ("gevent", "asyncio"):
        pytest.importorskip(wait)
    proc = _run_child("""
    import os, signal, sys, threading, time
    import btcore

    class File:
        def __init__(self):
            self.parts = []
        def write(self, text):
            self.parts.append(text)
        def flush(self):
            text = "".join(self.parts)
            if "=== thread " in text:
                sys.stdout.write(text)
                sys.stdout.flush()
                os._exit(0)

    def signal_from_another_thread():
        main = threading.get_native_id()

        def send():
            # once the main thread sleeps in a system call, the signal for this thread
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                with open(f"/proc/self/task/{main}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "S":
                        break
                time.sleep(0.01)
            time.sleep(0.2)
            signal.pthread_kill(threading.get_ident(), btcore.DEFAULT_DUMP_SIGNAL)
        threading.Thread(target=send, daemon=True).start()

    btcore.register_dump_signal(file=File())
""" + textwrap.indent(WAITS[wait], "    ") + """
    print("the main thread woke before the dump")
    """)
    assert proc.returncode == 0, proc.stderr
    assert "woke before" not in proc.stdout
    assert proc.stdout.startswith("Greenlet dump, pid ") and "=== thread " in proc.stdout, proc.stdout


def test_the_nudge_is_gone_before_the_interpreter_ends():
    """Guards the unwrap at exit: the interpreter's end puts SIG_DFL back
    on the signals it handled, and a nudge still armed then would end the
    process by SIGPWR's default action; by then the kernel's handler is
    Python's own again (compared with the one Python installs for SIGUSR2)."""
    proc = _run_child("""
    import atexit, ctypes, signal

    def kernel_handler(signum):
        old = ctypes.create_string_buffer(512)   # glibc's struct sigaction starts with the handler
        assert ctypes.CDLL(None).sigaction(signum, None, old) == 0
        return ctypes.c_void_p.from_buffer(old).value

    # registered before btcore's own exit hooks: runs after them
    atexit.register(lambda: print("at exit: Python's", kernel_handler(signal.SIGPWR) == kernel_handler(signal.SIGUSR2)))
    import btcore
    signal.signal(signal.SIGUSR2, lambda *args: None)
    btcore.register_dump_signal()
    print("registered: wrapped", kernel_handler(signal.SIGPWR) != kernel_handler(signal.SIGUSR2))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "registered: wrapped True\nat exit: Python's True\n", proc.stdout
