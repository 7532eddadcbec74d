"""A cluster snapshot: the parsed Services, EndpointSlices and own Node one sync works from.

Built from raw API objects (dicts, as the API server or a manifest holds them). Objects of other
kinds are ignored; invalid ones become Problems (core/model.py). Pure: no files, no API.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ipvsproxy.core.model import (
    EndpointSlice,
    Node,
    Problem,
    Service,
    parse_endpoint_slice,
    parse_node,
    parse_service,
)


@dataclass(frozen=True, slots=True)
class Snapshot:
    services: tuple[Service, ...] = ()
    slices: tuple[EndpointSlice, ...] = ()
    node: Node | None = None
    problems: tuple[Problem, ...] = ()

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


def build_snapshot(docs: Iterable[Any], node_name: str) -> Snapshot:
    """Parse every Service, EndpointSlice and the Node called `node_name` (others ignored)."""
    services: list[Service] = []
    slices: list[EndpointSlice] = []
    node: Node | None = None
    problems: list[Problem] = []
    seen: set[tuple[str, str, str]] = set()
    for obj in flatten(docs):
        kind = obj.get("kind")
        if kind == "Service":
            svc, probs = parse_service(obj)
            problems.extend(probs)
            if svc is not None:
                if ("Service", svc.namespace, svc.name) in seen:
                    problems.append(Problem("Service", svc.namespace, svc.name,
                                            "defined twice; the first one is used"))
                    continue
                seen.add(("Service", svc.namespace, svc.name))
                services.append(svc)
        elif kind == "EndpointSlice":
            sl, probs = parse_endpoint_slice(obj)
            problems.extend(probs)
            if sl is not None:
                if ("EndpointSlice", sl.namespace, sl.name) in seen:
                    problems.append(Problem("EndpointSlice", sl.namespace, sl.name,
                                            "defined twice; the first one is used"))
                    continue
                seen.add(("EndpointSlice", sl.namespace, sl.name))
                slices.append(sl)
        elif kind == "Node":
            meta = obj.get("metadata")
            name = meta.get("name") if isinstance(meta, Mapping) else None
            if isinstance(name, str) and name.lower() == node_name:
                n, probs = parse_node(obj)
                problems.extend(probs)
                node = n or node
    return Snapshot(tuple(services), tuple(slices), node, tuple(problems))
