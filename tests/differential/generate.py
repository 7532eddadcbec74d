"""Seeded clusters for the differential suite, as API objects the real kube-apiserver v1.35
accepts. Pure: no I/O, no clock; the same seed gives the same objects.

A cluster is the namespaces, this node's Node (zone label, InternalIP addresses), Services of
every kind kube-proxy 1.35 handles, their LoadBalancer status (for the status subresource) and
EndpointSlices written directly (managed-by `MANAGED_BY`, so no controller would touch them;
none runs anyway). Every address and port is explicit (clusterIPs inside `Params.service_cidrs`,
nodePorts and health-check node ports unique inside `Params.node_port_range`), so the same
cluster loads the same way twice. Each service is built around one feature of `FEATURES`
(consecutive seeds take turns through all of them, so seven seeds of a dozen services cover
every one), with two more at random and the rest of its fields random; every cluster has each
proxied Service type.

This module owns the feature tables, `Params`, `Change`, `Cluster`, the generator's model of a
Service and `generate()`. features.py reads back which features a cluster covers, validity.py
checks the objects offline against the API server's rules (pkg/apis/core/validation and
pkg/apis/discovery/validation at v1.35.4), and changes.py makes change series.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_network
from typing import Any

Obj = dict[str, Any]

MANAGED_BY = "differential.ipvsproxy.io"
LABEL_MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
LABEL_SERVICE_NAME = "kubernetes.io/service-name"
LABEL_PROXY_NAME = "service.kubernetes.io/service-proxy-name"
LABEL_HEADLESS = "service.kubernetes.io/headless"
LABEL_ZONE = "topology.kubernetes.io/zone"
# The other nodes of the cluster (endpoints there are remote; node-b in zone-a, node-c in
# zone-b) and the zones (this node's is zone-a, none, or another after a change).
OTHER_NODES = ("node-b", "node-c")
ZONES = ("zone-a", "zone-b", "zone-c")
PROTOCOLS = ("TCP", "UDP", "SCTP")

# Every feature a cluster or a change series can cover (what features()/change.feature name).
SERVICE_FEATURES = (
    "svc:ClusterIP", "svc:NodePort", "svc:LoadBalancer", "svc:ExternalName", "svc:headless",
    "proto:TCP", "proto:UDP", "proto:SCTP", "ports:multi", "ports:unnamed",
    "nodeport:tcp-udp-same-number",
    "family:ipv4", "family:ipv6", "family:dual-v4-primary", "family:dual-v6-primary",
    "family:prefer-dual", "family:implicit",
    "externalIPs", "externalIPs:ipv6", "externalIPs:node-address", "externalIPs:clusterip-local",
    "lb:vip", "lb:proxy", "lb:ipmode-unset", "lb:hostname", "lb:ipv6", "lb:other-family",
    "lb:node-address", "lb:no-nodeports", "lb:no-status",
    "sourceRanges", "sourceRanges:node", "sourceRanges:zero", "sourceRanges:padded",
    "sourceRanges:host-bits", "sourceRanges:ipv6",
    "affinity:ClientIP", "affinity:default-timeout",
    "etp:Local", "etp:Local-no-local-endpoints", "itp:Local", "hcnp",
    "td:PreferClose", "td:PreferSameZone", "td:PreferSameNode",
    "label:service-proxy-name", "ann:ipvsproxy-scheduler", "ann:ipvsproxy-weight",
    "lb:same-as-externalIP", "invalid:externalIP-leading-zeros",
    "invalid:externalIP-ipv4-mapped", "invalid:lb-ip-leading-zeros",
    "externalIPs:service-range", "invalid:externalIP-multicast", "invalid:lb-ip-link-local",
)
ENDPOINT_FEATURES = (
    "ep:ready", "ep:conditions-unset", "ep:not-ready", "ep:serving-terminating",
    "ep:terminating-not-serving", "ep:local", "ep:remote", "ep:no-node", "ep:multi-address",
    "ep:duplicate", "ep:none",
    "hints:zone", "hints:zone-other", "hints:zone-partial", "hints:node", "hints:node-other",
    "hints:node-partial", "hints:zone-empty-name",
    "slice:multi", "slice:no-service-label", "slice:orphan", "slice:port-name-mismatch",
    "slice:protocol-mismatch", "slice:port-nil", "slice:port-zero", "slice:fqdn",
    "slice:other-family", "slice:headless-label", "slice:proxy-name-label",
    "invalid:endpoint-leading-zeros", "invalid:endpoint-multicast",
)
NODE_FEATURES = ("node:zone", "node:no-zone", "node:ipv4-only")
FEATURES = SERVICE_FEATURES + ENDPOINT_FEATURES + NODE_FEATURES
CHANGE_FEATURES = (
    "chg:scale-up", "chg:scale-down", "chg:condition", "chg:hints", "chg:type", "chg:etp",
    "chg:itp", "chg:affinity", "chg:externalIPs", "chg:lb-status", "chg:source-ranges",
    "chg:ports", "chg:delete-service", "chg:create-service", "chg:delete-slice",
    "chg:create-slice", "chg:node-zone",
)


@dataclass(frozen=True, slots=True)
class Params:
    """What the cluster must fit: the API server's ranges and this node."""

    services: int = 12
    # --service-cluster-ip-range of the API server: the IPv4 range, then the IPv6 one
    service_cidrs: tuple[str, str] = ("10.96.0.0/16", "fd00:96::/112")
    node_port_range: tuple[int, int] = (30000, 32767)  # --service-node-port-range
    node_name: str = "diff-node"
    node_ips: tuple[str, str] = ("192.168.77.10", "fd00:77::10")  # on a NIC of the lab guest
    cluster_cidrs: tuple[str, str] = ("10.244.0.0/16", "fd00:244::/56")  # pods
    namespaces: tuple[str, ...] = ("diff-a", "diff-b")
    reserved: int = 16  # the first addresses of each service CIDR (kubernetes, DNS) are not used


@dataclass(frozen=True, slots=True)
class Change:
    """One write through the API server.

    op: "create" (POST), "replace" (PUT of the whole object, no resourceVersion), "status" (a
    merge patch of a Service's status subresource: obj holds metadata and status) or "delete"
    (obj holds apiVersion, kind and metadata).
    """

    op: str
    obj: Obj
    feature: str

    @property
    def key(self) -> tuple[str, str, str]:
        return key_of(self.obj)


@dataclass(slots=True)
class Cluster:
    seed: int
    params: Params
    namespaces: list[Obj]
    node: Obj
    services: list[Obj]  # as created (a Service's status is set afterwards, see lb_status)
    lb_status: list[Obj]  # metadata + status of LoadBalancer Services with ingress
    slices: list[Obj]

    def steps(self) -> list[Change]:
        """Loading the cluster into an empty API server, in order."""
        out = [Change("create", o, "load") for o in (*self.namespaces, self.node)]
        out += [Change("create", o, "load") for o in self.services]
        out += [Change("status", o, "load") for o in self.lb_status]
        out += [Change("create", o, "load") for o in self.slices]
        return out

    def objects(self) -> list[Obj]:
        """The cluster as one list (Services with their status), e.g. for `--from-file`."""
        status = {key_of(s): s["status"] for s in self.lb_status}
        svcs = [dict(s, status=status[key_of(s)]) if key_of(s) in status else s
                for s in self.services]
        return [*self.namespaces, self.node, *svcs, *self.slices]

    def features(self) -> Counter[str]:
        from tests.differential.features import features  # features.py imports this module

        return features(self.node, self.services, self.lb_status, self.slices, self.params)


def key_of(obj: Obj) -> tuple[str, str, str]:
    m = obj["metadata"]
    return obj["kind"], m.get("namespace", ""), m["name"]


# ------------------------------------------------------------------------------ the model


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


def _slice(ns: str, name: str, service: str | None, address_type: str, ports: list[Obj],
           endpoints: list[Obj], labels: dict[str, str] | None = None,
           annotations: dict[str, str] | None = None) -> Obj:
    lab = {LABEL_MANAGED_BY: MANAGED_BY}
    if service is not None:
        lab[LABEL_SERVICE_NAME] = service
    lab.update(labels or {})
    meta: Obj = {"namespace": ns, "name": name, "labels": lab}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": meta,
            "addressType": address_type, "ports": ports, "endpoints": endpoints}


class _Gen:
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

    # ---- building blocks

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def families(self, want: set[str]) -> tuple[list[int], str | None]:
        r = self.rng
        choice: str | None = next((f for f in ("family:ipv6", "family:dual-v4-primary",
                                   "family:dual-v6-primary", "family:prefer-dual",
                                   "family:implicit", "family:ipv4") if f in want), None)
        if choice is None and want & {"lb:other-family", "slice:other-family",
                                      "invalid:externalIP-ipv4-mapped",
                                      "invalid:externalIP-multicast",
                                      "invalid:lb-ip-link-local", "invalid:endpoint-multicast",
                                      "externalIPs:service-range",
                                      "invalid:endpoint-leading-zeros",
                                      "invalid:externalIP-leading-zeros",
                                      "invalid:lb-ip-leading-zeros"}:
            choice = "family:ipv4"
        if choice is None:
            choice = r.choices(["family:ipv4", "family:ipv6", "family:dual-v4-primary",
                                "family:dual-v6-primary", "family:prefer-dual",
                                "family:implicit"], [5, 2, 3, 2, 1, 1])[0]
        return {
            "family:ipv4": ([4], "SingleStack"),
            "family:ipv6": ([6], "SingleStack"),
            "family:dual-v4-primary": ([4, 6], "RequireDualStack"),
            "family:dual-v6-primary": ([6, 4], "RequireDualStack"),
            "family:prefer-dual": ([4, 6], "PreferDualStack"),
            "family:implicit": ([4], None),
        }[choice]

    def ports(self, kind: str, want: set[str]) -> list[_Port]:
        r = self.rng
        n = 1 if "ports:unnamed" in want else r.choices([1, 2, 3], [5, 3, 1])[0]
        if "ports:multi" in want or "nodeport:tcp-udp-same-number" in want:
            n = max(n, 2)
        protos = [r.choices(PROTOCOLS, [6, 3, 1])[0] for _ in range(n)]
        for f in ("proto:UDP", "proto:SCTP"):
            if f in want:
                protos[0] = f.split(":")[1]
        if "nodeport:tcp-udp-same-number" in want:
            protos[:2] = ["TCP", "UDP"]
        out: list[_Port] = []
        used: set[tuple[str, int]] = set()
        for i, proto in enumerate(protos):
            port = r.choice([53, 80, 443, 8080, 9090, r.randint(1, 65535)])
            if "nodeport:tcp-udp-same-number" in want and i == 1:
                port = out[0].port
            while (proto, port) in used:
                port = r.randint(1, 65535)
            used.add((proto, port))
            name = "" if n == 1 and (r.random() < 0.4 or "ports:unnamed" in want) \
                else f"p{i}-{proto.lower()}"
            target = port if r.random() < 0.3 else r.randint(1024, 32000)
            out.append(_Port(name, proto, port, target))
        if kind in ("NodePort", "LoadBalancer"):
            for i, p in enumerate(out):
                if "nodeport:tcp-udp-same-number" in want and i == 1:
                    p.node_port = out[0].node_port
                else:
                    p.node_port = self.node_port()
        return out

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

    def ingress(self, fams: list[int], want: set[str], ports: list[_Port]) -> list[Obj]:
        r = self.rng
        node_ok = "lb:node-address" in want and self.claim_node_address(ports)
        out: list[Obj] = []
        n = r.choices([1, 2, 3], [5, 3, 1])[0]
        for i in range(n):
            fam = fams[i % len(fams)]
            if "lb:other-family" in want and i == 0:
                fam = 10 - fams[0]
            if "lb:ipv6" in want and i == 0 and 6 in fams:
                fam = 6
            ip = self.lb_ip(fam)
            if node_ok and i == 0:
                ip = self.p.node_ips[0] if fam == 4 else self.p.node_ips[1]
            if "invalid:lb-ip-leading-zeros" in want and i == 0 and fam == 4:
                ip = _leading_zeros(ip)
            if "invalid:lb-ip-link-local" in want and i == 0 and fam == 4:
                # ingress IPs get only the legacy IP check: link-local passes
                ip = self._unique(lambda: f"169.254.77.{r.randint(1, 254)}")
            mode = r.choices(["VIP", "Proxy", None], [5, 2, 2])[0]
            if "lb:proxy" in want and i == n - 1:
                mode = "Proxy"
            if "lb:ipmode-unset" in want and i == 0:
                mode = None
            ing: Obj = {"ip": ip}
            if mode is not None:
                ing["ipMode"] = mode
            out.append(ing)
        if "lb:hostname" in want or r.random() < 0.15:
            out.append({"hostname": f"lb{r.randint(1, 99)}.example.com"})
        return out

    def source_ranges(self, fams: list[int], want: set[str]) -> list[str]:
        r = self.rng
        pool4 = ["192.0.2.0/24", "198.18.0.0/15", "10.0.0.0/8", "172.16.5.0/24"]
        pool6 = ["2001:db8:5::/48", "2001:db8:77::/64"]
        out = r.sample(pool4, r.randint(1, 2))
        if 6 in fams and (r.random() < 0.5 or "sourceRanges:ipv6" in want):
            out.append(r.choice(pool6))
        if "sourceRanges:node" in want or r.random() < 0.3:
            out.append("192.168.77.0/24" if r.random() < 0.7 or 6 not in fams
                       else "fd00:77::/64")
        if "sourceRanges:zero" in want or r.random() < 0.03:
            out.append("0.0.0.0/0" if r.random() < 0.6 or 6 not in fams else "::/0")
        if "sourceRanges:padded" in want or r.random() < 0.1:
            out.append(" 192.0.2.128/25 ")
        if "sourceRanges:host-bits" in want or r.random() < 0.1:
            out.append("198.51.100.77/24")
        return out

    def conditions(self, want: set[str]) -> tuple[Obj | None, str]:
        kinds = ["ep:ready", "ep:conditions-unset", "ep:not-ready", "ep:serving-terminating",
                 "ep:terminating-not-serving"]
        k = next((f for f in kinds if f in want and self.chance(0.7)), None)
        if k is None:
            k = self.rng.choices(kinds, [12, 2, 2, 3, 1])[0]
        return {
            "ep:ready": {"ready": True, "serving": True, "terminating": False},
            "ep:conditions-unset": None,
            "ep:not-ready": {"ready": False, "serving": False, "terminating": False},
            "ep:serving-terminating": {"ready": False, "serving": True, "terminating": True},
            "ep:terminating-not-serving": {"ready": False, "serving": False,
                                           "terminating": True},
        }[k], k

    def endpoint(self, family: int, want: set[str]) -> Obj:
        r = self.rng
        node: str | None = r.choices([self.p.node_name, OTHER_NODES[0], OTHER_NODES[1], None],
                                     [3, 3, 2, 1])[0]
        if "ep:local" in want and self.chance(0.5):
            node = self.p.node_name
        ep: Obj = {"addresses": [self.pod_ip(family, node or "")]}
        if "ep:multi-address" in want and self.chance(0.5):
            ep["addresses"].append(self.pod_ip(family, node or ""))
        if "invalid:endpoint-leading-zeros" in want and family == 4 and self.chance(0.6):
            ep["addresses"][0] = _leading_zeros(ep["addresses"][0])
        elif "invalid:endpoint-multicast" in want and family == 4 and self.chance(0.5):
            ep["addresses"][0] = self._unique(lambda: f"233.252.1.{self.rng.randint(1, 254)}")
        cond, _ = self.conditions(want)
        if cond is not None:
            ep["conditions"] = cond
        if node is not None:
            ep["nodeName"] = node
            if self.zone_of(node):
                ep["zone"] = self.zone_of(node)
        return ep

    def hints(self, eps: list[Obj], mode: str, want: set[str]) -> None:
        """Hints as the EndpointSlice controller would write them for `mode`, or the variant
        `want` asks for (hinted elsewhere, one ready endpoint without hints)."""
        r = self.rng
        ready = [e for e in eps if e.get("conditions", {}).get("ready", True)]
        for e in eps:
            node = e.get("nodeName")
            zone = e.get("zone", "")
            h: Obj = {}
            if "hints:zone-empty-name" in want and not self.zone:
                # "" is a valid label value: this node (no zone label) and endpoints without a
                # node are hinted for it, the others for their zone
                h["forZones"] = [{"name": zone}]
            elif zone or "hints:zone-other" in want:
                zones = [zone or ZONES[2]]
                if "hints:zone-other" in want:
                    zones = [z for z in ZONES[1:] if z != self.zone][:1]
                h["forZones"] = [{"name": z} for z in zones]
            if mode == "PreferSameNode" and node:
                nodes = [node]
                if "hints:node-other" in want:
                    nodes = [OTHER_NODES[0] if node == self.p.node_name else node]
                h["forNodes"] = [{"name": n} for n in nodes]
            if h:
                e["hints"] = h
        if ready and ("hints:zone-partial" in want or "hints:node-partial" in want
                      or r.random() < 0.1):
            victim = r.choice(ready)
            h = victim.get("hints", {})
            if "hints:node-partial" in want and "forNodes" in h:
                del h["forNodes"]
            else:
                h.pop("forZones", None)
            if not h:
                victim.pop("hints", None)

    def slices_for(self, s: _Svc, want: set[str]) -> list[Obj]:
        r = self.rng
        out: list[Obj] = []
        fams = s.families or [r.choice([4, 6])]
        if s.kind == "ExternalName":
            fams = [4]
        if "slice:other-family" in want:
            fams = [*fams, 10 - fams[0]] if len(fams) == 1 else fams
        for fam in dict.fromkeys(fams):
            n_slices = 2 if want & {"slice:multi", "slice:headless-label",
                                    "slice:proxy-name-label"} or r.random() < 0.2 else 1
            ports = [{"name": p.name, "protocol": p.protocol, "port": p.target}
                     for p in s.ports]
            if "slice:port-name-mismatch" in want and ports:
                ports[-1] = dict(ports[-1], name="other")
            if "slice:protocol-mismatch" in want and ports:
                alt = next(x for x in PROTOCOLS if x != ports[0]["protocol"])
                ports[0] = dict(ports[0], protocol=alt)
            if "slice:port-nil" in want:
                ports.append({"name": "nil-port", "protocol": "TCP"})
            if "slice:port-zero" in want:
                ports.append({"name": "zero-port", "protocol": "TCP", "port": 0})
            for i in range(n_slices):
                count = r.choices([0, 1, 2, 3, 4], [1, 3, 4, 3, 2])[0]
                if any(f.startswith(("ep:", "hints:", "invalid:endpoint")) for f in want):
                    count = max(count, 2)
                if "ep:none" in want:
                    count = 0
                eps = [self.endpoint(fam, want) for _ in range(count)]
                if s.td is not None or any(f.startswith("hints:") for f in want):
                    self.hints(eps, s.td or "PreferClose", want)
                ann = {}
                if "ann:ipvsproxy-weight" in want and i == 0:
                    ann["ipvsproxy.io/weight"] = str(r.randint(2, 5))
                labels = {}
                if "slice:headless-label" in want and i == 1:
                    labels[LABEL_HEADLESS] = ""
                if "slice:proxy-name-label" in want and i == 1:
                    labels[LABEL_PROXY_NAME] = "someone-else"
                out.append(_slice(s.ns, f"{s.name}-v{fam}-{i}", s.name, f"IPv{fam}",
                                  copy.deepcopy(ports), eps, labels, ann))
        if "ep:duplicate" in want and out and out[0]["endpoints"]:
            dup = copy.deepcopy(out[0]["endpoints"][0])
            dup["nodeName"] = self.p.node_name
            dup.pop("zone", None)
            dup.pop("hints", None)
            extra = copy.deepcopy(out[0])
            extra["metadata"]["name"] = f"{s.name}-dup"
            extra["endpoints"] = [dup]
            out.append(extra)
        if "slice:fqdn" in want:
            out.append(_slice(s.ns, f"{s.name}-fqdn", s.name, "FQDN",
                              [{"name": p.name, "protocol": p.protocol, "port": p.target}
                               for p in s.ports[:1]],
                              [{"addresses": [f"pod1.{s.name}.example.com"]}]))
        if "slice:no-service-label" in want:
            sl = copy.deepcopy(out[0]) if out else None
            if sl is not None:
                sl["metadata"]["name"] = f"{s.name}-nolabel"
                del sl["metadata"]["labels"][LABEL_SERVICE_NAME]
                out.append(sl)
        return out

    # ---- services

    def service(self, want: set[str]) -> _Svc:
        r = self.rng
        ns = r.choice(self.p.namespaces)
        lb_feats = {"svc:LoadBalancer", "hcnp", "lb:no-nodeports", "lb:no-status"}
        if "svc:ExternalName" in want:
            kind = "ExternalName"
        elif "svc:headless" in want:
            kind = "headless"
        elif want & lb_feats or any(f.startswith(("lb:", "sourceRanges", "invalid:lb"))
                                    for f in want):
            kind = "LoadBalancer"
        elif "svc:NodePort" in want or "nodeport:tcp-udp-same-number" in want:
            kind = "NodePort"
        elif "svc:ClusterIP" in want or "externalIPs:clusterip-local" in want:
            kind = "ClusterIP"
        else:
            kind = r.choices(["ClusterIP", "NodePort", "LoadBalancer", "ExternalName",
                              "headless"], [6, 3, 4, 1, 1])[0]
        s = _Svc(ns, self.name(ns, {"ClusterIP": "cip", "NodePort": "np", "LoadBalancer": "lb",
                                    "ExternalName": "xn", "headless": "hl"}[kind]), kind)
        if kind == "ExternalName":
            s.policy = None
            if r.random() < 0.5:
                s.ports = self.ports("ClusterIP", want)
            s.slices = self.slices_for(s, want)
            return s
        s.families, s.policy = self.families(want)
        if kind == "headless":
            s.ports = self.ports("ClusterIP", want)
            s.slices = self.slices_for(s, want)
            return s
        s.cluster_ips = [self.cluster_ip(f) for f in s.families]
        s.ports = self.ports(kind, want)
        for p in s.ports:
            self.cluster_frontends.setdefault((p.protocol, p.port), s.cluster_ips[0])
        ext = "externalIPs" in want or "lb:same-as-externalIP" in want or any(
            f.startswith(("externalIPs:", "invalid:externalIP")) for f in want) \
            or r.random() < 0.2
        if ext:
            fams = s.families + ([6] if "externalIPs:ipv6" in want and 6 not in s.families
                                 else [])
            s.external_ips = [self.external_ip(r.choice(fams)) for _ in range(r.randint(1, 2))]
            if "externalIPs:ipv6" in want:
                s.external_ips.append(self.external_ip(6))
            if "externalIPs:node-address" in want and self.claim_node_address(s.ports):
                s.external_ips.append(self.p.node_ips[0])
            if "invalid:externalIP-leading-zeros" in want:
                s.external_ips.append(_leading_zeros(self.external_ip(4)))
            if "invalid:externalIP-ipv4-mapped" in want:
                s.external_ips.append("::ffff:" + self.external_ip(4))
            if "invalid:externalIP-multicast" in want:
                # multicast, not link-local: the API server accepts it (ValidateEndpointIP)
                s.external_ips.append(self._unique(lambda: f"233.252.0.{r.randint(1, 254)}"))
            if "externalIPs:service-range" in want:
                # another Service's clusterIP and port when there is one (a claim on it, as in
                # CVE-2020-8554), else a free address of the range
                s.external_ips.append(self.claim_cluster_ip(s.ports))
            s.external_ips = list(dict.fromkeys(s.external_ips))
        if s.externally_accessible:
            local = {"etp:Local", "hcnp", "externalIPs:clusterip-local",
                     "etp:Local-no-local-endpoints"} & want
            s.etp = "Local" if local or r.random() < 0.4 else "Cluster"
        if "itp:Local" in want or r.random() < 0.15:
            s.itp = "Local"
        if "affinity:ClientIP" in want or "affinity:default-timeout" in want \
                or r.random() < 0.25:
            s.affinity = 0 if "affinity:default-timeout" in want or r.random() < 0.3 \
                else r.choice([1, 60, 3600, 10800, 86400, r.randint(1, 86400)])
        if kind == "LoadBalancer":
            if "lb:no-nodeports" in want or r.random() < 0.15:
                s.alloc_node_ports = False
                for p in s.ports:
                    self.used_node_ports.discard(p.node_port)
                    p.node_port = 0
            if s.etp == "Local":
                s.hcnp = self.node_port()
            if any(f.startswith("sourceRanges") for f in want) or r.random() < 0.4:
                s.source_ranges = self.source_ranges(s.families, want)
            if "lb:no-status" not in want and (r.random() < 0.9 or any(
                    f.startswith(("lb:", "invalid:lb")) for f in want)):
                s.ingress = self.ingress(s.families, want, s.ports)
                same = [a for a in s.external_ips if ":" not in a or a.startswith("2001")]
                if "lb:same-as-externalIP" in want and same and "ip" in s.ingress[0]:
                    s.ingress[0]["ip"] = same[0]
        td = next((f.split(":")[1] for f in want if f.startswith("td:")), None)
        if td is None and any(f.startswith("hints:node") for f in want):
            td = "PreferSameNode"
        if td is None and (any(f.startswith("hints:") for f in want) or r.random() < 0.25):
            td = r.choice(["PreferClose", "PreferSameZone", "PreferSameNode"])
        s.td = td
        if "label:service-proxy-name" in want:
            s.labels[LABEL_PROXY_NAME] = "someone-else"
        if "ann:ipvsproxy-scheduler" in want:
            s.annotations["ipvsproxy.io/scheduler"] = r.choice(["wrr", "lc", "sh", "mh"])
        if r.random() < 0.1:
            s.annotations["example.com/note"] = "differential"
        s.slices = self.slices_for(s, want)
        if "etp:Local-no-local-endpoints" in want:
            for sl in s.slices:
                for e in sl["endpoints"]:
                    if e.get("nodeName") == self.p.node_name:
                        e["nodeName"] = OTHER_NODES[0]
                        e["zone"] = self.zone_of(OTHER_NODES[0])
                        e.pop("hints", None)
        return s

    def node(self, want: set[str]) -> Obj:
        r = self.rng
        self.zone = "" if "node:no-zone" in want or r.random() < 0.2 else ZONES[0]
        ipv4_only = "node:ipv4-only" in want or r.random() < 0.1
        self.node_families = (4,) if ipv4_only else (4, 6)
        labels = {"kubernetes.io/hostname": self.p.node_name, "kubernetes.io/os": "linux"}
        if self.zone:
            labels[LABEL_ZONE] = self.zone
        addrs = [{"type": "InternalIP", "address": self.p.node_ips[0]}]
        if not ipv4_only:
            addrs.append({"type": "InternalIP", "address": self.p.node_ips[1]})
        addrs.append({"type": "Hostname", "address": self.p.node_name})
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.p.node_name, "labels": labels},
                "status": {"addresses": addrs}}


def _leading_zeros(ip: str) -> str:
    """The same IPv4 address with leading zeros, which the API server's legacy IP validation
    accepts (StrictIPCIDRValidation is off in 1.35) and kube-proxy parses as decimal."""
    return ".".join(f"{int(x):03d}" for x in ip.split("."))


# Features a service can be built around (the node's and the orphan slice's come anyway), in
# one fixed order that consecutive seeds walk through.
_FOCUS = [f for f in FEATURES if f not in NODE_FEATURES and f not in (
    "slice:orphan", "ep:ready", "ep:remote", "ep:no-node")]
_FOCUS_ORDER = random.Random(0).sample(_FOCUS, len(_FOCUS))


def generate(seed: int, params: Params | None = None) -> Cluster:
    """One cluster: `params.services` Services (plus their slices), deterministic in `seed`."""
    p = params or Params()
    g = _Gen(seed, p)
    # consecutive seeds take turns through every feature
    focus = [_FOCUS_ORDER[(seed * p.services + i) % len(_FOCUS_ORDER)]
             for i in range(p.services)]
    node_want = {g.rng.choice(NODE_FEATURES)}
    if "hints:zone-empty-name" in focus:  # only meaningful on a node without a zone
        node_want = {"node:no-zone"}
    node = g.node(node_want)
    services: list[_Svc] = []
    for i in range(p.services):
        want = {focus[i]}
        # every cluster has each proxied type: the last services take the missing ones
        missing = [k for k in ("ClusterIP", "NodePort", "LoadBalancer")
                   if k not in {s.kind for s in services}]
        extra = g.rng.sample(_FOCUS, 2)
        want |= {f for f in extra if g.rng.random() < 0.5}
        if missing and p.services - i <= len(missing):
            want = {f"svc:{missing[0]}"}
        if g.zone and "hints:zone-empty-name" in want:
            want.discard("hints:zone-empty-name")
            want.add("hints:zone")
        services.append(g.service(want))
    slices = [sl for s in services for sl in s.slices]
    # a slice for a Service that does not exist
    ns = g.rng.choice(p.namespaces)
    orphan = _Svc(ns, "no-such-service", "ClusterIP", [4], ports=[_Port("", "TCP", 80, 8080)])
    slices += [dict(sl, metadata=dict(sl["metadata"], name=f"orphan-{seed}"))
               for sl in g.slices_for(orphan, set())[:1]]
    return Cluster(
        seed, p,
        [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
         for n in p.namespaces],
        node,
        [s.service() for s in services],
        [st for s in services if (st := s.status()) is not None],
        slices,
    )
