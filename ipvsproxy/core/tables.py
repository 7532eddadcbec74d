"""Fixed things as tables: the kube-proxy ipsets, the iptables chains and the jumps into them.

Names, types and comments are kube-proxy's (pkg/proxy/ipvs/ipset.go, proxier.go), so that
`ipset list KUBE-CLUSTER-IP` and `iptables-save | grep KUBE-` read as operators expect.
Setup walks these tables forwards, teardown in reverse (shared/reference/kube-proxy-ipvs.md §1.4,
§1.5). IPv6 names get `KUBE-6-` and are cut at 31 characters, as kube-proxy does.
"""

from __future__ import annotations

from dataclasses import dataclass

# ipset set names (IPv4 spelling)
LOOP_BACK = "KUBE-LOOP-BACK"
CLUSTER_IP = "KUBE-CLUSTER-IP"
EXTERNAL_IP = "KUBE-EXTERNAL-IP"
EXTERNAL_IP_LOCAL = "KUBE-EXTERNAL-IP-LOCAL"
LOAD_BALANCER = "KUBE-LOAD-BALANCER"
LOAD_BALANCER_FW = "KUBE-LOAD-BALANCER-FW"
LOAD_BALANCER_LOCAL = "KUBE-LOAD-BALANCER-LOCAL"
LB_SOURCE_IP = "KUBE-LOAD-BALANCER-SOURCE-IP"
LB_SOURCE_CIDR = "KUBE-LOAD-BALANCER-SOURCE-CIDR"
NODE_PORT_TCP = "KUBE-NODE-PORT-TCP"
NODE_PORT_LOCAL_TCP = "KUBE-NODE-PORT-LOCAL-TCP"
NODE_PORT_UDP = "KUBE-NODE-PORT-UDP"
NODE_PORT_LOCAL_UDP = "KUBE-NODE-PORT-LOCAL-UDP"
NODE_PORT_SCTP = "KUBE-NODE-PORT-SCTP-HASH"
NODE_PORT_LOCAL_SCTP = "KUBE-NODE-PORT-LOCAL-SCTP-HASH"
HEALTH_CHECK_NODE_PORT = "KUBE-HEALTH-CHECK-NODE-PORT"
IPVS_IPS = "KUBE-IPVS-IPS"
# ipvsproxy's own sets. OWNED records which virtual servers it created, so ownership survives
# restarts with no state on disk; EXT_NO_LOCAL holds the external frontends of
# externalTrafficPolicy=Local services that have no local endpoint (outside clients dropped).
OWNED = "IPVSPROXY-OWNED-VS"
EXT_NO_LOCAL = "IPVSPROXY-EXT-NO-LOCAL"
# Desired virtual servers someone else's virtual server holds (left alone): never taken for
# kube-proxy's in a takeover, though ipvsproxy lists them in kube-proxy's sets (core/takeover.py)
FOREIGN = "IPVSPROXY-FOREIGN-VS"

# Services a node needs before all others (namespace, name): the API server and cluster DNS.
# A plan programs them first, so on a cold start at 10,000 services they work within seconds
# instead of after the whole table (upstream #133773: new nodes time out while kube-proxy fills
# its sets).
FIRST_SERVICES = (("default", "kubernetes"), ("kube-system", "kube-dns"))


# Every scheduler the kernel's IPVS has (net/netfilter/ipvs/ip_vs_*.c, Linux 6.12: twos since
# 6.10, mh since 4.18). Any other name passes no kernel's check: the kernel answers ENOENT after
# trying request_module("ip_vs_<name>") on every node, at every sync (ip_vs_sched_getbyname).
# Whether this node's kernel has a known one is the shell's to say (HostFacts.schedulers).
KERNEL_SCHEDULERS = frozenset({"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed",
                               "nq", "fo", "ovf", "mh", "twos"})


@dataclass(frozen=True, slots=True)
class IPSetDef:
    name: str
    type: str
    comment: str

    def name_for(self, family: int) -> str:
        return family_name(self.name, family)


def family_name(name: str, family: int) -> str:
    if family == 4:
        return name
    if name.startswith("KUBE-"):
        return ("KUBE-6-" + name[len("KUBE-"):])[:31]
    return (name + "-6")[:31]


IPSETS: tuple[IPSetDef, ...] = (
    IPSetDef(LOOP_BACK, "hash:ip,port,ip",
             "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"),
    IPSetDef(CLUSTER_IP, "hash:ip,port",
             "Kubernetes service cluster ip + port for masquerade purpose"),
    IPSetDef(EXTERNAL_IP, "hash:ip,port",
             "Kubernetes service external ip + port for masquerade and filter purpose"),
    IPSetDef(EXTERNAL_IP_LOCAL, "hash:ip,port",
             "Kubernetes service external ip + port with externalTrafficPolicy=local"),
    IPSetDef(LOAD_BALANCER, "hash:ip,port", "Kubernetes service lb portal"),
    IPSetDef(LOAD_BALANCER_FW, "hash:ip,port",
             "Kubernetes service load balancer ip + port for load balancer with sourceRange"),
    IPSetDef(LOAD_BALANCER_LOCAL, "hash:ip,port",
             "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"),
    IPSetDef(LB_SOURCE_IP, "hash:ip,port,ip",
             "Kubernetes service load balancer ip + port + source IP for packet filter purpose"),
    IPSetDef(LB_SOURCE_CIDR, "hash:ip,port,net",
             "Kubernetes service load balancer ip + port + source cidr for packet filter "
             "purpose"),
    IPSetDef(NODE_PORT_TCP, "bitmap:port", "Kubernetes nodeport TCP port for masquerade purpose"),
    IPSetDef(NODE_PORT_LOCAL_TCP, "bitmap:port",
             "Kubernetes nodeport TCP port with externalTrafficPolicy=local"),
    IPSetDef(NODE_PORT_UDP, "bitmap:port", "Kubernetes nodeport UDP port for masquerade purpose"),
    IPSetDef(NODE_PORT_LOCAL_UDP, "bitmap:port",
             "Kubernetes nodeport UDP port with externalTrafficPolicy=local"),
    IPSetDef(NODE_PORT_SCTP, "hash:ip,port",
             "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"),
    IPSetDef(NODE_PORT_LOCAL_SCTP, "hash:ip,port",
             "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type "
             "'hash ip:port'"),
    IPSetDef(HEALTH_CHECK_NODE_PORT, "bitmap:port", "Kubernetes health check node port"),
    IPSetDef(IPVS_IPS, "hash:ip", "Addresses on the ipvs interface"),
)
IPSET_BY_NAME = {d.name: d for d in IPSETS}
OWN_IPSETS: tuple[IPSetDef, ...] = (
    IPSetDef(OWNED, "hash:ip,port", "virtual servers created by ipvsproxy"),
    IPSetDef(EXT_NO_LOCAL, "hash:ip,port",
             "ipvsproxy: externalTrafficPolicy=Local frontends with no local endpoint"),
    IPSetDef(FOREIGN, "hash:ip,port", "ipvsproxy: virtual servers of others left alone"),
)
ALL_IPSETS = IPSETS + OWN_IPSETS
# family-prefixed name -> (name, family): family_name() truncates, so it is not inverted by text
BY_FAMILY_NAME: dict[str, tuple[str, int]] = {
    family_name(d.name, f): (d.name, f) for d in ALL_IPSETS for f in (4, 6)}

# Chains: (table, chain). Declared in this order in the restore payload.
NAT_CHAINS = ("KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER",
              "KUBE-MARK-MASQ")
FILTER_CHAINS = ("KUBE-FORWARD", "KUBE-NODE-PORT", "KUBE-PROXY-FIREWALL",
                 "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER")


@dataclass(frozen=True, slots=True)
class Jump:
    table: str
    chain: str  # built-in chain
    target: str
    comment: str

    def rule(self) -> list[str]:
        return ["-m", "comment", "--comment", self.comment, "-j", self.target]


# kube-proxy inserts each with `iptables -I` when missing (so later ones end up above).
JUMPS: tuple[Jump, ...] = (
    Jump("nat", "OUTPUT", "KUBE-SERVICES", "kubernetes service portals"),
    Jump("nat", "PREROUTING", "KUBE-SERVICES", "kubernetes service portals"),
    Jump("nat", "POSTROUTING", "KUBE-POSTROUTING", "kubernetes postrouting rules"),
    Jump("filter", "FORWARD", "KUBE-FORWARD", "kubernetes forwarding rules"),
    Jump("filter", "INPUT", "KUBE-NODE-PORT", "kubernetes health check rules"),
    Jump("filter", "INPUT", "KUBE-PROXY-FIREWALL", "kube-proxy firewall rules"),
    Jump("filter", "FORWARD", "KUBE-PROXY-FIREWALL", "kube-proxy firewall rules"),
    Jump("filter", "INPUT", "KUBE-IPVS-FILTER", "kubernetes ipvs access filter"),
    Jump("filter", "OUTPUT", "KUBE-IPVS-OUT-FILTER", "kubernetes ipvs access filter"),
)

SYSCTLS: tuple[tuple[str, str], ...] = (
    ("net/ipv4/vs/conntrack", "1"),
    ("net/ipv4/vs/expire_nodest_conn", "1"),
    ("net/ipv4/vs/expire_quiescent_template", "1"),
    ("net/ipv4/ip_forward", "1"),
)
STRICT_ARP_SYSCTLS = (("net/ipv4/conf/all/arp_ignore", "1"),
                      ("net/ipv4/conf/all/arp_announce", "2"))
