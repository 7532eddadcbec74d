"""`ipvsproxy sync --once --from-file` against a real kernel: the state it leaves (ipvsadm -Sn,
ipset save, iptables-save, kube-ipvs0), idempotence (a second --dry-run prints nothing), repair,
ownership (a foreign virtual server is never touched) and `ipvsproxy cleanup`."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.kernel import forked
from tests.kernel.conftest import sh
from tests.unit.worked_example import worked_example

pytestmark = [pytest.mark.kernel, pytest.mark.lab_cost(100)]  # seconds, balances lab guests
NODE_IF = "ipvsp-node"
FLAGS = ["--hostname-override", "node-a", "--cluster-cidr", "10.244.0.0/16",
         "--ip-families", "4"]


def ipvsproxy(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = forked.run(args)
    if check and p.returncode != 0:
        raise AssertionError(f"ipvsproxy {' '.join(args)} exited {p.returncode}:\n"
                             f"{p.stdout}{p.stderr}")
    return p


@pytest.fixture
def node(ipvs_modules: None) -> Iterator[None]:
    """A node with one address (192.168.1.10 on a dummy 'NIC') and nothing of ipvsproxy's."""
    ipvsproxy("cleanup")
    sh("ipvsadm -C")
    sh(f"ip link add {NODE_IF} type dummy && ip addr add 192.168.1.10/24 dev {NODE_IF} "
       f"&& ip link set {NODE_IF} up")
    yield
    ipvsproxy("cleanup", check=False)
    sh("ipvsadm -C")
    sh(f"ip link del {NODE_IF}", check=False)


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    p = tmp_path / "cluster.yaml"
    p.write_text(yaml.safe_dump_all(worked_example()))
    return p


def sync(manifest: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return ipvsproxy("sync", "--once", "--from-file", str(manifest), *FLAGS, *extra)


def test_worked_example_kernel_state(node: None, manifest: Path) -> None:
    sync(manifest)
    assert sorted(sh("ipvsadm -Sn").splitlines()) == sorted([
        "-A -t 10.96.10.10:80 -s rr",
        "-a -t 10.96.10.10:80 -r 10.244.1.5:8080 -m -w 1",
        "-a -t 10.96.10.10:80 -r 10.244.2.7:8080 -m -w 1",
        "-A -t 10.96.20.20:8080 -s rr",
        "-a -t 10.96.20.20:8080 -r 10.244.1.6:80 -m -w 1",
        "-a -t 10.96.20.20:8080 -r 10.244.3.9:80 -m -w 1",
        "-A -t 10.96.30.30:443 -s rr",
        "-a -t 10.96.30.30:443 -r 10.244.2.8:8443 -m -w 1",
        "-A -t 192.168.1.10:30080 -s rr",
        "-a -t 192.168.1.10:30080 -r 10.244.1.6:80 -m -w 1",
        "-A -t 192.168.1.10:31443 -s rr",
        "-a -t 192.168.1.10:31443 -r 10.244.2.8:8443 -m -w 1",
        "-A -t 203.0.113.10:443 -s rr",
        "-a -t 203.0.113.10:443 -r 10.244.2.8:8443 -m -w 1",
    ])
    assert sorted(sh("ipset list KUBE-CLUSTER-IP | sed '1,/Members:/d'").split()) == [
        "10.96.10.10,tcp:80", "10.96.20.20,tcp:8080", "10.96.30.30,tcp:443"]
    assert sorted(sh("ipset list KUBE-NODE-PORT-LOCAL-TCP | sed '1,/Members:/d'").split()) \
        == ["30080"]
    assert sorted(sh("ipset list KUBE-LOAD-BALANCER-SOURCE-CIDR | sed '1,/Members:/d'")
                  .split()) == ["203.0.113.10,tcp:443,198.51.100.0/24"]
    addrs = sh("ip -o addr show dev kube-ipvs0 | awk '{print $4}'").split()
    assert sorted(addrs) == ["10.96.10.10/32", "10.96.20.20/32", "10.96.30.30/32",
                             "203.0.113.10/32"]
    nat = sh("iptables-save -t nat")
    assert ("-A KUBE-SERVICES ! -s 10.244.0.0/16 -m comment --comment \"Kubernetes service "
            "cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP "
            "dst,dst -j KUBE-MARK-MASQ") in nat
    assert "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000" in nat
    assert "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j " \
           "KUBE-SERVICES" in nat


def test_every_rule_reads_back_as_written(node: None, manifest: Path) -> None:
    """The rules are written in iptables-save's own form: the desired chains equal the kernel's
    chains line for line (otherwise every sync would rewrite them)."""
    sync(manifest)
    import json

    want = json.loads(sync(manifest, "-o", "json").stdout)["iptables"]["ipv4"]
    from ipvsproxy.kernel.iptables import save

    have = save(4)
    for table, chains in want.items():
        for chain, rules in chains.items():
            assert list(have[table][chain]) == rules, (table, chain)


def test_second_sync_is_a_no_op(node: None, manifest: Path) -> None:
    first = sync(manifest, "--dry-run").stdout
    assert "ipvsadm -A -t 10.96.10.10:80 -s rr" in first
    sync(manifest)
    assert sync(manifest, "--dry-run").stdout == ""


def test_drift_is_repaired(node: None, manifest: Path) -> None:
    sync(manifest)
    sh("ipvsadm -d -t 10.96.10.10:80 -r 10.244.1.5:8080")
    sh("ipset del KUBE-CLUSTER-IP 10.96.20.20,tcp:8080")
    sh("iptables -t nat -F KUBE-SERVICES")
    sh("ip addr del 10.96.30.30/32 dev kube-ipvs0")
    plan = sync(manifest, "--dry-run").stdout.splitlines()
    assert "ipvsadm -a -t 10.96.10.10:80 -r 10.244.1.5:8080 -m -w 1" in plan
    assert "ipset add KUBE-CLUSTER-IP 10.96.20.20,tcp:8080" in plan
    assert "iptables -t nat -F KUBE-SERVICES" in plan
    assert "ip addr add 10.96.30.30/32 dev kube-ipvs0" in plan
    sync(manifest)
    assert sync(manifest, "--dry-run").stdout == ""


def test_foreign_objects_survive_sync_and_cleanup(node: None, manifest: Path) -> None:
    sh("ipvsadm -A -t 10.0.0.1:80 -s wlc && ipvsadm -a -t 10.0.0.1:80 -r 10.1.1.1:80 -m")
    sh("ipvsadm -A -t 10.96.10.10:80 -s sh")  # someone else's, at a ClusterIP:port of ours
    sh("ipset create FOREIGN-SET hash:ip && iptables -N FOREIGN-CHAIN")
    p = sync(manifest)
    assert "virtual server TCP 10.96.10.10:80 exists and was not created by ipvsproxy" \
        in p.stderr
    save = sh("ipvsadm -Sn")
    assert "-A -t 10.0.0.1:80 -s wlc" in save and "-A -t 10.96.10.10:80 -s sh" in save
    assert "-a -t 10.96.10.10:80" not in save  # not ours: no real servers were added
    listing = ipvsproxy("ls", "-n", "--services").stdout
    assert re.search(r"^TCP  10\.96\.10\.10:80 sh$", listing, re.M), listing  # not named
    assert re.search(r"^TCP  10\.96\.20\.20:8080 rr +[\w-]+/[\w-]+", listing, re.M), listing
    ipvsproxy("cleanup")
    assert ipvsproxy("ls", "-n", "--services").stdout == sh("ipvsadm -Ln")  # names removed
    assert sorted(sh("ipvsadm -Sn").splitlines()) == sorted([
        "-A -t 10.0.0.1:80 -s wlc", "-a -t 10.0.0.1:80 -r 10.1.1.1:80 -m -w 1",
        "-A -t 10.96.10.10:80 -s sh"])
    assert "KUBE-" not in sh("ipset list -n") and "IPVSPROXY" not in sh("ipset list -n")
    assert "FOREIGN-SET" in sh("ipset list -n")
    assert "KUBE-" not in sh("iptables-save")
    assert ":FOREIGN-CHAIN" in sh("iptables-save -t filter")
    assert sh("ip link show kube-ipvs0", check=False) == ""
    sh("ipset destroy FOREIGN-SET && iptables -X FOREIGN-CHAIN")


def test_invalid_objects_are_reported_and_the_rest_programmed(node: None, tmp_path: Path
                                                              ) -> None:
    docs = worked_example()
    docs.append({"kind": "Service", "metadata": {"namespace": "default", "name": "bad"},
                 "spec": {"clusterIP": "10.96.0.999", "ports": [{"port": 80}]}})
    docs.append({"kind": "EndpointSlice", "addressType": "IPv4",
                 "metadata": {"namespace": "default", "name": "web-2",
                              "labels": {"kubernetes.io/service-name": "web"},
                              "annotations": {"ipvsproxy.io/weight": "heavy"}},
                 "ports": [{"port": 8080}], "endpoints": [{"addresses": ["10.244.9.9"]}]})
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump_all(docs))
    out = sync(p)
    assert "Service default/bad" in out.stderr and "10.96.0.999" in out.stderr
    assert "EndpointSlice default/web-2" in out.stderr and "heavy" in out.stderr
    assert "Traceback" not in out.stderr
    assert "-a -t 10.96.10.10:80 -r 10.244.9.9:8080 -m -w 1" in sh("ipvsadm -Sn")


def test_a_cold_node_gets_the_api_server_first_then_everything(node: None, tmp_path: Path
                                                                ) -> None:
    """On a cold node the sync programs default/kubernetes alone before the rest (syncer.py);
    the result is the same kernel state, and a warm node skips that step."""
    docs = worked_example()
    docs += [{"kind": "Service", "metadata": {"namespace": "default", "name": "kubernetes"},
              "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443}]}},
             {"kind": "EndpointSlice", "addressType": "IPv4",
              "metadata": {"namespace": "default", "name": "kubernetes",
                           "labels": {"kubernetes.io/service-name": "kubernetes"}},
              "ports": [{"name": "https", "port": 6443}],
              "endpoints": [{"addresses": ["192.168.1.10"]}]}]
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump_all(docs))
    cold = sync(p)
    assert "first_services_seconds" in cold.stderr, cold.stderr
    assert "error" not in cold.stderr.lower(), cold.stderr
    table = sh("ipvsadm -Sn")
    assert "-a -t 10.96.0.1:443 -r 192.168.1.10:6443 -m -w 1" in table
    assert "10.96.0.1/32" in sh("ip -o addr show dev kube-ipvs0")
    assert sync(p, "--dry-run").stdout == ""  # everything else is there too
    warm = sync(p)
    assert "first_services_seconds" not in warm.stderr
    assert sh("ipvsadm -Sn") == table


def dual_stack() -> list[dict[str, object]]:
    """A dual-stack NodePort + LoadBalancer service with source ranges, affinity and Local
    policy, and a UDP and an SCTP one: every rule form, in both families."""
    def eps(name: str, svc: str, family: str, ips: list[str], proto: str = "TCP"
            ) -> dict[str, object]:
        return {"kind": "EndpointSlice", "addressType": family,
                "metadata": {"namespace": "default", "name": name,
                             "labels": {"kubernetes.io/service-name": svc}},
                "ports": [{"name": "p", "port": 8080, "protocol": proto}],
                "endpoints": [{"addresses": [ip], "nodeName": "node-a"} for ip in ips]}
    return [
        {"kind": "Node", "metadata": {"name": "node-a"}, "status": {"addresses": [
            {"type": "InternalIP", "address": "192.168.1.10"},
            {"type": "InternalIP", "address": "fd00:1::10"}]}},
        {"kind": "Service", "metadata": {"namespace": "default", "name": "ds"},
         "spec": {"type": "LoadBalancer", "clusterIPs": ["10.96.5.5", "fd00:96::5"],
                  "ipFamilies": ["IPv4", "IPv6"], "externalTrafficPolicy": "Local",
                  "healthCheckNodePort": 32000, "sessionAffinity": "ClientIP",
                  "externalIPs": ["198.51.100.7", "2001:db8::7"],
                  "loadBalancerSourceRanges": ["192.168.1.0/24", "2001:db8:1::/48"],
                  "ports": [{"name": "p", "port": 80, "nodePort": 30090}]},
         "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.5"},
                                                 {"ip": "2001:db8:2::5"}]}}},
        eps("ds-4", "ds", "IPv4", ["10.244.1.5"]),
        eps("ds-6", "ds", "IPv6", ["fd00:244::5"]),
        {"kind": "Service", "metadata": {"namespace": "default", "name": "u"},
         "spec": {"type": "NodePort", "clusterIPs": ["10.96.5.6", "fd00:96::6"],
                  "ports": [{"name": "p", "port": 53, "protocol": "UDP", "nodePort": 30053}]}},
        eps("u-4", "u", "IPv4", ["10.244.1.6"], "UDP"),
        eps("u-6", "u", "IPv6", ["fd00:244::6"], "UDP"),
        {"kind": "Service", "metadata": {"namespace": "default", "name": "s"},
         "spec": {"type": "NodePort", "clusterIPs": ["10.96.5.7", "fd00:96::7"],
                  "ports": [{"name": "p", "port": 99, "protocol": "SCTP",
                             "nodePort": 30099}]}},
        eps("s-4", "s", "IPv4", ["10.244.1.7"], "SCTP"),
        eps("s-6", "s", "IPv6", ["fd00:244::7"], "SCTP"),
    ]


def test_dual_stack_every_rule_form_reads_back(node: None, tmp_path: Path) -> None:
    sh(f"ip addr add fd00:1::10/64 dev {NODE_IF} nodad")
    p = tmp_path / "ds.yaml"
    p.write_text(yaml.safe_dump_all(dual_stack()))
    flags = ["--ip-families", "4,6"]
    sync(p, *flags)
    assert sync(p, "--dry-run", *flags).stdout == ""
    save = sh("ipvsadm -Sn")
    assert "-A -t [fd00:96::5]:80 -s rr -p 10800" in save
    assert "-A --sctp-service [fd00:1::10]:30099 -s rr" in save
    assert "-A -u 192.168.1.10:30053 -s rr" in save
    assert "fd00:96::5" in sh("ipset list KUBE-6-IPVS-IPS")
    assert "[fd00:1::10]:30090" in sh("ipvsadm -Ln")
    ipvsproxy("cleanup")
    assert "KUBE" not in sh("ip6tables-save") and "KUBE" not in sh("ipset list -n")
