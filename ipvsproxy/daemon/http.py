"""The daemon's HTTP servers: /healthz and /livez (--healthz-bind-address), /metrics,
/proxyMode and a plain /healthz (--metrics-bind-address), and the one server the health-check
node ports (daemon/hcnp.py) share, each a thread of its own.

Owns starting servers, binding their listeners and their routes; how a server thread serves
(and what a client may cost it) is daemon/http_loop.py's, how a request is parsed and an
answer written daemon/http_wire.py's, what is answered comes from daemon/health.py and
daemon/metrics.py. /healthz listens on every address of every node, so anyone who can reach a
node can try to exhaust it: see http_loop.py for the bounds, and daemon/fds.py for the one
budget of connections all the process's servers share. Requests are GET and HEAD without
bodies. Must not: start a thread per client or per listener, or read a request body.
"""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from ipvsproxy.daemon.fds import Budget
from ipvsproxy.daemon.http_loop import LIMITS, Limits, Listener, Loop
from ipvsproxy.daemon.http_wire import NOSNIFF_TEXT, Route, json_answer
from ipvsproxy.daemon.http_wire import Request as Request  # what parse_request gives
from ipvsproxy.daemon.http_wire import parse_request as parse_request
from ipvsproxy.settings.config import parse_bind_address

__all__ = ["LIMITS", "Limits", "Listener", "Request", "Served", "parse_request", "serve",
           "server", "start_healthz", "start_metrics"]

WILDCARDS = ("", "0.0.0.0", "::")
HEALTHZ_PORT = 10256
METRICS_PORT = 10249


class Served:
    """A running server: one thread answering on its listeners (serve()'s one, host and port;
    health-check node ports add and drop theirs as services come and go)."""

    def __init__(self, server: Loop, name: str) -> None:
        self.server = server
        self.host, self.port = "", 0
        self._thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
        self._thread.start()

    def listen(self, host: str, port: int, routes: dict[str, Route],
               fallback: Route | None = None) -> Listener:
        """Listen on host:port too (a wildcard host on both families when the host has IPv6):
        bound here, answered by the server's thread. OSError when it cannot be bound."""
        door = Listener(_bind(host, port), routes, fallback, self.server)
        self.server.call(lambda: self.server._add(door))
        return door

    def unlisten(self, doors: list[Listener]) -> None:
        """Close these listeners and their connections; their ports are free when this
        returns."""
        done = threading.Event()

        def drop() -> None:
            for door in doors:
                self.server._drop(door)
            done.set()

        self.server.call(drop)
        if not done.wait(5):  # the loop is gone (it runs what is left as it ends)
            for door in doors:
                door.sock.close()

    def stop(self) -> None:
        """Close the listeners and every connection; the ports are free when this returns."""
        self.server.shutdown()
        self._thread.join(5)


def _listen(family: socket.AddressFamily, addr: str, port: int, dual: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # as HTTPServer did: rebinding right after a restart must not wait out TIME_WAIT
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if dual:
            # Go listens on both families for a wildcard address ("0.0.0.0", "::" or ""), and
            # so does kube-proxy (service_health.go: "go treats them all the same").
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((addr, port))
        # a burst must queue, not have its SYNs dropped and retried a second later (the old
        # backlog of 5); Go asks for net.core.somaxconn too, which caps this
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (a wildcard host on both families when the host has
    IPv6). OSError when the address cannot be bound."""
    candidates: list[tuple[socket.AddressFamily, str, bool]]
    if host in WILDCARDS and socket.has_ipv6:
        candidates = [(socket.AF_INET6, "::", True), (socket.AF_INET, "0.0.0.0", False)]
    elif ":" in host:
        candidates = [(socket.AF_INET6, host, False)]
    else:
        candidates = [(socket.AF_INET, host or "0.0.0.0", False)]
    for i, (family, addr, dual) in enumerate(candidates):
        try:
            return _listen(family, addr, port, dual)
        except OSError as exc:
            # no IPv6 on this host (EAFNOSUPPORT, EADDRNOTAVAIL): IPv4 only, as Go would do
            no_ipv6 = exc.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL)
            if i + 1 == len(candidates) or not no_ipv6:
                raise OSError(exc.errno, f"cannot listen on {_join(host, port)}: "
                                         f"{exc.strerror or exc}") from None
    raise AssertionError("unreachable")


def server(name: str, limits: Limits = LIMITS, budget: Budget | None = None) -> Served:
    """A server with no listener yet (Served.listen adds them), its connections counted in
    budget (the process's by default)."""
    return Served(Loop(limits, budget), name)


def serve(host: str, port: int, routes: dict[str, Route], name: str,
          fallback: Route | None = None, limits: Limits = LIMITS,
          budget: Budget | None = None) -> Served:
    """Listen on host:port (a wildcard host on both families when the host has IPv6) and answer
    routes by path, fallback (or 404) otherwise. OSError when the address cannot be bound."""
    served = server(name, limits, budget)
    try:
        door = served.listen(host, port, routes, fallback)
    except OSError:
        served.stop()
        raise
    served.host, served.port = door.host, door.port
    return served


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bind_address(addr: str, default_port: int) -> tuple[str, int]:
    """parse_bind_address, failing as a listener does (OSError): the caller reports both."""
    try:
        return parse_bind_address(addr, default_port)
    except ValueError as exc:
        raise OSError(errno.EINVAL, str(exc)) from None


def start_healthz(addr: str, health: Any, metrics: Any, limits: Limits = LIMITS,
                  budget: Budget | None = None) -> Served:
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
    return serve(host, port, routes, "healthz", limits=limits, budget=budget)


def start_metrics(addr: str, metrics: Any, budget: Budget | None = None) -> Served:
    """--metrics-bind-address: /metrics, /proxyMode ("ipvs") and component-base's /healthz
    ("ok"), as kube-proxy's serveMetrics (cmd/kube-proxy/app/server.go)."""
    host, port = _bind_address(addr, METRICS_PORT)
    routes: dict[str, Route] = {
        "/metrics": lambda: (200, {"Content-Type": CONTENT_TYPE_PLAIN_0_0_4}, metrics.render()),
        "/proxyMode": lambda: (200, NOSNIFF_TEXT, b"ipvs"),
        "/healthz": lambda: (200, NOSNIFF_TEXT, b"ok"),
    }
    return serve(host, port, routes, "metrics", budget=budget)
