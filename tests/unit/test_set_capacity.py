"""ipset capacity: sets sized from the desired state, resized when they outgrow their maxelem.

kube-proxy creates every set with `maxelem 65536` and fails to sync a cluster with more
ClusterIP:port pairs than that. Here a set keeps kube-proxy's 65536 until it needs more, then is
recreated larger and swapped in (the kernel cannot change maxelem in place), by the full diff
and by the incremental path alike. The kernel side is tests/kernel/test_sync.py's
test_more_than_65536_cluster_ip_ports.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

from ipvsproxy.core import tables as T
from ipvsproxy.core.cluster import build_snapshot
from ipvsproxy.core.desired import compute_desired, set_specs
from ipvsproxy.core.incremental import Applied
from ipvsproxy.core.ipset_text import SetSpec, capacity, render_create, temp_name
from ipvsproxy.core.plan import ResizeSet, SetMembers, diff, step_counts
from tests.unit.kube_objects import CFG, HOST, NODE, desired, ep, port, service, slice_
from tests.unit.test_incremental import as_observed, docs_of, mini
from tests.unit.test_plan import RICH, observed


def test_capacity_is_kube_proxys_until_half_full_then_twice_the_count() -> None:
    assert [capacity(n) for n in (0, 1, 32768)] == [65536] * 3
    assert capacity(32769) == 131072
    assert capacity(70000) == 262144
    assert all(capacity(n) >= 2 * n for n in (40000, 65537, 1_000_000))


def test_desired_sizes_each_set_from_its_members() -> None:
    members = frozenset(f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255},tcp:80" for i in range(70000))
    specs = {s.name: s for s in set_specs(4, {T.CLUSTER_IP: members})}
    assert specs[T.CLUSTER_IP].maxelem == 262144
    assert {s.maxelem for n, s in specs.items() if n != T.CLUSTER_IP and s.is_hash} == {65536}
    # an ordinary cluster gets exactly kube-proxy's sets: a node it ran on is taken over as is
    assert {s.maxelem for s in desired(*RICH).specs if s.is_hash} == {65536}


def _cluster_ip_spec(specs: tuple[SetSpec, ...]) -> SetSpec:
    return next(s for s in specs if s.name == T.CLUSTER_IP)


def test_a_set_too_small_is_refilled_whole_and_swapped_in() -> None:
    d = desired(*RICH)
    want = sorted(d.sets[T.CLUSTER_IP])
    assert len(want) > 2
    small = replace(_cluster_ip_spec(d.specs), maxelem=2)
    obs = observed(d, specs={**{s.name: s for s in d.specs}, T.CLUSTER_IP: small},
                   sets={**d.sets, T.CLUSTER_IP: frozenset(want[:1])})
    plan = diff(d, obs)
    resize = [s for s in plan.steps if isinstance(s, ResizeSet)]
    assert resize == [ResizeSet(_cluster_ip_spec(d.specs), tuple(want))]
    assert not [s for s in plan.steps if isinstance(s, SetMembers) and s.spec.name == T.CLUSTER_IP]
    tmp = temp_name(T.CLUSTER_IP)
    assert resize[0].lines() == [
        f"ipset {render_create(replace(_cluster_ip_spec(d.specs), name=tmp))}",
        *(f"ipset add {tmp} {e}" for e in want),
        f"ipset swap {tmp} {T.CLUSTER_IP}", f"ipset destroy {tmp}"]
    assert step_counts(plan.steps) == {"ipset_resize": 1}
    assert _cluster_ip_spec(plan.specs).maxelem == 65536


def test_a_set_larger_than_needed_keeps_its_size_and_is_named_as_it_is() -> None:
    # `ipset restore -exist` refuses a create line whose maxelem differs from the live set's
    d = desired(*RICH)
    big = replace(_cluster_ip_spec(d.specs), maxelem=1 << 20, hashsize=4096)
    want = sorted(d.sets[T.CLUSTER_IP])
    obs = observed(d, specs={**{s.name: s for s in d.specs}, T.CLUSTER_IP: big},
                   sets={**d.sets, T.CLUSTER_IP: frozenset(want[1:])})
    plan = diff(d, obs)
    assert [s for s in plan.steps if isinstance(s, SetMembers | ResizeSet)] == [
        SetMembers(big, True, (want[0],))]
    assert _cluster_ip_spec(plan.specs) == big


def _services(n: int) -> list[list[dict[str, object]] | None]:
    return [[service(f"s{i}", f"10.96.1.{i}", port(80)),
             slice_(f"s{i}", ep(f"10.244.2.{i}", NODE), port=8080)] for i in range(1, n + 1)]


def test_the_incremental_path_resizes_a_set_it_outgrows_like_the_full_diff() -> None:
    old = _services(4)
    new = [*old, *_services(5)[4:]]
    full_old = compute_desired(build_snapshot(docs_of(old), NODE), HOST, CFG)
    full_new = compute_desired(build_snapshot(docs_of(new), NODE), HOST, CFG)
    # the kernel's KUBE-CLUSTER-IP is exactly full: 4 members, maxelem 4
    tight = tuple(dataclasses.replace(s, maxelem=4) if s.name == T.CLUSTER_IP else s
                  for s in full_old.specs)
    kernel = replace(as_observed(full_old), specs={s.name: s for s in tight})
    applied = Applied.from_full(full_old, tight)
    dirty = {("default", "s5")}
    part = compute_desired(mini(build_snapshot(docs_of(new), NODE), dirty), HOST, CFG)
    scope = applied.scope(part, dirty)
    assert scope is not None
    inc = applied.plan(part, dirty, {}, CFG)
    full = diff(full_new, kernel)
    assert sorted(inc.lines()) == sorted(full.lines())
    resize = [s for s in inc.steps if isinstance(s, ResizeSet)]
    assert [(s.spec.name, s.spec.maxelem, len(s.entries)) for s in resize] == [
        (T.CLUSTER_IP, 65536, 5)]
    applied.commit(part, dirty, CFG, scope)
    assert _cluster_ip_spec(applied.specs).maxelem == 65536
    # the next change names the set at its new size, without resizing it again
    newer = [*new, *_services(6)[5:]]
    dirty = {("default", "s6")}
    part = compute_desired(mini(build_snapshot(docs_of(newer), NODE), dirty), HOST, CFG)
    plan = applied.plan(part, dirty, {}, CFG)
    adds = [s for s in plan.steps if isinstance(s, SetMembers) and s.spec.name == T.CLUSTER_IP]
    assert [(s.spec.maxelem, s.entries) for s in adds] == [(65536, ("10.96.1.6,tcp:80",))]
    assert not [s for s in plan.steps if isinstance(s, ResizeSet)]
