"""Diff: what the kernel holds against what it should hold, as an ordered plan. Pure.

`diff(desired, observed, exclude)` returns the steps that make the kernel match, touching only
what ipvsproxy owns: virtual servers recorded in its IPVSPROXY-OWNED-VS set, addresses on
kube-ipvs0 recorded in KUBE-IPVS-IPS, its own (kube-proxy's) sets and chains. Order is safe:
sysctls, the link, sets, rules (masquerade and filters before any address is bound: upstream
issue #133773), set members to add, unbinds, IPVS changes, binds, set members to remove, timeouts.
The members, IPVS changes and binds of tables.FIRST_SERVICES (the API server, cluster DNS) come
before all other members, in the same order, so a cold start makes them work first.
Each step renders itself as the command an operator would type, for `sync --dry-run`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address

from ipvsproxy.core import tables as T
from ipvsproxy.core.desired import KUBE_IPVS0, Desired
from ipvsproxy.core.ipset_text import SetSpec, ip_port_entry, render_create, temp_name
from ipvsproxy.core.ipvs import (
    SVC_F_HASHED,
    DestKey,
    IpvsOp,
    ObservedService,
    OpKind,
    Protocol,
    RealServer,
    ServiceKey,
    Timeouts,
    VirtualServer,
)
from ipvsproxy.core.ipvs_cmdline import op_line
from ipvsproxy.core.model import Problem
from ipvsproxy.core.rules import TABLES, jump_line
from ipvsproxy.core.takeover import (
    Takeover,
    iptables_leftovers,
    kube_proxy_services,
    wanted_kube_proxy_services,
)

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network
Chains = Mapping[str, tuple[str, ...]]  # chain -> rule lines, as iptables-save prints them


@dataclass(frozen=True, slots=True)
class Observed:
    """What the kernel holds (read by the kernel layer; only the parts the diff needs)."""

    services: Mapping[ServiceKey, ObservedService] = field(default_factory=dict)
    sets: Mapping[str, frozenset[str]] = field(default_factory=dict)  # existing sets' members
    specs: Mapping[str, SetSpec] = field(default_factory=dict)
    link: bool = False
    addresses: frozenset[IPAddress] = frozenset()  # on kube-ipvs0
    chains: Mapping[tuple[int, str], Chains] = field(default_factory=dict)  # (family, table)
    sysctls: Mapping[str, str] = field(default_factory=dict)
    timeouts: Timeouts | None = None
    # kube-proxy's nftables tables found ("ip kube-proxy"); looked for only in a takeover
    nft_tables: frozenset[str] = frozenset()


# ---------------------------------------------------------------------------------- steps


@dataclass(frozen=True, slots=True)
class Sysctl:
    key: str
    value: str

    def lines(self) -> list[str]:
        return [f"sysctl -w {self.key.replace('/', '.')}={self.value}"]


@dataclass(frozen=True, slots=True)
class CreateLink:
    def lines(self) -> list[str]:
        return [f"ip link add {KUBE_IPVS0} type dummy"]


@dataclass(frozen=True, slots=True)
class CreateSet:
    spec: SetSpec

    def lines(self) -> list[str]:
        return [f"ipset {render_create(self.spec)}"]


@dataclass(frozen=True, slots=True)
class SetMembers:
    spec: SetSpec
    add: bool
    entries: tuple[str, ...]

    def lines(self) -> list[str]:
        verb = "add" if self.add else "del"
        return [f"ipset {verb} {self.spec.name} {e}" for e in self.entries]


@dataclass(frozen=True, slots=True)
class ResizeSet:
    """A set too small (maxelem) for its members, replaced by one of `spec`'s size holding
    exactly `entries`: filled as a scratch set, then swapped in (`ipset swap`), so rules that
    match it never see it half-filled. The kernel cannot change a set's maxelem in place."""

    spec: SetSpec
    entries: tuple[str, ...]

    def lines(self) -> list[str]:
        tmp = temp_name(self.spec.name)
        return [f"ipset {render_create(self.spec.renamed(tmp))}",
                *(f"ipset add {tmp} {e}" for e in self.entries),
                f"ipset swap {tmp} {self.spec.name}", f"ipset destroy {tmp}"]


@dataclass(frozen=True, slots=True)
class Iptables:
    """One iptables-restore --noflush payload for one family: rewritten chains, missing jumps."""

    family: int
    payload: tuple[str, ...]
    commands: tuple[str, ...]

    def lines(self) -> list[str]:
        return list(self.commands)


@dataclass(frozen=True, slots=True)
class Ipvs:
    op: IpvsOp

    def lines(self) -> list[str]:
        return [op_line(self.op)]


@dataclass(frozen=True, slots=True)
class Address:
    addr: IPAddress
    add: bool

    def lines(self) -> list[str]:
        verb = "add" if self.add else "del"
        return [f"ip addr {verb} {self.addr}/{self.addr.max_prefixlen} dev {KUBE_IPVS0}"]


@dataclass(frozen=True, slots=True)
class SetTimeouts:
    timeouts: Timeouts

    def lines(self) -> list[str]:
        t = self.timeouts
        return [f"ipvsadm --set {t.tcp} {t.tcp_fin} {t.udp}"]


@dataclass(frozen=True, slots=True)
class DeleteNftTables:
    """kube-proxy's nftables tables, deleted in one nft transaction (a takeover's last step)."""

    tables: tuple[str, ...]

    def lines(self) -> list[str]:
        return [f"nft delete table {t}" for t in self.tables]


Step = (Sysctl | CreateLink | CreateSet | SetMembers | ResizeSet | Iptables | Ipvs | Address
        | SetTimeouts | DeleteNftTables)


def step_kind(step: Step) -> str:
    """A short name for what a step does, for metrics (ipvsproxy_operations_total{kind})."""
    if isinstance(step, Ipvs):
        return f"ipvs_{step.op.kind.name.lower()}"
    if isinstance(step, SetMembers):
        return "ipset_add" if step.add else "ipset_del"
    if isinstance(step, Address):
        return "address_add" if step.add else "address_del"
    return {Sysctl: "sysctl", CreateLink: "link_add", CreateSet: "ipset_create",
            ResizeSet: "ipset_resize", Iptables: "iptables_restore",
            SetTimeouts: "ipvs_set_timeouts", DeleteNftTables: "nft_delete"}[type(step)]


def one_service(kind: str) -> bool:
    """Whether a failed operation of this kind (step_kind) concerns one service's own objects (a
    virtual or real server, a bound address) rather than what every service shares (the sets,
    the rules, the link, sysctls). The kernel can refuse one tenant's object (kube-proxy logs
    such a failure and goes on); that must not fail the node's sync, its health or its
    incremental mode (README, "Security")."""
    return kind.startswith(("ipvs_add_", "ipvs_edit_", "ipvs_del_", "address_"))


def step_counts(steps: Sequence[Step]) -> dict[str, int]:
    """Operations per kind: each set member and address counts as one."""
    out: dict[str, int] = {}
    for s in steps:
        k = step_kind(s)
        out[k] = out.get(k, 0) + (len(s.entries) if isinstance(s, SetMembers) else 1)
    return out


@dataclass(frozen=True, slots=True)
class Plan:
    steps: tuple[Step, ...]
    problems: tuple[Problem, ...] = ()
    # real servers left in the kernel at weight 0 while their TCP connections end
    draining: tuple[tuple[ServiceKey, DestKey], ...] = ()
    # desired virtual servers someone else already holds in the kernel: left alone
    foreign: tuple[ServiceKey, ...] = ()
    # virtual servers kube-proxy programmed, taken over by this plan (--adopt-kube-proxy)
    adopted: tuple[ServiceKey, ...] = ()
    replaced_chains: int = 0  # kube-proxy's iptables-mode chains this plan deletes
    # the sets as the kernel holds them once the plan is applied (sizes differ from the desired
    # specs where an existing set is larger than needed): what later restore scripts must name;
    # derived, so not part of a plan's equality
    specs: tuple[SetSpec, ...] = field(default=(), compare=False)

    def lines(self) -> list[str]:
        return [line for s in self.steps for line in s.lines()]


# ----------------------------------------------------------------------------------- diff


def chains_after(rules: Mapping[int, Mapping[str, Chains]]) -> dict[tuple[int, str], Chains]:
    """The chains (ours and the jumps into them) once `rules` are applied: what the diff
    compares with when it trusts that the last plan was applied."""
    out: dict[tuple[int, str], dict[str, tuple[str, ...]]] = {
        (fam, table): dict(chains) for fam, tables in rules.items()
        for table, chains in tables.items()}
    for fam in rules:
        for j in T.JUMPS:
            table = out.setdefault((fam, j.table), {})
            table[j.chain] = (*table.get(j.chain, ()), jump_line(j))
    return dict(out)


def owned_entry(key: ServiceKey) -> str | None:
    if key.fwmark or key.addr is None or key.protocol is Protocol.NONE:
        return None
    return ip_port_entry(key.addr, key.protocol.name.lower(), key.port)


def _vs_equal(a: VirtualServer, b: VirtualServer) -> bool:
    return (a.scheduler == b.scheduler and a.flags & ~SVC_F_HASHED == b.flags & ~SVC_F_HASHED
            and a.timeout == b.timeout and a.effective_netmask == b.effective_netmask)


def _rs_equal(a: RealServer, b: RealServer) -> bool:
    return (a.fwd == b.fwd and a.weight == b.weight and a.u_threshold == b.u_threshold
            and a.l_threshold == b.l_threshold)


def _iptables(family: int, want: Mapping[str, Mapping[str, tuple[str, ...]]],
              have: Mapping[tuple[int, str], Chains], takeover: bool = False
              ) -> tuple[Iptables | None, int]:
    """The family's restore payload, and how many of kube-proxy's iptables-mode chains it
    deletes (a takeover: then it runs after everything else is in place)."""
    tool = "ip6tables" if family == 6 else "iptables"
    payload: list[str] = []
    cmds: list[str] = []
    replaces = 0
    for table, chains in TABLES.items():
        obs = have.get((family, table), {})
        body: list[str] = []
        decl: list[str] = []
        # kube-proxy's iptables mode, in a takeover: its jumps out of the built-in chains, and
        # its chains flushed (so none refers to another) and deleted, in the transaction that
        # writes ours (its CleanupLeftovers does the same); every chain of ours is written
        # then, so none still jumps to one of its
        gone, unlink = iptables_leftovers(table, obs) if takeover else ([], [])
        replaces += len(gone) or bool(unlink)
        for chain in chains:
            rules = want[table][chain]
            if obs.get(chain) == rules and not gone:
                continue
            decl.append(f":{chain} - [0:0]")
            # every chain exists before a rule jumps to it, as in the restore payload
            cmds.append(f"{tool} -t {table} {'-F' if chain in obs else '-N'} {chain}")
            body.extend(rules)
        cmds.extend(f"{tool} -t {table} {r}" for r in body)
        for j in T.JUMPS:
            if j.table != table:
                continue
            line = jump_line(j)
            if line not in obs.get(j.chain, ()):
                ins = "-I" + line[2:].replace(f" {j.chain} ", f" {j.chain} 1 ", 1)
                body.append(ins)
                cmds.append(f"{tool} -t {table} {ins}")
        decl += [f":{c} - [0:0]" for c in gone]
        body += unlink
        body += [f"-X {c}" for c in gone]
        cmds += [f"{tool} -t {table} {r}" for r in unlink]
        cmds += [f"{tool} -t {table} {flag} {c}" for flag in ("-F", "-X") for c in gone]
        if decl or body:
            payload += [f"*{table}", *decl, *body, "COMMIT"]
    if not payload:
        return None, 0
    return Iptables(family, tuple(payload), tuple(cmds)), replaces


def diff(des: Desired, obs: Observed, exclude: Sequence[IPNetwork] = (),
         force_delete: Collection[tuple[ServiceKey, DestKey]] = (),
         takeover: Takeover | None = None) -> Plan:
    """`force_delete`: draining real servers to delete even with connections left (the
    daemon's --ipvs-graceful-termination-period has passed for them). `takeover`: kube-proxy's
    state is ipvsproxy's to adopt (core/takeover.py)."""
    problems: list[Problem] = []
    draining: list[tuple[ServiceKey, DestKey]] = []
    early: list[Step] = [Sysctl(k, v) for k, v in des.sysctls if obs.sysctls.get(k) != v]
    if not obs.link:
        early.append(CreateLink())
    specs = {s.name: s for s in des.specs}
    for spec in des.specs:
        have = obs.specs.get(spec.name)
        if spec.name not in obs.sets:
            early.append(CreateSet(spec))
        elif have is not None and (have.type, have.family) != (spec.type, spec.family):
            problems.append(Problem("ipset", "", spec.name,
                                    f"exists as {have.type} {have.family or ''}, not "
                                    f"{spec.type}; run `ipvsproxy cleanup` to recreate it"))
    replacing: list[Step] = []  # kube-proxy's iptables-mode chains replaced: after the rest
    replaced = 0
    for fam in des.families:
        step, replaces = _iptables(fam, des.rules[fam], obs.chains, takeover is not None)
        replaced += replaces
        if step:
            (replacing if replaces else early).append(step)

    # Virtual servers: ours are those in the OWNED set(s); in a takeover, kube-proxy's too.
    owned: set[ServiceKey] = set()
    owned_members = _members(obs, T.OWNED, des.families)
    foreign_members = _members(obs, T.FOREIGN, des.families)
    for key in obs.services:
        e = owned_entry(key)
        if e is not None and e in owned_members:
            owned.add(key)
    adopted: set[ServiceKey] = set()
    if takeover is not None:
        theirs = [k for k in obs.services if k not in owned
                  and owned_entry(k) not in foreign_members]
        adopted = kube_proxy_services(theirs, obs.sets, takeover.node_addresses)
        adopted |= wanted_kube_proxy_services(
            (k for k in theirs if k in des.services and k not in adopted), des.owners,
            obs.addresses, takeover.node_addresses, frozenset(adopted))
        owned |= adopted
    want_sets = {n: set(m) for n, m in des.sets.items()}
    ipvs_add: list[Ipvs] = []
    first_ipvs: list[Ipvs] = []  # those of T.FIRST_SERVICES: applied before all others
    ipvs_del: list[Step] = []
    foreign: list[ServiceKey] = []
    first_keys, first_entries, first_addrs = _first(des)
    for key, vs in des.services.items():
        cur = obs.services.get(key)
        if cur is not None and key not in owned:
            problems.append(Problem("Service", "", des.owners.get(key, str(key)),
                                    f"virtual server {key} exists and was not created by "
                                    "ipvsproxy; left alone"))
            foreign.append(key)
            fam = key.addr.version if key.addr else 4
            want_sets[T.family_name(T.OWNED, fam)].discard(owned_entry(key) or "")
            # recorded: never taken for kube-proxy's, though the role sets name it
            want_sets[T.family_name(T.FOREIGN, fam)].add(owned_entry(key) or "")
            continue
        to = first_ipvs if key in first_keys else ipvs_add
        want = des.dests.get(key, ())
        if cur is None:  # a new virtual server: everything to add (a cold start's hot path)
            to.append(Ipvs(IpvsOp(OpKind.ADD_SERVICE, vs)))
            to.extend([Ipvs(IpvsOp(OpKind.ADD_DEST, vs, rs)) for rs in want])
            continue
        if not _vs_equal(vs, cur.service):
            to.append(Ipvs(IpvsOp(OpKind.EDIT_SERVICE, vs)))
        if cur.as_desired:  # read as exactly `want` (kernel/ipvs.py dump: the steady state)
            continue
        if len(want) == len(cur.dests) and want == tuple([d.dest for d in cur.dests[::-1]]):
            # The steady state, without hashing an address: the kernel lists real servers
            # newest first (ip_vs_ctl.c __ip_vs_update_dest: list_add_rcu at the head), so a
            # service programmed from `want` and unchanged since lists exactly it, reversed.
            # (IPv4Address hashes in Python; this compare costs one __eq__ per real server.)
            continue
        have_dests = {d.dest.key: d for d in cur.dests}
        for rs in want:
            got = have_dests.pop(rs.key, None)  # what is left: the real servers not wanted
            if got is None:
                to.append(Ipvs(IpvsOp(OpKind.ADD_DEST, vs, rs)))
            elif not _rs_equal(rs, got.dest):
                to.append(Ipvs(IpvsOp(OpKind.EDIT_DEST, vs, rs)))
        for dkey, d in have_dests.items():
            rs, conns = d.dest, d.active_conns + d.inact_conns
            # Draining: a TCP real server with connections goes to weight 0 and is deleted once
            # the kernel shows none (kube-proxy graceful_termination.go); UDP/SCTP at once.
            if key.protocol is Protocol.TCP and conns > 0 and (key, dkey) not in force_delete:
                draining.append((key, dkey))
                if rs.weight != 0:
                    to.append(Ipvs(IpvsOp(OpKind.EDIT_DEST, vs, rs._replace(weight=0))))
            else:
                ipvs_del.append(Ipvs(IpvsOp(OpKind.DEL_DEST, vs, rs)))
    for key in sorted(owned - des.services.keys()):
        if key.addr is not None and any(key.addr in n for n in exclude):
            e = owned_entry(key)
            want_sets[T.family_name(T.OWNED, key.addr.version)].add(e or "")
            continue  # --ipvs-exclude-cidrs: never deleted
        ipvs_del.append(Ipvs(IpvsOp(OpKind.DEL_SERVICE, obs.services[key].service)))

    # Set members: adds early (before what uses them), removals last. A set too small for its
    # members is resized (filled whole, then swapped in) instead; one that is large enough keeps
    # its size, and the restore scripts name it as the kernel has it (`create ... -exist` fails
    # when maxelem differs; the kernel ignores hashsize there, ip_set_hash_gen.h same_set).
    first_adds: list[Step] = []
    adds: list[Step] = []
    dels: list[Step] = []
    effective = dict(specs)
    for name, members in want_sets.items():
        members.discard("")
        present = obs.sets.get(name, frozenset())
        have = obs.specs.get(name)
        if have is not None and name in obs.sets and (have.type, have.family) == (
                specs[name].type, specs[name].family):
            if have.is_hash and len(members) > have.maxelem:
                adds.append(ResizeSet(specs[name], tuple(sorted(members))))
                continue
            effective[name] = have
        plus = sorted(members - present)
        minus = sorted(present - members)
        firsts = first_entries.get(name)
        if firsts and firsts.intersection(plus):
            first_adds.append(SetMembers(effective[name], True,
                                         tuple(e for e in plus if e in firsts)))
            plus = [e for e in plus if e not in firsts]
        if plus:
            adds.append(SetMembers(effective[name], True, tuple(plus)))
        if minus:
            dels.append(SetMembers(effective[name], False, tuple(minus)))

    # Addresses: ours are those kube-ipvs0 has and KUBE-IPVS-IPS lists. (The set's members are
    # parsed only when some address is not wanted: at 10,000 services that is 10,000 parses.)
    gone = obs.addresses - des.addresses
    listed: set[IPAddress] = set()
    for fam in des.families if gone else ():
        for e in obs.sets.get(T.family_name(T.IPVS_IPS, fam), frozenset()):
            listed.add(ip_address(e))
    unbind = [Address(a, False) for a in sorted(gone & listed, key=_akey)]
    bind = [Address(a, True) for a in sorted(des.addresses - obs.addresses, key=_akey)]

    late: list[Step] = []
    if des.timeouts is not None:
        cur_t = obs.timeouts or Timeouts(0, 0, 0)
        t = Timeouts(des.timeouts.tcp or cur_t.tcp, des.timeouts.tcp_fin or cur_t.tcp_fin,
                     des.timeouts.udp or cur_t.udp)
        if t != cur_t:
            late.append(SetTimeouts(t))
    # FIRST_SERVICES go first: their members, virtual servers and addresses (same safe order)
    first_bind = [b for b in bind if b.addr in first_addrs]
    if first_bind:
        bind = [b for b in bind if b.addr not in first_addrs]
    if takeover is not None and obs.nft_tables:
        late.append(DeleteNftTables(tuple(sorted(obs.nft_tables))))
    steps = [*early, *first_adds, *first_ipvs, *first_bind, *adds, *unbind, *ipvs_add, *ipvs_del,
             *bind, *replacing, *dels, *late]
    return Plan(tuple(steps), tuple(problems), tuple(draining), tuple(foreign),
                tuple(sorted(adopted)), replaced, tuple(effective[s.name] for s in des.specs))


def _members(obs: Observed, name: str, families: Sequence[int]) -> set[str]:
    """The members of one of ipvsproxy's sets, both families' spellings together."""
    return set().union(*(obs.sets.get(T.family_name(name, f), frozenset()) for f in families))


def _first(des: Desired) -> tuple[set[ServiceKey], dict[str, set[str]], set[IPAddress]]:
    """The virtual servers, set members (by set) and addresses of T.FIRST_SERVICES."""
    keys: set[ServiceKey] = set()
    entries: dict[str, set[str]] = {}
    addrs: set[IPAddress] = set()
    for sid in T.FIRST_SERVICES:
        ix = des.index.get(sid)
        if ix is not None:
            keys.update(ix.keys)
            for name, entry in ix.entries:
                entries.setdefault(name, set()).add(entry)
            addrs.update(ix.addresses)
    return keys, entries, addrs


def _akey(a: IPAddress) -> tuple[int, int]:
    return (a.version, int(a))

