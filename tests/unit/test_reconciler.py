"""The reconciler loop's decisions (daemon/reconciler.py), with a recording stand-in for the
kernel shell: when it syncs fully or incrementally, what it reads back, how failures are
retried. What the operations do to a real kernel is proven in tests/kernel/test_daemon.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from structlog.testing import capture_logs

from ipvsproxy.core.desired import Desired, HostFacts, compute_desired
from ipvsproxy.core.ipvs import ObservedService, RealServer, ServiceKey
from ipvsproxy.core.plan import Observed, Plan, chains_after, diff
from ipvsproxy.daemon.reconciler import Reconciler
from ipvsproxy.daemon.store import Store
from ipvsproxy.kernel.dataplane import Failure
from ipvsproxy.settings.config import Config
from tests.unit.kube_objects import HOST, NODE, ep, node, service, slice_
from tests.unit.test_incremental import as_observed
from tests.unit.test_overlap import applied_to

CFG = Config(hostname=NODE, min_sync_period=0.0, sync_period=3600.0)


class Recorder:
    """Holds what was 'applied' as a desired state, and records every call."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.plans: list[Plan] = []
        self.fail_next = 0
        # a refused operation on one service's own objects; "iptables_restore" fails what every
        # service shares
        self.fail_kind = "ipvs_add_dest"
        self.state: Desired | None = None
        self.cleared: list[dict[ServiceKey, tuple[RealServer, ...]]] = []

    def host_facts(self) -> HostFacts:
        return HOST

    def observe(self, des: Desired, nft: bool = False) -> Observed:
        self.calls.append("observe" + (" nft" if nft else ""))
        self.state = des
        return Observed() if len(self.plans) == 0 else as_observed(self.state)

    def read_services(self, keys: Iterable[ServiceKey]) -> dict[ServiceKey, ObservedService]:
        ks = sorted(keys, key=str)
        self.calls.append(f"read {len(ks)}")
        assert self.state is not None
        obs = as_observed(self.state)
        return {k: obs.services[k] for k in ks if k in obs.services}

    def apply(self, plan: Plan, seconds: dict[str, float] | None = None) -> list[Any]:
        self.calls.append(f"apply {len(plan.lines())}")
        self.plans.append(plan)
        if self.fail_next:
            self.fail_next -= 1
            return [Failure("ipvsadm -a ..." if self.fail_kind.startswith("ipvs")
                            else "iptables-restore ...", "File exists", self.fail_kind)]
        return []

    def clear_udp(self, dests: Mapping[ServiceKey, tuple[RealServer, ...]],
                  keys: Iterable[ServiceKey], families: Iterable[int]) -> int:
        self.cleared.append({k: dests.get(k, ()) for k in keys})
        return 0


def cluster(n: int) -> Store:
    s = Store(NODE)
    s.replace("Service", [service(f"s{i}", f"10.96.0.{i}") for i in range(1, n + 1)])
    s.replace("EndpointSlice", [slice_(f"s{i}", ep(f"10.244.1.{i}", "node-b"))
                                for i in range(1, n + 1)])
    s.replace("Node", [node()])
    return s


def test_first_sync_is_full_then_changes_are_incremental() -> None:
    s, k = cluster(20), Recorder()
    r = Reconciler(CFG, s, kernel=k)
    assert r.sync_once(s.take(), full=False)  # nothing applied yet: full regardless
    assert k.calls == ["observe", f"apply {len(k.plans[0].lines())}"]
    assert r.last is not None and r.last.mode == "full"
    s.event("EndpointSlice", "MODIFIED",
            slice_("s7", ep("10.244.1.7", "node-b"), ep("10.244.9.9", "node-b")))
    k.calls.clear()
    assert r.sync_once(s.take(), full=False)
    assert k.calls == ["read 1", "apply 1"]
    assert k.plans[-1].lines() == ["ipvsadm -a -t 10.96.0.7:80 -r 10.244.9.9:80 -m -w 1"]
    assert r.last.mode == "incremental" and r.last.operations == {"ipvs_add_dest": 1}



def test_the_loop_waits_for_the_lists_without_spinning() -> None:
    # The lists queue every object as a change; the loop used to wait for changes before the
    # store was initialised, so it returned at once and spun beside the reflectors (106,000
    # turns in a 10,000-service list in the lab).
    s, k = Store(NODE), Recorder()
    s.list_page("Service", [service("a", "10.96.0.1")], first=True)
    s.list_done("Service")
    s.list_page("EndpointSlice", [slice_("a", ep("10.244.1.1", "node-b"))], first=True)
    turns = 0

    def counted(wait: Callable[[float], bool]) -> Callable[[float], bool]:
        def turn(timeout: float) -> bool:
            nonlocal turns
            turns += 1
            return wait(timeout)
        return turn

    s.wait_initialized = counted(s.wait_initialized)  # type: ignore[method-assign]
    s.wait = counted(s.wait)  # type: ignore[method-assign]
    r = Reconciler(CFG, s, kernel=k)
    stop = threading.Event()
    loop = threading.Thread(target=r.run, args=(stop,), daemon=True)
    loop.start()
    try:
        time.sleep(0.5)
        assert k.calls == [] and turns <= 4  # 0.2 s a turn
        s.list_done("EndpointSlice")
        s.replace("Node", [node()])
        deadline = time.monotonic() + 10
        while not k.calls and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        s.notify()
        loop.join(10)
    assert k.calls[:1] == ["observe"] and not loop.is_alive()

def test_a_failed_shared_operation_is_retried_by_a_full_sync() -> None:
    s, k = cluster(3), Recorder()
    r = Reconciler(CFG, s, kernel=k)
    r.sync_once(s.take(), full=True)
    k.fail_next, k.fail_kind = 1, "iptables_restore"
    s.event("Service", "DELETED", service("s2", "10.96.0.2"))
    changes = s.take()
    assert not r.sync_once(changes, full=False)
    assert r.applied is None  # the kernel is not as planned: read it all again next time
    assert r.sync_once(s.take(), full=False)
    assert r.last is not None and r.last.mode == "full"


def test_kube_proxy_is_looked_for_until_a_full_sync_applied_cleanly() -> None:
    s, k = cluster(3), Recorder()
    r = Reconciler(Config(hostname=NODE, min_sync_period=0.0, sync_period=3600.0,
                          adopt_kube_proxy=True), s, kernel=k)
    k.fail_next = 1
    r.sync_once(s.take(), full=True)
    r.sync_once(s.take(), full=True)  # the first one failed in part: look again
    r.sync_once(s.take(), full=True)  # it applied cleanly: nothing of kube-proxy's is left
    assert [c for c in k.calls if c.startswith("observe")] == ["observe nft", "observe nft",
                                                               "observe"]
    s2, k2 = cluster(3), Recorder()
    r2 = Reconciler(CFG, s2, kernel=k2)  # without the flag, never
    r2.sync_once(s2.take(), full=True)
    assert k2.calls[0] == "observe"


def test_a_refused_operation_on_one_service_fails_neither_the_sync_nor_health() -> None:
    """Issue 32, item 6: the kernel refusing one tenant's virtual server made every sync
    failed and full, and /healthz and /livez 503 on every node after two sync periods. Now the
    failure is logged and counted, the sync counts as done (kube-proxy's health says whether
    syncs run), and the next change is still incremental."""
    from ipvsproxy.daemon.health import Health

    now = [1000.0]
    s, k = cluster(3), Recorder()
    health = Health((4,), sync_period=30.0, clock=lambda: now[0])
    r = Reconciler(CFG, s, health=health, kernel=k)
    assert r.sync_once(s.take(), full=True)
    k.fail_next = 1  # ipvs_add_dest
    s.event("EndpointSlice", "MODIFIED",
            slice_("s1", ep("10.244.1.1", "node-b"), ep("10.244.9.9", "node-b")))
    health.queued_update(4)
    assert r.sync_once(s.take(), full=False)
    assert r.applied is not None and r.failures_in_a_row == 0
    now[0] += 3 * 30.0  # three sync periods later, nothing else queued: still healthy
    assert health.healthz()[0] == 200 and health.livez()[0] == 200
    s.event("EndpointSlice", "MODIFIED", slice_("s2", ep("10.244.1.2", "node-b"),
                                                 ep("10.244.9.8", "node-b")))
    assert r.sync_once(s.take(), full=False)
    assert r.last is not None and r.last.mode == "incremental"


def test_an_exception_in_a_sync_does_not_end_the_loop() -> None:
    s, k = cluster(2), Recorder()
    boom = {"n": 1}

    def observe(des: Desired, nft: bool = False) -> Observed:
        if boom["n"]:
            boom["n"] -= 1
            raise OSError(19, "No such device")
        return Observed()

    k.observe = observe  # type: ignore[method-assign]
    r = Reconciler(Config(hostname=NODE, min_sync_period=0.0, sync_period=3600.0), s, kernel=k)
    stop = threading.Event()
    t = threading.Thread(target=r.run, args=(stop,), daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while r.syncs < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    s.notify()
    t.join(10)
    assert r.syncs >= 1 and not t.is_alive()


def test_bursts_coalesce_into_one_sync() -> None:
    s, k = cluster(5), Recorder()
    r = Reconciler(Config(hostname=NODE, min_sync_period=0.5, sync_period=3600.0), s,
                   kernel=k)
    stop = threading.Event()
    t = threading.Thread(target=r.run, args=(stop,), daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while r.syncs < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    for i in range(1, 6):  # five changes inside the min-sync-period window
        s.event("EndpointSlice", "MODIFIED", slice_(f"s{i}", ep(f"10.244.2.{i}", "node-b")))
    while r.syncs < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    s.notify()
    t.join(10)
    assert r.syncs == 2
    assert r.last is not None and r.last.mode == "incremental"
    assert r.last.operations == {"ipvs_add_dest": 5, "ipvs_del_dest": 5}


def test_removed_udp_endpoints_have_their_flows_cleared_tcp_ones_do_not() -> None:
    s, k = Store(NODE), Recorder()
    dns = {"name": "dns", "port": 53, "protocol": "UDP"}
    s.replace("Service", [service("dns", "10.96.0.53", dns), service("web", "10.96.0.80")])
    s.replace("EndpointSlice", [
        slice_("dns", ep("10.244.1.1", "node-b"), ep("10.244.1.2", "node-b"), port=53,
               port_name="dns", proto="UDP"),
        slice_("web", ep("10.244.1.1", "node-b"), ep("10.244.1.2", "node-b"))])
    s.replace("Node", [node()])
    r = Reconciler(CFG, s, kernel=k)
    assert r.sync_once(s.take(), full=True)
    k.cleared.clear()
    s.event("EndpointSlice", "MODIFIED", slice_("dns", ep("10.244.1.1", "node-b"), port=53,
                                                port_name="dns", proto="UDP"))
    s.event("EndpointSlice", "MODIFIED", slice_("web", ep("10.244.1.1", "node-b")))
    assert r.sync_once(s.take(), full=False)
    # one call, for the UDP virtual server only, with the real servers that stay
    [cleared] = k.cleared
    [(key, dests)] = cleared.items()
    assert (str(key.addr), key.port, key.protocol.name) == ("10.96.0.53", 53, "UDP")
    assert [str(d.key) for d in dests] == ["10.244.1.1:53"]


def test_names_are_published_after_syncs_and_follow_changes(tmp_path: Any) -> None:
    from ipvsproxy import names

    s, k = cluster(3), Recorder()
    r = Reconciler(CFG, s, kernel=k)
    r.names = names.Publisher(tmp_path / "services")
    r.sync_once(s.take(), full=True)
    got = names.read(tmp_path / "services")
    assert {str(key): owner for key, owner in got.items()} == {
        f"TCP 10.96.0.{i}:80": f"default/s{i}" for i in (1, 2, 3)}  # an unnamed port
    s.event("Service", "DELETED", service("s2", "10.96.0.2"))
    assert r.sync_once(s.take(), full=False) and r.last is not None
    assert r.last.mode == "incremental"
    assert sorted(map(str, names.read(tmp_path / "services"))) == [
        "TCP 10.96.0.1:80", "TCP 10.96.0.3:80"]


def test_names_are_not_rebuilt_when_no_owner_changed(tmp_path: Any) -> None:
    """Only a change of owners (or of foreign keys) writes the names file again: an endpoint
    change at 10k services must not copy and filter every owner."""
    from ipvsproxy import names

    calls: list[int] = []

    class Counting(names.Publisher):
        def publish(self, owners: Any) -> bool:
            calls.append(len(owners))
            return super().publish(owners)

    s, k = cluster(3), Recorder()
    r = Reconciler(CFG, s, kernel=k)
    r.names = Counting(tmp_path / "services")
    r.sync_once(s.take(), full=True)
    assert calls == [3]
    s.event("EndpointSlice", "MODIFIED", slice_("s1", ep("10.244.1.9", "node-b")))
    assert r.sync_once(s.take(), full=False) and r.last is not None
    assert r.last.mode == "incremental" and calls == [3]  # endpoints only: no rebuild
    s.event("Service", "DELETED", service("s2", "10.96.0.2"))
    assert r.sync_once(s.take(), full=False)
    assert calls == [3, 2]


def test_toggling_a_colliding_external_ip_is_incremental() -> None:
    """Issue 32, item 7: a tenant toggling an externalIP that collides with another Service's
    ClusterIP made every other sync full. Now each toggle recomputes and reads back only the
    two services' virtual servers, and leaves the kernel as a full sync would."""
    s, k = cluster(20), Recorder()
    r = Reconciler(CFG, s, kernel=k)
    assert r.sync_once(s.take(), full=True)
    for i in range(4):
        ext = ["10.96.0.3"] if i % 2 == 0 else []  # s3's ClusterIP
        s.event("Service", "MODIFIED", service("s9", "10.96.0.9", externalIPs=ext))
        k.calls.clear()
        assert r.sync_once(s.take(), full=False)
        assert r.last is not None and r.last.mode == "incremental"
        assert k.calls[0] == "read 2"  # s9's and s3's ClusterIP virtual servers
        full = compute_desired(s.snapshot(), HOST, CFG)
        assert r.applied is not None and r.applied.owners == dict(full.owners)


def unmodelled_as_asked(kernel: Observed, des: Desired) -> Observed:
    """The model's IPVS, set members and addresses; the link, sets, sysctls and chains as
    `des` asks (not modelled)."""
    return replace(kernel, link=True, sysctls=dict(des.sysctls), chains=chains_after(des.rules),
                   timeouts=des.timeouts, specs={s.name: s for s in des.specs},
                   sets={s.name: kernel.sets.get(s.name, frozenset()) for s in des.specs})


class KernelModel(Recorder):
    """A kernel that holds what the plans did (tests/unit/test_overlap.py's model); `gate`,
    when set, holds a full sync's read until it is opened."""

    def __init__(self) -> None:
        super().__init__()
        self.kernel = Observed()
        self.gate: threading.Event | None = None
        self.reading = threading.Event()

    def observe(self, des: Desired, nft: bool = False) -> Observed:
        self.calls.append("observe")
        if self.gate is not None:
            self.reading.set()
            assert self.gate.wait(20)
        return unmodelled_as_asked(self.kernel, des)

    def read_services(self, keys: Iterable[ServiceKey]) -> dict[ServiceKey, ObservedService]:
        ks = list(keys)
        self.calls.append(f"read {len(ks)}")
        return {k: self.kernel.services[k] for k in ks if k in self.kernel.services}

    def apply(self, plan: Plan, seconds: dict[str, float] | None = None) -> list[Any]:
        self.calls.append(f"apply {len(plan.lines())}")
        self.plans.append(plan)
        self.kernel = applied_to(self.kernel, plan)
        return []


def test_changes_are_applied_while_a_periodic_full_sync_is_read() -> None:
    """At 50,000 services a full sync outlasted its 30 s period and every change waited behind
    it (p50 39 s). Now the periodic one is read on a thread of its own: a change arriving
    meanwhile is applied at once, and the full sync's plan, made from a desired state older
    than the change and a kernel read after it, does not undo it."""
    s, k = cluster(5), KernelModel()
    r = Reconciler(Config(hostname=NODE, min_sync_period=0.0, sync_period=0.2), s, kernel=k)
    stop = threading.Event()
    t = threading.Thread(target=r.run, args=(stop,), daemon=True)

    def until(cond: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 20
        while not cond() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cond()

    t.start()
    try:
        until(lambda: r.syncs >= 1)  # the first full sync, blocking
        k.gate = gate = threading.Event()
        until(k.reading.is_set)  # a periodic one is being read, and holds
        s.event("EndpointSlice", "MODIFIED",
                slice_("s3", ep("10.244.1.3", "node-b"), ep("10.244.9.9", "node-b")))
        until(lambda: r.last is not None and r.last.mode == "incremental")
        assert not gate.is_set() and r.reading is not None  # the read still holds
        assert any(str(d.dest.key) == "10.244.9.9:80" for svc in k.kernel.services.values()
                   for d in svc.dests)
        syncs = r.syncs
        k.gate = None
        gate.set()
        until(lambda: r.syncs > syncs and r.last is not None and r.last.mode == "full")
    finally:
        stop.set()
        s.notify()
        t.join(10)
    # the full plan left the change alone, and the kernel is what the store says
    assert not any("10.244.9.9" in line for line in k.plans[-1].lines())
    des = compute_desired(s.snapshot(), HOST, r.cfg)
    left = diff(des, unmodelled_as_asked(k.kernel, des)).steps
    assert not left, left


class Timed(KernelModel):
    """Its apply says it spent 0.5 s on IPVS work."""

    def apply(self, plan: Plan, seconds: dict[str, float] | None = None) -> list[Any]:
        if seconds is not None:
            seconds["apply_ipvs"] = seconds.get("apply_ipvs", 0.0) + 0.5
        return super().apply(plan, seconds)


def test_a_full_sync_says_where_its_time_went() -> None:
    s, k = cluster(3), Timed()
    ticks = iter(range(1000))
    r = Reconciler(CFG, s, kernel=k, clock=lambda: float(next(ticks)))
    with capture_logs() as logs:
        assert r.sync_once(s.take(), full=True)
    assert r.last is not None
    phases = r.last.phases
    # a clock that ticks one second a call: one tick from each lap to the next
    assert phases["host"] == phases["desired"] == phases["observe"] == 1.0
    assert phases["apply_ipvs"] == 0.5 and phases["diff"] >= 1.0 and phases["index"] >= 1.0
    assert list(phases) == ["host", "desired", "observe", "diff", "apply_ipvs", "index"]
    line = next(e for e in logs if e["event"] == "sync")
    assert line["mode"] == "full" and line["phases"] == phases
    s.event("EndpointSlice", "MODIFIED", slice_("s2", ep("10.244.9.9", "node-b")))
    with capture_logs() as logs:
        assert r.sync_once(s.take(), full=False)
    assert r.last.mode == "incremental" and r.last.phases == {}
    assert "phases" not in next(e for e in logs if e["event"] == "sync")


def test_a_periodic_full_sync_read_beside_changes_keeps_its_phases() -> None:
    s, k = cluster(3), Timed()
    r = Reconciler(Config(hostname=NODE, min_sync_period=0.0, sync_period=0.1), s, kernel=k)
    stop = threading.Event()
    t = threading.Thread(target=r.run, args=(stop,), daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 20
        while r.syncs < 2 and time.monotonic() < deadline:  # the first, then a periodic one
            time.sleep(0.01)
    finally:
        stop.set()
        s.notify()
        t.join(10)
    assert r.syncs >= 2 and r.last is not None and r.last.mode == "full"
    assert set(r.last.phases) == {"host", "desired", "observe", "diff", "apply_ipvs", "index"}
    assert r.last.phases["apply_ipvs"] == 0.5
