"""Which endpoints become real servers: slice matching, conditions, traffic policies, topology.

kube-proxy's endpointslicecache.go (merge) and topology.go CategorizeEndpoints (selection), as
plain data. The one deliberate difference (IPVSPROXY-EXT-NO-LOCAL) is tested at the end.
"""

from __future__ import annotations

from ipaddress import ip_address, ip_network
from typing import Any

import pytest

from ipvsproxy.core import tables as T
from ipvsproxy.core.cluster import build_snapshot
from ipvsproxy.core.endpoints import Ep, port_endpoints
from ipvsproxy.core.ipvs import DestKey, Fwd, RealServer
from ipvsproxy.settings.config import Config
from tests.unit.kube_objects import (
    CFG46,
    NODE,
    chain,
    desired,
    ep,
    members,
    node,
    port,
    problems,
    service,
    slice_,
    vs,
)

LOCAL, OTHER = NODE, "node-b"
R, NR = {"ready": True}, {"ready": False}
TERM = {"ready": False, "serving": True, "terminating": True}  # serving and terminating
GONE = {"ready": False, "serving": False, "terminating": True}  # terminating, not serving


def eps(*spec: tuple[str, str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [ep(f"10.244.0.{i}", n, **c) for i, n, c in spec]


def rs(*ids: str) -> list[str]:
    return [f"10.244.0.{i}:80" for i in ids]


def policy_service(itp: str = "Cluster", etp: str = "Cluster", node_port: int = 0,
                   external: bool = False) -> dict[str, Any]:
    extra: dict[str, Any] = {"externalIPs": ["198.51.100.1"]} if external else {}
    return service("svc", "10.96.0.1", port(80, node_port=node_port),
                   type_="NodePort" if node_port else "ClusterIP",
                   internalTrafficPolicy=itp, externalTrafficPolicy=etp, **extra)


# (endpoints, ClusterIP real servers, externalIP real servers) for a service with
# ITP=Cluster and ETP=Local: the ClusterIP uses the cluster list, the externalIP the local list.
@pytest.mark.parametrize("endpoints,cluster,local", [
    (eps(("1", LOCAL, R), ("2", OTHER, R)), rs("1", "2"), rs("1")),
    # ready endpoints win over serving+terminating ones, in both lists
    (eps(("1", LOCAL, R), ("2", LOCAL, TERM), ("3", OTHER, R)), rs("1", "3"), rs("1")),
    # no ready endpoint anywhere: the cluster list falls back to serving+terminating
    (eps(("1", LOCAL, TERM), ("2", OTHER, TERM), ("3", OTHER, GONE)), rs("1", "2"), rs("1")),
    # no local ready endpoint: the local list falls back to local serving+terminating
    (eps(("1", LOCAL, TERM), ("2", LOCAL, GONE), ("3", OTHER, R)), rs("3"), rs("1")),
    # not ready, not serving: never a real server
    (eps(("1", LOCAL, NR), ("2", OTHER, GONE)), [], []),
], ids=["ready", "ready-beats-terminating", "cluster-fallback", "local-fallback", "unusable"])
def test_ready_serving_terminating(endpoints: list[Any], cluster: list[str], local: list[str]
                                   ) -> None:
    d = desired(policy_service(etp="Local", external=True), slice_("svc", *endpoints))
    assert vs(d) == {"TCP 10.96.0.1:80": cluster, "TCP 198.51.100.1:80": local or cluster}


@pytest.mark.parametrize("endpoints,node_port,expected", [
    (eps(("1", LOCAL, R), ("2", OTHER, R)), 0, rs("1")),
    # not externally reachable: no cluster list, so no fallback at all
    (eps(("1", OTHER, R), ("2", OTHER, R)), 0, []),
    # externally reachable (NodePort): falls back to cluster endpoints (kube-proxy PR #97081)
    (eps(("1", OTHER, R), ("2", OTHER, R)), 30001, rs("1", "2")),
    (eps(("1", LOCAL, TERM), ("2", OTHER, R)), 0, rs("1")),
], ids=["local", "no-local", "no-local-node-port-fallback", "local-terminating"])
def test_internal_traffic_policy_local(endpoints: list[Any], node_port: int,
                                       expected: list[str]) -> None:
    d = desired(policy_service(itp="Local", node_port=node_port), slice_("svc", *endpoints))
    assert vs(d)["TCP 10.96.0.1:80"] == expected


def test_internal_traffic_policy_is_per_family_externally_reachable() -> None:
    """A dual-stack ITP=Local service whose only externalIP is IPv4 is externally reachable in
    IPv4 (fallback to cluster endpoints) but not in IPv6 (no real servers), as kube-proxy's
    per-family ServicePort. (Fixed: the IPv6 side used to fall back too.)"""
    d = desired(service("ds", ["10.96.0.2", "fd00::2"], internalTrafficPolicy="Local",
                        externalIPs=["198.51.100.2"]),
                slice_("ds", ep("10.244.0.1", OTHER)),
                slice_("ds", ep("fd00:244::1", OTHER), family="IPv6"), cfg=CFG46)
    assert vs(d) == {"TCP 10.96.0.2:80": ["10.244.0.1:80"],
                     "TCP 198.51.100.2:80": ["10.244.0.1:80"], "TCP [fd00::2]:80": []}


# Topology: zone hints are used only when every ready endpoint has hints and one is for this
# node's zone (Node label topology.kubernetes.io/zone).
@pytest.mark.parametrize("zone,endpoints,expected", [
    ("z1", [ep("10.244.0.1", zones=["z1"]), ep("10.244.0.2", zones=["z2"])], rs("1")),
    ("z1", [ep("10.244.0.1", zones=["z1", "z2"]), ep("10.244.0.2", zones=["z2"])], rs("1")),
    ("z1", [ep("10.244.0.1", zones=["z1"]), ep("10.244.0.2")], rs("1", "2")),
    # an empty forZones list is no hint (endpointslicecache.go; fixed: it used to count)
    ("z1", [ep("10.244.0.1", zones=["z1"]), ep("10.244.0.2", zones=[])], rs("1", "2")),
    ("z3", [ep("10.244.0.1", zones=["z1"]), ep("10.244.0.2", zones=["z2"])], rs("1", "2")),
    ("", [ep("10.244.0.1", zones=["z1"]), ep("10.244.0.2", zones=["z2"])], rs("1", "2")),
    # a node without the zone label is in the zone "" (a valid label value): topology.go
    # looks the empty zone up in the hints like any other (found by the differential suite)
    ("", [ep("10.244.0.1", zones=[""]), ep("10.244.0.2", zones=["z2"])], rs("1")),
    # only ready endpoints are inspected: an unhinted not-ready one does not disable topology
    ("z1", [ep("10.244.0.1", zones=["z1"]), ep("10.244.0.2", zones=["z2"]),
            ep("10.244.0.3", ready=False)], rs("1")),
    # the serving+terminating fallback ignores topology
    ("z1", [ep("10.244.0.1", zones=["z2"], **TERM), ep("10.244.0.2", zones=["z2"], **TERM)],
     rs("1", "2")),
], ids=["filter", "multi-zone-hint", "one-unhinted", "empty-hint", "no-hint-for-zone",
        "node-without-zone", "hint-for-the-empty-zone", "unready-ignored",
        "terminating-fallback"])
def test_topology_zone_hints(zone: str, endpoints: list[Any], expected: list[str]) -> None:
    d = desired(policy_service(), slice_("svc", *endpoints), node(NODE, zone=zone))
    assert vs(d)["TCP 10.96.0.1:80"] == expected


@pytest.mark.parametrize("endpoints,expected", [
    # every ready endpoint hinted for a node, one for this node: only those (PreferSameNode)
    ([ep("10.244.0.1", nodes=[NODE]), ep("10.244.0.2", nodes=["node-b"])], rs("1")),
    # node hints win over zone hints
    ([ep("10.244.0.1", nodes=[NODE], zones=["z2"]), ep("10.244.0.2", nodes=["node-b"],
                                                       zones=["z1"])], rs("1")),
    # no hint for this node: the zone hints decide
    ([ep("10.244.0.1", nodes=["node-c"], zones=["z2"]),
      ep("10.244.0.2", nodes=["node-b"], zones=["z1"])], rs("2")),
    # one ready endpoint without a node hint: no node topology
    ([ep("10.244.0.1", nodes=[NODE]), ep("10.244.0.2")], rs("1", "2")),
    # an empty forNodes list is no hint
    ([ep("10.244.0.1", nodes=[NODE]), ep("10.244.0.2", nodes=[])], rs("1", "2")),
    # a not-ready endpoint's hints are not looked at
    ([ep("10.244.0.1", nodes=[NODE]), ep("10.244.0.2", nodes=["node-b"]),
      ep("10.244.0.3", ready=False)], rs("1")),
], ids=["filter", "before-zones", "zones-decide", "one-unhinted", "empty-hint",
        "unready-ignored"])
def test_topology_node_hints(endpoints: list[Any], expected: list[str]) -> None:
    """trafficDistribution PreferSameNode (GA in 1.35): topology.go topologyModeFromHints."""
    d = desired(policy_service(), slice_("svc", *endpoints), node(NODE, zone="z1"))
    assert vs(d)["TCP 10.96.0.1:80"] == expected


# An endpoint whose address ipvsproxy refuses (multicast, which the API server lets in, or a
# leading zero / IPv4-mapped spelling) is never programmed, but kube-proxy counts it when it
# chooses the others (and then fails to add it: the kernel refuses a multicast real server).
# Found by the differential suite: a hint-less multicast endpoint turned kube-proxy's node
# topology off.
@pytest.mark.parametrize("refused", ["233.252.1.129", "010.244.0.9", "::ffff:10.244.0.9"],
                         ids=["multicast", "leading-zero", "ipv4-mapped"])
@pytest.mark.parametrize("endpoints,expected", [
    # without hints, it turns topology off for every other endpoint
    ([ep("10.244.0.1", nodes=[NODE], zones=["z1"]), ep("10.244.0.2", nodes=["node-b"],
                                                       zones=["z1"])], rs("1", "2")),
    # ready, it stops the fallback to serving terminating endpoints: nothing is programmed
    ([ep("10.244.0.1", **TERM)], []),
], ids=["topology-off", "no-fallback"])
def test_a_refused_endpoint_counts_as_kube_proxy_counts_it(
        refused: str, endpoints: list[Any], expected: list[str]) -> None:
    d = desired(policy_service(), slice_("svc", *endpoints, ep(refused)), node(NODE, zone="z1"))
    assert vs(d)["TCP 10.96.0.1:80"] == expected
    assert any(refused in p and "ignored" in p for p in problems(d)), problems(d)
    # not ready, it changes nothing, as a not-ready endpoint never does: node topology in the
    # first case, the fallback in the second
    d = desired(policy_service(), slice_("svc", *endpoints, ep(refused, ready=False)),
                node(NODE, zone="z1"))
    assert vs(d)["TCP 10.96.0.1:80"] == rs("1")


def test_a_refused_spelling_never_stands_in_for_a_usable_address() -> None:
    d = desired(policy_service(), slice_("svc", ep("010.244.0.1"), ep("10.244.0.1", NODE)),
                node(NODE))
    assert vs(d)["TCP 10.96.0.1:80"] == rs("1")


@pytest.mark.parametrize("slice_obj,expected", [
    (slice_("svc", ep("10.244.0.1")), rs("1")),
    (slice_("svc", ep("10.244.0.1"), port_name="other"), []),
    (slice_("svc", ep("10.244.0.1"), proto="UDP"), []),  # ServicePortName includes protocol
    (slice_("svc", ep("10.244.0.1"), labels={}), []),  # no kubernetes.io/service-name label
    (slice_("other", ep("10.244.0.1")), []),
    (slice_("svc", ep("10.244.0.1"), ns="elsewhere"), []),
    (slice_("svc", ep("fd00::1"), family="IPv6"), []),  # other family
    (slice_("svc", ep("10.244.0.1"), labels={"kubernetes.io/service-name": "svc",
                                              "service.kubernetes.io/headless": ""}), []),
    (slice_("svc", ep("10.244.0.1"), ports=[port(9090, "x"), port(8080)]), ["10.244.0.1:8080"]),
], ids=["match", "port-name", "protocol", "no-label", "other-service", "other-namespace",
        "other-family", "headless-label", "second-port"])
def test_slice_matching(slice_obj: dict[str, Any], expected: list[str]) -> None:
    assert vs(desired(policy_service(), slice_obj))["TCP 10.96.0.1:80"] == expected


def test_multi_port_service_matches_each_port_by_name_and_protocol() -> None:
    d = desired(service("dns", "10.96.0.10", port(53, "dns", "UDP"), port(53, "dns-tcp")),
                slice_("dns", ep("10.244.0.1"),
                       ports=[port(5353, "dns", "UDP"), port(5354, "dns-tcp", "TCP")]))
    assert vs(d) == {"TCP 10.96.0.10:53": ["10.244.0.1:5354"],
                     "UDP 10.96.0.10:53": ["10.244.0.1:5353"]}


def test_duplicate_endpoint_across_slices_local_wins() -> None:
    """endpointslicecache.go addEndpoints: one entry per ip:port, the first one unless a later
    one is local (slices are merged in name order here)."""
    d = desired(policy_service(itp="Local"),
                slice_("svc", ep("10.244.0.1", OTHER), name="svc-a", weight="3"),
                slice_("svc", ep("10.244.0.1", LOCAL), name="svc-b", weight="7"),
                slice_("svc", ep("10.244.0.2", LOCAL), name="svc-c", weight="2"),
                slice_("svc", ep("10.244.0.2", OTHER), name="svc-d", weight="9"))
    got = d.dests[next(iter(d.services))]
    assert {str(r.key): r.weight for r in got} == {"10.244.0.1:80": 7, "10.244.0.2:80": 2}
    assert members(d, T.LOOP_BACK) == {"10.244.0.1,tcp:80,10.244.0.1",
                                       "10.244.0.2,tcp:80,10.244.0.2"}


@pytest.mark.parametrize("hostname,expected", [("node-a", rs("1")), ("NODE-A", rs("1")),
                                              ("", [])])
def test_endpoint_is_local_by_node_name(hostname: str, expected: list[str]) -> None:
    cfg = Config(hostname=hostname.lower())
    d = desired(policy_service(itp="Local"), slice_("svc", ep("10.244.0.1", "node-a")),
                cfg=cfg)
    assert vs(d)["TCP 10.96.0.1:80"] == expected


# Deliberate difference: kube-proxy's IPVS mode sends outside clients of an ETP=Local frontend
# with no local endpoint to cluster endpoints (and the reply is lost). ipvsproxy keeps the
# cluster endpoints as real servers (the node and its pods still reach the service) but lists
# the frontend in IPVSPROXY-EXT-NO-LOCAL, whose filter rule drops outside clients, as
# kube-proxy's iptables and nftables modes do.
def test_external_traffic_policy_local_without_local_endpoints() -> None:
    cfg = Config(hostname=NODE, cluster_cidrs=(ip_network("10.244.0.0/16"),))
    d = desired(service("lb", "10.96.0.3", port(443, node_port=31443), type_="LoadBalancer",
                        externalTrafficPolicy="Local", externalIPs=["198.51.100.3"],
                        ingress=["203.0.113.3"], healthCheckNodePort=32003),
                slice_("lb", ep("10.244.0.1", OTHER), port=8443), cfg=cfg)
    assert len(vs(d)) == 5 and all(v == ["10.244.0.1:8443"] for v in vs(d).values())
    assert members(d, T.EXT_NO_LOCAL) == {
        "198.51.100.3,tcp:443", "203.0.113.3,tcp:443",
        "192.168.1.10,tcp:31443", "10.244.1.1,tcp:31443"}  # not the ClusterIP
    comment = '-m comment --comment "ipvsproxy: externalTrafficPolicy=Local frontends with ' \
              'no local endpoint" -m set --match-set IPVSPROXY-EXT-NO-LOCAL dst,dst'
    assert chain(d, "filter", "KUBE-PROXY-FIREWALL") == [
        f"-s 10.244.0.0/16 {comment} -j RETURN",
        f"{comment} -m addrtype ! --src-type LOCAL -j DROP"]


def test_external_traffic_policy_local_with_local_endpoints() -> None:
    d = desired(policy_service(etp="Local", node_port=30001),
                slice_("svc", *eps(("1", LOCAL, R), ("2", OTHER, R))))
    assert vs(d) == {"TCP 10.96.0.1:80": rs("1", "2"), "TCP 10.244.1.1:30001": rs("1"),
                     "TCP 192.168.1.10:30001": rs("1")}
    assert members(d, T.EXT_NO_LOCAL) == set()
    assert chain(d, "filter", "KUBE-PROXY-FIREWALL") == []
    assert members(d, T.NODE_PORT_LOCAL_TCP) == {"30001"}


def test_real_servers_are_in_the_kernels_order_whatever_the_slices_order() -> None:
    """A virtual server's real servers come in DestKey order (the address as a number, then
    the port), as the kernel's dump is compared with them, however the slices list them:
    10.244.0.9 before 10.244.0.10, and a refused address never among them."""
    d = desired(policy_service(),
                slice_("svc", ep("10.244.0.10"), ep("239.1.1.1"), ep("10.244.0.9"), name="svc-b"),
                slice_("svc", ep("10.244.1.1"), ep("10.244.0.100"), name="svc-a"))
    assert vs(d) == {"TCP 10.96.0.1:80": ["10.244.0.9:80", "10.244.0.10:80", "10.244.0.100:80",
                                          "10.244.1.1:80"]}


def test_values_built_through_tuple_new_have_every_field() -> None:
    """port_endpoints and the real servers build their NamedTuples with tuple.__new__, which
    fills no defaults: each must still carry every field (a field added to Ep or RealServer
    and not to those builders fails here, not as a short tuple in a diff)."""
    d = desired(policy_service(), slice_("svc", ep("10.244.0.1"), weight="5"))
    (got,) = d.dests.values()
    assert got == (RealServer(DestKey(ip_address("10.244.0.1"), 80), Fwd.MASQ, 5),)
    assert len(got[0]) == len(RealServer._fields)
    snap = build_snapshot([policy_service(), slice_("svc", ep("10.244.0.1", LOCAL))], NODE)
    svc = snap.services[0]
    (e,) = port_endpoints(snap.slices_by_service()[svc.sid], svc.ports[0], 4, NODE)
    assert len(e) == len(Ep._fields) and e.usable and e.local
