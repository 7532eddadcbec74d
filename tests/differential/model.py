"""The generator's model of one cluster: a Service as the generator thinks of it (`_Svc`,
`_Port`, rendered into API objects) and `_Alloc`, the seeded state every builder draws from (the
random source, and the addresses, ports and names handed out so far, so none is used twice).
slices.py and generate.py build on `_Alloc`; changes.py rebuilds this model from a cluster's
objects to change it.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_network
from typing import Any

from tests.differential.cluster import OTHER_NODES, ZONES, Obj, Params


@dataclass(slots=True)
class _Port:
    name: str
    protocol: str
    port: int
    target: int
    node_port: int = 0


@dataclass(slots=True)
class _Svc:
    """A Service as the generator thinks of it; rendered into the API objects."""

    ns: str
    name: str
    kind: str  # ClusterIP, NodePort, LoadBalancer, ExternalName, headless
    families: list[int] = field(default_factory=list)  # spec.ipFamilies order
    policy: str | None = "SingleStack"  # None: left to defaulting (family:implicit)
    cluster_ips: list[str] = field(default_factory=list)
    ports: list[_Port] = field(default_factory=list)
    external_ips: list[str] = field(default_factory=list)
    etp: str = "Cluster"
    itp: str = "Cluster"
    affinity: int | None = None  # None: no affinity; 0: ClientIP with the default timeout
    hcnp: int = 0
    source_ranges: list[str] = field(default_factory=list)
    alloc_node_ports: bool = True
    ingress: list[Obj] | None = None  # None: no status written
    td: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    slices: list[Obj] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str]:
        return self.ns, self.name

    @property
    def proxied(self) -> bool:
        return self.kind in ("ClusterIP", "NodePort", "LoadBalancer")

    @property
    def externally_accessible(self) -> bool:
        return self.kind in ("NodePort", "LoadBalancer") or (
            self.kind == "ClusterIP" and bool(self.external_ips))

    def service(self) -> Obj:
        spec: Obj = {"type": "ClusterIP" if self.kind == "headless" else self.kind}
        if self.kind == "ExternalName":
            spec["externalName"] = f"{self.name}.example.com"
        elif self.kind == "headless":
            spec["clusterIP"] = "None"
            spec["clusterIPs"] = ["None"]
        else:
            spec["clusterIP"] = self.cluster_ips[0]
            spec["clusterIPs"] = list(self.cluster_ips)
        if self.kind != "ExternalName":
            if self.policy is not None:
                spec["ipFamilyPolicy"] = self.policy
                spec["ipFamilies"] = [f"IPv{f}" for f in self.families]
            spec["internalTrafficPolicy"] = self.itp
        ports = []
        for p in self.ports:
            d: Obj = {"protocol": p.protocol, "port": p.port, "targetPort": p.target}
            if p.name:
                d["name"] = p.name
            if p.node_port:
                d["nodePort"] = p.node_port
            ports.append(d)
        if ports:
            spec["ports"] = ports
        if self.external_ips:
            spec["externalIPs"] = list(self.external_ips)
        if self.externally_accessible:
            spec["externalTrafficPolicy"] = self.etp
        if self.affinity is not None:
            spec["sessionAffinity"] = "ClientIP"
            if self.affinity:
                spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": self.affinity}}
        if self.kind == "LoadBalancer":
            spec["allocateLoadBalancerNodePorts"] = self.alloc_node_ports
            if self.source_ranges:
                spec["loadBalancerSourceRanges"] = list(self.source_ranges)
            if self.hcnp:
                spec["healthCheckNodePort"] = self.hcnp
        if self.td is not None:
            spec["trafficDistribution"] = self.td
        meta: Obj = {"namespace": self.ns, "name": self.name}
        if self.labels:
            meta["labels"] = dict(self.labels)
        if self.annotations:
            meta["annotations"] = dict(self.annotations)
        return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}

    def status(self) -> Obj | None:
        if self.kind != "LoadBalancer" or self.ingress is None:
            return None
        return {"apiVersion": "v1", "kind": "Service",
                "metadata": {"namespace": self.ns, "name": self.name},
                "status": {"loadBalancer": {"ingress": copy.deepcopy(self.ingress)}}}


class _Alloc:
    """The generator's state: the random source and every allocator of one cluster."""

    def __init__(self, seed: int, params: Params) -> None:
        self.rng = random.Random(seed)
        self.p = params
        self.seed = seed
        nets = [ip_network(c) for c in params.service_cidrs]
        self.svc_nets: dict[int, IPv4Network | IPv6Network] = {n.version: n for n in nets}
        self.used_ips: set[str] = set()
        self.used_node_ports: set[int] = set()
        self.pod_next: dict[tuple[int, int], int] = {}
        self.names: set[tuple[str, str]] = set()
        self.zone = ""
        self.node_families: tuple[int, ...] = (4, 6)
        self.node_claims: set[tuple[str, int]] = set()  # (protocol, port) at the node's IP
        self.cluster_frontends: dict[tuple[str, int], str] = {}  # (protocol, port) -> clusterIP
        self.counter = 0

    # ---- allocators

    def cluster_ip(self, family: int) -> str:
        net = self.svc_nets[family]
        size = min(net.num_addresses - 2, 60000)
        while True:
            a = str(net.network_address + self.rng.randint(self.p.reserved, size))
            if a not in self.used_ips:
                self.used_ips.add(a)
                return a

    def node_port(self) -> int:
        lo, hi = self.p.node_port_range
        while True:
            n = self.rng.randint(lo, hi)
            if n not in self.used_node_ports:
                self.used_node_ports.add(n)
                return n

    def pod_ip(self, family: int, node: str) -> str:
        idx = {self.p.node_name: 1, OTHER_NODES[0]: 2, OTHER_NODES[1]: 3}.get(node, 4)
        k = self.pod_next.get((family, idx), 2)
        self.pod_next[(family, idx)] = k + 1 if k < 250 else 2
        if family == 4:
            base = ip_network(self.p.cluster_cidrs[0]).network_address
            return str(IPv4Address(int(base) + idx * 256 + k))
        base6 = ip_network(self.p.cluster_cidrs[1]).network_address
        return str(IPv6Address(int(base6) + (idx << 64) + k))

    def name(self, ns: str, stem: str) -> str:
        self.counter += 1
        n = f"s{self.counter:02d}-{stem}"
        self.names.add((ns, n))
        return n

    def zone_of(self, node: str) -> str:
        if node == self.p.node_name:
            return self.zone
        # node-b shares this node's usual zone: same-zone and same-node hints then differ
        return ZONES[OTHER_NODES.index(node)]

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def _unique(self, make: Any) -> str:
        """A fresh address: two Services at one frontend would make kube-proxy's state depend
        on its map order (each syncs the virtual server with its own real servers)."""
        while True:
            a = str(make())
            if a not in self.used_ips:
                self.used_ips.add(a)
                return a

    def external_ip(self, family: int) -> str:
        r = self.rng
        if family == 4:
            return self._unique(lambda: f"203.0.113.{r.randint(1, 254)}")
        return self._unique(lambda: f"2001:db8:e::{r.randint(1, 0xfffe):x}")

    def lb_ip(self, family: int) -> str:
        r = self.rng
        if family == 4:
            return self._unique(lambda: f"198.51.100.{r.randint(1, 254)}")
        return self._unique(lambda: f"2001:db8:1b::{r.randint(1, 0xfffe):x}")

    def claim_cluster_ip(self, ports: list[_Port]) -> str:
        for (proto, port), ip in sorted(self.cluster_frontends.items()):
            if (proto, port) in {(p.protocol, p.port) for p in ports} and "." in ip:
                del self.cluster_frontends[(proto, port)]  # one claim each
                return ip
        return self.cluster_ip(4)

    def claim_node_address(self, ports: list[_Port]) -> bool:
        """Whether this Service may use the node's address as an external or LB IP: no other
        Service uses it with one of these ports."""
        mine = {(p.protocol, p.port) for p in ports}
        if mine & self.node_claims:
            return False
        self.node_claims |= mine
        return True


def _leading_zeros(ip: str) -> str:
    """The same IPv4 address with leading zeros, which the API server's legacy IP validation
    accepts (StrictIPCIDRValidation is off in 1.35) and kube-proxy parses as decimal."""
    return ".".join(f"{int(x):03d}" for x in ip.split("."))

