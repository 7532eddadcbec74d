"""The daemon's Prometheus metrics: kube-proxy's own (names, help, labels and buckets of
pkg/proxy/metrics/metrics.go, so existing dashboards and alerts keep working), ipvsproxy's
(kernel operations, syncs, drift repaired, IPVS table size) and, read from the kernel at scrape
time, per-service IPVS traffic counters.

Owns a private CollectorRegistry (never prometheus_client's global one) and its text rendering;
serving it is daemon/http.py, updating it the reconciler (daemon/reconciler.py) and
`ipvsproxy run`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

log = structlog.get_logger("ipvsproxy.metrics")

# One service port's IPVS counters: namespace, name, port name, connections, packets in,
# packets out, bytes in, bytes out.
ServiceStats = tuple[str, str, str, int, int, int, int, int]


def exponential_buckets(start: float, factor: float, count: int) -> list[float]:
    return [start * factor ** i for i in range(count)]


def linear_buckets(start: float, width: float, count: int) -> list[float]:
    return [start + width * i for i in range(count)]


# metrics.go: ExponentialBuckets(0.001, 2, 15), 1 ms .. 16.384 s.
SYNC_BUCKETS = exponential_buckets(0.001, 2, 15)
# metrics.go: MergeBuckets of 0.25 s steps to 0.5 s, 1 s steps to 59 s, 5 s steps to 115 s and
# 30 s steps to 5 min. component-base's MergeBuckets starts from a zero-length-1 slice, so the
# first bucket is le="0": kept, the bucket list is part of the series names.
NETWORK_PROGRAMMING_BUCKETS = [0.0, *linear_buckets(0.25, 0.25, 2), *linear_buckets(1, 1, 59),
                               *linear_buckets(60, 5, 12), *linear_buckets(120, 30, 7)]

# component-base prefixes the help of every ALPHA metric with its stability level
# (metrics/opts.go): kube-proxy's /metrics says "# HELP ... [ALPHA] ...".
ALPHA = "[ALPHA] "
FAMILY = ("ip_family",)


class _ServiceStatsCollector:
    """Per service port traffic, read from IPVS when scraped (the kernel keeps the counters)."""

    def __init__(self, source: Callable[[], Iterable[ServiceStats]]) -> None:
        self.source = source

    @staticmethod
    def _families() -> tuple[CounterMetricFamily, CounterMetricFamily, CounterMetricFamily]:
        labels = ["namespace", "service", "port"]
        return (CounterMetricFamily("ipvsproxy_service_connections",
                                    "Connections scheduled by the service port's virtual servers",
                                    labels=labels),
                CounterMetricFamily("ipvsproxy_service_packets",
                                    "Packets through the service port's virtual servers",
                                    labels=[*labels, "direction"]),
                CounterMetricFamily("ipvsproxy_service_bytes",
                                    "Bytes through the service port's virtual servers",
                                    labels=[*labels, "direction"]))

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        try:
            rows = list(self.source())
        except Exception as exc:  # a scrape without these beats no scrape at all
            log.warning("cannot read IPVS service counters", error=str(exc) or type(exc).__name__)
            return iter(())
        conns, packets, octets = self._families()
        for ns, name, port, c, pin, pout, bin_, bout in rows:
            conns.add_metric([ns, name, port], c)
            packets.add_metric([ns, name, port, "in"], pin)
            packets.add_metric([ns, name, port, "out"], pout)
            octets.add_metric([ns, name, port, "in"], bin_)
            octets.add_metric([ns, name, port, "out"], bout)
        return iter((conns, packets, octets))


class _WithoutCreated:
    """The registry without prometheus_client's `*_created` series, which kube-proxy (Go client)
    does not have; filtered here rather than with the process-wide disable_created_metrics()."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric


class Metrics:
    """Every metric the daemon exports. Counter names are given as exposed (prometheus_client
    strips `_total` and adds it back)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self._stats: _ServiceStatsCollector | None = None
        # kube-proxy: pkg/proxy/metrics/metrics.go
        self.sync_duration = Histogram(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            ALPHA + "SyncProxyRules latency in seconds", FAMILY, buckets=SYNC_BUCKETS,
            registry=r)
        # ipvsproxy's own: where a full sync's time goes (daemon/laps.py), up to ~4 minutes
        self.sync_phase = Histogram(
            "ipvsproxy_sync_phase_seconds",
            "Seconds of each phase of a full sync: host, desired, observe, diff, apply_ipvs, "
            "apply_ipsets, apply_addresses, apply_other, index", ["phase"],
            buckets=exponential_buckets(0.001, 2, 18), registry=r)
        self.last_sync = Gauge(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            ALPHA + "The last time proxy rules were successfully synced", FAMILY, registry=r)
        self.last_queued = Gauge(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            ALPHA + "The last time a sync of proxy rules was queued", FAMILY, registry=r)
        self.network_programming = Histogram(
            "kubeproxy_network_programming_duration_seconds",
            ALPHA + "In Cluster Network Programming Latency in seconds", FAMILY,
            buckets=NETWORK_PROGRAMMING_BUCKETS, registry=r)
        self.endpoint_changes_pending = Gauge(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            ALPHA + "Pending proxy rules Endpoint changes", registry=r)
        self.endpoint_changes_total = Counter(
            "kubeproxy_sync_proxy_rules_endpoint_changes_total",
            ALPHA + "Cumulative proxy rules Endpoint changes", registry=r)
        self.service_changes_pending = Gauge(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            ALPHA + "Pending proxy rules Service changes", registry=r)
        self.service_changes_total = Counter(
            "kubeproxy_sync_proxy_rules_service_changes_total",
            ALPHA + "Cumulative proxy rules Service changes", registry=r)
        # a gauge despite its name, as upstream
        self.no_local_endpoints = Gauge(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            ALPHA + "Number of services with a Local traffic policy and no endpoints",
            ("traffic_policy", "ip_family"), registry=r)
        self.healthz_total = Counter(
            "kubeproxy_proxy_healthz_total", ALPHA + "Cumulative proxy healthz HTTP status",
            ("code",), registry=r)
        self.livez_total = Counter(
            "kubeproxy_proxy_livez_total", ALPHA + "Cumulative proxy livez HTTP status",
            ("code",), registry=r)
        # per family upstream since the metrics became dual-stack (like the histograms)
        self.iptables_restore_failures = Counter(
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
            ALPHA + "Cumulative proxy iptables restore failures", FAMILY, registry=r)
        # upstream gives no buckets of its own: those of the sync duration
        self.conntrack_sync_duration = Histogram(
            "kubeproxy_conntrack_reconciler_sync_duration_seconds",
            ALPHA + "ReconcileConntrackFlowsLatency latency in seconds", FAMILY,
            buckets=SYNC_BUCKETS, registry=r)
        self.conntrack_deleted = Counter(
            "kubeproxy_conntrack_reconciler_deleted_entries_total",
            ALPHA + "Cumulative conntrack flows deleted by conntrack reconciler", FAMILY,
            registry=r)
        # ipvsproxy's own
        self.operations = Counter(
            "ipvsproxy_operations_total",
            "Kernel operations applied by syncs (IPVS, ipset, iptables, addresses), by kind "
            "and result", ("kind", "result"), registry=r)
        self.syncs = Counter(
            "ipvsproxy_syncs_total", "Syncs, by mode (full or incremental) and result",
            ("mode", "result"), registry=r)
        self.virtual_servers = Gauge(
            "ipvsproxy_virtual_servers", "IPVS virtual servers programmed", registry=r)
        self.real_servers = Gauge(
            "ipvsproxy_real_servers", "IPVS real servers programmed", registry=r)
        self.drift_repaired = Counter(
            "ipvsproxy_drift_repaired_total",
            "Kernel operations a full sync needed although nothing changed in the cluster "
            "(someone else changed the kernel)", registry=r)
        self.invalid_objects = Gauge(
            "ipvsproxy_invalid_objects", "API objects (partly) ignored as invalid, by kind",
            ("kind",), registry=r)

    def set_service_stats_source(self, fn: Callable[[], Iterable[ServiceStats]]) -> None:
        """Export per service port IPVS counters, read with fn at each scrape."""
        if self._stats is None:
            self._stats = _ServiceStatsCollector(fn)
            self.registry.register(self._stats)
        else:
            self._stats.source = fn

    def render(self) -> bytes:
        """The Prometheus text exposition (format 0.0.4) of every metric."""
        return generate_latest(_WithoutCreated(self.registry))
