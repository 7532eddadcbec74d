"""A full sync read beside incremental syncs (core/overlap.py): its plan, without what they
touched, neither undoes them nor leaves the kernel short of what a blocking full sync would.

The kernel is modelled as the Observed it would be read back as, and plans are applied to that
model step by step (pure logic: the real kernel is in tests/kernel/test_daemon.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ipvsproxy.core.cluster import build_snapshot
from ipvsproxy.core.desired import compute_desired
from ipvsproxy.core.incremental import Applied
from ipvsproxy.core.ipvs import ObservedDest, ObservedService, OpKind
from ipvsproxy.core.overlap import Touched, without
from ipvsproxy.core.plan import (
    Address,
    Ipvs,
    Observed,
    Plan,
    SetMembers,
    chains_after,
    diff,
    owned_entry,
)
from tests.unit.kube_objects import CFG, HOST, NODE
from tests.unit.test_incremental import as_observed, cluster, counts, docs_of, mini, svc_doc


def applied_to(obs: Observed, plan: Plan) -> Observed:
    """The kernel model once `plan` ran (its IPVS, set member and address steps)."""
    services = dict(obs.services)
    sets = {n: set(m) for n, m in obs.sets.items()}
    addresses = set(obs.addresses)
    for s in plan.steps:
        if isinstance(s, Ipvs):
            op = s.op
            assert op.service is not None
            key = op.service.key
            cur = services.get(key)
            if op.kind in (OpKind.ADD_SERVICE, OpKind.EDIT_SERVICE):
                services[key] = ObservedService(op.service, cur.dests if cur else ())
            elif op.kind is OpKind.DEL_SERVICE:
                del services[key]
            else:
                assert cur is not None and op.dest is not None
                dests = [d for d in cur.dests if d.dest.key != op.dest.key]
                if op.kind is not OpKind.DEL_DEST:  # newest first, as the kernel lists them
                    dests.insert(0, ObservedDest(op.dest))
                services[key] = cur._replace(dests=tuple(dests))
        elif isinstance(s, SetMembers):
            members = sets.setdefault(s.spec.name, set())
            (members.update if s.add else members.difference_update)(s.entries)
        elif isinstance(s, Address):
            (addresses.add if s.add else addresses.discard)(s.addr)
    return replace(obs, services=services, sets={n: frozenset(m) for n, m in sets.items()},
                   addresses=frozenset(addresses))


def drifted(obs: Observed, which: int) -> Observed:
    """Someone removed one virtual server, one set member or one address behind our back."""
    if which == 0 and obs.services:
        key = sorted(obs.services, key=str)[0]
        return replace(obs, services={k: v for k, v in obs.services.items() if k != key})
    if which == 1 and obs.addresses:
        return replace(obs, addresses=frozenset(sorted(obs.addresses, key=str)[1:]))
    name = next((n for n, m in sorted(obs.sets.items()) if m), None)
    if which == 2 and name is not None:
        return replace(obs, sets={**obs.sets, name: frozenset(sorted(obs.sets[name])[1:])})
    return obs


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_full_sync_read_beside_changes_neither_undoes_them_nor_misses_drift(
        data: st.DataObject) -> None:
    n = data.draw(st.integers(2, 6))
    old: list[list[dict[str, Any]] | None] = list(data.draw(cluster(n)))
    new = list(old)
    changed = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=3))
    for i in changed:
        new[i] = data.draw(st.one_of(st.none(), svc_doc(i)))
    read_first = data.draw(st.booleans())  # the kernel read before or after the incremental
    drift = data.draw(st.integers(0, 3))  # 3: none
    snap_old = build_snapshot(docs_of(old), NODE)
    snap_new = build_snapshot(docs_of(new), NODE)
    full_old = compute_desired(snap_old, HOST, CFG)
    full_new = compute_desired(snap_new, HOST, CFG)

    kernel = drifted(as_observed(full_old), drift)
    applied = Applied.from_full(full_old)
    reading = diff(full_old, kernel) if read_first else None  # desired read at the start

    # the incremental sync that runs meanwhile, on the state the last sync left
    dirty = {("default", f"s{i}") for i in changed}
    part, dirty = applied.settle(dirty, lambda ids: compute_desired(mini(snap_new, ids), HOST,
                                                                    CFG))
    scope = applied.scope(part, dirty)
    assert scope is not None
    inc = applied.plan(part, dirty, {k: kernel.services[k] for k in scope
                                     if k in kernel.services}, CFG)
    touched = Touched()
    touched.add([applied.index[s] for s in dirty if s in applied.index], part.index.values(),
                scope, inc)
    applied.commit(part, dirty, CFG, scope)
    kernel = applied_to(kernel, inc)
    after_inc = kernel
    if reading is None:
        reading = diff(full_old, kernel)

    plan = without(reading, touched)
    assume(plan is not None)  # a set refilled whole: the daemon runs a blocking full sync
    assert plan is not None
    kernel = applied_to(kernel, plan)

    # nothing the incremental made is undone
    for k in touched.keys:
        assert kernel.services.get(k) == after_inc.services.get(k)
    for a in touched.addresses:
        assert (a in kernel.addresses) == (a in after_inc.addresses)
    for name, e in touched.entries:
        assert (e in kernel.sets.get(name, ())) == (e in after_inc.sets.get(name, ()))
    # the applied state is the one a blocking full sync of the new cluster leaves
    rebuilt = Applied.from_full(full_old, reading.specs)
    rebuilt.commit(part, dirty, CFG, scope)
    assert counts(rebuilt) == counts(Applied.from_full(full_new))
    # and the kernel holds what it would, but for drift in what the incremental touched
    # (repaired by the next full sync), and chains (not modelled here)
    vs_entries = {owned_entry(k) for k in touched.keys}
    left = diff(full_new, replace(kernel, chains=chains_after(full_new.rules))).steps
    for s in left:
        if isinstance(s, Ipvs):
            assert s.op.service is not None and s.op.service.key in touched.keys, s
        elif isinstance(s, Address):
            assert s.addr in touched.addresses, s
        elif isinstance(s, SetMembers):  # the ownership records name virtual servers
            assert all((s.spec.name, e) in touched.entries or e in vs_entries
                       for e in s.entries), s
    if drift == 3:
        assert not left
