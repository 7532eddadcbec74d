"""Taking a node over from kube-proxy (issue 36; core/takeover.py): which virtual servers are
kube-proxy's, that they are edited in place and recorded rather than deleted and added, that
someone else's never are, and how kube-proxy's iptables-mode chains and nftables tables go. Plain
data in, plan steps out; the kernel tests move real nodes between the proxies under traffic."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from ipaddress import ip_address

from ipvsproxy.core import tables as T
from ipvsproxy.core.desired import Desired
from ipvsproxy.core.ipvs import SVC_F_HASHED, ObservedDest, ObservedService, RealServer
from ipvsproxy.core.plan import DeleteNftTables, Iptables, Observed, SetMembers, diff
from ipvsproxy.core.takeover import Takeover, iptables_leftovers, kube_proxy_services
from ipvsproxy.kernel.iptables import parse_save
from tests.unit.kube_objects import HOST, NODE, desired, ep, port, service, slice_
from tests.unit.test_plan import ep_key, key, observed, ops, stages

TAKEOVER = Takeover.of(HOST.addresses)  # NodePorts on 192.168.1.10, 10.244.1.1 (cni0)
CLUSTER = [service("web", "10.96.0.10", port(80, node_port=30080), type_="NodePort"),
           slice_("web", ep("10.244.1.5", NODE), ep("10.244.2.7", "node-b"), port=8080),
           service("dns", "10.96.0.53", port(53, "dns", "UDP")),
           slice_("dns", ep("10.244.2.9"), port=5353, port_name="dns", proto="UDP")]


def as_kube_proxy_left_it(d: Desired) -> Observed:
    """`d` in the kernel as kube-proxy's IPVS mode programs it: the same virtual servers, real
    servers and sets (kube-proxy's names), but no IPVSPROXY-* set."""
    obs = observed(d)
    return replace(obs, sets={n: (frozenset() if n.startswith("IPVSPROXY-") else m)
                              for n, m in obs.sets.items()})


def test_kube_proxys_virtual_servers_are_recognised_by_its_sets() -> None:
    d = desired(*CLUSTER)
    obs = as_kube_proxy_left_it(d)
    assert {str(k) for k in kube_proxy_services(obs.services, obs.sets, TAKEOVER.node_addresses)
            } == {"TCP 10.96.0.10:80", "TCP 192.168.1.10:30080", "TCP 10.244.1.1:30080",
                  "UDP 10.96.0.53:53"}
    # nothing names them: someone else's
    bare = {n: frozenset() for n in obs.sets}
    assert kube_proxy_services(obs.services, bare, TAKEOVER.node_addresses) == set()
    # a NodePort's port, but not on one of the node's addresses
    assert "TCP 192.168.1.10:30080" not in {
        str(k) for k in kube_proxy_services(obs.services, obs.sets,
                                            frozenset({ip_address("10.244.1.1")}))}


def test_a_takeover_edits_kube_proxys_virtual_servers_in_place() -> None:
    """What kube-proxy left, with changes made while no proxy ran: web lost an endpoint and
    gained one, dns's Service was deleted. ipvsproxy adopts the virtual servers (recorded as its
    own, first), adds and drains real servers in place, deletes the virtual server of the
    deleted Service last, and deletes and re-adds nothing."""
    before = desired(*CLUSTER)
    kernel = as_kube_proxy_left_it(before)
    web2 = [CLUSTER[0], slice_("web", ep("10.244.1.5", NODE), ep("10.244.3.3", "node-b"),
                               port=8080)]
    now = desired(*web2)
    plan = diff(now, kernel, takeover=TAKEOVER)
    assert set(plan.adopted) == set(before.services)
    assert not plan.problems
    got = sorted(ops(plan))
    web = ["TCP 10.96.0.10:80", "TCP 192.168.1.10:30080", "TCP 10.244.1.1:30080"]
    assert got == sorted([*((op, vs, rs, 1) for vs in web for op, rs in (
        ("ADD_DEST", "10.244.3.3:8080"), ("DEL_DEST", "10.244.2.7:8080"))),
        ("DEL_SERVICE", "UDP 10.96.0.53:53", "", -1)])
    owned = [s for s in plan.steps if isinstance(s, SetMembers) and s.add
             and s.spec.name == T.OWNED]
    assert set(owned[0].entries) == {"10.96.0.10,tcp:80", "192.168.1.10,tcp:30080",
                                     "10.244.1.1,tcp:30080"}
    assert plan.steps.index(owned[0]) < min(plan.steps.index(s) for s in plan.steps
                                            if type(s).__name__ == "Ipvs")
    # without the operator's word, kube-proxy's virtual servers are someone else's
    alone = diff(now, kernel)
    assert not alone.adopted and len(alone.foreign) == 3
    assert [o for o in ops(alone) if o[0] == "DEL_SERVICE"] == []


def test_someone_elses_virtual_server_is_recorded_and_never_taken_for_kube_proxys() -> None:
    """A foreign virtual server at a desired key: ipvsproxy leaves it alone, lists the key in
    kube-proxy's sets (as before) and records it in IPVSPROXY-FOREIGN-VS; at every later sync,
    though the sets now name it, a takeover does not adopt it."""
    d = desired(*CLUSTER)
    k = key("TCP 10.96.0.10:80")
    theirs = ObservedService(d.services[k]._replace(scheduler="wlc", flags=SVC_F_HASHED),
                             (ObservedDest(RealServer(ep_key("10.1.1.1:80"))),))
    first = diff(d, replace(Observed(), services={k: theirs}), takeover=TAKEOVER)
    assert not first.adopted and first.foreign == (k,)
    recorded = [s for s in first.steps if isinstance(s, SetMembers) and s.spec.name == T.FOREIGN]
    assert [s.entries for s in recorded] == [("10.96.0.10,tcp:80",)]
    later = observed(d, services={k: theirs})
    later = replace(later, sets={**later.sets, T.OWNED: later.sets[T.OWNED] - {
        "10.96.0.10,tcp:80"}, T.FOREIGN: frozenset({"10.96.0.10,tcp:80"})})
    again = diff(d, later, takeover=TAKEOVER)
    assert not again.adopted and again.foreign == (k,)
    assert [o for o in ops(again) if o[1] == "TCP 10.96.0.10:80"] == []


def test_a_kube_proxy_stopped_before_its_sets_were_written_is_taken_over_too() -> None:
    """kube-proxy writes IPVS and kube-ipvs0 first and its sets at the end of a sync: stopped in
    between, its virtual servers are on kube-ipvs0's addresses (and the NodePorts on the node's)
    with no set naming them. The frontends ipvsproxy wants are adopted all the same (found in
    the lab: a kube-proxy stopped during its first sync); one it does not want, at a bound
    address but named by no set, is not kube-proxy's for sure and stays."""
    d = desired(*CLUSTER)
    kernel = as_kube_proxy_left_it(d)
    stray = key("TCP 10.96.0.10:8443")
    stray_vs = ObservedService(d.services[key("TCP 10.96.0.10:80")]._replace(key=stray), ())
    kernel = replace(kernel, sets={n: frozenset() for n in kernel.sets},
                     services={**kernel.services, stray: stray_vs})
    assert kernel.addresses  # ClusterIPs bound on kube-ipvs0
    plan = diff(d, kernel, takeover=TAKEOVER)
    assert {str(k) for k in plan.adopted} == {"TCP 10.96.0.10:80", "TCP 192.168.1.10:30080",
                                              "TCP 10.244.1.1:30080", "UDP 10.96.0.53:53"}
    assert not plan.problems and not plan.foreign
    assert [o for o in ops(plan) if o[0] in ("DEL_SERVICE", "ADD_SERVICE")] == []
    # without kube-ipvs0's word (the address not bound), a ClusterIP is not taken: nor is the
    # NodePort of its Service port
    unbound = replace(kernel, addresses=frozenset())
    alone = diff(d, unbound, takeover=TAKEOVER)
    assert not alone.adopted and len(alone.foreign) == 4


# kube-proxy v1.35's iptables mode, as iptables-save prints it (trimmed to one service), with the
# kubelet's KUBE-FIREWALL and a rule of someone else's
IPTABLES_MODE = """*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-SEP-AAAA - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-BBBB - [0:0]
:KUBE-EXT-BBBB - [0:0]
:OTHER - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -j OTHER
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-EXT-BBBB -j KUBE-SVC-BBBB
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-NODEPORTS -p tcp -m comment --comment "default/web" -m tcp --dport 30080 -j KUBE-EXT-BBBB
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SEP-AAAA -p tcp -m comment --comment "default/web" -m tcp -j DNAT --to-destination 10.244.1.5:8080
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "default/web cluster IP" -m tcp --dport 80 -j KUBE-SVC-BBBB
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-BBBB -m comment --comment "default/web -> 10.244.1.5:8080" -j KUBE-SEP-AAAA
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SERVICES - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A INPUT -j KUBE-FIREWALL
-A INPUT -p tcp --dport 22 -j ACCEPT
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-SERVICES -d 10.96.0.53/32 -p udp -m comment --comment "default/dns has no endpoints" -m udp --dport 53 -j REJECT --reject-with icmp-port-unreachable
COMMIT
"""  # noqa: E501


def iptables_mode_kernel(d: Desired) -> Observed:
    """A node kube-proxy ran on in iptables mode: its chains, no IPVS, no sets, no link."""
    saved = parse_save(IPTABLES_MODE)
    return Observed(chains={(4, t): c for t, c in saved.items()}, sysctls=dict(d.sysctls))


def test_kube_proxys_iptables_mode_chains_are_listed_and_the_kubelets_kept() -> None:
    saved = parse_save(IPTABLES_MODE)
    gone, unlink = iptables_leftovers("nat", saved["nat"])
    assert gone == ["KUBE-EXT-BBBB", "KUBE-NODEPORTS", "KUBE-PROXY-CANARY", "KUBE-SEP-AAAA",
                    "KUBE-SVC-BBBB"]
    assert unlink == []  # nat's jumps are IPVS mode's too
    gone, unlink = iptables_leftovers("filter", saved["filter"])
    assert gone == ["KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS", "KUBE-PROXY-CANARY",
                    "KUBE-SERVICES"]
    assert len(unlink) == 8 and all(r.startswith("-D ") for r in unlink)
    assert not any("KUBE-FIREWALL" in r or "--dport 22" in r or "KUBE-FORWARD" in r
                   for r in unlink)


def test_from_iptables_mode_ipvs_first_then_the_chains_in_one_transaction() -> None:
    """Everything of ipvsproxy's (sets, virtual servers, addresses) is in place before the one
    iptables-restore run per family that writes its chains and deletes kube-proxy's: until then
    kube-proxy's rules keep translating new connections, after it they meet IPVS, and the ones
    already translated keep their conntrack entries."""
    d = desired(*CLUSTER)
    plan = diff(d, iptables_mode_kernel(d), takeover=TAKEOVER)
    assert plan.replaced_chains == 9
    order = stages(plan)
    assert order.index("Iptables") > order.index("Address+") > order.index("Ipvs")
    (step,) = [s for s in plan.steps if isinstance(s, Iptables)]
    payload = "\n".join(step.payload)
    for chain in ("KUBE-SVC-BBBB", "KUBE-SEP-AAAA", "KUBE-NODEPORTS", "KUBE-EXTERNAL-SERVICES"):
        assert f"-X {chain}" in payload
    assert "KUBE-FIREWALL" not in payload and "dport 22" not in payload
    # without the operator's word: ipvsproxy's chains as always, early; kube-proxy's stay
    plain = diff(d, iptables_mode_kernel(d))
    assert plain.replaced_chains == 0 and "-X " not in "\n".join(
        next(s for s in plain.steps if isinstance(s, Iptables)).payload)
    assert stages(plain).index("Iptables") < stages(plain).index("Ipvs")


def test_the_takeover_payload_restores_in_a_real_iptables() -> None:
    """iptables-restore (the host's, in a network namespace of its own) takes the payload on
    kube-proxy's rules as iptables-save printed them, and leaves ipvsproxy's chains, the
    kubelet's and the other rules, and nothing of kube-proxy's iptables mode."""
    d = desired(*CLUSTER)
    (step,) = [s for s in diff(d, iptables_mode_kernel(d), takeover=TAKEOVER).steps
               if isinstance(s, Iptables)]
    sets = " ".join(f"ipset create {n} {t} -exist;" for n, t in (
        ("KUBE-CLUSTER-IP", "hash:ip,port"), ("KUBE-LOOP-BACK", "hash:ip,port,ip"),
        ("KUBE-EXTERNAL-IP", "hash:ip,port"), ("KUBE-NODE-PORT-TCP", "bitmap:port range 0-65535"),
        ("KUBE-IPVS-IPS", "hash:ip"), ("KUBE-LOAD-BALANCER", "hash:ip,port"),
        ("KUBE-HEALTH-CHECK-NODE-PORT", "bitmap:port range 0-65535"),
        ("KUBE-EXTERNAL-IP-LOCAL", "hash:ip,port"), ("KUBE-NODE-PORT-UDP",
                                                      "bitmap:port range 0-65535")))
    # (the nfacct match needs a counter object kube-proxy creates; not the point here)
    kube_proxys = IPTABLES_MODE.replace(
        "-m nfacct --nfacct-name ct_state_invalid_dropped_pkts ", "")
    ours = "\n".join(step.payload)
    script = (f"{sets} iptables-restore <<'EOF'\n{kube_proxys}EOF\n"
              f"iptables-restore --noflush <<'EOF'\n{ours}\nEOF\n"
              "iptables-save -t nat; iptables-save -t filter")
    p = subprocess.run(["unshare", "--net", "sh", "-ec", script], capture_output=True, text=True,
                       check=False)
    assert p.returncode == 0, p.stderr
    assert "KUBE-SVC-" not in p.stdout and "KUBE-SEP-" not in p.stdout
    assert "KUBE-NODEPORTS" not in p.stdout and "KUBE-EXTERNAL-SERVICES" not in p.stdout
    assert "-A INPUT -j KUBE-FIREWALL" in p.stdout and "--dport 22 -j ACCEPT" in p.stdout
    assert "-A PREROUTING -j OTHER" in p.stdout
    assert "KUBE-IPVS-FILTER" in p.stdout and "KUBE-NODE-PORT" in p.stdout


def test_from_nftables_mode_kube_proxys_tables_go_last() -> None:
    d = desired(*CLUSTER)
    obs = replace(Observed(sysctls=dict(d.sysctls)),
                  nft_tables=frozenset({"ip kube-proxy", "ip6 kube-proxy"}))
    plan = diff(d, obs, takeover=TAKEOVER)
    assert isinstance(plan.steps[-1], DeleteNftTables)
    assert plan.steps[-1].lines() == ["nft delete table ip kube-proxy",
                                      "nft delete table ip6 kube-proxy"]
    assert not any(isinstance(s, DeleteNftTables) for s in diff(d, obs).steps)
