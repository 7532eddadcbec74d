"""Offline validity of generated objects: what the API server (pkg/apis/core/validation and
pkg/apis/discovery/validation at v1.35.4) would refuse, as far as it can be checked without it;
the real server checks the rest when the lab loads a cluster.
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network

from tests.differential.cluster import (
    LABEL_MANAGED_BY,
    MANAGED_BY,
    Cluster,
    Obj,
    Params,
    key_of,
)


def problems(cluster: Cluster) -> list[str]:
    """What the API server would refuse, as far as it can be checked offline (the real server
    checks the rest in the lab): ranges, uniqueness, the Service field combinations of
    validateService, EndpointSlice limits. An empty list means none found."""
    return check_objects(cluster.params, [cluster.node], cluster.services, cluster.lb_status,
                         cluster.slices)


def check_objects(p: Params, nodes: list[Obj], services: list[Obj], lb_status: list[Obj],
                  slices: list[Obj]) -> list[str]:
    out: list[str] = []
    nets: dict[int, IPv4Network | IPv6Network] = {ip_network(c).version: ip_network(c)
                                                  for c in p.service_cidrs}
    ips: set[str] = set()
    node_ports: dict[int, str] = {}
    lo, hi = p.node_port_range
    seen: set[tuple[str, str]] = set()
    for svc in services:
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        where = f"Service {ns}/{name}"
        if (ns, name) in seen:
            out.append(f"{where}: duplicate")
        seen.add((ns, name))
        if not _dns1035(name):
            out.append(f"{where}: name is not a DNS-1035 label")
        spec = svc["spec"]
        kind = spec["type"]
        cips = spec.get("clusterIPs", [])
        if kind == "ExternalName":
            if cips or "ipFamilies" in spec or "ipFamilyPolicy" in spec:
                out.append(f"{where}: ExternalName with clusterIPs or ipFamilies")
        elif cips != ["None"]:
            if spec.get("clusterIP") != (cips[0] if cips else None):
                out.append(f"{where}: clusterIP is not clusterIPs[0]")
            fams = spec.get("ipFamilies")
            for i, a in enumerate(cips):
                cip = ip_address(a)
                if cip not in nets[cip.version]:
                    out.append(f"{where}: clusterIP {a} outside {nets[cip.version]}")
                if a in ips:
                    out.append(f"{where}: clusterIP {a} used twice")
                ips.add(a)
                if fams is not None and fams[i] != f"IPv{cip.version}":
                    out.append(f"{where}: clusterIPs[{i}] is not of ipFamilies[{i}]")
            if len({ip_address(a).version for a in cips}) != len(cips):
                out.append(f"{where}: two clusterIPs of one family")
            if len(cips) == 2 and spec.get("ipFamilyPolicy") == "SingleStack":
                out.append(f"{where}: SingleStack with two clusterIPs")
        ports = spec.get("ports", [])
        if not ports and kind != "ExternalName" and cips != ["None"]:
            out.append(f"{where}: no ports")
        names = [pt.get("name", "") for pt in ports]
        if len(ports) > 1 and ("" in names or len(set(names)) != len(names)):
            out.append(f"{where}: ports need unique names")
        if len({(pt["protocol"], pt["port"]) for pt in ports}) != len(ports):
            out.append(f"{where}: duplicate (protocol, port)")
        for pt in ports:
            if not 1 <= pt["port"] <= 65535:
                out.append(f"{where}: port {pt['port']}")
            np_ = pt.get("nodePort", 0)
            if np_:
                if kind == "ClusterIP":
                    out.append(f"{where}: nodePort on a ClusterIP service")
                if not lo <= np_ <= hi:
                    out.append(f"{where}: nodePort {np_} outside the range")
                if node_ports.setdefault(np_, where) != where:
                    out.append(f"{where}: nodePort {np_} used by {node_ports[np_]} too")
            elif kind == "NodePort" or (kind == "LoadBalancer"
                                        and spec.get("allocateLoadBalancerNodePorts")):
                out.append(f"{where}: nodePort left to the allocator")
        ext_access = kind in ("NodePort", "LoadBalancer") or (
            kind == "ClusterIP" and bool(spec.get("externalIPs")))
        if ext_access != ("externalTrafficPolicy" in spec):
            out.append(f"{where}: externalTrafficPolicy set iff externally accessible")
        needs_hc = kind == "LoadBalancer" and spec.get("externalTrafficPolicy") == "Local"
        hc = spec.get("healthCheckNodePort", 0)
        if needs_hc != bool(hc):
            out.append(f"{where}: healthCheckNodePort iff LoadBalancer and Local")
        if hc:
            if not lo <= hc <= hi:
                out.append(f"{where}: healthCheckNodePort {hc} outside the range")
            if node_ports.setdefault(hc, where + " hc") != where + " hc":
                out.append(f"{where}: healthCheckNodePort {hc} used twice")
        if kind != "LoadBalancer" and ("loadBalancerSourceRanges" in spec
                                       or "allocateLoadBalancerNodePorts" in spec):
            out.append(f"{where}: LoadBalancer fields on a {kind}")
        if kind == "LoadBalancer" and "allocateLoadBalancerNodePorts" not in spec:
            out.append(f"{where}: allocateLoadBalancerNodePorts is required")
        aff = spec.get("sessionAffinityConfig")
        if aff is not None:
            t = aff["clientIP"]["timeoutSeconds"]
            if spec.get("sessionAffinity") != "ClientIP" or not 1 <= t <= 86400:
                out.append(f"{where}: sessionAffinityConfig")
        if kind != "ExternalName" and spec.get("internalTrafficPolicy") not in ("Cluster",
                                                                                "Local"):
            out.append(f"{where}: internalTrafficPolicy is required")
        for r in spec.get("loadBalancerSourceRanges", []):
            try:
                ip_network(r.strip(), strict=False)
            except ValueError:
                out.append(f"{where}: source range {r!r}")
        for a in spec.get("externalIPs", []):
            ext_ip = _parse_sloppy(a)
            if ext_ip is None or _endpoint_ip_refused(ext_ip):
                out.append(f"{where}: externalIP {a!r}")
    by_key = {key_of(s): s for s in services}
    for st in lb_status:
        ns, name = st["metadata"]["namespace"], st["metadata"]["name"]
        lb = by_key.get(key_of(st))
        if lb is None or lb["spec"]["type"] != "LoadBalancer":
            out.append(f"status of {ns}/{name}: not a LoadBalancer")
        for ing in st["status"]["loadBalancer"]["ingress"]:
            if "ip" in ing and _parse_sloppy(ing["ip"]) is None:
                out.append(f"status of {ns}/{name}: ip {ing['ip']!r}")
            if "ipMode" in ing and ("ip" not in ing or ing["ipMode"] not in ("VIP", "Proxy")):
                out.append(f"status of {ns}/{name}: ipMode {ing.get('ipMode')!r}")
    names_seen: set[tuple[str, str]] = set()
    for sl in slices:
        ns, name = sl["metadata"]["namespace"], sl["metadata"]["name"]
        where = f"EndpointSlice {ns}/{name}"
        if (ns, name) in names_seen:
            out.append(f"{where}: duplicate")
        names_seen.add((ns, name))
        if sl["metadata"]["labels"].get(LABEL_MANAGED_BY) != MANAGED_BY:
            out.append(f"{where}: not managed by {MANAGED_BY}")
        pnames = [pt.get("name", "") for pt in sl["ports"]]
        if len(set(pnames)) != len(pnames):
            out.append(f"{where}: duplicate port names")
        if len(sl["endpoints"]) > 1000:
            out.append(f"{where}: too many endpoints")
        at = sl["addressType"]
        for e in sl["endpoints"]:
            if not 1 <= len(e["addresses"]) <= 100:
                out.append(f"{where}: addresses count")
            for a in e["addresses"]:
                if at == "FQDN":
                    continue
                ip = _parse_sloppy(a)
                if ip is None or f"IPv{ip.version}" != at:
                    out.append(f"{where}: address {a!r} is not {at}")
                elif _endpoint_ip_refused(ip):
                    out.append(f"{where}: address {a!r} is special")
                elif at == "IPv6" and str(ip) != a:
                    out.append(f"{where}: IPv6 address {a!r} is not canonical")
            h = e.get("hints", {})
            if len(h.get("forZones", [])) > 8 or len(h.get("forNodes", [])) > 8:
                out.append(f"{where}: too many hints")
    return out


def _endpoint_ip_refused(ip: IPv4Address | IPv6Address) -> bool:
    """ValidateEndpointIP (endpoint addresses and externalIPs): unspecified, loopback,
    link-local unicast and link-local multicast are refused; other multicast is not."""
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    link_local_mc = (ip in ip_network("224.0.0.0/24") if ip.version == 4
                     else ip.packed[0] == 0xFF and ip.packed[1] & 0x0F == 0x02)
    return ip.is_unspecified or ip.is_loopback or ip.is_link_local or link_local_mc


def _dns1035(name: str) -> bool:
    return (0 < len(name) <= 63 and name[0].isalpha() and name[-1].isalnum()
            and all(ch.islower() or ch.isdigit() or ch == "-" for ch in name))


def _parse_sloppy(text: str) -> IPv4Address | IPv6Address | None:
    """netutils.ParseIPSloppy: IPv4 parts with leading zeros are decimal."""
    try:
        if "." in text and ":" not in text:
            parts = text.split(".")
            if len(parts) != 4 or not all(x.isdigit() and int(x) < 256 for x in parts):
                return None
            return IPv4Address(".".join(str(int(x)) for x in parts))
        return ip_address(text)
    except ValueError:
        return None
