"""The desired dataplane of this node, computed from a cluster snapshot: pure, no I/O.

`compute_desired(snapshot, host, config)` gives every virtual server with its real servers, the
kube-ipvs0 addresses, the members of every ipset, the iptables rules, the sysctls and IPVS
timeouts. Semantics are kube-proxy's IPVS mode (shared/reference/kube-proxy-ipvs.md §1, §4),
with the deliberate differences the README lists (per-service schedulers and weights, the drop
of outside traffic to externalTrafficPolicy=Local services without local endpoints).
`frontends()` is the one place that says which virtual servers a service port has.

Who gets an address:port:protocol that several Services claim is decided by authority, never by
names: claims are ranked by who may write them (RANK): a ClusterIP or NodePort (allocated and
made unique by the API server), then a LoadBalancer status IP (written by the load balancer's
controller; tenants cannot write status), then an externalIP (any editor of the Service); between
claims of one rank the older Service (creationTimestamp, then UID) wins. Before that, `screen()`
drops the tenant-written addresses that may not be claimed at all (inside the cluster's service
ranges or its pod network, the node's own addresses and the node network unless the operator
allows them) and refuses a Service that would expand into more kernel objects than
--max-objects-per-service. (README, "Deliberate differences" and "Security".)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from itertools import chain
from operator import itemgetter
from typing import Any

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
from ipvsproxy.core.screen import Screen, screen
from ipvsproxy.settings.config import Config

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network
KUBE_IPVS0 = "kube-ipvs0"
PROTO = {"TCP": Protocol.TCP, "UDP": Protocol.UDP, "SCTP": Protocol.SCTP}


@dataclass(frozen=True, slots=True)
class HostFacts:
    """What the shell observed about the host that the desired state depends on."""

    addresses: tuple[tuple[str, IPAddress], ...] = ()  # (interface, address), every interface
    kernel: tuple[int, int] = (6, 1)
    # the IPVS schedulers this kernel has (built in or as a module); None: unknown (no module
    # index to read), every name of model.KERNEL_SCHEDULERS is tried
    schedulers: frozenset[str] | None = None


# Who may write a claim, most trusted first: the API server allocates ClusterIPs and NodePorts
# and keeps them unique; a load balancer's controller writes status.loadBalancer.ingress (status:
# no tenant can); any editor of a Service writes spec.externalIPs. spec.loadBalancerIP is only a
# request to that controller and is never programmed by itself (kube-proxy does not either).
RANK = {"cluster-ip": 0, "node-port": 0, "load-balancer": 1, "external-ip": 2}


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
    # the virtual servers it claimed and another Service won: a change to either of the two
    # may move the claim, so an incremental sync recomputes both (core/incremental.py)
    lost: tuple[ServiceKey, ...] = ()


class _IndexAcc:
    __slots__ = ("addresses", "entries", "keys", "lost", "no_local", "out_filter")

    def __init__(self) -> None:
        self.keys: list[ServiceKey] = []
        self.entries: list[tuple[str, str]] = []
        self.addresses: list[IPAddress] = []
        self.out_filter: list[tuple[int, IPAddress, str, int]] = []
        self.no_local: list[tuple[str, int]] = []
        self.lost: list[ServiceKey] = []

    def freeze(self) -> ServiceIndex:
        return ServiceIndex(tuple(self.keys), tuple(dict.fromkeys(self.entries)),
                            tuple(dict.fromkeys(self.addresses)),
                            tuple(self.out_filter), tuple(dict.fromkeys(self.no_local)),
                            tuple(dict.fromkeys(self.lost)) if self.lost else ())


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
    NodePort's, and an externalIP the operator lets a node's address be (Service.unbound_ips,
    which kube-proxy too programs without binding), is bound to kube-ipvs0."""
    for cip in svc.cluster_ips:
        if cip.version == family:
            yield Frontend("cluster-ip", cip, sp.port, True, svc.internal_local)
    for eip in svc.external_ips:
        if eip.version == family:
            yield Frontend("external-ip", eip, sp.port, eip not in svc.unbound_ips,
                           svc.external_local)
    for lb in svc.lb_ingress_ips:
        if lb.version == family:
            yield Frontend("load-balancer", lb, sp.port, True, svc.external_local)
    if sp.node_port:
        for nip in nodeips:
            yield Frontend("node-port", nip, sp.node_port, False, svc.external_local)


class _Port:
    """One service port as the builder keeps it between its passes (see _Builder)."""

    __slots__ = ("acc", "cat", "eps", "flags", "flat", "owner", "proto", "ranges", "sched", "sp",
                 "svc")

    def __init__(self, svc: Service, sp: ServicePort, cat: Categorized, sched: str, flags: int,
                 ranges: list[IPNetwork], owner: str, acc: _IndexAcc) -> None:
        self.svc, self.sp, self.cat, self.sched, self.flags = svc, sp, cat, sched, flags
        self.ranges, self.owner, self.acc = ranges, owner, acc
        self.proto = sp.protocol.value.lower()
        # the last endpoint list a frontend of this port used, flattened (_flat): a port's
        # frontends mostly share one list, and then one tuple of real servers (memory)
        self.eps: Sequence[Ep] | None = None
        self.flat: Flat = ()


class _Builder:
    """Accumulates one family's desired state while the services are walked.

    Claims are settled by the order frontends are added, first come first served: every
    service's ClusterIPs and NodePorts (add_port), then every LoadBalancer IP, then every
    externalIP (add_deferred), each pass over the services oldest first (RANK, `age`)."""

    def __init__(self, family: int, cfg: Config, nodeips: list[IPAddress],
                 primary: list[IPAddress], zone: str) -> None:
        self.family = family
        self.cfg = cfg
        self.zone = zone
        self.primary = primary[0] if primary else None
        self.nodeips = nodeips
        self.sets: dict[str, set[str]] = {d.name: set() for d in (*T.IPSETS, *T.OWN_IPSETS)}
        self.services: dict[ServiceKey, VirtualServer] = {}
        self.flats: dict[ServiceKey, Flat] = {}  # each frontend's; see Flat
        self.owners: dict[ServiceKey, str] = {}
        self.bound: set[IPAddress] = set()
        self.out_filter: list[tuple[IPAddress, str, int]] = []
        self.problems: list[Problem] = []
        # key -> ("ns/name" of the service that won it, the kind of its claim)
        self.claims: dict[ServiceKey, tuple[str, str]] = {}
        self.acc = _IndexAcc()

    def _add(self, name: str, entry: str) -> None:
        self.sets[name].add(entry)
        self.acc.entries.append((T.family_name(name, self.family), entry))

    def add_port(self, svc: Service, sp: ServicePort, cat: Categorized,
                 eps_local: Sequence[tuple[IPAddress, int]]) -> _Port | None:
        """The port's own entries and its ClusterIP and NodePort frontends; the port again when
        it has LoadBalancer or external IPs of this family, for add_deferred."""
        add = self._add
        if cat.has_any and not cat.local:
            if svc.internal_local:
                self.acc.no_local.append(("internal", self.family))
            if svc.external_local:
                self.acc.no_local.append(("external", self.family))
        proto = sp.protocol.value.lower()
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
        p = _Port(svc, sp, cat, sched, flags, ranges, owner, self.acc)
        deferred = False
        for fe in frontends(svc, sp, self.family, self.nodeips):
            if RANK[fe.kind]:
                deferred = True
            else:
                self._frontend(p, fe)
        # kube-proxy skips the health-check port too when no node IP serves NodePorts (quirk)
        if svc.health_check_node_port and (self.nodeips or not sp.node_port):
            add(T.HEALTH_CHECK_NODE_PORT, port_entry(svc.health_check_node_port))
        return p if deferred else None

    def add_deferred(self, ports: Sequence[_Port], kind: str) -> None:
        """The frontends of one later rank ("load-balancer", "external-ip") of these ports."""
        for p in ports:
            self.acc = p.acc
            for fe in frontends(p.svc, p.sp, self.family, self.nodeips):
                if fe.kind == kind:
                    self._frontend(p, fe)

    def _frontend(self, p: _Port, fe: Frontend) -> None:
        svc, proto, add = p.svc, p.proto, self._add
        key = ServiceKey.inet(PROTO[p.sp.protocol.value], fe.addr, fe.port)
        claim = self.claims.get(key)
        if claim is not None and (claim[0] != svc.key or RANK[fe.kind] == 0):
            # Taken by a claim of higher rank, or of the same rank by an older Service (or
            # a second claim of one Service's ClusterIP or NodePort: a duplicate port)
            holder, held_as = claim
            if holder != svc.key:
                self.acc.lost.append(key)
            what = "the ClusterIP of" if held_as == "cluster-ip" else \
                "the LoadBalancer IP of" if held_as != fe.kind and held_as == "load-balancer" \
                else "already used by"
            self.problems.append(Problem("Service", svc.namespace, svc.name,
                                         f"{fe.kind} {key} is {what} {self.owners[key]}; "
                                         "ignored"))
            return
        cat = p.cat
        entry = ip_port_entry(fe.addr, proto, fe.port)
        eps = cat.cluster
        if fe.local_policy and cat.local:
            eps = cat.local
        elif fe.local_policy and fe.external and cat.cluster:
            # Deliberate difference: outside clients are dropped (as kube-proxy's iptables
            # mode does); the node and its pods still reach the cluster endpoints.
            add(T.EXT_NO_LOCAL, entry)
        if claim is None:
            # An address that is this Service's externalIP and LB ingress IP is one virtual
            # server with both roles: the sets and firewall of each (as kube-proxy has it)
            self.services[key] = VirtualServer(
                key, p.sched, p.flags, svc.affinity_timeout,
                -1 if not svc.affinity_timeout else (0xFFFFFFFF if self.family == 4 else 128))
            self.owners[key] = p.owner
            self.claims[key] = (svc.key, fe.kind)
            self.acc.keys.append(key)
            if eps is not p.eps:
                p.eps, p.flat = eps, _flat(eps)
            self.flats[key] = p.flat
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
            if p.ranges:
                add(T.LOAD_BALANCER_FW, entry)
                for r in p.ranges:
                    add(T.LB_SOURCE_CIDR, ip_port_net_entry(fe.addr, proto, fe.port, r))
                if self.primary is not None and any(self.primary in r for r in p.ranges):
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


# RealServer's fields after `weight`, at their defaults (the tail _real_servers appends)
_RS_DEFAULTS = RealServer(DestKey(IPv4Address(0), 0))[3:]


# A port's real servers while the services are walked: (address, port, weight) of each, one
# flat tuple. The RealServer values (two tuples an endpoint, ~90 MB at 50,000 services x 10)
# are made last, after the index is frozen (_real_servers): made among what outlives the sync
# (virtual servers, set entries, the index), their memory could not go back when they were
# freed (pymalloc returns an arena only when it is empty). Made last, they fill arenas of
# their own, freed whole: at 50,000 services 467 -> 391 MB resident after the settle (host).
Flat = tuple[Any, ...]
_ADDR_PORT_WEIGHT = itemgetter(0, 1, 2)


def _flat(eps: Sequence[Ep]) -> Flat:
    # in (address, port) order, as DestKey orders them: port_endpoints gives them so, and
    # categorize keeps the order
    return tuple(chain.from_iterable(map(_ADDR_PORT_WEIGHT, eps)))


def _real_servers(flats: dict[ServiceKey, Flat]) -> dict[ServiceKey, tuple[RealServer, ...]]:
    """Each frontend's real servers, one tuple for the frontends that share a flat tuple.
    tuple.__new__ builds each NamedTuple from all its fields without the Python frame of its
    generated __new__ (as its own _make does): a million values at 50,000 services, 7% of
    compute_desired's instructions. (`+ tail` joins two tuples in C; `*tail` in the display
    goes through a list, ~1% of all instructions more.)"""
    masq, tail, new = Fwd.MASQ, _RS_DEFAULTS, tuple.__new__
    made: dict[int, tuple[RealServer, ...]] = {}  # by id: `flats` keeps every flat alive
    out: dict[ServiceKey, tuple[RealServer, ...]] = {}
    for key, flat in flats.items():
        rs = made.get(id(flat))
        if rs is None:
            it = iter(flat)
            rs = made[id(flat)] = tuple([
                new(RealServer, (new(DestKey, (a, port)), masq, w) + tail)  # noqa: RUF005
                for a, port, w in zip(it, it, it, strict=True)])
        out[key] = rs
    return out


def compute_desired(snap: Snapshot, host: HostFacts, cfg: Config) -> Desired:
    with paused():
        return _compute_desired(snap, host, cfg)


def screen_of(snap: Snapshot, host: HostFacts, cfg: Config,
              nodeips: Mapping[int, Sequence[IPAddress]]) -> Screen:
    """What this node lets a Service claim (core/screen.py), from its own facts and settings."""
    node = snap.node
    own = {a: i for i, a in host.addresses if i != KUBE_IPVS0}
    own.update((a, "its Node") for a in (node.addresses if node else ()) if a not in own)
    pods = [(n, "the pod network (--cluster-cidr)") for n in cfg.cluster_cidrs]
    pods += [(n, "this node's podCIDR") for n in (node.pod_cidrs if node else ())]
    return Screen(own, tuple(dict.fromkeys((*cfg.service_cidrs, *snap.service_cidrs))),
                  tuple(pods), cfg.node_network_cidrs, cfg.external_ip_cidrs,
                  host.schedulers, cfg.max_objects_per_service, cfg.families,
                  {f: len(v) for f, v in nodeips.items()})


def _compute_desired(snap: Snapshot, host: HostFacts, cfg: Config) -> Desired:
    node = snap.node
    zone = node.zone if node else ""
    by_svc = snap.slices_by_service()
    services: dict[ServiceKey, VirtualServer] = {}
    flats: dict[ServiceKey, Flat] = {}
    owners: dict[ServiceKey, str] = {}
    bound: set[IPAddress] = set()
    sets: dict[str, frozenset[str]] = {}
    specs: list[SetSpec] = []
    rules: dict[int, Rules] = {}
    problems = list(snap.problems)
    accs: dict[tuple[str, str], _IndexAcc] = {}
    primaries = {f: [a for a in (node.addresses if node else ()) if a.version == f]
                 for f in cfg.families}
    nodeips = {f: node_ips(host, cfg, primaries[f], f) for f in cfg.families}
    sc = screen_of(snap, host, cfg, nodeips)
    ordered = []
    # most Services claim no tenant-written address, name no scheduler and are far below the
    # budget whatever their addresses' families: nothing to screen (a call less per Service)
    per_port = 2 + sum(sc.nodeips.values()) if sc.nodeips else 2
    plain = sc.max_objects // per_port if sc.max_objects else 1 << 62
    for svc in sorted(snap.services, key=age):
        if svc.external_ips or svc.lb_ingress_ips or svc.scheduler or len(svc.ports) > plain:
            kept, refused = screen(svc, sc)
            problems.extend(refused)
            if kept is None:
                continue
            svc = kept
        ordered.append(svc)
    for family in cfg.families:
        b = _Builder(family, cfg, nodeips[family], primaries[family], zone)
        later: list[_Port] = []
        for svc in ordered:
            b.acc = accs.setdefault(svc.sid, _IndexAcc())
            if not any(c.version == family for c in svc.cluster_ips):
                continue
            slices = by_svc.get(svc.sid, [])
            for sp in svc.ports:
                eps = port_endpoints(slices, sp, family, cfg.hostname)
                cat = categorize(eps, svc, sp, zone, family, cfg.hostname)
                local = [(e.addr, e.port) for e in eps if e.local and e.usable]
                if (p := b.add_port(svc, sp, cat, local)) is not None:
                    later.append(p)
        b.add_deferred(later, "load-balancer")
        b.add_deferred(later, "external-ip")
        fam_sets, fam_rules = b.finish()
        services.update(b.services)
        flats.update(b.flats)
        owners.update(b.owners)
        bound |= b.bound
        sets.update(fam_sets)
        specs.extend(set_specs(family, fam_sets))
        rules[family] = fam_rules
        problems.extend(b.problems)
    timeouts = None
    if cfg.tcp_timeout or cfg.tcpfin_timeout or cfg.udp_timeout:
        timeouts = Timeouts(cfg.tcp_timeout, cfg.tcpfin_timeout, cfg.udp_timeout)
    index = {k: a.freeze() for k, a in accs.items()}
    del accs
    return Desired(cfg.families, services, _real_servers(flats), owners, frozenset(bound),
                   tuple(specs), sets, rules, sysctls(cfg, host), timeouts, tuple(problems),
                   index)  # the real servers last: see Flat
