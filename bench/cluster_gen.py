"""A synthetic cluster for the benchmarks: N Services with M endpoints each, in the mix issue 8
asks for (70% ClusterIP, 20% NodePort, 10% LoadBalancer; some UDP, some ClientIP affinity, some
Local traffic policy; endpoints spread over 50 nodes), as plain Kubernetes objects (what a LIST
returns), deterministic for a seed.

    python -m bench.cluster_gen 10000 10 > cluster.json   # a `kind: List` for --from-file
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

NODES = 50
NODE = "node-0"  # the node the proxy runs on
NODE_IP = "192.168.1.10"
CLUSTER_CIDR = "10.128.0.0/9"  # every generated pod address is in it
# default/kubernetes, as every cluster has it: the API server's ClusterIP and its endpoint
# (kernel benches run a listener there, in a network namespace of its own)
KUBERNETES_IP, API_IP, API_PORT = "10.96.0.1", "192.168.77.2", 6443


def cluster_ip(i: int) -> str:
    i += 2  # never 10.96.0.0, and 10.96.0.1 is default/kubernetes
    return f"10.{96 + (i >> 16)}.{(i >> 8) & 255}.{i & 255}"


def pod_ip(i: int, j: int, m: int, version: int = 0) -> str:
    """Endpoint j of service i: 10.128.0.0/10, one address each; at `version` v > 0 endpoint
    v % m has been replaced by a new pod (10.192.0.0/10), as a rolling restart does."""
    k = i * m + j
    if version and j == version % m:
        n = (0x0AC00000 + (k * 16 + version % 16) % (1 << 22))
    else:
        n = 0x0A800000 + k % (1 << 22)
    return f"{n >> 24}.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"


def node_obj(name: str = NODE, ip: str = NODE_IP) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "labels": {}},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}]}}


def service(i: int, rng: random.Random, node_ports: list[int]) -> dict[str, Any]:
    """`node_ports`: a counter of NodePorts handed out, so that each is unique (as the API
    server ensures; a large cluster widens --service-node-port-range past 32767)."""
    r = rng.random()
    type_ = "ClusterIP" if r < 0.7 else "NodePort" if r < 0.9 else "LoadBalancer"
    proto = "UDP" if rng.random() < 0.1 else "TCP"
    port: dict[str, Any] = {"name": "p", "port": 80 if proto == "TCP" else 53,
                            "targetPort": 8080, "protocol": proto}
    spec: dict[str, Any] = {"type": type_, "clusterIP": cluster_ip(i),
                            "clusterIPs": [cluster_ip(i)], "ports": [port]}
    if type_ != "ClusterIP":
        port["nodePort"] = 30000 + node_ports[0]
        node_ports[0] += 1
        if rng.random() < 0.2:
            spec["externalTrafficPolicy"] = "Local"
    if rng.random() < 0.05:
        spec["sessionAffinity"] = "ClientIP"
    obj: dict[str, Any] = {"kind": "Service", "apiVersion": "v1",
                           "metadata": {"namespace": f"ns{i % 100}", "name": f"svc-{i}",
                                        "resourceVersion": str(i + 1)},
                           "spec": spec}
    if type_ == "LoadBalancer":
        obj["status"] = {"loadBalancer": {"ingress": [
            {"ip": cluster_ip(i).replace("10.", "172.", 1)}]}}  # 172.96.0.0/11, unique
    return obj


def endpoint_slice(i: int, svc: dict[str, Any], m: int, version: int = 0) -> dict[str, Any]:
    """The EndpointSlice of service i with m endpoints on nodes spread over NODES; `version`
    counts its updates (each replaces one pod)."""
    proto = svc["spec"]["ports"][0]["protocol"]
    eps = [{"addresses": [pod_ip(i, j, m, version)], "nodeName": f"node-{(i * 7 + j) % NODES}",
            "conditions": {"ready": True}} for j in range(m)]
    meta = svc["metadata"]
    return {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1", "addressType": "IPv4",
            "metadata": {"namespace": meta["namespace"], "name": f"{meta['name']}-abcde",
                         "labels": {"kubernetes.io/service-name": meta["name"]},
                         "resourceVersion": str(1_000_000 + i + version)},
            "ports": [{"name": "p", "port": 8080, "protocol": proto}], "endpoints": eps}


def kubernetes() -> list[dict[str, Any]]:
    """default/kubernetes and its EndpointSlice (the API server)."""
    port = {"name": "https", "port": 443, "targetPort": API_PORT, "protocol": "TCP"}
    return [{"kind": "Service", "apiVersion": "v1",
             "metadata": {"namespace": "default", "name": "kubernetes",
                          "resourceVersion": "900000"},
             "spec": {"type": "ClusterIP", "clusterIP": KUBERNETES_IP,
                      "clusterIPs": [KUBERNETES_IP], "ports": [port]}},
            {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1", "addressType": "IPv4",
             "metadata": {"namespace": "default", "name": "kubernetes",
                          "labels": {"kubernetes.io/service-name": "kubernetes"},
                          "resourceVersion": "900001"},
             "ports": [{"name": "https", "port": API_PORT, "protocol": "TCP"}],
             "endpoints": [{"addresses": [API_IP], "conditions": {"ready": True}}]}]


def generate(n: int, m: int, seed: int = 0) -> list[dict[str, Any]]:
    """The Node this proxy runs on, default/kubernetes, then each of the n Services followed by
    its one EndpointSlice."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = [node_obj(), *kubernetes()]
    node_ports = [0]
    for i in range(n):
        svc = service(i, rng, node_ports)
        out += [svc, endpoint_slice(i, svc, m)]
    return out


def main(argv: list[str] | None = None) -> int:
    args = (argv if argv is not None else sys.argv[1:]) or ["1000", "10"]
    n, m = int(args[0]), int(args[1])
    json.dump({"kind": "List", "items": generate(n, m)}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
