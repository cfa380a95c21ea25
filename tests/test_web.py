"""btcore.web.serve() against hostile HTTP clients, over real loopback sockets.

The server runs in a child program (tests/fixtures/web_target.py), in both
of its forms: "gevent" (greenlets of the program's hub) and "thread" (a
program without gevent: OS threads).  The child runs a ticker (a greenlet,
or a thread) and counts its ticks around each render of the page; it
answers commands on stdin (os.open under a lowered RLIMIT_NOFILE, tick
gaps), so the oracles are the program's own view: did its loop keep
turning, could it still open files.  No wall-clock thresholds: timeouts
below only detect hangs, and the server's own deadline is set short (1 s)
where a test waits for it.
"""
import json
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "fixtures", "web_target.py")
TIMEOUT = 60                 # hang detection only
MODES = ("gevent", "thread")


class Target:
    """The child program: its url, port, token; ask(command) -> its JSON answer."""

    def __init__(self, mode, *options):
        self.mode = mode
        self.proc = subprocess.Popen([sys.executable, "-P", TARGET, mode, *options],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        info = self._answer()
        self.url, self.port = info["url"], info["address"][1]
        self.token = self.url.partition("?token=")[2]

    def _answer(self):
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT)
        assert ready, "the target did not answer"
        return json.loads(self.proc.stdout.readline())

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def start():
    targets = []

    def start(mode, *options):
        targets.append(Target(mode, *options))
        return targets[-1]

    yield start
    for target in targets:
        target.close()


def _head(target, query=None, host=None, headers=()):
    """A request head: the token's query unless query is given, Host: 127.0.0.1:port unless host is."""
    query = f"token={target.token}" if query is None else query
    host = f"127.0.0.1:{target.port}" if host is None else host
    lines = [f"GET /?{query} HTTP/1.1"] + ([f"Host: {host}"] if host != "" else []) + list(headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _exchange(port, data):
    """(status, body) of the answer to data; status 0 if the server reset the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        try:
            sock.sendall(data)
            answer = bytearray()
            while chunk := sock.recv(65536):
                answer += chunk
        except (ConnectionResetError, BrokenPipeError):
            return 0, b""
    head, _, body = bytes(answer).partition(b"\r\n\r\n")
    return (int(head.split()[1]) if head else 0), body


def _idle(port, data=b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n"):
    """A connection that sent data (a head without its end, by default) and waits."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sock.sendall(data)
    return sock


def _closed_by_server(sock):
    """Reads (whatever answer comes) until the server closes sock; False if it has not within TIMEOUT."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


# ---- access: token, Host, Origin ----


@pytest.mark.parametrize("mode", MODES)
def test_token_is_required(start, mode):
    """Guards the token check: without it, or with another one, 403; with it (query or Bearer), the page."""
    target = start(mode)
    assert len(target.token) >= 20
    assert _exchange(target.port, _head(target, query=""))[0] == 403
    assert _exchange(target.port, _head(target, query="token=" + "x" * len(target.token)))[0] == 403
    assert _exchange(target.port, _head(target, query="format=text&token=" + target.token[:-1]))[0] == 403
    status, body = _exchange(target.port, _head(target))
    assert status == 200 and b'id="btcore-data"' in body
    status, body = _exchange(target.port, _head(target, query="format=text",
                                                headers=[f"Authorization: Bearer {target.token}"]))
    assert status == 200 and body.startswith(b"Greenlet dump")


@pytest.mark.parametrize("mode", MODES)
def test_foreign_host_and_origin_are_refused(start, mode):
    """Guards the DNS-rebinding check: only the bound address, localhost and allowed names, in Host and Origin."""
    target = start(mode, "--allow", "Debug.Example")
    port = target.port
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", f"[::1]:{port}"):
        assert _exchange(port, _head(target, host=host)) == (403, b"Host not allowed (DNS rebinding?): "
                                                             b"serve(allowed_hosts=...) adds names\n"), host
    for host in ("", f"evil@127.0.0.1:{port}", f"127.0.0.1:{port}/x", "127.0.0.1:123456"):
        assert _exchange(port, _head(target, host=host))[0] == 400, host
    assert _exchange(port, _head(target, headers=[f"Host: 127.0.0.1:{port}"]))[0] == 400      # two Hosts
    for origin in ("http://evil.example", f"http://evil.example:{port}", "null", "http://[::1"):
        assert _exchange(port, _head(target, headers=[f"Origin: {origin}"]))[0] == 403, origin
    for host in (f"127.0.0.1:{port}", "127.0.0.1", f"LocalHost:{port}", f"debug.example:{port}"):
        assert _exchange(port, _head(target, host=host, headers=[f"Origin: http://{host}"]))[0] == 200, host


# ---- bounds: head size, deadlines, connections ----


@pytest.mark.parametrize("mode", MODES)
def test_huge_heads_are_refused(start, mode):
    """Guards the head limit: a 100 KB header line or 300 small headers get 431 (or a reset: the server
    closes with the rest unread), never the page; the server serves on."""
    target = start(mode)
    assert _exchange(target.port, _head(target, headers=["X-Big: " + "a" * 100_000]))[0] in (0, 431)
    many = [f"X-Header-{i}: {'b' * 20}" for i in range(300)]
    assert _exchange(target.port, _head(target, headers=many))[0] in (0, 431)
    just_over = ["X-Pad: " + "c" * (9000 - len(_head(target)))]    # read whole before the answer
    assert _exchange(target.port, _head(target, headers=just_over))[0] == 431
    assert _exchange(target.port, _head(target, query="format=json&token=" + target.token))[0] == 200


@pytest.mark.parametrize("mode", MODES)
def test_idle_and_slow_clients_are_cut_off(start, mode):
    """Guards the request deadline: an idle client and one that drips a byte at a time are both closed."""
    target = start(mode, "--timeout", "1")
    idle = socket.create_connection(("127.0.0.1", target.port), timeout=TIMEOUT)
    partial = _idle(target.port)
    drip = _idle(target.port)
    with idle, partial, drip:
        assert _closed_by_server(idle) and _closed_by_server(partial)
        # slowloris: one header byte every 20 ms, never ending; at most TIMEOUT seconds of it
        closed = False
        for _ in range(TIMEOUT * 50):
            try:
                drip.send(b"x")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if select.select([drip], [], [], 0.02)[0]:
                closed = _closed_by_server(drip)
                break
        assert closed
    assert _exchange(target.port, _head(target))[0] == 200


@pytest.mark.parametrize("mode", MODES)
def test_an_idle_client_does_not_block_others(start, mode):
    """Guards concurrent serving (the thread server used to serve one client at a time)."""
    target = start(mode)
    with _idle(target.port), _idle(target.port, b""):
        status, body = _exchange(target.port, _head(target, query="format=text&token=" + target.token))
    assert status == 200 and body.startswith(b"Greenlet dump")


def _until_served(target):
    """The first status other than a refusal (503/reset) of the page, asking again while refused."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        status = _exchange(target.port, _head(target, query="format=json&token=" + target.token))[0]
        if status not in (0, 503):
            return status
        time.sleep(0.05)
    return None


@pytest.mark.parametrize("mode", MODES)
def test_connections_are_capped(start, mode):
    """Guards the connection cap: with max_connections held by idle clients, the next one is refused at
    once (503 or reset, not queued); once they leave, requests are served again."""
    target = start(mode, "--max-connections", "4")
    held = [_idle(target.port) for _ in range(4)]
    try:
        for _ in range(3):
            assert _exchange(target.port, _head(target))[0] in (0, 503)
    finally:
        for sock in held:
            sock.close()
    assert _until_served(target) == 200


def _raise_own_descriptor_limit(need):
    """Room for need descriptors in this process (ValueError if the hard limit is below: no silent skip)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    return soft


@pytest.mark.parametrize("mode", MODES)
def test_a_thousand_idle_connections_leave_the_program_its_descriptors(start, mode):
    """Guards the cap where it matters: under RLIMIT_NOFILE 128, 1,000 idle connections held open
    while the program opens 50 files of its own: every open succeeds, then the page is served."""
    old = _raise_own_descriptor_limit(1200)
    target = start(mode, "--nofile", "128")
    held = []
    try:
        for _ in range(1000):
            try:
                held.append(_idle(target.port))
            except OSError:     # refused or reset by the server: it stays refused, and that is fine
                pass
        assert target.ask("open 50") == {"opened": 50, "error": None}
        fds = target.ask("fds")
        print(f"{mode}: {len(held)} client connections held; the program has {fds['fds']} descriptors open "
              f"(limit {fds['limit']})")
        assert fds["fds"] < 128 - 50
    finally:
        for sock in held:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (old, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    assert _until_served(target) == 200


# ---- the program keeps running while a page is rendered ----


@pytest.mark.parametrize("mode", MODES + ("patched",))
def test_the_loop_ticks_while_the_page_is_rendered(start, mode):
    """Guards the render off the event loop: the target's ticker advances during btcore.views.html.page(),
    which runs outside the program's main OS thread (gevent: the hub's thread), monkey-patched
    (threading is gevent's) or not."""
    target = start(mode, "--greenlets", "3000")
    status, body = _exchange(target.port, _head(target))
    assert status == 200
    (before, after, in_main_thread, _, _), = target.ask("pages")
    gaps = target.ask("ticks")["gaps"]
    print(f"{mode}: {after - before} ticks during the render; the ticker's largest gaps (s): "
          f"{[round(gap, 4) for gap in gaps[:5]]}")
    assert not in_main_thread
    assert after > before


@pytest.mark.parametrize("mode", MODES)
def test_concurrent_requests_share_one_render(start, mode):
    """Guards coalescing: 8 simultaneous GETs of the page are answered by fewer renders than requests,
    and the requests answered by one render get the same bytes."""
    target = start(mode, "--greenlets", "3000")
    barrier, answers = threading.Barrier(8), []

    def get():
        barrier.wait()
        answers.append(_exchange(target.port, _head(target)))

    clients = [threading.Thread(target=get) for _ in range(8)]
    for client in clients:
        client.start()
    for client in clients:
        client.join(TIMEOUT)
    renders = len(target.ask("pages"))
    distinct = {body for _, body in answers}
    print(f"{mode}: 8 requests, {renders} renders, {len(distinct)} distinct bodies")
    assert [status for status, _ in answers] == [200] * 8
    assert len(distinct) == renders < 8


def test_a_file_name_with_undecodable_bytes_is_served_escaped():
    # guards: the page's text form is UTF-8 bytes whatever file names the program's code has: a name the file
    # system gave with bytes that are not UTF-8 holds lone surrogates (os.fsdecode), served escaped as
    # Python's tracebacks print them, not a failed render.
    import greenlet
    from btcore import snapshot, web
    scope = {"greenlet": greenlet}
    exec(compile("def park():\n    greenlet.getcurrent().parent.switch()\n", "/nowhere/caf\udce9.py", "exec"), scope)
    parked = greenlet.greenlet(scope["park"])
    parked.switch()
    body = web._render_bytes(snapshot(), "text")
    assert b'File "/nowhere/caf\\udce9.py", line 2, in park' in body
