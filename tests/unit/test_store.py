"""The state store (daemon/store.py): changes tracked per service, deletions found from a fresh
list, equal objects ignored, invalid objects reported once, initialisation gated on all kinds."""

from __future__ import annotations

import threading
from typing import Any

import structlog

from ipvsproxy.daemon.store import Store
from tests.unit.kube_objects import NODE, ep, node, service, slice_


def store() -> Store:
    return Store(NODE, clock=lambda: 1000.0)


def listed(s: Store, services: list[dict[str, Any]], slices: list[dict[str, Any]]) -> None:
    s.replace("Service", services)
    s.replace("EndpointSlice", slices)
    s.replace("Node", [node()])


def test_initialised_only_when_every_kind_was_listed() -> None:
    s = store()
    s.replace("Service", [])
    s.replace("EndpointSlice", [])
    assert not s.initialized()
    s.replace("Node", [])  # no Node object (yet): listed all the same
    assert s.initialized()



def test_waiting_for_initialisation_is_not_woken_by_what_the_lists_queue() -> None:
    # Every listed object is a pending change: a wait for changes returns at once while the
    # lists are read, a wait for the lists does not.
    s = store()
    s.list_page("Service", [service("a", "10.96.0.1")], first=True)
    s.list_done("Service")
    s.list_page("EndpointSlice", [slice_("a", ep("10.244.1.1"))], first=True)
    assert s.pending_any() and s.wait(5.0)  # woken by the pending changes, not timed out
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(s.wait_initialized(30.0)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not got  # still waiting, though changes are pending
    s.list_done("EndpointSlice")
    s.replace("Node", [node()])  # the last kind listed wakes it
    waiter.join(10.0)
    assert got == [True]
    assert s.wait_initialized(0.0)

def test_changes_are_per_service_and_equal_objects_are_no_change() -> None:
    s = store()
    listed(s, [service("a", "10.96.0.1"), service("b", "10.96.0.2")],
           [slice_("a", ep("10.244.1.1"))])
    first = s.take()
    assert first.dirty == {("default", "a"), ("default", "b")} and first.full
    s.event("Service", "MODIFIED", service("a", "10.96.0.1"))  # same content
    assert not s.take()
    s.event("EndpointSlice", "MODIFIED", slice_("a", ep("10.244.1.1"), ep("10.244.1.2")))
    ch = s.take()
    assert ch.dirty == {("default", "a")} and not ch.full
    snap = s.snapshot(ch.dirty)
    assert [x.name for x in snap.services] == ["a"]
    assert [len(x.endpoints) for x in snap.slices] == [2]


def test_a_fresh_list_deletes_what_it_lacks() -> None:
    s = store()
    listed(s, [service("a", "10.96.0.1"), service("b", "10.96.0.2")],
           [slice_("a", ep("10.244.1.1")), slice_("b", ep("10.244.1.2"))])
    s.take()
    s.replace("Service", [service("a", "10.96.0.1")])
    s.replace("EndpointSlice", [slice_("a", ep("10.244.1.1"))])
    assert s.take().dirty == {("default", "b")}
    assert [x.name for x in s.snapshot().services] == ["a"]
    assert [x.service for x in s.snapshot().slices] == ["a"]


def test_a_slice_moving_to_another_service_dirties_both() -> None:
    s = store()
    listed(s, [], [slice_("a", ep("10.244.1.1"), name="x")])
    s.take()
    s.event("EndpointSlice", "MODIFIED", slice_("b", ep("10.244.1.1"), name="x"))
    assert s.take().dirty == {("default", "a"), ("default", "b")}
    assert not s.snapshot({("default", "a")}).slices


def test_node_changes_ask_for_a_full_sync_and_other_nodes_are_ignored() -> None:
    seen: list[Any] = []
    s = Store(NODE, on_node=seen.append)
    listed(s, [], [])
    s.take()
    s.event("Node", "MODIFIED", node("other-node", "192.168.1.99"))
    assert not s.take()
    s.event("Node", "MODIFIED", node(NODE, "192.168.1.10", zone="z1"))
    assert s.take().full
    s.event("Node", "DELETED", node(NODE))
    assert s.take().full and s.node is None and seen[-1] is None


def test_invalid_objects_are_reported_once_and_do_not_stop_others() -> None:
    s = store()
    bad = service("bad", "10.96.0.300")
    with structlog.testing.capture_logs() as logs:
        listed(s, [bad, service("good", "10.96.0.2")], [])
        s.event("Service", "MODIFIED", bad)
        s.event("Service", "MODIFIED", bad)
    warnings = [e for e in logs if e["event"] == "invalid object"]
    assert len(warnings) == 1 and warnings[0]["object"] == "default/bad"
    assert [x.name for x in s.snapshot().services] == ["good"]
    assert s.invalid_counts()["Service"] == 1
    s.event("Service", "DELETED", bad)
    assert s.invalid_counts()["Service"] == 0


def test_trigger_times_and_requeue() -> None:
    s = store()
    listed(s, [], [])
    s.take()
    sl = slice_("a", ep("10.244.1.1"))
    sl["metadata"]["annotations"] = {
        "endpoints.kubernetes.io/last-change-trigger-time": "2026-11-23T10:00:00Z"}
    s.event("EndpointSlice", "ADDED", sl)
    ch = s.take()
    assert ch.trigger_times == (1795428000.0,) and ch.first_queued == 1000.0
    s.requeue(ch)
    assert s.take().dirty == ch.dirty


def test_health_check_ports_follow_each_change() -> None:
    """LoadBalancer + Local services: health-check node port and this node's ready, not
    terminating endpoints (distinct addresses); worked out again only for changed services."""
    s = store()

    def lb(name: str, ip: str, hc: int, policy: str = "Local") -> dict[str, Any]:
        return service(name, ip, type_="LoadBalancer", ingress=["203.0.113.1"],
                       externalTrafficPolicy=policy, healthCheckNodePort=hc)

    listed(s, [lb("a", "10.96.0.1", 32001), lb("b", "10.96.0.2", 32002, "Cluster"),
               service("c", "10.96.0.3")],
           [slice_("a", ep("10.244.0.1", NODE), ep("10.244.0.2", "node-b"),
                   ep("10.244.0.3", NODE, ready=False), ep("10.244.0.4", NODE, terminating=True),
                   name="a-1"),
            slice_("a", ep("10.244.0.1", NODE), ep("10.244.0.5", NODE), name="a-2", port=81),
            slice_("b", ep("10.244.1.1", NODE), name="b-1")])
    assert s.health_check_ports() == {("default", "a"): (32001, 2)}
    s.event("EndpointSlice", "MODIFIED", slice_("a", ep("10.244.0.2", "node-b"), name="a-2",
                                                port=81))
    assert s.health_check_ports() == {("default", "a"): (32001, 1)}
    s.event("Service", "MODIFIED", lb("b", "10.96.0.2", 32002))  # now Local
    assert s.health_check_ports() == {("default", "a"): (32001, 1), ("default", "b"): (32002, 1)}
    s.event("Service", "DELETED", lb("a", "10.96.0.1", 32001))
    assert s.health_check_ports() == {("default", "b"): (32002, 1)}
    assert s.health_check_ports() == {("default", "b"): (32002, 1)}  # nothing changed since


def test_health_check_counts_only_endpoints_it_programs() -> None:
    """A local ready endpoint ipvsproxy refuses (multicast, a leading zero) is not counted:
    kube-proxy counts it (its EndpointsMap holds every ParseIPSloppy address), but here it has
    no real server, so a node with only such an endpoint would take LB traffic it drops."""
    s = store()
    svc = service("a", "10.96.0.1", type_="LoadBalancer", ingress=["203.0.113.1"],
                  externalTrafficPolicy="Local", healthCheckNodePort=32001)
    listed(s, [svc], [slice_("a", ep("239.1.1.9", NODE), ep("010.244.0.1", NODE), name="a-1")])
    assert [len(x.refused) for x in s.snapshot().slices] == [2]
    assert s.health_check_ports() == {("default", "a"): (32001, 0)}
    s.event("EndpointSlice", "MODIFIED",
            slice_("a", ep("239.1.1.9", NODE), ep("10.244.0.1", NODE), name="a-1"))
    assert s.health_check_ports() == {("default", "a"): (32001, 1)}


def test_a_list_goes_in_page_by_page_and_only_a_complete_one_deletes() -> None:
    s = store()
    listed(s, [service("a", "10.96.0.1"), service("b", "10.96.0.2"), service("c", "10.96.0.3")],
           [])
    s.take()
    s.list_page("Service", [service("a", "10.96.0.9")], first=True)
    assert s.services[("default", "a")].cluster_ips[0].exploded == "10.96.0.9"  # in at once
    assert set(s.services) == {("default", "a"), ("default", "b"), ("default", "c")}
    s.list_page("Service", [service("b", "10.96.0.2")], first=True)  # started over (a 410)
    s.list_page("Service", [service("d", "10.96.0.4")], first=False)
    s.list_done("Service")  # a and c were not in the complete list
    assert set(s.services) == {("default", "b"), ("default", "d")}
    assert s.take().dirty == {("default", x) for x in "acd"}
    s.list_page("Node", [node("other")], first=True)
    s.list_done("Node")
    assert s.node is None


def test_service_cidrs_ask_for_a_full_sync_and_reach_every_snapshot() -> None:
    s = store()
    s.take()
    cidr = {"kind": "ServiceCIDR", "metadata": {"name": "kubernetes"},
            "spec": {"cidrs": ["10.96.0.0/16", "fd00:96::/112"]}}
    s.replace("ServiceCIDR", [cidr])
    assert s.take().full
    assert [str(c) for c in s.snapshot().service_cidrs] == ["10.96.0.0/16", "fd00:96::/112"]
    assert [str(c) for c in s.snapshot({("default", "x")}).service_cidrs] == [
        "10.96.0.0/16", "fd00:96::/112"]
    s.event("ServiceCIDR", "MODIFIED", cidr)  # the same ranges: no change
    assert not s.take()
    s.event("ServiceCIDR", "DELETED", cidr)
    assert s.take().full and s.snapshot().service_cidrs == ()
    s.replace("ServiceCIDR", [{**cidr, "spec": {"cidrs": ["10.96.0.0/33"]}}])
    assert s.snapshot().service_cidrs == ()
    assert s.invalid_counts().get("ServiceCIDR") == 1
    assert s.initialized() is False  # not one of the kinds the first sync waits for
