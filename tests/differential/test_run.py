"""The pure parts of the lab driver: when a proxy counts as synced and the configuration both
proxies get (tests/differential/proxies.py), and which clusterIP virtual servers the API objects
ask for (tests/differential/run.py)."""

from __future__ import annotations

import json
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

from ipvsproxy.settings import kpconfig
from tests.differential import proxies, run, snapshot
from tests.differential.cluster import LABEL_PROXY_NAME, Params

LAST = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
QUEUED = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"


def m(last4: float, queued4: float, last6: float, queued6: float,
      pending: float = 0) -> dict[str, float]:
    return {f'{LAST}{{ip_family="IPv4"}}': last4, f'{QUEUED}{{ip_family="IPv4"}}': queued4,
            f'{LAST}{{ip_family="IPv6"}}': last6, f'{QUEUED}{{ip_family="IPv6"}}': queued6,
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending": pending,
            "kubeproxy_sync_proxy_rules_service_changes_pending": 0}


def test_converged_needs_both_families_synced_after_their_last_queued_change() -> None:
    assert proxies.converged(m(10, 9, 12, 11))
    assert not proxies.converged(m(10, 9, 0, 11))  # IPv6 never synced (kube-proxy: not yet
    #                                                initialized while IPv4's first sync runs)
    assert not proxies.converged(m(10, 11, 12, 11))  # a change queued after IPv4's last sync
    assert not proxies.converged(m(10, 9, 12, 11, pending=1))
    assert not proxies.converged({})  # no metrics yet (not listening)


def test_the_kube_proxy_configuration_is_one_both_proxies_read() -> None:
    p = Params()
    text = proxies.kube_proxy_config(p, Path("/k/admin.kubeconfig"))
    cfg = json.loads(text)
    assert cfg["mode"] == "ipvs" and cfg["ipvs"]["scheduler"] == "rr"
    assert cfg["hostnameOverride"] == p.node_name
    assert cfg["clusterCIDR"] == ",".join(p.cluster_cidrs)
    # conntrack left alone: no sysctl the lab cannot set is written
    assert cfg["conntrack"] == {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                                "tcpCloseWaitTimeout": "0s"}
    # ipvsproxy run --config reads the same file without a warning
    values, warnings = _read(kpconfig, text)
    assert warnings == []
    assert values["kubeconfig"] == "/k/admin.kubeconfig"


def _read(mod: Any, text: str) -> tuple[dict[str, Any], list[str]]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "kube-proxy.conf"
        path.write_text(text)
        values, warnings = mod.defaults_from_file(str(path))
    return dict(values), list(warnings)


def test_cluster_ip_frontends_of_the_api_objects() -> None:
    objs: list[dict[str, Any]] = [
        {"kind": "Service", "metadata": {"name": "a"},
         "spec": {"type": "ClusterIP", "clusterIPs": ["10.96.1.1", "fd00:96::1"],
                  "externalIPs": ["10.96.7.7", "203.000.113.005"],
                  "ports": [{"protocol": "TCP", "port": 80}]}},
        {"kind": "Service", "metadata": {"name": "h"},
         "spec": {"type": "ClusterIP", "clusterIP": "None", "clusterIPs": ["None"],
                  "ports": [{"protocol": "TCP", "port": 80}]}},
        {"kind": "Service", "metadata": {"name": "x"},
         "spec": {"type": "ExternalName", "externalName": "x.example.com"}},
        {"kind": "Service", "metadata": {"name": "o", "labels": {
            LABEL_PROXY_NAME: "other"}},
         "spec": {"type": "ClusterIP", "clusterIP": "10.96.2.2", "clusterIPs": ["10.96.2.2"],
                  "ports": [{"protocol": "UDP", "port": 53}]}},
    ]
    must, may = run.cluster_ip_frontends(objs, Params())
    assert must == {"TCP 10.96.1.1:80", "TCP [fd00:96::1]:80"}
    assert may == must | {"TCP 10.96.7.7:80", "TCP 203.0.113.5:80"}
    assert run._in_service_ranges("TCP 10.96.7.7:80", Params())
    assert not run._in_service_ranges("TCP 203.0.113.5:80", Params())


def test_the_sentinel_has_a_stage_a_family_and_names_what_the_kernel_will_show() -> None:
    """Two stages (the second, a second endpoint a slice, is read only by a sync that began
    after the first stage's sync finished), each with a real server in each family, named as
    snapshot.parse_ipvs names the dump's; and the sentinel's addresses are out of the
    generator's way (it allocates clusterIPs below offset 60,000)."""
    p = Params()
    s = run._sentinel(p, 9002)
    assert [c.op for c in s.first] == ["create"] * 3 and [c.op for c in s.second] == \
        ["replace"] * 2
    svc = s.first[0].obj
    assert svc["spec"]["clusterIPs"] == ["10.96.255.202", "fd00:96::ffca"]
    assert {sl.obj["addressType"] for sl in s.first[1:]} == {"IPv4", "IPv6"}
    assert [c.obj["metadata"]["name"] for c in s.second] == \
        [c.obj["metadata"]["name"] for c in s.first[1:]]
    dump = ("-A -t 10.96.255.202:7777 -s rr\n"
            "-a -t 10.96.255.202:7777 -r 10.244.9.9:7777 -m -w 1\n"
            "-a -t 10.96.255.202:7777 -r 10.244.9.10:7777 -m -w 1\n"
            "-A -t [fd00:96::ffca]:7777 -s rr\n"
            "-a -t [fd00:96::ffca]:7777 -r [fd00:244::9:9]:7777 -m -w 1\n"
            "-a -t [fd00:96::ffca]:7777 -r [fd00:244::9:10]:7777 -m -w 1\n")
    dests = set(snapshot.parse_ipvs(dump)[1])
    assert s.first_dests | s.second_dests == dests and not s.first_dests & s.second_dests
    assert len(s.first_dests) == len(s.second_dests) == 2
    for n in range(50):
        for ip in run._sentinel(p, n).first[0].obj["spec"]["clusterIPs"]:
            assert run._in_service_ranges(f"TCP {snapshot._hostport(ip + ':1')}", p)
            net = ip_network(p.service_cidrs[0 if "." in ip else 1])
            assert int(ip_address(ip)) - int(net.network_address) > 60000
