"""The takeover runs' cluster and accounting (tests/takeover/, issue 36): pure parts, on the
host. The moves themselves run in the lab (tests/kernel/test_takeover.py, make takeover)."""

from __future__ import annotations

import pytest

from tests.differential.snapshot import Difference
from tests.takeover import cluster as C
from tests.takeover.moves import Result, changes, leftover, table


@pytest.mark.parametrize("size", [20, 200])
def test_the_cluster_has_every_kind_and_traffic_through_each(size: int) -> None:
    p = C.plan(size)
    kinds = {s.kind for s in p.services}
    assert kinds == {"cluster-ip", "udp", "node-port", "load-balancer", "external-ip",
                     "affinity"}
    assert len({s.cluster_ip for s in p.services} | {p.created.cluster_ip}) == size + 1
    ext = {s.external for s in p.services if s.external}
    targets = {h for t in p.traffic.values() for h, _ in [*t.new, *t.long, *t.udp]}
    assert ext & targets and C.PARAMS.node_ips[0] in targets
    # the services changed while no proxy runs: the grown one carries traffic, the others none
    assert (p.grown.cluster_ip, 80) in p.traffic["cli"].new
    quiet = {p.shrunk.cluster_ip, p.deleted.cluster_ip}
    assert not quiet & targets
    objs = C.objects(p)
    assert sum(o["kind"] == "Service" for o in objs) == size
    assert [c.op for c in changes(p)] == ["replace", "replace", "delete", "delete", "create",
                                          "create"]


def test_the_table_counts_every_clients_failures() -> None:
    r = Result("a move", long_total=5, followed=3.2)
    r.counts = {"cli": {"ok": {"new": 10, "long": 50, "udp": 20},
                        "failed": {"new": [[0, "x", "refused"]], "long": [], "udp": []},
                        "pods": {}},
                "client": {"ok": {"new": 5, "long": 30, "udp": 0},
                           "failed": {"new": [], "long": [[0, "y", "reset"]], "udp": []},
                           "pods": {}}}
    assert r.figures() == {"new ok": 15, "new failed": 1, "long ok": 80, "long broken": 1,
                           "udp ok": 20, "udp lost": 0}
    assert "| a move | 1 of 16 | 1 of 5 | 0 of 20 | 3.2 s | not compared |" in table([r])
    r.compared, r.differences = True, ["[ipvs service] only kube-proxy: TCP 10.96.0.1:443"]
    assert "| 3.2 s | 1 differences |" in table([r])
    # a move that could not be completed says why, on one line
    gone = Result("another", error="kube-proxy never served the cluster: TCP 1.2.3.4:80\ntail")
    assert "| another | could not be completed: kube-proxy never served the cluster: TCP " \
           "1.2.3.4:80 |" in table([gone])


def test_what_kube_proxys_iptables_mode_leaves_on_purpose() -> None:
    ipt = "kube-proxy iptables"
    localnet = Difference("sysctl", "net/ipv4/conf/all/route_localnet", "0", "1")
    firewall = Difference("iptables rule", "v4 filter KUBE-FIREWALL chain", None, "chain")
    assert leftover(localnet, ipt) and leftover(firewall, ipt)
    assert not leftover(localnet, "kube-proxy ipvs")  # only iptables mode sets them
    # the other way round (the moved node lacks what a clean one has) is a real difference
    assert not leftover(Difference("sysctl", "net/ipv4/conf/all/route_localnet", "1", "0"), ipt)
    assert not leftover(Difference("iptables rule", "v4 filter KUBE-FIREWALL chain", "chain",
                                   None), ipt)
    assert not leftover(Difference("sysctl", "net/ipv4/ip_forward", "1", "0"), ipt)
