"""Scenarios ported from kube-proxy's pkg/proxy/ipvs/proxier_test.go (kubernetes/kubernetes).

Each test names the upstream test it ports. Upstream runs a fake proxier (no node name match
unless NodeName is "test-node", a netlink fake whose eth0 holds `nodeIPs`, a no-op local-traffic
detector); here the same objects go through compute_desired with a host and Config saying the
same. Differences that are deliberate, or that come from upstream test shortcuts (ports 0,
nodePorts on ClusterIP services, several services sharing one ClusterIP), are noted per test.
"""

from __future__ import annotations

from ipaddress import ip_network
from typing import Any

import pytest

from ipvsproxy.core import tables as T
from ipvsproxy.core.desired import HostFacts
from ipvsproxy.core.endpoints import categorize, port_endpoints
from ipvsproxy.core.ipvs import SVC_F_PERSISTENT
from ipvsproxy.core.model import parse_service
from ipvsproxy.core.slices import parse_endpoint_slice
from ipvsproxy.settings.config import Config
from tests.unit.kube_objects import (
    addrs,
    chain,
    desired,
    ep,
    host,
    members,
    node,
    port,
    problems,
    service,
    slice_,
    vs,
    vs_attrs,
)

TEST_NODE = "test-node"


def cfg(family: int = 4, **kw: Any) -> Config:
    return Config(hostname=TEST_NODE, families=(family,), **kw)


def on(*ips: str) -> HostFacts:
    """NewFakeProxier(nodeIPs): the addresses live on eth0."""
    return host(*(("eth0", ip) for ip in ips))


def sync(*docs: Any, family: int = 4, ips: tuple[str, ...] = (), **kw: Any) -> Any:
    return desired(*docs, node(TEST_NODE, *(ips or ("100.101.102.103",))), cfg=cfg(family, **kw),
                   host=on(*ips))


def jumps(d: Any, table: str, name: str, family: int = 4) -> list[tuple[str, str]]:
    """(target, match-set) per rule: what upstream's checkIptables compares."""
    out = []
    for r in chain(d, table, name, family):
        words = r.split()
        ms = words[words.index("--match-set") + 1] if "--match-set" in words else ""
        out.append((words[words.index("-j") + 1], ms))
    return out


NP = port(80, "p80", node_port=3001)
V4 = slice_("svc1", ep("10.180.0.1"), port_name="p80", ns="ns1")
V6 = slice_("svc1", ep("1002:ab8::2:10"), port_name="p80", ns="ns1", family="IPv6")


# TestNodePortIPv4 / TestNodePortIPv6 (table cases; upstream's IPv6 "UDP" case puts an IPv4
# address into an IPv6 slice, which is a Problem here rather than silently nothing).
@pytest.mark.parametrize("docs,family,ips,expected", [
    ([service("svc1", "10.20.30.41", NP, type_="NodePort", ns="ns1"), V4, V6], 4,
     ("100.101.102.103", "2001:db8::1:1"),
     {"TCP 10.20.30.41:80": ["10.180.0.1:80"], "TCP 100.101.102.103:3001": ["10.180.0.1:80"]}),
    ([service("svc1", "10.20.30.41", NP, type_="NodePort", ns="ns1")], 4, ("100.101.102.103",),
     {"TCP 10.20.30.41:80": [], "TCP 100.101.102.103:3001": []}),
    ([service("svc1", "2020::1", NP, type_="NodePort", ns="ns1"), V4, V6], 6,
     ("100.101.102.103", "2001:db8::1:1"),
     {"TCP [2001:db8::1:1]:3001": ["[1002:ab8::2:10]:80"],
      "TCP [2020::1]:80": ["[1002:ab8::2:10]:80"]}),
    ([service("svc1", "10.20.30.41", port(80, "p80", "UDP", 3001), type_="NodePort", ns="ns1")],
     6, ("100.101.102.103",), {}),
], ids=["ipv4-2-endpoints", "ipv4-no-endpoints", "ipv6-2-endpoints", "ipv6-proxier-ipv4-svc"])
def test_node_port(docs: list[Any], family: int, ips: tuple[str, ...],
                   expected: dict[str, list[str]]) -> None:
    assert vs(sync(*docs, family=family, ips=ips)) == expected


def test_node_port_udp() -> None:
    """TestNodePortIPv4 "1 UDP service with node port, has endpoints"."""
    d = sync(service("svc1", "10.20.30.41", port(80, "p80", "UDP", 3001), type_="NodePort",
                     ns="ns1"),
             slice_("svc1", ep("10.180.0.1"), port_name="p80", proto="UDP", ns="ns1"),
             ips=("100.101.102.103",), nodeport_addresses=(ip_network("0.0.0.0/0"),))
    assert vs(d) == {"UDP 10.20.30.41:80": ["10.180.0.1:80"],
                     "UDP 100.101.102.103:3001": ["10.180.0.1:80"]}
    assert members(d, T.NODE_PORT_UDP) == {"3001"}
    assert jumps(d, "nat", "KUBE-NODE-PORT") == [("KUBE-MARK-MASQ", "KUBE-NODE-PORT-UDP")]
    assert jumps(d, "filter", "KUBE-NODE-PORT") == [("ACCEPT", "KUBE-HEALTH-CHECK-NODE-PORT")]
    assert jumps(d, "nat", "KUBE-SERVICES") == [
        ("RETURN", ""), ("KUBE-MARK-MASQ", "KUBE-CLUSTER-IP"), ("KUBE-NODE-PORT", ""),
        ("ACCEPT", "KUBE-CLUSTER-IP")]


@pytest.mark.parametrize("family,cluster_ip,ep_ip,ips,node_ips", [
    (4, "10.20.30.41", "10.180.0.1",
     ("100.101.102.103", "100.101.102.104", "100.101.102.105", "2001:db8::1:1", "2001:db8::1:2"),
     ["100.101.102.103", "100.101.102.104", "100.101.102.105"]),
    (6, "2020::1", "2001::1", ("2001:db8::1:1", "2001:db8::1:2"),
     ["2001:db8::1:1", "2001:db8::1:2"]),
], ids=["ipv4", "ipv6"])
def test_node_port_sctp_on_multiple_node_ips(family: int, cluster_ip: str, ep_ip: str,
                                              ips: tuple[str, ...], node_ips: list[str]
                                              ) -> None:
    """TestNodePortIPv4/IPv6 "node port service with protocol sctp on a node with multiple
    nodeIPs": one virtual server and one KUBE-NODE-PORT-SCTP-HASH entry per node IP."""
    d = sync(service("svc1", cluster_ip, port(80, "p80", "SCTP", 3001), type_="NodePort",
                     ns="ns1"),
             slice_("svc1", ep(ep_ip), port_name="p80", proto="SCTP", ns="ns1",
                    family=f"IPv{family}"), family=family, ips=ips)
    wrap = (lambda a: f"[{a}]") if family == 6 else (lambda a: a)
    assert vs(d) == {f"SCTP {wrap(a)}:{p}": [f"{wrap(ep_ip)}:80"]
                     for a, p in [(cluster_ip, 80), *((n, 3001) for n in node_ips)]}
    assert members(d, T.NODE_PORT_SCTP, family) == {f"{n},sctp:3001" for n in node_ips}


def test_node_port_sctp_external_traffic_policy_local() -> None:
    """TestNodePortIPv4 "node port service with protocol sctp and externalTrafficPolicy local"."""
    d = sync(service("svc1", "10.20.30.41", port(80, "p80", "SCTP", 3001), type_="NodePort",
                     ns="ns1", externalTrafficPolicy="Local"),
             slice_("svc1", ep("10.180.0.1", TEST_NODE), ep("10.180.1.1", "other-node"),
                    port_name="p80", proto="SCTP", ns="ns1"), ips=("100.101.102.103",))
    assert vs(d) == {"SCTP 10.20.30.41:80": ["10.180.0.1:80", "10.180.1.1:80"],
                     "SCTP 100.101.102.103:3001": ["10.180.0.1:80"]}
    assert members(d, T.NODE_PORT_SCTP) == members(d, T.NODE_PORT_LOCAL_SCTP) == {
        "100.101.102.103,sctp:3001"}
    assert jumps(d, "nat", "KUBE-NODE-PORT") == [
        ("RETURN", "KUBE-NODE-PORT-LOCAL-SCTP-HASH"),
        ("KUBE-MARK-MASQ", "KUBE-NODE-PORT-SCTP-HASH")]


@pytest.mark.parametrize("family,expected", [
    (4, {"TCP 10.20.30.41:80": ["10.180.0.1:80"]}),
    (6, {"TCP [1002:ab8::2:1]:8080": ["[1009:ab8::5:6]:8080"]})])
def test_ip_family_proxier(family: int, expected: dict[str, list[str]]) -> None:
    """TestIPv4Proxier / TestIPv6Proxier (and TestClusterIP): each family programs only its own
    services and endpoints."""
    d = sync(service("svc1", "10.20.30.41", port(80, "p80"), ns="ns1"),
             slice_("svc1", ep("10.180.0.1"), port_name="p80", ns="ns1"),
             service("svc2", "1002:ab8::2:1", port(8080, "p8080"), ns="ns2"),
             slice_("svc2", ep("1009:ab8::5:6"), port=8080, port_name="p8080", ns="ns2",
                    family="IPv6"), family=family)
    assert vs(d) == expected


def test_cluster_ip_no_endpoint() -> None:
    """TestClusterIPNoEndpoint / TestIPv4Proxier "cluster IP service with no endpoints"."""
    assert vs(sync(service("svc1", "10.20.30.41", port(80, "p80"), ns="ns1"))) == {
        "TCP 10.20.30.41:80": []}


@pytest.mark.parametrize("policy,with_eps,expected", [
    ("Cluster", False, []), ("Cluster", True, []), ("Local", True, ["10.180.0.1:80"])],
    ids=["no-endpoint", "protocol-mismatch", "only-local"])
def test_external_ips(policy: str, with_eps: bool, expected: list[str]) -> None:
    """TestExternalIPsNoEndpoint, TestExternalIPs, TestOnlyLocalExternalIPs: the IPv4 proxier
    gets the ClusterIP and the two IPv4 externalIPs (2012::51 is the other family).
    TestExternalIPs' slice port is UDP for a TCP service, so nothing matches (upstream only
    loops over whatever real servers exist). Differs: the third externalIP, 127.0.0.1, is
    refused (the API server refuses a loopback externalIP; upstream's unit test bypasses it)."""
    proto = "UDP" if policy == "Cluster" else "TCP"
    d = desired(service("svc1", "10.20.30.41", port(80, "p80"), ns="ns1",
                     type_="NodePort" if policy == "Local" else "ClusterIP",
                     externalIPs=["50.60.70.81", "2012::51", "127.0.0.1"],
                     externalTrafficPolicy=policy),
             *([slice_("svc1", ep("10.180.0.1", TEST_NODE), ep("10.180.1.1", "other-node"),
                       port_name="p80", proto=proto, ns="ns1")] if with_eps else []),
                node(TEST_NODE), cfg=cfg(), host=host(("lo", "127.0.0.1")))
    assert set(vs(d)) == {"TCP 10.20.30.41:80", "TCP 50.60.70.81:80"}
    assert vs(d)["TCP 50.60.70.81:80"] == expected
    assert addrs(d) == {"10.20.30.41", "50.60.70.81"}
    assert [p for p in problems(d) if "127.0.0.1" in p] == [
        "Service ns1/svc1: externalIP '127.0.0.1' is loopback, which the API server refuses "
        "for a Service address; ignored"]


def test_load_balancer() -> None:
    """TestLoadBalancer (no node IPs, so no NodePort virtual server; the slice is UDP for a TCP
    service, so no real server)."""
    d = sync(service("svc1", "10.20.30.41", port(80, "p80", node_port=3001), ns="ns1",
                     type_="LoadBalancer", ingress=["1.2.3.4"]),
             slice_("svc1", ep("10.180.0.1"), port_name="p80", proto="UDP", ns="ns1"))
    assert vs(d) == {"TCP 10.20.30.41:80": [], "TCP 1.2.3.4:80": []}
    assert members(d, T.LOAD_BALANCER) == {"1.2.3.4,tcp:80"}
    assert jumps(d, "nat", "KUBE-SERVICES") == [
        ("RETURN", ""), ("KUBE-LOAD-BALANCER", "KUBE-LOAD-BALANCER"),
        ("KUBE-MARK-MASQ", "KUBE-CLUSTER-IP"), ("KUBE-NODE-PORT", ""),
        ("ACCEPT", "KUBE-CLUSTER-IP"), ("ACCEPT", "KUBE-LOAD-BALANCER")]
    assert jumps(d, "nat", "KUBE-LOAD-BALANCER") == [("KUBE-MARK-MASQ", "")]


def test_only_local_node_ports() -> None:
    """TestOnlyLocalNodePorts: --nodeport-addresses 100.101.102.0/24 on eth0 100.101.102.103
    and eth1 2001:db8::."""
    d = desired(service("svc1", "10.20.30.41", port(80, "p80", node_port=3001), ns="ns1",
                        type_="NodePort", externalTrafficPolicy="Local"),
                slice_("svc1", ep("10.180.0.1", TEST_NODE), ep("10.180.1.1", "other-node"),
                       port_name="p80", ns="ns1"), node(TEST_NODE, "100.101.102.103"),
                cfg=cfg(nodeport_addresses=(ip_network("100.101.102.0/24"),)),
                host=host(("eth0", "100.101.102.103"), ("eth1", "2001:db8::")))
    assert vs(d) == {"TCP 10.20.30.41:80": ["10.180.0.1:80", "10.180.1.1:80"],
                     "TCP 100.101.102.103:3001": ["10.180.0.1:80"]}
    assert members(d, T.NODE_PORT_TCP) == members(d, T.NODE_PORT_LOCAL_TCP) == {"3001"}
    assert jumps(d, "nat", "KUBE-NODE-PORT") == [
        ("RETURN", "KUBE-NODE-PORT-LOCAL-TCP"), ("KUBE-MARK-MASQ", "KUBE-NODE-PORT-TCP")]
    assert jumps(d, "nat", "KUBE-SERVICES") == [
        ("RETURN", ""), ("KUBE-MARK-MASQ", "KUBE-CLUSTER-IP"), ("KUBE-NODE-PORT", ""),
        ("ACCEPT", "KUBE-CLUSTER-IP")]


def test_health_check_node_port() -> None:
    """TestHealthCheckNodePort: only LoadBalancer + ETP=Local services get their port in the
    set. Differs: upstream's three services share one ClusterIP and nodePort; here each has its
    own (a shared frontend would be a Problem)."""
    svcs = [service(name, f"10.20.30.{41 + i}", port(80, "p80", node_port=3000 + i), ns="ns1",
                    type_="LoadBalancer", externalTrafficPolicy=etp,
                    healthCheckNodePort=30000 + i)
            for i, (name, etp) in enumerate([("valid-svc1", "Local"), ("valid-svc2", "Local"),
                                             ("invalid-svc3", "Cluster")])]
    d = desired(*svcs, node(TEST_NODE, "100.101.102.103"),
                cfg=cfg(nodeport_addresses=(ip_network("100.101.102.0/24"),)),
                host=host(("eth0", "100.101.102.103"), ("eth1", "2001:db8::")))
    assert members(d, T.HEALTH_CHECK_NODE_PORT) == {"30000", "30001"}
    assert jumps(d, "nat", "KUBE-NODE-PORT") == [
        ("RETURN", "KUBE-NODE-PORT-LOCAL-TCP"), ("KUBE-MARK-MASQ", "KUBE-NODE-PORT-TCP")]
    assert jumps(d, "filter", "KUBE-NODE-PORT") == [("ACCEPT", "KUBE-HEALTH-CHECK-NODE-PORT")]


@pytest.mark.parametrize("hc,expected", [(30000, {"30000"}), (30001, {"30001"}), (0, set())])
def test_health_check_node_port_e2e(hc: int, expected: set[str]) -> None:
    """TestHealthCheckNodePortE2E: created, updated (30000 -> 30001), deleted (0: no service)."""
    docs = [service("svc1", "172.20.1.1", port(80), ns="ns1", type_="LoadBalancer",
                    externalTrafficPolicy="Local", healthCheckNodePort=hc)] if hc else []
    assert members(sync(*docs), T.HEALTH_CHECK_NODE_PORT) == expected


def test_load_balancer_source_ranges() -> None:
    """TestLoadBalancerSourceRanges. The node's primary IP is outside 10.0.0.0/8, so node ->
    VIP traffic gets the KUBE-IPVS-OUT-FILTER drop (upstream's fake has no node IP: same)."""
    d = sync(service("svc1", "10.20.30.41", port(80, "p80"), ns="ns1", type_="LoadBalancer",
                     ingress=["1.2.3.4"], loadBalancerSourceRanges=["10.0.0.0/8"]),
             slice_("svc1", ep("10.180.0.1"), port_name="p80", ns="ns1"))
    assert vs(d) == {"TCP 10.20.30.41:80": ["10.180.0.1:80"], "TCP 1.2.3.4:80": ["10.180.0.1:80"]}
    assert members(d, T.LOAD_BALANCER) == members(d, T.LOAD_BALANCER_FW) == {"1.2.3.4,tcp:80"}
    assert members(d, T.LB_SOURCE_CIDR) == {"1.2.3.4,tcp:80,10.0.0.0/8"}
    assert jumps(d, "filter", "KUBE-PROXY-FIREWALL") == [
        ("KUBE-SOURCE-RANGES-FIREWALL", "KUBE-LOAD-BALANCER-FW")]
    assert jumps(d, "filter", "KUBE-SOURCE-RANGES-FIREWALL") == [
        ("RETURN", "KUBE-LOAD-BALANCER-SOURCE-CIDR"), ("DROP", "")]
    assert jumps(d, "filter", "KUBE-IPVS-OUT-FILTER") == [("DROP", "")]


def test_accept_ipvs_traffic() -> None:
    """TestAcceptIPVSTraffic. Differs: upstream gives the ClusterIP service a nodePort too,
    which the API would refuse; it is dropped here (and upstream has no node IPs anyway)."""
    d = sync(service("svc1", "10.20.30.40", port(80, "p80"), ns="ns1",
                     externalIPs=["5.6.7.8"]),
             service("svc2", "10.20.30.41", port(80, "p80", node_port=80), ns="ns1",
                     type_="LoadBalancer", ingress=["1.2.3.4"]),
             service("svc3", "10.20.30.42", port(80, "p80", node_port=80), ns="ns1",
                     type_="NodePort"))
    assert jumps(d, "nat", "KUBE-SERVICES") == [
        ("RETURN", ""), ("KUBE-LOAD-BALANCER", "KUBE-LOAD-BALANCER"),
        ("KUBE-MARK-MASQ", "KUBE-CLUSTER-IP"), ("KUBE-MARK-MASQ", "KUBE-EXTERNAL-IP"),
        ("ACCEPT", "KUBE-EXTERNAL-IP"), ("ACCEPT", "KUBE-EXTERNAL-IP"), ("KUBE-NODE-PORT", ""),
        ("ACCEPT", "KUBE-CLUSTER-IP"), ("ACCEPT", "KUBE-LOAD-BALANCER")]


def test_only_local_load_balancing() -> None:
    """TestOnlyLocalLoadBalancing: the LB VIP uses the local endpoint only."""
    d = sync(service("svc1", "10.20.30.41", port(80, "p80", node_port=3001), ns="ns1",
                     type_="LoadBalancer", ingress=["1.2.3.4"], externalTrafficPolicy="Local"),
             slice_("svc1", ep("10.180.0.1", TEST_NODE), ep("10.180.1.1", "other-node"),
                    port_name="p80", ns="ns1"))
    assert vs(d) == {"TCP 10.20.30.41:80": ["10.180.0.1:80", "10.180.1.1:80"],
                     "TCP 1.2.3.4:80": ["10.180.0.1:80"]}
    assert members(d, T.LOAD_BALANCER) == members(d, T.LOAD_BALANCER_LOCAL) == {"1.2.3.4,tcp:80"}
    assert jumps(d, "nat", "KUBE-LOAD-BALANCER") == [
        ("RETURN", "KUBE-LOAD-BALANCER-LOCAL"), ("KUBE-MARK-MASQ", "")]


def test_session_affinity() -> None:
    """TestSessionAffinity: every virtual server of the port is persistent for 10800 s."""
    d = sync(service("svc1", "10.20.30.41", port(80, "p80", node_port=3001), ns="ns1",
                     type_="NodePort", externalIPs=["50.60.70.81"], sessionAffinity="ClientIP",
                     sessionAffinityConfig={"clientIP": {"timeoutSeconds": 10800}}),
             ips=("100.101.102.103",))
    assert {k: a[1:3] for k, a in vs_attrs(d).items()} == {
        k: (SVC_F_PERSISTENT, 10800) for k in
        ("TCP 10.20.30.41:80", "TCP 50.60.70.81:80", "TCP 100.101.102.103:3001")}


@pytest.mark.parametrize("ports,bound", [
    ([port(1234, "port1"), port(1235, "port2")], {"172.16.55.4"}),
    ([port(1234, "port1")], {"172.16.55.4"}),
    ([port(1234, "port1"), port(1235, "port2"), port(1236, "port3", "UDP")], {"172.16.55.4"}),
    ([], set())], ids=["two-ports", "one-port", "three-ports", "deleted"])
def test_multi_port_service_bind_addr(ports: list[Any], bound: set[str]) -> None:
    """TestMultiPortServiceBindAddr: the ClusterIP stays bound while any port exists (the
    unbind after deletion is in test_plan)."""
    docs = [service("svc1", "172.16.55.4", *ports, ns="ns1")] if ports else []
    assert addrs(sync(*docs)) == bound


def test_endpoint_slice_e2e() -> None:
    """TestEndpointSliceE2E (port 80 instead of upstream's unset service port)."""
    d = sync(service("svc1", "172.20.1.1", port(80), ns="ns1"),
             slice_("svc1", ep("10.0.1.1", TEST_NODE), ep("10.0.1.2", "node2"),
                    ep("10.0.1.3", "node3"), ep("10.0.1.4", "node3", ready=False), ns="ns1"))
    assert members(d, T.LOOP_BACK) == {"10.0.1.1,tcp:80,10.0.1.1"}
    assert vs(d) == {"TCP 172.20.1.1:80": ["10.0.1.1:80", "10.0.1.2:80", "10.0.1.3:80"]}
    assert vs(sync(service("svc1", "172.20.1.1", port(80), ns="ns1"))) == {
        "TCP 172.20.1.1:80": []}  # slice deleted


@pytest.mark.parametrize("itp,nodes,loop_back,expected", [
    ("Cluster", (TEST_NODE, "node1", "node2"), 1, ["10.0.1.1:80", "10.0.1.2:80", "10.0.1.3:80"]),
    ("Cluster", ("node0", "node1", "node2"), 0, ["10.0.1.1:80", "10.0.1.2:80", "10.0.1.3:80"]),
    ("Local", (TEST_NODE, "node1", "node2"), 1, ["10.0.1.1:80"]),
    ("Local", ("node0", "node1", "node2"), 0, []),
], ids=["cluster-local-eps", "cluster-no-local-eps", "local-local-eps", "local-no-local-eps"])
def test_internal_traffic_policy_e2e(itp: str, nodes: tuple[str, ...], loop_back: int,
                                     expected: list[str]) -> None:
    """TestTestInternalTrafficPolicyE2E."""
    d = sync(service("svc1", "172.20.1.1", port(80), ns="ns1", internalTrafficPolicy=itp),
             slice_("svc1", *(ep(f"10.0.1.{i + 1}", n) for i, n in enumerate(nodes)), ns="ns1"))
    assert len(members(d, T.LOOP_BACK)) == loop_back
    assert vs(d) == {"TCP 172.20.1.1:80": expected}


R = {"ready": True, "serving": True, "terminating": False}
TERM = {"ready": False, "serving": True, "terminating": True}
GONE = {"ready": False, "serving": False, "terminating": True}
DOWN = {"ready": False, "serving": False, "terminating": False}


@pytest.mark.parametrize("etp,conds,loop_back,cluster,external", [
    ("Cluster", [(TEST_NODE, R), (TEST_NODE, R), (TEST_NODE, TERM), (TEST_NODE, GONE),
                 ("another-node", R)], 4, [1, 2, 5], [1, 2, 5]),
    ("Local", [(TEST_NODE, R), (TEST_NODE, R), (TEST_NODE, TERM), (TEST_NODE, GONE),
               ("another-node", R)], 4, [1, 2, 5], [1, 2]),
    ("Cluster", [(TEST_NODE, TERM), (TEST_NODE, TERM), (TEST_NODE, GONE), ("another-node", TERM),
                 ("another-node", DOWN)], 3, [1, 2, 4], [1, 2, 4]),
    ("Local", [(TEST_NODE, TERM), (TEST_NODE, TERM), (TEST_NODE, GONE), ("another-node", TERM),
               ("another-node", R)], 3, [5], [1, 2]),
], ids=["ReadyAndTerminatingCluster", "ReadyAndTerminatingLocal",
        "OnlyReadyAndTerminatingCluster", "OnlyReadyAndTerminatingLocal"])
def test_terminating_endpoints(etp: str, conds: list[tuple[str, dict[str, bool]]],
                               loop_back: int, cluster: list[int], external: list[int]) -> None:
    """Test_EndpointSlice{,Only}ReadyAndTerminating{Cluster,Local}: ClusterIP and externalIP
    real servers of a NodePort service with externalIP 1.2.3.4 (no nodePort, as upstream)."""
    d = sync(service("svc1", "172.20.1.1", port(80), ns="ns1", type_="NodePort",
                     externalTrafficPolicy=etp, internalTrafficPolicy="Cluster",
                     externalIPs=["1.2.3.4"]),
             slice_("svc1", *(ep(f"10.0.1.{i + 1}", n, **c) for i, (n, c) in enumerate(conds)),
                    ns="ns1"))
    assert len(members(d, T.LOOP_BACK)) == loop_back
    assert vs(d) == {"TCP 172.20.1.1:80": [f"10.0.1.{i}:80" for i in cluster],
                     "TCP 1.2.3.4:80": [f"10.0.1.{i}:80" for i in external]}


@pytest.mark.parametrize("itp,etp,nodes,no_local", [
    ("Local", "", (TEST_NODE, "node1", "node2"), (False, False)),
    ("", "Local", (TEST_NODE, "node1", "node2"), (False, False)),
    ("Local", "Local", (TEST_NODE, "node1", "node2"), (False, False)),
    ("Local", "", ("node0", "node1", "node2"), (True, False)),
    ("", "Local", ("node0", "node1", "node2"), (False, True)),
    ("Local", "Local", ("node0", "node1", "node2"), (True, True)),
    ("Local", "Local", (), (False, False)),
])
def test_no_local_endpoints_accounting(itp: str, etp: str, nodes: tuple[str, ...],
                                       no_local: tuple[bool, bool]) -> None:
    """TestNoEndpointsMetric: a port counts as "no local endpoints" (internal / external) when
    its policy is Local, it has no local endpoint, and it has endpoints somewhere. Differs: the
    upstream ITP-only cases give a ClusterIP service a nodePort; it is type NodePort here."""
    spec = {"internalTrafficPolicy": itp or "Cluster", "externalTrafficPolicy": etp or "Cluster"}
    svc, _ = parse_service(service("svc1", "172.20.1.1", port(80, "p80", node_port=30000),
                                   ns="ns1", type_="NodePort", **spec))
    sl, _ = parse_endpoint_slice(slice_("svc1", *(ep(f"10.0.1.{i}", n) for i, n in
                                                  enumerate(nodes)), port_name="p80", ns="ns1"))
    assert svc is not None and sl is not None
    sp = svc.ports[0]
    cat = categorize(port_endpoints([sl], sp, 4, TEST_NODE), svc, sp, "", 4)
    missing = cat.has_any and not cat.local
    assert (svc.internal_local and missing, svc.external_local and missing) == no_local


@pytest.mark.parametrize("family,first", [(4, "-s 127.0.0.0/8 -j RETURN"),
                                          (6, "-s ::1/128 -j RETURN")])
def test_dismiss_localhost_rule_exist(family: int, first: str) -> None:
    """TestDismissLocalhostRuleExist."""
    assert chain(sync(family=family), "nat", "KUBE-SERVICES", family)[0] == first


@pytest.mark.parametrize("ip_mode,expected", [("Proxy", 1), ("VIP", 2), (None, 2)])
def test_load_balancer_ingress_route_type_proxy(ip_mode: str | None, expected: int) -> None:
    """TestLoadBalancerIngressRouteTypeProxy, LoadBalancerIPMode enabled (GA)."""
    ing: dict[str, Any] = {"ip": "1.2.3.4", **({"ipMode": ip_mode} if ip_mode else {})}
    d = sync(service("svc1", "10.20.30.41", port(80, "p80", node_port=3001), ns="ns1",
                     type_="LoadBalancer", ingress=[ing]),
             slice_("svc1", ep("10.180.0.1"), port_name="p80", ns="ns1"))
    assert len(vs(d)) == expected


@pytest.mark.parametrize("obj", [
    service("headless", "None", port(1234, "rpc", "UDP"), ns="somewhere-else"),
    service("headless-sctp", "None", port(1235, "sip", "SCTP"), ns="somewhere-else"),
    service("external-name", "172.16.55.4", port(1235, "blah", "UDP"), ns="somewhere-else",
            type_="ExternalName", externalName="foo2.bar.com"),
], ids=["headless", "headless-sctp", "external-name"])
def test_build_service_map_skips(obj: dict[str, Any]) -> None:
    """TestBuildServiceMapServiceHeadless, TestBuildServiceMapServiceTypeExternalName."""
    d = sync(obj)
    assert (vs(d), members(d, T.HEALTH_CHECK_NODE_PORT)) == ({}, set())


def test_create_and_link_kube_chain() -> None:
    """TestCreateAndLinkKubeChain: the chains, in declaration order."""
    d = sync()
    assert list(d.rules[4]["nat"]) == ["KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-NODE-PORT",
                                       "KUBE-LOAD-BALANCER", "KUBE-MARK-MASQ"]
    assert list(d.rules[4]["filter"]) == [
        "KUBE-FORWARD", "KUBE-NODE-PORT", "KUBE-PROXY-FIREWALL", "KUBE-SOURCE-RANGES-FIREWALL",
        "KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER"]


@pytest.mark.parametrize("random_fully", [False, True])
def test_masquerade_rule(random_fully: bool) -> None:
    """TestMasqueradeRule."""
    d = sync(random_fully=random_fully)
    assert chain(d, "nat", "KUBE-POSTROUTING")[-1] == (
        '-m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE'
        + (" --random-fully" if random_fully else ""))


def test_worked_example_of_the_reference() -> None:
    """shared/reference/kube-proxy-ipvs.md §1.6 (not upstream's file, but its write-up)."""
    from tests.unit.worked_example import worked_example

    d = desired(*worked_example(),
                cfg=Config(hostname="node-a", cluster_cidrs=(ip_network("10.244.0.0/16"),)),
                host=host(("lo", "127.0.0.1"), ("eth0", "192.168.1.10"), ("cni0", "10.244.1.1")))
    assert vs(d) == {
        "TCP 10.96.10.10:80": ["10.244.1.5:8080", "10.244.2.7:8080"],
        "TCP 10.96.20.20:8080": ["10.244.1.6:80", "10.244.3.9:80"],
        "TCP 10.96.30.30:443": ["10.244.2.8:8443"],
        "TCP 10.244.1.1:30080": ["10.244.1.6:80"],
        "TCP 10.244.1.1:31443": ["10.244.2.8:8443"],
        "TCP 192.168.1.10:30080": ["10.244.1.6:80"],
        "TCP 192.168.1.10:31443": ["10.244.2.8:8443"],
        "TCP 203.0.113.10:443": ["10.244.2.8:8443"]}
    assert addrs(d) == {"10.96.10.10", "10.96.20.20", "10.96.30.30", "203.0.113.10"}
    assert members(d, T.NODE_PORT_LOCAL_TCP) == {"30080"}
    assert members(d, T.LB_SOURCE_IP) == set()
