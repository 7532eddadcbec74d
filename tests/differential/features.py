"""Which features of `cluster.FEATURES` a cluster covers, read back from its API objects
alone (never from the generator's model), and the coverage of a run of seeds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from ipaddress import ip_address, ip_network

from tests.differential.cluster import (
    LABEL_HEADLESS,
    LABEL_PROXY_NAME,
    LABEL_SERVICE_NAME,
    LABEL_ZONE,
    Obj,
    Params,
    key_of,
)
from tests.differential.generate import generate
from tests.differential.validity import _parse_sloppy


def features(node: Obj, services: list[Obj], lb_status: list[Obj], slices: list[Obj],
             params: Params) -> Counter[str]:
    """Which features these objects cover, read from the objects alone."""
    c: Counter[str] = Counter()
    zone = node["metadata"].get("labels", {}).get(LABEL_ZONE, "")
    c["node:zone" if zone else "node:no-zone"] += 1
    if not any(a["type"] == "InternalIP" and ":" in a["address"]
               for a in node["status"]["addresses"]):
        c["node:ipv4-only"] += 1
    status = {key_of(s)[1:]: s["status"]["loadBalancer"]["ingress"] for s in lb_status}
    by_svc: dict[tuple[str, str], list[Obj]] = {}
    for sl in slices:
        name = sl["metadata"].get("labels", {}).get(LABEL_SERVICE_NAME)
        if name is not None:
            by_svc.setdefault((sl["metadata"]["namespace"], name), []).append(sl)
    names = set()
    for svc in services:
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        names.add((ns, name))
        _service_features(c, svc, status.get((ns, name)), by_svc.get((ns, name), []), params)
    for sl in slices:
        _slice_features(c, sl, params, zone)
        labels = sl["metadata"].get("labels", {})
        if LABEL_SERVICE_NAME not in labels:
            c["slice:no-service-label"] += 1
        elif (sl["metadata"]["namespace"], labels[LABEL_SERVICE_NAME]) not in names:
            c["slice:orphan"] += 1
    return c


def _service_features(c: Counter[str], svc: Obj, ingress: list[Obj] | None,
                      slices: list[Obj], params: Params) -> None:
    spec = svc["spec"]
    meta = svc["metadata"]
    kind = spec["type"]
    if spec.get("clusterIP") == "None":
        kind = "headless"
    c[f"svc:{kind}"] += 1
    ports = spec.get("ports", [])
    for p in ports:
        c[f"proto:{p['protocol']}"] += 1
    if len(ports) > 1:
        c["ports:multi"] += 1
    if len(ports) == 1 and not ports[0].get("name"):
        c["ports:unnamed"] += 1
    nps = [p["nodePort"] for p in ports if p.get("nodePort")]
    if len(nps) != len(set(nps)):
        c["nodeport:tcp-udp-same-number"] += 1
    fams = spec.get("ipFamilies")
    if kind not in ("ExternalName", "headless"):
        if fams is None:
            c["family:implicit"] += 1
        elif spec.get("ipFamilyPolicy") == "PreferDualStack":
            c["family:prefer-dual"] += 1
        elif fams == ["IPv4"]:
            c["family:ipv4"] += 1
        elif fams == ["IPv6"]:
            c["family:ipv6"] += 1
        else:
            c["family:dual-v4-primary" if fams[0] == "IPv4" else "family:dual-v6-primary"] += 1
    ext = spec.get("externalIPs", [])
    if ext:
        c["externalIPs"] += 1
        if any(":" in e for e in ext):
            c["externalIPs:ipv6"] += 1
        if any(e in params.node_ips for e in ext):
            c["externalIPs:node-address"] += 1
        if kind == "ClusterIP" and spec.get("externalTrafficPolicy") == "Local":
            c["externalIPs:clusterip-local"] += 1
        if any(_has_leading_zeros(e) for e in ext):
            c["invalid:externalIP-leading-zeros"] += 1
        if any(e.startswith("::ffff:") for e in ext):
            c["invalid:externalIP-ipv4-mapped"] += 1
        if any(e.startswith("233.252.") for e in ext):
            c["invalid:externalIP-multicast"] += 1
        nets = [ip_network(n) for n in params.service_cidrs]
        if any((a := _parse_sloppy(e)) is not None and any(a in n for n in nets) for e in ext):
            c["externalIPs:service-range"] += 1
    if kind == "LoadBalancer":
        if not spec.get("allocateLoadBalancerNodePorts", True):
            c["lb:no-nodeports"] += 1
        if ingress is None:
            c["lb:no-status"] += 1
        fam_of = {4 if f == "IPv4" else 6 for f in (fams or ["IPv4"])}
        for ing in ingress or []:
            if "hostname" in ing and "ip" not in ing:
                c["lb:hostname"] += 1
                continue
            c[{"VIP": "lb:vip", "Proxy": "lb:proxy", None: "lb:ipmode-unset"}[
                ing.get("ipMode")]] += 1
            fam = 6 if ":" in ing["ip"] else 4
            if fam == 6:
                c["lb:ipv6"] += 1
            if fam not in fam_of:
                c["lb:other-family"] += 1
            if ing["ip"] in params.node_ips:
                c["lb:node-address"] += 1
            if _has_leading_zeros(ing["ip"]):
                c["invalid:lb-ip-leading-zeros"] += 1
            if ing["ip"] in ext:
                c["lb:same-as-externalIP"] += 1
            if ing["ip"].startswith("169.254."):
                c["invalid:lb-ip-link-local"] += 1
        ranges = spec.get("loadBalancerSourceRanges", [])
        if ranges:
            c["sourceRanges"] += 1
        for r in ranges:
            net = ip_network(r.strip(), strict=False)
            if r != r.strip():
                c["sourceRanges:padded"] += 1
            if net.prefixlen == 0:
                c["sourceRanges:zero"] += 1
            elif any(ip_address(n) in net for n in params.node_ips):
                c["sourceRanges:node"] += 1
            if net.version == 6:
                c["sourceRanges:ipv6"] += 1
            if str(net) != r.strip():
                c["sourceRanges:host-bits"] += 1
        if spec.get("healthCheckNodePort"):
            c["hcnp"] += 1
    sa = spec.get("sessionAffinity")
    if sa == "ClientIP":
        c["affinity:ClientIP"] += 1
        if "sessionAffinityConfig" not in spec:
            c["affinity:default-timeout"] += 1
    if spec.get("externalTrafficPolicy") == "Local":
        c["etp:Local"] += 1
        eps = [e for sl in slices if sl["addressType"] != "FQDN" for e in sl["endpoints"]]
        if eps and not any(e.get("nodeName") == params.node_name for e in eps):
            c["etp:Local-no-local-endpoints"] += 1
    if spec.get("internalTrafficPolicy") == "Local":
        c["itp:Local"] += 1
    if spec.get("trafficDistribution"):
        c[f"td:{spec['trafficDistribution']}"] += 1
    if LABEL_PROXY_NAME in meta.get("labels", {}):
        c["label:service-proxy-name"] += 1
    if "ipvsproxy.io/scheduler" in meta.get("annotations", {}):
        c["ann:ipvsproxy-scheduler"] += 1
    real = [sl for sl in slices if sl["addressType"] != "FQDN"
            and LABEL_HEADLESS not in sl["metadata"]["labels"]
            and LABEL_PROXY_NAME not in sl["metadata"]["labels"]]
    if len([sl for sl in real if sl["addressType"] == real[0]["addressType"]]) > 1:
        c["slice:multi"] += 1
    if slices and not any(sl["endpoints"] for sl in real):
        c["ep:none"] += 1
    seen: dict[tuple[str, str], int] = {}
    for sl in real:
        for e in sl["endpoints"]:
            k = (sl["addressType"], e["addresses"][0])
            seen[k] = seen.get(k, 0) + 1
    if any(n > 1 for n in seen.values()):
        c["ep:duplicate"] += 1
    svc_ports = {(p.get("name", ""), p["protocol"]) for p in ports}
    svc_names = {p.get("name", "") for p in ports}
    svc_fams = {f"IPv{4 if f == 'IPv4' else 6}" for f in (fams or ["IPv4"])}
    for sl in slices:
        if sl["addressType"] == "FQDN":
            continue
        if kind not in ("ExternalName",) and sl["addressType"] not in svc_fams:
            c["slice:other-family"] += 1
        for p in sl["ports"]:
            if p.get("name", "") not in svc_names:
                if p.get("port") is None:
                    c["slice:port-nil"] += 1
                elif p["port"] == 0:
                    c["slice:port-zero"] += 1
                else:
                    c["slice:port-name-mismatch"] += 1
            elif (p.get("name", ""), p["protocol"]) not in svc_ports:
                c["slice:protocol-mismatch"] += 1


def _slice_features(c: Counter[str], sl: Obj, params: Params, zone: str) -> None:
    labels = sl["metadata"].get("labels", {})
    if sl["addressType"] == "FQDN":
        c["slice:fqdn"] += 1
        return
    if LABEL_HEADLESS in labels:
        c["slice:headless-label"] += 1
    if LABEL_PROXY_NAME in labels:
        c["slice:proxy-name-label"] += 1
    if "ipvsproxy.io/weight" in sl["metadata"].get("annotations", {}):
        c["ann:ipvsproxy-weight"] += 1
    ready_hints = []
    for e in sl["endpoints"]:
        cond = e.get("conditions")
        if cond is None:
            c["ep:conditions-unset"] += 1
        elif cond.get("ready", True):
            c["ep:ready"] += 1
        elif cond.get("terminating"):
            c["ep:serving-terminating" if cond.get("serving") else
              "ep:terminating-not-serving"] += 1
        else:
            c["ep:not-ready"] += 1
        node = e.get("nodeName")
        c["ep:no-node" if node is None else
          "ep:local" if node == params.node_name else "ep:remote"] += 1
        if len(e["addresses"]) > 1:
            c["ep:multi-address"] += 1
        if _has_leading_zeros(e["addresses"][0]):
            c["invalid:endpoint-leading-zeros"] += 1
        if e["addresses"][0].startswith("233.252."):
            c["invalid:endpoint-multicast"] += 1
        if cond is None or cond.get("ready", True):
            ready_hints.append(e.get("hints", {}))
    if ready_hints:
        zones = [{z["name"] for z in h.get("forZones", [])} for h in ready_hints]
        nodes = [{n["name"] for n in h.get("forNodes", [])} for h in ready_hints]
        if any(zones):
            if not all(zones):
                c["hints:zone-partial"] += 1
            elif any("" in z for z in zones):
                c["hints:zone-empty-name"] += 1
            elif any(zone in z for z in zones):
                c["hints:zone"] += 1
            else:
                c["hints:zone-other"] += 1
        if any(nodes):
            if not all(nodes):
                c["hints:node-partial"] += 1
            elif any(params.node_name in n for n in nodes):
                c["hints:node"] += 1
            else:
                c["hints:node-other"] += 1


def _has_leading_zeros(ip: str) -> bool:
    return "." in ip and any(len(x) > 1 and x[0] == "0" for x in ip.split("."))



def coverage(seeds: Iterable[int], params: Params | None = None) -> Counter[str]:
    total: Counter[str] = Counter()
    for s in seeds:
        total.update(generate(s, params).features())
    return total
