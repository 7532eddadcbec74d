"""The daemon's metrics (daemon/metrics.py): kube-proxy's names, labels and buckets
(pkg/proxy/metrics/metrics.go), ipvsproxy's own, the per-service IPVS counters read at scrape
time, and a real reconciler sync touching every metric it uses."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import structlog

from ipvsproxy.daemon.health import Health
from ipvsproxy.daemon.metrics import NETWORK_PROGRAMMING_BUCKETS, SYNC_BUCKETS, Metrics
from ipvsproxy.daemon.reconciler import Reconciler
from ipvsproxy.daemon.store import Store
from tests.unit.kube_objects import NODE, ep, node, service, slice_
from tests.unit.test_reconciler import CFG, Recorder


def samples(text: bytes) -> dict[str, float]:
    """Sample lines keyed by name and labels as printed."""
    out = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def types(text: bytes) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text.decode(), re.M))


def test_every_metric_has_its_upstream_name_and_type() -> None:
    assert types(Metrics().render()) == {
        "kubeproxy_sync_proxy_rules_duration_seconds": "histogram",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds": "gauge",
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": "gauge",
        "kubeproxy_network_programming_duration_seconds": "histogram",
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending": "gauge",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total": "counter",
        "kubeproxy_sync_proxy_rules_service_changes_pending": "gauge",
        "kubeproxy_sync_proxy_rules_service_changes_total": "counter",
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total": "gauge",
        "kubeproxy_proxy_healthz_total": "counter",
        "kubeproxy_proxy_livez_total": "counter",
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total": "counter",
        "kubeproxy_conntrack_reconciler_sync_duration_seconds": "histogram",
        "kubeproxy_conntrack_reconciler_deleted_entries_total": "counter",
        "ipvsproxy_operations_total": "counter",
        "ipvsproxy_syncs_total": "counter",
        "ipvsproxy_virtual_servers": "gauge",
        "ipvsproxy_real_servers": "gauge",
        "ipvsproxy_drift_repaired_total": "counter",
        "ipvsproxy_invalid_objects": "gauge",
        "ipvsproxy_sync_phase_seconds": "histogram",
    }


def test_help_and_buckets_are_upstreams() -> None:
    m = Metrics()
    m.sync_duration.labels(ip_family="IPv4").observe(0.003)
    m.network_programming.labels(ip_family="IPv4").observe(1.5)
    text = m.render().decode()
    assert ("# HELP kubeproxy_sync_proxy_rules_duration_seconds [ALPHA] SyncProxyRules latency "
            "in seconds\n") in text
    les = re.findall(r'kubeproxy_sync_proxy_rules_duration_seconds_bucket\{ip_family="IPv4",'
                     r'le="([^"]+)"\}', text)
    assert les[0] == "0.001" and les[-2:] == ["16.384", "+Inf"] and len(les) == 16
    les = re.findall(r'kubeproxy_network_programming_duration_seconds_bucket\{ip_family="IPv4",'
                     r'le="([^"]+)"\}', text)
    assert les[:4] == ["0.0", "0.25", "0.5", "1.0"] and les[-3:] == ["270.0", "300.0", "+Inf"]
    assert len(SYNC_BUCKETS) == 15 and len(NETWORK_PROGRAMMING_BUCKETS) == 1 + 2 + 59 + 12 + 7
    assert "_created" not in text  # the Go client has no such series


def test_labels_as_kube_proxy_and_the_lab_test_expect() -> None:
    m = Metrics()
    m.operations.labels(kind="ipvs_add_dest", result="ok").inc(2)
    m.syncs.labels(mode="full", result="ok").inc()
    m.no_local_endpoints.labels(traffic_policy="external", ip_family="IPv4").set(1)
    m.healthz_total.labels(code="503").inc()
    m.conntrack_deleted.labels(ip_family="IPv6").inc(4)
    m.invalid_objects.labels(kind="Service").set(2)
    s = samples(m.render())
    assert s['ipvsproxy_operations_total{kind="ipvs_add_dest",result="ok"}'] == 2
    assert s['ipvsproxy_syncs_total{mode="full",result="ok"}'] == 1
    assert s['kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",'
             'traffic_policy="external"}'] == 1
    assert s['kubeproxy_proxy_healthz_total{code="503"}'] == 1
    assert s['kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv6"}'] == 4
    assert s['ipvsproxy_invalid_objects{kind="Service"}'] == 2


def test_two_instances_do_not_share_a_registry() -> None:
    a, b = Metrics(), Metrics()
    a.drift_repaired.inc(5)
    assert samples(b.render())["ipvsproxy_drift_repaired_total"] == 0


def test_service_counters_are_read_at_each_scrape() -> None:
    m = Metrics()
    calls = []

    def source() -> Iterator[tuple[str, str, str, int, int, int, int, int]]:
        calls.append(1)
        yield "default", "web", "http", 3, 10, 9, 1000, 900
        yield "kube-system", "dns", "dns-udp", 7, 70, 70, 7000, 9000

    m.set_service_stats_source(source)
    s = samples(m.render())
    labels = 'namespace="default",port="http",service="web"'
    assert s[f"ipvsproxy_service_connections_total{{{labels}}}"] == 3
    assert s[f'ipvsproxy_service_packets_total{{direction="in",{labels}}}'] == 10
    assert s[f'ipvsproxy_service_packets_total{{direction="out",{labels}}}'] == 9
    assert s[f'ipvsproxy_service_bytes_total{{direction="in",{labels}}}'] == 1000
    assert s[f'ipvsproxy_service_bytes_total{{direction="out",{labels}}}'] == 900
    assert s['ipvsproxy_service_bytes_total{direction="out",namespace="kube-system",'
             'port="dns-udp",service="dns"}'] == 9000
    m.render()
    assert len(calls) == 2


def test_a_failing_service_counter_source_does_not_break_the_scrape() -> None:
    m = Metrics()

    def source() -> Iterator[tuple[str, str, str, int, int, int, int, int]]:
        yield "default", "web", "http", 1, 1, 1, 1, 1
        raise OSError(19, "No such device")

    m.set_service_stats_source(source)
    m.virtual_servers.set(4)
    with structlog.testing.capture_logs() as logs:
        s = samples(m.render())
    assert s["ipvsproxy_virtual_servers"] == 4
    assert not any(k.startswith("ipvsproxy_service_") for k in s)
    assert [(e["log_level"], e["error"]) for e in logs] == [("warning", "[Errno 19] No such "
                                                             "device")]


@pytest.fixture
def synced() -> tuple[Metrics, Health, Reconciler]:
    """A real Reconciler's first full sync, then an incremental one, with real Metrics and
    Health: any attribute or label it uses that Metrics lacks fails here, not in the lab."""
    store = Store(NODE)
    store.replace("Service", [service("web", "10.96.0.10"),
                              service("lb", "10.96.0.11", type_="LoadBalancer",
                                      externalTrafficPolicy="Local")])
    store.replace("EndpointSlice", [slice_("web", ep("10.244.1.5", "node-b")),
                                    slice_("lb", ep("10.244.1.6", "node-b"))])
    store.replace("Node", [node()])
    store.replace("Service", [service("web", "10.96.0.10"),
                              service("lb", "10.96.0.11", type_="LoadBalancer",
                                      externalTrafficPolicy="Local"),
                              {"kind": "Service", "metadata": {"name": "bad"}}])
    m, h = Metrics(), Health(CFG.families, CFG.sync_period)
    r = Reconciler(CFG, store, m, h, kernel=Recorder())
    assert r.sync_once(store.take(), full=True)
    store.event("EndpointSlice", "MODIFIED",
                slice_("web", ep("10.244.1.5", "node-b"), ep("10.244.1.7", "node-b")))
    assert r.sync_once(store.take(), full=False)
    return m, h, r


def test_a_real_reconciler_sync_fills_the_metrics(
        synced: tuple[Metrics, Health, Reconciler]) -> None:
    m, h, r = synced
    s = samples(m.render())
    assert s['ipvsproxy_syncs_total{mode="full",result="ok"}'] == 1
    assert s['ipvsproxy_syncs_total{mode="incremental",result="ok"}'] == 1
    assert s['ipvsproxy_operations_total{kind="ipvs_add_dest",result="ok"}'] >= 1
    assert s['kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}'] == 2
    assert s['kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}'] > 0
    assert s["kubeproxy_sync_proxy_rules_endpoint_changes_total"] >= 3
    assert s["kubeproxy_sync_proxy_rules_service_changes_total"] >= 2
    assert s["kubeproxy_sync_proxy_rules_service_changes_pending"] == 0
    assert s["kubeproxy_sync_proxy_rules_endpoint_changes_pending"] == 0
    assert r.applied is not None
    assert s["ipvsproxy_virtual_servers"] == len(r.applied.services) > 0
    assert s["ipvsproxy_real_servers"] >= 2
    assert ('kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",'
            'traffic_policy="external"}') in s
    assert any(k.startswith("ipvsproxy_invalid_objects{") for k in s)
    assert h.healthz()[1]["status"]["IPv4"]["healthy"] is True


def test_a_drift_repair_and_a_failed_sync_are_counted() -> None:
    store = Store(NODE)
    store.replace("Service", [service("web", "10.96.0.10")])
    store.replace("EndpointSlice", [slice_("web", ep("10.244.1.5", "node-b"))])
    store.replace("Node", [node()])
    m, k = Metrics(), Recorder()
    r = Reconciler(CFG, store, m, None, kernel=k)
    assert r.sync_once(store.take(), full=True)
    k.plans.clear()  # the Recorder reports an empty kernel again: as after `ipvsadm -C`
    assert r.sync_once(store.take(), full=True)
    k.fail_next = 1  # one service's real server refused: counted, the sync is not failed
    k.plans.clear()
    assert r.sync_once(store.take(), full=True)
    k.fail_next, k.fail_kind = 1, "iptables_restore"  # the shared rules: the sync failed
    k.plans.clear()
    assert not r.sync_once(store.take(), full=True)
    s = samples(m.render())
    assert s["ipvsproxy_drift_repaired_total"] > 0
    assert s['ipvsproxy_syncs_total{mode="full",result="failed"}'] == 1
    assert s['ipvsproxy_operations_total{kind="ipvs_add_dest",result="failed"}'] == 1
    assert s['ipvsproxy_operations_total{kind="iptables_restore",result="failed"}'] == 1
