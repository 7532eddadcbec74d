"""A cluster snapshot: the parsed Services, EndpointSlices and own Node one sync works from.

Built from raw API objects (dicts, as the API server or a manifest holds them). Objects of other
kinds are ignored; invalid ones become Problems (core/model.py). Pure: no files, no API.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network
from typing import Any

from ipvsproxy.core.model import (
    LABEL_SERVICE_NAME,
    EndpointSlice,
    Node,
    Problem,
    Service,
    cidr,
    parse_node,
    parse_service,
)
from ipvsproxy.core.slices import parse_endpoint_slice


@dataclass(frozen=True, slots=True)
class Snapshot:
    services: tuple[Service, ...] = ()
    slices: tuple[EndpointSlice, ...] = ()
    node: Node | None = None
    problems: tuple[Problem, ...] = ()
    # The cluster's service ranges from its ServiceCIDR objects (networking.k8s.io/v1), beside
    # --service-cluster-ip-range: no tenant address may be inside them (core/desired.py).
    service_cidrs: tuple[IPv4Network | IPv6Network, ...] = ()

    def slices_by_service(self) -> dict[tuple[str, str], list[EndpointSlice]]:
        """(namespace, service name) -> its slices, sorted by name (kube-proxy's merge order)."""
        out: dict[tuple[str, str], list[EndpointSlice]] = {}
        for s in sorted(self.slices, key=lambda s: s.name):
            out.setdefault((s.namespace, s.service), []).append(s)
        return out


def flatten(docs: Iterable[Any]) -> Iterable[Mapping[str, Any]]:
    """Documents, with `kind: List` / `*List` items expanded; non-objects dropped."""
    for doc in docs:
        if not isinstance(doc, Mapping):
            continue
        kind = doc.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
            item_kind = kind[:-4]
            for item in doc["items"]:
                if isinstance(item, Mapping):
                    # items of a typed list (ServiceList) may omit their own kind
                    yield item if "kind" in item or not item_kind else {**item, "kind": item_kind}
        else:
            yield doc


def first_objects(docs: Iterable[Any], first: Iterable[tuple[str, str]]) -> list[Mapping[str, Any]]:
    """The Services named in `first` (namespace, name), their EndpointSlices and the Nodes: what
    a sync needs to program those services alone, found without parsing anything else. On a
    cold node this pass is on the way to the first answer, so an object is dropped on its name
    alone, before its namespace is read; names and namespaces that are not strings never match
    (the parsers report them)."""
    want = set(first)
    names = {name for _, name in want}
    out: list[Mapping[str, Any]] = []
    for obj in flatten(docs):
        kind = obj.get("kind")
        if kind == "Service":
            meta = obj.get("metadata")
            if not isinstance(meta, Mapping):
                continue
            name = meta.get("name")
        elif kind == "EndpointSlice":
            meta = obj.get("metadata")
            if not isinstance(meta, Mapping):
                continue
            labels = meta.get("labels")
            if not isinstance(labels, Mapping):
                continue
            name = labels.get(LABEL_SERVICE_NAME)
        elif kind == "Node":
            out.append(obj)
            continue
        else:
            continue
        if isinstance(name, str) and name in names:
            ns = meta.get("namespace")
            if isinstance(ns, str) and (ns, name) in want:
                out.append(obj)
    return out


def build_snapshot(docs: Iterable[Any], node_name: str) -> Snapshot:
    """Parse every Service, EndpointSlice and the Node called `node_name` (others ignored)."""
    parsed: dict[str, dict[tuple[str, str], Any]] = {"Service": {}, "EndpointSlice": {}}
    parsers: dict[str, Callable[[Mapping[str, Any]], tuple[Any, list[Problem]]]] = {
        "Service": parse_service, "EndpointSlice": parse_endpoint_slice}
    node: Node | None = None
    problems: list[Problem] = []
    cidrs: list[IPv4Network | IPv6Network] = []
    for obj in flatten(docs):
        kind = obj.get("kind")
        if kind in parsers:
            assert isinstance(kind, str)
            value, probs = parsers[kind](obj)
            problems.extend(probs)
            if value is None:
                continue
            key = (value.namespace, value.name)
            if key in parsed[kind]:
                problems.append(Problem(kind, *key, "defined twice; the first one is used"))
            else:
                parsed[kind][key] = value
        elif kind == "Node":
            meta = obj.get("metadata")
            name = meta.get("name") if isinstance(meta, Mapping) else None
            if isinstance(name, str) and name.lower() == node_name:
                n, probs = parse_node(obj)
                problems.extend(probs)
                node = n or node
        elif kind == "ServiceCIDR":
            cidrs.extend(service_cidrs(obj, problems))
    return Snapshot(tuple(parsed["Service"].values()), tuple(parsed["EndpointSlice"].values()),
                    node, tuple(problems), tuple(dict.fromkeys(cidrs)))


def service_cidrs(obj: Mapping[str, Any], problems: list[Problem]
                  ) -> list[IPv4Network | IPv6Network]:
    """The ranges of one ServiceCIDR object (spec.cidrs); a bad one is a Problem."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    spec = obj.get("spec")
    out: list[IPv4Network | IPv6Network] = []
    for raw in spec.get("cidrs", []) if isinstance(spec, Mapping) else []:
        net = cidr(raw, strict=True) if isinstance(raw, str) and raw == raw.strip() else None
        if net is not None:
            out.append(net)
        else:
            problems.append(Problem("ServiceCIDR", "", name if isinstance(name, str) else
                                    "<unnamed>", f"spec.cidrs entry {raw!r} is not a CIDR; "
                                    "ignored"))
    return out
