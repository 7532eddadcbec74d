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

from ipvsproxy.config import Config
from ipvsproxy.core.desired import Desired
from ipvsproxy.core.model import Problem
from tests.unit.kube_objects import NODE, desired, ep, port, problems, service, slice_, vs

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
        "Service t1/t: externalIP 192.168.1.10 is an address of this node (eth0); ignored"]


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
    from ipvsproxy.manifests import load_objects

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
