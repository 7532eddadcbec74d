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

This module owns the generator: `_Gen` (a Service built around the features it is asked for,
and this node's Node; the EndpointSlices come from slices.py's `_SliceGen`, the allocators from
model.py's `_Alloc`) and `generate()`. cluster.py holds the values it makes; features.py reads
back which features a cluster covers, validity.py checks the objects offline against the API
server's rules (pkg/apis/core/validation and pkg/apis/discovery/validation at v1.35.4), and
changes.py makes change series.
"""

from __future__ import annotations

import random

from tests.differential.cluster import (
    FEATURES,
    LABEL_PROXY_NAME,
    LABEL_ZONE,
    NODE_FEATURES,
    OTHER_NODES,
    PROTOCOLS,
    ZONES,
    Cluster,
    Obj,
    Params,
)
from tests.differential.model import _leading_zeros, _Port, _Svc
from tests.differential.slices import _SliceGen


class _Gen(_SliceGen):
    """The generator: Services and the Node, on the EndpointSlices and allocators it extends."""

    # ---- building blocks

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
        td = next((f.split(":")[1] for f in sorted(want) if f.startswith("td:")), None)
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
