"""The outside profiler: python -m btcore profile PID, btcore.profile.remote.

The target is a separate gevent program with a known split: one greenlet
computes half of the time (20 ms computing, 20 ms asleep, in turns, and
writes the share it measured itself to a file), three wait the whole time
(on a socket, a lock, a sleep), one parks in turn at two places.  Oracles:
that split and the share the program measured, the functions the test
wrote, the inside profiler's view of the same program (python -m btcore
profile -- COMMAND), a protobuf decoder written from profile.proto
(tests/test_profile.py's) and Go's pprof when `go` is installed.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import conftest

pytest.importorskip("gevent")
from btcore.profile import formats as profile_formats  # noqa: E402
from btcore.remote.process import DumpError  # noqa: E402
from btcore.profile.remote import ProcessProfiler, profile_process  # noqa: E402
from test_profile import check_pprof_times, decode_pprof, go_pprof_top  # noqa: E402

pytestmark = pytest.mark.skipif(not conftest.DUMPS_OTHER_PROCESSES, reason=conftest.NO_DUMP_HERE)
WAIT = 120                    # seconds: hang detection only
TOLERANCE = 0.15              # the burner's on-CPU share in the profile = the share it measured itself +- 0.15:
                              # from outside no GIL delays a sample (the inside profiler's test needs 0.25); ~100
                              # samples of a 20 ms on / 20 ms off pattern leave a few % of sampling noise
WAITERS = (("on_socket", "recv"), ("on_lock", "acquire"), ("on_sleep", "sleep"))

PROGRAM = textwrap.dedent('''
    import gevent.monkey; gevent.monkey.patch_all()
    import os, socket, sys, threading, time, gevent
    ready, share, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    started, burned = time.perf_counter(), [0.0]
    def burn():
        while True:
            t = time.perf_counter()
            while time.perf_counter() - t < 0.02:
                pass
            with open(share + ".tmp", "w") as f:   # (its own time is the burner's too)
                now = time.perf_counter()
                f.write(f"{burned[0] + now - t} {now - started}")
            os.replace(share + ".tmp", share)
            burned[0] += time.perf_counter() - t
            gevent.sleep(0.02)
    def on_socket(s): s.recv(1)
    def on_lock(l): l.acquire()
    def on_sleep(): gevent.sleep(1000)
    def first(): gevent.sleep(0.03)
    def second(): gevent.sleep(0.03)
    def alternate():
        while True:
            first()
            second()
    a, b = socket.socketpair()
    lock = threading.Lock(); lock.acquire()
    workers = [gevent.spawn(burn), gevent.spawn(on_socket, a), gevent.spawn(on_lock, lock), gevent.spawn(on_sleep),
               gevent.spawn(alternate)]
    gevent.sleep(0.1)
    with open(ready, "w") as f:
        f.write("ready")
    gevent.sleep(seconds)
''')


def start(tmp_path, seconds=600.0):
    """(process, path of the burner's share file) of a running split program."""
    script, ready, share = tmp_path / "split.py", tmp_path / "ready", tmp_path / "share"
    script.write_text(PROGRAM)
    proc = subprocess.Popen([sys.executable, str(script), str(ready), str(share), str(seconds)])
    conftest.wait_until_ready(proc, ready, WAIT)
    return proc, share


def measured(share):
    burned, elapsed = (float(x) for x in share.read_text().split())
    return burned, elapsed


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """The outside profile of 2 s of the split program at 50 Hz; profile.burned: the share of that time the
    computing greenlet measured itself computing."""
    folder = tmp_path_factory.mktemp("split")
    proc, share = start(folder)
    try:
        before = measured(share)
        profile = profile_process(proc.pid, 2.0, 50)
        after = measured(share)
        profile.burned = (after[0] - before[0]) / (after[1] - before[1])
        profile.script = str(folder / "split.py")
        yield profile
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)


def by_group(stacks, width):
    out = {}
    for stack, us in stacks.items():
        out[stack[:width]] = out.get(stack[:width], 0) + us
    return out


def group_of(stacks, function):
    """The group whose name ends with "(function)" (remote_names: a gevent Greenlet's type and function)."""
    return next(stack[0] for stack in stacks if stack[0].endswith(f"({function})"))


def test_on_cpu_time_goes_to_the_computing_greenlet_half_of_the_time(split):
    cpu = split.stacks("cpu")
    main = sum(us for stack, us in cpu.items() if not stack[0].startswith("thread ") or "(main thread)" in stack[0])
    in_burn = sum(us for stack, us in cpu.items() if any(f.startswith(f"burn ({split.script}:") for f in stack))
    assert abs(in_burn / main - split.burned) <= TOLERANCE, (in_burn / main, split.burned, by_group(cpu, 1))
    # the running stack takes the burner's group (seen parked, running the same outermost function); until
    # it is first seen parked (one turn: 40 ms, longer on a loaded machine), its thread's
    burner = group_of(cpu, "burn")
    assert by_group(cpu, 1)[(burner,)] >= 0.5 * in_burn, by_group(cpu, 1)
    assert not any(stack[0].endswith(("(on_socket)", "(on_lock)", "(on_sleep)")) for stack in cpu)


def test_wall_clock_time_of_each_waiting_greenlet_is_where_it_waits(split):
    wall = split.stacks("wall")
    groups = by_group(wall, 2)
    for name, waits_in in WAITERS:
        group = group_of(wall, name)
        assert groups[(group, "parked")] >= 0.95 * split.sampled, (name, groups)
        assert (group, "running") not in groups
        stacks = [stack for stack in wall if stack[0] == group]
        assert len(stacks) == 1, stacks
        names = stacks[0]
        at = next(i for i, frame in enumerate(names) if frame.startswith(f"{name} ({split.script}:"))
        below = [frame for frame in names[at + 1:] if not frame.startswith("[python")]
        assert any(waits_in in frame for frame in below[:4]), names
        assert any(frame.endswith(".so]") for frame in names[at + 1:]), names   # native frames, merged
    # the burner is in every sample, running or parked, under its group or (running before it was first seen
    # parked) its thread's
    in_burn = sum(us for stack, us in wall.items() if any(f.startswith(f"burn ({split.script}:") for f in stack))
    assert in_burn >= 0.9 * split.sampled, (in_burn, split.sampled, groups)


def test_a_greenlet_parking_in_turn_at_two_places_shows_both(split):
    wall = split.stacks("wall")
    group = group_of(wall, "alternate")
    places = {function for stack in wall if stack[0] == group for function in ("first", "second")
              if any(frame.startswith(f"{function} ({split.script}:") for frame in stack)}
    assert places == {"first", "second"}, [stack for stack in wall if stack[0] == group]


def test_samples_weigh_the_time_they_stand_for(split):
    # 2 s asked for: the weights and the stops add up to the time recorded (up to the last stop's end: what
    # follows it, its walk, is the only part not counted), however long the machine's load stretched it
    accounted = split.sampled + split.busy * 1e6
    assert split.duration >= 1.8 and 0.8 * split.duration * 1e6 <= accounted <= split.duration * 1e6 + 1, \
        (split.sampled, split.busy, split.duration, split.ticks)
    assert split.ticks >= 20


def test_collapsed_stacks_round_trip(split):
    for mode in ("cpu", "wall"):
        text = profile_formats.collapsed(split, mode)
        assert profile_formats.read_collapsed(text) == split.stacks(mode)


def test_pprof_decoded_from_the_spec_holds_the_same_times(split):
    doc = decode_pprof(profile_formats.pprof(split))
    check_pprof_times(split, doc)
    assert any("on_lock" in names for names, _, _ in doc["samples"])


@pytest.mark.skipif(conftest.UNDER_QEMU, reason="qemu-user: go tool pprof runs past its timeout under emulation")
def test_go_pprof_reads_the_file(split, tmp_path):
    top, = go_pprof_top(split, tmp_path, ["-sample_index=wall", "-tagfocus=greenlet=on_lock"])
    rows = [line.split() for line in top.splitlines() if line.strip().endswith(" on_lock")]
    assert len(rows) == 1, top
    cum = float(rows[0][4].rstrip("%"))   # flat flat% sum% cum cum% name: on_lock's share of all wall time
    wall = split.stacks("wall")
    ours = sum(us for stack, us in wall.items() if stack[0].endswith("(on_lock)"))
    assert abs(cum - 100 * ours / sum(wall.values())) < 0.01, top   # go prints 2 decimals


def python_functions(stack):
    """The Python functions of a stack's frame names ("function (file:line)"), without their place."""
    return {frame.rsplit(" (", 1)[0] for frame in stack if frame.endswith(")") and ".py:" in frame}


def test_outside_and_inside_profiles_agree_on_the_waiters_stacks(split, tmp_path):
    script, ready, share = tmp_path / "split.py", tmp_path / "ready", tmp_path / "share"
    script.write_text(PROGRAM)
    out = tmp_path / "inside.txt"
    done = subprocess.run([sys.executable, "-m", "btcore", "profile", "-o", str(out), "--", sys.executable,
                           str(script), str(ready), str(share), "1.0"], capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 0, done.stderr
    inside = profile_formats.read_collapsed(out.read_text(encoding="utf-8"))
    outside = split.stacks("wall")
    for name, _ in WAITERS:
        theirs = {f for stack in inside if stack[0].endswith(f"({name})") and stack[1] == "parked"
                  for f in python_functions(stack)}
        ours = {f for stack in outside if stack[0].endswith(f"({name})") for f in python_functions(stack)}
        assert ours == theirs and name in ours, (name, ours, theirs)


def test_progress_calls_and_bounded_stacks(tmp_path):
    proc, _ = start(tmp_path)
    try:
        profiler = ProcessProfiler(proc.pid, 50, max_stacks=2)
        seen = []
        try:
            assert profiler.record(1.0, on_progress=seen.append, progress_every=0.2) == "duration"
        finally:
            profiler.close()
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)
    assert len(seen) >= 2 and all(p is profiler for p in seen)
    profile = profiler.profile
    assert len(profile) == 2 and profile.other > 0   # the other stacks' samples: counted, not kept
    assert sum(profile.stacks("wall").values()) == sum(profile.stacks("wall", group_by=None).values())


# ---- the command ----

def cli(*args):
    # (SIGINT back to its default in the child: a shell's background job, CI's say, starts with it ignored,
    # and Python then keeps it ignored: the Ctrl-C test's signal would be lost)
    return subprocess.Popen([sys.executable, "-m", "btcore", "profile", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_cli_a_target_that_exits_mid_recording_writes_what_was_recorded(tmp_path):
    proc, _ = start(tmp_path)
    out = tmp_path / "out.txt"
    child = cli(str(proc.pid), "--duration", "60", "--rate", "50", "-o", str(out))
    assert child.stderr.readline().startswith(f"btcore profile: recording process {proc.pid}")
    time.sleep(0.5)
    proc.terminate()   # it ends (SIGTERM: no handler) while the profiler records
    proc.wait(timeout=WAIT)
    _, stderr = child.communicate(timeout=WAIT)
    assert child.returncode == 0, stderr
    assert f"process {proc.pid} exited after" in stderr and f"wrote {out} (collapsed)" in stderr, stderr
    stacks = profile_formats.read_collapsed(out.read_text(encoding="utf-8"))
    # the Python frames were named while the target lived
    assert any(frame.startswith(f"on_lock ({tmp_path / 'split.py'}:") for stack in stacks for frame in stack), stacks


@pytest.mark.parametrize("sig, how", [(signal.SIGINT, "interrupted (Ctrl-C)"),
                                      (signal.SIGTERM, "terminated (SIGTERM)")])   # a supervisor's stop
def test_cli_ctrl_c_or_sigterm_writes_what_was_recorded(tmp_path, sig, how):
    proc, _ = start(tmp_path)
    out = tmp_path / "out.pb.gz"
    try:
        child = cli(str(proc.pid), "-o", str(out))
        assert child.stderr.readline().startswith(f"btcore profile: recording process {proc.pid}")
        time.sleep(0.5)
        child.send_signal(sig)
        _, stderr = child.communicate(timeout=WAIT)
        assert proc.poll() is None   # the target runs on
    finally:
        proc.kill()
        proc.wait(timeout=WAIT)
    assert child.returncode == 0, stderr
    assert f"{how}: the profile holds" in stderr and f"wrote {out} (pprof)" in stderr, stderr
    doc = decode_pprof(out.read_bytes())
    assert any("on_sleep" in names and labels["state"] == "parked" for names, _, labels in doc["samples"])


def gone_pid():
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait(timeout=WAIT)
    return done.pid


@pytest.mark.parametrize("args, message", [
    (["abc"], "'abc' is not a PID"),
    (["1", "--", "true"], "give a PID or a program to run after --, not both"),
    (["1", "--group-by", "spawn"], "spawn sites are not read from outside"),
    (["1", "--rate", "0"], "--rate must be from 1 to 1000"),
])
def test_cli_refuses_bad_arguments(args, message):
    child = cli(*args)
    _, stderr = child.communicate(timeout=WAIT)
    assert child.returncode == 2 and message in stderr, stderr


def test_cli_a_process_that_is_gone_is_a_clear_error(tmp_path):
    pid = gone_pid()
    child = cli(str(pid), "-o", str(tmp_path / "p.txt"))
    _, stderr = child.communicate(timeout=WAIT)
    assert child.returncode == 1 and f"no process {pid}" in stderr, stderr
    assert not (tmp_path / "p.txt").exists()


def test_api_refuses_bad_arguments():
    with pytest.raises(ValueError, match="cannot profile itself"):
        ProcessProfiler(os.getpid())
    with pytest.raises(ValueError, match="rate"):
        ProcessProfiler(1, 0)
    with pytest.raises(ValueError, match="duration"):
        profile_process(1, 0)
    with pytest.raises(DumpError, match="no process"):
        ProcessProfiler(gone_pid())
