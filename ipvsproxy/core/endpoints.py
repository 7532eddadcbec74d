"""Which endpoints a service port uses on this node: merge its EndpointSlices, then categorize.

Mirrors kube-proxy's endpointslicecache.go (merge: port matched by name and protocol, one entry
per ip:port, a local duplicate wins) and pkg/proxy/topology.go CategorizeEndpoints (ready
endpoints, topology by node and zone hints, the serving-and-terminating fallback, local lists).
Pure functions over core.model values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from typing import NamedTuple

from ipvsproxy.core.model import EndpointSlice, Service, ServicePort

IPAddress = IPv4Address | IPv6Address


class Ep(NamedTuple):
    """One endpoint of one service port (a NamedTuple: 100,000 of them are made per full sync,
    at a third of a frozen dataclass's cost)."""

    addr: IPAddress
    port: int
    weight: int
    ready: bool
    serving: bool
    terminating: bool
    local: bool
    zones: frozenset[str]
    has_hints: bool
    nodes: frozenset[str]
    usable: bool = True  # False: refused (EndpointSlice.refused), counted but never programmed

    @property
    def serving_terminating(self) -> bool:
        return self.serving and self.terminating


def port_endpoints(slices: Sequence[EndpointSlice], sp: ServicePort, family: int,
                   node_name: str) -> list[Ep]:
    """Every endpoint of service port `sp` of `family`, de-duplicated by ip:port and ordered by
    it (as the kernel lists real servers, DestKey order); the refused ones (usable=False) last,
    so that `categorize` can tell there are some from the last."""
    # keyed by the address as an int: IPv4Address hashes via hex() (a third of this function's
    # time at 100,000 endpoints); one family per call, so the int is unique
    found: dict[tuple[int, int], Ep] = {}
    refused: list[tuple[int, EndpointSlice]] = []
    # endpointslicecache.go isLocal: the exact name (the API server admits lowercase node names
    # only), and nothing is local without a node name
    mine = node_name or None
    new = tuple.__new__
    for sl in slices:
        if sl.family != family:
            continue
        port = next((p.port for p in sl.ports
                     if p.name == sp.name and p.protocol == sp.protocol), None)
        if port is None:
            continue
        if sl.refused:
            refused.append((port, sl))
        for e in sl.endpoints:
            local = e.node_name == mine
            key = (int(e.addr), port)
            # endpointslicecache.go addEndpoints: first one wins, unless a later one is local
            if key not in found or local:
                # tuple.__new__: the NamedTuple without its generated __new__'s Python frame
                found[key] = new(Ep, (e.addr, port, sl.weight, e.ready, e.serving,
                                      e.terminating, local, e.zone_hints, e.has_hints,
                                      e.node_hints, True))
    out = [found[k] for k in sorted(found)]  # int keys sort in C; ipaddress's __lt__ is slow
    if refused:
        unusable: dict[tuple[int, int], Ep] = {}
        for port, sl in refused:
            for e in sl.refused:
                key = (int(e.addr), port)
                if key not in found:  # a refused spelling never stands in for a usable address
                    local = e.node_name == mine
                    unusable[key] = Ep(e.addr, port, sl.weight, e.ready, e.serving,
                                       e.terminating, local, e.zone_hints, e.has_hints,
                                       e.node_hints, False)
        out += [unusable[k] for k in sorted(unusable)]
    return out


def externally_accessible(svc: Service, sp: ServicePort, family: int = 0) -> bool:
    """A NodePort, or LB / external IPs of `family` (0: any). kube-proxy's ServicePort of one
    family only holds that family's externalIPs and LB IPs (serviceport.go)."""
    return sp.node_port != 0 or any(a.version == family or not family
                                    for a in (*svc.lb_ingress_ips, *svc.external_ips))


def uses_cluster(svc: Service, sp: ServicePort, family: int = 0) -> bool:
    return not svc.internal_local or externally_accessible(svc, sp, family)


def uses_local(svc: Service, sp: ServicePort, family: int = 0) -> bool:
    return svc.internal_local or (svc.external_local
                                  and externally_accessible(svc, sp, family))


def topology(eps: Sequence[Ep], node_name: str, zone: str) -> str:
    """topology.go topologyModeFromHints: "PreferSameNode" when every ready endpoint has a node
    hint and one is for this node, else "PreferSameZone" when every ready endpoint has a zone
    hint and one is for this node's zone (which may be "", a node without the label, matching
    a hint for the zone ""), else "" (every ready endpoint)."""
    ready = [e for e in eps if e.ready]
    if not ready:
        return ""
    if all(e.nodes for e in ready) and any(node_name in e.nodes for e in ready):
        return "PreferSameNode"
    if all(e.has_hints for e in ready) and any(zone in e.zones for e in ready):
        return "PreferSameZone"
    return ""


def _available(e: Ep, mode: str, node_name: str, zone: str) -> bool:
    """topology.go availableForTopology, for a `mode` that is not ""."""
    return node_name in e.nodes if mode == "PreferSameNode" else zone in e.zones


@dataclass(frozen=True, slots=True)
class Categorized:
    cluster: tuple[Ep, ...]
    local: tuple[Ep, ...]
    has_any: bool  # any usable endpoint anywhere (for the no-local-endpoints accounting)


def categorize(eps: Sequence[Ep], svc: Service, sp: ServicePort, zone: str,
               family: int = 0, node_name: str = "") -> Categorized:
    """CategorizeEndpoints. Refused endpoints (a multicast address, an ambiguous spelling)
    are chosen as kube-proxy chooses them, then left out: kube-proxy counts them too (one
    without hints turns topology off; a ready one stops the fallback to terminating ones) and
    then fails to program them (the kernel refuses a multicast real server, ip_vs_ctl.c
    ip_vs_new_dest). Found by the differential suite."""
    cluster: list[Ep] = []
    local: list[Ep] = []
    has_any = False
    if uses_cluster(svc, sp, family):
        if mode := topology(eps, node_name, zone):
            cluster = [e for e in eps if e.ready and _available(e, mode, node_name, zone)]
        else:  # no topology (most services): every ready endpoint, without a call for each
            cluster = [e for e in eps if e.ready]
        if not cluster:
            cluster = [e for e in eps if e.serving_terminating]
        has_any = bool(cluster)
    if uses_local(svc, sp, family):
        has_any = has_any or any(e.ready or e.serving_terminating for e in eps)
        local = [e for e in eps if e.local and e.ready]
        if not local:
            local = [e for e in eps if e.local and e.serving_terminating]
    if eps and not eps[-1].usable:
        cluster = [e for e in cluster if e.usable]
        local = [e for e in local if e.usable]
    return Categorized(tuple(cluster), tuple(local), has_any)
