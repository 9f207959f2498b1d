"""The HTTP clients of the HTTP backends: one ``httpx.Client`` per thread, sharing one TLS context.

With ``--jobs N`` a backend serves N run threads at once. One shared client puts all of them through one httpcore
connection pool, whose bookkeeping takes a lock and scans every pooled connection (a socket poll for each idle one,
and a quadratic count of the idle ones) on every request and response: at 256 runs in flight that cost more than the
rest of a turn. A client per thread keeps its one connection alive between that thread's requests and shares nothing
but the TLS context (loading the certificate store is the costly part of making a client).

Each thread also has a transport of its own (:meth:`ThreadClients.direct`), which the backends' chat requests go to
directly when no proxy is set in the environment: the client's sending layers (authentication, redirects, cookies,
event hooks), of which these requests use none, cost 0.13-0.27 ms of CPU a request, a tenth or more of a turn against a
server that answers at once (``benchmarks/concurrency.py --baseline``). With a proxy set, every request goes through the
client, which routes it as the environment says. Either way, the connections' every socket wait ends by the deadline
of the request in flight (:func:`harness.backends.deadline.bind`).
"""

from __future__ import annotations

import http.cookiejar
import os
import ssl
import threading
import urllib.request

import httpx

from harness.backends.deadline import bind
from harness.backends.server_words import environment_proxy
from harness.errors import UsageError

__all__ = ["ThreadClients"]


def _NO_COOKIES() -> http.cookiejar.CookieJar:  # noqa: N802 - a factory named as the constant it stands for
    """A cookie jar whose policy keeps no cookie (red team: a chat request sent directly, :meth:`ThreadClients.direct`,
    kept none while one sent through the client kept a load balancer's, so a proxy setting changed the requests)."""
    return http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


class ThreadClients:
    """Lazily made ``httpx.Client`` objects, one per calling thread; thread-safe.

    Args:
        timeout: the clients' default timeout (each request of the backends passes its own deadline too).

    Example::

        clients = ThreadClients(httpx.Timeout(60.0))
        response = clients.get().get("http://127.0.0.1:8080/v1/models")
        clients.close()
    """

    def __init__(self, timeout: httpx.Timeout) -> None:
        self._timeout = timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._tls: ssl.SSLContext | None = None
        self._clients: list[httpx.Client] = []
        self._transports: list[httpx.HTTPTransport] = []
        self._proxied = bool({"http", "https", "all"} & set(urllib.request.getproxies()))  # as httpx reads them

    def get(self) -> httpx.Client:
        """This thread's client, made on its first call (with the shared TLS context)."""
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            with self._lock:
                if self._tls is None:
                    self._tls = httpx.create_ssl_context()  # honours SSL_CERT_FILE / SSL_CERT_DIR like httpx's default
                try:  # a cookie policy that keeps none: a request is what its run sent, whichever way it goes
                    client = httpx.Client(timeout=self._timeout, verify=self._tls, cookies=_NO_COOKIES())
                except (ImportError, ValueError, httpx.InvalidURL) as exc:  # a proxy setting httpx cannot use
                    raise UsageError(f"the proxy set in the environment cannot be used ({exc}); correct or unset "
                                     "HTTP_PROXY, HTTPS_PROXY, ALL_PROXY and NO_PROXY.") from exc  # fmt: skip
                bind(client)  # every socket wait of a request ends by its deadline (harness.backends.deadline)
                self._clients.append(client)
            self._local.client = client
        return client

    def direct(self) -> httpx.HTTPTransport | None:
        """This thread's transport, made on its first call as ``httpx.Client`` makes its own (given a transport, a
        client would ignore the environment's proxies), for a request :meth:`get`'s client built
        (``client.build_request``) to go to without the client's sending layers; None when a proxy is set in the
        environment (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``): then the client routes every request."""
        if self._proxied:
            return None
        transport: httpx.HTTPTransport | None = getattr(self._local, "transport", None)
        if transport is None:
            self.get()  # the TLS context
            assert self._tls is not None
            with self._lock:
                transport = httpx.HTTPTransport(verify=self._tls)
                bind(transport)
                self._transports.append(transport)
            self._local.transport = transport
        return transport

    def proxy_for(self, url: httpx.URL) -> tuple[str, str] | None:
        """``(variable, proxy URL without user name or password)`` of the environment's proxy a request for ``url`` goes
        through (:func:`~harness.backends.server_words.environment_proxy`), or ``None``: no proxy was set when these
        clients were made, or ``NO_PROXY`` names the host. For the sentence of a request that could not connect."""
        if not self._proxied:
            return None
        return environment_proxy(url, urllib.request.getproxies(), os.environ)

    def close(self) -> None:
        """Close every client and transport made so far (their connections); a thread calling :meth:`get` or
        :meth:`direct` afterwards gets a new one."""
        with self._lock:
            clients, self._clients = self._clients, []
            transports, self._transports = self._transports, []
            self._local = threading.local()
        for client in clients:
            client.close()
        for transport in transports:
            transport.close()
