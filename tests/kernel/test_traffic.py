"""Real packets through what `ipvsproxy sync --once` programs: pods are network namespaces on a
bridge (integration/vm/pods.sh), an outside client is routed to the node, and every request is
answered by a pod that says its name and the source address it saw.

Node "node-a" has 192.168.1.10 (towards the client) and 10.244.1.1 (its pod bridge). pod1 and
pod2 are on node-a; pod3 is declared on node-b (it is on the same bridge, so it is reachable,
but it is not local).
"""

from __future__ import annotations

import collections
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kernel import forked
from tests.kernel.conftest import sh

pytestmark = [pytest.mark.kernel, pytest.mark.lab_cost(140)]  # seconds, balances lab guests
PODS = {"pod1": ("10.244.1.11", "node-a"), "pod2": ("10.244.1.12", "node-a"),
        "pod3": ("10.244.1.13", "node-b")}
PODS_SH = str(Path(__file__).resolve().parents[2] / "integration" / "vm" / "pods.sh")
FLAGS = ["--hostname-override", "node-a", "--cluster-cidr", "10.244.0.0/16",
         "--ip-families", "4"]


def service(name: str, ip: str, ports: list[dict[str, Any]], type_: str = "ClusterIP",
            annotations: dict[str, str] | None = None, lb: str | None = None,
            **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "kind": "Service",
        "metadata": {"namespace": "default", "name": name, "annotations": annotations or {}},
        "spec": {"type": type_, "clusterIP": ip, "ports": ports, **spec}}
    if lb:
        obj["status"] = {"loadBalancer": {"ingress": [{"ip": lb}]}}
    return obj


def slice_(name: str, svc: str, pods: list[str], ports: list[dict[str, Any]],
           weight: int | None = None) -> dict[str, Any]:
    ann = {"ipvsproxy.io/weight": str(weight)} if weight is not None else {}
    return {"kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"namespace": "default", "name": name, "annotations": ann,
                         "labels": {"kubernetes.io/service-name": svc}},
            "ports": ports,
            "endpoints": [{"addresses": [PODS[p][0]], "nodeName": PODS[p][1],
                           "conditions": {"ready": True}} for p in pods]}


HTTP = [{"name": "http", "port": 8080, "protocol": "TCP"}]
ALL = ["pod1", "pod2", "pod3"]


def cluster(echo_pods: tuple[str, ...] = ("pod1",)) -> list[dict[str, Any]]:
    http80 = [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]
    return [
        {"kind": "Node", "metadata": {"name": "node-a"},
         "status": {"addresses": [{"type": "InternalIP", "address": "192.168.1.10"}]}},
        service("web", "10.96.0.10", http80),
        slice_("web-1", "web", ALL, HTTP),
        service("web-np", "10.96.1.10", [{**http80[0], "nodePort": 30080}], "NodePort"),
        slice_("web-np-1", "web-np", ALL, HTTP),
        service("web-local", "10.96.1.11", [{**http80[0], "nodePort": 30081}], "NodePort",
                externalTrafficPolicy="Local"),
        slice_("web-local-1", "web-local", ["pod1", "pod3"], HTTP),
        service("no-local", "10.96.1.12", [{**http80[0], "nodePort": 30082}], "NodePort",
                externalTrafficPolicy="Local"),
        slice_("no-local-1", "no-local", ["pod3"], HTTP),
        service("lb", "10.96.2.10", [{**http80[0], "nodePort": 30083}], "LoadBalancer",
                lb="203.0.113.10", loadBalancerSourceRanges=["192.168.1.100/32"]),
        slice_("lb-1", "lb", ALL, HTTP),
        service("lb-deny", "10.96.2.11", [{**http80[0], "nodePort": 30084}], "LoadBalancer",
                lb="203.0.113.11", loadBalancerSourceRanges=["198.51.100.0/24"]),
        slice_("lb-deny-1", "lb-deny", ALL, HTTP),
        service("lb-local", "10.96.2.12", [{**http80[0], "nodePort": 30085}], "LoadBalancer",
                lb="203.0.113.12", externalTrafficPolicy="Local", healthCheckNodePort=32085),
        slice_("lb-local-1", "lb-local", ["pod1", "pod3"], HTTP),
        service("sticky", "10.96.0.11", http80, sessionAffinity="ClientIP"),
        slice_("sticky-1", "sticky", ALL, HTTP),
        service("canary", "10.96.0.12", http80, annotations={"ipvsproxy.io/scheduler": "wrr"}),
        slice_("canary-main", "canary", ["pod1", "pod2"], HTTP, weight=3),
        slice_("canary-new", "canary", ["pod3"], HTTP, weight=1),
        service("hashed", "10.96.0.13", http80, annotations={"ipvsproxy.io/scheduler": "sh"}),
        slice_("hashed-1", "hashed", ALL, HTTP),
        service("dns", "10.96.0.53", [{"name": "dns", "port": 53, "protocol": "UDP"}]),
        slice_("dns-1", "dns", ALL, [{"name": "dns", "port": 5353, "protocol": "UDP"}]),
        service("echo", "10.96.0.14", [*http80, {"name": "echo", "port": 9000,
                                                 "protocol": "TCP"}]),
        slice_("echo-1", "echo", list(echo_pods),
               [*HTTP, {"name": "echo", "port": 9000, "protocol": "TCP"}]),
    ]


def sync(tmp: Path, docs: list[dict[str, Any]], *flags: str) -> str:
    """Program `docs`; what the command warned about."""
    path = tmp / "cluster.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    p = forked.run(["sync", "--once", "--from-file", str(path), *FLAGS, *flags])
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stderr


@pytest.fixture(scope="module")
def node(ipvs_modules: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("traffic")
    forked.run(["cleanup"])
    sh("ipvsadm -C")
    sh(f"{PODS_SH} up pod1 pod2 pod3")
    sync(tmp, cluster())
    yield tmp
    forked.run(["cleanup"])
    sh(f"{PODS_SH} down")


def curl(url: str, ns: str | None = None, timeout: int = 10) -> tuple[int, str]:
    cmd = ["curl", "-s", "-m", str(timeout), url]
    if ns:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return p.returncode, p.stdout.strip()


def who(url: str, ns: str | None = None) -> tuple[str, str]:
    """(pod name, source address the pod saw) of one request to url/cgi-bin/who."""
    rc, out = curl(url + "/cgi-bin/who", ns)
    assert rc == 0, f"curl {url} from {ns or 'the node'} exited {rc}"
    name, seen = out.split()
    # busybox httpd listens on a dual-stack socket: "[::ffff:10.244.1.1]"
    return name, seen.strip("[]").removeprefix("::ffff:")


def pods_hit(url: str, n: int, ns: str | None = None) -> collections.Counter[str]:
    return collections.Counter(who(url, ns)[0] for _ in range(n))


def test_cluster_ip_from_a_pod_and_from_the_node_round_robin(node: Path) -> None:
    assert pods_hit("http://10.96.0.10", 6, ns="pod2") == {"pod1": 2, "pod2": 2, "pod3": 2}
    assert pods_hit("http://10.96.0.10", 3) == {"pod1": 1, "pod2": 1, "pod3": 1}


def test_pod_to_cluster_ip_keeps_its_address_node_is_masqueraded(node: Path) -> None:
    seen = {who("http://10.96.0.10", ns="pod1")[1] for _ in range(3)}
    assert seen <= {"10.244.1.11", "10.244.1.1"}  # itself (hairpin) is masqueraded
    assert "10.244.1.11" in seen
    assert {who("http://10.96.0.10")[1] for _ in range(3)} == {"10.244.1.1"}


def test_hairpin_a_pod_reaches_itself_through_its_service(node: Path) -> None:
    answers = [who("http://10.96.0.10", ns="pod1") for _ in range(3)]
    assert ("pod1", "10.244.1.1") in answers  # KUBE-LOOP-BACK masquerade


def test_node_port_from_outside_is_masqueraded_under_cluster_policy(node: Path) -> None:
    answers = [who("http://192.168.1.10:30080", ns="client") for _ in range(3)]
    assert {a[0] for a in answers} == {"pod1", "pod2", "pod3"}
    assert {a[1] for a in answers} == {"10.244.1.1"}


def test_node_port_local_policy_keeps_client_address_and_local_pods(node: Path) -> None:
    answers = [who("http://192.168.1.10:30081", ns="client") for _ in range(4)]
    assert answers == [("pod1", "192.168.1.100")] * 4


def test_local_policy_without_local_endpoint_drops_outside_serves_node(node: Path) -> None:
    rc, _ = curl("http://192.168.1.10:30082/", ns="client", timeout=2)
    assert rc == 28  # timed out: dropped, not refused
    assert who("http://192.168.1.10:30082")[0] == "pod3"  # from the node itself
    assert who("http://192.168.1.10:30082", ns="pod1")[0] == "pod3"  # from a pod (cluster CIDR)


def test_load_balancer_ip_and_source_ranges(node: Path) -> None:
    answers = [who("http://203.0.113.10", ns="client") for _ in range(3)]
    assert {a[0] for a in answers} == {"pod1", "pod2", "pod3"}
    assert {a[1] for a in answers} == {"10.244.1.1"}
    rc, _ = curl("http://203.0.113.11/", ns="client", timeout=2)
    assert rc == 28  # 192.168.1.100 is not in 198.51.100.0/24: dropped
    # Local policy: only the local pod, and it sees the client's own address
    assert [who("http://203.0.113.12", ns="client") for _ in range(3)] == \
        [("pod1", "192.168.1.100")] * 3


def test_session_affinity_keeps_a_client_on_one_pod(node: Path) -> None:
    assert len(pods_hit("http://10.96.0.11", 5, ns="pod2")) == 1
    assert len(pods_hit("http://10.96.0.11", 5, ns="client")) == 1


def test_weighted_canary_with_wrr(node: Path) -> None:
    # weights 3, 3, 1: the kernel's wrr gives exactly 3:3:1 over each cycle of 7
    assert pods_hit("http://10.96.0.12", 14, ns="pod2") == {"pod1": 6, "pod2": 6, "pod3": 2}


def test_source_hashing_keeps_a_client_on_one_pod(node: Path) -> None:
    assert len(pods_hit("http://10.96.0.13", 5, ns="pod1")) == 1
    assert len(pods_hit("http://10.96.0.13", 5, ns="client")) == 1


def test_udp_round_robin(node: Path) -> None:
    got = collections.Counter()
    for _ in range(3):
        p = subprocess.run("echo q | ip netns exec pod2 socat -T2 - UDP:10.96.0.53:53",
                           shell=True, capture_output=True, text=True, check=False)
        got[p.stdout.strip()] += 1
    assert got == {"pod1": 1, "pod2": 1, "pod3": 1}


def test_non_service_port_on_a_service_ip_is_rejected(node: Path) -> None:
    rc, _ = curl("http://10.96.0.10:81/", ns="pod1", timeout=5)
    assert rc == 7  # connection refused (REJECT), not a timeout
    assert who("http://10.96.0.10", ns="pod1")[0] in PODS


def test_established_connection_to_removed_endpoint_survives(node: Path) -> None:
    """The endpoint goes away: its real server drains at weight 0, the open TCP connection
    keeps working, new connections go to the new endpoint."""
    client = subprocess.Popen(
        ["ip", "netns", "exec", "pod2", sys.executable, "-c",
         "import socket, sys\n"
         "s = socket.create_connection(('10.96.0.14', 9000), timeout=10)\n"
         "s.sendall(b'one\\n'); print(s.recv(100).decode().strip(), flush=True)\n"
         "sys.stdin.readline()\n"
         "s.sendall(b'two\\n'); print(s.recv(100).decode().strip(), flush=True)\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert client.stdout is not None and client.stdin is not None
    assert client.stdout.readline().strip() == "one"
    try:
        sync(node, cluster(echo_pods=("pod3",)))
        rs = sh("ipvsadm -Ln -t 10.96.0.14:9000")
        assert "10.244.1.11:9000" in rs and "10.244.1.13:9000" in rs
        assert [ln.split()[3] for ln in rs.splitlines() if "10.244.1.11" in ln] == ["0"]
        assert pods_hit("http://10.96.0.14", 3, ns="pod1") == {"pod3": 3}
        client.stdin.write("\n")
        client.stdin.flush()
        assert client.stdout.readline().strip() == "two"
    finally:
        client.kill()
        client.wait()
    time.sleep(0.5)


def test_a_tenant_cannot_take_another_tenants_cluster_ip(node: Path) -> None:
    """Issue 23: t1/attacker (older, and its namespace sorts first) lists t2/victim's ClusterIP
    as an externalIP and as its LoadBalancer IP. The victim's ClusterIP still reaches the
    victim's pod only, and the attacker still gets its own ClusterIP."""
    def ns(obj: dict[str, Any], namespace: str, created: str) -> dict[str, Any]:
        obj["metadata"].update(namespace=namespace, creationTimestamp=created)
        return obj

    http80 = [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]
    attack = [
        ns(service("victim", "10.96.3.60", http80), "t2", "2025-01-01T00:00:00Z"),
        ns(slice_("victim-1", "victim", ["pod1"], HTTP), "t2", "2025-01-01T00:00:00Z"),
        ns(service("attacker", "10.96.3.61", http80, "LoadBalancer", lb="10.96.3.60",
                   externalIPs=["10.96.3.60", "203.0.113.12"]), "t1", "2020-01-01T00:00:00Z"),
        ns(slice_("attacker-1", "attacker", ["pod3"], HTTP), "t1", "2020-01-01T00:00:00Z"),
    ]
    try:
        sync(node, cluster() + attack)
        assert pods_hit("http://10.96.3.60", 6, ns="pod2") == {"pod1": 6}
        assert pods_hit("http://10.96.3.60", 3) == {"pod1": 3}  # from the node too
        assert pods_hit("http://10.96.3.61", 3, ns="pod2") == {"pod3": 3}
        assert "10.244.1.13" not in sh("ipvsadm -Ln -t 10.96.3.60:80")
        # Issue 32, item 1: the older tenant's externalIP does not take default/lb-local's
        # LoadBalancer status IP (its Local policy: pod1 only, the client's address kept)
        assert [who("http://203.0.113.12", ns="client") for _ in range(3)] == \
            [("pod1", "192.168.1.100")] * 3
    finally:
        sync(node, cluster())


def test_an_ingress_on_the_nodes_own_address_if_the_operator_allows_it(node: Path) -> None:
    """Issue 32, item 3: bare-metal ingress published on the node's own IP through
    externalIPs. Refused by default; inside --external-ip-cidrs it is served, from outside the
    node, without binding the node's address to kube-ipvs0, and the node's other ports on that
    address still answer (its own listener on 8443 is not rejected as a service address's)."""
    https = [{"name": "https", "port": 443, "targetPort": 8080, "protocol": "TCP"}]
    ingress = [service("ingress", "10.96.4.10", https, externalIPs=["192.168.1.10"]),
               slice_("ingress-1", "ingress", ["pod2"],
                      [{"name": "https", "port": 8080, "protocol": "TCP"}])]
    own = subprocess.Popen(["socat", "TCP-LISTEN:8443,bind=192.168.1.10,fork,reuseaddr",
                            "SYSTEM:echo node-a"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        warned = sync(node, cluster() + ingress)
        assert "externalIP 192.168.1.10 is an address of this node" in warned
        assert curl("http://192.168.1.10:443/", ns="client", timeout=2)[0] != 0
        warned = sync(node, cluster() + ingress, "--external-ip-cidrs", "192.168.1.0/24")
        assert "192.168.1.10" not in warned
        assert [who("http://192.168.1.10:443", ns="client")[0] for _ in range(3)] == \
            ["pod2"] * 3
        assert "192.168.1.10" not in sh("ip -4 addr show dev kube-ipvs0")
        time.sleep(0.2)  # socat is listening by now
        p = subprocess.run("ip netns exec client socat -t5 -T5 - TCP:192.168.1.10:8443",
                           shell=True, capture_output=True, text=True, check=False,
                           stdin=subprocess.DEVNULL)
        assert p.stdout.strip() == "node-a"
    finally:
        own.kill()
        own.wait()
        sync(node, cluster())
