"""Change series for the differential suite: `changes()` is a random series of valid changes to
a generated cluster (endpoints scaled and their conditions flipped, hints, types, traffic
policies, affinity, external and LoadBalancer IPs, source ranges, ports, Services and
EndpointSlices created and deleted, the node's zone), each valid against the state the ones
before leave. Pure and deterministic, like generate.py, whose generator (`_Gen`) and model
(model.py) it drives.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from collections.abc import Iterable

from tests.differential.cluster import (
    CHANGE_FEATURES,
    LABEL_SERVICE_NAME,
    LABEL_ZONE,
    ZONES,
    Change,
    Cluster,
    Obj,
    Params,
    key_of,
)
from tests.differential.generate import _FOCUS, _Gen, generate
from tests.differential.model import _Port, _Svc


class _State:
    """The cluster as the API server holds it after each change, for the change generator."""

    def __init__(self, cluster: Cluster, g: _Gen, services: list[_Svc]) -> None:
        self.g = g
        self.services = {s.key: s for s in services}
        self.slices: dict[tuple[str, str], Obj] = {
            key_of(sl)[1:]: copy.deepcopy(sl) for sl in cluster.slices}
        self.node = copy.deepcopy(cluster.node)


def changes(cluster: Cluster, n: int, seed: int | None = None) -> list[Change]:
    """`n` random changes to `cluster`, each valid against the state the ones before leave.
    Deterministic in (cluster.seed, seed)."""
    g = _Gen(cluster.seed, cluster.params)
    services = _rebuild(g, cluster)
    g.rng = random.Random(f"changes-{cluster.seed}-{seed}")
    st = _State(cluster, g, services)
    out: list[Change] = []
    kinds = list(CHANGE_FEATURES)
    weights = [6, 5, 5, 2, 3, 2, 1, 2, 2, 2, 2, 2, 2, 3, 2, 2, 1]
    while len(out) < n:
        kind = g.rng.choices(kinds, weights)[0]
        out.extend(_change(st, kind))
    return out[:n]


def _rebuild(g: _Gen, cluster: Cluster) -> list[_Svc]:
    """The generator's model of each Service of the cluster, re-read from the objects, and the
    allocators primed with what the cluster uses."""
    status = {key_of(s): s["status"]["loadBalancer"]["ingress"] for s in cluster.lb_status}
    zone = cluster.node["metadata"]["labels"].get(LABEL_ZONE, "")
    g.zone = zone
    out = []
    for svc in cluster.services:
        spec = svc["spec"]
        meta = svc["metadata"]
        kind = "headless" if spec.get("clusterIP") == "None" else spec["type"]
        s = _Svc(meta["namespace"], meta["name"], kind)
        g.names.add(s.key)
        fams = spec.get("ipFamilies")
        s.policy = spec.get("ipFamilyPolicy")
        s.families = [4 if f == "IPv4" else 6 for f in fams] if fams else (
            [4] if kind not in ("ExternalName",) else [])
        s.cluster_ips = [] if kind == "headless" else list(spec.get("clusterIPs", []))
        g.used_ips.update(s.cluster_ips)
        s.ports = [_Port(pt.get("name", ""), pt["protocol"], pt["port"], pt["targetPort"],
                         pt.get("nodePort", 0)) for pt in spec.get("ports", [])]
        g.used_node_ports.update(pt.node_port for pt in s.ports if pt.node_port)
        s.external_ips = list(spec.get("externalIPs", []))
        s.etp = spec.get("externalTrafficPolicy", "Cluster")
        s.itp = spec.get("internalTrafficPolicy", "Cluster")
        if spec.get("sessionAffinity") == "ClientIP":
            s.affinity = spec.get("sessionAffinityConfig", {}).get("clientIP", {}).get(
                "timeoutSeconds", 0)
        s.hcnp = spec.get("healthCheckNodePort", 0)
        if s.hcnp:
            g.used_node_ports.add(s.hcnp)
        s.source_ranges = list(spec.get("loadBalancerSourceRanges", []))
        s.alloc_node_ports = spec.get("allocateLoadBalancerNodePorts", True)
        s.ingress = copy.deepcopy(status.get(key_of(svc)))
        g.used_ips.update(s.external_ips)
        g.used_ips.update(i["ip"] for i in s.ingress or [] if "ip" in i)
        if any(a in cluster.params.node_ips for a in s.external_ips) or any(
                i.get("ip") in cluster.params.node_ips for i in s.ingress or []):
            g.node_claims |= {(p.protocol, p.port) for p in s.ports}
        s.td = spec.get("trafficDistribution")
        s.labels = dict(meta.get("labels", {}))
        s.annotations = dict(meta.get("annotations", {}))
        out.append(s)
    g.counter = len(cluster.services) + 1
    for sl in cluster.slices:
        for e in sl["endpoints"]:
            for a in e["addresses"]:
                g.used_ips.add(a)
    # pod addresses continue after the cluster's
    g.pod_next = {(f, i): 120 for f in (4, 6) for i in range(1, 5)}
    return out


def _delete(obj: Obj, feature: str) -> Change:
    return Change("delete", {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                             "metadata": {k: v for k, v in obj["metadata"].items()
                                          if k in ("namespace", "name")}}, feature)


def _proxied(st: _State) -> list[_Svc]:
    return sorted((s for s in st.services.values() if s.proxied), key=lambda s: s.key)


def _live_slices(st: _State, svc: _Svc | None = None) -> list[tuple[str, str]]:
    return sorted(k for k, sl in st.slices.items() if sl["addressType"] != "FQDN" and (
        svc is None or (k[0] == svc.ns and sl["metadata"]["labels"].get(LABEL_SERVICE_NAME)
                        == svc.name)))


def _svc_replace(s: _Svc, feature: str) -> list[Change]:
    out = [Change("replace", s.service(), feature)]
    st = s.status()
    if st is not None:
        out.append(Change("status", st, feature))
    return out


def _change(st: _State, kind: str) -> list[Change]:
    g = st.g
    r = g.rng
    if kind in ("chg:scale-up", "chg:scale-down", "chg:condition", "chg:hints"):
        keys = _live_slices(st)
        if not keys:
            return []
        k = r.choice(keys)
        sl = copy.deepcopy(st.slices[k])
        fam = 4 if sl["addressType"] == "IPv4" else 6
        eps = sl["endpoints"]
        if kind == "chg:scale-up" or (kind == "chg:scale-down" and not eps):
            for _ in range(r.randint(1, 3)):
                eps.append(g.endpoint(fam, set()))
            kind = "chg:scale-up"
        elif kind == "chg:scale-down":
            del eps[r.randrange(len(eps))]
        elif kind == "chg:condition":
            if not eps:
                return []
            e = r.choice(eps)
            cond, _ = g.conditions(set())
            if cond is None:
                e.pop("conditions", None)
            else:
                e["conditions"] = cond
        else:
            if any("hints" in e for e in eps) and r.random() < 0.4:
                for e in eps:
                    e.pop("hints", None)
            else:
                g.hints(eps, r.choice(["PreferClose", "PreferSameNode"]), set(r.sample(
                    ["hints:zone-other", "hints:node-other", "hints:zone-partial"],
                    r.randint(0, 1))))
        st.slices[k] = sl
        return [Change("replace", sl, kind)]
    if kind == "chg:create-slice":
        svcs = _proxied(st)
        if not svcs:
            return []
        s = r.choice(svcs)
        made = g.slices_for(s, set())[:1]
        out = []
        for sl in made:
            sl["metadata"]["name"] = g.name(s.ns, "extra")
            st.slices[key_of(sl)[1:]] = sl
            out.append(Change("create", sl, kind))
        return out
    if kind == "chg:delete-slice":
        keys = sorted(st.slices)
        if not keys:
            return []
        k = r.choice(keys)
        return [_delete(st.slices.pop(k), kind)]
    if kind == "chg:node-zone":
        node = copy.deepcopy(st.node)
        labels = node["metadata"]["labels"]
        new = r.choice([z for z in ("", *ZONES) if z != labels.get(LABEL_ZONE, "")])
        if new:
            labels[LABEL_ZONE] = new
        else:
            labels.pop(LABEL_ZONE, None)
        g.zone = new
        st.node = node
        obj = copy.deepcopy(node)
        del obj["status"]  # ignored on update anyway
        return [Change("replace", obj, kind)]
    if kind == "chg:create-service":
        want = {r.choice(_FOCUS)}
        if "hints:zone-empty-name" in want:
            want = {"hints:zone"}
        s = g.service(want)
        st.services[s.key] = s
        out = [Change("create", s.service(), kind)]
        if (status := s.status()) is not None:
            out.append(Change("status", status, kind))
        for sl in s.slices:
            st.slices[key_of(sl)[1:]] = sl
            out.append(Change("create", sl, kind))
        return out
    if kind == "chg:delete-service":
        keys = sorted(st.services)
        if not keys:
            return []
        s = st.services.pop(r.choice(keys))
        out = [_delete(s.service(), kind)]
        if r.random() < 0.7:  # else its slices stay, orphaned
            for k in _live_slices(st, s):
                out.append(_delete(st.slices.pop(k), kind))
        return out
    svcs = _proxied(st)
    if not svcs:
        return []
    s = r.choice(svcs)
    if kind == "chg:type":
        new = r.choice([t for t in ("ClusterIP", "NodePort", "LoadBalancer") if t != s.kind])
        old = s.kind
        s.kind = new
        if new == "ClusterIP":
            for p in s.ports:
                p.node_port = 0
            s.hcnp = 0
            s.source_ranges = []
            s.ingress = None
            if not s.external_ips:
                s.etp = "Cluster"
        else:
            if new == "LoadBalancer":
                s.alloc_node_ports = True
            for p in s.ports:
                if not p.node_port:
                    p.node_port = g.node_port()
            if old == "LoadBalancer":
                s.hcnp = 0
                s.source_ranges = []
                s.ingress = None
            if new == "LoadBalancer":
                if s.etp == "Local":
                    s.hcnp = g.node_port()
                s.ingress = g.ingress(s.families, set(), s.ports)
        return _svc_replace(s, kind)
    if kind == "chg:etp":
        if not s.externally_accessible:
            return []
        s.etp = "Local" if s.etp == "Cluster" else "Cluster"
        s.hcnp = g.node_port() if s.kind == "LoadBalancer" and s.etp == "Local" else 0
        return _svc_replace(s, kind)
    if kind == "chg:itp":
        s.itp = "Local" if s.itp == "Cluster" else "Cluster"
        return _svc_replace(s, kind)
    if kind == "chg:affinity":
        s.affinity = r.choice([None, 0, 30, 3600, 86400]) if s.affinity is None else (
            None if r.random() < 0.5 else r.randint(1, 86400))
        return _svc_replace(s, kind)
    if kind == "chg:externalIPs":
        if s.external_ips and r.random() < 0.4:
            s.external_ips = s.external_ips[1:]
        else:
            s.external_ips = list(dict.fromkeys(
                [*s.external_ips, g.external_ip(r.choice(s.families))]))
        if s.kind == "ClusterIP" and not s.external_ips:
            s.etp = "Cluster"
        return _svc_replace(s, kind)
    if kind == "chg:lb-status":
        if s.kind != "LoadBalancer":
            return []
        s.ingress = g.ingress(s.families, set(), s.ports) if r.random() < 0.8 else []
        st_obj = s.status()
        return [Change("status", st_obj, kind)] if st_obj is not None else []
    if kind == "chg:source-ranges":
        if s.kind != "LoadBalancer":
            return []
        s.source_ranges = [] if s.source_ranges and r.random() < 0.3 else \
            g.source_ranges(s.families, set())
        return _svc_replace(s, kind)
    if kind == "chg:ports":
        if len(s.ports) > 1 and r.random() < 0.4:
            s.ports.pop()
            if len(s.ports) == 1 and r.random() < 0.5:
                s.ports[0].name = ""
        else:
            r.choice(s.ports).target = r.randint(1024, 32000)
        # the service's slices follow its ports
        out = _svc_replace(s, kind)
        for k in _live_slices(st, s):
            sl = copy.deepcopy(st.slices[k])
            sl["ports"] = [{"name": p.name, "protocol": p.protocol, "port": p.target}
                           for p in s.ports]
            st.slices[k] = sl
            out.append(Change("replace", sl, kind))
        return out
    raise AssertionError(kind)



def change_coverage(seeds: Iterable[int], n: int, params: Params | None = None,
                    ) -> Counter[str]:
    total: Counter[str] = Counter()
    for s in seeds:
        total.update(c.feature for c in changes(generate(s, params), n, s))
    return total
