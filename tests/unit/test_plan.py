"""The diff: desired state against what the kernel holds, as an ordered plan of steps.

Observed states are built from Desired values (what the kernel would hold after applying them),
then edited: plain data in, plan steps out. Ownership is explicit (IPVSPROXY-OWNED-VS for
virtual servers, KUBE-IPVS-IPS for kube-ipvs0 addresses), a deliberate difference from
kube-proxy, which deletes every virtual server it did not program (issues #59507, #134147).
"""

from __future__ import annotations

from dataclasses import replace
from ipaddress import ip_address, ip_network
from typing import Any

import pytest

from ipvsproxy.core import tables as T
from ipvsproxy.core.desired import Desired
from ipvsproxy.core.ipvs import (
    SVC_F_HASHED,
    DestKey,
    Fwd,
    ObservedDest,
    ObservedService,
    Protocol,
    RealServer,
    ServiceKey,
    Timeouts,
    VirtualServer,
)
from ipvsproxy.core.plan import (
    Address,
    CreateLink,
    CreateSet,
    Iptables,
    Ipvs,
    Observed,
    Plan,
    SetMembers,
    SetTimeouts,
    Sysctl,
    diff,
)
from ipvsproxy.core.rules import jump_line
from tests.unit.cmdline_check import check
from tests.unit.kube_objects import CFG46, NODE, desired, ep, port, service, slice_

WEB = [service("web", "10.96.0.10", port(80)),
       slice_("web", ep("10.244.1.5", NODE), ep("10.244.2.7", "node-b"), port=8080)]
DNS = [service("dns", "10.96.0.53", port(53, "dns", "UDP")),
       slice_("dns", ep("10.244.2.9"), port=5353, port_name="dns", proto="UDP")]
SIG = [service("sig", "10.96.0.54", port(3868, "s", "SCTP")),
       slice_("sig", ep("10.244.2.8"), port=3868, port_name="s", proto="SCTP")]
RICH = [*WEB, *DNS, *SIG,
        service("lb", ["10.96.0.30", "fd00::30"], port(443, node_port=31443), type_="LoadBalancer",
                ingress=["203.0.113.10", "2001:db8:f::10"], externalIPs=["198.51.100.7"],
                loadBalancerSourceRanges=["198.51.100.0/24", "2001:db8::/32"],
                externalTrafficPolicy="Local", healthCheckNodePort=32000,
                sessionAffinity="ClientIP", annotations={"ipvsproxy.io/scheduler": "mh"}),
        slice_("lb", ep("10.244.2.8", "node-b"), port=8443),
        slice_("lb", ep("fd00:244::8", NODE), port=8443, family="IPv6")]


def observed(d: Desired, **changes: Any) -> Observed:
    """What the kernel holds once `d` is applied (the kernel adds IP_VS_SVC_F_HASHED)."""
    chains: dict[tuple[int, str], dict[str, tuple[str, ...]]] = {}
    for fam, tables in d.rules.items():
        for table, rules in tables.items():
            chains[(fam, table)] = dict(rules)
            for j in T.JUMPS:
                if j.table == table:
                    have = chains[(fam, table)].get(j.chain, ())
                    chains[(fam, table)][j.chain] = (*have, jump_line(j))
    obs = Observed(
        services={k: ObservedService(v._replace(flags=v.flags | SVC_F_HASHED),
                                     tuple(ObservedDest(rs) for rs in d.dests.get(k, ())))
                  for k, v in d.services.items()},
        sets=dict(d.sets), specs={s.name: s for s in d.specs}, link=True,
        addresses=d.addresses, chains=chains, sysctls=dict(d.sysctls), timeouts=d.timeouts)
    return replace(obs, **changes)


def key(text: str) -> ServiceKey:
    """The ServiceKey written "TCP 10.96.0.10:80"."""
    proto, addr = text.split()
    host, _, p = addr.rpartition(":")
    return ServiceKey.inet(Protocol[proto], ip_address(host.strip("[]")), int(p))


def ops(plan: Plan) -> list[tuple[str, str, str, int]]:
    """IPVS steps as (op, virtual server, real server, weight)."""
    return [(s.op.kind.name, str(s.op.service.key) if s.op.service else "",
             str(s.op.dest.key) if s.op.dest else "", s.op.dest.weight if s.op.dest else -1)
            for s in plan.steps if isinstance(s, Ipvs)]


def stage(step: Any) -> str:
    if isinstance(step, SetMembers | Address):
        return f"{type(step).__name__}{'+' if step.add else '-'}"
    return type(step).__name__


ORDER = ["Sysctl", "CreateLink", "CreateSet", "Iptables", "SetMembers+", "Address-", "Ipvs",
         "Address+", "SetMembers-", "SetTimeouts"]


def stages(plan: Plan) -> list[str]:
    out: list[str] = []
    for s in plan.steps:
        if not out or out[-1] != stage(s):
            out.append(stage(s))
    return out


def test_first_sync_creates_everything_in_safe_order() -> None:
    d = desired(*RICH, cfg=CFG46)
    plan = diff(d, Observed())
    assert stages(plan) == ["Sysctl", "CreateLink", "CreateSet", "Iptables", "SetMembers+",
                            "Ipvs", "Address+"]
    assert {s.spec.name for s in plan.steps if isinstance(s, CreateSet)} == {
        s.name for s in d.specs}
    assert [s.family for s in plan.steps if isinstance(s, Iptables)] == [4, 6]
    assert {s.addr for s in plan.steps if isinstance(s, Address)} == set(d.addresses)
    added = {(k, rs) for k, rss in d.dests.items() for rs in rss}
    got = ops(plan)
    assert {o[1] for o in got if o[0] == "ADD_SERVICE"} == {str(k) for k in d.services}
    assert {(o[1], o[2]) for o in got if o[0] == "ADD_DEST"} == {
        (str(k), str(rs.key)) for k, rs in added}
    for o in got:  # each real server after its virtual server
        if o[0] == "ADD_DEST":
            assert ("ADD_SERVICE", o[1], "", -1) in got[:got.index(o)]
    assert plan.problems == ()


def test_every_change_in_one_plan_keeps_the_safe_order() -> None:
    old = desired(*WEB, *DNS, service("gone", "10.96.0.77"), cfg=CFG46)
    new = desired(*WEB, *SIG, service("new", "10.96.0.78"), cfg=CFG46)
    obs = observed(old, link=False, sysctls={}, timeouts=Timeouts(1, 2, 3),
                   sets={n: m for n, m in old.sets.items() if n != T.LB_SOURCE_IP})
    obs = replace(obs, chains={k: c for k, c in obs.chains.items() if k != (4, "nat")})
    plan = diff(replace(new, timeouts=Timeouts(900, 0, 0)), obs)
    got = stages(plan)
    assert got == sorted(got, key=ORDER.index) and set(got) == set(ORDER)


def test_the_api_server_and_cluster_dns_are_programmed_before_all_other_services() -> None:
    kube = [service("kubernetes", "10.96.0.1", port(443, "https")),
            slice_("kubernetes", ep("192.168.1.10"), port=6443, port_name="https")]
    kdns = [service("kube-dns", "10.96.0.10", port(53, "dns", "UDP"), ns="kube-system"),
            slice_("kube-dns", ep("10.244.1.9", NODE), port=53, port_name="dns", proto="UDP",
                   ns="kube-system")]
    web = [service("web", "10.96.0.20", port(80)), slice_("web", ep("10.244.1.5"), port=8080)]
    d = desired(*web, *kdns, *kube, cfg=CFG46)
    plan = diff(d, Observed())
    first = {"10.96.0.1", "10.96.0.10"}

    def about(s: Any) -> set[str]:  # the service addresses a step programs
        if isinstance(s, Ipvs) and s.op.service is not None:
            return {str(s.op.service.key.addr)}
        if isinstance(s, Address):
            return {str(s.addr)}
        if isinstance(s, SetMembers) and s.add and s.spec.name == T.CLUSTER_IP:
            return {e.split(",")[0] for e in s.entries}
        return set()

    web_at = next(i for i, s in enumerate(plan.steps) if "10.96.0.20" in about(s))
    head = plan.steps[:web_at]
    assert set().union(*map(about, head)) == first
    # still the safe order among them: members (ownership recorded), IPVS, then addresses
    assert stages(Plan(head))[-4:] == ["Iptables", "SetMembers+", "Ipvs", "Address+"]
    owned = next(s for s in head if isinstance(s, SetMembers) and s.spec.name == T.OWNED)
    assert len(owned.entries) == 2
    # the whole plan still does everything, once
    def units(p: Plan) -> list[str]:
        return sorted(f"{s.spec.name} {s.add} {e}" if isinstance(s, SetMembers) else str(s)
                      for s in p.steps for e in (s.entries if isinstance(s, SetMembers) else ("",)))

    assert units(plan) == units(diff(replace(d, index={}), Observed()))


@pytest.mark.parametrize("docs", [WEB, RICH, []], ids=["web", "rich", "empty"])
def test_nothing_to_do_when_the_kernel_already_matches(docs: list[Any]) -> None:
    d = desired(*docs, cfg=CFG46)
    d = replace(d, timeouts=Timeouts(900, 120, 300))
    assert diff(d, observed(d)) == Plan(())


def test_changed_weight_is_an_edit() -> None:
    old = desired(*WEB)
    new = desired(WEB[0], slice_("web", ep("10.244.1.5", NODE), ep("10.244.2.7", "node-b"),
                                 port=8080, weight="3"))
    assert ops(diff(new, observed(old))) == [
        ("EDIT_DEST", "TCP 10.96.0.10:80", "10.244.1.5:8080", 3),
        ("EDIT_DEST", "TCP 10.96.0.10:80", "10.244.2.7:8080", 3)]


def _kernel_order(obs: Observed) -> Observed:
    """As the kernel lists real servers: newest first (list_add_rcu at the head)."""
    return replace(obs, services={k: s._replace(dests=s.dests[::-1])
                                  for k, s in obs.services.items()})


@pytest.mark.parametrize("docs", [WEB, RICH], ids=["web", "rich"])
def test_real_servers_listed_newest_first_are_the_steady_state(docs: list[Any]) -> None:
    d = desired(*docs, cfg=CFG46)
    assert any(len(v) > 1 for v in d.dests.values())
    assert diff(d, _kernel_order(observed(d))) == Plan(())


def test_in_kernel_order_a_changed_weight_is_an_edit_and_a_gone_pod_a_delete() -> None:
    old = desired(*WEB)
    new = desired(WEB[0], slice_("web", ep("10.244.1.5", NODE), ep("10.244.2.7", "node-b"),
                                 port=8080, weight="3"))
    assert ops(diff(new, _kernel_order(observed(old)))) == [
        ("EDIT_DEST", "TCP 10.96.0.10:80", "10.244.1.5:8080", 3),
        ("EDIT_DEST", "TCP 10.96.0.10:80", "10.244.2.7:8080", 3)]
    fewer = desired(WEB[0], slice_("web", ep("10.244.1.5", NODE), port=8080))
    assert [op[:3] for op in ops(diff(fewer, _kernel_order(observed(old))))] == [
        ("DEL_DEST", "TCP 10.96.0.10:80", "10.244.2.7:8080")]


def _with_gone_endpoint(proto: str, active: int, inactive: int, weight: int,
                        persist: int = 0) -> Plan:
    svc = service("s", "10.96.0.5", port(80, "p", proto))
    d = desired(svc, slice_("s", ep("10.244.0.1"), port_name="p", proto=proto))
    k = next(iter(d.services))
    gone = ObservedDest(RealServer(ep_key("10.244.0.2:80"), Fwd.MASQ, weight), active, inactive,
                        persist)
    obs = observed(d)
    svcs = dict(obs.services)
    svcs[k] = svcs[k]._replace(dests=(*svcs[k].dests, gone))
    return diff(d, replace(obs, services=svcs))


def ep_key(text: str) -> DestKey:
    host, _, p = text.rpartition(":")
    return DestKey(ip_address(host), int(p))


# Graceful termination (kube-proxy graceful_termination.go): a TCP real server that still has
# connections is drained at weight 0, deleted once it has none; UDP and SCTP go at once.
@pytest.mark.parametrize("proto,active,inactive,weight,persist,expected", [
    ("TCP", 1, 0, 1, 0, [("EDIT_DEST", 0)]),
    ("TCP", 0, 3, 1, 0, [("EDIT_DEST", 0)]),
    ("TCP", 2, 0, 0, 0, []),  # already draining
    ("TCP", 0, 0, 1, 0, [("DEL_DEST", 1)]),
    ("TCP", 0, 0, 0, 0, [("DEL_DEST", 0)]),  # drained
    ("TCP", 0, 0, 1, 4, [("DEL_DEST", 1)]),  # persistence templates do not count
    ("UDP", 5, 5, 1, 0, [("DEL_DEST", 1)]),
    ("SCTP", 1, 0, 1, 0, [("DEL_DEST", 1)]),
], ids=["tcp-active", "tcp-inactive", "tcp-draining", "tcp-idle", "tcp-drained",
        "tcp-templates-only", "udp", "sctp"])
def test_removed_real_server(proto: str, active: int, inactive: int, weight: int, persist: int,
                             expected: list[tuple[str, int]]) -> None:
    got = ops(_with_gone_endpoint(proto, active, inactive, weight, persist))
    assert [(o[0], o[3]) for o in got] == expected
    assert all(o[2] == "10.244.0.2:80" for o in got)


def test_returning_real_server_is_weighted_back_up() -> None:
    """kube-proxy deletes and re-adds a real server that comes back while draining, and resets
    weight 0 left by a previous run (Test_syncEndpoint_updateWeightsOnRestart): an edit here."""
    d = desired(*WEB)
    obs = observed(d)
    k = next(iter(d.services))
    drained = tuple(ObservedDest(RealServer(o.dest.key, o.dest.fwd, 0), 3)
                    for o in obs.services[k].dests)
    plan = diff(d, replace(obs, services={k: obs.services[k]._replace(dests=drained)}))
    assert ops(plan) == [("EDIT_DEST", "TCP 10.96.0.10:80", "10.244.1.5:8080", 1),
                         ("EDIT_DEST", "TCP 10.96.0.10:80", "10.244.2.7:8080", 1)]


def test_foreign_virtual_server_at_a_desired_key_is_left_alone() -> None:
    d = desired(*WEB)
    k = key("TCP 10.96.0.10:80")
    foreign = ObservedService(VirtualServer(k, "wlc", SVC_F_HASHED),
                              (ObservedDest(RealServer(ep_key("10.1.1.1:80"))),))
    owned_without = {n: (m - {"10.96.0.10,tcp:80"} if n == T.OWNED else m)
                     for n, m in d.sets.items()}
    plan = diff(d, observed(d, services={k: foreign}, sets=owned_without))
    # the only change: the key recorded as someone else's (never taken for kube-proxy's)
    assert ops(plan) == [] and [(s.spec.name, s.entries) for s in plan.steps
                                if isinstance(s, SetMembers)] == [
        (T.FOREIGN, ("10.96.0.10,tcp:80",))]
    assert [str(p) for p in plan.problems] == [
        "Service default/web: virtual server TCP 10.96.0.10:80 exists and was not created by "
        "ipvsproxy; left alone"]
    first = diff(d, replace(Observed(), services={k: foreign}))  # never claimed, not even later
    owned_adds = [s for s in first.steps if isinstance(s, SetMembers) and s.spec.name == T.OWNED]
    assert owned_adds == [] and ("TCP 10.96.0.10:80" not in {o[1] for o in ops(first)})


def _stale(addr: str, port_: int, owned: bool) -> tuple[ServiceKey, ObservedService, str]:
    k = ServiceKey.inet(Protocol.UDP, ip_address(addr), port_)
    rs = (ObservedDest(RealServer(ep_key("10.180.0.1:53")), 1),)
    return k, ObservedService(VirtualServer(k, "rr", SVC_F_HASHED), rs), (
        f"{addr},udp:{port_}" if owned else "")


@pytest.mark.parametrize("family,excluded,stale", [
    (4, ["3.3.3.0/24", "4.4.4.0/24"],
     [("3.3.3.3", 55, True, True), ("4.4.4.4", 56, False, True), ("5.5.5.5", 57, False, True),
      ("6.6.6.6", 58, True, False)]),
    (6, ["3000::/64", "4000::/64"],
     [("3000::1", 55, True, True), ("4000::1", 56, False, True), ("5000::1", 57, False, True),
      ("1000::6", 58, True, False)]),
], ids=["TestCleanLegacyService", "TestCleanLegacyService6"])
def test_stale_virtual_servers(family: int, excluded: list[str],
                               stale: list[tuple[str, int, bool, bool]]) -> None:
    """Ports TestCleanLegacyService{,6} and TestCleanLegacyServiceWithRealServers: owned and no
    longer desired -> deleted with its real servers (no draining), unless in
    --ipvs-exclude-cidrs (then kept, and still owned). Differs deliberately: a virtual server
    ipvsproxy did not create (5.5.5.5 / 5000::1) is never deleted; upstream deletes it."""
    ip = "1.1.1.1" if family == 4 else "1000::1"
    d = desired(service("dns", ip, port(53, "dns", "UDP")),
                cfg=replace(CFG46, families=(family,)))
    obs = observed(d)
    owned_name = T.family_name(T.OWNED, family)
    svcs, owned = dict(obs.services), set(obs.sets[owned_name])
    for addr, p, is_owned, _kept in stale:
        k, o, entry = _stale(addr, p, is_owned)
        svcs[k] = o
        owned |= {entry} - {""}
    plan = diff(d, replace(obs, services=svcs, sets={**obs.sets, owned_name: frozenset(owned)}),
                [ip_network(c) for c in excluded])
    deleted = [a for a, _p, _o, kept in stale if not kept]
    wrap = "[{}]" if family == 6 else "{}"
    assert ops(plan) == [("DEL_SERVICE", f"UDP {wrap.format(a)}:58", "", -1) for a in deleted]
    dels = [s for s in plan.steps if isinstance(s, SetMembers) and not s.add]
    assert [(s.spec.name, s.entries) for s in dels] == [(owned_name, (f"{deleted[0]},udp:58",))]


def test_kube_ipvs0_addresses_not_listed_in_kube_ipvs_ips_are_never_unbound() -> None:
    d = desired(*WEB)
    mine, foreign, wanted = (ip_address(a) for a in ("10.96.0.77", "10.99.0.1", "10.96.0.10"))
    obs = observed(d, addresses=frozenset({mine, foreign}),
                   sets={**d.sets, T.IPVS_IPS: frozenset({"10.96.0.10", "10.96.0.77"})})
    plan = diff(d, obs)
    assert [(s.addr, s.add) for s in plan.steps if isinstance(s, Address)] == [
        (mine, False), (wanted, True)]
    assert [(s.spec.name, s.add, s.entries) for s in plan.steps if isinstance(s, SetMembers)] == [
        (T.IPVS_IPS, False, ("10.96.0.77",))]


@pytest.mark.parametrize("steps", [
    [service("svc1", "172.16.55.4", port(1234, "port1"), port(1235, "port2"))],
    [service("svc1", "172.16.55.4", port(1234, "port1"))],
    [service("svc1", "172.16.55.4", port(1234, "port1"), port(1235, "port2"),
             port(1236, "port3", "UDP"))],
])
def test_multi_port_service_bind_addr(steps: list[Any]) -> None:
    """TestMultiPortServiceBindAddr: changing the ports keeps the address bound; deleting the
    service unbinds it (after its virtual servers are gone)."""
    before = desired(service("svc1", "172.16.55.4", port(1234, "port1"), port(1235, "port2")))
    plan = diff(desired(*steps), observed(before))
    assert [s for s in plan.steps if isinstance(s, Address)] == []
    gone = diff(desired(), observed(desired(*steps)))
    assert [(str(s.addr), s.add) for s in gone.steps if isinstance(s, Address)] == [
        ("172.16.55.4", False)]
    assert stages(gone)[-3:] == ["Address-", "Ipvs", "SetMembers-"]


# Test_syncService: virtual server (scheduler, flags, timeout, netmask) compared without the
# kernel's IP_VS_SVC_F_HASHED; any difference is an in-place edit (no traffic interruption).
@pytest.mark.parametrize("kernel,expected", [
    (VirtualServer(key("TCP 10.96.0.10:80"), "rr", SVC_F_HASHED), []),
    (VirtualServer(key("TCP 10.96.0.10:80"), "wlc", SVC_F_HASHED), ["EDIT_SERVICE"]),
    (VirtualServer(key("TCP 10.96.0.10:80"), "rr", SVC_F_HASHED | 1, 300), ["EDIT_SERVICE"]),
    (VirtualServer(key("TCP 10.96.0.10:80"), "rr", 0, 0, 0xFFFFFFFF), []),
    (VirtualServer(key("TCP 10.96.0.10:80"), "rr", 0, 0, 0xFFFFFF00), ["EDIT_SERVICE"]),
], ids=["same", "scheduler", "persistence", "explicit-default-netmask", "netmask"])
def test_virtual_server_attributes(kernel: VirtualServer, expected: list[str]) -> None:
    d = desired(*WEB)
    obs = observed(d)
    k = kernel.key
    plan = diff(d, replace(obs, services={k: obs.services[k]._replace(service=kernel)}))
    assert [o[0] for o in ops(plan)] == expected
    if expected:
        assert plan.steps[0].lines() == ["ipvsadm -E -t 10.96.0.10:80 -s rr"]


def test_changed_scheduler_annotation_is_an_edit() -> None:
    old = desired(*WEB)
    new = desired(service("web", "10.96.0.10", annotations={"ipvsproxy.io/scheduler": "lc"}),
                  WEB[1])
    plan = diff(new, observed(old))
    assert [s.lines() for s in plan.steps] == [["ipvsadm -E -t 10.96.0.10:80 -s lc"]]


def test_iptables_rewrites_only_changed_chains_and_inserts_missing_jumps() -> None:
    d = desired(*WEB)
    obs = observed(d)
    nat = dict(obs.chains[(4, "nat")])
    nat["KUBE-MARK-MASQ"] = ("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x8000/0x8000",)
    nat["PREROUTING"] = ()
    plan = diff(d, replace(obs, chains={**obs.chains, (4, "nat"): nat}))
    (step,) = plan.steps
    assert isinstance(step, Iptables)
    assert step.payload == (
        "*nat", ":KUBE-MARK-MASQ - [0:0]", "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
        '-I PREROUTING 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        "COMMIT")
    assert step.lines() == [
        "iptables -t nat -F KUBE-MARK-MASQ",
        "iptables -t nat -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
        'iptables -t nat -I PREROUTING 1 -m comment --comment "kubernetes service portals" '
        "-j KUBE-SERVICES"]


def test_existing_set_of_another_type_is_a_problem() -> None:
    d = desired(*WEB)
    obs = observed(d)
    spec = obs.specs[T.CLUSTER_IP].renamed(T.CLUSTER_IP)
    bad = replace(spec, type=type(spec.type)("hash:ip"))
    plan = diff(d, replace(obs, specs={**obs.specs, T.CLUSTER_IP: bad}))
    assert [str(p) for p in plan.problems] == [
        "ipset KUBE-CLUSTER-IP: exists as hash:ip inet, not hash:ip,port; run `ipvsproxy "
        "cleanup` to recreate it"]


@pytest.mark.parametrize("want,have,expected", [
    (Timeouts(900, 0, 0), Timeouts(900, 120, 300), None),
    (Timeouts(900, 0, 0), Timeouts(0, 120, 300), Timeouts(900, 120, 300)),
    (Timeouts(0, 30, 60), None, Timeouts(0, 30, 60)),
])
def test_timeouts_zero_keeps_the_current_value(want: Timeouts, have: Timeouts | None,
                                               expected: Timeouts | None) -> None:
    d = replace(desired(), timeouts=want)
    plan = diff(d, observed(d, timeouts=have))
    assert [s.timeouts for s in plan.steps if isinstance(s, SetTimeouts)] == (
        [expected] if expected else [])


def test_dry_run_lines_are_valid_commands() -> None:
    rich = desired(*RICH, cfg=CFG46)
    first = diff(rich, Observed())
    assert check(first.lines()) == len(first.lines()) > 150
    changes = diff(desired(*WEB, *SIG, service("new", "10.96.0.78", port(8080, "h", "UDP"))),
                   observed(rich, timeouts=Timeouts(1, 2, 3)))
    lines = changes.lines()
    assert {o[0] for o in ops(changes)} >= {"DEL_SERVICE", "ADD_SERVICE"}
    assert check(lines, chains=[*T.NAT_CHAINS, *T.FILTER_CHAINS], sets=rich.specs) > 20
    drain = _with_gone_endpoint("TCP", 1, 0, 1).lines() + _with_gone_endpoint(
        "UDP", 0, 0, 1).lines()
    assert drain == ["ipvsadm -e -t 10.96.0.5:80 -r 10.244.0.2:80 -m -w 0",
                     "ipvsadm -d -u 10.96.0.5:80 -r 10.244.0.2:80"]
    check(drain)
    assert any(line.startswith("ipset del") for line in lines)
    assert isinstance(first.steps[0], Sysctl) and isinstance(first.steps[4], CreateLink)


@pytest.mark.parametrize("bad", [
    "ipvsadm -A -t 10.96.0.1 -s rr", "ipvsadm -a -t 10.96.0.1:80 -r 10.1.1.1:80 -m",
    "ipvsadm -A -t 10.96.0.1:80 -s nope", "ipset add KUBE-CLUSTER-IP 10.96.0.1,tcp",
    "iptables -t nat -A KUBE-SERVICES --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT",
    "iptables -t nat -A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst -j ACCEPT",
    "ip addr add 10.96.0.1/24 dev kube-ipvs0"])
def test_the_checker_rejects_bad_lines(bad: str) -> None:
    create = "ipset create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536"
    with pytest.raises((AssertionError, KeyError, ValueError)):
        check([create, bad], chains=["KUBE-SERVICES"])


def test_a_virtual_server_read_as_desired_is_left_alone_but_its_own_values() -> None:
    """A full sync's read finds a virtual server's real servers exactly the desired ones and
    keeps none of them (ObservedService.as_desired): only the virtual server's own values can
    still differ."""
    d = desired(*WEB)
    k = key("TCP 10.96.0.10:80")
    obs = observed(d)
    settled = {**obs.services, k: obs.services[k]._replace(dests=(), as_desired=True)}
    assert ops(diff(d, replace(obs, services=settled))) == []
    lc = {**settled, k: settled[k]._replace(service=settled[k].service._replace(scheduler="lc"))}
    assert ops(diff(d, replace(obs, services=lc))) == [("EDIT_SERVICE", str(k), "", -1)]
    empty = {**obs.services, k: obs.services[k]._replace(dests=())}  # read, and none there
    assert [o[0] for o in ops(diff(d, replace(obs, services=empty)))] == ["ADD_DEST"] * 2
