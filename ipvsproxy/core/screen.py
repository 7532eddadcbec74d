"""What one Service may claim on this node, decided before any of its virtual servers is built.

Objects come from tenants: anyone who may edit a Service in one namespace writes its
externalIPs and annotations, and ipvsproxy turns them into kernel state on every node. So
`screen()` takes out of a Service, each with a Problem naming it:
- the externalIPs and LoadBalancer IPs that are not the tenant's to claim: inside the cluster's
  service ranges (a ClusterIP's, whoever holds it: CVE-2020-8554), inside the pod network
  (--cluster-cidr, and this node's podCIDRs: another tenant's pod), a node's address (this
  node's own, and for externalIPs any inside --node-network-cidrs), or, for externalIPs,
  outside --external-ip-cidrs when it is set. An externalIP that is a node's address is allowed
  only inside --external-ip-cidrs (the operator's bare-metal pattern: an ingress published on
  the nodes' own IPs), and then served without being bound to kube-ipvs0, as kube-proxy serves
  this node's: binding another node's address here would take this node's traffic to that node;
- a scheduler this node's kernel does not have (the kernel would refuse the virtual server,
  at every sync, after trying to load `ip_vs_<name>`): the default is used;
- the whole Service when it would expand into more virtual servers and source-range entries
  than --max-objects-per-service (500 ports x 400 externalIPs was 200,500 virtual servers on
  every node, more memory than the DaemonSet's limit).
Which of several legitimate claims wins is core/desired.py's. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from ipvsproxy.core.model import ANN_SCHEDULER, Problem, Service

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network


@dataclass(frozen=True, slots=True)
class Screen:
    own: Mapping[IPAddress, str]  # this node's addresses -> where (an interface, "its Node")
    service_ranges: tuple[IPNetwork, ...] = ()
    pod_ranges: tuple[tuple[IPNetwork, str], ...] = ()  # (range, what it is)
    node_networks: tuple[IPNetwork, ...] = ()  # --node-network-cidrs
    allowed: tuple[IPNetwork, ...] = ()  # --external-ip-cidrs; () = any externalIP
    schedulers: frozenset[str] | None = None  # None: unknown, every known name is tried
    max_objects: int = 0  # 0: no limit
    families: tuple[int, ...] = (4,)
    nodeips: Mapping[int, int] | None = None  # family -> addresses serving NodePorts


def screen(svc: Service, sc: Screen) -> tuple[Service | None, list[Problem]]:
    """`svc` without what it may not claim here, or None when it may claim nothing."""
    problems: list[Problem] = []
    if svc.external_ips or svc.lb_ingress_ips:
        svc = _addresses(svc, sc, problems)
    if svc.scheduler and sc.schedulers is not None and svc.scheduler not in sc.schedulers:
        problems.append(Problem("Service", svc.namespace, svc.name,
                                f"annotation {ANN_SCHEDULER}={svc.scheduler!r}: this node's "
                                f"kernel has no ip_vs_{svc.scheduler} module; using the "
                                "default"))
        svc = replace(svc, scheduler="")
    if sc.max_objects and _rough_objects(svc, sc) > sc.max_objects:
        n = objects(svc, sc)
        if n > sc.max_objects:
            problems.append(Problem(
                "Service", svc.namespace, svc.name,
                f"expands to {n} virtual servers and source-range entries on this node, more "
                f"than --max-objects-per-service={sc.max_objects}; not programmed"))
            return None, problems
    return svc, problems


def objects(svc: Service, sc: Screen) -> int:
    """The virtual servers (every port at every address, NodePorts at every node address) and
    LoadBalancer source-range set entries the Service makes on this node."""
    nodeips = sc.nodeips or {}
    node_ports = sum(1 for sp in svc.ports if sp.node_port)
    n = 0
    for fam in sc.families:
        cips = sum(1 for a in svc.cluster_ips if a.version == fam)
        if not cips:
            continue  # no virtual server of this family at all (desired.py skips it)
        ext = sum(1 for a in svc.external_ips if a.version == fam)
        lb = sum(1 for a in svc.lb_ingress_ips if a.version == fam)
        ranges = sum(1 for r in svc.lb_source_ranges if r.version == fam)
        n += len(svc.ports) * (cips + ext + lb + lb * ranges) + node_ports * nodeips.get(fam, 0)
    return n


def _rough_objects(svc: Service, sc: Screen) -> int:
    """An upper bound of objects() in a few multiplications: most Services are far below the
    limit, and this runs for every Service at every full sync."""
    lb = len(svc.lb_ingress_ips)
    addrs = len(svc.cluster_ips) + len(svc.external_ips) + lb + lb * len(svc.lb_source_ranges)
    return len(svc.ports) * (addrs + sum((sc.nodeips or {}).values()))


def _addresses(svc: Service, sc: Screen, problems: list[Problem]) -> Service:
    unbound: list[IPAddress] = []

    def why_not(a: IPAddress, external: bool) -> str:
        if (r := _inside(a, sc.service_ranges)) is not None:
            return f"inside the service range {r}"
        for net, what in sc.pod_ranges:
            if a in net:
                return f"inside {what} {net}"
        node = sc.own.get(a)
        where = f"an address of this node ({node})" if node is not None else ""
        if not external:
            return where
        if not where and (r := _inside(a, sc.node_networks)) is not None:
            where = f"inside the node network {r} (--node-network-cidrs)"
        allowed = _inside(a, sc.allowed) is not None
        if where:
            if allowed:  # the operator's own pattern: served, never bound (see the docstring)
                unbound.append(a)
                return ""
            return f"{where}, which only --external-ip-cidrs can allow"
        return "" if allowed or not sc.allowed else "outside --external-ip-cidrs"

    def keep(what: str, addrs: tuple[IPAddress, ...], external: bool) -> tuple[IPAddress, ...]:
        out = []
        for a in addrs:
            why = why_not(a, external)
            if why:
                problems.append(Problem("Service", svc.namespace, svc.name,
                                        f"{what} {a} is {why}; ignored"))
            else:
                out.append(a)
        return addrs if len(out) == len(addrs) else tuple(out)

    ext = keep("externalIP", svc.external_ips, True)
    lb = keep("loadBalancer ingress IP", svc.lb_ingress_ips, False)
    if ext is svc.external_ips and lb is svc.lb_ingress_ips and not unbound:
        return svc
    return replace(svc, external_ips=ext, lb_ingress_ips=lb, unbound_ips=tuple(unbound))


def _inside(a: IPAddress, nets: Sequence[IPNetwork]) -> IPNetwork | None:
    return next((n for n in nets if a in n), None)
