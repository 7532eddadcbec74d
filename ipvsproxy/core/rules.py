"""The iptables rules of one IP family, in kube-proxy's chains and order (reference §1.5).

Rules are written exactly as `iptables-save` prints them back (basic matches first, MARK as
--set-xmark, /32 on addresses), so that comparing the kernel's chains with these is a plain
string comparison: a sync with nothing to change rewrites no chain. Pure: the kernel layer runs
iptables-restore.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from ipvsproxy.core import tables as T

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network
# table -> chain -> rule lines ("-A CHAIN ..."), chains in declaration order
Rules = Mapping[str, Mapping[str, tuple[str, ...]]]
TABLES = {"nat": T.NAT_CHAINS, "filter": T.FILTER_CHAINS}


@dataclass(frozen=True, slots=True)
class RuleInputs:
    family: int
    nonempty: frozenset[str]  # IPv4 spellings of the sets that have members
    cluster_cidrs: tuple[IPNetwork, ...] = ()
    masquerade_all: bool = False
    mark: str = "0x4000"
    random_fully: bool = True
    out_filter: tuple[tuple[IPAddress, str, int], ...] = ()  # LB ip, proto, port


def q(text: str) -> str:
    """A quoted comment as iptables-save prints it: \\, " and ' escaped (xtables_save_string);
    iptables-restore reads it back to the same text."""
    esc = text.replace("\\", "\\\\").replace('"', '\\"').replace("'", "\\'")
    return f'"{esc}"'


_COMMENTS = {d.name: d.comment for d in T.ALL_IPSETS}


def _comment(set_name: str) -> str:
    return _COMMENTS[set_name]


def host(a: IPAddress) -> str:
    return f"{a}/{a.max_prefixlen}"


def vaddr(a: IPAddress) -> str:
    """xt_ipvs prints --vaddr without a full-length prefix (libxt_ipvs.c ipvs_mt_dump_addr)."""
    return str(a)


def render_rules(r: RuleInputs) -> dict[str, dict[str, tuple[str, ...]]]:
    fam = r.family
    mark = r.mark
    out: dict[str, dict[str, list[str]]] = {t: {c: [] for c in cs} for t, cs in TABLES.items()}

    def add(table: str, chain: str, rule: str) -> None:
        out[table][chain].append(f"-A {chain} {rule}")

    def sname(name: str) -> str:
        return T.family_name(name, fam)

    def set_rule(table: str, chain: str, name: str, dirs: str, target: str,
                 proto: str = "", pre: str = "") -> None:
        if name not in r.nonempty:
            return
        p = f"-p {proto} " if proto else ""
        add(table, chain, f"{pre}{p}-m comment --comment {q(_comment(name))} "
                          f"-m set --match-set {sname(name)} {dirs} -j {target}")

    add("nat", "KUBE-SERVICES", "-s ::1/128 -j RETURN" if fam == 6 else
        "-s 127.0.0.0/8 -j RETURN")
    set_rule("nat", "KUBE-POSTROUTING", T.LOOP_BACK, "dst,dst,src", "MASQUERADE")
    set_rule("nat", "KUBE-SERVICES", T.LOAD_BALANCER, "dst,dst", "KUBE-LOAD-BALANCER")
    set_rule("nat", "KUBE-LOAD-BALANCER", T.LOAD_BALANCER_LOCAL, "dst,dst", "RETURN")
    for proto, local, masq in (("tcp", T.NODE_PORT_LOCAL_TCP, T.NODE_PORT_TCP),
                               ("udp", T.NODE_PORT_LOCAL_UDP, T.NODE_PORT_UDP)):
        set_rule("nat", "KUBE-NODE-PORT", local, "dst", "RETURN", proto)
        set_rule("nat", "KUBE-NODE-PORT", masq, "dst", "KUBE-MARK-MASQ", proto)
    set_rule("nat", "KUBE-NODE-PORT", T.NODE_PORT_LOCAL_SCTP, "dst,dst", "RETURN", "sctp")
    set_rule("nat", "KUBE-NODE-PORT", T.NODE_PORT_SCTP, "dst,dst", "KUBE-MARK-MASQ", "sctp")
    # ipvsproxy: outside clients of Local-policy frontends with no local endpoint are dropped,
    # the node and (with --cluster-cidr) its pods are not. Filter INPUT runs before IPVS.
    if T.EXT_NO_LOCAL in r.nonempty:
        for cidr in r.cluster_cidrs:
            set_rule("filter", "KUBE-PROXY-FIREWALL", T.EXT_NO_LOCAL, "dst,dst", "RETURN",
                     pre=f"-s {cidr} ")
        add("filter", "KUBE-PROXY-FIREWALL",
            f"-m comment --comment {q(_comment(T.EXT_NO_LOCAL))} -m set --match-set "
            f"{sname(T.EXT_NO_LOCAL)} dst,dst -m addrtype ! --src-type LOCAL -j DROP")
    set_rule("filter", "KUBE-PROXY-FIREWALL", T.LOAD_BALANCER_FW, "dst,dst",
             "KUBE-SOURCE-RANGES-FIREWALL")
    set_rule("filter", "KUBE-SOURCE-RANGES-FIREWALL", T.LB_SOURCE_CIDR, "dst,dst,src", "RETURN")
    set_rule("filter", "KUBE-SOURCE-RANGES-FIREWALL", T.LB_SOURCE_IP, "dst,dst,src", "RETURN")
    # masquerade for cluster IPs (step 3)
    if r.masquerade_all:
        set_rule("nat", "KUBE-SERVICES", T.CLUSTER_IP, "dst,dst", "KUBE-MARK-MASQ")
    elif r.cluster_cidrs:
        for cidr in r.cluster_cidrs:
            set_rule("nat", "KUBE-SERVICES", T.CLUSTER_IP, "dst,dst", "KUBE-MARK-MASQ",
                     pre=f"! -s {cidr} ")
    else:
        set_rule("nat", "KUBE-SERVICES", T.CLUSTER_IP, "src,dst", "KUBE-MARK-MASQ")
    set_rule("nat", "KUBE-SERVICES", T.EXTERNAL_IP, "dst,dst", "KUBE-MARK-MASQ")
    for name in (T.EXTERNAL_IP, T.EXTERNAL_IP_LOCAL):
        if name in r.nonempty:
            match = (f"-m comment --comment {q(_comment(name))} -m set --match-set "
                     f"{sname(name)} dst,dst")
            add("nat", "KUBE-SERVICES",
                f"{match} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT")
            add("nat", "KUBE-SERVICES", f"{match} -m addrtype --dst-type LOCAL -j ACCEPT")
    add("nat", "KUBE-SERVICES", "-m addrtype --dst-type LOCAL -j KUBE-NODE-PORT")
    add("nat", "KUBE-LOAD-BALANCER", "-j KUBE-MARK-MASQ")
    add("filter", "KUBE-SOURCE-RANGES-FIREWALL", "-j DROP")
    vproto = {"tcp": 6, "udp": 17, "sctp": 132}
    for addr, proto, port in r.out_filter:
        add("filter", "KUBE-IPVS-OUT-FILTER",
            f"-s {host(addr)} -m ipvs --vproto {vproto[proto]} --vaddr {vaddr(addr)} "
            f"--vport {port} -j DROP")
    for name in (T.CLUSTER_IP, T.LOAD_BALANCER):
        if name in r.nonempty:
            add("nat", "KUBE-SERVICES", f"-m set --match-set {sname(name)} dst,dst -j ACCEPT")
    add("filter", "KUBE-FORWARD", f"-m comment --comment {q('kubernetes forwarding rules')} "
                                  f"-m mark --mark {mark}/{mark} -j ACCEPT")
    add("filter", "KUBE-FORWARD",
        f"-m comment --comment {q('kubernetes forwarding conntrack rule')} "
        "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
    add("filter", "KUBE-NODE-PORT",
        f"-m comment --comment {q('Kubernetes health check node port')} -m set --match-set "
        f"{sname(T.HEALTH_CHECK_NODE_PORT)} dst -j ACCEPT")
    for name, dirs in ((T.LOAD_BALANCER, "dst,dst"), (T.CLUSTER_IP, "dst,dst"),
                       (T.EXTERNAL_IP, "dst,dst"), (T.EXTERNAL_IP_LOCAL, "dst,dst"),
                       (T.HEALTH_CHECK_NODE_PORT, "dst")):
        add("filter", "KUBE-IPVS-FILTER", f"-m set --match-set {sname(name)} {dirs} -j RETURN")
    reject = "icmp6-port-unreachable" if fam == 6 else "icmp-port-unreachable"
    add("filter", "KUBE-IPVS-FILTER",
        f"-m conntrack --ctstate NEW -m set --match-set {sname(T.IPVS_IPS)} dst "
        f"-j REJECT --reject-with {reject}")
    add("nat", "KUBE-POSTROUTING", f"-m mark ! --mark {mark}/{mark} -j RETURN")
    add("nat", "KUBE-POSTROUTING", f"-j MARK --set-xmark {mark}/0x0")
    add("nat", "KUBE-POSTROUTING",
        f"-m comment --comment {q('kubernetes service traffic requiring SNAT')} -j MASQUERADE"
        + (" --random-fully" if r.random_fully else ""))
    add("nat", "KUBE-MARK-MASQ", f"-j MARK --set-xmark {mark}/{mark}")
    return {t: {c: tuple(rs) for c, rs in chains.items()} for t, chains in out.items()}


def jump_line(j: T.Jump) -> str:
    return f"-A {j.chain} -m comment --comment {q(j.comment)} -j {j.target}"
