"""The public API given what callers give it by mistake or by circumstance:
a FIFO or a descriptor number for a path, a file closed after it was handed
over, a fault's signal for the dump's, a watchdog stopped from another
thread, a server stopped in a forked child, arguments of the wrong kind.
Each is a clear exception or the documented behaviour, never a hang, a
write into another file or a silent failure.
"""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import btcore
import conftest
from btcore import web

WAIT = 60   # seconds: hang detection only


def run(source: str, *args, env=None):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source), *args], capture_output=True, text=True,
                          timeout=WAIT, env=env)


def test_write_html_takes_a_regular_file_path_only(tmp_path):
    # guards: write_html opened a FIFO and waited for a reader for ever; an int was taken for a descriptor (the
    # page written into whatever file had that number, which was then closed).
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = run("""
        import sys, btcore
        try:
            btcore.write_html(sys.argv[1])
        except OSError as e:
            print(e)
    """, str(fifo))
    assert done.returncode == 0 and "not a regular file: a FIFO" in done.stdout, done.stderr
    with open(tmp_path / "mine.txt", "w") as mine:
        with pytest.raises(TypeError, match="takes a path"):
            btcore.write_html(mine.fileno())
        mine.write("still mine")
    assert (tmp_path / "mine.txt").read_text() == "still mine"
    btcore.write_html(tmp_path / "page.html")
    assert (tmp_path / "page.html").read_text().startswith("<!DOCTYPE html>")


def test_the_crash_report_keeps_writing_to_its_file_after_the_caller_closed_it(tmp_path):
    # guards: enable_crash_report() kept the file's descriptor number, not a descriptor of its own: closed by the
    # caller (a with block) and given to the next file opened, the report went into that other file.
    report, other = tmp_path / "report.txt", tmp_path / "data.txt"
    done = run("""
        import ctypes, sys, btcore
        with open(sys.argv[1], "w") as f:
            btcore.enable_crash_report(f, helper=False)
        data = open(sys.argv[2], "w")   # gets the number the report's file had
        ctypes.string_at(0)
    """, str(report), str(other), env={**os.environ, **conftest.ASAN_CRASH_CHILD_ENV})   # (ASan: its SIGSEGV ours)
    assert done.returncode == -signal.SIGSEGV, done.stderr
    assert other.read_text() == ""
    assert "SIGSEGV" in report.read_text()


@pytest.mark.parametrize("signum", [signal.SIGSEGV, signal.SIGBUS, signal.SIGKILL, 0, 65])
def test_a_signal_that_cannot_carry_a_dump_is_refused(signum):
    # guards: register_dump_signal(SIGSEGV) turned a crash into a hang (the handler returns, the fault comes back);
    # SIGKILL gave a bare OSError.
    with pytest.raises(ValueError):
        btcore.register_dump_signal(signum)
    with pytest.raises(ValueError):
        btcore.register_dump_signal(signum, stuck=True)


def test_a_watchdog_stopped_from_another_thread_stops_watching_the_thread_that_started_it(tmp_path):
    # guards: stop() unwatched only the thread calling it: a watchdog started later, in another thread, went on
    # reporting the first one's thread, which nobody asked it to watch.
    out = tmp_path / "reports.txt"
    done = run("""
        import sys, threading, time, btcore
        dog = btcore.start_watchdog(0.2, open(sys.argv[1], "w"))
        stopper = threading.Thread(target=dog.stop)
        stopper.start(); stopper.join()

        def second():
            with btcore.start_watchdog(0.2, open(sys.argv[1], "a")):
                time.sleep(1.0)   # stuck itself: reported
        t = threading.Thread(target=second)
        t.start()
        time.sleep(1.0)           # stuck too, not watched any more: not reported
        t.join()
        print(threading.main_thread().ident, t.ident)
    """, str(out))
    assert done.returncode == 0, done.stderr
    main, second = done.stdout.split()
    text = out.read_text()
    assert f"{int(second):#x}" in text or second in text, text
    assert f"{int(main):#x}" not in text and main not in text, text


def test_serve_refuses_arguments_that_cannot_work():
    # guards: web._check_serve: port=True bound port 1, a str of hosts was split into letters, host "" bound every
    # interface, an endless timeout reset every connection.
    for kwargs, error in (({"port": True}, ValueError), ({"port": 70000}, ValueError), ({"host": ""}, ValueError),
                          ({"host": None}, TypeError), ({"allowed_hosts": "localhost"}, TypeError),
                          ({"timeout": float("inf")}, ValueError), ({"max_connections": 1.5}, ValueError)):
        with pytest.raises(error):
            web.serve(**kwargs)


def test_a_server_stopped_in_a_forked_child_keeps_serving_in_the_parent():
    # guards: Server.stop() in a fork child shut the listening socket down for both processes (shutdown(2) acts
    # on the socket, not the descriptor): the parent's page was refused from then on.  (A program of its own,
    # without gevent: the server's OS threads answer while this one waits for the answer.)
    done = run("""
        import os, urllib.request
        from btcore import web
        server = web.serve(token=False)
        child = os.fork()
        if child == 0:
            try:
                server.stop()
            finally:
                os._exit(0)
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
        with urllib.request.urlopen(server.url + "?format=text", timeout=60) as answer:
            print(answer.status)
        server.stop()
    """)
    assert done.returncode == 0 and done.stdout == "200\n", done.stderr


def test_misused_arguments_are_type_errors_that_say_what_is_wanted(tmp_path):
    # guards: dump_all(object()) (AttributeError), decode(search="/tmp") (walked "/" letter by letter: "/", "t",
    # ...), chain_backtrace(None) (AttributeError); spawn_chain(task) before tracking was ever on was a TypeError.
    with pytest.raises(TypeError, match="write"):
        btcore.dump_all(object())
    token = btcore.collect().encode()
    with pytest.raises(TypeError, match=r"give \[directory\]"):
        btcore.decode(token, search=str(tmp_path))
    with pytest.raises(TypeError, match="search holds directories"):
        btcore.decode(token, search=[3])
    with pytest.raises(TypeError, match="takes a SpawnChain"):
        btcore.chain_backtrace(None)
    done = run("""
        import asyncio, btcore
        async def main():
            print(btcore.spawn_chain(asyncio.current_task()))
        asyncio.run(main())
    """)
    assert done.returncode == 0 and done.stdout == "None\n", done.stderr
