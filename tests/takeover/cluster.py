"""The cluster a node moves between proxies with (issue 36): `size` Services of every kind a
takeover must keep serving (ClusterIP TCP and UDP, NodePort, LoadBalancer, externalIP, ClientIP
affinity), their EndpointSlices over four pods, the traffic the clients send through them, and
the changes made while no proxy runs. Plain objects for the real API server; pure.

The pods are pods.sh's network namespaces on this node (10.244.1.11-14, each running
tests/takeover/pod.py), the pod-network client `cli` is 10.244.1.15, and the outside client
`client` (192.168.1.100) reaches the node's address for NodePorts, LoadBalancer IPs and
externalIPs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.differential.cluster import LABEL_MANAGED_BY, LABEL_SERVICE_NAME, MANAGED_BY, Params

Obj = dict[str, Any]
NS = "move"
PODS = {"pod1": "10.244.1.11", "pod2": "10.244.1.12", "pod3": "10.244.1.13",
        "pod4": "10.244.1.14"}
CLIENT_PODS = ("cli",)  # 10.244.1.15, on the pod network
TCP, UDP = 7000, 7001  # tests/takeover/pod.py
PARAMS = Params(node_name="move-node", namespaces=(NS,))


@dataclass(frozen=True)
class Svc:
    i: int
    kind: str  # "cluster-ip", "udp", "node-port", "load-balancer", "external-ip", "affinity"
    pods: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"s{self.i}"

    @property
    def cluster_ip(self) -> str:
        return f"10.96.{10 + self.i // 250}.{self.i % 250 + 1}"

    @property
    def udp(self) -> bool:
        return self.kind == "udp"

    @property
    def port(self) -> int:
        return 53 if self.udp else 80

    @property
    def node_port(self) -> int:
        return 30000 + self.i

    @property
    def external(self) -> str:
        """Its LoadBalancer or external IP ("" for the others)."""
        if self.kind == "load-balancer":
            return f"203.0.113.{self.i % 250 + 1}"
        if self.kind == "external-ip":
            return f"198.51.100.{self.i % 250 + 1}"
        return ""


def kind_of(i: int) -> str:
    if i == 1:
        return "affinity"
    return ("cluster-ip", "cluster-ip", "cluster-ip", "cluster-ip", "cluster-ip", "cluster-ip",
            "udp", "node-port", "load-balancer", "external-ip")[i % 10]


def services(size: int) -> list[Svc]:
    names = sorted(PODS)
    return [Svc(i, kind_of(i), tuple(names[(i + k) % 3] for k in range(2)))
            for i in range(size)]


def service_obj(s: Svc) -> Obj:
    port: Obj = {"name": "p", "protocol": "UDP" if s.udp else "TCP", "port": s.port,
                 "targetPort": UDP if s.udp else TCP}
    spec: Obj = {"type": "ClusterIP", "clusterIP": s.cluster_ip, "clusterIPs": [s.cluster_ip],
                 "ports": [port]}
    if s.kind in ("node-port", "load-balancer"):
        spec["type"] = "NodePort" if s.kind == "node-port" else "LoadBalancer"
        port["nodePort"] = s.node_port
        spec["externalTrafficPolicy"] = "Cluster"
    if s.kind == "external-ip":
        spec["externalIPs"] = [s.external]
    if s.kind == "affinity":
        spec["sessionAffinity"] = "ClientIP"
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": NS, "name": s.name},
            "spec": spec}


def lb_status(s: Svc) -> Obj:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": NS, "name": s.name},
            "status": {"loadBalancer": {"ingress": [{"ip": s.external, "ipMode": "VIP"}]}}}


def slice_obj(s: Svc, pods: tuple[str, ...] | None = None) -> Obj:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": NS, "name": f"{s.name}-a",
                         "labels": {LABEL_SERVICE_NAME: s.name, LABEL_MANAGED_BY: MANAGED_BY}},
            "addressType": "IPv4",
            "ports": [{"name": "p", "protocol": "UDP" if s.udp else "TCP",
                       "port": UDP if s.udp else TCP}],
            "endpoints": [{"addresses": [PODS[p]], "nodeName": PARAMS.node_name,
                           "conditions": {"ready": True}} for p in pods or s.pods]}


def node_obj() -> Obj:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": PARAMS.node_name},
            "status": {"addresses": [{"type": "InternalIP", "address": a}
                                     for a in PARAMS.node_ips]}}


@dataclass
class Traffic:
    """What each client sends (tests/takeover/traffic.py's CONFIG, less the files)."""

    new: list[tuple[str, int]] = field(default_factory=list)
    long: list[tuple[str, int]] = field(default_factory=list)
    udp: list[tuple[str, int]] = field(default_factory=list)

    def config(self, rate: float) -> dict[str, Any]:
        return {"new": self.new, "long": self.long, "udp": self.udp, "rate": rate,
                "timeout": 5.0, "interval": 0.1}


@dataclass
class Plan:
    """The services, who sends what, and the changes made while no proxy runs."""

    services: list[Svc]
    traffic: dict[str, Traffic]  # client namespace -> its traffic
    grown: Svc  # gains pod4 while no proxy runs (traffic goes to it)
    shrunk: Svc  # loses its first pod (no long-lived connection through it)
    deleted: Svc  # deleted while no proxy runs (no traffic)
    created: Svc  # created while no proxy runs


def plan(size: int) -> Plan:
    """`size` >= 20."""
    svcs = services(size)
    node_ip = PARAMS.node_ips[0]
    by = {k: [s for s in svcs if s.kind == k] for k in
          ("cluster-ip", "udp", "node-port", "load-balancer", "external-ip", "affinity")}
    inside = Traffic(
        new=[(s.cluster_ip, s.port) for s in by["cluster-ip"][:6] + by["affinity"]],
        long=[(s.cluster_ip, s.port) for s in by["cluster-ip"][6:8]],
        udp=[(s.cluster_ip, s.port) for s in by["udp"][:2]])
    outside = Traffic(
        new=[(node_ip, s.node_port) for s in by["node-port"][:2]]
        + [(s.external, s.port) for s in by["load-balancer"][:2] + by["external-ip"][:2]],
        long=[(node_ip, by["node-port"][0].node_port), (by["load-balancer"][0].external, 80),
              (by["external-ip"][0].external, 80)])
    quiet = by["cluster-ip"][8:]
    return Plan(svcs, {"cli": inside, "client": outside}, grown=by["cluster-ip"][0],
                shrunk=quiet[0], deleted=quiet[1], created=Svc(size, "cluster-ip",
                                                               ("pod1", "pod2")))


def objects(p: Plan) -> list[Obj]:
    """Everything to create, in order (the node, the namespace, Services, slices)."""
    out: list[Obj] = [node_obj(), {"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": NS}}]
    out += [service_obj(s) for s in p.services]
    out += [slice_obj(s) for s in p.services]
    return out
