"""The desired dataplane of this node, computed from a cluster snapshot: pure, no I/O.

`compute_desired(snapshot, host, config)` gives every virtual server with its real servers, the
kube-ipvs0 addresses, the members of every ipset, the iptables rules, the sysctls and IPVS
timeouts. Semantics are kube-proxy's IPVS mode (shared/reference/kube-proxy-ipvs.md §1, §4),
with the deliberate differences the README lists (per-service schedulers and weights, the drop
of outside traffic to externalTrafficPolicy=Local services without local endpoints).
`frontends()` is the one place that says which virtual servers a service port has.

Who gets an address:port:protocol that several Services claim is decided by authority, never by
names: a ClusterIP (allocated and made unique by the API server) beats any externalIP or
LoadBalancer IP, and between claims of one rank the older Service (creationTimestamp, then UID)
wins. Before that, `screened()` drops the tenant-written addresses that may not be claimed at
all: those inside the cluster's service ranges or equal to one of the node's own addresses, and
externalIPs outside --external-ip-cidrs when it is set. (README, "Deliberate differences".)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from ipvsproxy.config import Config
from ipvsproxy.core import tables as T
from ipvsproxy.core.cluster import Snapshot
from ipvsproxy.core.endpoints import Categorized, Ep, categorize, port_endpoints
from ipvsproxy.core.gcpause import paused
from ipvsproxy.core.ipset_text import (
    Family,
    SetSpec,
    SetType,
    capacity,
    ip_entry,
    ip_port_entry,
    ip_port_ip_entry,
    ip_port_net_entry,
    port_entry,
)
from ipvsproxy.core.ipvs import (
    SVC_F_PERSISTENT,
    SVC_F_SCHED2,
    DestKey,
    Fwd,
    Protocol,
    RealServer,
    ServiceKey,
    Timeouts,
    VirtualServer,
)
from ipvsproxy.core.model import Problem, Service, ServicePort
from ipvsproxy.core.rules import RuleInputs, Rules, render_rules

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network
KUBE_IPVS0 = "kube-ipvs0"
PROTO = {"TCP": Protocol.TCP, "UDP": Protocol.UDP, "SCTP": Protocol.SCTP}


@dataclass(frozen=True, slots=True)
class HostFacts:
    """What the shell observed about the host that the desired state depends on."""

    addresses: tuple[tuple[str, IPAddress], ...] = ()  # (interface, address), every interface
    kernel: tuple[int, int] = (6, 1)


@dataclass(frozen=True, slots=True)
class Frontend:
    """One virtual server of a service port."""

    kind: str  # "cluster-ip", "external-ip", "load-balancer", "node-port"
    addr: IPAddress
    port: int
    bind: bool  # bound to kube-ipvs0
    local_policy: bool  # uses node-local endpoints (traffic policy Local)

    @property
    def external(self) -> bool:
        return self.kind != "cluster-ip"


@dataclass(frozen=True, slots=True)
class Desired:
    families: tuple[int, ...]
    services: Mapping[ServiceKey, VirtualServer] = field(default_factory=dict)
    dests: Mapping[ServiceKey, tuple[RealServer, ...]] = field(default_factory=dict)
    owners: Mapping[ServiceKey, str] = field(default_factory=dict)  # "ns/name:port"
    addresses: frozenset[IPAddress] = frozenset()
    specs: tuple[SetSpec, ...] = ()
    sets: Mapping[str, frozenset[str]] = field(default_factory=dict)
    rules: Mapping[int, Rules] = field(default_factory=dict)
    sysctls: tuple[tuple[str, str], ...] = ()
    timeouts: Timeouts | None = None
    problems: tuple[Problem, ...] = ()
    # What each Service contributed, for the daemon's incremental syncs (core/incremental.py)
    index: Mapping[tuple[str, str], ServiceIndex] = field(default_factory=dict)
    contested: frozenset[ServiceKey] = frozenset()  # claimed by two services (one won)


@dataclass(frozen=True, slots=True)
class ServiceIndex:
    """One Service's part of the desired state (both families): the virtual servers it won,
    its set members (family-prefixed set name, entry), its bound addresses, its LB out-filter
    rule inputs. Entries and addresses may be shared with other services."""

    keys: tuple[ServiceKey, ...] = ()
    entries: tuple[tuple[str, str], ...] = ()
    addresses: tuple[IPAddress, ...] = ()
    out_filter: tuple[tuple[int, IPAddress, str, int], ...] = ()  # (family, LB ip, proto, port)
    # ("internal" | "external", family) when a Local policy finds endpoints, none of them on
    # this node (kube-proxy's sync_proxy_rules_no_local_endpoints_total counts such services)
    no_local: tuple[tuple[str, int], ...] = ()


class _IndexAcc:
    __slots__ = ("addresses", "entries", "keys", "no_local", "out_filter")

    def __init__(self) -> None:
        self.keys: list[ServiceKey] = []
        self.entries: list[tuple[str, str]] = []
        self.addresses: list[IPAddress] = []
        self.out_filter: list[tuple[int, IPAddress, str, int]] = []
        self.no_local: list[tuple[str, int]] = []

    def freeze(self) -> ServiceIndex:
        return ServiceIndex(tuple(self.keys), tuple(dict.fromkeys(self.entries)),
                            tuple(dict.fromkeys(self.addresses)),
                            tuple(self.out_filter), tuple(dict.fromkeys(self.no_local)))


def family_rules(family: int, cfg: Config, nonempty: frozenset[str],
                 out_filter: Sequence[tuple[IPAddress, str, int]]) -> Rules:
    """The iptables rules of one family, from which sets have members (unprefixed names) and
    the LB out-filter inputs (sorted here, so that any order of services renders the same)."""
    return render_rules(RuleInputs(
        family=family, nonempty=nonempty, cluster_cidrs=cfg.cluster_cidrs_of(family),
        masquerade_all=cfg.masquerade_all, mark=cfg.masq_mark, random_fully=cfg.random_fully,
        out_filter=tuple(sorted(set(out_filter), key=lambda f: (int(f[0]), f[1], f[2])))))


def set_specs(family: int, sets: Mapping[str, frozenset[str]] | None = None) -> list[SetSpec]:
    """The sets of one family, each sized (maxelem) for the members `sets` gives it."""
    fam = Family.INET if family == 4 else Family.INET6
    sizes = {n: len(m) for n, m in (sets or {}).items()}
    return [SetSpec(d.name_for(family), SetType(d.type), fam,
                    maxelem=capacity(sizes.get(d.name_for(family), 0)))
            for d in T.ALL_IPSETS]


def node_ips(host: HostFacts, cfg: Config, primary: Sequence[IPAddress],
             family: int) -> list[IPAddress]:
    """The addresses NodePorts are served on (kube-proxy §1.2): every address of the family
    except kube-ipvs0's, loopback and IPv6 link-local, or those in --nodeport-addresses."""
    cidrs = [n for n in cfg.nodeport_addresses if n.version == family]
    if cfg.nodeport_primary:
        cidrs = [IPv4Network(a) if a.version == 4 else IPv6Network(a)
                 for a in primary[:1]]
        if not cidrs:
            return []
    match_all = not cidrs or any(n.prefixlen == 0 for n in cidrs)
    out: list[IPAddress] = []
    for ifname, a in host.addresses:
        if a.version != family or a.is_loopback or ifname == KUBE_IPVS0:
            continue
        if a.version == 6 and a.is_link_local:
            continue
        if (match_all or any(a in n for n in cidrs)) and a not in out:
            out.append(a)
    return out


def frontends(svc: Service, sp: ServicePort, family: int, nodeips: Sequence[IPAddress],
              ) -> Iterator[Frontend]:
    """Every virtual server of one service port, in kube-proxy's order. Every address but a
    NodePort's is bound to kube-ipvs0: `screened` took out the node's own addresses (which
    kube-proxy programs without binding them)."""
    for cip in svc.cluster_ips:
        if cip.version == family:
            yield Frontend("cluster-ip", cip, sp.port, True, svc.internal_local)
    for eip in svc.external_ips:
        if eip.version == family:
            yield Frontend("external-ip", eip, sp.port, True, svc.external_local)
    for lb in svc.lb_ingress_ips:
        if lb.version == family:
            yield Frontend("load-balancer", lb, sp.port, True, svc.external_local)
    if sp.node_port:
        for nip in nodeips:
            yield Frontend("node-port", nip, sp.node_port, False, svc.external_local)


class _Builder:
    """Accumulates one family's desired state while the services are walked."""

    def __init__(self, family: int, cfg: Config, host: HostFacts, primary: list[IPAddress],
                 zone: str, cluster_keys: Mapping[tuple[str, IPAddress, int], str]) -> None:
        self.family = family
        self.cfg = cfg
        self.zone = zone
        self.primary = primary[0] if primary else None
        self.nodeips = node_ips(host, cfg, primary, family)
        self.sets: dict[str, set[str]] = {d.name: set() for d in (*T.IPSETS, *T.OWN_IPSETS)}
        self.services: dict[ServiceKey, VirtualServer] = {}
        self.dests: dict[ServiceKey, tuple[RealServer, ...]] = {}
        self.owners: dict[ServiceKey, str] = {}
        self.bound: set[IPAddress] = set()
        self.out_filter: list[tuple[IPAddress, str, int]] = []
        self.problems: list[Problem] = []
        self.claims: dict[ServiceKey, str] = {}  # key -> "ns/name" of the service that won it
        self.contested: set[ServiceKey] = set()
        # (protocol, ClusterIP, port) -> "ns/name:port" of the oldest Service holding it: no
        # externalIP or LoadBalancer IP of another Service may take one, whatever the order
        self.cluster_keys = cluster_keys
        self.acc = _IndexAcc()

    def _add(self, name: str, entry: str) -> None:
        self.sets[name].add(entry)
        self.acc.entries.append((T.family_name(name, self.family), entry))

    def add_port(self, svc: Service, sp: ServicePort, cat: Categorized,
                 eps_local: Sequence[tuple[IPAddress, int]]) -> None:
        proto = sp.protocol.value.lower()
        add = self._add
        if cat.has_any and not cat.local:
            if svc.internal_local:
                self.acc.no_local.append(("internal", self.family))
            if svc.external_local:
                self.acc.no_local.append(("external", self.family))
        for addr, port in eps_local:
            add(T.LOOP_BACK, ip_port_ip_entry(addr, proto, port, addr))
        sched = svc.scheduler or self.cfg.scheduler
        flags = svc.sched_flags
        if not flags and sched == "mh":
            flags = SVC_F_SCHED2  # kube-proxy sets mh-port (FlagSourceHash) for mh
        if svc.affinity_timeout:
            flags |= SVC_F_PERSISTENT
        ranges = [r for r in svc.lb_source_ranges if r.version == self.family]
        owner = f"{svc.namespace}/{svc.name}:{sp.name}" if sp.name else svc.key
        last_eps: tuple[Ep, ...] | None = None
        last_rs: tuple[RealServer, ...] = ()
        for fe in frontends(svc, sp, self.family, self.nodeips):
            key = ServiceKey.inet(PROTO[sp.protocol.value], fe.addr, fe.port)
            if fe.kind in ("external-ip", "load-balancer") and (held := self.cluster_keys.get(
                    (sp.protocol.value, fe.addr, fe.port))) is not None \
                    and not held.startswith(svc.key + ":") and held != svc.key:
                self.contested.add(key)
                self.problems.append(Problem(
                    "Service", svc.namespace, svc.name,
                    f"{fe.kind} {key} is the ClusterIP of {held}; ignored"))
                continue
            again = key in self.services
            if again and (self.claims[key] != svc.key or fe.kind in ("cluster-ip",
                                                                     "node-port")):
                if self.claims[key] != svc.key:
                    self.contested.add(key)
                self.problems.append(Problem(
                    "Service", svc.namespace, svc.name,
                    f"{fe.kind} {key} is already used by {self.owners[key]}; ignored"))
                continue
            entry = ip_port_entry(fe.addr, proto, fe.port)
            eps = cat.cluster
            if fe.local_policy and cat.local:
                eps = cat.local
            elif fe.local_policy and fe.external and cat.cluster:
                # Deliberate difference: outside clients are dropped (as kube-proxy's iptables
                # mode does); the node and its pods still reach the cluster endpoints.
                add(T.EXT_NO_LOCAL, entry)
            if not again:
                # An address that is this Service's externalIP and LB ingress IP is one virtual
                # server with both roles: the sets and firewall of each (as kube-proxy has it)
                self.services[key] = VirtualServer(
                    key, sched, flags, svc.affinity_timeout,
                    -1 if not svc.affinity_timeout else (0xFFFFFFFF if self.family == 4 else 128))
                self.owners[key] = owner
                self.claims[key] = svc.key
                self.acc.keys.append(key)
                if eps is not last_eps:  # a port's frontends mostly share one endpoint list
                    last_eps, last_rs = eps, _real_servers(eps)
                self.dests[key] = last_rs
            add(T.OWNED, entry)
            if fe.bind:
                self.bound.add(fe.addr)
                self.acc.addresses.append(fe.addr)
                add(T.IPVS_IPS, ip_entry(fe.addr))
            if fe.kind == "cluster-ip":
                add(T.CLUSTER_IP, entry)
            elif fe.kind == "external-ip":
                add(T.EXTERNAL_IP_LOCAL if svc.external_local else T.EXTERNAL_IP, entry)
            elif fe.kind == "load-balancer":
                add(T.LOAD_BALANCER, entry)
                if svc.external_local:
                    add(T.LOAD_BALANCER_LOCAL, entry)
                if ranges:
                    add(T.LOAD_BALANCER_FW, entry)
                    for r in ranges:
                        add(T.LB_SOURCE_CIDR, ip_port_net_entry(fe.addr, proto, fe.port, r))
                    if self.primary is not None and any(self.primary in r for r in ranges):
                        add(T.LB_SOURCE_IP, ip_port_ip_entry(fe.addr, proto, fe.port, fe.addr))
                    else:
                        self.out_filter.append((fe.addr, proto, fe.port))
                        self.acc.out_filter.append((self.family, fe.addr, proto, fe.port))
            elif fe.kind == "node-port":
                if proto == "sctp":
                    add(T.NODE_PORT_SCTP, entry)
                    if svc.external_local:
                        add(T.NODE_PORT_LOCAL_SCTP, entry)
                else:
                    name = T.NODE_PORT_TCP if proto == "tcp" else T.NODE_PORT_UDP
                    add(name, port_entry(fe.port))
                    if svc.external_local:
                        local = T.NODE_PORT_LOCAL_TCP if proto == "tcp" else T.NODE_PORT_LOCAL_UDP
                        add(local, port_entry(fe.port))
        # kube-proxy skips the health-check port too when no node IP serves NodePorts (quirk)
        if svc.health_check_node_port and (self.nodeips or not sp.node_port):
            add(T.HEALTH_CHECK_NODE_PORT, port_entry(svc.health_check_node_port))

    def finish(self) -> tuple[dict[str, frozenset[str]], Rules]:
        sets = {T.family_name(n, self.family): frozenset(m) for n, m in self.sets.items()}
        nonempty = frozenset(n for n, m in self.sets.items() if m)
        return sets, family_rules(self.family, self.cfg, nonempty, self.out_filter)


def sysctls(cfg: Config, host: HostFacts) -> tuple[tuple[str, str], ...]:
    out = list(T.SYSCTLS)
    if (4, 1) <= host.kernel < (5, 9):
        out.append(("net/ipv4/vs/conn_reuse_mode", "0"))  # kube-proxy issue #93297
    if cfg.strict_arp:
        out.extend(T.STRICT_ARP_SYSCTLS)
    return tuple(out)


def age(svc: Service) -> tuple[str, str, str, str]:
    """The order claims of one rank are settled in: oldest first (a Service without a
    creationTimestamp counts as the youngest), then UID, then the name for a total order."""
    return (svc.created or "\uffff", svc.uid, svc.namespace, svc.name)


def screened(svc: Service, own: Mapping[IPAddress, str], ranges: Sequence[IPNetwork],
             allowed: Sequence[IPNetwork]) -> tuple[Service, list[Problem]]:
    """`svc` without the externalIPs and LoadBalancer IPs a tenant may not claim: inside a
    service range (a ClusterIP's, whoever holds it: CVE-2020-8554), one of this node's own
    addresses (`own`: address -> where it is), or, for externalIPs, outside `allowed` when
    that is given. Each refusal is a Problem naming the Service."""
    if not svc.external_ips and not svc.lb_ingress_ips:
        return svc, []
    problems: list[Problem] = []

    def keep(what: str, addrs: tuple[IPAddress, ...], allow: Sequence[IPNetwork]
             ) -> tuple[IPAddress, ...]:
        out = []
        for a in addrs:
            why = ""
            if (r := next((r for r in ranges if a in r), None)) is not None:
                why = f"inside the service range {r}"
            elif a in own:
                why = f"an address of this node ({own[a]})"
            elif allow and not any(a in n for n in allow):
                why = "outside --external-ip-cidrs"
            if why:
                problems.append(Problem("Service", svc.namespace, svc.name,
                                        f"{what} {a} is {why}; ignored"))
            else:
                out.append(a)
        return addrs if len(out) == len(addrs) else tuple(out)

    ext = keep("externalIP", svc.external_ips, allowed)
    lb = keep("loadBalancer ingress IP", svc.lb_ingress_ips, ())
    if not problems:
        return svc, []
    return replace(svc, external_ips=ext, lb_ingress_ips=lb), problems


# RealServer's fields after `weight`, at their defaults (the tail _real_servers appends)
_RS_DEFAULTS = RealServer(DestKey(IPv4Address(0), 0))[3:]


def _real_servers(eps: Sequence[Ep]) -> tuple[RealServer, ...]:
    # in (address, port) order, as DestKey orders them: port_endpoints gives them so, and
    # categorize keeps the order. tuple.__new__ builds each NamedTuple from all its fields
    # without the Python frame of its generated __new__ (as its own _make does): a million
    # values at 50,000 services, 7% of compute_desired's instructions. (`+ tail` joins two
    # tuples in C; `*tail` in the display goes through a list, ~1% of all instructions more.)
    masq, tail, new = Fwd.MASQ, _RS_DEFAULTS, tuple.__new__
    return tuple([new(RealServer, (new(DestKey, (e.addr, e.port)), masq, e.weight) + tail)  # noqa: RUF005
                  for e in eps])


def compute_desired(snap: Snapshot, host: HostFacts, cfg: Config) -> Desired:
    with paused():
        return _compute_desired(snap, host, cfg)


def _compute_desired(snap: Snapshot, host: HostFacts, cfg: Config) -> Desired:
    node = snap.node
    zone = node.zone if node else ""
    by_svc = snap.slices_by_service()
    services: dict[ServiceKey, VirtualServer] = {}
    dests: dict[ServiceKey, tuple[RealServer, ...]] = {}
    owners: dict[ServiceKey, str] = {}
    bound: set[IPAddress] = set()
    sets: dict[str, frozenset[str]] = {}
    specs: list[SetSpec] = []
    rules: dict[int, Rules] = {}
    problems = list(snap.problems)
    accs: dict[tuple[str, str], _IndexAcc] = {}
    contested: set[ServiceKey] = set()
    own = {a: i for i, a in host.addresses if i != KUBE_IPVS0}
    own.update((a, "its Node") for a in (node.addresses if node else ()) if a not in own)
    ranges = tuple(dict.fromkeys((*cfg.service_cidrs, *snap.service_cidrs)))
    ordered = []
    for svc in sorted(snap.services, key=age):
        svc, refused = screened(svc, own, ranges, cfg.external_ip_cidrs)
        problems.extend(refused)
        ordered.append(svc)
    for family in cfg.families:
        primary = [a for a in (node.addresses if node else ()) if a.version == family]
        cluster_keys: dict[tuple[str, IPAddress, int], str] = {}
        for svc in ordered:
            for cip in svc.cluster_ips:
                if cip.version == family:
                    for sp in svc.ports:
                        cluster_keys.setdefault((sp.protocol.value, cip, sp.port),
                                                f"{svc.key}:{sp.name}" if sp.name else svc.key)
        b = _Builder(family, cfg, host, primary, zone, cluster_keys)
        for svc in ordered:
            b.acc = accs.setdefault(svc.sid, _IndexAcc())
            if not any(c.version == family for c in svc.cluster_ips):
                continue
            slices = by_svc.get(svc.sid, [])
            for sp in svc.ports:
                eps = port_endpoints(slices, sp, family, cfg.hostname)
                cat = categorize(eps, svc, sp, zone, family, cfg.hostname)
                local = [(e.addr, e.port) for e in eps if e.local and e.usable]
                b.add_port(svc, sp, cat, local)
        fam_sets, fam_rules = b.finish()
        contested |= b.contested
        services.update(b.services)
        dests.update(b.dests)
        owners.update(b.owners)
        bound |= b.bound
        sets.update(fam_sets)
        specs.extend(set_specs(family, fam_sets))
        rules[family] = fam_rules
        problems.extend(b.problems)
    timeouts = None
    if cfg.tcp_timeout or cfg.tcpfin_timeout or cfg.udp_timeout:
        timeouts = Timeouts(cfg.tcp_timeout, cfg.tcpfin_timeout, cfg.udp_timeout)
    return Desired(cfg.families, services, dests, owners, frozenset(bound), tuple(specs),
                   sets, rules, sysctls(cfg, host), timeouts, tuple(problems),
                   {k: a.freeze() for k, a in accs.items()}, frozenset(contested))
