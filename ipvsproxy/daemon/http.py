"""The daemon's HTTP servers: /healthz and /livez (--healthz-bind-address), /metrics,
/proxyMode and a plain /healthz (--metrics-bind-address), and the small server machinery the
health-check node ports (daemon/hcnp.py) share.

Owns listening and answering only; what is answered comes from daemon/health.py and
daemon/metrics.py. Servers are ThreadingHTTPServers in daemon threads, silent per request.
"""

from __future__ import annotations

import errno
import json
import socket
import socketserver
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from ipvsproxy.config import parse_bind_address

log = structlog.get_logger("ipvsproxy.http")

# (status, headers, body) for a path; None: 404
Route = Callable[[], tuple[int, dict[str, str], bytes]]
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
NOSNIFF_TEXT = {"Content-Type": TEXT, "X-Content-Type-Options": "nosniff"}
WILDCARDS = ("", "0.0.0.0", "::")
HEALTHZ_PORT = 10256
METRICS_PORT = 10249


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    routes: dict[str, Route]
    fallback: Route | None

    def server_bind(self) -> None:
        # HTTPServer.server_bind would resolve the host's FQDN: a DNS lookup per listener
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), \
            int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client hanging up mid-answer is not worth a traceback on stderr
        log.debug("http request failed", client=str(client_address), exc_info=True)


class _DualStackServer(_Server):
    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        # Go listens on both families for a wildcard address ("0.0.0.0", "::" or ""), and so
        # does kube-proxy (service_health.go: "go treats them all the same").
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class _V6Server(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 10  # a stuck client must not hold a thread forever
    server_version = "ipvsproxy"
    sys_version = ""

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        route = self.server.routes.get(path, self.server.fallback)
        if route is None:  # Go's ServeMux NotFound
            status, headers, data = 404, dict(NOSNIFF_TEXT), b"404 page not found\n"
        else:
            status, headers, data = route()
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: probes arrive every few seconds


class Served:
    """A running server: the port it is bound to, and stop()."""

    def __init__(self, server: _Server, name: str) -> None:
        self.server = server
        self.host = str(server.server_address[0])
        self.port = int(server.server_address[1])
        # stop() waits for the serving loop to notice, up to poll_interval
        self._thread = threading.Thread(target=server.serve_forever, args=(0.2,), name=name,
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


def serve(host: str, port: int, routes: dict[str, Route], name: str,
          fallback: Route | None = None) -> Served:
    """Listen on host:port (a wildcard host on both families when the host has IPv6) and answer
    routes by path, fallback (or 404) otherwise. OSError when the address cannot be bound."""
    candidates: list[tuple[type[_Server], str]]
    if host in WILDCARDS and socket.has_ipv6:
        candidates = [(_DualStackServer, "::"), (_Server, "0.0.0.0")]
    elif ":" in host:
        candidates = [(_V6Server, host)]
    else:
        candidates = [(_Server, host or "0.0.0.0")]
    for i, (cls, addr) in enumerate(candidates):
        try:
            server = cls((addr, port), _Handler)
            break
        except OSError as exc:
            # no IPv6 on this host (EAFNOSUPPORT, EADDRNOTAVAIL): IPv4 only, as Go would do
            no_ipv6 = exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL)
            if i + 1 == len(candidates) or not no_ipv6:
                raise OSError(exc.errno, f"cannot listen on {_join(host, port)}: "
                                         f"{exc.strerror or exc}") from None
    server.routes = routes
    server.fallback = fallback
    return Served(server, name)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bind_address(addr: str, default_port: int) -> tuple[str, int]:
    """parse_bind_address, failing as a listener does (OSError): the caller reports both."""
    try:
        return parse_bind_address(addr, default_port)
    except ValueError as exc:
        raise OSError(errno.EINVAL, str(exc)) from None


def json_answer(status: int, doc: Any) -> tuple[int, dict[str, str], bytes]:
    """A JSON answer as kube-proxy's health handlers write it (compact, nosniff)."""
    return status, {"Content-Type": JSON, "X-Content-Type-Options": "nosniff"}, \
        json.dumps(doc, separators=(",", ":")).encode()


def start_healthz(addr: str, health: Any, metrics: Any) -> Served:
    """--healthz-bind-address: /healthz and /livez (proxy_health.go healthzHandler and
    livezHandler), each answer counted in kubeproxy_proxy_{healthz,livez}_total by code."""
    host, port = _bind_address(addr, HEALTHZ_PORT)

    def probe(check: Callable[[], tuple[int, dict[str, Any]]], counter: str) -> Route:
        def route() -> tuple[int, dict[str, str], bytes]:
            status, doc = check()
            if metrics is not None:
                getattr(metrics, counter).labels(code=str(status)).inc()
            return json_answer(status, doc)
        return route

    routes = {"/healthz": probe(health.healthz, "healthz_total"),
              "/livez": probe(health.livez, "livez_total")}
    return serve(host, port, routes, "healthz")


def start_metrics(addr: str, metrics: Any) -> Served:
    """--metrics-bind-address: /metrics, /proxyMode ("ipvs") and component-base's /healthz
    ("ok"), as kube-proxy's serveMetrics (cmd/kube-proxy/app/server.go)."""
    host, port = _bind_address(addr, METRICS_PORT)
    routes: dict[str, Route] = {
        "/metrics": lambda: (200, {"Content-Type": CONTENT_TYPE_PLAIN_0_0_4}, metrics.render()),
        "/proxyMode": lambda: (200, NOSNIFF_TEXT, b"ipvs"),
        "/healthz": lambda: (200, NOSNIFF_TEXT, b"ok"),
    }
    return serve(host, port, routes, "metrics")
