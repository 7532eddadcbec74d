"""EndpointSlice JSON into `EndpointSlice` values: the parser on the hot watch path.

Every watch event of every slice passes through `parse_endpoint_slice`, so this module owns the
sharing that keeps an update cheap: given what the previous version of the slice parsed to, the
parts that did not change (each endpoint, the ports, the whole slice) are the previous objects.
The values, the other parsers and the field helpers it shares with them are in core/model.py;
semantics follow kube-proxy's endpointslicecache.go.
"""

from __future__ import annotations

from collections.abc import Mapping
from ipaddress import IPv4Address, IPv6Address
from socket import AF_INET, AF_INET6, inet_pton
from sys import intern as _intern
from types import MappingProxyType
from typing import Any

from ipvsproxy.core.model import (
    _MAP,
    ANN_TRIGGER_TIME,
    ANN_WEIGHT,
    LABEL_HEADLESS,
    LABEL_PROXY_NAME,
    LABEL_SERVICE_NAME,
    Endpoint,
    EndpointSlice,
    Problem,
    Proto,
    SlicePort,
    _ip,
    _list,
    _meta,
    _port,
    bounded,
    shared,
    sloppy_ip,
)
from ipvsproxy.core.validate import is_dns_label, is_dns_subdomain, refusal, special_address

# Shared by every endpoint without zone hints: `frozenset()` builds a new 216-byte, GC-tracked
# object each time (no empty singleton since Python 3.10), ten per event and 100k at 100k
# endpoints.
_NO_ZONES: frozenset[str] = frozenset()
_NO_MAP: Mapping[str, Any] = MappingProxyType({})
_PROTOS = {p.value: p for p in Proto}


def _names(hints: list[Any]) -> frozenset[str]:
    """The names of a forZones or forNodes list (a shared empty set for none)."""
    return frozenset(h["name"] for h in hints
                     if isinstance(h, _MAP) and isinstance(h.get("name"), str)) or _NO_ZONES


def _map_or_none(v: Any) -> Mapping[str, Any] | None:
    # `None` first: isinstance(None, Mapping) is the slow ABC check, and absent is the usual case
    return None if v is None or not isinstance(v, _MAP) else v


def parse_endpoint_slice(obj: Mapping[str, Any], prev: EndpointSlice | None = None,
                         ) -> tuple[EndpointSlice | None, list[Problem]]:
    """An EndpointSlice to proxy, or None (skipped: FQDN, no service-name label, not ours).

    `prev`, what the previous version of this slice parsed to, never changes the value returned,
    only its sharing: a part equal to prev's (an endpoint, the ports) is prev's object, and a
    slice equal to prev is prev itself. A watch update changes one endpoint of many: the rest
    then cost no allocation, no memory and no garbage collection, and compare by identity.
    """
    ns, name, meta = _meta(obj)
    problems: list[Problem] = []

    def bad(reason: str) -> Problem:
        return Problem("EndpointSlice", ns, name or "<unnamed>", reason)

    if not name or not ns:
        return None, [bad("metadata.name and metadata.namespace are required")]
    if (prev is None or name != prev.name or ns != prev.namespace) \
            and (not is_dns_subdomain(name) or not is_dns_label(ns)):
        return None, [bad("metadata.name must be a DNS-1123 subdomain and metadata.namespace "
                          "a DNS-1123 label, as the API server requires; ignored")]
    labels = _map_or_none(meta.get("labels")) or _NO_MAP
    if isinstance(labels.get(LABEL_PROXY_NAME), str) or isinstance(labels.get(LABEL_HEADLESS), str):
        return None, []
    svc = labels.get(LABEL_SERVICE_NAME)
    if not svc or not isinstance(svc, str):
        return None, []  # kube-proxy ignores slices without the service-name label
    at = obj.get("addressType")
    if at not in ("IPv4", "IPv6"):
        if at != "FQDN":
            problems.append(bad(f"addressType {at!r} is not IPv4, IPv6 or FQDN; ignored"))
        return None, problems
    family, addr_type = (4, IPv4Address) if at == "IPv4" else (6, IPv6Address)
    if prev is not None and prev.family != family:
        prev = None
    old_ports = prev.ports if prev is not None else ()
    ports: list[SlicePort] = []
    for i, p in enumerate(_list(obj.get("ports"))):
        if not isinstance(p, _MAP):
            problems.append(bad(f"ports[{i}] is not an object; ignored"))
            continue
        pname = p.get("name") or ""
        proto_raw = p.get("protocol", "TCP")
        proto = _PROTOS.get(proto_raw) if isinstance(proto_raw, str) else None
        port = _port(p.get("port"))
        if not isinstance(pname, str) or (pname and not is_dns_label(pname)) or proto is None \
                or port is None:
            if p.get("port") is not None:  # kube-proxy ignores nil ports silently
                problems.append(bad(f"ports[{i}] is invalid (name {pname!r}, port "
                                    f"{p.get('port')!r}, protocol {proto_raw!r}); ignored"))
            continue
        k = len(ports)
        if k < len(old_ports) and (o := old_ports[k]).port == port and o.name == pname \
                and o.protocol is proto:
            ports.append(o)
        else:
            ports.append(shared(SlicePort(pname, proto, port)))
    old_eps = prev.endpoints if prev is not None else ()
    n_old = len(old_eps)
    af = AF_INET if family == 4 else AF_INET6
    eps: list[Endpoint] = []
    refused: list[Endpoint] = []
    same = True  # every endpoint so far is prev's, at the same place
    for i, e in enumerate(_list(obj.get("endpoints"))):
        if not isinstance(e, _MAP):
            problems.append(bad(f"endpoints[{i}] is not an object; ignored"))
            continue
        # This loop runs once per endpoint of every watch event: helpers are inlined, and an
        # endpoint equal to prev's at the same place is compared, not built.
        addrs = e.get("addresses")
        text: Any = addrs[0] if isinstance(addrs, list) and addrs else None  # [0] only
        k = len(eps)
        # The address of prev's endpoint at this place, if the text names it: compared as
        # the bytes inet_pton makes of it (C), not parsed into an address (Python, and a
        # dict of texts would hold one more string per endpoint: ~40 MB at 500,000).
        # inet_pton takes only what the full parse below takes as the same address.
        try:
            same_addr = k < n_old and int.from_bytes(inet_pton(af, text)) == int(old_eps[k].addr)
        except (OSError, TypeError, ValueError):  # not an address of this family, not a str
            same_addr = False
        refuse = False
        if same_addr:
            a = old_eps[k].addr
        else:
            parsed = _ip(text)
            if parsed is None or parsed.__class__ is not addr_type:
                problems.append(bad(f"endpoints[{i}] address {_list(addrs)[:1]!r} is not a "
                                    f"valid IPv{family} address; ignored"))
                # kube-proxy still counts what ParseIPSloppy reads in it (a leading zero, an
                # IPv4-mapped spelling): kept aside as refused, see EndpointSlice.refused
                parsed = sloppy_ip(text)
                if parsed is None or parsed.__class__ is not addr_type:
                    continue
                refuse = True
            elif why := special_address(parsed):  # ValidateEndpointIP, and any multicast
                problems.append(bad(f"endpoints[{i}] address {text!r} is "
                                    f"{refusal(why, 'an endpoint')}; ignored"))
                refuse = True
            a = parsed
        cond = e.get("conditions")
        if cond is None or not isinstance(cond, _MAP):
            cond = _NO_MAP
        hints = e.get("hints")
        zones = nodes = _NO_ZONES
        has_hints = False
        if hints is not None and isinstance(hints, _MAP):
            # endpointslicecache.go: an empty forZones (forNodes) list is no hint at all
            if isinstance(for_zones := hints.get("forZones"), list):
                has_hints = bool(for_zones)
                zones = _names(for_zones)
            if isinstance(for_nodes := hints.get("forNodes"), list):
                nodes = _names(for_nodes)
        node = e.get("nodeName")
        node = node if node.__class__ is str else ""
        ready, serving, term = cond.get("ready"), cond.get("serving"), cond.get("terminating")
        ready = ready if ready.__class__ is bool else True
        serving = serving if serving.__class__ is bool else True
        term = term if term.__class__ is bool else False
        if refuse:
            refused.append(Endpoint(a, ready, serving, term, _intern(node), zones, has_hints,
                                    nodes))
            continue
        if k < n_old and old_eps[k] == (a, ready, serving, term, node, zones, has_hints, nodes):
            ep = old_eps[k]
        else:
            same = False
            # A node's name is one string (sys.intern), not one per endpoint: less memory, and
            # the next version's compare finds it by identity.
            ep = Endpoint(a, ready, serving, term, _intern(node), zones, has_hints, nodes)
        eps.append(ep)
    ann = _map_or_none(meta.get("annotations")) or _NO_MAP
    weight = 1
    raw_weight = ann.get(ANN_WEIGHT)
    if isinstance(raw_weight, str):
        raw = raw_weight.strip()
        if raw.isdigit() and raw.isascii() and int(raw) <= 65535:
            weight = int(raw)
        else:
            problems.append(bad(f"annotation {ANN_WEIGHT}={raw_weight!r} is not an "
                                "integer in 0..65535; using 1"))
    trigger = ann.get(ANN_TRIGGER_TIME)
    trigger = trigger if isinstance(trigger, str) else ""
    if problems:
        problems = bounded(problems)  # a slice from a file may hold a million bad endpoints
    port_t = shared(tuple(ports))  # most slices of a cluster list the same few ports
    refused_t = tuple(refused) if refused else ()
    if prev is not None:
        if port_t == prev.ports:  # by identity, unless a port changed
            port_t = prev.ports
        if same and len(eps) == n_old:  # every endpoint is prev's
            if old_eps is prev.endpoints and port_t is prev.ports and svc == prev.service \
                    and weight == prev.weight and trigger == prev.trigger_time \
                    and ns == prev.namespace and name == prev.name \
                    and refused_t == prev.refused:
                return prev, problems
            return (EndpointSlice(ns, name, svc, family, port_t, old_eps, weight, trigger,
                                  refused_t), problems)
    return (EndpointSlice(ns, name, svc, family, port_t, tuple(eps), weight, trigger, refused_t),
            problems)
