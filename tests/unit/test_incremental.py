"""Incremental syncs (core/incremental.py) against the full diff they stand in for.

The property: for a cluster and a change to some of its services, the incremental plan does to
the kernel exactly what the full `diff(compute_desired(new), kernel-as-old)` does, and the
reference counts after `commit` equal those indexed from the new full desired state. The kernel
is stood in by the old desired state read back as an Observed (pure logic: no kernel is faked).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ipvsproxy.core.cluster import Snapshot, build_snapshot
from ipvsproxy.core.desired import Desired, compute_desired
from ipvsproxy.core.incremental import Applied
from ipvsproxy.core.ipvs import ObservedDest, ObservedService, Protocol, ServiceKey
from ipvsproxy.core.plan import Ipvs, Observed, chains_after, diff
from tests.unit.kube_objects import CFG, HOST, NODE, ep, node, port, service, slice_

NODES = [NODE, "node-b"]


def as_observed(des: Desired, conns: int = 0) -> Observed:
    """What the kernel holds once `des` is applied (every real server with `conns`)."""
    services = {k: ObservedService(vs, tuple(ObservedDest(rs, conns) for rs in
                                             des.dests.get(k, ())))
                for k, vs in des.services.items()}
    return Observed(services, dict(des.sets), {s.name: s for s in des.specs}, True,
                    des.addresses, chains_after(des.rules), dict(des.sysctls), des.timeouts)


def mini(snap: Snapshot, dirty: set[tuple[str, str]]) -> Snapshot:
    return Snapshot(tuple(s for s in snap.services if (s.namespace, s.name) in dirty),
                    tuple(s for s in snap.slices if (s.namespace, s.service) in dirty),
                    snap.node)


def counts(a: Applied) -> tuple[Any, ...]:
    return (a.index, a.key_owner, +a.entry_refs, +a.set_sizes, +a.addr_refs, +a.out_filter,
            +a.no_local, a.rules, a.services, a.dest_counts, a.owners, a.real_servers)


@st.composite
def svc_doc(draw: st.DrawFn, i: int) -> list[dict[str, Any]]:
    name = f"s{i}"
    kind = draw(st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]))
    proto = draw(st.sampled_from(["TCP", "UDP"]))
    shared_lb = draw(st.booleans())  # services sharing one LB IP share its address
    extra: dict[str, Any] = {}
    if kind == "LoadBalancer" and draw(st.booleans()):
        extra["loadBalancerSourceRanges"] = ["203.0.113.0/24"]
    if kind != "ClusterIP" and draw(st.booleans()):
        extra["externalTrafficPolicy"] = "Local"
    ports = [port(80 + i, "p", proto, node_port=30000 + i if kind != "ClusterIP" else 0)]
    svc = service(name, f"10.96.0.{10 + i}", *ports, type_=kind,
                  ingress=[f"198.51.100.{1 if shared_lb else 10 + i}"]
                  if kind == "LoadBalancer" else None, **extra)
    pods = draw(st.lists(st.integers(1, 6), max_size=4, unique=True))
    # pods are shared between services: KUBE-LOOP-BACK members are shared too
    eps = [ep(f"10.244.1.{p}", NODES[p % 2]) for p in pods]
    return [svc, slice_(name, *eps, port=8080, proto=proto)]


@st.composite
def cluster(draw: st.DrawFn, n: int) -> list[list[dict[str, Any]]]:
    return [draw(svc_doc(i)) for i in range(n)]


def docs_of(svcs: list[list[dict[str, Any]] | None]) -> list[dict[str, Any]]:
    return [d for s in svcs if s for d in s] + [node(NODE, "192.168.1.10")]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_incremental_plan_equals_full_diff(data: st.DataObject) -> None:
    n = data.draw(st.integers(2, 6))
    old: list[list[dict[str, Any]] | None] = list(data.draw(cluster(n)))
    new = list(old)
    changed = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=3))
    for i in changed:
        new[i] = data.draw(st.one_of(st.none(), svc_doc(i)))  # None: the service is deleted
    conns = data.draw(st.sampled_from([0, 2]))
    snap_old = build_snapshot(docs_of(old), NODE)
    snap_new = build_snapshot(docs_of(new), NODE)
    full_old = compute_desired(snap_old, HOST, CFG)
    full_new = compute_desired(snap_new, HOST, CFG)
    dirty = {("default", f"s{i}") for i in changed}

    applied = Applied.from_full(full_old)
    part = compute_desired(mini(snap_new, dirty), HOST, CFG)
    scope = applied.scope(part, dirty)
    assert scope is not None  # no service here claims another's virtual server
    kernel_all = as_observed(full_old, conns)
    kernel = {k: kernel_all.services[k] for k in scope if k in kernel_all.services}
    inc = applied.plan(part, dirty, kernel, CFG)
    full = diff(full_new, as_observed(full_old, conns))

    assert not diff(full_old, as_observed(full_old, conns)).steps  # the stand-in is exact
    assert sorted(inc.lines()) == sorted(full.lines())
    assert sorted(inc.draining) == sorted(full.draining)
    applied.commit(part, dirty, CFG, scope)
    assert counts(applied) == counts(Applied.from_full(full_new))


def test_a_one_endpoint_change_touches_one_virtual_server() -> None:
    svcs: list[list[dict[str, Any]] | None] = [
        [service(f"s{i}", f"10.96.1.{i}", port(80)),
         slice_(f"s{i}", ep(f"10.244.2.{i}", NODE), port=8080)] for i in range(1, 200)]
    snap = build_snapshot(docs_of(svcs), NODE)
    before = compute_desired(snap, HOST, CFG)
    applied = Applied.from_full(before)
    svcs[41] = [service("s42", "10.96.1.42", port(80)),
                slice_("s42", ep("10.244.2.42", NODE), ep("10.244.3.1", "node-b"), port=8080)]
    dirty = {("default", "s42")}
    part = compute_desired(mini(build_snapshot(docs_of(svcs), NODE), dirty), HOST, CFG)
    scope = applied.scope(part, dirty)
    key = ServiceKey.inet(Protocol.TCP, snap.services[41].cluster_ips[0], 80)
    assert scope == {key}
    plan = applied.plan(part, dirty, {key: as_observed(before).services[key]}, CFG)
    assert plan.lines() == ["ipvsadm -a -t 10.96.1.42:80 -r 10.244.3.1:8080 -m -w 1"]


def test_a_conflict_falls_back_to_a_full_sync() -> None:
    a = [service("a", "10.96.0.1", port(80))]
    b = [service("b", "10.96.0.2", port(80), externalIPs=["10.96.0.1"])]
    snap = build_snapshot(docs_of([a, b]), NODE)
    full = compute_desired(snap, HOST, CFG)
    assert full.contested  # b's external IP is a's cluster IP: a wins
    applied = Applied.from_full(full)
    part = compute_desired(mini(snap, {("default", "a")}), HOST, CFG)
    assert applied.scope(part, {("default", "a")}) is None
    c = [service("c", "10.96.0.3", port(80), externalIPs=["10.96.0.2"])]
    snap2 = build_snapshot(docs_of([a, b, c]), NODE)
    part = compute_desired(mini(snap2, {("default", "c")}), HOST, CFG)
    assert applied.scope(part, {("default", "c")}) is None


def test_draining_is_reported_and_force_delete_deletes() -> None:
    svcs: list[list[dict[str, Any]] | None] = [
        [service("s1", "10.96.0.1", port(80)),
         slice_("s1", ep("10.244.1.1", "node-b"), ep("10.244.1.2", "node-b"), port=8080)]]
    full_old = compute_desired(build_snapshot(docs_of(svcs), NODE), HOST, CFG)
    svcs[0] = [service("s1", "10.96.0.1", port(80)),
               slice_("s1", ep("10.244.1.1", "node-b"), port=8080)]
    full_new = compute_desired(build_snapshot(docs_of(svcs), NODE), HOST, CFG)
    obs = as_observed(full_old, conns=3)
    drained = diff(full_new, obs)
    key = next(iter(full_new.services))
    assert [str(d) for k, d in drained.draining if k == key] == ["10.244.1.2:8080"]
    assert drained.lines() == ["ipvsadm -e -t 10.96.0.1:80 -r 10.244.1.2:8080 -m -w 0"]
    forced = diff(full_new, obs, force_delete=drained.draining)
    assert forced.lines() == ["ipvsadm -d -t 10.96.0.1:80 -r 10.244.1.2:8080"]
    assert not forced.draining
    assert all(isinstance(s, Ipvs) for s in forced.steps)
