"""Health-check node ports: for each LoadBalancer Service with externalTrafficPolicy Local, an
HTTP server on its spec.healthCheckNodePort telling the cloud load balancer whether this node
has local endpoints (200) or not (503), so traffic only goes to nodes that can serve it.

Owns those listeners (opened, closed and updated at each sync); which services need one and their
local endpoint counts come from `ipvsproxy run`. A port of kube-proxy's ServiceHealthServer
(pkg/proxy/healthcheck/service_health.go), answer for answer.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from ipvsproxy.daemon import http

log = structlog.get_logger("ipvsproxy.hcnp")
ServiceId = tuple[str, str]  # (namespace, name)


class ProxyHealth(Protocol):
    def is_healthy(self) -> bool: ...


@dataclass
class _Instance:
    port: int
    servers: list[http.Served] = field(default_factory=list)
    endpoints: int = 0


class HealthCheckPorts:
    """The listeners, one per service (per address when addresses are given; None listens on
    every address of both families)."""

    def __init__(self, health: ProxyHealth, addresses: list[str] | None) -> None:
        self.health = health
        self.addresses = addresses
        self._lock = threading.Lock()
        self._services: dict[ServiceId, _Instance] = {}
        self._failed: dict[ServiceId, tuple[int, str]] = {}  # logged once until it changes

    def sync(self, ports: dict[ServiceId, tuple[int, int]]) -> None:
        """Make these the open health-check ports: (namespace, name) -> (healthCheckNodePort,
        local endpoints). Upstream's SyncServices then SyncEndpoints: a service gone or on a new
        port is closed first, new ones opened; one that cannot be opened is logged and retried
        at the next sync while the others keep working."""
        with self._lock:
            gone = [sid for sid, inst in self._services.items()
                    if sid not in ports or ports[sid][0] != inst.port]
            closing = [self._services.pop(sid) for sid in gone]
        _stop([s for inst in closing for s in inst.servers])
        for sid, inst in zip(gone, closing, strict=True):
            log.info("health check port closed", service=_name(sid), port=inst.port)
        for sid in list(self._failed):
            if sid not in ports or ports[sid][0] != self._failed[sid][0]:
                del self._failed[sid]
        for sid, (port, count) in sorted(ports.items()):
            with self._lock:
                known = self._services.get(sid)
                if known is not None:
                    known.endpoints = count
                    continue
            self._open(sid, port, count)

    def _open(self, sid: ServiceId, port: int, count: int) -> None:
        inst = _Instance(port, endpoints=count)
        try:
            for addr in self.addresses if self.addresses is not None else [""]:
                inst.servers.append(http.serve(addr, port, {}, f"hcnp-{port}",
                                               fallback=lambda: self._answer(sid)))
        except OSError as exc:
            _stop(inst.servers)  # upstream closeAll: a retry, or another owner, may need it
            error = exc.strerror or str(exc)
            if self._failed.get(sid) != (port, error):
                self._failed[sid] = (port, error)
                log.warning("cannot open health check port", service=_name(sid), port=port,
                            error=error)
            return
        self._failed.pop(sid, None)
        with self._lock:
            self._services[sid] = inst
        log.info("health check port opened", service=_name(sid), port=port)

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
            closing, self._services = list(self._services.values()), {}
        _stop([s for inst in closing for s in inst.servers])


def _stop(servers: Iterable[http.Served]) -> None:
    """Stop servers in parallel: each takes up to its poll interval to notice."""
    threads = [threading.Thread(target=s.stop, daemon=True) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _name(sid: ServiceId) -> str:
    return f"{sid[0]}/{sid[1]}"
