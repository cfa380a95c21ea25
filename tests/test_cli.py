"""python -m btcore's commands given what users give them by mistake or by
circumstance: outputs that are not regular files, files that cannot be read,
closed or full standard streams, a reader that goes away, options that
contradict each other, a process that is this one, a thread or a zombie.
Each ends in one line on standard error and a non-zero status, before any
recording, never a traceback or a hang (timeouts below detect hangs only).
"""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import conftest

WAIT = 60   # seconds: hang detection only


def btcore(*args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, **kwargs):
    return subprocess.run([sys.executable, "-m", "btcore", *args], stdin=stdin, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=WAIT, **kwargs)


def one_line(done, status: int, says: str) -> None:
    assert done.returncode == status, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr


def sleeper():
    """A Python process that waits (a target for dump and profile)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


# ---- profile -o ----

@pytest.mark.parametrize("kind, says", [("fifo", "not a regular file: a FIFO"), ("directory", "Is a directory"),
                                        ("device", "not a regular file: a device"),
                                        ("missing folder", "No such file or directory")])
def test_profile_refuses_an_output_it_could_not_write_before_recording(kind, says, tmp_path):
    # guards: -o is checked before the recording (profile/formats.py, check_output): a FIFO was opened after it
    # with SIGINT and SIGTERM ignored (a hang only SIGKILL ended), a directory or a device lost the recording.
    path = {"fifo": tmp_path / "out.txt", "directory": tmp_path / "out.txt", "device": "/dev/full",
            "missing folder": tmp_path / "not" / "out.txt"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    target = sleeper()
    try:
        done = btcore("profile", str(target.pid), "--duration", "30", "-o", str(path), "--format", "collapsed")
    finally:
        target.kill()
        target.wait()
    one_line(done, 2, f"cannot write {path}: {says}")
    assert "recording" not in done.stderr


@pytest.mark.skipif(not conftest.DUMPS_OTHER_PROCESSES, reason=conftest.NO_DUMP_HERE)
def test_profile_whose_output_went_away_writes_the_recording_elsewhere_and_says_where(tmp_path):
    # guards: a write that fails after the recording (the folder removed meanwhile; a full disk alike) puts what
    # was recorded in a new file of the temporary directory, says so, and exits 1 (formats.write_somewhere):
    # the recording was lost with a traceback.
    folder = tmp_path / "out"
    folder.mkdir()
    target = sleeper()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    try:
        command = subprocess.Popen([sys.executable, "-m", "btcore", "profile", str(target.pid), "--duration", "1.5",
                                    "--rate", "20", "-o", str(folder / "p.txt")], stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, "TMPDIR": str(scratch)})
        first = command.stderr.readline()
        assert first.startswith(f"btcore profile: recording process {target.pid}"), first
        shutil.rmtree(folder)   # while it records
        _, stderr = command.communicate(timeout=WAIT)
    finally:
        target.kill()
        target.wait()
    assert command.returncode == 1 and "Traceback" not in stderr, stderr
    saved = list(scratch.iterdir())
    assert len(saved) == 1 and saved[0].name.startswith("btcore-profile-") and saved[0].name.endswith("-p.txt")
    assert f"cannot write {folder / 'p.txt'}: No such file or directory; what was recorded is in {saved[0]}" \
        in stderr, stderr
    assert saved[0].read_text().strip(), "the saved profile is empty"


# ---- decode ----

def test_decode_says_which_files_it_cannot_read_and_decodes_the_others(tmp_path):
    # guards: decode_files: a file that cannot be opened (missing, a directory) is one line each, the others are
    # decoded, the status is 1; it was a traceback at the first, after the earlier files' output.
    good = tmp_path / "good.log"
    good.write_text("before btc4.AAAA after\n")
    done = btcore("decode", str(tmp_path / "missing"), str(tmp_path), str(good))
    one_line(done, 1, f"btcore decode: {tmp_path / 'missing'}: No such file or directory")
    assert f"btcore decode: {tmp_path}: Is a directory" in done.stderr
    assert done.stdout.startswith("before btc4.AAAA (btcore: ") and done.stdout.endswith(" after\n")


def test_decode_reads_a_line_without_end_in_bounded_pieces_and_keeps_the_bytes(tmp_path):
    # guards: decode reads at most a piece (plus a token's most) at a time, cut where no token goes on
    # (__main__._pieces): /dev/zero or a 50 MB line grew its memory without bound; a token across a cut is still
    # decoded; CR, CRLF and bytes that are not UTF-8 come out as they came in (files and standard input alike).
    import btcore as bt
    token = bt.collect().encode()
    text = b"a" * ((1 << 16) - 10) + b" " + token.encode() + b" \xff\r\nnext\r"
    (tmp_path / "in.log").write_bytes(text)
    for args, stdin in ((["decode", str(tmp_path / "in.log")], None), (["decode"], open(tmp_path / "in.log", "rb"))):
        done = subprocess.run([sys.executable, "-m", "btcore", *args], stdin=stdin, capture_output=True,
                              timeout=WAIT, env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"})
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(b"a" * 1000) and done.stdout.endswith(b" \xff\r\nnext\r")
        assert token.encode() not in done.stdout and b"Backtrace (most recent call last)" in done.stdout
    if conftest.UNDER_ASAN or conftest.UNDER_QEMU:   # (ASan's shadow needs terabytes of address space; qemu-user
        return                                        # does not apply RLIMIT_AS)
    zeros = subprocess.Popen(["prlimit", f"--as={256 << 20}", sys.executable, "-m", "btcore", "decode", "/dev/zero"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        read = sum(len(zeros.stdout.read(1 << 20)) for _ in range(288))   # more NULs than its room
    finally:
        zeros.kill()
        zeros.wait()
    assert read == 288 << 20, zeros.stderr.read()


def _exec_keeps_standard_input_closed() -> bool:
    """False under qemu-user: binfmt_misc hands qemu the program as an open descriptor, the lowest free one,
    and qemu reads AT_EXECFD 0 as "none" and leaves it open, so a program started with its standard input
    closed reads its own executable there (seen in the arm64 lane: sys.stdin was /usr/bin/python3.14)."""
    probe = subprocess.run([sys.executable, "-c", "import sys; sys.exit(sys.stdin is not None)"], stdin=None,
                           preexec_fn=lambda: os.close(0), timeout=WAIT)
    return probe.returncode == 0


def test_decode_with_standard_input_closed_says_so():
    if not _exec_keeps_standard_input_closed():
        pytest.skip(QEMU_OPENS_STANDARD_INPUT)
    done = btcore("decode", stdin=None, preexec_fn=lambda: os.close(0))
    one_line(done, 1, "btcore decode: standard input is closed")


QEMU_OPENS_STANDARD_INPUT = "exec opens the program at a closed standard input (qemu-user's AT_EXECFD 0)"


# ---- standard output: closed, full, a reader gone ----

def test_a_closed_standard_output_is_one_line_and_status_1():
    # guards: __main__.main: a closed standard output (sys.stdout None: an AttributeError traceback).
    closed = btcore("demo", "--greenlet", stdout=None, preexec_fn=lambda: os.close(1))
    one_line(closed, 1, "btcore demo: standard output is closed")


def test_a_full_standard_output_is_one_line_and_status_1():
    # guards: __main__.main: a full disk (an OSError traceback), and on 3.14 the bytes a failed flush keeps,
    # which the interpreter's flush at exit wrote again ("Exception ignored while flushing sys.stdout", status
    # 120: the arm64 lane).
    with open("/dev/full", "w") as full:
        done = btcore("demo", "--greenlet", stdout=full)
    one_line(done, 1, "btcore demo: No space left on device")
    assert done.stderr.count("No space left on device") == 1, done.stderr


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    # guards: __main__.main's BrokenPipeError: `python -m btcore decode big.log | head -1` ended in a traceback;
    # now the status is 128 + SIGPIPE, as a C tool's, and nothing is said.
    big = tmp_path / "big.log"
    big.write_text("line\n" * 2_000_000)
    command = subprocess.Popen([sys.executable, "-m", "btcore", "decode", str(big)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    assert command.stdout.readline() == b"line\n"
    command.stdout.close()
    assert command.wait(timeout=WAIT) == 128 + signal.SIGPIPE
    assert command.stderr.read() == b""


# ---- dump ----

@pytest.mark.parametrize("args, says", [
    (["--timeout", "nan"], "timeout must be more than 0 and at most 3600 seconds, got nan"),
    (["--timeout", "1e7"], "timeout must be more than 0 and at most 3600 seconds"),
    (["--timeout", "0"], "timeout must be more than 0"),
    (["--exe", "/bin/ls"], "checked against a core file's mapped files: give the core file"),
    (["--json", "--format", "html"], "--json and --format html say different things"),
    (["--crash-record", "0x10", "--format", "json"], "--crash-record writes text"),
    (["--crash-record", "-1"], "not an address: '-1'"),
    (["--crash-record", "zz"], "not an address: 'zz'"),
])
def test_dump_options_that_cannot_work_are_refused(args, says):
    # guards: dump_command and remote.process.check_target: --timeout nan, inf or 1e7 ended in a ValueError or an
    # OverflowError traceback; contradicting options were accepted and one silently won.
    one_line(btcore("dump", *args, "1"), 2, says)


@pytest.mark.skipif(not conftest.DUMPS_OTHER_PROCESSES, reason=conftest.NO_DUMP_HERE)
def test_dump_of_this_process_a_thread_or_a_zombie_says_what_it_is():
    # guards: remote/snapshot._process_of: a dump of its own process stops its own threads (it said "lacks
    # CAP_SYS_PTRACE"); a thread's id reads its whole process, under that process's id; a zombie has exited (it
    # said "not a CPython process").
    itself = subprocess.run(["sh", "-c", f"exec {sys.executable} -m btcore dump $$"], capture_output=True, text=True,
                            timeout=WAIT)
    one_line(itself, 1, "is this process: a dump from outside stops the threads of the process it reads")
    threaded = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                                 "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
                                 "print(threading.get_native_id(), flush=True)\ntime.sleep(600)"],
                                stdout=subprocess.PIPE, text=True)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        threaded.stdout.readline()
        deadline = time.monotonic() + WAIT
        while len(os.listdir(f"/proc/{threaded.pid}/task")) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        thread = max(int(t) for t in os.listdir(f"/proc/{threaded.pid}/task"))
        done = btcore("dump", str(thread))
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"Process dump, process {threaded.pid}:")
        assert f"note: {thread} is a thread of process {threaded.pid}: the whole process is read" in done.stdout
        os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)   # exited, not reaped
        one_line(btcore("dump", str(zombie.pid)), 1, f"process {zombie.pid} has exited (a zombie")
    finally:
        threaded.kill()
        threaded.wait()
        zombie.wait()


def test_dump_process_refuses_arguments_of_the_wrong_kind():
    # guards: check_target from the API: a float or a bool pid, a timeout that is not a number or not finite.
    from btcore import dump_process
    for bad, error in (({"pid": 1.0}, TypeError), ({"pid": True}, TypeError), ({"pid": 1, "timeout": "5"}, TypeError),
                       ({"pid": 1, "timeout": float("inf")}, ValueError), ({"core": 3}, TypeError)):
        with pytest.raises(error):
            dump_process(**bad)
