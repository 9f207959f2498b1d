"""``harness view``: the ledger's pages served read-only on 127.0.0.1 by the standard library's HTTP server.

Routes (GET and HEAD; nothing else is answered but with an error)::

    /                 the run list (query: the filter form's fields, ``sort``, ``desc``, ``page``)
    /run/<run_id>     one run
    /pair?a=<id>&b=<id>   two runs side by side
    /static/<name>    the viewer's own CSS, scripts and icon (a fixed list; no path reaches the disk)
    /favicon.ico      the icon (``static/favicon.svg``), for browsers that ask before reading the page's link

The ledger is opened read-only once and shared by the request threads (:class:`harness.ledger.Ledger` is
thread-safe). A request whose ``Host`` is not 127.0.0.1 or localhost with the server's port is refused (a web page
whose name was re-pointed at 127.0.0.1, "DNS rebinding", cannot read the ledger). Every answer carries a Content-Security-Policy that allows scripts and styles only from the viewer
itself, a second wall behind the templates' escaping.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from harness.errors import HarnessError, LedgerError, UsageError
from harness.ledger import Ledger
from harness.viewer.pages import CONTENT_POLICY, Links, list_page, pair_page, render, run_page

__all__ = ["HOST", "STATIC_FILES", "ViewerServer", "open_server"]

HOST = "127.0.0.1"
"""The only address the viewer listens on."""
STATIC_FILES = {
    "viewer.css": "text/css",
    "list.js": "text/javascript",
    "pair.js": "text/javascript",
    "favicon.svg": "image/svg+xml",
}
"""The files under ``harness/viewer/static`` that are served, with their media types."""
_LOG = logging.getLogger("harness.viewer")
IDLE_TIMEOUT = 30.0
"""Seconds a viewer connection may stay silent (or take to send one request) before it is closed."""


class ViewerServer(ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 answering with the pages of one ledger (opened read-only; closed by
    :meth:`server_close`). ``port`` 0 takes a free port; :attr:`url` says which. A connection that sends nothing, or
    trickles a request, for ``idle_timeout`` seconds is closed, so it cannot hold a thread for ever."""

    daemon_threads = True

    def __init__(self, ledger: Ledger, port: int = 0, *, idle_timeout: float = IDLE_TIMEOUT):
        self.ledger = ledger
        # StreamRequestHandler.setup sets each connection's socket timeout from the handler class's ``timeout``
        super().__init__((HOST, port), type("_TimedHandler", (_Handler,), {"timeout": idle_timeout}))

    @property
    def url(self) -> str:
        """The address of the run list, e.g. ``http://127.0.0.1:41234/``."""
        return f"http://{HOST}:{self.server_address[1]}/"

    def server_close(self) -> None:
        """Stop listening and close the ledger."""
        super().server_close()
        self.ledger.close()


def open_server(ledger_path: str | Path, port: int = 0, *, idle_timeout: float = IDLE_TIMEOUT) -> ViewerServer:
    """Open the ledger read-only and listen on 127.0.0.1 (``port`` 0: a free one); call ``serve_forever()`` next.
    ``idle_timeout``: seconds before a silent or trickling connection is closed.

    Raises:
        LedgerError: no ledger at the path, or not a readable ledger.
        UsageError: the port is taken or cannot be used.
    """
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port} is not a port number (0 to 65535; 0 picks a free one).")
    ledger = Ledger(ledger_path, readonly=True)
    try:
        return ViewerServer(ledger, port, idle_timeout=idle_timeout)
    except OSError as exc:
        ledger.close()
        why = "it is in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise UsageError(f"cannot listen on {HOST}:{port} ({why}); pass another --port, or none for a free one.") from None


class _Handler(BaseHTTPRequestHandler):
    server: ViewerServer
    server_version = "harness-view"

    def log_message(self, format: str, *args: object) -> None:
        _LOG.debug(format, *args)

    def handle_one_request(self) -> None:
        """Read one request within ``timeout`` seconds in all (a socket timeout alone is per read, so a client
        trickling a byte now and then would hold the thread for ever); the answer is not timed."""
        self._was_cut = False
        self._cutter = threading.Timer(self.timeout or IDLE_TIMEOUT, self._cut)
        self._cutter.daemon = True
        self._cutter.start()
        try:
            super().handle_one_request()
        except OSError:
            if not self._was_cut:
                raise
            self.close_connection = True
        finally:
            self._cutter.cancel()

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # reads the headers
        self._cutter.cancel()
        if self._was_cut:
            self.close_connection = True
            return False
        return parsed

    def _cut(self) -> None:
        self._was_cut = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _page(self) -> tuple[HTTPStatus, str, bytes]:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        ledger, links = self.server.ledger, Links(served=True)
        if parts.path == "/":
            return HTTPStatus.OK, "text/html; charset=utf-8", list_page(ledger, query, links).encode()
        if parts.path.startswith("/run/"):
            run_id = unquote(parts.path.removeprefix("/run/"))
            return HTTPStatus.OK, "text/html; charset=utf-8", run_page(ledger, run_id, links).encode()
        if parts.path == "/pair":
            if not query.get("a") or not query.get("b"):
                raise UsageError("the side-by-side needs two runs: /pair?a=RUN_ID&b=RUN_ID.")
            return HTTPStatus.OK, "text/html; charset=utf-8", pair_page(ledger, query["a"], query["b"], links).encode()
        name = "favicon.svg" if parts.path == "/favicon.ico" else parts.path.removeprefix("/static/")
        if (parts.path.startswith("/static/") or parts.path == "/favicon.ico") and name in STATIC_FILES:
            data = (resources.files("harness.viewer") / "static" / name).read_bytes()
            return HTTPStatus.OK, f"{STATIC_FILES[name]}; charset=utf-8", data
        return HTTPStatus.NOT_FOUND, "text/html; charset=utf-8", _error_page("No such page.")

    def _answer(self, *, head: bool) -> None:
        port = self.server.server_address[1]
        try:
            if self.headers.get("Host", "") not in (f"{HOST}:{port}", f"localhost:{port}"):
                status, kind, body = HTTPStatus.MISDIRECTED_REQUEST, "text/html; charset=utf-8", _error_page(
                    f"this viewer answers only requests addressed to {HOST}:{port}.")  # fmt: skip
            else:
                status, kind, body = self._page()
        except UsageError as exc:
            status, kind, body = HTTPStatus.NOT_FOUND, "text/html; charset=utf-8", _error_page(str(exc))
        except LedgerError as exc:
            status, kind, body = HTTPStatus.INTERNAL_SERVER_ERROR, "text/html; charset=utf-8", _error_page(str(exc))
        except HarnessError as exc:
            status, kind, body = HTTPStatus.BAD_REQUEST, "text/html; charset=utf-8", _error_page(str(exc))
        self.send_response(status)
        for header, value in (("Content-Type", kind), ("Content-Length", str(len(body))), ("Content-Security-Policy", CONTENT_POLICY),
                              ("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer"),
                              ("Cache-Control", "no-store")):  # fmt: skip
            self.send_header(header, value)
        self.end_headers()
        if not head:
            self.wfile.write(body)


def _error_page(message: str) -> bytes:
    return render("error.html", links=Links(served=True), message=message).encode()
