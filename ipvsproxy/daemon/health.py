"""The proxy's own health: what /healthz and /livez answer, and what the health-check node ports
(daemon/hcnp.py) report as `serviceProxyHealthy`.

Owns the per-family "last updated" and "oldest pending queued update" times and the node's
eligibility; serving them over HTTP is daemon/http.py. A port of kube-proxy's ProxyHealthServer
(pkg/proxy/healthcheck/proxy_health.go), including its JSON body, field for field.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

FAMILY_LABEL = {4: "IPv4", 6: "IPv6"}
# The Cluster Autoscaler's taint on a node it is about to delete (proxy_health.go).
TO_BE_DELETED_TAINT = "ToBeDeletedByClusterAutoscaler"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
GO_ZERO_TIME = "0001-01-01T00:00:00Z"  # how Go's JSON prints a zero time.Time


def go_time(t: float | None) -> str:
    """A Unix time as Go's time.Time JSON (RFC3339Nano: trailing zeros of the fraction dropped,
    no fraction at all when whole), in UTC, to the microsecond; None is Go's zero time."""
    if t is None:
        return GO_ZERO_TIME
    us = round(t * 1_000_000)
    dt = _EPOCH + timedelta(microseconds=us)
    frac = f"{us % 1_000_000:06d}".rstrip("0")
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"


def node_eligible(node: Mapping[str, Any] | None) -> bool:
    """proxy_health.go NodeEligible: not being deleted and not tainted ToBeDeletedTaint. No Node
    at all (deleted, or missing from the list) is not eligible either."""
    if node is None:
        return False
    meta = node.get("metadata")
    if isinstance(meta, Mapping) and meta.get("deletionTimestamp"):
        return False
    spec = node.get("spec")
    taints = spec.get("taints") if isinstance(spec, Mapping) else None
    if isinstance(taints, list):
        for taint in taints:
            if isinstance(taint, Mapping) and taint.get("key") == TO_BE_DELETED_TAINT:
                return False
    return True


class Health:
    """kube-proxy's ProxyHealthServer state. Thread-safe: the reconciler and the store write it,
    the HTTP servers read it."""

    def __init__(self, families: tuple[int, ...], sync_period: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.families = families
        self.timeout = 2 * sync_period  # kube-proxy's healthTimeout (cmd/kube-proxy server.go)
        self.clock = clock
        self._lock = threading.Lock()
        self._last_updated: dict[str, float] = {}
        self._oldest_queued: dict[str, float] = {}
        # Before the first Node event the node counts as eligible, as it did upstream before
        # kube-proxy started waiting for its Node at startup: a proxy starting is not a node
        # being drained.
        self._node_eligible = True

    def queued_update(self, fam: int) -> None:
        """Changes arrived that the kernel does not have yet. Only the oldest pending one counts:
        the time is kept until updated() (QueuedUpdate)."""
        with self._lock:
            self._oldest_queued.setdefault(FAMILY_LABEL[fam], self.clock())

    def updated(self, fam: int) -> None:
        """A sync of this family succeeded (Updated)."""
        with self._lock:
            label = FAMILY_LABEL[fam]
            self._oldest_queued.pop(label, None)
            self._last_updated[label] = self.clock()

    def set_node(self, obj: Mapping[str, Any] | None) -> None:
        """The raw Node object as last seen, None once it is gone."""
        eligible = node_eligible(obj)
        with self._lock:
            self._node_eligible = eligible

    def _health(self) -> tuple[bool, dict[str, Any]]:
        """proxy_health.go Health(). Quirk kept: only families that synced at least once are
        judged (and listed in `status`); one never synced counts as healthy ("starting up")."""
        with self._lock:
            now = self.clock()
            healthy = True
            status: dict[str, dict[str, Any]] = {}
            for label in sorted(self._last_updated):  # Go's json.Marshal sorts map keys
                last = self._last_updated[label]
                queued = self._oldest_queued.get(label)
                ok = queued is None or now - queued < self.timeout
                healthy = healthy and ok
                status[label] = {"lastUpdated": go_time(last), "healthy": ok}
            latest = max(self._last_updated.values(), default=None)
            eligible = self._node_eligible
        doc: dict[str, Any] = {"lastUpdated": go_time(latest), "currentTime": go_time(now),
                               "nodeEligible": eligible, "healthy": healthy}
        if status:  # `json:"status,omitempty"`
            doc["status"] = status
        return healthy, doc

    def is_healthy(self) -> bool:
        """The proxy's health, ignoring the node's eligibility (what service_health.go reports
        as serviceProxyHealthy)."""
        return self._health()[0]

    def healthz(self) -> tuple[int, dict[str, Any]]:
        """/healthz: unhealthy (503) also when the node is being deleted, so load balancers stop
        sending to it. When healthy, lastUpdated is reported as now (upstream's compatibility
        with older releases whose lastUpdated was the last sync loop run)."""
        healthy, doc = self._health()
        ok = healthy and doc["nodeEligible"]
        if ok:
            doc["lastUpdated"] = doc["currentTime"]
        return (200 if ok else 503), doc

    def livez(self) -> tuple[int, dict[str, Any]]:
        """/livez: like /healthz without the node's eligibility (and no nodeEligible field)."""
        healthy, doc = self._health()
        del doc["nodeEligible"]
        if healthy:
            doc["lastUpdated"] = doc["currentTime"]
        return (200 if healthy else 503), doc
