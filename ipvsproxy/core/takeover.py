"""Taking a node over from kube-proxy, in place: what kube-proxy left in the kernel that ipvsproxy
adopts, or replaces, when the operator asks for it (--adopt-kube-proxy; README, "Moving from
kube-proxy"). kube-proxy leaves everything as it is on SIGTERM; this module recognises it. Pure:
the diff (core/plan.py) calls it over what the kernel holds, and orders the steps.

- IPVS mode. kube-proxy programs a virtual server for every ClusterIP, externalIP and
  LoadBalancer IP (bound to kube-ipvs0) and NodePort (on the node's addresses), and lists each in
  the set of its role, whose names ipvsproxy shares: KUBE-CLUSTER-IP, KUBE-EXTERNAL-IP(-LOCAL) and
  KUBE-LOAD-BALANCER hold its address,protocol:port, KUBE-NODE-PORT-TCP/-UDP its port
  (KUBE-NODE-PORT-SCTP-HASH address,sctp:port). A virtual server not recorded as ipvsproxy's that
  a role set names is kube-proxy's (`kube_proxy_services`): it becomes ipvsproxy's (recorded in
  IPVSPROXY-OWNED-VS) and is edited in place, its connections kept; one ipvsproxy would not
  program is deleted after everything it will program is in place. kube-proxy writes those sets
  at the end of a sync, after IPVS and kube-ipvs0 (pkg/proxy/ipvs/proxier.go syncProxyRules:
  syncService, then syncIPSetEntries, one `ipset` process per entry): a kube-proxy stopped
  during a sync (its first one, say, or a rolling update's) leaves virtual servers its sets do
  not name yet. So a virtual server at a frontend ipvsproxy wants is kube-proxy's on weaker
  evidence too (`wanted_kube_proxy_services`): its address bound on kube-ipvs0 (kube-proxy's
  dummy link; kube-proxy binds it right after adding the virtual server), or, on a node
  address, a NodePort of a Service port whose other frontends are kube-proxy's. (A Service
  deleted while no proxy ran is not wanted: its virtual server goes only on the sets' word.)
  ipvsproxy writes role entries for a desired frontend that someone else's virtual server
  holds (it leaves that one alone), so it records those in IPVSPROXY-FOREIGN-VS, and nothing
  listed there is ever taken for kube-proxy's.
- iptables mode. Its chains (`iptables_leftovers`): KUBE-SVC-*, KUBE-SVL-*, KUBE-EXT-*, KUBE-FW-*,
  KUBE-SEP-*, KUBE-NODEPORTS and KUBE-PROXY-CANARY in nat; KUBE-SERVICES,
  KUBE-EXTERNAL-SERVICES, KUBE-NODEPORTS and KUBE-PROXY-CANARY in filter (pkg/proxy/iptables
  CleanupLeftovers), and the jumps into them and its own jumps into KUBE-PROXY-FIREWALL. They are
  removed in the iptables-restore run that writes ipvsproxy's chains, after ipvsproxy's virtual
  servers, sets and addresses are in place: a connection kube-proxy's rules already translated
  keeps its conntrack entry, and the next one meets IPVS. KUBE-FIREWALL is the kubelet's: kept.
- nftables mode. The tables `ip kube-proxy` and `ip6 kube-proxy` (pkg/proxy/nftables
  CleanupLeftovers), deleted in one nft transaction once everything else is in place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address

from ipvsproxy.core import tables as T
from ipvsproxy.core.ipset_text import ip_port_entry, port_entry
from ipvsproxy.core.ipvs import Protocol, ServiceKey

IPAddress = IPv4Address | IPv6Address
Chains = Mapping[str, tuple[str, ...]]

# The sets kube-proxy lists a virtual server in, by the role of its address
VIP_SETS = (T.CLUSTER_IP, T.EXTERNAL_IP, T.EXTERNAL_IP_LOCAL, T.LOAD_BALANCER)
NODE_PORT_SETS = {Protocol.TCP: T.NODE_PORT_TCP, Protocol.UDP: T.NODE_PORT_UDP}

# kube-proxy's iptables mode (pkg/proxy/iptables/proxier.go, v1.35)
IPTABLES_MODE_CHAINS = {
    "nat": frozenset({"KUBE-NODEPORTS", "KUBE-PROXY-CANARY"}),
    "filter": frozenset({"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS",
                         "KUBE-PROXY-CANARY"}),
}
IPTABLES_MODE_PREFIXES = {"nat": ("KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-",
                                  "KUBE-SEP-"), "filter": ()}
# iptables mode's jumps into KUBE-PROXY-FIREWALL (from INPUT, OUTPUT and FORWARD, new
# connections only); IPVS mode jumps there from INPUT and FORWARD with another comment
IPTABLES_MODE_FIREWALL_COMMENT = '"kubernetes load balancer firewall"'
BUILTIN = frozenset({"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"})
NFT_TABLES = ("ip kube-proxy", "ip6 kube-proxy")


@dataclass(frozen=True, slots=True)
class Takeover:
    """The operator's word that kube-proxy's state on this node is ipvsproxy's to adopt, and
    what recognising it needs: the node's own addresses (kube-proxy's NodePort virtual servers
    are on them)."""

    node_addresses: frozenset[IPAddress] = frozenset()

    @classmethod
    def of(cls, addresses: Iterable[tuple[str, IPAddress]]) -> Takeover:
        """From the host's (interface, address) pairs: every one but kube-ipvs0's."""
        return cls(frozenset(a for ifname, a in addresses if ifname != "kube-ipvs0"))


def kube_proxy_services(services: Iterable[ServiceKey], sets: Mapping[str, frozenset[str]],
                        node_addresses: frozenset[IPAddress]) -> set[ServiceKey]:
    """The virtual servers among `services` that kube-proxy's sets name (see the module's
    docstring); the caller leaves out those ipvsproxy already owns or recorded as foreign."""
    out: set[ServiceKey] = set()
    for key in services:
        if key.fwmark or key.addr is None or key.protocol is Protocol.NONE:
            continue  # kube-proxy programs no fwmark service
        fam = key.addr.version
        entry = ip_port_entry(key.addr, key.protocol.name.lower(), key.port)
        if any(entry in sets.get(T.family_name(n, fam), ()) for n in VIP_SETS):
            out.add(key)
        elif key.addr in node_addresses:
            if key.protocol is Protocol.SCTP:
                named = entry in sets.get(T.family_name(T.NODE_PORT_SCTP, fam), ())
            else:
                named = port_entry(key.port) in sets.get(
                    T.family_name(NODE_PORT_SETS[key.protocol], fam), ())
            if named:
                out.add(key)
    return out


def wanted_kube_proxy_services(present: Iterable[ServiceKey], owners: Mapping[ServiceKey, str],
                               bound: frozenset[IPAddress], node_addresses: frozenset[IPAddress],
                               adopted: frozenset[ServiceKey]) -> set[ServiceKey]:
    """Among `present` (virtual servers at frontends ipvsproxy wants, neither ipvsproxy's nor
    recorded as foreign, nor in `adopted` already): kube-proxy's by the weaker evidence of the
    module's docstring. `owners`: each wanted frontend's Service port ("ns/name:port")."""
    out: set[ServiceKey] = set()
    rest: list[ServiceKey] = []
    for key in present:
        if key.fwmark or key.addr is None:
            continue
        if key.addr in bound:
            out.add(key)
        elif key.addr in node_addresses:
            rest.append(key)
    theirs = {owners.get(k) for k in (*adopted, *out)}
    theirs.discard(None)
    out.update(k for k in rest if owners.get(k) in theirs)
    return out


def iptables_leftovers(table: str, chains: Chains) -> tuple[list[str], list[str]]:
    """kube-proxy's iptables-mode chains in one table as iptables-save listed them: (the chains
    to flush and delete, the rules of built-in chains to delete, as `-D ...` lines)."""
    prefixes = IPTABLES_MODE_PREFIXES.get(table, ())
    names = IPTABLES_MODE_CHAINS.get(table, frozenset())
    gone = sorted(c for c in chains if c in names or (prefixes and c.startswith(prefixes)))
    dead = set(gone)
    rules: list[str] = []
    for chain in sorted(BUILTIN & chains.keys()):
        for rule in chains[chain]:
            target = _target(rule)
            if target in dead or (target == "KUBE-PROXY-FIREWALL"
                                  and IPTABLES_MODE_FIREWALL_COMMENT in rule):
                rules.append("-D" + rule[2:])
    return gone, rules


def _target(rule: str) -> str:
    words = rule.split()
    for i, w in enumerate(words[:-1]):
        if w in ("-j", "-g"):
            return words[i + 1]
    return ""
