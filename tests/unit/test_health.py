"""The proxy's health (daemon/health.py) against kube-proxy's ProxyHealthServer semantics
(pkg/proxy/healthcheck/proxy_health.go), with a fake clock."""

from __future__ import annotations

from typing import Any

import pytest

from ipvsproxy.daemon.health import Health, go_time

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def health(families: tuple[int, ...] = (4,), sync_period: float = 30.0
           ) -> tuple[Health, Clock]:
    clock = Clock()
    return Health(families, sync_period, clock=clock), clock


def node(deleting: bool = False, taints: list[str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "node-a"}
    if deleting:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    return {"kind": "Node", "metadata": meta,
            "spec": {"taints": [{"key": k, "effect": "NoSchedule"} for k in taints or []]}}


def test_go_time_is_rfc3339nano_in_utc() -> None:
    assert go_time(None) == "0001-01-01T00:00:00Z"
    assert go_time(T0) == "2023-11-14T22:13:20Z"  # no fraction when whole
    assert go_time(T0 + 0.5) == "2023-11-14T22:13:20.5Z"  # trailing zeros dropped
    assert go_time(T0 + 0.123456) == "2023-11-14T22:13:20.123456Z"
    assert go_time(0.000001) == "1970-01-01T00:00:00.000001Z"


def test_a_fresh_start_is_healthy_with_zero_last_updated_and_no_status() -> None:
    h, _ = health()
    code, doc = h.healthz()
    assert code == 200
    # exact keys and order of upstream's ProxyHealth; status is omitempty
    assert list(doc) == ["lastUpdated", "currentTime", "nodeEligible", "healthy"]
    assert doc == {"lastUpdated": go_time(T0), "currentTime": go_time(T0),
                   "nodeEligible": True, "healthy": True}
    assert h.livez() == (200, {"lastUpdated": go_time(T0), "currentTime": go_time(T0),
                               "healthy": True})
    assert h.is_healthy()


def test_a_queued_update_not_synced_within_twice_the_sync_period_is_unhealthy() -> None:
    h, clock = health(sync_period=30.0)
    h.updated(4)
    synced = clock.t
    clock.t += 5
    h.queued_update(4)
    clock.t += 59.9
    assert h.healthz()[0] == 200  # late only after 2 x sync period
    h.queued_update(4)  # a newer change does not move the oldest pending one
    clock.t += 0.1
    code, doc = h.healthz()
    assert code == 503 and not h.is_healthy()
    assert doc == {"lastUpdated": go_time(synced), "currentTime": go_time(clock.t),
                   "nodeEligible": True, "healthy": False,
                   "status": {"IPv4": {"lastUpdated": go_time(synced), "healthy": False}}}
    assert h.livez()[0] == 503
    h.updated(4)
    code, doc = h.healthz()
    assert code == 200 and doc["healthy"] is True
    assert doc["status"] == {"IPv4": {"lastUpdated": go_time(clock.t), "healthy": True}}


def test_when_healthy_last_updated_is_reported_as_now() -> None:
    h, clock = health()
    h.updated(4)
    clock.t += 10
    code, doc = h.healthz()
    assert code == 200 and doc["lastUpdated"] == doc["currentTime"] == go_time(clock.t)
    assert doc["status"]["IPv4"]["lastUpdated"] == go_time(T0)  # the real one per family


def test_each_family_is_judged_and_listed_sorted() -> None:
    h, clock = health((6, 4), sync_period=1.0)
    h.updated(6)
    h.updated(4)
    h.queued_update(6)
    clock.t += 2
    code, doc = h.livez()
    assert code == 503 and list(doc["status"]) == ["IPv4", "IPv6"]
    assert doc["status"]["IPv4"]["healthy"] is True
    assert doc["status"]["IPv6"]["healthy"] is False


def test_a_family_never_synced_counts_as_starting_up() -> None:
    """Upstream quirk: only families present in lastUpdated are judged."""
    h, clock = health()
    h.queued_update(4)
    clock.t += 3600
    assert h.healthz()[0] == 200


@pytest.mark.parametrize("obj", [node(deleting=True),
                                 node(taints=["ToBeDeletedByClusterAutoscaler"]), None])
def test_a_node_going_away_fails_healthz_but_not_livez(obj: dict[str, Any] | None) -> None:
    h, _ = health()
    h.updated(4)
    h.set_node(obj)
    code, doc = h.healthz()
    assert code == 503
    assert doc["nodeEligible"] is False and doc["healthy"] is True  # the proxy itself is fine
    assert h.livez()[0] == 200 and h.is_healthy()
    h.set_node(node(taints=["node.kubernetes.io/unschedulable"]))
    assert h.healthz() == (200, {**doc, "nodeEligible": True})
