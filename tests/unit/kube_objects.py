"""Plain API objects and plain views of the desired state, for the table-driven desired/plan tests.

Builders return the dicts the API server would serve (only the fields the proxy reads); views turn
a `Desired` into strings (`"TCP 10.96.0.1:80"`, `"10.244.1.5:8080"`), so a test case is plain data
in and plain data out.
"""

from __future__ import annotations

from collections.abc import Mapping
from ipaddress import ip_address
from typing import Any

from ipvsproxy.core.cluster import build_snapshot
from ipvsproxy.core.desired import Desired, HostFacts, compute_desired
from ipvsproxy.core.tables import family_name
from ipvsproxy.settings.config import Config

NODE = "node-a"
# A node with the usual clutter: loopback, a primary NIC (v4, v6 and v6 link-local), a CNI
# bridge, and an address already on kube-ipvs0 (never a node IP).
HOST = HostFacts(addresses=tuple((i, ip_address(a)) for i, a in (
    ("lo", "127.0.0.1"), ("lo", "::1"),
    ("eth0", "192.168.1.10"), ("eth0", "2001:db8::10"), ("eth0", "fe80::1"),
    ("cni0", "10.244.1.1"), ("kube-ipvs0", "10.96.0.99"))))
CFG = Config(hostname=NODE)
CFG46 = Config(hostname=NODE, families=(4, 6))


def port(port: int, name: str = "", proto: str = "TCP", node_port: int = 0) -> dict[str, Any]:
    p: dict[str, Any] = {"name": name, "port": port, "protocol": proto}
    if node_port:
        p["nodePort"] = node_port
    return p


def service(name: str, ip: str | list[str], *ports: dict[str, Any], type_: str = "ClusterIP",
            ns: str = "default", labels: Mapping[str, str] | None = None,
            annotations: Mapping[str, str] | None = None, ingress: list[Any] | None = None,
            **spec: Any) -> dict[str, Any]:
    """A Service. `ingress` items are IP strings or full ingress dicts (ipMode, hostname)."""
    ips = [ip] if isinstance(ip, str) else ip
    obj: dict[str, Any] = {
        "kind": "Service",
        "metadata": {"namespace": ns, "name": name, "labels": dict(labels or {}),
                     "annotations": dict(annotations or {})},
        "spec": {"type": type_, "clusterIP": ips[0], "clusterIPs": ips,
                 "ports": list(ports) or [port(80)], **spec}}
    if ingress is not None:
        obj["status"] = {"loadBalancer": {"ingress": [
            {"ip": i} if isinstance(i, str) else i for i in ingress]}}
    return obj


def ep(ip: str, node: str = "", ready: bool | None = True, serving: bool | None = None,
       terminating: bool | None = None, zones: list[str] | None = None,
       nodes: list[str] | None = None) -> dict[str, Any]:
    """One endpoint; None leaves a condition unset (kube-proxy's defaults apply)."""
    cond = {k: v for k, v in (("ready", ready), ("serving", serving),
                              ("terminating", terminating)) if v is not None}
    e: dict[str, Any] = {"addresses": [ip], "conditions": cond}
    if node:
        e["nodeName"] = node
    if zones is not None:
        e.setdefault("hints", {})["forZones"] = [{"name": z} for z in zones]
    if nodes is not None:
        e.setdefault("hints", {})["forNodes"] = [{"name": n} for n in nodes]
    return e


def slice_(svc: str, *endpoints: dict[str, Any], name: str = "", port: int = 80,
           port_name: str = "", proto: str = "TCP", family: str = "IPv4",
           ports: list[dict[str, Any]] | None = None, ns: str = "default",
           weight: str | None = None, labels: Mapping[str, str] | None = None
           ) -> dict[str, Any]:
    """An EndpointSlice of `svc` (labelled kubernetes.io/service-name unless `labels` given)."""
    meta: dict[str, Any] = {"namespace": ns, "name": name or f"{svc}-{family.lower()}",
                            "labels": dict(labels if labels is not None
                                           else {"kubernetes.io/service-name": svc})}
    if weight is not None:
        meta["annotations"] = {"ipvsproxy.io/weight": weight}
    return {"kind": "EndpointSlice", "addressType": family, "metadata": meta,
            "ports": ports if ports is not None else [
                {"name": port_name, "port": port, "protocol": proto}],
            "endpoints": list(endpoints)}


def node(name: str = NODE, *addrs: str, zone: str = "") -> dict[str, Any]:
    addresses = addrs or ("192.168.1.10", "2001:db8::10")
    labels = {"topology.kubernetes.io/zone": zone} if zone else {}
    return {"kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"addresses": [{"type": "InternalIP", "address": a} for a in addresses]}}


def desired(*docs: Any, cfg: Config = CFG, host: HostFacts = HOST,
            with_node: bool = True) -> Desired:
    """compute_desired over the objects (and a default Node unless one is given)."""
    objs = list(docs)
    if with_node and not any(d.get("kind") == "Node" for d in objs):
        objs.append(node())
    return compute_desired(build_snapshot(objs, cfg.hostname), host, cfg)


def host(*addrs: tuple[str, str]) -> HostFacts:
    return HostFacts(addresses=tuple((i, ip_address(a)) for i, a in addrs))


# ----------------------------------------------------------------------------------- views


def vs(d: Desired) -> dict[str, list[str]]:
    """Virtual server -> its real servers, e.g. {"TCP 10.96.0.1:80": ["10.244.1.5:8080"]}."""
    return {str(k): [str(rs.key) for rs in d.dests.get(k, ())] for k in sorted(d.services)}


def weights(d: Desired) -> dict[str, dict[str, int]]:
    return {str(k): {str(rs.key): rs.weight for rs in d.dests.get(k, ())}
            for k in sorted(d.services)}


def vs_attrs(d: Desired) -> dict[str, tuple[str, int, int, int]]:
    """Virtual server -> (scheduler, flags, timeout, effective netmask)."""
    return {str(k): (v.scheduler, v.flags, v.timeout, v.effective_netmask)
            for k, v in sorted(d.services.items())}


def members(d: Desired, name: str, family: int = 4) -> set[str]:
    """Members of a set, by its IPv4 name (the IPv6 spelling is derived)."""
    return set(d.sets[family_name(name, family)])


def nonempty(d: Desired) -> dict[str, set[str]]:
    return {n: set(m) for n, m in d.sets.items() if m}


def chain(d: Desired, table: str, name: str, family: int = 4) -> list[str]:
    """The rules of one chain without the `-A CHAIN ` prefix."""
    return [r.split(" ", 2)[2] for r in d.rules[family][table][name]]


def addrs(d: Desired) -> set[str]:
    return {str(a) for a in d.addresses}


def problems(d: Desired) -> list[str]:
    return [str(p) for p in d.problems]
