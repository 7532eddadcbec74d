"""The cluster model: Services, EndpointSlices and the Node as frozen values, and the parsers
from API JSON into them.

This module owns the values, the label and annotation names, the field helpers every parser
shares (`_meta`, `_ip` and its address cache, ...), and the Service and Node parsers. The
EndpointSlice parser, the hot watch path with its sharing of unchanged parts, is in
core/slices.py.

Only the fields the proxy needs are kept. Parsing never raises on bad cluster data: an invalid
object (or an invalid part of one, such as one bad port) becomes a `Problem` naming the object
and the reason, and everything valid next to it is kept. Semantics follow kube-proxy
(pkg/proxy/serviceport.go, endpointslicecache.go); see shared/reference/kube-proxy-ipvs.md §4.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from socket import AF_INET, AF_INET6, inet_ntop, inet_pton
from sys import intern as _intern
from typing import Any, NamedTuple, TypeVar

from ipvsproxy.core.tables import KERNEL_SCHEDULERS
from ipvsproxy.core.validate import (
    is_dns1035_label,
    is_dns_label,
    printable,
    refusal,
    special_address,
)

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network

# isinstance(x, Mapping) goes through the ABC machinery (~0.5 us); JSON gives dicts, so
# dict is tried first and Mapping only for anything else.
_MAP = (dict, Mapping)

LABEL_SERVICE_NAME = "kubernetes.io/service-name"
LABEL_PROXY_NAME = "service.kubernetes.io/service-proxy-name"
LABEL_HEADLESS = "service.kubernetes.io/headless"
LABEL_ZONE = "topology.kubernetes.io/zone"
ANN_SCHEDULER = "ipvsproxy.io/scheduler"
ANN_SCHED_FLAGS = "ipvsproxy.io/scheduler-flags"
ANN_WEIGHT = "ipvsproxy.io/weight"
ANN_TRIGGER_TIME = "endpoints.kubernetes.io/last-change-trigger-time"
TAINT_TO_BE_DELETED = "ToBeDeletedByClusterAutoscaler"
# What one problem may quote (characters): a reason, and a name (the API server caps names at
# 253, a file does not)
REASON_MAX = 300
NAME_MAX = 253
# Problems one object may report; the rest are counted in one more line (bounded())
PROBLEMS_PER_OBJECT = 10


class Proto(StrEnum):
    TCP = "TCP"
    UDP = "UDP"
    SCTP = "SCTP"


@dataclass(frozen=True, slots=True)
class Problem:
    """An invalid object or field: reported once, never fatal to the rest."""

    kind: str
    namespace: str
    name: str
    reason: str

    def __post_init__(self) -> None:
        # Bounded: a reason quotes what the object said, and an object may say megabytes (a
        # 250 KB annotation). Each problem is a log line on every node.
        if len(self.reason) > REASON_MAX:
            object.__setattr__(self, "reason", self.reason[:REASON_MAX] + "... (cut)")
        if len(self.name) > NAME_MAX:
            object.__setattr__(self, "name", self.name[:NAME_MAX] + "...")

    def __str__(self) -> str:
        # escaped: names come from files too, and a newline would forge a log line
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return printable(f"{self.kind} {where}: {self.reason}")


@dataclass(frozen=True, slots=True)
class ServicePort:
    name: str
    protocol: Proto
    port: int
    node_port: int = 0


@dataclass(frozen=True, slots=True)
class Service:
    namespace: str
    name: str
    type: str  # ClusterIP, NodePort, LoadBalancer (ExternalName and headless are never built)
    cluster_ips: tuple[IPAddress, ...]
    ports: tuple[ServicePort, ...]
    external_ips: tuple[IPAddress, ...] = ()
    lb_ingress_ips: tuple[IPAddress, ...] = ()  # ipMode Proxy and hostname-only already dropped
    lb_source_ranges: tuple[IPNetwork, ...] = ()
    external_local: bool = False  # externalTrafficPolicy: Local
    internal_local: bool = False  # internalTrafficPolicy: Local
    affinity_timeout: int = 0  # sessionAffinity ClientIP timeout; 0 = no affinity
    health_check_node_port: int = 0
    scheduler: str = ""  # ipvsproxy.io/scheduler ("" = the configured default)
    sched_flags: int = 0  # ipvsproxy.io/scheduler-flags as IPVS flag bits
    annotations_problem: str = ""
    # Who wins an address:port claimed twice (core/desired.py): the older Service. RFC 3339 UTC
    # as the API server writes it, so text order is time order; "" (no timestamp) is youngest.
    created: str = ""
    uid: str = ""
    # externalIPs programmed without binding them to kube-ipvs0: node addresses the operator
    # allows (--external-ip-cidrs); set by core/desired.py screen(), never by the parser
    unbound_ips: tuple[IPAddress, ...] = ()
    # (namespace, name): the one tuple the store's dicts, the desired state's index and the
    # daemon's applied state all key this service by (three equal tuples per service were
    # 5.6 MB at 50,000 services). Not compared, not given: it follows from the two fields.
    sid: tuple[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sid", (self.namespace, self.name))

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class Endpoint(NamedTuple):
    """One endpoint of a slice (a NamedTuple: a watch stream builds ten of these per event,
    at a third of a frozen dataclass's cost)."""

    addr: IPAddress
    ready: bool
    serving: bool
    terminating: bool
    node_name: str = ""
    zone_hints: frozenset[str] = frozenset()
    has_hints: bool = False  # forZones was a non-empty list
    node_hints: frozenset[str] = frozenset()  # forNodes (PreferSameNode, GA in 1.35)


@dataclass(frozen=True, slots=True)
class SlicePort:
    name: str
    protocol: Proto
    port: int


@dataclass(frozen=True, slots=True)
class EndpointSlice:
    namespace: str
    name: str
    service: str  # the kubernetes.io/service-name label
    family: int  # 4 or 6 (FQDN slices are dropped)
    ports: tuple[SlicePort, ...]
    endpoints: tuple[Endpoint, ...]
    weight: int = 1  # ipvsproxy.io/weight
    trigger_time: str = ""
    # Endpoints whose address ipvsproxy refuses to program (multicast, an ambiguous spelling)
    # but kube-proxy reads and counts: they take part in choosing the endpoints (topology
    # hints, the terminating fallback; endpoints.py) and are never programmed.
    refused: tuple[Endpoint, ...] = ()


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    zone: str = ""
    addresses: tuple[IPAddress, ...] = ()
    deleting: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    # spec.podCIDRs: this node's pods' addresses, which no tenant's Service address may claim
    pod_cidrs: tuple[IPNetwork, ...] = ()


# ------------------------------------------------------------------------------ helpers


def _meta(obj: Mapping[str, Any]) -> tuple[str, str, Mapping[str, Any]]:
    meta = obj.get("metadata")
    if not isinstance(meta, _MAP):
        meta = {}
    ns = meta.get("namespace")
    name = meta.get("name")
    # a namespace is one string (sys.intern), not one per object: a cluster has few of them
    ns = _intern(ns) if ns.__class__ is str else ns if isinstance(ns, str) else ""
    return (ns, name if isinstance(name, str) else "", meta)


def _str_map(v: Any) -> dict[str, str]:
    if not isinstance(v, _MAP):
        return {}
    return {k: x for k, x in v.items() if isinstance(k, str) and isinstance(x, str)}


def _port(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535:
        return None
    return v


# Parsed addresses by their text, for the addresses a watch stream repeats that the slice
# parser does not find at the same place in the previous version (endpoints reordered, a
# Service's addresses): parsing one costs as much as the rest of an endpoint (_parse_ip).
# Small and cleared when full: it holds its texts alive, and at 2**18 entries it and they
# took 18 MB of the store at 50,000 services x 10 endpoints, for hits that recent addresses
# give as well.
_IPS: dict[str, IPAddress] = {}
_IPS_MAX = 1 << 14


def _ip(v: Any) -> IPAddress | None:
    if not isinstance(v, str):
        return None
    a = _IPS.get(v)
    if a is not None:
        return a
    if "%" in v:
        # An IPv6 zone ("fe80::1%eth0"): ip_address takes it, the API server does not
        # (netutils.ParseIPSloppy, Go's net.ParseIP), and its text, newlines included, would
        # reach iptables-restore and ipset restore as written.
        return None
    try:
        a = _parse_ip(v)
    except ValueError:
        return None
    if isinstance(a, IPv6Address) and a.ipv4_mapped is not None:
        # IPv4-mapped ("::ffff:203.0.113.5"): the API server lets it into legacy fields and
        # kube-proxy programs the IPv4 address (Go's net.IP); refused here, as is a leading
        # zero, which ip_address rejects: one text must name one address (README)
        return None
    if len(_IPS) >= _IPS_MAX:
        _IPS.clear()
    _IPS[v] = a
    return a


# Equal port values (and tuples of them) shared between objects: most Services and EndpointSlices
# of a cluster repeat a few ports (80/TCP "http"...), and each value is 56 to 64 bytes, each
# tuple of them 48 more (9 MB at 50,000 services x 10 endpoints). Frozen, so sharing is safe;
# bounded as _IPS is (cleared when full).
_SHARED: dict[Any, Any] = {}
_SHARED_MAX = 1 << 12
_T = TypeVar("_T")


def shared(v: _T) -> _T:
    """The value held for `v` (hashable, immutable, equal to it), or `v`, now held."""
    got = _SHARED.get(v)
    if got is not None:
        return got  # type: ignore[no-any-return]
    if len(_SHARED) >= _SHARED_MAX:
        _SHARED.clear()
    _SHARED[v] = v
    return v


def sloppy_ip(text: Any) -> IPAddress | None:
    """The address kube-proxy reads from `text` (netutils.ParseIPSloppy, Go 1.16's net.ParseIP):
    each IPv4 part decimal even with leading zeros, and an IPv4-mapped IPv6 address the IPv4
    address (net.IP.To4). Only for endpoints that ipvsproxy refuses but kube-proxy counts."""
    if not isinstance(text, str) or "%" in text:  # Go's net.ParseIP takes no IPv6 zone
        return None
    parts = text.split(".")
    if len(parts) == 4 and all(p.isascii() and p.isdigit() for p in parts):
        nums = [int(p) for p in parts]
        return IPv4Address(bytes(nums)) if max(nums) <= 255 else None
    try:
        a = ip_address(text)
    except ValueError:
        return None
    return a.ipv4_mapped if isinstance(a, IPv6Address) and a.ipv4_mapped is not None else a


def _parse_ip(text: str) -> IPAddress:
    """ip_address(text), sooner: ip_address is Python (1.5 us an IPv4 address, 3.4 us IPv6),
    and every pod a rollout replaces brings a new address. The C parser's result is taken only
    when the text is its canonical form, which ip_address accepts too, as the same address;
    any other text (leading zeros, a zone, upper case...) is left to ip_address."""
    for family, cls in ((AF_INET, IPv4Address), (AF_INET6, IPv6Address)):
        try:
            packed = inet_pton(family, text)
        except (OSError, ValueError):  # not this family; ValueError: a NUL or not ASCII
            continue
        if inet_ntop(family, packed) == text:
            return cls(packed)
        break
    return ip_address(text)


def cidr(text: Any, strict: bool = False) -> IPNetwork | None:
    """A CIDR as the API server reads one (netutils.ParseCIDRSloppy), or None: surrounding
    blanks are not part of it, and an IPv6 zone ("fe80::%eth0/64"), which ip_network takes,
    is refused."""
    if not isinstance(text, str) or "%" in text:
        return None
    try:
        return ip_network(text.strip(), strict=strict)
    except ValueError:
        return None


def bounded(problems: list[Problem]) -> list[Problem]:
    """At most PROBLEMS_PER_OBJECT of one object's problems, and one line counting the rest: a
    Service with 10,000 bad ports is one warning on every node, not 10,000."""
    if len(problems) <= PROBLEMS_PER_OBJECT:
        return problems
    first = problems[:PROBLEMS_PER_OBJECT]
    p = first[0]
    return [*first, Problem(p.kind, p.namespace, p.name,
                            f"and {len(problems) - PROBLEMS_PER_OBJECT} more problems")]


def _timestamp(v: Any) -> str:
    """RFC 3339 in UTC as the API server writes it; YAML written without quotes loads a
    datetime, which is written back the same way."""
    if isinstance(v, str):
        return v
    if hasattr(v, "astimezone") and hasattr(v, "strftime"):
        from datetime import UTC

        return str((v.astimezone(UTC) if v.tzinfo else v).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return ""


def _special(a: IPAddress) -> str:
    """Why an external or load-balancer address is refused (ValidateNonSpecialIP), or ""."""
    why = special_address(a)
    return refusal(why, "a Service address") if why else ""


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


SCHED_FLAG_BITS = {"sh-fallback": 0x8, "mh-fallback": 0x8, "flag-1": 0x8, "sh-port": 0x10,
                   "mh-port": 0x10, "flag-2": 0x10, "flag-3": 0x20}
def _annotations(ann: Mapping[str, str]) -> tuple[str, int, list[str]]:
    problems: list[str] = []
    raw_sched = ann.get(ANN_SCHEDULER, "")
    sched = raw_sched.strip().lower()
    if sched and sched not in KERNEL_SCHEDULERS:
        problems.append(f"annotation {ANN_SCHEDULER}={raw_sched[:40]!r} is not an IPVS "
                        f"scheduler ({', '.join(sorted(KERNEL_SCHEDULERS))}); using the default")
        sched = ""
    flags = 0
    unknown: list[str] = []
    raw = ann.get(ANN_SCHED_FLAGS, "")
    for word in filter(None, (w.strip() for w in raw.split(","))):
        bit = SCHED_FLAG_BITS.get(word)
        if bit is None:
            unknown.append(word)
        else:
            flags |= bit
    if unknown:
        # one problem for the field, however many words: a 250 KB annotation was 43,519 lines
        shown = ", ".join(repr(w[:20]) for w in unknown[:3])
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        problems.append(f"annotation {ANN_SCHED_FLAGS}: unknown flags {shown}{more} ignored")
    return sched, flags, problems


# ------------------------------------------------------------------------------ parsers


def parse_service(obj: Mapping[str, Any]) -> tuple[Service | None, list[Problem]]:
    """A Service to proxy, or None (skipped: headless, ExternalName, labelled, invalid)."""
    ns, name, meta = _meta(obj)
    problems: list[Problem] = []

    def bad(reason: str) -> Problem:
        return Problem("Service", ns, name or "<unnamed>", reason)

    if not name or not ns:
        return None, [bad("metadata.name and metadata.namespace are required")]
    if not is_dns1035_label(name) or not is_dns_label(ns):
        return None, [bad("metadata.name must be a DNS-1035 label and metadata.namespace a "
                          "DNS-1123 label, as the API server requires; ignored")]
    labels = _str_map(meta.get("labels"))
    if LABEL_PROXY_NAME in labels or LABEL_HEADLESS in labels:
        return None, []  # not ours (kube-proxy's informer label selector drops these)
    spec = obj.get("spec")
    if not isinstance(spec, _MAP):
        return None, [bad("spec is missing or not an object")]
    stype = spec.get("type", "ClusterIP")
    if stype == "ExternalName":
        return None, []
    if stype not in ("ClusterIP", "NodePort", "LoadBalancer"):
        return None, [bad(f"unknown spec.type {stype!r}")]
    raw_ips = _list(spec.get("clusterIPs")) or [spec.get("clusterIP")]
    if raw_ips in ([None], ["None"], [""], []) or "None" in raw_ips:
        return None, []  # headless
    cluster_ips: list[IPAddress] = []
    said: set[str] = set()  # a bad value listed twice is reported once
    for raw in raw_ips:
        a = _ip(raw)
        if a is None:
            if (text := f"clusterIP {raw!r} is not a valid IP address; ignored") not in said:
                said.add(text)
                problems.append(bad(text))
        elif a.version not in {x.version for x in cluster_ips}:
            cluster_ips.append(a)
    if not cluster_ips:
        return None, bounded(problems) or [bad("no valid clusterIP")]
    ports: list[ServicePort] = []
    seen: set[tuple[str, Proto]] = set()
    for i, p in enumerate(_list(spec.get("ports"))):
        if not isinstance(p, _MAP):
            problems.append(bad(f"spec.ports[{i}] is not an object; ignored"))
            continue
        pname = p.get("name", "") if isinstance(p.get("name", ""), str) else None
        proto_raw = p.get("protocol", "TCP")
        port = _port(p.get("port"))
        np_raw = p.get("nodePort", 0)
        node_port = 0 if np_raw in (0, None) else _port(np_raw)
        # isinstance first: a list or an object as protocol is not even hashable
        if pname is None or (pname and not is_dns_label(pname)) \
                or not isinstance(proto_raw, str) \
                or proto_raw not in Proto.__members__ or port is None \
                or node_port is None:
            problems.append(bad(f"spec.ports[{i}] is invalid (name {p.get('name')!r}, protocol "
                                f"{proto_raw!r}, port {p.get('port')!r}, nodePort {np_raw!r}); "
                                "ignored"))
            continue
        if (pname, Proto(proto_raw)) in seen:
            problems.append(bad(f"spec.ports[{i}] duplicates port name {pname!r}; ignored"))
            continue
        seen.add((pname, Proto(proto_raw)))
        if stype == "ClusterIP":
            node_port = 0
        ports.append(shared(ServicePort(pname, Proto(proto_raw), port, node_port)))
    # dicts, not lists, keep the first of repeats: a membership test per item in a list was
    # quadratic (8,000 source ranges took 3.6 s per parse, inside every watch event)
    ext: dict[IPAddress, None] = {}
    for raw in _list(spec.get("externalIPs")):
        a = _ip(raw)
        why = "not a valid IP address" if a is None else _special(a)
        if why:
            if (text := f"externalIP {raw!r} is {why}; ignored") not in said:
                said.add(text)
                problems.append(bad(text))
        elif a is not None:
            ext[a] = None
    lb: dict[IPAddress, None] = {}
    ranges: dict[IPNetwork, None] = {}
    hc = 0
    if stype == "LoadBalancer":
        status = obj.get("status")
        lbs = status.get("loadBalancer") if isinstance(status, _MAP) else None
        ingress = lbs.get("ingress") if isinstance(lbs, _MAP) else None
        for ing in _list(ingress):
            if not isinstance(ing, _MAP) or "ip" not in ing:
                continue  # hostname-only ingress is ignored
            if ing.get("ipMode") == "Proxy":
                continue
            a = _ip(ing.get("ip"))
            why = "not a valid IP address" if a is None else _special(a)
            if why:
                if (text := f"loadBalancer ingress IP {ing.get('ip')!r} is {why}; "
                            "ignored") not in said:
                    said.add(text)
                    problems.append(bad(text))
            elif a is not None:
                lb[a] = None
        for raw in _list(spec.get("loadBalancerSourceRanges")):
            net = cidr(raw)
            if net is None:
                problems.append(bad(f"loadBalancerSourceRange {raw!r} is not a CIDR; ignored"))
            else:
                ranges[net] = None
        # serviceport.go: a zero-masked range of a family means "allow any", as no range of that
        # family does (and ipset's hash:net sets cannot hold a /0)
        open_to = {n.version for n in ranges if n.prefixlen == 0}
        if open_to:
            ranges = {n: None for n in ranges if n.version not in open_to}
        hc = _port(spec.get("healthCheckNodePort")) or 0
    ext_local = spec.get("externalTrafficPolicy") == "Local"
    int_local = spec.get("internalTrafficPolicy") == "Local"
    timeout = 0
    if spec.get("sessionAffinity") == "ClientIP":
        cfg = spec.get("sessionAffinityConfig")
        cip = cfg.get("clientIP") if isinstance(cfg, _MAP) else None
        t = cip.get("timeoutSeconds", 10800) if isinstance(cip, _MAP) else 10800
        if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= 86400:
            problems.append(bad(f"sessionAffinityConfig timeoutSeconds {t!r} is invalid; "
                                "using 10800"))
            t = 10800
        timeout = t
    sched, flags, ann_problems = _annotations(_str_map(meta.get("annotations")))
    problems.extend(bad(p) for p in ann_problems)
    uid = meta.get("uid")
    problems = bounded(problems)
    # the type's text is one of three: one string each (interned), not one per Service
    svc = Service(ns, name, _intern(stype), tuple(cluster_ips), shared(tuple(ports)),
                  tuple(ext), tuple(lb), tuple(ranges), ext_local, int_local, timeout,
                  hc if ext_local else 0, sched, flags, "",
                  _timestamp(meta.get("creationTimestamp")), uid if isinstance(uid, str) else "")
    return svc, problems


def parse_node(obj: Mapping[str, Any]) -> tuple[Node | None, list[Problem]]:
    _, name, meta = _meta(obj)
    if not name:
        return None, [Problem("Node", "", "<unnamed>", "metadata.name is required")]
    labels = _str_map(meta.get("labels"))
    status = obj.get("status")
    addrs: list[IPAddress] = []
    # InternalIPs first, then ExternalIPs, as GetNodeHostIPs orders them: the first address
    # of a family is the node's primary IP of that family.
    raw = _list(status.get("addresses") if isinstance(status, _MAP) else None)
    for kind in ("InternalIP", "ExternalIP"):
        for a in raw:
            if isinstance(a, _MAP) and a.get("type") == kind:
                ip = _ip(a.get("address"))
                if ip is not None and ip not in addrs:
                    addrs.append(ip)
    spec = obj.get("spec")
    if not isinstance(spec, _MAP):
        spec = {}
    taints = _list(spec.get("taints"))
    deleting = bool(meta.get("deletionTimestamp")) or any(
        isinstance(t, _MAP) and t.get("key") == TAINT_TO_BE_DELETED for t in taints)
    pod_cidrs = tuple(dict.fromkeys(n for n in map(cidr, _list(spec.get("podCIDRs"))
                                                   or [spec.get("podCIDR")]) if n is not None))
    return Node(name, labels.get(LABEL_ZONE, ""), tuple(addrs), deleting, labels, pod_cidrs), []
