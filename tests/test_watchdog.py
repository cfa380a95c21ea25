"""The watchdog and the signal-context capture, in child interpreters with a time bound.

Each child runs a greenlet stuck in one of the three ways a loop gets stuck
(tests/fixtures/stuck.c: a C loop holding the GIL, a C sleep with the GIL
released; and a Python loop) and prints RETURNED when the stuck call
returns.  The oracles: the order of lines on the child's stderr (the report
must come before RETURNED: written while stuck, not after), the fixture's
own function names, read from its symbol table with pyelftools, and the
Python function that called it.
"""
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

import btcore
import conftest

STUCK_SECONDS = 4.0    # long enough for a loaded machine to notice; the threshold is 0.2 s
BOUND = 60             # the child's hard time limit


@pytest.fixture(scope="module")
def stuck_so(tmp_path_factory):
    from elftools.elf.elffile import ELFFile

    out = tmp_path_factory.mktemp("stuck") / "stuck.so"
    src = os.path.join(os.path.dirname(__file__), "fixtures", "stuck.c")
    subprocess.run(["gcc", "-O1", "-g", "-shared", "-fPIC", "-o", str(out), src], check=True)
    with open(out, "rb") as f:
        names = {s.name for s in ELFFile(f).get_section_by_name(".symtab").iter_symbols()
                 if s["st_info"]["type"] == "STT_FUNC"}
    assert {"stuck_busy_loop", "stuck_sleep"} <= names
    return str(out)


PRELUDE = r"""
    import ctypes, os, sys, time
    import btcore, greenlet
    so, seconds = sys.argv[1], float(sys.argv[2])
    held, released = ctypes.PyDLL(so), ctypes.CDLL(so)   # PyDLL keeps the GIL during the call
    for lib in (held, released):
        lib.stuck_busy_loop.argtypes = lib.stuck_sleep.argtypes = [ctypes.c_double]

    def stuck_in_c():
        held.stuck_busy_loop(seconds)

    def stuck_in_syscall():
        released.stuck_sleep(seconds)

    def stuck_in_python():
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
"""


def run_child(body, so, *, seconds=STUCK_SECONDS, args=(), env=None):
    """The child's stderr; a crash or a missed time bound fails the test."""
    source = textwrap.dedent(PRELUDE) + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-P", "-c", source, so, str(seconds), *args], capture_output=True,
                          text=True, timeout=BOUND, env=dict(os.environ, PYTHONFAULTHANDLER="1", **(env or {})))
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stderr


WATCHED = r"""
    def stuck_then_returned():
        globals()[sys.argv[3]]()
        # (one write: a report cannot cut the line; before this greenlet ends, whose switch back the watchdog
        # reports, under qemu once before a RETURNED written after it)
        os.write(2, b"RETURNED\n")

    with btcore.start_watchdog(threshold=0.2, file=sys.stderr) as dog:
        greenlet.greenlet(stuck_then_returned).switch()
        time.sleep(0.5)   # the watchdog's next tick sees the switch back
    print("REPORTS", dog.reports, file=sys.stderr)
"""


def first_report(err):
    """The lines of the first stuck report, its header included."""
    lines = err.splitlines()
    start = next(i for i, line in enumerate(lines) if "has not switched" in line)
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return lines[start:end]


def episode_reports(err):
    """The reports of the first stuck episode, each a list of lines (its header first), up to its
    "switched again" line (asserted present: the final line stays after shortened reports)."""
    lines = err.splitlines()
    start = next(i for i, line in enumerate(lines) if "has not switched" in line)
    end = next(i for i in range(start, len(lines)) if "switched again" in lines[i])
    reports = []
    for line in lines[start:end]:
        if line.startswith("btcore watchdog: "):
            reports.append([line])
        elif line.startswith("  ") and reports:
            reports[-1].append(line)
    return reports


def frame_lines(report):
    return [line for line in report[1:] if not line.startswith("  (partial: ")]


def seconds(header, before):
    """The number of seconds that follows `before` in a report's header."""
    return header.split(before, 1)[1].split(" s", 1)[0]


def ctypes_call_marker():
    """What names ctypes' call machinery in a report: PyCFuncPtr_call (static) where its module has a
    full symbol table, else that module (Debian sid's _ctypes is stripped)."""
    from elftools.elf.elffile import ELFFile
    import _ctypes
    path = getattr(_ctypes, "__file__", None) or conftest.INTERPRETER_PATH
    with open(path, "rb") as f:
        full = ELFFile(f).get_section_by_name(".symtab") is not None
    return "PyCFuncPtr_call" if full else f"[{os.path.basename(path)}]"


def line_of(report, text):
    return next(i for i, line in enumerate(report) if text in line)


@pytest.mark.parametrize("function, innermost", [
    ("stuck_in_c", "stuck_busy_loop"),          # C code holding the GIL
    ("stuck_in_syscall", "stuck_sleep"),        # a blocking call, the GIL released
    ("stuck_in_python", None),                  # a Python loop
])
def test_report_comes_while_stuck_and_names_both_sides(stuck_so, function, innermost):
    """Guards the watchdog's three stuck modes: reported before the stuck call returns, C function and Python caller named."""
    err = run_child(WATCHED, stuck_so, args=[function])
    lines = err.splitlines()
    assert "RETURNED" in lines, err
    report = first_report(err)
    assert lines.index(report[0]) < lines.index("RETURNED"), err
    python = line_of(report, f"in {function}")
    if innermost:
        # the C function, then ctypes' call machinery, then the Python caller: the walk went through every
        # module between them (their tables built between samples, never in the handler)
        assert line_of(report, f"] {innermost}+") < line_of(report, ctypes_call_marker()) < python, err
    assert any("g_initialstub" in line for line in report[python:]), err   # down to the greenlet's start
    if function == "stuck_in_syscall":
        # native file:line (DWARF of the fixture): the line of its clock_nanosleep call, read from the source
        with open(os.path.join(os.path.dirname(__file__), "fixtures", "stuck.c")) as f:
            call = next(n for n, text in enumerate(f, 1) if "clock_nanosleep(CLOCK_MONOTONIC" in text)
        assert report[line_of(report, "] stuck_sleep+")].endswith(f"stuck.c:{call})"), report
    assert line_of(report, f"in {function}") == line_of(report, ", line ")   # Python frames: file and line
    # One recovery line for that episode (the main greenlet, sleeping afterwards, may be reported too).
    thread = report[0].split(" has not switched")[0]
    episode = lines[lines.index(report[0]):lines.index("RETURNED") + 1]
    assert not any("switched again" in line for line in episode), err
    recovered = [line for line in lines if line.startswith(thread) and "switched again" in line]
    assert len(recovered) >= 1 and "it was stuck for" in recovered[0], err
    reports = int(lines[-1].split()[-1])
    assert reports >= 2, err   # repeat=True: again after twice the threshold
    # ... and that second report of the same stuck call does not repeat the outer frames it shares with the
    # first, down to the greenlet's start (unless the first sample was partial, then the second is whole: see
    # test_a_repeat_after_a_partial_report_shows_the_whole_stack). Not "shorter": a Python loop's inner C
    # calls may run deeper at the second sample.
    first, second = episode_reports(err)[:2]
    assert second[0].startswith(f"{thread} still has not switched greenlets, for "), err
    if not any(line.startswith("  (partial: ") for line in first):
        assert "the same stack as at" in second[0] or "its stack changed: the inner" in second[0], err
        assert not any("g_initialstub" in line for line in second), err


HOPS = 20   # libraries the hop chain crosses, each loaded just before the stuck call (no CFI table yet)


@pytest.fixture(scope="module")
def hop_libraries(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hops")
    src = os.path.join(os.path.dirname(__file__), "fixtures", "hop.c")
    paths = [str(folder / f"libhop{i}.so") for i in range(HOPS)]
    subprocess.run(["gcc", "-O1", "-g", "-shared", "-fPIC", "-o", paths[0], src], check=True)
    for path in paths[1:]:   # the same code in HOPS files: HOPS modules, each with a table of its own
        shutil.copyfile(paths[0], path)
    return paths


HOPPING = r"""
    libs = [ctypes.PyDLL(path) for path in sys.argv[3:]]   # loaded now: the watchdog has built none of their tables
    hops = (ctypes.c_void_p * len(libs))(*[ctypes.cast(lib.hop, ctypes.c_void_p) for lib in libs[1:]], None)
    libs[0].hop.argtypes = [ctypes.c_double, ctypes.c_void_p, ctypes.c_int]

    def stuck_hopping():
        libs[0].hop(seconds, hops, len(libs) - 1)

    with btcore.start_watchdog(threshold=0.2, file=sys.stderr):
        greenlet.greenlet(stuck_hopping).switch()
"""


def test_the_first_report_of_a_stack_through_many_new_modules_is_whole(stuck_so, hop_libraries):
    # guards: the sample is asked again for each module whose table it lacks (built between asks), as many
    # times as the stack has such modules: one bound of 8 asks for tables and unlucky moments together cut
    # the first report short of greenlet's start when the stack crossed more new modules than that (ci45: a
    # sample inside the vDSO, under ASan's interceptor).
    err = run_child(HOPPING, stuck_so, args=hop_libraries)
    report = first_report(err)
    hops = [line for line in report if "] hop+" in line]
    assert len(hops) == HOPS and len({line.split("]")[0] for line in hops}) == HOPS, err
    assert not any("(partial" in line for line in report), err
    assert any("g_initialstub" in line for line in report[line_of(report, "in stuck_hopping"):]), err


def test_a_later_report_of_the_same_stuck_call_says_same_stack(stuck_so):
    """Guards the shortened repeat: a call stuck where it was (a C sleep) is reported in full once, then in one line."""
    err = run_child(WATCHED, stuck_so, seconds=1.5, args=["stuck_in_syscall"])
    first, second = episode_reports(err)[:2]
    assert any("] stuck_sleep+" in line for line in first) and any("in stuck_in_syscall" in line for line in first)
    thread = first[0].split(" has not switched")[0]
    assert second == [f"{thread} still has not switched greenlets, for {seconds(second[0], ', for ')} s now: "
                      f"the same stack as at {seconds(first[0], 'greenlets for ')} s"], err


PHASES = r"""
    def phase_one():
        while dog.reports < 1:             # until the first report is written: it was sampled in here
            released.stuck_sleep(0.01)

    def phase_two():
        start = dog.reports
        while dog.reports < start + 2:     # a report sampled after phase_two began (the second one counted)
            released.stuck_sleep(0.01)

    def driver():
        phase_one()
        phase_two()                        # the next line: the driver's frame changed too, not its callers

    with btcore.start_watchdog(threshold=0.2, file=sys.stderr) as dog:
        greenlet.greenlet(driver).switch()   # stuck all along: never switches
        os.write(2, b"RETURNED\n")
        time.sleep(0.5)
"""


def test_a_later_report_whose_inner_stack_changed_shows_only_the_inner_frames(stuck_so):
    """Guards the changed form: the first report sampled in phase_one, the first one in phase_two shows only
    the frames that changed (phase_two's and the driver's, at its next line), and says how many outer frames
    (the driver's callers, counted in the full first report) are as they were."""
    err = run_child(PHASES, stuck_so)
    reports = episode_reports(err)
    first = reports[0]
    assert any("in phase_one" in line for line in first), err
    frames = frame_lines(first)
    driver = line_of(frames, "in driver")
    outer = len(frames) - driver - 1                       # the driver's callers: the part that stays
    changed = next(i for i, report in enumerate(reports) if any("in phase_two" in line for line in report))
    report = reports[changed]
    # the report it is compared with: the last one that showed frames (a "same stack" one shows none)
    shown = next(r for r in reversed(reports[:changed]) if "the same stack as at" not in r[0])
    inner = frame_lines(report)
    assert report[0].endswith(f"its stack changed: the inner {len(inner)} frame{'s' * (len(inner) != 1)} "
                              f"(the outer {outer} as at {seconds(shown[0], 'for ')} s):"), err
    # the outermost changed frames: phase_two in the driver, now one line further (the line from the report)
    assert "in phase_two" in inner[-2] and "in driver" in inner[-1], err
    number = int(frames[driver].split(", line ")[1].split(",")[0])
    assert inner[-1] == frames[driver].replace(f", line {number},", f", line {number + 1},"), err
    assert not any("in phase_one" in line for line in inner), err
    assert len(report) < len(first), err


def test_repeat_false_reports_once(stuck_so):
    """Guards repeat=False: one report per stuck episode."""
    err = run_child(r"""
        with btcore.start_watchdog(threshold=0.2, file=sys.stderr, repeat=False) as dog:
            greenlet.greenlet(stuck_in_syscall).switch()
        print("REPORTS", dog.reports, file=sys.stderr)
    """, stuck_so, seconds=1.5)
    assert err.splitlines()[-1] == "REPORTS 1", err


def test_switch_detection_installs_no_tracer(stuck_so):
    """Guards the sampled switch detection: no greenlet tracer is installed (a switch costs nothing more), one set before is untouched."""
    err = run_child(r"""
        seen = []
        def mine(event, args):
            seen.append(event)
        greenlet.settrace(mine)
        with btcore.start_watchdog(threshold=5):
            assert greenlet.gettrace() is mine, greenlet.gettrace()
            before = len(seen)
            greenlet.greenlet(lambda: None).switch()
        print("SEEN", seen[before:], file=sys.stderr)
    """, stuck_so)
    assert err.splitlines()[-1] == "SEEN ['switch', 'switch']", err


def test_greenlets_switching_back_and_forth_between_ticks_are_not_stuck(stuck_so):
    """Guards the counter against A -> B -> A between two samples: the same greenlet current at every tick is not stuck if it switched meanwhile."""
    err = run_child(r"""
        def other():
            while True:
                greenlet.getcurrent().parent.switch()
        g = greenlet.greenlet(other)
        # ~30 ticks of 0.1 s; a threshold of 1 s: a loaded machine (ASan, 2 cores) stalled a switch for 0.1 s once
        with btcore.start_watchdog(threshold=1.0, file=sys.stderr) as dog:
            end = time.monotonic() + 3.0
            while time.monotonic() < end:   # main is current at almost every tick, yet switches all the time
                g.switch()
        print("REPORTS", dog.reports, file=sys.stderr)
    """, stuck_so)
    assert err.splitlines()[-1] == "REPORTS 0", err


def test_watched_thread_that_exits_is_forgotten_safely(stuck_so):
    """Guards the watchdog's reads of another thread's state: a watched thread that ends (its state freed) is neither read nor reported."""
    err = run_child(r"""
        import threading
        with btcore.start_watchdog(threshold=0.1, file=sys.stderr) as dog:
            def worker():
                dog.watch()
                time.sleep(0.02)
            for _ in range(50):
                t = threading.Thread(target=worker)
                t.start()
                t.join()
            greenlet.greenlet(stuck_in_syscall).switch()   # the watchdog still works for the main thread
        print("REPORTS", dog.reports, file=sys.stderr)
    """, stuck_so, seconds=1.0)
    assert "has not switched greenlets" in err and "in stuck_in_syscall" in err, err
    assert int(err.splitlines()[-1].split()[-1]) >= 1, err
    assert "thread 0 " not in err, err   # a worker reported stuck is named when it ends, not by its emptied slot


def test_gevent_hub_waiting_is_idle_not_stuck(stuck_so):
    """Guards the hub rule: a thread switched into gevent's hub waits for events; it is not reported."""
    pytest.importorskip("gevent")
    err = run_child(r"""
        import gevent
        with btcore.start_watchdog(threshold=0.1, file=sys.stderr) as dog:
            gevent.sleep(1.0)          # the hub waits in the loop for 1 s
        print("REPORTS", dog.reports, file=sys.stderr)
    """, stuck_so)
    assert err.splitlines()[-1] == "REPORTS 0", err


def test_gevent_event_loop_blocked_report_has_native_frames(stuck_so):
    """Guards gevent_blocking_reports(): gevent's own monitor report includes btcore's native + Python stack."""
    pytest.importorskip("gevent")
    err = run_child(r"""
        import threading
        import gevent
        btcore.gevent_blocking_reports()
        # The hub's first run starts its own monitor thread (Hub.run), which the test takes.  Started by hand
        # before the hub ran, the monitor kills itself at its first wake-up (`if not hub: self.kill()`: a
        # greenlet not started is false) when this thread has not switched to the hub by then (ASan, ci18).
        gevent.sleep(0)
        monitor = gevent.get_hub().periodic_monitoring_thread
        shown, show = threading.Event(), monitor._show_blocking_report

        def shown_then_set(*args):
            try:
                return show(*args)
            finally:
                shown.set()

        monitor._show_blocking_report = shown_then_set

        def stuck_until_reported():   # in C, never switching, until gevent has printed its report
            while not shown.is_set():
                released.stuck_sleep(0.05)

        gevent.spawn(stuck_until_reported).join()
        os.write(2, b"RETURNED\n")
    """, stuck_so, env={"GEVENT_MONITOR_THREAD_ENABLE": "1", "GEVENT_MAX_BLOCKING_TIME": "0.2"})
    # Stuck until the report is printed, not for a fixed time: under ASan the report's first resolution took
    # longer than 4 s, then than 8 s on a loaded machine (ci17, ci18): printed after the return, or not at all.
    lines = err.splitlines()
    start = line_of(lines, "appears to be blocked")
    ours = line_of(lines[start:], "btcore: the blocked thread's native and Python stack") + start
    assert ours < lines.index("RETURNED"), err
    report = lines[ours:]
    assert line_of(report, "] stuck_sleep+") < line_of(report, "in stuck_until_reported"), err


def test_stuck_dump_signal_while_main_thread_holds_the_gil(stuck_so):
    """Guards register_dump_signal(stuck=True): the dump comes while the main thread is in C holding the GIL."""
    err = run_child(r"""
        import signal
        held.stuck_busy_loop_after_raising.argtypes = [ctypes.c_double, ctypes.c_int]

        def stuck_in_c_asking_for_a_dump():
            held.stuck_busy_loop_after_raising(seconds, signal.SIGUSR1)   # the signal, then the C loop

        btcore.register_dump_signal(signal.SIGUSR1, sys.stderr, stuck=True)
        stuck_in_c_asking_for_a_dump()
        os.write(2, b"RETURNED\n")   # one write: a report cannot cut the line
        assert btcore.unregister_dump_signal(signal.SIGUSR1)
    """, stuck_so)
    lines = err.splitlines()
    header = line_of(lines, f"btcore: signal {int(signal.SIGUSR1)}: the stack of thread")
    assert header < lines.index("RETURNED"), err
    dump = lines[header:]
    assert line_of(dump, "] stuck_busy_loop+") < line_of(dump, "in stuck_in_c_asking_for_a_dump") < \
        line_of(dump, "in <module>"), err


def test_stuck_dump_shows_another_thread_holding_the_gil_in_c(stuck_so):
    """Guards the stuck dump of other threads: a worker holding the GIL in C is sampled in its own thread, shown where it is."""
    err = run_child(r"""
        import signal, threading
        held.stuck_busy_loop_after_raising.argtypes = [ctypes.c_double, ctypes.c_int]
        go = threading.Event()

        def worker_stuck_in_c():
            go.wait()
            held.stuck_busy_loop_after_raising(seconds, signal.SIGUSR1)   # the signal, then the C loop

        worker = threading.Thread(target=worker_stuck_in_c)
        worker.start()
        btcore.register_dump_signal(signal.SIGUSR1, sys.stderr, stuck=True)   # the worker exists: it is registered
        go.set()
        worker.join()
        os.write(2, b"RETURNED\n")
        print("WORKER", worker.ident, file=sys.stderr)
        assert btcore.unregister_dump_signal(signal.SIGUSR1)
    """, stuck_so)
    lines = err.splitlines()
    worker = lines[-1].split()[-1]
    header = line_of(lines, f"btcore: signal {int(signal.SIGUSR1)}: the stack of thread {worker},")
    assert header < lines.index("RETURNED"), err
    dump = lines[header + 1:]
    end = next((i for i, line in enumerate(dump) if not line.startswith("  ")), len(dump))
    dump = dump[:end]
    assert line_of(dump, "] stuck_busy_loop+") < line_of(dump, "in worker_stuck_in_c") < line_of(dump, "in Thread.run"), err


def test_sample_survives_fork_and_the_child_can_watch(stuck_so):
    """Guards fork: the child has no watchdog thread and no stale registration, and starts its own."""
    err = run_child(r"""
        import os
        dog = btcore.start_watchdog(threshold=0.2, file=sys.stderr)
        pid = os.fork()
        if pid == 0:
            try:
                with btcore.start_watchdog(threshold=0.2, file=sys.stderr) as child_dog:
                    greenlet.greenlet(stuck_in_syscall).switch()
                dog.stop()     # the parent's: nothing of it runs in the child, a no-op
                print("CHILD REPORTS", child_dog.reports, file=sys.stderr, flush=True)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        dog.stop()
        print("STATUS", status, file=sys.stderr)
    """, stuck_so, seconds=1.0)
    lines = err.splitlines()
    assert lines[-1] == "STATUS 0", err
    child_reports = next(line for line in lines if line.startswith("CHILD REPORTS"))
    assert int(child_reports.split()[-1]) >= 1, err


def test_start_watchdog_checks_its_arguments():
    """Guards the documented errors: a bad threshold, a file without a descriptor, two watchdogs."""
    import io
    with pytest.raises(ValueError):
        btcore.start_watchdog(threshold=0)
    with pytest.raises(ValueError):
        btcore.start_watchdog(file=io.StringIO())
    with btcore.start_watchdog(threshold=60):
        with pytest.raises(RuntimeError):
            btcore.start_watchdog(threshold=60)


REPEAT_AFTER = r"""
    from btcore._native import ffi, lib
    lib.btc_thread_register()
    import threading
    def nested(n, out):   # the watchdog's own sampling: a signal, tables built between asks
        return nested(n - 1, out) if n else lib.btc_signal_sample(threading.get_ident(), 1000, out)
    first, then = ffi.new("btc_sigsample *"), ffi.new("btc_sigsample *")
    assert nested(3, then) == 0 and not then.partial, then.partial
    ffi.memmove(first, then, ffi.sizeof("btc_sigsample"))   # the same stack (two samples' inner pcs may differ)
    first.partial = int(sys.argv[3])   # as a sample the walk cut at a module whose table was not built yet
    text = ffi.new("char[]", 65536)
    lib.btc_test_watchdog_repeat(first, 0.2, then, 0.4, text, 65536)
    print(ffi.string(text).decode(), end="", file=sys.stderr)
"""


@pytest.mark.parametrize("first_partial", [0, 2])   # BTC_PARTIAL_NO_TABLE
def test_a_repeat_after_a_partial_report_shows_the_whole_stack(stuck_so, first_partial):
    """Guards the rule for repeats (native/watch/watchdog.c add_stack): after a whole report, the same stack is
    one line; after a partial one (frames it lacked were never shown), the next report is whole."""
    err = run_child(REPEAT_AFTER, stuck_so, args=[str(first_partial)])
    lines = err.splitlines()
    if not first_partial:
        assert lines == ["still has not switched greenlets, for 0.4 s now: the same stack as at 0.2 s"], err
        return
    assert lines[0] == ("still has not switched greenlets, for 0.4 s now; the report at 0.2 s was partial: its "
                        "whole stack, innermost first:"), err
    python = [line for line in lines if " in nested" in line]
    assert len(python) == 4 and any("btc_signal_sample" in line for line in lines[1:]), err
    assert not any(line.startswith("  (partial: ") for line in lines), err


UNREADABLE_CODE = r"""
    import ctypes
    from btcore._native import ffi, lib
    libc = ctypes.CDLL(None)
    libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                               ctypes.c_int, ctypes.c_int, ctypes.c_long]
    gone = libc.mmap(None, 4096, 3, 0x22, -1, 0)   # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
    assert libc.munmap(ctypes.c_void_p(gone), 4096) == 0   # an address of nothing

    def sampled():
        return 1

    code = sampled.__code__
    lay = ffi.new("btc_remote_layout *")
    if lib.btc_remote_layout_compiled(lay) != 0:   # 3.11: its known table
        assert lib.btc_remote_layout_of(sys.hexversion, lay) == 0
    # A copy of the code object whose file name points at nothing: a corrupt or half-freed object.
    copy = ctypes.create_string_buffer(ctypes.string_at(id(code), lay.code_adaptive + 64))
    ctypes.c_void_p.from_buffer(copy, lay.code_filename).value = gone
    lasti = next(start for start, end, line in code.co_lines() if line == code.co_firstlineno + 1)
    sample = ffi.new("btc_sigsample *")
    sample.n = 3
    for frame, addr in zip(sample.frames, (id(code), gone, ctypes.addressof(copy))):
        frame.kind, frame.addr, frame.lasti = lib.BTC_KIND_PYTHON, addr, lasti
    buf = ffi.new("char[]", 4096)
    n = lib.btc_sigsample_format(sample, buf, len(buf))
    print(ffi.string(buf, n).decode(), end="", file=sys.stderr)
    print("LINE", code.co_firstlineno + 1, file=sys.stderr)
"""


@pytest.mark.skipif(conftest.UNDER_QEMU, reason="qemu-user: process_vm_readv is not emulated, so a sample's code "
                    "objects are read in place there (native/capture/signal_capture.c btc_read_sampled)")
def test_a_sample_names_code_objects_it_cannot_read_without_reading_them(stuck_so):
    """Guards report.c add_python: a sample is formatted without the GIL while its thread runs on, so a code
    object may be gone or half-freed by then (ASan once saw a use after free in ci30): every part of it is read
    from a copy, an address of nothing is a note, a string pointing at nothing a "?", the line still decoded."""
    err = run_child(UNREADABLE_CODE, stuck_so)
    lines = err.splitlines()
    line = lines[-1].split()[-1]
    assert lines[0] == f'  File "<string>", line {line}, in sampled', err   # the oracle: co_lines()
    assert lines[1].startswith("  (a Python frame whose code object is gone: 0x"), err
    assert lines[2] == f'  File "?", line {line}, in sampled', err
