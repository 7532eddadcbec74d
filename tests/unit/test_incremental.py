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
    # Claims that collide (issue 32, item 7): a port of a few, externalIPs and ingress IPs
    # from a small pool holding the other services' ClusterIPs and LoadBalancer IPs, and
    # creation times that decide ties
    p = draw(st.sampled_from([80 + i, 80, 443]))
    ports = [port(p, "p", proto, node_port=30000 + i if kind != "ClusterIP" else 0)]
    pool = [f"10.96.0.{10 + j}" for j in range(3)] + ["198.51.100.1", "198.51.100.11",
                                                      "203.0.113.9"]
    if draw(st.booleans()):
        extra["externalIPs"] = draw(st.lists(st.sampled_from(pool), max_size=2, unique=True))
    ingress = [f"198.51.100.{1 if shared_lb else 10 + i}"]
    if draw(st.booleans()):
        ingress = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2, unique=True))
    svc = service(name, f"10.96.0.{10 + i}", *ports, type_=kind,
                  ingress=ingress if kind == "LoadBalancer" else None, **extra)
    if (t := draw(st.sampled_from([None, "2024-01-01T00:00:00Z", "2025-01-01T00:00:00Z"]))):
        svc["metadata"]["creationTimestamp"] = t
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
    part, dirty = applied.settle(dirty, lambda ids: compute_desired(mini(snap_new, ids), HOST,
                                                                    CFG))
    scope = applied.scope(part, dirty)
    assert scope is not None  # settle() took in every service whose claims meet these
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


def test_a_collision_is_settled_by_the_services_in_it_not_a_full_sync() -> None:
    """Issue 32, item 7: b's externalIP is a's ClusterIP (a wins); a change to a recomputes a
    and b, and a new c claiming b's ClusterIP recomputes the three, never the 50 others; the
    plan is the full diff's."""
    a = [service("a", "10.96.0.1", port(80))]
    b = [service("b", "10.96.0.2", port(80), externalIPs=["10.96.0.1"])]
    others = [[service(f"o{i}", f"10.96.3.{i}", port(80))] for i in range(50)]
    snap = build_snapshot(docs_of([a, b, *others]), NODE)
    full = compute_desired(snap, HOST, CFG)
    applied = Applied.from_full(full)
    assert applied.lost_by == {next(k for k in full.services if str(k) == "TCP 10.96.0.1:80"):
                               {("default", "b")}}
    a2 = [service("a", "10.96.0.1", port(81))]  # a lets go of port 80: b's externalIP wins it
    c = [service("c", "10.96.0.3", port(80), externalIPs=["10.96.0.2"])]
    for change, dirty, together in (
            ([a2, b, *others], {("default", "a")}, {("default", "a"), ("default", "b")}),
            # c claims b's ClusterIP, and b claims a's: all three, none of the 50 others
            ([a, b, c, *others], {("default", "c")},
             {("default", "a"), ("default", "b"), ("default", "c")})):
        snap2 = build_snapshot(docs_of(change), NODE)
        part, ids = applied.settle(
            dirty, lambda ids, snap2=snap2: compute_desired(mini(snap2, ids), HOST, CFG))
        assert ids == together
        scope = applied.scope(part, ids)
        assert scope is not None
        kernel = as_observed(full).services
        inc = applied.plan(part, ids, {k: kernel[k] for k in scope if k in kernel}, CFG)
        want = diff(compute_desired(snap2, HOST, CFG), as_observed(full))
        assert sorted(inc.lines()) == sorted(want.lines())


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
