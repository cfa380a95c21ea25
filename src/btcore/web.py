"""The live HTML view over HTTP: `app`, a WSGI application, and serve().

A debug endpoint, like Go's net/http/pprof: it shows every greenlet's stack,
source file paths and greenlet names to whoever can reach it.  Mount `app`
behind your application's own authentication, or let serve() run it: on the
loopback interface, answering only requests whose Host (and Origin) name
its own address, and that carry its token (docs/safety.md).

What a request costs the program: the snapshot is taken by the caller (raw
frames, nothing resolved), a gevent caller in steps of
introspect.PAUSE_EVERY greenlets with the loop running between them;
resolving and rendering, the
expensive part, run in a real OS thread while a gevent caller waits
cooperatively (gevent's threadpool), so the event loop keeps turning.  One
render at a time (per hub, or per process for OS threads); a request for
the format being rendered waits for that render and shares its body.
"""
from __future__ import annotations

import errno
import hmac
import io
import ipaddress
import os
import re
import secrets
import socket
import sys
import threading
import time
import weakref
from functools import partial
from urllib.parse import parse_qs, quote, unquote, urlsplit

import greenlet

from .views.dump import render, stack_text
from .capture.introspect import snapshot
from .capture.threads import is_main_thread, real_thread

LOOPBACK = "127.0.0.1"
MAX_CONNECTIONS = 16     # connections serve() handles at once; more get a 503 and are closed at once
MAX_HEAD = 8192          # bytes of request line and headers serve() reads; more is a 431
TIMEOUT = 10.0           # seconds for a request's head to arrive, and again for its response to be taken
_CONTENT_TYPES = {
    "html": "text/html; charset=utf-8",
    "json": "application/json",
    "text": "text/plain; charset=utf-8",
}
# Sent with every response: never cached, never sniffed, no fetch from the page,
# and no Referer carrying serve()'s token anywhere.
_HEADERS = [
    ("Cache-Control", "no-store"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Content-Type-Options", "nosniff"),
    ("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'"),
]


def app(environ, start_response):
    """GET: a new snapshot of every greenlet, as the HTML page (default),
    ?format=json (schema v2) or ?format=text (dump_all's text)."""
    method = environ.get("REQUEST_METHOD", "GET")
    if method not in ("GET", "HEAD"):
        return _plain(start_response, "405 Method Not Allowed", "GET only\n", [("Allow", "GET, HEAD")])
    fmt = parse_qs(environ.get("QUERY_STRING", "")).get("format", ["html"])[0]
    if fmt not in _CONTENT_TYPES:
        return _plain(start_response, "400 Bad Request", "format must be html, json or text\n")
    body = _renders_here().body(fmt)
    start_response("200 OK", [("Content-Type", _CONTENT_TYPES[fmt]), ("Content-Length", str(len(body)))] + _HEADERS)
    return [b"" if method == "HEAD" else body]


def _plain(start_response, status, text, extra=()):
    status, headers, body = _plain_answer(status, text, extra)
    start_response(status, headers)
    return [body]


def _plain_answer(status, text, extra=()):
    body = text.encode()
    return status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
                    *extra] + _HEADERS, body


# ---- rendering: one at a time, shared, off the event loop ----

def _render_bytes(infos, fmt) -> bytes:
    return render(infos, True, True, fmt, stack_text).encode("utf-8", "backslashreplace")   # see dump.write_text


class _Renders:
    """One render at a time; a request for the format being rendered waits
    for it and gets the same body (ten concurrent GETs cost one render).

    lock, result: the waiting primitives of the callers (gevent's for
    greenlets of a hub, OS locks for threads); offload(fn, *args) runs the
    render where it does not hold up the caller's event loop; pause: what the
    snapshot calls between its steps to let that loop run (None: no loop)."""

    def __init__(self, lock, result, offload, pause=None):
        self._lock, self._result, self._offload, self._pause = lock(), result, offload, pause
        self._jobs = {}        # format -> result of the render in flight

    def body(self, fmt) -> bytes:
        job = self._result()
        shared = self._jobs.setdefault(fmt, job)    # atomic under the GIL: one leader per format
        if shared is not job:
            return shared.get()
        try:
            with self._lock:
                # In the caller, greenlets parked as the hub sees them; in steps
                # with the loop running between them (10,000 greenlets: ~0.1-0.2 s).
                infos = snapshot(pause=self._pause)
                job.set(self._offload(_render_bytes, infos, fmt))
        except BaseException as error:
            job.set_exception(error)
            raise
        finally:
            self._jobs.pop(fmt)
        return job.get()


class _ThreadResult:
    """A one-shot result OS threads wait for (gevent's AsyncResult, for threads)."""

    def __init__(self):
        self._done = real_thread("allocate_lock")()
        self._done.acquire()
        self._value = self._error = None

    def set(self, value):
        self._value = value
        self._done.release()

    def set_exception(self, error):
        self._error = error
        self._done.release()

    def get(self):
        with self._done:     # each waiter passes the released lock on to the next
            pass
        if self._error is not None:
            raise self._error
        return self._value


def _in_place(fn, *args):
    return fn(*args)      # an OS thread of its own already: nothing else waits on it


def _in_threadpool(fn, *args):
    """fn(*args) in a real OS thread of the hub's threadpool (started with the
    original, unpatched thread start), the calling greenlet waiting cooperatively."""
    import gevent
    return gevent.get_hub().threadpool.apply(fn, args)


def _new_thread_renders():
    return _Renders(real_thread("allocate_lock"), _ThreadResult, _in_place)


_thread_renders = _new_thread_renders()
_hub_renders = weakref.WeakKeyDictionary()     # hub -> _Renders of its greenlets


def _renders_here() -> _Renders:
    hub = _running_hub()
    if hub is None:
        return _thread_renders
    renders = _hub_renders.get(hub)
    if renders is None:
        import gevent.event
        import gevent.lock
        # A pause of 1 ms, not sleep(0): gevent runs sleep(0)'s callback before
        # the loop polls again, so timers and sockets would wait for the whole snapshot.
        renders = _hub_renders[hub] = _Renders(gevent.lock.Semaphore, gevent.event.AsyncResult, _in_threadpool,
                                               partial(gevent.sleep, 0.001))
    return renders


def _running_hub():
    """This thread's gevent hub when the caller is one of its greenlets (it can
    wait cooperatively), else None (the caller is a thread of its own)."""
    if "gevent" not in sys.modules:
        return None
    from gevent._hub_local import get_hub_if_exists    # gevent.get_hub() would create one
    hub = get_hub_if_exists()
    return hub if hub is not None and greenlet.getcurrent() is not hub else None


def _after_fork_in_child():
    """A lock held by another thread at fork() stays held in the child: start afresh."""
    global _thread_renders
    _thread_renders = _new_thread_renders()
    _hub_renders.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


# ---- serve(): a small HTTP server with bounds, deadlines and access checks ----

def serve(host: str = LOOPBACK, port: int = 0, *, token: str | bool = True, allowed_hosts=(),
          max_connections: int = MAX_CONNECTIONS, timeout: float = TIMEOUT) -> Server:
    """Serve `app` at http://host:port/ in the background; returns the Server.

    host defaults to the loopback interface: pass another address only on
    purpose (the page is a debug endpoint).  port 0 picks a free port.
    token: True (default) makes a random one; a string is used as given;
    False serves without one.  Requests must carry it (?token=, or
    `Authorization: Bearer`): `server.url` does.  allowed_hosts: names,
    besides the bound address (and "localhost" on loopback), that the Host
    and Origin headers may carry.  A program that has imported gevent is
    served by greenlets of its hub; otherwise by OS threads.
    """
    _check_serve(host, port, allowed_hosts, max_connections, timeout)
    runtime = _Gevent() if "gevent" in sys.modules else _Threads()
    if token is True:
        token = secrets.token_urlsafe(18)
    if token is not False and not (isinstance(token, str) and token):
        raise ValueError("token must be True, False or a non-empty string")
    return Server(runtime, host, port, token or None, list(allowed_hosts), max_connections, timeout)


def _check_serve(host, port, allowed_hosts, max_connections, timeout) -> None:
    """TypeError or ValueError for serve()'s arguments that cannot work (before anything is bound)."""
    if not isinstance(host, str):
        raise TypeError(f"host must be a str, not {type(host).__name__}")
    if not host:
        raise ValueError(f"host must be an address (\"{LOOPBACK}\"; \"0.0.0.0\" for every interface, on purpose), "
                         f"not {host!r}")
    for name, value, low, high in (("port", port, 0, 65535), ("max_connections", max_connections, 1, 1 << 16)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{name} must be an int from {low} to {high}, not {value!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise ValueError(f"timeout must be more than 0 and at most 3600 seconds, not {timeout!r}")
    if isinstance(allowed_hosts, (str, bytes)) or not all(isinstance(name, str) for name in allowed_hosts):
        raise TypeError(f"allowed_hosts must be a list of names (str), not {allowed_hosts!r}")
    if "gevent" in sys.modules and not is_main_thread() and not _has_hub():
        raise RuntimeError("serve() runs on the calling thread's gevent hub, and this thread has none that runs: "
                           "call it in the thread whose hub runs the program's loop (or before gevent is imported)")


def _has_hub() -> bool:
    from gevent import _hub_local
    return _hub_local.get_hub_if_exists() is not None


class _Threads:
    """OS threads and blocking sockets (a program without gevent)."""
    socket = staticmethod(socket.socket)
    sleep = staticmethod(time.sleep)

    @staticmethod
    def spawn(fn, *args):
        thread = threading.Thread(target=fn, args=args, name="btcore.web", daemon=True)
        thread.start()
        return thread


class _Gevent:
    """Greenlets of the calling thread's hub and gevent's cooperative sockets."""

    def __init__(self):
        import gevent
        import gevent.socket
        self.socket, self.sleep, self.spawn = gevent.socket.socket, gevent.sleep, gevent.spawn


_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 5\r\nConnection: close\r\n"
         b"Retry-After: 1\r\n\r\nbusy\n")
# A Host header: a name or IPv4 address, or an IPv6 address in brackets; an optional port.
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:[0-9]{1,5})?")


class Server:
    """A running serve(): `address` (host, port) as bound; `url`, the page's
    address with the token; `token` (None when off); stop() closes it."""

    def __init__(self, runtime, host, port, token, allowed_hosts, max_connections, timeout):
        self._runtime, self.token, self._pid = runtime, token, os.getpid()
        self._max_connections, self._timeout = max_connections, timeout
        self._connections = set()      # set.add/discard and len() are atomic under the GIL
        self._stopped = False
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = runtime.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(128)
        except BaseException:
            self._listener.close()
            raise
        self.address = self._listener.getsockname()[:2]
        bound = ipaddress.ip_address(self.address[0])
        self._allowed = {host.lower(), str(bound)} | {name.lower() for name in allowed_hosts}
        if bound.is_loopback:
            self._allowed.add("localhost")
        # Bound to every interface: clients name the machine by any of its
        # addresses; an address literal cannot be rebound by DNS, names still
        # must be allowed.
        self._any_address = bound.is_unspecified
        shown = f"[{bound}]" if bound.version == 6 else str(bound)
        query = f"?token={quote(token, safe='')}" if token else ""
        self.url = f"http://{shown}:{self.address[1]}/{query}"
        self._acceptor = runtime.spawn(self._accept_loop)

    def stop(self) -> None:
        """Stop accepting, close every connection, wait for the accept loop to end.
        In a forked child: close its copies only (shutdown() would end the parent's)."""
        self._stopped = True
        if os.getpid() != self._pid:
            for sock in [self._listener, *self._connections]:
                sock.close()
            return
        for sock in [self._listener, *self._connections]:
            try:
                sock.shutdown(socket.SHUT_RDWR)     # wakes a thread blocked in accept()/recv()
            except OSError:
                pass
        self._acceptor.join(self._timeout)

    # ---- connections ----

    def _accept_loop(self):
        try:
            while not self._stopped:
                try:
                    conn, _ = self._listener.accept()
                except OSError as error:
                    if self._stopped:
                        break
                    # EMFILE and the like: wait for the program to free descriptors, not a spin
                    self._runtime.sleep(0 if error.errno == errno.ECONNABORTED else 0.1)
                    continue
                self._take(conn)
                self._runtime.sleep(0)    # a flood of connections must not hold the event loop
        finally:
            self._listener.close()

    def _take(self, conn):
        if len(self._connections) >= self._max_connections:
            _refuse(conn)
            return
        self._connections.add(conn)
        try:
            self._runtime.spawn(self._handle, conn)
        except Exception:      # no thread to be had (RuntimeError, MemoryError): refuse, keep accepting
            self._connections.discard(conn)
            _refuse(conn)

    def _handle(self, conn):
        # Nothing may escape: gevent would print it to the program's stderr.
        try:
            status, headers, body = self._answer(conn)
            conn.settimeout(self._timeout)        # sendall's timeout bounds the whole response
            conn.sendall(_response(status, headers, body))
        except Exception:
            pass      # the client left, or was too slow: its connection is closed below
        finally:
            self._connections.discard(conn)
            conn.close()

    def _answer(self, conn):
        """(status, headers, body) for the request read from conn."""
        try:
            environ = _environ(_read_head(conn, time.monotonic() + self._timeout), self.address)
        except _BadRequest as bad:
            return _plain_answer(bad.status, bad.text)
        refused = self._refusal(environ)
        if refused is not None:
            return _plain_answer(*refused)
        try:
            return _call(app, environ)
        except Exception as error:
            return _plain_answer("500 Internal Server Error", f"{type(error).__name__}\n")

    # ---- access ----

    def _refusal(self, environ):
        """None for a request to answer, else (status, why)."""
        host = _HOST.fullmatch(environ.get("HTTP_HOST", ""))
        if host is None:
            return "400 Bad Request", "a Host header (name or address, optional port) is required\n"
        if not self._allowed_host(host.group(1)):
            return "403 Forbidden", "Host not allowed (DNS rebinding?): serve(allowed_hosts=...) adds names\n"
        origin = environ.get("HTTP_ORIGIN")
        if origin is not None and not self._allowed_host(_origin_host(origin)):
            return "403 Forbidden", "Origin not allowed\n"
        if self.token is not None and not hmac.compare_digest(_token_of(environ).encode(), self.token.encode()):
            return "403 Forbidden", "token missing or wrong: open the URL serve() gave (server.url)\n"
        return None

    def _allowed_host(self, name: str) -> bool:
        name = name.lower().strip("[]")
        if name in self._allowed:
            return True
        if not self._any_address:
            return False
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True


def _origin_host(origin: str) -> str:
    try:
        return urlsplit(origin).hostname or ""
    except ValueError:     # a malformed bracketed address
        return ""


def _token_of(environ) -> str:
    given = parse_qs(environ.get("QUERY_STRING", "")).get("token")
    if given:
        return given[0]
    scheme, _, value = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def _refuse(conn):
    """Answer 503 if the socket takes it at once, and close: never wait on a refused client."""
    try:
        conn.setblocking(False)
        conn.send(_BUSY)
    except OSError:
        pass
    finally:
        conn.close()


# ---- HTTP/1.1, the small part a debug page needs: GET, no body, no keep-alive ----

class _BadRequest(Exception):
    def __init__(self, status, text):
        super().__init__(status)
        self.status, self.text = status, text


def _read_head(conn, deadline) -> bytes:
    """The request line and headers, without the blank line that ends them.

    At most MAX_HEAD bytes (a 431 past that) and until deadline, whatever
    the client's pace: a client sending a byte a second (slowloris) is cut
    off like an idle one (TimeoutError)."""
    head = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request head not received in time")
        conn.settimeout(left)
        chunk = conn.recv(4096)
        if not chunk:
            raise ConnectionError("client closed before the end of its request head")
        start = max(0, len(head) - 3)
        head += chunk
        end = head.find(b"\r\n\r\n", start)
        if end > MAX_HEAD or (end < 0 and len(head) > MAX_HEAD):
            raise _BadRequest("431 Request Header Fields Too Large", f"request head over {MAX_HEAD} bytes\n")
        if end >= 0:
            return bytes(head[:end])


def _environ(head: bytes, address) -> dict:
    """The WSGI environ of a request head (no body is read: GET and HEAD only)."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest("400 Bad Request", "malformed request line\n")
    method, target, version = parts
    path, _, query = target.partition("?")
    environ = {"REQUEST_METHOD": method, "SCRIPT_NAME": "", "PATH_INFO": unquote(path, "latin-1"),
               "QUERY_STRING": query, "SERVER_NAME": str(address[0]), "SERVER_PORT": str(address[1]),
               "SERVER_PROTOCOL": version, "wsgi.version": (1, 0), "wsgi.url_scheme": "http",
               "wsgi.input": io.BytesIO(), "wsgi.errors": io.StringIO(), "wsgi.multithread": True,
               "wsgi.multiprocess": False, "wsgi.run_once": False}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        key = "HTTP_" + name.upper().replace("-", "_")
        # no space before the colon, no folded lines, no header given twice (which Host would count?)
        if not colon or not name or name != name.strip() or key in environ:
            raise _BadRequest("400 Bad Request", "malformed or repeated header\n")
        environ[key] = value.strip()
    return environ


def _call(application, environ):
    """(status, headers, body) of a WSGI application's answer."""
    answer = []

    def start_response(status, headers, exc_info=None):
        answer[:] = [status, headers]

    body = b"".join(application(environ, start_response))
    return answer[0], answer[1], body


def _response(status, headers, body) -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{name}: {value}" for name, value in headers), "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body
