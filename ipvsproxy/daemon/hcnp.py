"""Health-check node ports: for each LoadBalancer Service with externalTrafficPolicy Local, an
HTTP server on its spec.healthCheckNodePort telling the cloud load balancer whether this node
has local endpoints (200) or not (503), so traffic only goes to nodes that can serve it.

Owns those listeners (opened, closed and updated at each sync); which services need one and their
local endpoint counts come from `ipvsproxy run`. A port of kube-proxy's ServiceHealthServer
(pkg/proxy/healthcheck/service_health.go), answer for answer.

Any tenant allowed a LoadBalancer Service opens one on every node, so they cost what the
tenants cannot make unbounded (issue 32, item 8): all of them are one server (one thread, one
selector: a listening socket each, no thread or wakeup pipe per port), their connections count
in the process's one Budget, and the listening sockets are capped (daemon/fds.py: a quarter of
the descriptor limit; the API server allocates these ports from the NodePort range, 2,768 by
default). Beyond the cap, the services not yet listening get no listener (their load balancer
sees this node refuse, as when kube-proxy cannot listen), named in one warning each time that
set changes, and are opened once there is room.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from ipvsproxy.daemon import fds, http

log = structlog.get_logger("ipvsproxy.hcnp")
ServiceId = tuple[str, str]  # (namespace, name)


class ProxyHealth(Protocol):
    def is_healthy(self) -> bool: ...


@dataclass
class _Instance:
    port: int
    listeners: list[http.Listener] = field(default_factory=list)
    endpoints: int = 0


class HealthCheckPorts:
    """The listeners, one per service (per address when addresses are given; None listens on
    every address of both families)."""

    def __init__(self, health: ProxyHealth, addresses: list[str] | None,
                 max_listeners: int | None = None, budget: fds.Budget | None = None) -> None:
        self.health = health
        self.addresses = addresses
        # listening sockets at most (default: the share of the descriptor limit now)
        self.max_listeners = max_listeners or fds.shares().listeners
        self._budget = budget
        self._server: http.Served | None = None  # started with the first port
        self._lock = threading.Lock()
        self._services: dict[ServiceId, _Instance] = {}
        self._failed: dict[ServiceId, tuple[int, str]] = {}  # logged once until it changes
        self._left_out: set[ServiceId] = set()  # no room for a listener; logged when it changes

    def sync(self, ports: dict[ServiceId, tuple[int, int]]) -> None:
        """Make these the open health-check ports: (namespace, name) -> (healthCheckNodePort,
        local endpoints). Upstream's SyncServices then SyncEndpoints: a service gone or on a new
        port is closed first, new ones opened; one that cannot be opened is logged and retried
        at the next sync while the others keep working."""
        with self._lock:
            gone = [sid for sid, inst in self._services.items()
                    if sid not in ports or ports[sid][0] != inst.port]
            closing = [self._services.pop(sid) for sid in gone]
        self._unlisten([d for inst in closing for d in inst.listeners])
        for sid, inst in zip(gone, closing, strict=True):
            log.info("health check port closed", service=_name(sid), port=inst.port)
        for sid in list(self._failed):
            if sid not in ports or ports[sid][0] != self._failed[sid][0]:
                del self._failed[sid]
        addresses = self.addresses if self.addresses is not None else [""]
        with self._lock:
            listening = sum(len(inst.listeners) for inst in self._services.values())
        left_out = set()
        for sid, (port, count) in sorted(ports.items()):
            with self._lock:
                known = self._services.get(sid)
                if known is not None:
                    known.endpoints = count
                    continue
            if listening + len(addresses) > self.max_listeners:
                left_out.add(sid)
                continue
            listening += self._open(sid, port, count, addresses)
        if left_out and left_out != self._left_out:
            log.warning("health check ports not opened: too many listeners",
                        not_opened=len(left_out), max_listeners=self.max_listeners,
                        services=[_name(sid) for sid in sorted(left_out)[:5]])
        self._left_out = left_out

    def _open(self, sid: ServiceId, port: int, count: int, addresses: list[str]) -> int:
        """Listen for one service: the listening sockets it took (0 when it could not)."""
        inst = _Instance(port, endpoints=count)
        if self._server is None:
            self._server = http.server("hcnp", budget=self._budget)
        try:
            for addr in addresses:
                inst.listeners.append(self._server.listen(addr, port, {},
                                                          fallback=lambda: self._answer(sid)))
        except OSError as exc:
            # upstream closeAll: a retry, or another owner, may need it
            self._unlisten(inst.listeners)
            error = exc.strerror or str(exc)
            if self._failed.get(sid) != (port, error):
                self._failed[sid] = (port, error)
                log.warning("cannot open health check port", service=_name(sid), port=port,
                            error=error)
            return 0
        self._failed.pop(sid, None)
        with self._lock:
            self._services[sid] = inst
        log.info("health check port opened", service=_name(sid), port=port)
        return len(inst.listeners)

    def _answer(self, sid: ServiceId) -> tuple[int, dict[str, str], bytes]:
        """service_health.go hcHandler: 200 when the service has local endpoints and the proxy
        is healthy (node eligibility is not looked at), else 503; the body is upstream's
        dedented, tab-indented JSON, byte for byte."""
        with self._lock:
            inst = self._services.get(sid)
            count = inst.endpoints if inst is not None else 0
        healthy = self.health.is_healthy()
        ns, name = sid
        body = ("{\n"
                "\t\"service\": {\n"
                f"\t\t\"namespace\": {json.dumps(ns)},\n"
                f"\t\t\"name\": {json.dumps(name)}\n"
                "\t},\n"
                f"\t\"localEndpoints\": {count},\n"
                f"\t\"serviceProxyHealthy\": {'true' if healthy else 'false'}\n"
                "}")
        headers = {"Content-Type": "application/json", "X-Content-Type-Options": "nosniff",
                   "X-Load-Balancing-Endpoint-Weight": str(count)}
        return (200 if count and healthy else 503), headers, body.encode()

    def open_ports(self) -> dict[ServiceId, int]:
        with self._lock:
            return {sid: inst.port for sid, inst in self._services.items()}

    def close(self) -> None:
        with self._lock:
            self._services = {}
        if self._server is not None:
            self._server.stop()
            self._server = None

    def _unlisten(self, listeners: list[http.Listener]) -> None:
        if listeners and self._server is not None:
            self._server.unlisten(listeners)


def _name(sid: ServiceId) -> str:
    return f"{sid[0]}/{sid[1]}"
