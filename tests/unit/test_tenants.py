"""No tenant takes another's traffic (issue 23): address claims are settled by authority, not by
names or order; tenant-written addresses stay out of the cluster's ranges and the node's own
addresses; and every input gets the API server's address and name validation."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from ipaddress import ip_network
from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.core.desired import Desired
from ipvsproxy.core.model import Problem
from ipvsproxy.settings.config import Config
from tests.unit.kube_objects import (
    NODE,
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

OLD, NEW = "2024-01-01T00:00:00Z", "2025-06-01T00:00:00Z"


def aged(obj: dict[str, Any], created: str | None = None, uid: str | None = None
         ) -> dict[str, Any]:
    if created:
        obj["metadata"]["creationTimestamp"] = created
    if uid:
        obj["metadata"]["uid"] = uid
    return obj


def owner(d: Desired, key: str) -> str:
    return next(d.owners[k] for k in d.services if str(k) == key)


def attacker_and_victim(attacker_ns: str, victim_ns: str, attacker_older: bool
                        ) -> list[dict[str, Any]]:
    """Issue 23's first file: t1/a lists the victim's ClusterIP as an externalIP."""
    a_time, v_time = (OLD, NEW) if attacker_older else (NEW, OLD)
    return [
        aged(service("a", "10.96.0.50", port(80, "p"), type_="LoadBalancer", ns=attacker_ns,
                     externalIPs=["10.96.0.60"]), a_time),
        slice_("a", ep("10.244.9.9", NODE), port_name="p", ns=attacker_ns),
        aged(service("victim", "10.96.0.60", port(80, "http"), ns=victim_ns), v_time),
        slice_("victim", ep("10.244.1.5", NODE), port_name="http", ns=victim_ns),
    ]


@pytest.mark.parametrize("attacker_ns,victim_ns", [("t1", "t2"), ("t2", "t1"), ("a1", "a0"),
                                                   ("a0", "a1"), ("z", "a"), ("a", "z")])
@pytest.mark.parametrize("attacker_older", [True, False])
def test_an_external_ip_never_takes_another_services_cluster_ip(
        attacker_ns: str, victim_ns: str, attacker_older: bool) -> None:
    objs = attacker_and_victim(attacker_ns, victim_ns, attacker_older)
    for order in itertools.permutations(objs):
        d = desired(*order)
        assert owner(d, "TCP 10.96.0.60:80") == f"{victim_ns}/victim:http"
        assert vs(d)["TCP 10.96.0.60:80"] == ["10.244.1.5:80"]
        assert vs(d)["TCP 10.96.0.50:80"] == ["10.244.9.9:80"]  # the attacker keeps its own
        said = [p for p in problems(d) if "10.96.0.60" in p]
        assert said == [f"Service {attacker_ns}/a: external-ip TCP 10.96.0.60:80 is the "
                        f"ClusterIP of {victim_ns}/victim:http; ignored"]


@pytest.mark.parametrize("victims", [("t2", "t3"), ("a0", "a1"), ("a0", "z9")])
def test_a_load_balancer_ip_never_takes_cluster_ips(victims: tuple[str, str]) -> None:
    """Issue 23's second file: one valid attacker (t1, port web) whose LoadBalancer ingress
    lists two victims' ClusterIPs."""
    objs = [aged(service("a", "10.96.0.50", port(80, "web"), type_="LoadBalancer", ns="t1",
                         ingress=["10.96.0.61", "10.96.0.62"]), OLD),
            slice_("a", ep("10.244.9.9", NODE), port_name="web", ns="t1")]
    for i, ns in enumerate(victims):
        objs += [aged(service("victim", f"10.96.0.6{i + 1}", port(80, "http"), ns=ns), NEW),
                 slice_("victim", ep(f"10.244.1.{i + 5}", NODE), port_name="http", ns=ns)]
    for order in itertools.permutations(objs):
        d = desired(*order)
        for i, ns in enumerate(victims):
            key = f"TCP 10.96.0.6{i + 1}:80"
            assert owner(d, key) == f"{ns}/victim:http"
            assert vs(d)[key] == [f"10.244.1.{i + 5}:80"]
        assert len([p for p in problems(d) if "is the ClusterIP of" in p]) == 2


@pytest.mark.parametrize("names", [("t1", "t2"), ("t2", "t1")])
def test_between_equal_claims_the_older_service_wins(names: tuple[str, str]) -> None:
    older, newer = names
    objs = [aged(service("s", "10.96.0.70", ns=older, externalIPs=["198.51.100.9"]), OLD),
            aged(service("s", "10.96.0.71", ns=newer, externalIPs=["198.51.100.9"]), NEW)]
    for order in itertools.permutations(objs):
        d = desired(*order)
        assert owner(d, "TCP 198.51.100.9:80") == f"{older}/s"
        assert [p for p in problems(d) if "198.51.100.9" in p] == [
            f"Service {newer}/s: external-ip TCP 198.51.100.9:80 is already used by {older}/s; "
            "ignored"]


def test_same_age_goes_to_the_lower_uid_then_the_name() -> None:
    a = aged(service("s", "10.96.0.70", ns="zz", externalIPs=["198.51.100.9"]), OLD, "1-uid")
    b = aged(service("s", "10.96.0.71", ns="aa", externalIPs=["198.51.100.9"]), OLD, "2-uid")
    assert owner(desired(b, a), "TCP 198.51.100.9:80") == "zz/s"
    # without a timestamp a Service counts as the youngest
    c = service("s", "10.96.0.72", ns="a", externalIPs=["198.51.100.9"])
    assert owner(desired(c, b), "TCP 198.51.100.9:80") == "aa/s"
    assert desired(c, b).owners == desired(b, c).owners


TENANT = [service("t", "10.96.0.80", port(80, "http"), type_="LoadBalancer", ns="t1",
                  externalIPs=["10.96.5.5", "192.168.1.10", "203.0.113.7", "198.51.100.7"],
                  ingress=["10.97.0.1", "198.51.100.8"])]


def test_tenant_addresses_inside_the_service_range_or_the_nodes_are_refused() -> None:
    d = desired(*TENANT, cfg=Config(hostname=NODE,
                                    service_cidrs=(ip_network("10.96.0.0/16"),)))
    assert set(vs(d)) == {"TCP 10.96.0.80:80", "TCP 203.0.113.7:80", "TCP 198.51.100.7:80",
                          "TCP 10.97.0.1:80", "TCP 198.51.100.8:80"}
    assert sorted(problems(d)) == [
        "Service t1/t: externalIP 10.96.5.5 is inside the service range 10.96.0.0/16; ignored",
        "Service t1/t: externalIP 192.168.1.10 is an address of this node (eth0), which only "
        "--external-ip-cidrs can allow; ignored"]


def test_service_cidr_objects_count_as_service_ranges() -> None:
    cidr = {"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
            "metadata": {"name": "extra"}, "spec": {"cidrs": ["10.97.0.0/24", "fd00:97::/112"]}}
    d = desired(*TENANT, cidr)
    assert "TCP 10.97.0.1:80" not in vs(d)
    assert "Service t1/t: loadBalancer ingress IP 10.97.0.1 is inside the service range " \
        "10.97.0.0/24; ignored" in problems(d)
    bad = {"kind": "ServiceCIDR", "metadata": {"name": "bad"}, "spec": {"cidrs": ["10.0.0.1/8"]}}
    assert "ServiceCIDR bad: spec.cidrs entry '10.0.0.1/8' is not a CIDR; ignored" in \
        problems(desired(*TENANT, bad))


def test_the_external_ip_allow_list() -> None:
    cfg = Config(hostname=NODE, external_ip_cidrs=(ip_network("203.0.113.0/24"),))
    d = desired(*TENANT, cfg=cfg)
    assert "TCP 203.0.113.7:80" in vs(d)
    assert "TCP 198.51.100.7:80" not in vs(d)
    assert "TCP 198.51.100.8:80" in vs(d)  # the allow-list is for externalIPs only
    assert "Service t1/t: externalIP 198.51.100.7 is outside --external-ip-cidrs; ignored" \
        in problems(d)


SPECIAL = ["0.0.0.0", "127.0.0.1", "169.254.169.254", "224.0.0.251", "::", "::1", "fe80::1",
           "ff02::1"]


@pytest.mark.parametrize("addr", SPECIAL)
def test_special_addresses_are_refused_for_endpoints_and_service_addresses(addr: str) -> None:
    fam = "IPv6" if ":" in addr else "IPv4"
    cip = "fd00:96::10" if ":" in addr else "10.96.0.10"
    from tests.unit.kube_objects import CFG46
    d = desired(service("s", cip, port(80, "http"), type_="LoadBalancer",
                        externalIPs=[addr], ingress=[addr]),
                slice_("s", ep(addr, NODE), ep("fd00:244::5" if ":" in addr else "10.244.1.5",
                                               NODE), port_name="http", family=fam), cfg=CFG46)
    assert list(vs(d)) == [f"TCP {'[' + cip + ']' if ':' in cip else cip}:80"]
    assert len(vs(d)[next(iter(vs(d)))]) == 1  # only the ordinary endpoint
    got = problems(d)
    assert len(got) == 3, got
    assert all(addr in p and ("refuses" in p) for p in got), got


def test_port_names_must_be_dns_labels_and_text_is_escaped() -> None:
    d = desired(service("s", "10.96.0.10", port(80, "bad\nname"), port(81, "ok")),
                slice_("s", ep("10.244.1.5", NODE), ports=[
                    {"name": "x\ry", "port": 8080, "protocol": "TCP"},
                    {"name": "ok", "port": 8081, "protocol": "TCP"}]))
    assert vs(d) == {"TCP 10.96.0.10:81": ["10.244.1.5:8081"]}
    for p in problems(d):
        assert "\n" not in p and "\r" not in p
    assert any("'bad\\nname'" in p for p in problems(d))
    assert str(Problem("Service", "ns", "a\nb", "x\x1b[31m")) == "Service ns/a\\nb: x\\x1b[31m"


def test_invalid_names_are_refused() -> None:
    d = desired(service("Bad_Name", "10.96.0.10"), service("1abc", "10.96.0.11"),
                service("ok", "10.96.0.12", ns="Not-A-Label"), service("fine", "10.96.0.13"))
    assert list(vs(d)) == ["TCP 10.96.0.13:80"]
    assert len(problems(d)) == 3


def test_the_command_line_on_the_issues_file(tmp_path: Path) -> None:
    """`ipvsproxy sync --once --from-file F -o json`, as the issue tried it, on the host."""
    objs = attacker_and_victim("t1", "t2", attacker_older=True)
    objs[0]["spec"]["externalIPs"] += ["0.0.0.0", "127.0.0.1", "169.254.169.254"]
    objs[1]["endpoints"] += [ep("127.0.0.1", NODE), ep("169.254.169.254", NODE)]
    f = tmp_path / "f.json"
    f.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    out = subprocess.run([sys.executable, "-m", "ipvsproxy", "sync", "--once", "--from-file",
                          str(f), "-o", "json", "--hostname-override", NODE, "--ip-families",
                          "4"], capture_output=True, text=True, check=True)
    programmed = json.dumps(json.loads(out.stdout)["virtual_servers"])
    assert "t2/victim:http" in programmed
    assert "169.254" not in programmed and "127.0.0.1" not in programmed and "0.0.0.0" \
        not in programmed
    warnings = [w for w in out.stderr.splitlines() if w.startswith("warning:")]
    assert any("is the ClusterIP of t2/victim:http" in w for w in warnings)
    assert sum("refuses" in w for w in warnings) == 5, warnings


def test_an_unquoted_yaml_timestamp_orders_as_the_api_servers_text(tmp_path: Path) -> None:
    from ipvsproxy.core.cluster import build_snapshot
    from ipvsproxy.inputs.manifests import load_objects

    f = tmp_path / "s.yaml"
    f.write_text("kind: Service\nmetadata: {namespace: a, name: s, "
                 "creationTimestamp: 2024-01-01T10:00:00Z}\n"
                 "spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n"
                 "---\nkind: Service\nmetadata: {namespace: b, name: s, "
                 "creationTimestamp: \"2023-01-01T10:00:00Z\"}\n"
                 "spec: {clusterIP: 10.96.0.2, ports: [{port: 80}]}\n")
    snap = build_snapshot(load_objects(str(f)), NODE)
    assert sorted(s.created for s in snap.services) == ["2023-01-01T10:00:00Z",
                                                        "2024-01-01T10:00:00Z"]


def test_ambiguous_ipv4_spellings_are_refused() -> None:
    """Leading zeros ("010.244.1.5") and IPv4-mapped IPv6 ("::ffff:203.0.113.5"), which the API
    server still lets into legacy fields and kube-proxy reads as decimal IPv4 (ParseIPSloppy),
    are refused with a warning, the rest programmed (a deliberate difference, README)."""
    d = desired(service("web", "10.96.0.10", externalIPs=["::ffff:203.0.113.5", "198.51.100.7"]),
                slice_("web", ep("010.244.1.5"), ep("10.244.1.6")),
                service("zeros", "10.96.0.11", externalIPs=["203.000.113.6"]))
    assert vs(d) == {"TCP 10.96.0.10:80": ["10.244.1.6:80"],
                     "TCP 198.51.100.7:80": ["10.244.1.6:80"], "TCP 10.96.0.11:80": []}
    got = problems(d)
    for text in ("::ffff:203.0.113.5", "010.244.1.5", "203.000.113.6"):
        assert any(text in p for p in got), (text, got)


# ------------------------------------------------------------- issue 32: the second round


@pytest.mark.parametrize("names", [("t1", "t2"), ("t2", "t1")])
def test_a_load_balancer_ip_outranks_an_older_services_external_ip(names: tuple[str, str]
                                                                   ) -> None:
    """Item 1: a Service created in 2024 that adds `externalIPs: [203.0.113.50]` today does not
    take port 443 of another namespace's LoadBalancer whose status says 203.0.113.50: status is
    written by the load balancer's controller, externalIPs by any editor of a Service."""
    tenant, owner_ns = names
    objs = [aged(service("grab", "10.96.0.70", port(443, "https"), ns=tenant,
                         externalIPs=["203.0.113.50"]), OLD),
            slice_("grab", ep("10.244.9.9", NODE), port=443, port_name="https", ns=tenant),
            aged(service("lb", "10.96.0.71", port(443, "https"), ns=owner_ns,
                         type_="LoadBalancer", ingress=["203.0.113.50"]), NEW),
            slice_("lb", ep("10.244.1.5", NODE), port=443, port_name="https", ns=owner_ns)]
    for order in itertools.permutations(objs):
        d = desired(*order)
        assert owner(d, "TCP 203.0.113.50:443") == f"{owner_ns}/lb:https"
        assert vs(d)["TCP 203.0.113.50:443"] == ["10.244.1.5:443"]
        assert [p for p in problems(d) if "203.0.113.50" in p] == [
            f"Service {tenant}/grab: external-ip TCP 203.0.113.50:443 is the LoadBalancer IP "
            f"of {owner_ns}/lb:https; ignored"]


POD_NET = Config(hostname=NODE, cluster_cidrs=(ip_network("10.244.0.0/16"),))


def test_tenant_addresses_inside_the_pod_network_are_refused() -> None:
    """Item 2: an externalIP equal to another tenant's pod IP would send that pod's port, from
    every node, to the attacker's endpoints; an ingress IP there too."""
    attack = service("a", "10.96.0.50", port(8080), type_="LoadBalancer", ns="t1",
                     externalIPs=["10.244.1.5"], ingress=["10.244.2.9"])
    d = desired(attack, slice_("a", ep("10.244.9.9", NODE), port=8080, ns="t1"), cfg=POD_NET)
    assert set(vs(d)) == {"TCP 10.96.0.50:8080"}
    assert sorted(problems(d)) == [
        "Service t1/a: externalIP 10.244.1.5 is inside the pod network (--cluster-cidr) "
        "10.244.0.0/16; ignored",
        "Service t1/a: loadBalancer ingress IP 10.244.2.9 is inside the pod network "
        "(--cluster-cidr) 10.244.0.0/16; ignored"]
    # without --cluster-cidr, the Node's own spec.podCIDRs are known all the same
    n = node()
    n["spec"] = {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00:244:1::/64"]}
    d = desired(attack, n)
    assert "TCP 10.244.1.5:8080" not in vs(d) and "TCP 10.244.2.9:8080" in vs(d)
    assert "Service t1/a: externalIP 10.244.1.5 is inside this node's podCIDR 10.244.1.0/24; " \
        "ignored" in problems(d)


def test_other_nodes_addresses_are_refused_inside_the_node_network() -> None:
    """Item 2: another node's address is not known without watching every Node; the operator
    says where the nodes live (--node-network-cidrs) and externalIPs there are refused."""
    attack = service("a", "10.96.0.50", port(10250), ns="t1", externalIPs=["192.168.1.11"])
    assert "TCP 192.168.1.11:10250" in vs(desired(attack))  # unknown: served (and bound)
    cfg = Config(hostname=NODE, node_network_cidrs=(ip_network("192.168.1.0/24"),))
    d = desired(attack, cfg=cfg)
    assert "TCP 192.168.1.11:10250" not in vs(d)
    assert problems(d) == [
        "Service t1/a: externalIP 192.168.1.11 is inside the node network 192.168.1.0/24 "
        "(--node-network-cidrs), which only --external-ip-cidrs can allow; ignored"]


def test_the_operator_may_allow_node_addresses_as_external_ips() -> None:
    """Item 3: bare-metal ingress published on the nodes' own IPs through externalIPs. Inside
    --external-ip-cidrs a node's address is served, without binding it to kube-ipvs0 (as
    kube-proxy serves this node's): this node's own, and another node's (which binding would
    take from that node)."""
    ingress = service("ingress-nginx", "10.96.0.60", port(443, "https"), ns="ingress",
                      externalIPs=["192.168.1.10", "192.168.1.11"])
    cfg = Config(hostname=NODE, external_ip_cidrs=(ip_network("192.168.1.0/24"),),
                 node_network_cidrs=(ip_network("192.168.1.0/24"),))
    d = desired(ingress, slice_("ingress-nginx", ep("10.244.1.5", NODE), port=443,
                                port_name="https", ns="ingress"), cfg=cfg)
    assert vs(d)["TCP 192.168.1.10:443"] == vs(d)["TCP 192.168.1.11:443"] == ["10.244.1.5:443"]
    assert problems(d) == []
    assert addrs_bound(d) == {"10.96.0.60"}
    assert members(d, "KUBE-EXTERNAL-IP") == {"192.168.1.10,tcp:443", "192.168.1.11,tcp:443"}
    assert members(d, "KUBE-IPVS-IPS") == {"10.96.0.60"}


def addrs_bound(d: Desired) -> set[str]:
    return {str(a) for a in d.addresses}


def test_a_service_over_the_object_budget_is_refused_and_the_rest_programmed() -> None:
    """Item 4: 500 ports x 400 externalIPs made 200,500 virtual servers on every node."""
    big = service("big", "10.96.0.90", *[port(1000 + i, f"p{i}") for i in range(500)],
                  ns="t1", externalIPs=[f"203.0.{113 + i // 250}.{i % 250 + 1}"
                                        for i in range(400)])
    d = desired(big, service("small", "10.96.0.91"))
    assert set(vs(d)) == {"TCP 10.96.0.91:80"}
    assert problems(d) == ["Service t1/big: expands to 200500 virtual servers and source-range "
                           "entries on this node, more than --max-objects-per-service=10000; "
                           "not programmed"]
    # source ranges count: 1 LoadBalancer IP x 20 ports x 600 ranges
    ranged = service("ranged", "10.96.0.92", *[port(1000 + i, f"p{i}") for i in range(20)],
                     type_="LoadBalancer", ingress=["198.51.100.9"],
                     loadBalancerSourceRanges=[f"10.{i // 250}.{i % 250}.0/24"
                                               for i in range(600)])
    assert problems(desired(ranged, cfg=Config(hostname=NODE, max_objects_per_service=10_000))
                    ) == ["Service default/ranged: expands to 12040 virtual servers and "
                          "source-range entries on this node, more than "
                          "--max-objects-per-service=10000; not programmed"]
    # 0: no limit
    assert len(vs(desired(ranged, cfg=Config(hostname=NODE, max_objects_per_service=0)))) == 40
