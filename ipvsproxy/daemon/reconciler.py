"""The reconciler loop: turns store changes into kernel operations, forever.

- Nothing is applied before Services, EndpointSlices and the Node have all been listed.
- Bursts of events coalesce: at least --ipvs-min-sync-period between the end of one sync and the
  start of the next.
- A change to some services is an incremental sync (core/incremental.py): only those services
  are recomputed, only their virtual servers are read back, only their kernel objects touched.
- Every --ipvs-sync-period, and after any failure, a full sync compares the whole desired state
  with the whole kernel and repairs drift (someone ran `ipvsadm -C`, flushed a chain...).
  Failures are retried with capped exponential backoff; no error ends the loop.
- The periodic full sync is read and diffed on a thread of its own (daemon/background.py) while
  incremental syncs go on; its plan is applied without what they touched (core/overlap.py). At
  50,000 services a full sync outlasts its period, and changes used to wait behind it.
- Graceful termination: removed TCP real servers with connections stay at weight 0 (diff) until
  they have none or --ipvs-graceful-termination-period has passed; UDP flows to removed real
  servers are cleared from conntrack after the sync (kube-proxy, §2.7 of the reference).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from socket import AF_INET, AF_INET6
from typing import Any, Protocol

import structlog

from ipvsproxy.core.desired import Desired, HostFacts, compute_desired
from ipvsproxy.core.gcpause import paused
from ipvsproxy.core.incremental import Applied
from ipvsproxy.core.ipvs import DestKey, ObservedService, RealServer, ServiceKey
from ipvsproxy.core.ipvs import Protocol as IpProto
from ipvsproxy.core.overlap import without
from ipvsproxy.core.plan import Ipvs, Observed, Plan, one_service, step_counts
from ipvsproxy.daemon.background import Reading, read_full
from ipvsproxy.daemon.laps import Laps, rounded
from ipvsproxy.daemon.store import Changes, Store
from ipvsproxy.settings.config import Config

log = structlog.get_logger("ipvsproxy.sync")
FAMILY_LABEL = {4: "IPv4", 6: "IPv6"}


class Kernel(Protocol):
    """The shell the loop drives (kernel/dataplane.py in production)."""

    def host_facts(self) -> HostFacts: ...
    def observe(self, des: Desired, nft: bool = False) -> Observed: ...
    def read_services(self, keys: Iterable[ServiceKey]) -> dict[ServiceKey, ObservedService]: ...
    def apply(self, plan: Plan, seconds: dict[str, float] | None = None) -> list[Any]: ...
    def clear_udp(self, dests: Mapping[ServiceKey, tuple[RealServer, ...]],
                  keys: Iterable[ServiceKey], families: Iterable[int]) -> int: ...


class NodeKernel:
    """The real one."""

    def host_facts(self) -> HostFacts:
        from ipvsproxy.kernel.host import host_facts

        return host_facts()

    def observe(self, des: Desired, nft: bool = False) -> Observed:
        from ipvsproxy.kernel import dataplane

        return dataplane.observe(des, nft)

    def read_services(self, keys: Iterable[ServiceKey]) -> dict[ServiceKey, ObservedService]:
        from ipvsproxy.kernel import dataplane

        return dataplane.read_services(keys)

    def apply(self, plan: Plan, seconds: dict[str, float] | None = None) -> list[Any]:
        from ipvsproxy.kernel import dataplane

        return dataplane.apply(plan, seconds)

    def clear_udp(self, dests: Mapping[ServiceKey, tuple[RealServer, ...]],
                  keys: Iterable[ServiceKey], families: Iterable[int]) -> int:
        from ipvsproxy.core.conntrack_filters import udp_filters
        from ipvsproxy.kernel.conntrack import clear_stale_udp

        filters = udp_filters(dests, keys)
        deleted = 0
        for fam in families:
            af = AF_INET if fam == 4 else AF_INET6
            mine = {k: v for k, v in filters.items() if k[0] == af}
            if mine:
                deleted += clear_stale_udp(mine, fam)
        return deleted


@dataclass(slots=True)
class SyncResult:
    mode: str  # "full" | "incremental"
    operations: dict[str, int] = field(default_factory=dict)
    failures: list[Any] = field(default_factory=list)
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # a full sync's (daemon/laps.py)


def _settle() -> None:
    """After a full sync: what it left alive (the store, the applied state) goes to the
    collector's permanent generation, so that no later collection walks it again (at 10,000
    services such a walk, tens of milliseconds under emulation, landed on single endpoint
    changes), and the C heap's free pages go back to the system (glibc malloc_trim)."""
    gc.collect()
    gc.freeze()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class Reconciler:
    def __init__(self, cfg: Config, store: Store, metrics: Any = None, health: Any = None,
                 kernel: Kernel | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.store = store
        self.metrics = metrics
        self.health = health
        self.kernel: Kernel = kernel or NodeKernel()
        self.clock = clock
        self.wall = wall
        self.applied: Applied | None = None
        self.host: HostFacts | None = None
        self.draining: dict[tuple[ServiceKey, DestKey], float] = {}  # -> since (clock)
        self.seen_problems: set[str] = set()
        self.failures_in_a_row = 0
        self.syncs = 0
        self.last: SyncResult | None = None
        self._totals = (0, 0)  # the store's change totals already counted in the metrics
        self.after_sync: Callable[[], None] | None = None  # e.g. health-check node ports
        self.names: Any = None  # a names.Publisher: who owns each virtual server, for ls/explain
        self.foreign: set[ServiceKey] = set()  # desired, but someone else's in the kernel
        # --adopt-kube-proxy: until a full sync has applied cleanly, kube-proxy's state is
        # looked for and adopted; after that none is left (its virtual servers adopted or
        # removed, chains replaced, nftables tables deleted), so later full syncs skip the
        # search (an `nft list tables` per sync). A restarted ipvsproxy looks again.
        self.taking_over = cfg.adopt_kube_proxy
        # what the names file was last written from (None: write at the next sync); without it
        # every sync would copy and filter the owners of all services (10k+) for nothing
        self._published: tuple[int, frozenset[ServiceKey]] | None = None
        self.reading: Reading | None = None  # a periodic full sync being read beside changes

    # --------------------------------------------------------------------------- the loop

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set() and not self.store.wait_initialized(0.2):
            pass
        next_full = self.clock()  # the first sync is a full one
        last_end = float("-inf")
        retry_at: float | None = None
        while not stop.is_set():
            reading = self.reading
            if reading is not None and reading.done:
                self.reading = None
                done = self._finish_reading(reading)
                if done is not None:  # else a blocking full sync ran meanwhile: nothing to do
                    last_end = self.clock()
                    retry_at = None if done else last_end + self._backoff()
                    if done:
                        next_full = last_end + self.cfg.sync_period
                continue
            now = self.clock()
            due = reading is None and (
                now >= next_full or (retry_at is not None and now >= retry_at))
            if not due and not self.store.pending_any():
                wake = min(next_full, retry_at if retry_at is not None else next_full)
                self.store.wait(1.0 if reading else min(max(wake - now, 0.01), 1.0))
                continue
            gap = last_end + self.cfg.min_sync_period - now
            if gap > 0:  # coalesce: changes arriving now join the coming sync
                stop.wait(gap)
                continue
            if due and retry_at is None and self.applied is not None and not self.taking_over:
                # the periodic full sync: read beside the changes that come meanwhile
                self.reading = Reading(self.kernel, self.store.snapshot, self.cfg,
                                       self._expired(), self.store.notify).start()
                continue
            changes = self.store.take()
            full = due or changes.full or self.applied is None
            ok = self.sync_once(changes, full)
            last_end = self.clock()
            if ok:
                retry_at = None
                if full:
                    next_full = last_end + self.cfg.sync_period
            else:  # then a full sync: it repairs whatever is left
                retry_at = last_end + self._backoff()

    def _backoff(self) -> float:
        """Capped exponential."""
        return min(2.0 ** min(self.failures_in_a_row, 10), self.cfg.sync_period)

    def sync_once(self, changes: Changes, full: bool) -> bool:
        """One sync; never raises. False when it failed (the changes are put back)."""
        t0 = self.clock()
        try:
            if not full and self.applied is not None:
                result = self._incremental(changes)
                if result is None:  # a conflict: only a full sync settles it
                    result = self._full(changes)
            else:
                result = self._full(changes)
        except Exception as exc:
            self.failures_in_a_row += 1
            self.store.requeue(changes)
            self.applied = None  # next time, start again from the kernel's state
            log.error("sync failed", error=str(exc) or type(exc).__name__, exc_info=True)
            self._count_sync("full" if full else "incremental", False)
            return False
        result.seconds = self.clock() - t0
        self.last = result
        self.syncs += 1
        # A refused operation on one service's own objects is logged and counted, and the next
        # full sync tries it again, as kube-proxy does; only a failure of what all services
        # share (sets, rules, link, sysctls) fails the sync: health, backoff, a full re-read.
        ok = all(one_service(f.kind) for f in result.failures)
        self.failures_in_a_row = 0 if ok else self.failures_in_a_row + 1
        if not ok:
            self.applied = None  # the kernel is not what was planned: re-read it next time
        self._after(changes, result, ok)
        return ok

    # -------------------------------------------------------------------------- the syncs

    def _full(self, changes: Changes) -> SyncResult:
        # Millions of objects and no cycles: the cyclic collector would only walk the growing
        # heap again and again (as for `sync --once`, see commands/sync.py).
        collecting = gc.isenabled()
        if self.reading is not None:  # what it reads is older than this sync: dropped
            self.reading.stop()
        try:
            with paused():
                return self._full_sync(changes)
        finally:
            if collecting:
                _settle()

    def _full_sync(self, changes: Changes) -> SyncResult:
        laps = Laps(self.clock)
        read = read_full(self.kernel, self.store.snapshot, self.cfg, self._expired,
                         self.taking_over, laps)
        self.host, des, plan = read.host, read.des, read.plan
        if plan.adopted or plan.replaced_chains or read.nft_tables:
            log.info("taking over from kube-proxy", virtual_servers=len(plan.adopted),
                     iptables_chains=plan.replaced_chains, nftables=sorted(read.nft_tables))
        failures = self.kernel.apply(plan, laps.seconds)
        laps.restart()
        if not failures:
            self.taking_over = False
        self._track_draining(plan, None)
        self.foreign = set(plan.foreign)
        self.applied = Applied.from_full(des, plan.specs)
        laps.lap("index")
        self._published = None
        self._report(des.problems + plan.problems)
        result = SyncResult("full", step_counts(plan.steps), failures, phases=laps.seconds)
        if not changes and self.metrics is not None and plan.steps:
            self.metrics.drift_repaired.inc(sum(result.operations.values()))
        self._clear_udp(plan, des.dests)
        return result

    def _incremental(self, changes: Changes) -> SyncResult | None:
        assert self.applied is not None and self.host is not None
        host, cfg, store = self.host, self.cfg, self.store
        # with the services whose claims meet these: who wins a contested address is settled
        # here as a full sync would settle it
        part, dirty = self.applied.settle(
            changes.dirty, lambda ids: compute_desired(store.snapshot(ids), host, cfg))
        scope = self.applied.scope(part, dirty)
        if scope is None:
            return None
        kernel = self.kernel.read_services(scope)
        plan = self.applied.plan(part, dirty, kernel, self.cfg, self._expired())
        failures = self.kernel.apply(plan)
        self._track_draining(plan, scope)
        self.foreign = {k for k in self.foreign if k not in scope} | set(plan.foreign)
        if self.reading is not None:
            before = [self.applied.index[s] for s in dirty if s in self.applied.index]
            self.reading.touched.add(before, part.index.values(), scope, plan)
            self.reading.parts.append((part, dirty, scope))
        self.applied.commit(part, dirty, self.cfg, scope)
        self._report(part.problems + plan.problems, partial=True)
        self._clear_udp(plan, part.dests)
        return SyncResult("incremental", step_counts(plan.steps), failures)

    def _finish_reading(self, reading: Reading) -> bool | None:
        """Apply a periodic full sync read beside incremental syncs (daemon/background.py):
        its plan without what they touched, then the applied state it leaves, their parts
        committed over it in order. None: it was stale (a blocking full sync ran meanwhile, or
        is due after a failure), nothing done; else whether it went."""
        if reading.stopped or self.applied is None:
            return None
        res = reading.result
        if res is None:
            exc = reading.error
            self.failures_in_a_row += 1
            log.error("sync failed", error=str(exc) or type(exc).__name__, exc_info=exc)
            self._count_sync("full", False)
            return False
        touched = reading.touched
        plan = without(res.plan, touched)
        if plan is None or (touched and res.host != self.host):
            log.info("full sync read beside changes it cannot be told apart from: blocking")
            return self.sync_once(Changes(), True)
        t0 = self.clock()
        laps = Laps(self.clock)
        laps.add(reading.phases)
        try:
            with paused():
                failures = self.kernel.apply(plan, laps.seconds)
                laps.restart()
                applied = Applied.from_full(res.des, plan.specs)
                for part, dirty, scope in reading.parts:
                    applied.commit(part, dirty, self.cfg, scope)
                laps.lap("index")
        except Exception as exc:
            self.failures_in_a_row += 1
            self.applied = None
            log.error("sync failed", error=str(exc) or type(exc).__name__, exc_info=True)
            self._count_sync("full", False)
            return False
        self.host = res.host
        self._track_draining(plan, None, keep=touched.keys)
        self.foreign = {k for k in self.foreign if k in touched.keys} | set(plan.foreign)
        self.applied = applied
        self._published = None
        self._report(res.des.problems + plan.problems)
        result = SyncResult("full", step_counts(plan.steps), failures,
                            reading.seconds + self.clock() - t0, laps.seconds)
        if self.metrics is not None and plan.steps and not touched:
            self.metrics.drift_repaired.inc(sum(result.operations.values()))
        self._clear_udp(plan, res.des.dests)
        self.last = result
        self.syncs += 1
        ok = all(one_service(f.kind) for f in failures)
        self.failures_in_a_row = 0 if ok else self.failures_in_a_row + 1
        if not ok:
            self.applied = None
        self._after(Changes(), result, ok)
        _settle()
        return ok

    # ----------------------------------------------------------------------------- helpers

    def _expired(self) -> frozenset[tuple[ServiceKey, DestKey]]:
        """Draining real servers past --ipvs-graceful-termination-period: deleted even with
        connections (NFS-like clients would otherwise pin them forever)."""
        limit = self.clock() - self.cfg.graceful_termination_period
        return frozenset(k for k, since in self.draining.items() if since <= limit)

    def _track_draining(self, plan: Plan, scope: set[ServiceKey] | None,
                        keep: Collection[ServiceKey] = ()) -> None:
        """`scope`: the virtual servers the plan was made for (None: all), `keep`: but not
        these (incremental syncs, since, decided about them)."""
        now = self.clock()
        still = set(plan.draining)
        for k in list(self.draining):
            if (scope is None or k[0] in scope) and k[0] not in keep and k not in still:
                del self.draining[k]
        for k in still:
            self.draining.setdefault(k, now)

    def _clear_udp(self, plan: Plan, dests: Mapping[ServiceKey, tuple[RealServer, ...]]) -> None:
        """After real servers of UDP virtual servers changed, flows still pinned (in conntrack)
        to removed ones are deleted, as kube-proxy does: UDP has no end of connection."""
        keys = {s.op.service.key for s in plan.steps if isinstance(s, Ipvs)
                and s.op.service is not None and s.op.service.key.protocol is IpProto.UDP}
        if not keys:
            return
        try:
            t0 = self.clock()
            n = self.kernel.clear_udp(dests, keys, self.cfg.families)
            if self.metrics is not None:
                for fam in self.cfg.families:
                    lbl = FAMILY_LABEL[fam]
                    self.metrics.conntrack_sync_duration.labels(ip_family=lbl).observe(
                        self.clock() - t0)
                    self.metrics.conntrack_deleted.labels(ip_family=lbl).inc(n)
        except Exception as exc:  # stale flows are a nuisance, not a reason to fail the sync
            log.warning("conntrack cleanup failed", error=str(exc))

    def _report(self, problems: Iterable[Any], partial: bool = False) -> None:
        """Log each problem once (not at every sync)."""
        now = {str(p) for p in problems}
        for p in sorted(now - self.seen_problems):
            log.warning("not programmed", problem=p)
        self.seen_problems = self.seen_problems | now if partial else now

    def _count_sync(self, mode: str, ok: bool) -> None:
        if self.metrics is not None:
            self.metrics.syncs.labels(mode=mode, result="ok" if ok else "failed").inc()

    def _after(self, changes: Changes, result: SyncResult, ok: bool) -> None:
        """Logs, metrics and health after a sync."""
        failed: dict[str, int] = {}
        for f in result.failures:
            failed[f.kind] = failed.get(f.kind, 0) + f.count
            log.error("operation failed", operation=f.what, error=f.error)
        applied = self.applied
        more = {"phases": rounded(result.phases)} if result.phases else {}
        log.info("sync", mode=result.mode, services=len(changes.dirty) if result.mode ==
                 "incremental" else (len(applied.index) if applied else None),
                 operations=sum(result.operations.values()),
                 failed=sum(failed.values()), seconds=round(result.seconds, 3), **more)
        wall = self.wall()
        if ok and self.health is not None:
            for fam in self.cfg.families:
                self.health.updated(fam)
        if self.after_sync is not None:
            try:
                self.after_sync()
            except Exception as exc:
                log.warning("after-sync hook failed", error=str(exc))
        if self.names is not None and applied is not None:
            source = (applied.owners_version, frozenset(self.foreign))
            try:
                if source != self._published:
                    self.names.publish({k: v for k, v in applied.owners.items()
                                        if k not in self.foreign})
                    self._published = source
            except OSError as exc:  # names are for people; the dataplane does not need them
                log.warning("cannot publish service names", error=str(exc))
        m = self.metrics
        if m is None:
            return
        self._count_sync(result.mode, ok)
        for kind, n in result.operations.items():
            bad = failed.get(kind, 0)
            if n - bad > 0:
                m.operations.labels(kind=kind, result="ok").inc(n - bad)
            if bad:
                m.operations.labels(kind=kind, result="failed").inc(bad)
        for phase, seconds in result.phases.items():
            m.sync_phase.labels(phase=phase).observe(seconds)
        for fam in self.cfg.families:
            lbl = FAMILY_LABEL[fam]
            m.sync_duration.labels(ip_family=lbl).observe(result.seconds)
            if ok:
                m.last_sync.labels(ip_family=lbl).set(wall)
            for t in changes.trigger_times:
                if t > 0:
                    m.network_programming.labels(ip_family=lbl).observe(max(wall - t, 0.0))
        if applied is not None:
            m.virtual_servers.set(len(applied.services))
            m.real_servers.set(applied.real_servers)
            for fam in self.cfg.families:
                for policy in ("internal", "external"):
                    m.no_local_endpoints.labels(traffic_policy=policy,
                                                ip_family=FAMILY_LABEL[fam]).set(
                        applied.no_local.get((policy, fam), 0))
        totals = (self.store.service_changes_total, self.store.endpoint_changes_total)
        m.service_changes_total.inc(totals[0] - self._totals[0])
        m.endpoint_changes_total.inc(totals[1] - self._totals[1])
        self._totals = totals
        svc_pending, ep_pending = self.store.pending()
        m.service_changes_pending.set(svc_pending)
        m.endpoint_changes_pending.set(ep_pending)
        for kind, n in self.store.invalid_counts().items():
            m.invalid_objects.labels(kind=kind).set(n)
