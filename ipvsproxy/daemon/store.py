"""The state store: the Services, EndpointSlices and own Node the watches delivered, parsed into
the core's frozen values, and what changed since the last sync.

It is the reflectors' sink (kube/reflector.py: `replace` for a fresh list, `event` for a watch
event) and the reconciler's source (`take` the changes, `snapshot` the objects). Raw JSON is
parsed once on arrival and dropped: only the projection the proxy needs is kept (memory at
100k endpoints). An object equal to the one held is not a change (kube-proxy's trackers drop
deep-equal updates). Invalid objects are logged once, when they arrive or change, with their
name and reason; they stay out of the snapshot and never stop the others.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog

from ipvsproxy.core.cluster import Snapshot, service_cidrs
from ipvsproxy.core.model import (
    EndpointSlice,
    Node,
    Problem,
    Service,
    _meta,
    parse_node,
    parse_service,
)
from ipvsproxy.core.slices import parse_endpoint_slice

ServiceId = tuple[str, str]  # (namespace, name)
KINDS = ("Service", "EndpointSlice", "Node")  # each listed once before the first sync
# Watched too, but not waited for: clusters before 1.33 have no ServiceCIDR API (and
# --service-cluster-ip-range covers them)
SERVICE_CIDR = "ServiceCIDR"
log = structlog.get_logger("ipvsproxy.store")


@dataclass(frozen=True, slots=True)
class Changes:
    """What a sync has to do, taken from the store in one go."""

    dirty: frozenset[ServiceId] = frozenset()
    full: bool = False  # the Node or a whole list changed: recompute everything
    trigger_times: tuple[float, ...] = ()  # EndpointSlice last-change-trigger-time, unix s
    first_queued: float | None = None  # unix time of the oldest change in this batch

    def __bool__(self) -> bool:
        return bool(self.dirty) or self.full


@dataclass(slots=True)
class _Pending:
    services: set[ServiceId] = field(default_factory=set)  # by a Service change
    endpoints: set[ServiceId] = field(default_factory=set)  # by an EndpointSlice change
    full: bool = False
    trigger_times: list[float] = field(default_factory=list)
    first_queued: float | None = None


class Store:
    def __init__(self, node_name: str, on_queued: Callable[[], None] | None = None,
                 on_node: Callable[[Mapping[str, Any] | None], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.node_name = node_name
        self._on_queued = on_queued  # health and metrics: an update is queued
        self._on_node = on_node  # health: node eligibility from the raw Node
        self._clock = clock
        self._cond = threading.Condition()
        self.services: dict[ServiceId, Service] = {}
        self.slices: dict[tuple[str, str], EndpointSlice] = {}  # (namespace, slice name)
        # each service's slices: a tuple, not a set (a set of one is 216 bytes, a tuple of one
        # 48: 9 MB less at 50,000 services); a service has a few slices, a scan is cheap
        self._slices_of: dict[ServiceId, tuple[tuple[str, str], ...]] = {}
        self.node: Node | None = None
        self.cidrs: dict[str, tuple[Any, ...]] = {}  # ServiceCIDR name -> its ranges
        self.listed: set[str] = set()
        self.problems: dict[tuple[str, str, str], tuple[Problem, ...]] = {}
        self._pending = _Pending()
        self.service_changes_total = 0
        self.endpoint_changes_total = 0
        # health_check_ports(), per service, and the services changed since it last ran
        self._hc: dict[ServiceId, tuple[int, int]] = {}
        self._hc_dirty: set[ServiceId] = set()
        self._listing: dict[str, set[tuple[str, str]]] = {}  # a list being read: keys seen

    # ----------------------------------------------------------------- the reflectors' sink

    def replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        """A complete list of `kind`: what is held and not listed was deleted meanwhile."""
        self.list_page(kind, items, first=True)
        self.list_done(kind)

    def list_page(self, kind: str, items: list[dict[str, Any]], first: bool) -> None:
        """One page of a list of `kind` as it is read (first: the list starts over): its
        objects go in now. Only a page's raw objects are alive at a time: holding a whole
        list's (100,000 endpoints) until its end was the daemon's peak memory, and Python keeps
        its peak (the freed objects' memory stays fragmented among the ones kept)."""
        # parsed before the lock is taken: the reconciler never waits for a page's parsing
        parsed = [self._parse(kind, obj) for obj in items] \
            if kind in ("Service", "EndpointSlice") else []
        node = next((i for i in items if _name(i) == self.node_name), None) \
            if kind == "Node" else None
        node_value = parse_node(node) if node is not None else None
        with self._cond:
            seen = self._listing[kind] = set() if first else self._listing.get(kind, set())
            if kind == "Node":
                if node is not None and node_value is not None:
                    seen.add(("", self.node_name))
                    self._set_node(node, node_value)
                return
            if kind == SERVICE_CIDR:
                for obj in items:
                    seen.add(_key(obj))
                    self._set_cidrs(_key(obj)[1], obj)
                return
            for p in parsed:
                seen.add(p[0])
                self._upsert(kind, *p)

    def list_done(self, kind: str) -> None:
        """The list of `kind` is complete: what is held and was not listed is gone."""
        with self._cond:
            seen = self._listing.pop(kind, set())
            if kind == "Node":
                if ("", self.node_name) not in seen:
                    self._set_node(None)
            elif kind == SERVICE_CIDR:
                for name in set(self.cidrs) - {n for _, n in seen}:
                    self._set_cidrs(name, None)
            else:
                held = set(self.services if kind == "Service" else self.slices)
                for key in held - seen:
                    self._delete(kind, key)
            self.listed.add(kind)
            self._cond.notify_all()

    def event(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        # Parsing happens before the lock is taken: a hostile object (8,000 source ranges) or a
        # big slice costs the reflector's thread its time, never the reconciler, which takes
        # the same lock for every snapshot.
        parsed = self._parse(kind, obj) if type_ != "DELETED" and kind in (
            "Service", "EndpointSlice") else None
        mine = kind == "Node" and _name(obj) == self.node_name
        node = parse_node(obj) if mine and type_ != "DELETED" else None
        with self._cond:
            if kind == "Node":
                if mine:
                    self._set_node(None if type_ == "DELETED" else obj, node)
            elif kind == SERVICE_CIDR:
                self._set_cidrs(_key(obj)[1], None if type_ == "DELETED" else obj)
            elif parsed is None:
                self._delete(kind, _key(obj))
            else:
                self._upsert(kind, *parsed)
            self._cond.notify_all()

    # -------------------------------------------------------------------- the reconciler's

    def initialized(self) -> bool:
        """Services, EndpointSlices and the Node have each been listed once: before that,
        a sync would delete what the cluster still has (kube-proxy waits the same way)."""
        with self._cond:
            return self.listed >= set(KINDS)

    def wait_initialized(self, timeout: float) -> bool:
        """Block until initialized() (or notify()), at most `timeout`. Not `wait`: every listed
        object is a pending change, so waiting for changes while the lists are read returns at
        once, and the reconciler spun on the lock and the GIL beside the reflectors parsing the
        lists (106,000 turns during a 10,000-service list in the lab)."""
        with self._cond:
            if not self.listed >= set(KINDS):
                self._cond.wait(timeout)
            return self.listed >= set(KINDS)

    def wait(self, timeout: float) -> bool:
        """Block until there are changes (or the store got initialized), at most `timeout`."""
        with self._cond:
            return self._cond.wait_for(lambda: bool(self._pending_changes()), timeout)

    def notify(self) -> None:
        """Wake a waiting reconciler (used when stopping)."""
        with self._cond:
            self._cond.notify_all()

    def pending_any(self) -> bool:
        with self._cond:
            return self._pending_changes()

    def pending(self) -> tuple[int, int]:
        """(services with Service changes, services with endpoint changes) not yet taken."""
        with self._cond:
            return len(self._pending.services), len(self._pending.endpoints)

    def take(self) -> Changes:
        with self._cond:
            p, self._pending = self._pending, _Pending()
            return Changes(frozenset(p.services | p.endpoints), p.full, tuple(p.trigger_times),
                           p.first_queued)

    def requeue(self, changes: Changes) -> None:
        """Put back changes a failed sync did not apply."""
        with self._cond:
            self._pending.endpoints |= changes.dirty
            self._pending.full |= changes.full
            self._pending.trigger_times.extend(changes.trigger_times)
            if self._pending.first_queued is None:
                self._pending.first_queued = changes.first_queued

    def snapshot(self, ids: Collection[ServiceId] | None = None) -> Snapshot:
        """The objects for compute_desired: all of them, or the named services and their
        slices (an incremental sync)."""
        with self._cond:
            cidrs = tuple(dict.fromkeys(c for r in self.cidrs.values() for c in r))
            if ids is None:
                return Snapshot(tuple(self.services.values()), tuple(self.slices.values()),
                                self.node, service_cidrs=cidrs)
            svcs = tuple(self.services[i] for i in ids if i in self.services)
            slices = tuple(self.slices[k] for i in ids for k in self._slices_of.get(i, ()))
            return Snapshot(svcs, slices, self.node, service_cidrs=cidrs)

    def health_check_ports(self) -> dict[ServiceId, tuple[int, int]]:
        """LoadBalancer services with externalTrafficPolicy Local: their health-check node port
        and how many ready, not terminating endpoints (distinct IPs; refused ones are left
        out, as they have no real server) this node has. Kept per service and worked out again
        only for the services changed since the last call: the daemon asks after every sync,
        and walking every endpoint of the cluster each time made one endpoint change cost more
        the bigger the cluster."""
        with self._cond:
            for sid in self._hc_dirty:
                svc = self.services.get(sid)
                if svc is None or not (svc.health_check_node_port and svc.external_local):
                    self._hc.pop(sid, None)
                    continue
                local = {e.addr for k in self._slices_of.get(sid, ())
                         for e in self.slices[k].endpoints
                         if e.node_name == self.node_name and e.ready and not e.terminating}
                self._hc[sid] = (svc.health_check_node_port, len(local))
            self._hc_dirty.clear()
            return dict(self._hc)

    def invalid_counts(self) -> dict[str, int]:
        with self._cond:
            out = dict.fromkeys(KINDS, 0)
            for kind, _, _ in self.problems:
                out[kind] = out.get(kind, 0) + 1
            return out

    # ------------------------------------------------------------------------ internals

    def _pending_changes(self) -> bool:
        p = self._pending
        return bool(p.services or p.endpoints or p.full)

    def _queued(self) -> None:
        if self._pending.first_queued is None:
            self._pending.first_queued = self._clock()
        if self._on_queued is not None:
            self._on_queued()

    def _report(self, kind: str, key: tuple[str, str], probs: Iterable[Problem]) -> None:
        """Log an object's problems once: when they first appear or change."""
        pkey = (kind, *key)
        now = tuple(probs)
        if self.problems.get(pkey, ()) == now:
            return
        if now:
            self.problems[pkey] = now
            for p in now:
                log.warning("invalid object", kind=p.kind, object=f"{p.namespace}/{p.name}"
                            if p.namespace else p.name, reason=p.reason)
        else:
            self.problems.pop(pkey, None)

    def _parse(self, kind: str, obj: Mapping[str, Any]
               ) -> tuple[tuple[str, str], Service | EndpointSlice | None, list[Problem]]:
        """(key, value or None, problems) of a Service or EndpointSlice, without the lock. A
        slice is parsed against the value held for it, read without the lock: that only decides
        which parts are shared with it (parse_endpoint_slice), never the value."""
        key = _key(obj)
        if kind == "Service":
            return (key, *parse_service(obj))
        return (key, *parse_endpoint_slice(obj, self.slices.get(key)))

    def _upsert(self, kind: str, key: tuple[str, str], value: Service | EndpointSlice | None,
                probs: list[Problem]) -> None:
        if kind == "Service":
            svc = value
            assert svc is None or isinstance(svc, Service)
            self._report(kind, key, probs)
            if svc is None:
                self._delete(kind, key, keep_problems=True)
            elif (held := self.services.get(key)) != svc:
                if held is None:
                    # keyed by the Service's own sid, which the desired state's index keys it
                    # by too (one tuple, not three), and so are its slices, if they came first
                    key = svc.sid
                    keys = self._slices_of.pop(key, None)
                    if keys is not None:
                        self._slices_of[key] = keys
                self.services[key] = svc
                self._service_changed(key)
        elif kind == "EndpointSlice":
            old = self.slices.get(key)
            # Given the value held, the parse shared its unchanged parts and returned it as is
            # when nothing the proxy reads changed: no new objects, and no deep compare here.
            sl = value
            assert sl is None or isinstance(sl, EndpointSlice)
            self._report(kind, key, probs)
            if sl is None:
                self._delete(kind, key, keep_problems=True)
                return
            if sl is old:
                return
            self.slices[key] = sl
            sid = (sl.namespace, sl.service)
            if old is None or old.service != sl.service:
                if old is not None:  # moved to another service: the old one changed too
                    self._unlink(old, key)
                    self._endpoints_changed((old.namespace, old.service))
                keys = self._slices_of.get(sid, ())
                if key not in keys:
                    if not keys and (svc := self.services.get(sid)) is not None:
                        sid = svc.sid  # the service's key tuple, not one more
                    self._slices_of[sid] = (*keys, key)
            if sl.trigger_time:
                t = _parse_time(sl.trigger_time)
                if t is not None:
                    self._pending.trigger_times.append(t)
            self._endpoints_changed(sid)

    def _delete(self, kind: str, key: tuple[str, str], keep_problems: bool = False) -> None:
        if not keep_problems:
            self.problems.pop((kind, *key), None)
        if kind == "Service":
            if self.services.pop(key, None) is not None:
                self._service_changed(key)
        elif kind == "EndpointSlice":
            old = self.slices.pop(key, None)
            if old is not None:
                self._unlink(old, key)
                self._endpoints_changed((old.namespace, old.service))

    def _unlink(self, sl: EndpointSlice, key: tuple[str, str]) -> None:
        sid = (sl.namespace, sl.service)
        keys = tuple(k for k in self._slices_of.get(sid, ()) if k != key)
        if keys:
            self._slices_of[sid] = keys
        else:
            self._slices_of.pop(sid, None)

    def _service_changed(self, sid: ServiceId) -> None:
        self._hc_dirty.add(sid)
        self.service_changes_total += 1
        self._pending.services.add(sid)
        self._queued()

    def _endpoints_changed(self, sid: ServiceId) -> None:
        self._hc_dirty.add(sid)
        self.endpoint_changes_total += 1
        self._pending.endpoints.add(sid)
        self._queued()

    def _set_node(self, obj: Mapping[str, Any] | None,
                  parsed: tuple[Node | None, list[Problem]] | None = None) -> None:
        """The own Node as the API gave it (None: gone), and what parse_node made of it."""
        if self._on_node is not None:
            self._on_node(obj)
        node = None
        if obj is not None:
            node, probs = parsed if parsed is not None else parse_node(obj)
            self._report("Node", ("", self.node_name), probs)
        if node != self.node:
            # zone and addresses feed every service (topology, NodePort addresses)
            self.node = node
            self._pending.full = True
            self._queued()


    def _set_cidrs(self, name: str, obj: Mapping[str, Any] | None) -> None:
        probs: list[Problem] = []
        ranges = tuple(service_cidrs(obj, probs)) if obj is not None else ()
        self._report(SERVICE_CIDR, ("", name), probs)
        if ranges != self.cidrs.get(name, ()):
            # the ranges decide which addresses every Service may claim
            if ranges:
                self.cidrs[name] = ranges
            else:
                self.cidrs.pop(name, None)
            self._pending.full = True
            self._queued()


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name.lower() if isinstance(name, str) else ""


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, name) as the parsers read them (the namespace interned)."""
    ns, name, _ = _meta(obj)
    return ns, name


def _parse_time(text: str) -> float | None:
    """RFC 3339 (the annotation's format, e.g. 2026-11-23T10:00:00Z) to unix seconds."""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
