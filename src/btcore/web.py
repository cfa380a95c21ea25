"""The live HTML view over HTTP: `app`, a WSGI application, and serve().

A debug endpoint, like Go's net/http/pprof: it shows every greenlet's stack,
source file paths and greenlet names to whoever can reach it.  Mount it
behind your application's own authentication, or serve it on the loopback
interface only (serve()'s default).
"""
from __future__ import annotations

import sys
import threading
from urllib.parse import parse_qs

from .dump import _render, _stack_text
from .introspect import snapshot

LOOPBACK = "127.0.0.1"
_CONTENT_TYPES = {
    "html": "text/html; charset=utf-8",
    "json": "application/json",
    "text": "text/plain; charset=utf-8",
}
# Sent with every response: never cached, never sniffed, no fetch from the page.
_HEADERS = [
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'"),
]


def app(environ, start_response):
    """GET: a new snapshot of every greenlet, as the HTML page (default),
    ?format=json (schema v1) or ?format=text (dump_all's text)."""
    method = environ.get("REQUEST_METHOD", "GET")
    if method not in ("GET", "HEAD"):
        return _plain(start_response, "405 Method Not Allowed", "GET only\n", [("Allow", "GET, HEAD")])
    fmt = parse_qs(environ.get("QUERY_STRING", "")).get("format", ["html"])[0]
    if fmt not in _CONTENT_TYPES:
        return _plain(start_response, "400 Bad Request", "format must be html, json or text\n")
    body = _render(snapshot(), True, True, fmt, _stack_text).encode("utf-8")
    start_response("200 OK", [("Content-Type", _CONTENT_TYPES[fmt]), ("Content-Length", str(len(body)))] + _HEADERS)
    return [b"" if method == "HEAD" else body]


def _plain(start_response, status, text, extra=()):
    body = text.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(body))), *extra] + _HEADERS)
    return [body]


def serve(host: str = LOOPBACK, port: int = 0):
    """Serve `app` at http://host:port/ in the background; returns the server.

    host defaults to the loopback interface: pass another address only on
    purpose (the page is a debug endpoint).  port 0 picks a free port; the
    server's `address` is (host, port) as bound.  A program that has
    imported gevent gets gevent's pywsgi server, run by its hub (it serves
    while the program's greenlets yield, as any gevent server does);
    otherwise wsgiref's server runs in a daemon thread.  Call
    `server.stop()` to close it.
    """
    if "gevent" in sys.modules:
        return _serve_gevent(host, port)
    return _serve_thread(host, port)


def _serve_gevent(host, port):
    from gevent.pywsgi import WSGIServer
    server = WSGIServer((host, port), app, log=None)
    server.start()
    return server


def _serve_thread(host, port):
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, *args):   # a debug endpoint must not write to the program's stderr
            pass

    server = make_server(host, port, app, handler_class=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="btcore.web", daemon=True)
    thread.start()

    def stop():
        server.shutdown()
        server.server_close()
        thread.join()

    server.stop, server.address = stop, server.server_address
    return server
