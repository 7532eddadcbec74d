"""A Service's EndpointSlices as the generator makes them: endpoints (addresses, conditions,
node and zone), the hints the EndpointSlice controller would write, and the slice variants the
endpoint and slice features ask for (`_SliceGen`, the generator's endpoint half).
"""

from __future__ import annotations

import copy

from tests.differential.cluster import (
    LABEL_HEADLESS,
    LABEL_MANAGED_BY,
    LABEL_PROXY_NAME,
    LABEL_SERVICE_NAME,
    MANAGED_BY,
    OTHER_NODES,
    PROTOCOLS,
    ZONES,
    Obj,
)
from tests.differential.model import _Alloc, _leading_zeros, _Svc


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


class _SliceGen(_Alloc):
    """The generator's EndpointSlices, on its allocators."""

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

