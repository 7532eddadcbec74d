"""The pure parts of the side-by-side bench (bench/peers*.py, issue 33): kube-proxy's names for
an endpoint's chains, the objects loaded into the API server, the change series and the table's
arithmetic. No timing is asserted."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from bench import peers, peers_kernel
from bench.cluster_gen import generate
from bench.peers_cluster import (
    HC_PORT_BASE,
    Service,
    api_objects,
    change_series,
    cpu_seconds,
    iptables_endpoint_chain,
    nft_endpoint_chain,
    percentile,
    services,
)
from bench.peers_kernel import Item

SVC1 = Service(1, "ns1", "svc1", "TCP", "10.20.30.41", 80, "p80", 80)


def test_nftables_endpoint_chain_is_kube_proxys() -> None:
    # pkg/proxy/nftables/proxier_test.go, v1.35.4
    assert nft_endpoint_chain(SVC1, "10.180.0.1") == \
        "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"


def test_nftables_endpoint_chain_is_truncated_as_kube_proxys() -> None:
    long = Service(1, "n" * 63, "s" * 63, "SCTP", "fd00::1", 80, "p" * 63, 65535)
    name = nft_endpoint_chain(long, "fd00:1234:5678:9abc:def0:1234:5678:9abc")
    assert len(name) == len("endpoint-") + 240 and name.endswith("...")


def test_iptables_endpoint_chain_is_kube_proxys() -> None:
    # pkg/proxy/iptables/proxier_test.go, v1.35.4: ns1/svc1:p80 -> 10.180.0.1:80
    assert iptables_endpoint_chain(SVC1, "10.180.0.1") == "KUBE-SEP-SXIVWICOYRO3J4NJ"


def test_sizes_load_as_prefixes_of_one_cluster() -> None:
    whole, whole_status = api_objects(300, 2)
    first, first_status = api_objects(100, 2)
    rest, rest_status = api_objects(300, 2, start=100)
    key = lambda o: (o["kind"], o["metadata"]["namespace"], o["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, whole)) == sorted(map(key, first + rest))
    assert whole_status == first_status + rest_status
    assert all("resourceVersion" not in o["metadata"] for o in whole)
    # explicit health-check node ports, each once, the same whichever size loaded them
    hc = {o["metadata"]["name"]: o["spec"]["healthCheckNodePort"] for o in whole
          if "healthCheckNodePort" in o.get("spec", {})}
    assert hc and sorted(hc.values()) == list(range(HC_PORT_BASE, HC_PORT_BASE + len(hc)))
    assert hc == {o["metadata"]["name"]: o["spec"]["healthCheckNodePort"] for o in first + rest
                  if "healthCheckNodePort" in o.get("spec", {})}


def test_change_series_takes_turns_over_distinct_services() -> None:
    svcs = services(generate(500, 3))
    series = change_series(svcs, 200, 100)
    assert [c.measured for c in series[:6]] == [True, False] * 3
    assert sum(c.measured for c in series) == 200 and len(series) == 300
    assert len({c.svc.index for c in series}) == 300
    assert all(c.version == 1 for c in series)
    small = change_series(svcs[:50], 60, 60)
    assert len(small) == 120 and max(c.version for c in small) == 3


def test_cpu_seconds_counts_the_children_waited_for() -> None:
    stat = ("123 (kube (proxy)) S 1 123 123 0 -1 4194560 100 0 0 0 250 50 30 20 20 0 12 0 "
            "900 0 0")
    assert cpu_seconds(stat, 100) == 3.5


def test_percentile() -> None:
    assert percentile([float(i) for i in range(1, 201)], 0.99) == 198.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0


def test_rows_are_ipvsproxy_over_each_peer() -> None:
    ours = {"cold": {"cold_s": 10.0, "cpu_s": 4.0}, "rss_first_mb": 50.0,
            "changes": {"p99_s": 1.0, "cpu_per_1000_s": 5.0}}
    theirs = {"cold": {"cold_s": 40.0, "cpu_s": 8.0}, "rss_first_mb": 40.0,
              "changes": {"p99_s": 4.0, "cpu_per_1000_s": 20.0}}
    slow = {"cold": {"capped": 60.0}}
    got = {r["key"]: r for r in peers.rows(1000, {"ipvsproxy": ours, "kube-proxy-ipvs": theirs,
                                                  "kube-proxy-iptables": slow}, 60.0)}
    assert got["cold"]["ratios"] == {"kube-proxy-ipvs": 0.25} and got["cold"]["met"] is True
    assert got["rss_first"]["ratios"]["kube-proxy-ipvs"] == 1.25
    assert got["rss_first"]["met"] is False
    assert got["cold"]["values"]["kube-proxy-iptables"] == "> 60 s"
    assert "target" not in got["p50"]
    text = peers.table(list(got.values()), ["ipvsproxy", "kube-proxy-ipvs",
                                            "kube-proxy-iptables"])
    assert "| 1,000 | cold node: start to every endpoint in the kernel (s) | 10.0 | 40.0 | 0.25 |" \
        in text


def test_the_control_server_answers_an_extra_action_with_its_query() -> None:
    from typing import Any

    from integration.upstream.controlplane import ControlPlane
    from integration.upstream.remote import Remote, serve_control

    calls: list[dict[str, str]] = []

    def load(q: dict[str, str]) -> dict[str, Any]:
        calls.append(q)
        return {"services": int(q["services"])}

    unstarted = ControlPlane.__new__(ControlPlane)  # nothing of it is called
    server = serve_control(unstarted, extra={("POST", "/load"): load})
    try:
        remote = Remote({"url": "https://127.0.0.1:1", "ca_pem": "", "admin_token": "",
                         "control": f"http://127.0.0.1:{server.server_address[1]}"})
        assert remote.call("POST", "/load?services=1000&dests=10") == {"services": 1000}
        assert calls == [{"services": "1000", "dests": "10"}]
    finally:
        server.shutdown()


def test_memory_splits_the_resident_set() -> None:
    import os

    mem = peers.memory(os.getpid())
    assert mem["VmRSS"] > 0 and mem["Threads"] >= 1
    assert abs(mem["RssAnon"] + mem["RssFile"] + mem["RssShmem"] - mem["VmRSS"]) <= 1
    assert mem["VmHWM"] >= mem["VmRSS"]
    r = {"memory_after": {"RssAnon": 30.0, "RssFile": 20.0, "VmHWM": 90.0},
         "rss_after_mb": 50.0, "changes": {"rss_mean_mb": 60.0}}
    got = {x["key"]: x for x in peers.rows(1000, {"ipvsproxy": r, "kube-proxy-ipvs": {
        "memory_after": {"RssAnon": 20.0, "RssFile": 30.0, "RssShmem": 10.0, "VmHWM": 100.0},
        "changes": {"rss_mean_mb": 80.0}}}, 60.0)}
    assert got["anon_after"]["ratios"] == {"kube-proxy-ipvs": 1.5}
    assert got["file_after"]["ratios"] == {"kube-proxy-ipvs": 0.5}
    # the series' mean and the peak, beside the one sample at its end
    assert got["rss_mean"]["ratios"] == {"kube-proxy-ipvs": 0.75}
    assert got["peak"]["ratios"] == {"kube-proxy-ipvs": 0.9}


def test_a_node_install_holds_what_pip_installs_for_ipvsproxy() -> None:
    from bench.node_install import runtime_distributions

    names = {d.metadata["Name"].lower() for d in runtime_distributions()}
    assert {"pyroute2", "structlog", "prometheus-client", "kubernetes", "pyyaml"} <= \
        {n.replace("_", "-") for n in names}
    assert not names & {"pytest", "mypy", "ruff", "hypothesis"}  # the dev extra is not a node's


def test_changes_past_the_cap_read_as_more_than_it() -> None:
    ours = {"changes": {"p50_s": 2.0, "p99_s": 39.0, "lost": 0}}
    theirs = {"changes": {"p50_s": None, "p99_s": None, "lost": 200}}
    got = {r["key"]: r for r in peers.rows(10000, {"ipvsproxy": ours, "kube-proxy-ipvs": theirs},
                                           1200.0, 1200.0)}
    assert got["p99"]["values"]["kube-proxy-ipvs"] == "> 1200 s"
    assert got["p99"]["ratios"] == {} and got["p99"]["met"] is None


def test_the_profiled_command_is_the_plain_one_under_cprofile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IPVSPROXY_UPSTREAM_BIN", str(tmp_path))  # no kube-proxy build needed
    v = peers.VARIANTS["ipvsproxy"]
    conf, prof = tmp_path / "c.conf", tmp_path / "ipvsproxy.prof"
    plain = peers.argv(v, conf)
    assert peers.argv(v, conf, prof) == [plain[0], "-P", "-m", "cProfile", "-o", str(prof),
                                         *plain[1:]]
    assert plain[2:] == ["--log-format", "json", "run", "--config", str(conf)]
    # kube-proxy runs as it is, profile or not
    kp = peers.VARIANTS["kube-proxy-ipvs"]
    assert peers.argv(kp, conf, prof) == peers.argv(kp, conf)


class _Proc:
    pid = os.getpid()

    def alive(self) -> None:
        pass


class _ScriptedProbe(peers_kernel.Probe):
    """Endpoints appear at given poll numbers; the full read numbered `gone_on_read` also finds
    the first service's second endpoint missing (it is back at the next look)."""

    def __init__(self, appears: dict[tuple[str, str], int], gone_on_read: int = 0) -> None:
        self.appears, self.gone_on_read, self.polls, self.full_reads = appears, gone_on_read, 0, 0

    def _held(self, name: str, ip: str) -> bool:
        return self.polls >= self.appears.get((name, ip), 0)

    def has(self, svc: Service, ip: str) -> bool:
        self.polls += 1
        return self._held(svc.name, ip)

    def absent(self, expected: Sequence[tuple[Service, Sequence[str]]]) -> list[Item]:
        self.polls += 1
        self.full_reads += 1
        gone = [(expected[0][0], expected[0][1][1])] if self.full_reads == self.gone_on_read \
            else []
        return gone + [(s, ip) for s, ips in expected for ip in ips if not self._held(s.name, ip)]


def _expected() -> list[tuple[Service, list[str]]]:
    return [(Service(i, "ns", f"s{i}", "TCP", f"10.96.0.{i}", 80, "p", 80),
             [f"10.0.{i}.1", f"10.0.{i}.2"]) for i in range(1, 4)]


def test_cold_polls_only_what_the_full_read_found_missing() -> None:
    exp = _expected()
    probe = _ScriptedProbe({("s2", "10.0.2.1"): 40})
    c = peers.cold(_Proc(), probe, exp, time.perf_counter(), 60, random.Random(1), pause=0)
    assert "cold_s" in c and c["checks"] > 2
    # one full read found it missing, one confirmed the end: every check between was one GET
    assert probe.full_reads == 2


def test_cold_polls_on_when_the_confirming_read_finds_something_gone() -> None:
    probe = _ScriptedProbe({("s2", "10.0.2.1"): 30}, gone_on_read=2)
    c = peers.cold(_Proc(), probe, _expected(), time.perf_counter(), 60, random.Random(1),
                   pause=0)
    # read 1 found s2's endpoint missing, read 2 (confirming) found s1's gone, read 3 confirmed
    assert "cold_s" in c and c["gone_after_confirm"] == 1 and probe.full_reads == 3


def test_cold_is_capped() -> None:
    probe = _ScriptedProbe({("s3", "10.0.3.2"): 10**9})
    c = peers.cold(_Proc(), probe, _expected(), time.perf_counter() - 100, 60,
                   random.Random(1), pause=0)
    assert c["capped"] == 60


def test_many_items_are_read_again_at_once_not_one_by_one() -> None:
    exp = [(Service(i, "ns", f"s{i}", "TCP", f"10.96.{i // 250}.{i % 250}", 80, "p", 80),
            [f"10.1.{i // 250}.{i % 250}"]) for i in range(200)]
    probe = _ScriptedProbe({(s.name, ips[0]): 5 for s, ips in exp[:100]})
    left = probe.absent(exp)
    assert len(left) == 100 > peers_kernel.ONE_BY_ONE
    probe.polls = 10
    assert probe.still_absent(left) == [] and probe.full_reads == 2


def test_many_items_are_sampled_while_some_of_the_sample_are_missing() -> None:
    exp = [(Service(i, "ns", f"s{i}", "TCP", f"10.96.{i // 250}.{i % 250}", 80, "p", 80),
            [f"10.1.{i // 250}.{i % 250}"]) for i in range(300)]
    probe = _ScriptedProbe({(s.name, ips[0]): 10**9 for s, ips in exp[:200]})
    left = probe.absent(exp)
    assert len(left) == 200
    again = probe.still_absent(left)
    assert again == left and probe.full_reads == 1  # a sample polled, nothing read in full
