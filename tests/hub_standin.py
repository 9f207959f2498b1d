"""A stand-in for the Hugging Face hub on 127.0.0.1, for the tests of ``harness.backends.hub_fetch``.

It answers the two requests ``huggingface_hub`` makes to download a file (``huggingface_hub`` 2.4,
``file_download.py``: ``get_hf_file_metadata`` then ``http_get``):

* ``HEAD /{owner}/{repo}/resolve/{revision}/{path}``: 200 with the headers the hub sends for a Git LFS file,
  ``X-Repo-Commit`` (required, or ``huggingface_hub`` takes the server for something else), ``X-Linked-Etag``
  (the file's SHA-256, quoted, as the hub's LFS etag is), ``X-Linked-Size``, ``ETag`` and ``Content-Length``.
  The real hub answers a LFS file's HEAD with a 302 to its file CDN carrying these headers; the client
  downloads from the ``Location`` it is sent to, which here is the same URL.
* ``GET`` of the same path: the bytes, ``206`` with ``Content-Range`` for a ``Range: bytes=N-`` request.

A file unknown to the stand-in is a 404 with ``X-Error-Code: EntryNotFound``. ``cut_after`` makes GET
responses close the connection after that many body bytes (``None`` disarms it), as a broken network would.
Every request is recorded with its ``Range`` header and the body bytes sent.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

__all__ = ["HubStandIn", "Served"]

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_CHUNK = 1 << 20


@dataclass
class Served:
    """One request the stand-in answered: method, URL path, ``Range`` header, body bytes sent."""

    method: str
    path: str
    range: str | None
    sent: int = 0


@dataclass
class HubStandIn:
    """Files by URL path (``/{owner}/{repo}/resolve/{revision}/{path}``) and what was served.

    Attributes:
        files: bytes served per resolve path.
        etags: the SHA-256 advertised per resolve path when it is not the bytes' own (a corrupt CDN).
        sizes: the size advertised (``X-Linked-Size``) per resolve path when it is not the bytes' own.
        cut_after: close GET responses after this many body bytes (a list: one entry per coming GET, then whole).
        served: every request answered, in order.
        custom: per resolve path, a function ``(handler, record)`` that answers the request itself (a lying,
            slow or failing hub); it writes the status line, headers and body with the handler's methods.
    """

    files: dict[str, bytes] = field(default_factory=dict)
    etags: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    cut_after: list[int] = field(default_factory=list)
    served: list[Served] = field(default_factory=list)
    custom: dict[str, Callable[[BaseHTTPRequestHandler, Served], None]] = field(default_factory=dict)
    _server: ThreadingHTTPServer | None = None

    def add(self, repo: str, path: str, data: bytes, *, revision: str = "main") -> str:
        """Serve ``data`` as ``path`` in ``repo`` at ``revision``; return its resolve path."""
        key = f"/{repo}/resolve/{revision}/{path}"
        self.files[key] = data
        return key

    def start(self) -> str:
        """Start serving on a free port of 127.0.0.1; return the endpoint URL (for ``HF_ENDPOINT``)."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self.endpoint

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` (also once stopped: the port then refuses connections)."""
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def gets(self) -> list[Served]:
        """The GET requests answered so far."""
        return [s for s in self.served if s.method == "GET"]


def _handler_for(hub: HubStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_HEAD(self):
            self._answer(body=False)

        def do_GET(self):
            self._answer(body=True)

        def _answer(self, *, body):
            path = unquote(self.path.split("?")[0])
            record = Served(self.command, path, self.headers.get("Range"))
            hub.served.append(record)
            if path in hub.custom:
                hub.custom[path](self, record)
                return
            data = hub.files.get(path)
            if data is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("X-Error-Message", "Entry not found")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = _range_start(record.range) if body else 0
            sha = hub.etags.get(path) or hashlib.sha256(data).hexdigest()
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", str(hub.sizes.get(path, len(data))))
            self.send_header("ETag", f'"{sha}"')
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if body:
                self._send_body(data, start, record)

        def _send_body(self, data, start, record):
            limit = hub.cut_after.pop(0) if hub.cut_after else None
            end = len(data) if limit is None else min(len(data), start + limit)
            for offset in range(start, end, _CHUNK):
                chunk = data[offset : min(end, offset + _CHUNK)]
                self.wfile.write(chunk)
                record.sent += len(chunk)
            self.wfile.flush()
            if limit is not None:  # the network breaks: a clean close before the promised Content-Length
                self.close_connection = True

    return Handler


def _range_start(header: str | None) -> int:
    if not header or not header.startswith("bytes=") or not header.endswith("-"):
        return 0
    return int(header[len("bytes=") : -1])


def serving(monkeypatch, cache: str, repo: str, file: str, data: bytes) -> Iterator[HubStandIn]:
    """Body of a pytest fixture: a started stand-in serving ``data`` as ``repo``/``file``, ``HF_ENDPOINT`` pointed at it,
    ``HARNESS_CACHE`` set to ``cache``, no hub token and not offline; stopped after the test."""
    standin = HubStandIn()
    standin.add(repo, file, data)
    monkeypatch.setenv("HF_ENDPOINT", standin.start())
    monkeypatch.setenv("HARNESS_CACHE", cache)
    for name in ("HF_HUB_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    yield standin
    standin.stop()
