"""Every difference between kube-proxy's kernel state and ipvsproxy's, classified.

`DEVIATIONS` is the table of the deliberate differences the README documents: each entry has
the README sentence it stands for (tests/differential/test_snapshot.py checks that the README
says it, word for word up to line breaks), the test that shows the behaviour is intended, and a
predicate over a `Difference` and the cluster's objects (`Context`). `classify` returns
"documented: <name>" for a difference one of them explains and "unexplained: <kind>" for any
other, which the differential test reports as a failure: a bug in ipvsproxy, or something
kube-proxy does that ipvsproxy does not.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

from ipvsproxy.core.model import sloppy_ip
from tests.differential.cluster import LABEL_SERVICE_NAME, Params
from tests.differential.snapshot import Difference

README = Path(__file__).resolve().parents[2] / "README.md"
UNEXPLAINED = "unexplained"
DOCUMENTED = "documented: "
Obj = dict[str, Any]


def _sloppy(text: str) -> str | None:
    """An address as kube-proxy parses it (netutils.ParseIPSloppy: leading zeros decimal, an
    IPv4-mapped address the IPv4 one), as text; the product reads refused endpoints so too."""
    a = sloppy_ip(text)
    return None if a is None else str(a)


@dataclass
class Context:
    """The cluster as the API server served it: which Service owns a virtual server."""

    services: dict[tuple[str, str], Obj] = field(default_factory=dict)
    slices: dict[tuple[str, str], list[Obj]] = field(default_factory=dict)
    # "TCP 10.96.0.1:443" (and "TCP *:30080" for a node port) -> (namespace, name)
    frontends: dict[str, tuple[str, str]] = field(default_factory=dict)
    node_ips: tuple[str, ...] = ()
    # addresses the objects spell only with leading zeros ("010.244.001.005"), canonical form
    leading_zeros: set[str] = field(default_factory=set)
    # IPv4 addresses the objects spell only IPv4-mapped ("::ffff:203.0.113.5")
    v4_mapped: set[str] = field(default_factory=set)
    service_cidrs: tuple[str, ...] = Params().service_cidrs
    cluster_cidrs: tuple[str, ...] = Params().cluster_cidrs  # the pod network
    # "TCP 10.96.0.1:443" -> every Service with a clusterIP, externalIP or LB IP there
    claims: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    # externalIPs and LB ingress IPs (VIP mode), canonical
    tenant_ips: set[str] = field(default_factory=set)
    # endpoint, externalIP and LB ingress addresses, canonical
    any_ips: set[str] = field(default_factory=set)
    node_name: str = ""
    zone: str = ""  # the Node's topology.kubernetes.io/zone label
    # LB ingress IPs (VIP) that are an externalIP of the same Service too
    lb_and_external: set[str] = field(default_factory=set)
    # service ports ("10.96.0.10:80/UDP", as kube-proxy names them) whose last topology
    # decision before the snapshot, in kube-proxy's log, was made without the node's zone
    kube_proxy_no_zone: frozenset[str] = frozenset()

    @classmethod
    def from_objects(cls, objects: Iterable[Obj], params: Params | None = None) -> Context:
        c = cls()
        objs = list(objects)
        for o in objs:
            if o.get("kind") == "Node":
                c.node_ips = tuple(a["address"] for a in o.get("status", {}).get("addresses", [])
                                   if a.get("type") in ("InternalIP", "ExternalIP"))
                c.node_name = o["metadata"]["name"]
                c.zone = o["metadata"].get("labels", {}).get("topology.kubernetes.io/zone", "")
        for o in objs:
            meta = o.get("metadata", {})
            key = (meta.get("namespace", ""), meta.get("name", ""))
            if o.get("kind") == "Service":
                c.services[key] = o
                c._frontends(o, key)
            elif o.get("kind") == "EndpointSlice":
                svc = meta.get("labels", {}).get(LABEL_SERVICE_NAME)
                if svc:
                    c.slices.setdefault((key[0], svc), []).append(o)
        if params is not None:
            c.service_cidrs = params.service_cidrs
            c.cluster_cidrs = params.cluster_cidrs
            # ipvsproxy refuses the addresses on the node's own links, not only those its Node
            # object lists (an IPv4-only Node on a NIC with an IPv6 address too: seed 424834)
            c.node_ips = tuple(dict.fromkeys((*c.node_ips, *params.node_ips)))
        spelled: set[str] = set()
        zeros: set[str] = set()
        mapped: set[str] = set()
        for o in objs:
            for text in _addresses_of(o):
                canon = _sloppy(text)
                if canon is None:
                    continue
                if canon == text or ":" in canon:
                    spelled.add(canon)
                elif ":" in text:
                    mapped.add(canon)
                else:
                    zeros.add(canon)
        c.leading_zeros = zeros - spelled
        c.v4_mapped = mapped - spelled
        c.any_ips = spelled | zeros | mapped
        return c

    def _frontends(self, svc: Obj, key: tuple[str, str]) -> None:
        spec = svc.get("spec", {})
        if spec.get("type") == "ExternalName":
            return
        addrs = [a for a in spec.get("clusterIPs", []) if a != "None"]
        tenant = list(spec.get("externalIPs", []))
        if spec.get("type") == "LoadBalancer":
            tenant += [i["ip"] for i in svc.get("status", {}).get("loadBalancer", {})
                       .get("ingress", []) if "ip" in i and i.get("ipMode", "VIP") == "VIP"]
        self.tenant_ips |= {a for t in tenant if (a := _sloppy(t)) is not None}
        ext = {_sloppy(a) for a in spec.get("externalIPs", [])}
        self.lb_and_external |= {a for t in tenant[len(spec.get("externalIPs", [])):]
                                 if (a := _sloppy(t)) is not None and a in ext}
        if spec.get("clusterIP") == "None" or not addrs:
            return
        for p in spec.get("ports", []):
            for a in addrs + tenant:
                ip = _sloppy(a)
                if ip is not None:
                    vs = _vs(p["protocol"], ip, p["port"])
                    self.frontends.setdefault(vs, key)
                    self.claims.setdefault(vs, set()).add(key)
            if p.get("nodePort"):
                self.frontends[f"{p['protocol']} *:{p['nodePort']}"] = key

    def owner(self, vs_key: str) -> Obj | None:
        """The Service a virtual server ("TCP 10.96.0.1:443") belongs to."""
        key = self.frontends.get(vs_key)
        if key is None:
            proto, _, hostport = vs_key.partition(" ")
            key = self.frontends.get(f"{proto} *:{hostport.rpartition(':')[2]}")
        return self.services.get(key) if key else None

    def slices_of(self, svc: Obj) -> list[Obj]:
        m = svc["metadata"]
        return self.slices.get((m["namespace"], m["name"]), [])


def _addresses_of(o: Obj) -> list[str]:
    """The IP addresses an object spells: clusterIPs, externalIPs, LB ingress IPs, endpoint
    addresses."""
    out: list[str] = []
    spec = o.get("spec", {})
    if o.get("kind") == "Service":
        out += [a for a in spec.get("clusterIPs", []) if a != "None"]
        out += spec.get("externalIPs", [])
        out += [i["ip"] for i in o.get("status", {}).get("loadBalancer", {}).get("ingress", [])
                if "ip" in i]
    elif o.get("kind") == "EndpointSlice" and o.get("addressType") in ("IPv4", "IPv6"):
        out += [a for e in o.get("endpoints") or [] for a in e.get("addresses", [])[:1]]
    return out


_IP_RE = re.compile(r"(?<![\w.:])(\d{1,3}(?:\.\d{1,3}){3}|[0-9a-f]*:[0-9a-f:]+)(?![\w.])")


def ips_in(text: str) -> set[str]:
    """Every IP address a difference's key or value names, canonical."""
    out = set()
    for m in _IP_RE.finditer(text):
        canon = _sloppy(m.group(1).strip("[]"))
        if canon is not None:
            out.add(canon)
    return out


def _vs(proto: str, ip: str, port: int) -> str:
    a = ip_address(ip)
    return f"{proto} [{a}]:{port}" if a.version == 6 else f"{proto} {a}:{port}"


def vs_of(d: Difference) -> str:
    """The virtual server a difference is about ("TCP 10.96.0.1:443"), or ""."""
    if d.kind == "ipvs service":
        return d.key
    if d.kind == "ipvs dest":
        return d.key.partition(" -> ")[0]
    return ""


# ------------------------------------------------------------------------------ the table


@dataclass(frozen=True)
class Deviation:
    name: str
    readme: str  # the README's sentence (whitespace-normalized)
    test: str  # a test that shows the behaviour is intended (pytest node id)
    matches: Callable[[Difference, Context], bool]


def _annotated_scheduler(d: Difference, c: Context) -> bool:
    if d.kind != "ipvs service" or d.reference is None or d.candidate is None:
        return False
    svc = c.owner(d.key)
    ann = (svc or {}).get("metadata", {}).get("annotations", {})
    return "ipvsproxy.io/scheduler" in ann or "ipvsproxy.io/scheduler-flags" in ann


def _weight(text: str | None) -> str:
    m = re.search(r"-w (\d+)", text or "")
    return m.group(1) if m else ""


def _annotated_weight(d: Difference, c: Context) -> bool:
    if d.kind != "ipvs dest" or d.reference is None or d.candidate is None:
        return False
    if re.sub(r"-w \d+", "", d.reference) != re.sub(r"-w \d+", "", d.candidate):
        return False
    svc = c.owner(vs_of(d))
    if svc is None:
        return False
    rs = d.key.partition(" -> ")[2]
    host = rs.rpartition(":")[0].strip("[]")
    for sl in c.slices_of(svc):
        w = sl["metadata"].get("annotations", {}).get("ipvsproxy.io/weight")
        if w is not None and w.strip() == _weight(d.candidate) and any(
                _sloppy(e["addresses"][0]) == host for e in sl.get("endpoints", [])):
            return True
    return False


def _own_set(prefix: str) -> Callable[[Difference, Context], bool]:
    def match(d: Difference, c: Context) -> bool:
        del c
        if d.kind in ("ipset type/options", "ipset member"):
            return d.reference is None and d.key.startswith(prefix)
        return False
    return match


def _ext_no_local(d: Difference, c: Context) -> bool:
    if _own_set("IPVSPROXY-EXT-NO-LOCAL")(d, c):
        return True
    return (d.kind == "iptables rule" and d.reference is None
            and "KUBE-PROXY-FIREWALL" in d.key and "IPVSPROXY-EXT-NO-LOCAL" in d.key)


def _set_entry_vs(d: Difference) -> str:
    """The frontend an ipset member of a hash:ip,port set names ("TCP 10.96.0.1:443")."""
    entry = d.key.partition(" ")[2]
    parts = entry.split(",")
    if len(parts) < 2 or ":" not in parts[1]:
        return ""
    proto, _, port = parts[1].partition(":")
    ip = _sloppy(parts[0])
    return _vs(proto.upper(), ip, int(port)) if ip and port.isdigit() else ""


def _claimed_twice(d: Difference, c: Context) -> bool:
    """About a frontend that two Services claim: kube-proxy's state there depends on its map
    order (the last writer wins); ipvsproxy's on the claims' rank and age."""
    vs = vs_of(d) or (_set_entry_vs(d) if d.kind == "ipset member" else "")
    return bool(vs) and len(c.claims.get(vs, ())) > 1


def _tenant_address(d: Difference, c: Context) -> bool:
    """About an externalIP or LB ingress IP inside the service ranges or the pod network, or
    equal to a node address, which kube-proxy programs and ipvsproxy refuses. Where it is a
    ClusterIP too (a Service's own, say), kube-proxy writes that virtual server twice, the
    externalIP's real servers (Local policy: this node's only) over the ClusterIP's, so
    ipvsproxy alone has the ClusterIP's others."""
    ips = ips_in(d.key)
    if d.candidate is not None:
        if d.reference is not None or d.kind != "ipvs dest":
            return False
        ips = ips_in(vs_of(d))
    nets = [ip_network(n) for n in (*c.service_cidrs, *c.cluster_cidrs)]
    nodes = {_sloppy(a) for a in c.node_ips}
    return any(ip in nodes or any(ip_address(ip) in n for n in nets)
               for ip in ips & c.tenant_ips)


def _special(ip: str) -> bool:
    a = ip_address(ip)
    return a.is_unspecified or a.is_loopback or a.is_link_local or a.is_multicast


def _special_address(d: Difference, c: Context) -> bool:
    """About an endpoint, externalIP or LB IP that is unspecified, loopback, link-local or
    multicast, which kube-proxy programs where the API server let it in."""
    return d.candidate is None and any(_special(ip) for ip in ips_in(d.key) & c.any_ips)


def _refused_local_endpoints(d: Difference, c: Context) -> bool:
    """A real server only ipvsproxy has in an external virtual server (externalIP, LB IP,
    NodePort) of an externalTrafficPolicy Local Service whose local endpoints all have special
    addresses: kube-proxy chooses them, so it has no fallback, and the kernel refuses them
    (an empty virtual server); ipvsproxy refuses them first, finds no usable local endpoint and
    does what it documents for that case (the cluster's endpoints, outside clients dropped;
    externalTrafficPolicy Local without a local endpoint). Seed 853066 found it."""
    if d.kind != "ipvs dest" or d.reference is not None or d.candidate is None:
        return False
    vs = vs_of(d)
    svc = c.owner(vs)
    if svc is None:
        return False
    spec = svc.get("spec", {})
    if spec.get("externalTrafficPolicy") != "Local" or \
            ips_in(vs) & {_sloppy(a) for a in spec.get("clusterIPs") or []}:
        return False
    local = [e for sl in c.slices_of(svc) for e in sl.get("endpoints") or []
             if e.get("addresses") and e.get("nodeName") == c.node_name]
    # An address kube-proxy cannot read (netutils.ParseIPSloppy) is still chosen, by nodeName,
    # and then skipped when the real servers are built: as refused as a special one.
    return bool(local) and all((ip := _sloppy(e["addresses"][0])) is None or _special(ip)
                               for e in local)


def _leading_zeros(d: Difference, c: Context) -> bool:
    """About an address the API objects spell only with leading zeros (legacy IPv4 fields:
    externalIPs, LB ingress IPs, IPv4 EndpointSlice addresses): kube-proxy reads them as
    decimal (netutils.ParseIPSloppy), ipvsproxy refuses them."""
    return d.candidate is None and bool(ips_in(d.key) & c.leading_zeros)


def _v4_mapped(d: Difference, c: Context) -> bool:
    """About an externalIP spelled IPv4-mapped ("::ffff:203.0.113.5"), which the API server
    accepts (legacy IP validation) and kube-proxy programs as the IPv4 address (Go's net.IP,
    MapIPsByIPFamily); ipvsproxy refuses it."""
    return d.candidate is None and bool(ips_in(d.key) & c.v4_mapped)


_TOPOLOGY_LINE = re.compile(r'topology\.go:\d+\] "Ignoring same-zone topology hints for service '
                            r'since ([^"]*)" service="([^"]+)"')


def zone_unknown(log: str) -> frozenset[str]:
    """The service ports whose last same-zone decision in kube-proxy's log (--v=2) was "node
    is missing label": kube-proxy did not know the node's zone when it last synced them."""
    last: dict[str, str] = {}
    for m in _TOPOLOGY_LINE.finditer(log):
        last[m.group(2)] = m.group(1)
    return frozenset(k for k, why in last.items() if why == "node is missing label")


def _ready(e: Obj) -> bool:
    cond = e.get("conditions") or {}
    return cond.get("ready") is not False  # endpointslicecache.go: nil is ready


def _zones(e: Obj) -> set[str]:
    return {h.get("name") for h in (e.get("hints") or {}).get("forZones") or []}


def _kube_proxy_lost_zone(d: Difference, c: Context) -> bool:
    """A real server kube-proxy programs only because it did not know the node's zone: the
    Node has a zone label, kube-proxy logged "node is missing label" for the service, every
    ready endpoint has zone hints, one is hinted for the node's zone, and this one is not (so
    same-zone topology would leave it out, topology.go topologyModeFromHints)."""
    if d.kind != "ipvs dest" or d.reference is None or d.candidate is not None or not c.zone:
        return False
    svc = c.owner(vs_of(d))
    if svc is None:
        return False
    spec = svc.get("spec", {})
    names = {f"{ip}:{p['port']}/{p['protocol']}" for ip in spec.get("clusterIPs", [])
             for p in spec.get("ports", [])}
    if not names & c.kube_proxy_no_zone:
        return False
    host = _sloppy(d.key.partition(" -> ")[2].rpartition(":")[0].strip("[]"))
    ready = [e for sl in c.slices_of(svc) for e in sl.get("endpoints") or []
             if e.get("addresses") and _ready(e)]
    this = [e for e in ready if _sloppy(e["addresses"][0]) == host]
    return bool(this) and all(_zones(e) for e in ready) \
        and any(c.zone in _zones(e) for e in ready) and all(c.zone not in _zones(e) for e in this)


DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        "per-service scheduler",
        "Service annotation `ipvsproxy.io/scheduler` picks any kernel scheduler (rr, wrr, lc, "
        "wlc, sh, mh, dh, sed, nq, ...; default `--ipvs-scheduler`, itself `rr` by default) and "
        "`ipvsproxy.io/scheduler-flags` sets its flags",
        "tests/unit/test_desired.py::test_scheduler",
        _annotated_scheduler),
    Deviation(
        "per-slice weight",
        "EndpointSlice annotation `ipvsproxy.io/weight` (0..65535, default 1) sets the weight "
        "of that slice's endpoints, for canaries with `wrr`.",
        "tests/unit/test_desired.py::test_slice_weight_annotation",
        _annotated_weight),
    Deviation(
        "ownership record",
        "The record is kept in the kernel, so it survives restarts with nothing on disk: the "
        "ipset `IPVSPROXY-OWNED-VS` (`IPVSPROXY-OWNED-VS-6`) lists the virtual servers it "
        "created or adopted",
        "tests/unit/test_plan.py::test_foreign_virtual_server_at_a_desired_key_is_left_alone",
        lambda d, c: _own_set("IPVSPROXY-OWNED-VS")(d, c)
        or _own_set("IPVSPROXY-FOREIGN-VS")(d, c)),
    Deviation(
        "externalTrafficPolicy Local without a local endpoint",
        "As kube-proxy's iptables and nftables modes do, connections from outside the cluster "
        "to that NodePort, LoadBalancer IP or externalIP on this node are dropped (filter rule "
        "on the set `IPVSPROXY-EXT-NO-LOCAL`)",
        "tests/unit/test_desired_endpoints.py::"
        "test_external_traffic_policy_local_without_local_endpoints",
        _ext_no_local),
    Deviation(
        "address claims settled by authority",
        "An address:port:protocol that several Services claim goes to the claim of the most "
        "trusted writer: a ClusterIP or NodePort (allocated and made unique by the API "
        "server), then a LoadBalancer status IP (written by the load balancer's controller; "
        "tenants cannot write status), then an externalIP (written by any editor of the "
        "Service), whatever the namespaces are called.",
        "tests/unit/test_tenants.py::test_an_external_ip_never_takes_another_services_cluster_ip",
        _claimed_twice),
    Deviation(
        "tenant addresses refused",
        "An externalIP or LoadBalancer ingress IP inside the service ranges "
        "(`--service-cluster-ip-range`, and the ranges of the cluster's ServiceCIDR objects, "
        "watched where the API serves them, 1.33+), inside the pod network (`--cluster-cidr`, "
        "and this node's `spec.podCIDRs`) or equal to one of this node's own addresses is "
        "refused with a warning naming the Service",
        "tests/unit/test_tenants.py::"
        "test_tenant_addresses_inside_the_service_range_or_the_nodes_are_refused",
        _tenant_address),
    Deviation(
        "special addresses refused",
        "an endpoint, externalIP or LoadBalancer IP that is unspecified, loopback, link-local "
        "or multicast (the API server refuses link-local multicast; ipvsproxy every multicast "
        "address, which IPVS cannot balance) is refused",
        "tests/unit/test_tenants.py::"
        "test_special_addresses_are_refused_for_endpoints_and_service_addresses",
        lambda d, c: _special_address(d, c) or _refused_local_endpoints(d, c)),
    Deviation(
        "ambiguous IPv4 spellings refused (leading zeros)",
        "An IPv4 address written with leading zeros (`010.244.1.5`) or as IPv4-mapped IPv6 "
        "(`::ffff:203.0.113.5`) in an externalIP, LoadBalancer IP or EndpointSlice address is "
        "refused with a warning naming the object",
        "tests/unit/test_tenants.py::test_ambiguous_ipv4_spellings_are_refused",
        _leading_zeros),
    Deviation(
        "ambiguous IPv4 spellings refused (IPv4-mapped)",
        "An IPv4 address written with leading zeros (`010.244.1.5`) or as IPv4-mapped IPv6 "
        "(`::ffff:203.0.113.5`) in an externalIP, LoadBalancer IP or EndpointSlice address is "
        "refused with a warning naming the object",
        "tests/unit/test_tenants.py::test_ambiguous_ipv4_spellings_are_refused",
        _v4_mapped),
    Deviation(
        "kube-proxy did not know the node's zone",
        "kube-proxy 1.35 can start without the node's zone: its NodeTopologyConfig adds its "
        "handler to the node informer, which kube-proxy's NodeManager has already started, "
        "before the proxier is registered with it",
        "tests/unit/test_desired_endpoints.py::test_topology_zone_hints",
        _kube_proxy_lost_zone),
)

@dataclass(frozen=True)
class Known:
    """A difference understood but not (yet) documented: still a failure."""

    name: str
    cls: str  # "bug" (ipvsproxy is wrong), "missing" (kube-proxy does it, ipvsproxy does not),
    #           "pending README" (deliberate, the README does not say so yet)
    matches: Callable[[Difference, Context], bool]


# Empty now: the differential suite's first runs found five (node hints, the zone "" on a node
# without a zone label, an LB IP that is also an externalIP: fixed; leading zeros and
# IPv4-mapped spellings: documented). A new finding goes here until it is fixed or documented.
KNOWN: tuple[Known, ...] = ()


def classify(d: Difference, c: Context) -> str:
    for dev in DEVIATIONS:
        if dev.matches(d, c):
            return f"{DOCUMENTED}{dev.name}"
    for k in KNOWN:
        if k.matches(d, c):
            return f"{UNEXPLAINED} ({k.cls}): {k.name}"
    return f"{UNEXPLAINED}: {d.kind}"


def classify_all(diffs: Mapping[str, list[Difference]], c: Context,
                 ) -> list[tuple[Difference, str]]:
    """Every difference with its class. An iptables rule kube-proxy has and ipvsproxy has not,
    because it only exists while its set has members (rules.py writes it for a non-empty set,
    as kube-proxy does), takes the class of that set's missing members when they all have one
    class, or when each has a documented one (their names joined; seed 805742 found a
    KUBE-LOAD-BALANCER-LOCAL whose members were refused for two documented reasons): it is a
    consequence, not a difference of its own."""
    out = [(d, classify(d, c)) for items in diffs.values() for d in items]
    by_set: dict[str, set[str]] = {}
    for d, cls in out:
        if d.kind == "ipset member" and d.candidate is None:
            by_set.setdefault(d.key.partition(" ")[0], set()).add(cls)
    fixed = []
    for d, cls in out:
        m = re.search(r"--match-set (\S+) ", d.key)
        classes = sorted(by_set.get(m.group(1), ())) if m else []
        if d.kind == "iptables rule" and d.candidate is None and cls.startswith(
                f"{UNEXPLAINED}: ") and classes and (
                    len(classes) == 1 or all(k.startswith(DOCUMENTED) for k in classes)):
            if len(classes) > 1:
                classes = [DOCUMENTED + " and ".join(k.removeprefix(DOCUMENTED) for k in classes)]
            cls = f"{classes[0]} (its set's members)"
        fixed.append((d, cls))
    return fixed


def normalized(text: str) -> str:
    return " ".join(text.split())


def readme_says(sentence: str, readme: str | None = None) -> bool:
    text = normalized(readme if readme is not None else README.read_text())
    return normalized(sentence) in text


def counts(classes: Iterable[str]) -> Mapping[str, int]:
    out: dict[str, int] = {}
    for c in classes:
        out[c] = out.get(c, 0) + 1
    return out


def main(argv: list[str] | None = None) -> int:
    """Re-classify a saved run (run.py's cluster-N.json / changes-N.json) on the host."""
    import json
    import sys

    from tests.differential import snapshot

    for path in argv if argv is not None else sys.argv[1:]:
        data = json.loads(Path(path).read_text())
        ctx = Context.from_objects(data["objects"])
        ctx.kube_proxy_no_zone = frozenset(data.get("kube_proxy_no_zone", ()))
        snaps = {k: snapshot.from_plain(v) for k, v in data["snapshots"].items()}
        for name, snap in snaps.items():
            if name == "kube-proxy":
                continue
            diffs = snapshot.compare(snaps["kube-proxy"], snap)
            print(f"{path} {name}:")
            for d, cls in classify_all(diffs, ctx):
                print(f"  {cls}: {d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
