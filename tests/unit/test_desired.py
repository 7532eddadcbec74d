"""The desired dataplane, feature by feature: frontends, ipsets, iptables, schedulers, problems.

Plain data in (API objects, a host, a Config), plain data out (virtual servers, set members, rule
lines). Semantics are kube-proxy's IPVS mode (shared/reference/kube-proxy-ipvs.md §1, §4);
deliberate differences are named where a test covers one.
"""

from __future__ import annotations

import argparse
from ipaddress import ip_network
from typing import Any

import pytest

from ipvsproxy.core import tables as T
from ipvsproxy.core.desired import HostFacts
from ipvsproxy.core.ipvs import SVC_F_PERSISTENT, SVC_F_SCHED1, SVC_F_SCHED2
from ipvsproxy.settings.config import Config, ConfigError, add_proxy_flags, from_args
from tests.unit.kube_objects import (
    CFG,
    CFG46,
    NODE,
    addrs,
    chain,
    desired,
    ep,
    host,
    members,
    node,
    nonempty,
    port,
    problems,
    service,
    slice_,
    vs,
    vs_attrs,
    weights,
)

EP = slice_("web", ep("10.244.1.5", NODE), ep("10.244.2.7", "node-b"), port=8080)


def test_cluster_ip_with_endpoints() -> None:
    d = desired(service("web", "10.96.0.10"), EP)
    assert vs(d) == {"TCP 10.96.0.10:80": ["10.244.1.5:8080", "10.244.2.7:8080"]}
    assert addrs(d) == {"10.96.0.10"}
    assert nonempty(d) == {
        T.CLUSTER_IP: {"10.96.0.10,tcp:80"},
        T.LOOP_BACK: {"10.244.1.5,tcp:8080,10.244.1.5"},
        T.IPVS_IPS: {"10.96.0.10"},
        T.OWNED: {"10.96.0.10,tcp:80"},
    }
    assert d.owners and set(d.owners.values()) == {"default/web"}
    assert problems(d) == []


def test_cluster_ip_without_endpoints_still_gets_its_virtual_server() -> None:
    assert vs(desired(service("web", "10.96.0.10"))) == {"TCP 10.96.0.10:80": []}


# NodePort addresses: every node address except kube-ipvs0's, loopback and IPv6 link-local;
# --nodeport-addresses narrows it to CIDRs ("primary" = the Node's own address).
@pytest.mark.parametrize("cfg,expected", [
    (CFG, {"192.168.1.10", "10.244.1.1"}),
    (Config(hostname=NODE, nodeport_addresses=(ip_network("192.168.1.0/24"),)),
     {"192.168.1.10"}),
    (Config(hostname=NODE, nodeport_addresses=(ip_network("0.0.0.0/0"),)),
     {"192.168.1.10", "10.244.1.1"}),
    # only IPv6 CIDRs given: the IPv4 family matches all, as kube-proxy's NodePortAddresses
    (Config(hostname=NODE, nodeport_addresses=(ip_network("2001:db8::/64"),)),
     {"192.168.1.10", "10.244.1.1"}),
    (Config(hostname=NODE, nodeport_addresses=(ip_network("10.0.0.0/8"),)), {"10.244.1.1"}),
    (Config(hostname=NODE, nodeport_primary=True), {"192.168.1.10"}),
    (Config(hostname=NODE, nodeport_addresses=(ip_network("172.16.0.0/12"),)), set()),
], ids=["all", "cidr", "match-all", "other-family-only", "cni-cidr", "primary", "none"])
def test_node_port_addresses(cfg: Config, expected: set[str]) -> None:
    d = desired(service("np", "10.96.0.20", port(80, node_port=30080), type_="NodePort"), EP,
                cfg=cfg)
    got = {k.split()[1].rsplit(":", 1)[0] for k in vs(d) if k.endswith(":30080")}
    assert got == expected
    assert members(d, T.NODE_PORT_TCP) == ({"30080"} if expected else set())
    assert addrs(d) == {"10.96.0.20"}  # node IPs are never bound to kube-ipvs0


def test_primary_node_ip_is_the_first_internal_ip() -> None:
    """GetNodeHostIPs: InternalIPs before ExternalIPs, whatever the status order. (Fixed: the
    first listed address was taken.) The primary IP decides --nodeport-addresses=primary and
    whether the node may reach its own source-ranged LB VIPs."""
    n = node()
    n["status"]["addresses"] = [{"type": "ExternalIP", "address": "10.244.1.1"},
                                {"type": "Hostname", "address": NODE},
                                {"type": "InternalIP", "address": "192.168.1.10"}]
    d = desired(service("lb", "10.96.0.30", port(443, node_port=31443), type_="LoadBalancer",
                        ingress=["203.0.113.10"], loadBalancerSourceRanges=["192.168.1.0/24"]),
                n, cfg=Config(hostname=NODE, nodeport_primary=True))
    assert [k for k in vs(d) if k.endswith(":31443")] == ["TCP 192.168.1.10:31443"]
    assert members(d, T.LB_SOURCE_IP) == {"203.0.113.10,tcp:443,203.0.113.10"}


def test_node_port_ipv6_skips_loopback_and_link_local() -> None:
    d = desired(service("np6", "fd00::20", port(80, node_port=30080), type_="NodePort"),
                cfg=Config(hostname=NODE, families=(6,)))
    assert set(vs(d)) == {"TCP [fd00::20]:80", "TCP [2001:db8::10]:30080"}


def test_node_port_udp_and_sctp_sets() -> None:
    d = desired(
        service("dns", "10.96.0.53", port(53, "u", "UDP", 30053), port(53, "t", "TCP", 30053),
                type_="NodePort"),
        service("sig", "10.96.0.54", port(3868, "s", "SCTP", 30868), type_="NodePort",
                externalTrafficPolicy="Local"))
    assert members(d, T.NODE_PORT_UDP) == {"30053"}
    assert members(d, T.NODE_PORT_TCP) == {"30053"}
    # SCTP NodePorts cannot live in a bitmap: one hash:ip,port entry per node IP
    assert members(d, T.NODE_PORT_SCTP) == {"192.168.1.10,sctp:30868", "10.244.1.1,sctp:30868"}
    assert members(d, T.NODE_PORT_LOCAL_SCTP) == members(d, T.NODE_PORT_SCTP)
    assert chain(d, "nat", "KUBE-NODE-PORT") == [
        '-p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" '
        "-m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ",
        '-p udp -m comment --comment "Kubernetes nodeport UDP port for masquerade purpose" '
        "-m set --match-set KUBE-NODE-PORT-UDP dst -j KUBE-MARK-MASQ",
    # iptables-save escapes the quotes (xtables_save_string); so do we, to compare lines
        '-p sctp -m comment --comment "Kubernetes nodeport SCTP port with externalTrafficPolicy'
        "=local with type \\'hash ip:port\\'\" -m set --match-set KUBE-NODE-PORT-LOCAL-SCTP-HASH "
        "dst,dst -j RETURN",
        '-p sctp -m comment --comment "Kubernetes nodeport SCTP port for masquerade purpose with '
        "type \\'hash ip:port\\'\" -m set --match-set KUBE-NODE-PORT-SCTP-HASH dst,dst "
        "-j KUBE-MARK-MASQ",
    ]


@pytest.mark.parametrize("ingress,expected", [
    (["203.0.113.10"], ["203.0.113.10"]),
    ([{"ip": "203.0.113.10", "ipMode": "VIP"}], ["203.0.113.10"]),
    ([{"ip": "203.0.113.10", "ipMode": "Proxy"}], []),
    ([{"hostname": "lb.example.com"}], []),
    ([{"hostname": "lb.example.com", "ip": "203.0.113.11"}, "2001:db8:1::1"], ["203.0.113.11"]),
], ids=["ip", "vip-mode", "proxy-mode-skipped", "hostname-only-ignored", "v6-other-family"])
def test_load_balancer_ingress(ingress: list[Any], expected: list[str]) -> None:
    d = desired(service("lb", "10.96.0.30", port(443), type_="LoadBalancer", ingress=ingress), EP)
    assert [k for k in vs(d) if ":443" in k] == ["TCP 10.96.0.30:443"] + [
        f"TCP {ip}:443" for ip in expected]
    assert members(d, T.LOAD_BALANCER) == {f"{ip},tcp:443" for ip in expected}
    assert addrs(d) == {"10.96.0.30", *expected}


@pytest.mark.parametrize("kind", ["externalIPs", "ingress"])
def test_external_and_lb_addresses_that_are_node_addresses_are_refused(kind: str) -> None:
    # Deliberate difference (README): kube-proxy programs them, unbound, which lets a tenant's
    # Service take the node's own ports (ssh, the kubelet).
    extra: dict[str, Any] = ({"externalIPs": ["192.168.1.10", "198.51.100.7"]}
                             if kind == "externalIPs"
                             else {"ingress": ["192.168.1.10", "198.51.100.7"]})
    d = desired(service("x", "10.96.0.40", port(8443), type_="LoadBalancer", **extra))
    assert "TCP 192.168.1.10:8443" not in vs(d)
    assert "TCP 198.51.100.7:8443" in vs(d)
    assert addrs(d) == {"10.96.0.40", "198.51.100.7"}
    assert members(d, T.IPVS_IPS) == addrs(d)
    what = "externalIP" if kind == "externalIPs" else "loadBalancer ingress IP"
    hint = ", which only --external-ip-cidrs can allow" if kind == "externalIPs" else ""
    assert problems(d) == [f"Service default/x: {what} 192.168.1.10 is an address of this node "
                           f"(eth0){hint}; ignored"]


@pytest.mark.parametrize("policy,masq_set,accept_set", [
    ("Cluster", T.EXTERNAL_IP, T.EXTERNAL_IP), ("Local", None, T.EXTERNAL_IP_LOCAL)])
def test_external_ips(policy: str, masq_set: str | None, accept_set: str) -> None:
    d = desired(service("ext", "10.96.0.50", port(80), externalIPs=["198.51.100.5"],
                        externalTrafficPolicy=policy), slice_("ext", ep("10.244.2.7")))
    assert vs(d)["TCP 198.51.100.5:80"] == ["10.244.2.7:80"]
    assert members(d, accept_set) == {"198.51.100.5,tcp:80"}
    rules = [r for r in chain(d, "nat", "KUBE-SERVICES") if "EXTERNAL-IP" in r]
    match = f"--match-set {accept_set} dst,dst"
    assert [r.split(match)[1] for r in rules] == (
        [" -j KUBE-MARK-MASQ"] if masq_set else []) + [
        " -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT",
        " -m addrtype --dst-type LOCAL -j ACCEPT"]


# loadBalancerSourceRanges: FW + SOURCE-CIDR always; SOURCE-IP when the node's primary IP is
# allowed, else node -> VIP traffic is dropped by KUBE-IPVS-OUT-FILTER (kube-proxy #119656).
@pytest.mark.parametrize("ranges,source_ip,out_filter", [
    (["198.51.100.0/24"], False, True),
    (["198.51.100.0/24", "192.168.1.0/24"], True, False),
    (["2001:db8::/32"], False, False),  # only other-family ranges: no firewall at all
])
def test_load_balancer_source_ranges(ranges: list[str], source_ip: bool, out_filter: bool
                                     ) -> None:
    d = desired(service("lb", "10.96.0.30", port(443), type_="LoadBalancer",
                        ingress=["203.0.113.10"], loadBalancerSourceRanges=ranges), EP)
    v4 = [r for r in ranges if ":" not in r]
    assert members(d, T.LOAD_BALANCER_FW) == ({"203.0.113.10,tcp:443"} if v4 else set())
    assert members(d, T.LB_SOURCE_CIDR) == {f"203.0.113.10,tcp:443,{r}" for r in v4}
    assert members(d, T.LB_SOURCE_IP) == (
        {"203.0.113.10,tcp:443,203.0.113.10"} if source_ip else set())
    assert chain(d, "filter", "KUBE-IPVS-OUT-FILTER") == (
        ["-s 203.0.113.10/32 -m ipvs --vproto 6 --vaddr 203.0.113.10 --vport 443 -j DROP"]
        if out_filter else [])
    assert chain(d, "filter", "KUBE-SOURCE-RANGES-FIREWALL")[-1] == "-j DROP"


@pytest.mark.parametrize("affinity,expected", [
    ({}, (0, 0)),
    ({"sessionAffinity": "ClientIP"}, (SVC_F_PERSISTENT, 10800)),
    ({"sessionAffinity": "ClientIP",
      "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}, (SVC_F_PERSISTENT, 60)),
], ids=["none", "default-timeout", "timeout"])
def test_session_affinity_on_every_virtual_server_of_the_port(
        affinity: dict[str, Any], expected: tuple[int, int]) -> None:
    d = desired(service("s", ["10.96.0.60", "fd00::60"], port(80, node_port=30060),
                        type_="NodePort", externalIPs=["198.51.100.6"], **affinity),
                cfg=CFG46)
    attrs = vs_attrs(d)
    assert len(attrs) == 6  # ClusterIP, externalIP, 2 IPv4 node IPs, IPv6 ClusterIP + node IP
    for key, (_sched, flags, timeout, netmask) in attrs.items():
        assert (flags, timeout) == expected, key
        assert netmask == (128 if "[" in key else 0xFFFFFFFF)  # persistence per client IP


@pytest.mark.parametrize("annotations,default,expected", [
    ({}, "rr", ("rr", 0)),
    ({}, "wlc", ("wlc", 0)),
    ({"ipvsproxy.io/scheduler": "sh"}, "rr", ("sh", 0)),
    ({"ipvsproxy.io/scheduler": "sh", "ipvsproxy.io/scheduler-flags": "sh-fallback,sh-port"},
     "rr", ("sh", SVC_F_SCHED1 | SVC_F_SCHED2)),
    ({}, "mh", ("mh", SVC_F_SCHED2)),  # kube-proxy: mh always gets mh-port (FlagSourceHash)
    ({"ipvsproxy.io/scheduler": "mh"}, "rr", ("mh", SVC_F_SCHED2)),
    ({"ipvsproxy.io/scheduler": "mh", "ipvsproxy.io/scheduler-flags": "mh-fallback"}, "rr",
     ("mh", SVC_F_SCHED1)),  # explicit flags replace the default
], ids=["default-rr", "flag-default", "annotation", "annotation-flags", "mh-default",
        "mh-annotation", "mh-explicit-flags"])
def test_scheduler(annotations: dict[str, str], default: str, expected: tuple[str, int]
                   ) -> None:
    d = desired(service("web", "10.96.0.10", annotations=annotations),
                cfg=Config(hostname=NODE, scheduler=default))
    assert [a[:2] for a in vs_attrs(d).values()] == [expected]


def test_invalid_scheduler_annotation_is_a_problem_and_the_default_is_used() -> None:
    d = desired(service("web", "10.96.0.10", annotations={"ipvsproxy.io/scheduler": "no such"}))
    assert [a[0] for a in vs_attrs(d).values()] == ["rr"]
    assert problems(d) == ["Service default/web: annotation ipvsproxy.io/scheduler='no such' "
                           "is not an IPVS scheduler (dh, fo, lblc, lblcr, lc, mh, nq, ovf, rr, "
                           "sed, sh, twos, wlc, wrr); using the default"]


@pytest.mark.parametrize("raw,weight,problem", [
    (None, 1, False), ("0", 0, False), ("5", 5, False), ("65535", 65535, False),
    ("65536", 1, True), ("-1", 1, True), ("heavy", 1, True), ("", 1, True)])
def test_slice_weight_annotation(raw: str | None, weight: int, problem: bool) -> None:
    d = desired(service("web", "10.96.0.10"),
                slice_("web", ep("10.244.1.5"), name="web-w", weight=raw))
    assert weights(d) == {"TCP 10.96.0.10:80": {"10.244.1.5:80": weight}}
    assert [p.startswith("EndpointSlice default/web-w: annotation ipvsproxy.io/weight")
            for p in problems(d)] == ([True] if problem else [])


@pytest.mark.parametrize("obj", [
    service("hl", "None"),
    service("en", "10.96.0.70", type_="ExternalName", externalName="db.example.com"),
    service("other", "10.96.0.71", labels={"service.kubernetes.io/service-proxy-name": "x"}),
    service("hll", "10.96.0.72", labels={"service.kubernetes.io/headless": ""}),
], ids=["headless", "external-name", "service-proxy-name", "headless-label"])
def test_skipped_services(obj: dict[str, Any]) -> None:
    d = desired(obj, slice_(obj["metadata"]["name"], ep("10.244.1.5", NODE)))
    assert (vs(d), addrs(d), problems(d)) == ({}, set(), [])
    assert members(d, T.LOOP_BACK) == set()


def test_invalid_objects_are_problems_naming_them_and_neighbours_are_unaffected() -> None:
    d = desired(
        service("bad-ip", "10.96.0.999"),
        service("bad-port", "10.96.0.81", port(70000, "a"), port(81, "b")),
        service("good", "10.96.0.82"),
        slice_("good", ep("10.244.1.5"), ep("not-an-ip"), name="good-1"),
        {"kind": "EndpointSlice", "metadata": {"namespace": "default", "name": "odd",
                                               "labels": {"kubernetes.io/service-name": "good"}},
         "addressType": "MAC"})
    assert vs(d) == {"TCP 10.96.0.81:81": [], "TCP 10.96.0.82:80": ["10.244.1.5:80"]}
    got = problems(d)
    assert len(got) == 4, got
    for who in ("Service default/bad-ip:", "Service default/bad-port: spec.ports[0]",
                "EndpointSlice default/good-1: endpoints[1]", "EndpointSlice default/odd:"):
        assert any(p.startswith(who) for p in got), who


def test_one_frontend_claimed_twice_is_a_problem_and_the_first_service_keeps_it() -> None:
    d = desired(service("a", "10.96.0.90", externalIPs=["198.51.100.9"]),
                service("b", "10.96.0.91", externalIPs=["198.51.100.9"]))
    assert d.owners[next(k for k in d.services if str(k) == "TCP 198.51.100.9:80")] == "default/a"
    assert problems(d) == ["Service default/b: external-ip TCP 198.51.100.9:80 is already used "
                           "by default/a; ignored"]


@pytest.mark.parametrize("ranges,firewalled", [
    (["0.0.0.0/0", "198.51.100.0/24"], False),  # a zero-masked range of a family: allow any
    (["::/0", "198.51.100.0/24"], True),  # ... only for its own family
    (["10.0.0.0/0"], False),  # any zero mask (proxyutil.IsZeroCIDR looks at the length only)
])
def test_a_zero_masked_source_range_allows_any(ranges: list[str], firewalled: bool) -> None:
    """serviceport.go: kube-proxy drops a family's ranges when one is a /0. It used to reach the
    ipset writer, which refuses a /0 in a hash:net set, and fail the whole sync (found by the
    differential suite)."""
    d = desired(service("lb", "10.96.0.30", port(443), type_="LoadBalancer",
                        ingress=["203.0.113.10"], loadBalancerSourceRanges=ranges), EP)
    assert members(d, T.LOAD_BALANCER_FW) == ({"203.0.113.10,tcp:443"} if firewalled else set())
    assert members(d, T.LB_SOURCE_CIDR) == (
        {"203.0.113.10,tcp:443,198.51.100.0/24"} if firewalled else set())
    assert problems(d) == []


def test_an_address_that_is_externalip_and_lb_ip_of_one_service_has_both_roles() -> None:
    """One virtual server, in the externalIP set and the LoadBalancer sets with its source-range
    firewall, as kube-proxy programs it (found by the differential suite: it used to be
    "already used" and lost its firewall)."""
    d = desired(service("lb", "10.96.0.30", port(443), type_="LoadBalancer",
                        externalIPs=["203.0.113.10"], ingress=["203.0.113.10"],
                        loadBalancerSourceRanges=["198.51.100.0/24"]), EP)
    assert "TCP 203.0.113.10:443" in vs(d)
    assert members(d, T.EXTERNAL_IP) == {"203.0.113.10,tcp:443"}
    assert members(d, T.LOAD_BALANCER) == {"203.0.113.10,tcp:443"}
    assert members(d, T.LOAD_BALANCER_FW) == {"203.0.113.10,tcp:443"}
    assert members(d, T.LB_SOURCE_CIDR) == {"203.0.113.10,tcp:443,198.51.100.0/24"}
    assert problems(d) == []


def test_loop_back_holds_every_local_endpoint_whatever_its_state() -> None:
    d = desired(service("web", "10.96.0.10"), slice_(
        "web", ep("10.244.1.5", NODE), ep("10.244.1.6", NODE, ready=False),
        ep("10.244.1.7", NODE, ready=False, serving=False, terminating=True),
        ep("10.244.2.7", "node-b"), port=8080))
    assert members(d, T.LOOP_BACK) == {f"10.244.1.{i},tcp:8080,10.244.1.{i}" for i in (5, 6, 7)}
    assert vs(d) == {"TCP 10.96.0.10:80": ["10.244.1.5:8080", "10.244.2.7:8080"]}


@pytest.mark.parametrize("type_,policy,expected", [
    ("LoadBalancer", "Local", {"32000"}), ("LoadBalancer", "Cluster", set()),
    ("NodePort", "Local", set())])
def test_health_check_node_port(type_: str, policy: str, expected: set[str]) -> None:
    d = desired(service("lb", "10.96.0.30", port(443, node_port=31443), type_=type_,
                        externalTrafficPolicy=policy, healthCheckNodePort=32000))
    assert members(d, T.HEALTH_CHECK_NODE_PORT) == expected
    assert chain(d, "filter", "KUBE-NODE-PORT") == [
        '-m comment --comment "Kubernetes health check node port" '
        "-m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT"]


def test_health_check_node_port_skipped_when_no_node_ip_serves_node_ports() -> None:
    """kube-proxy quirk (a `continue` in syncProxyRules): no node IPs, no health-check entry."""
    d = desired(service("lb", "10.96.0.30", port(443, node_port=31443), type_="LoadBalancer",
                        externalTrafficPolicy="Local", healthCheckNodePort=32000),
                host=HostFacts())
    assert members(d, T.HEALTH_CHECK_NODE_PORT) == set()


MASQ = '-m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" '


@pytest.mark.parametrize("cfg,expected", [
    (Config(hostname=NODE, masquerade_all=True),
     [MASQ + "-m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ"]),
    (Config(hostname=NODE, cluster_cidrs=(ip_network("10.244.0.0/16"),)),
     ["! -s 10.244.0.0/16 " + MASQ + "-m set --match-set KUBE-CLUSTER-IP dst,dst "
      "-j KUBE-MARK-MASQ"]),
    (CFG, [MASQ + "-m set --match-set KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ"]),
], ids=["masquerade-all", "cluster-cidr", "neither"])
def test_cluster_ip_masquerade_rule(cfg: Config, expected: list[str]) -> None:
    d = desired(service("web", "10.96.0.10"), cfg=cfg)
    assert [r for r in chain(d, "nat", "KUBE-SERVICES") if "MARK-MASQ" in r] == expected


def test_cluster_cidr_masquerade_is_per_family() -> None:
    cfg = Config(hostname=NODE, families=(4, 6),
                 cluster_cidrs=(ip_network("10.244.0.0/16"), ip_network("fd00:244::/56")))
    d = desired(service("ds", ["10.96.0.11", "fd00::11"]), cfg=cfg)
    assert [r.split(" -m ")[0] for r in chain(d, "nat", "KUBE-SERVICES", 4) if "MASQ" in r] == [
        "! -s 10.244.0.0/16"]
    assert [r.split(" -m ")[0] for r in chain(d, "nat", "KUBE-SERVICES", 6) if "MASQ" in r] == [
        "! -s fd00:244::/56"]


def test_two_cluster_cidrs_of_one_family_are_refused() -> None:
    """As kube-proxy's validation: `! -s A` then `! -s B` would masquerade all traffic."""
    parser = argparse.ArgumentParser()
    add_proxy_flags(parser)

    def parse(cidrs: str) -> Config:
        return from_args(parser.parse_args(["--hostname-override", NODE, "--ip-families", "4,6",
                                            "--cluster-cidr", cidrs]))

    assert len(parse("10.244.0.0/16,fd00:244::/56").cluster_cidrs) == 2
    with pytest.raises(ConfigError, match="at most one CIDR per IP family"):
        parse("10.244.0.0/16,10.245.0.0/16")


def test_ipv6_family_names_and_rules() -> None:
    d = desired(service("web6", "fd00::10"), slice_("web6", ep("fd00:244::5", NODE),
                                                     family="IPv6"),
                cfg=Config(hostname=NODE, families=(6,)))
    assert vs(d) == {"TCP [fd00::10]:80": ["[fd00:244::5]:80"]}
    assert nonempty(d) == {
        "KUBE-6-CLUSTER-IP": {"fd00::10,tcp:80"},
        "KUBE-6-LOOP-BACK": {"fd00:244::5,tcp:80,fd00:244::5"},
        "KUBE-6-IPVS-IPS": {"fd00::10"},
        "IPVSPROXY-OWNED-VS-6": {"fd00::10,tcp:80"},
    }
    assert {s.name for s in d.specs} >= {"KUBE-6-LOAD-BALANCER-SOURCE-CID",
                                         "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS"}  # cut at 31
    assert chain(d, "nat", "KUBE-SERVICES", 6)[0] == "-s ::1/128 -j RETURN"
    assert chain(d, "filter", "KUBE-IPVS-FILTER", 6)[-1] == (
        "-m conntrack --ctstate NEW -m set --match-set KUBE-6-IPVS-IPS dst "
        "-j REJECT --reject-with icmp6-port-unreachable")


def test_dual_stack_service_is_programmed_in_each_family() -> None:
    d = desired(service("ds", ["10.96.0.11", "fd00::11"]),
                slice_("ds", ep("10.244.1.5")), slice_("ds", ep("fd00:244::5"), family="IPv6"),
                service("v6only", "fd00::12"), cfg=CFG46)
    assert vs(d) == {"TCP 10.96.0.11:80": ["10.244.1.5:80"],
                     "TCP [fd00::11]:80": ["[fd00:244::5]:80"], "TCP [fd00::12]:80": []}
    single = desired(service("v6only", "fd00::12"), cfg=CFG)
    assert vs(single) == {}


def test_sysctls_and_timeouts() -> None:
    cfg = Config(hostname=NODE, strict_arp=True, tcp_timeout=900, udp_timeout=30)
    old = desired(cfg=cfg, host=host(("eth0", "192.168.1.10")))
    assert dict(old.sysctls) == {
        "net/ipv4/vs/conntrack": "1", "net/ipv4/vs/expire_nodest_conn": "1",
        "net/ipv4/vs/expire_quiescent_template": "1", "net/ipv4/ip_forward": "1",
        "net/ipv4/conf/all/arp_ignore": "1", "net/ipv4/conf/all/arp_announce": "2"}
    assert (old.timeouts.tcp, old.timeouts.tcp_fin, old.timeouts.udp) == (900, 0, 30)
    legacy = desired(host=HostFacts(kernel=(5, 4)))  # 4.1 <= kernel < 5.9 (kube-proxy #93297)
    assert ("net/ipv4/vs/conn_reuse_mode", "0") in legacy.sysctls
    assert desired().timeouts is None
