"""Incremental syncs: what the daemon last applied, indexed per Service, and the plan for a few
changed Services without recomputing or re-reading the other 10,000. Pure (no I/O).

`Applied.from_full(des)` indexes a full desired state (what a full sync made the kernel hold).
For a change to some services, `part` is `compute_desired` over just those services (and their
EndpointSlices): `applied.scope(part, dirty)` names the virtual servers to read back from the
kernel (their real servers' connection counts decide draining), `applied.plan(...)` runs the
ordinary `diff` over that slice of the state, and `applied.commit(...)` records the result.

Set members and kube-ipvs0 addresses can be shared between services (two services selecting the
same pod port share a KUBE-LOOP-BACK member; services sharing a LoadBalancer IP share its
address), so they are reference-counted: a member is removed only when no service uses it.

A virtual server several services claim (core/desired.py settles who wins) is settled
incrementally too: `rivals` names the other services that claimed, or claim, what the changed
ones claim, and the caller recomputes those with them, until no claim reaches outside. So a
collision costs what a change to the services in it costs, never a full sync (a tenant toggling
a colliding externalIP used to make every other sync full).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Any

from ipvsproxy.core import tables as T
from ipvsproxy.core.desired import Desired, ServiceIndex, family_rules
from ipvsproxy.core.ipset_text import SetSpec, capacity
from ipvsproxy.core.ipvs import DestKey, ObservedService, ServiceKey, VirtualServer
from ipvsproxy.core.plan import Observed, Plan, chains_after, diff
from ipvsproxy.core.rules import Rules
from ipvsproxy.settings.config import Config

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network
ServiceId = tuple[str, str]  # (namespace, name)


@dataclass(slots=True)
class Applied:
    """The desired state last applied, per service, with reference counts (mutable: the
    daemon's memory between syncs; every method is still free of I/O)."""

    families: tuple[int, ...]
    index: dict[ServiceId, ServiceIndex]
    services: dict[ServiceKey, VirtualServer]
    # real servers per virtual server, for the gauge: the incremental plan reads a changed
    # service's real servers back from the kernel, so the RealServer values themselves are not
    # kept (they were ~110 MB of the daemon at 50,000 services x 10 endpoints)
    dest_counts: dict[ServiceKey, int]
    owners: dict[ServiceKey, str]
    key_owner: dict[ServiceKey, ServiceId]
    lost_by: dict[ServiceKey, set[ServiceId]]  # the services that claimed a key and lost it
    entry_refs: Counter[tuple[str, str]]
    set_sizes: Counter[str]  # family-prefixed set name -> members with refs > 0
    addr_refs: Counter[IPAddress]
    out_filter: Counter[tuple[int, IPAddress, str, int]]
    no_local: Counter[tuple[str, int]]  # (traffic policy, family) -> services
    rules: dict[int, Rules]
    specs: tuple[SetSpec, ...] = ()
    owners_version: int = 0  # bumped when `owners` changes: readers skip unchanged names
    real_servers: int = 0  # sum of dest_counts: kept up to date (a gauge reads it every sync)

    @classmethod
    def from_full(cls, des: Desired, specs: tuple[SetSpec, ...] | None = None) -> Applied:
        """`specs`: the sets as the kernel holds them after the full sync (Plan.specs), whose
        sizes restore scripts must repeat; `des.specs` when not given."""
        a = cls(des.families, {}, dict(des.services),
                {k: len(v) for k, v in des.dests.items()}, dict(des.owners), {}, {},
                Counter(), Counter(), Counter(), Counter(), Counter(),
                dict(des.rules), specs or des.specs)
        for sid, ix in des.index.items():
            a._add(sid, ix)
        a.real_servers = sum(a.dest_counts.values())
        return a

    # ------------------------------------------------------------------ reference counts

    def _add(self, sid: ServiceId, ix: ServiceIndex) -> None:
        self.index[sid] = ix
        for k in ix.keys:
            self.key_owner[k] = sid
        for k in ix.lost:
            self.lost_by.setdefault(k, set()).add(sid)
        for e in ix.entries:
            self.entry_refs[e] += 1
            if self.entry_refs[e] == 1:
                self.set_sizes[e[0]] += 1
        self.addr_refs.update(ix.addresses)
        self.out_filter.update(ix.out_filter)
        self.no_local.update(ix.no_local)

    def _remove(self, sid: ServiceId) -> None:
        ix = self.index.pop(sid, None)
        if ix is None:
            return
        for k in ix.keys:
            if self.key_owner.get(k) == sid:
                del self.key_owner[k]
        for k in ix.lost:
            losers = self.lost_by.get(k)
            if losers is not None:
                losers.discard(sid)
                if not losers:
                    del self.lost_by[k]
        for e in ix.entries:
            self.entry_refs[e] -= 1
            if self.entry_refs[e] <= 0:
                del self.entry_refs[e]
                self.set_sizes[e[0]] -= 1
        _decrement(self.addr_refs, ix.addresses)
        _decrement(self.out_filter, ix.out_filter)
        _decrement(self.no_local, ix.no_local)

    # --------------------------------------------------------------------------- steps

    def rivals(self, part: Desired, dirty: Collection[ServiceId]) -> set[ServiceId]:
        """The services outside `dirty` that claimed or claim a virtual server a service in
        `dirty` claimed (applied) or claims (`part`, computed over `dirty`): who wins it may
        change, so they belong in the change. Empty once `dirty` holds every claimant."""
        keys: set[ServiceKey] = set()
        for sid in dirty:
            old = self.index.get(sid)
            if old is not None:
                keys.update(old.keys)
                keys.update(old.lost)
        for ix in part.index.values():
            keys.update(ix.keys)
            keys.update(ix.lost)
        out: set[ServiceId] = set()
        for k in keys:
            owner = self.key_owner.get(k)
            if owner is not None and owner not in dirty:
                out.add(owner)
            out.update(s for s in self.lost_by.get(k, ()) if s not in dirty)
        return out

    def settle(self, dirty: Collection[ServiceId],
               compute: Callable[[set[ServiceId]], Desired]) -> tuple[Desired, set[ServiceId]]:
        """`compute` (compute_desired over the named services) of `dirty` and of every service
        whose claims meet theirs (`rivals`, followed until none is left), and those services:
        the part and the dirty set an incremental sync goes on with."""
        ids = set(dirty)
        while True:
            part = compute(ids)
            more = self.rivals(part, ids)
            if not more:
                return part, ids
            ids |= more

    def scope(self, part: Desired, dirty: Collection[ServiceId]) -> set[ServiceKey] | None:
        """The virtual servers a change to `dirty` touches (old and new), or None when one of
        them is held by a service outside `dirty` (`rivals` was not followed: a full sync)."""
        keys: set[ServiceKey] = set()
        for sid in dirty:
            old = self.index.get(sid)
            if old is not None:
                keys.update(old.keys)
        for sid, ix in part.index.items():
            for k in ix.keys:
                owner = self.key_owner.get(k)
                if owner is not None and owner != sid and owner not in dirty:
                    return None
                keys.add(k)
        return keys

    def plan(self, part: Desired, dirty: Collection[ServiceId],
             kernel: Mapping[ServiceKey, ObservedService], cfg: Config,
             force_delete: Collection[tuple[ServiceKey, DestKey]] = ()) -> Plan:
        """The operations that bring the kernel from the applied state to one where `part`
        replaces the services in `dirty`; `kernel` holds the scope's virtual servers as read
        back (absent: not in the kernel)."""
        # The reference counts once `part` replaces `dirty`, as changes to the current ones
        # (copying the counters whole made each change cost more the bigger the cluster).
        removed = [self.index[s] for s in dirty if s in self.index]
        added = list(part.index.values())
        entries: Counter[tuple[str, str]] = Counter()
        addrs: Counter[IPAddress] = Counter()
        out_filter = Counter(self.out_filter)
        for ix in removed:
            entries.subtract(ix.entries)
            addrs.subtract(ix.addresses)
            _decrement(out_filter, ix.out_filter)
        for ix in added:
            entries.update(ix.entries)
            addrs.update(ix.addresses)
            out_filter.update(ix.out_filter)
        set_sizes = Counter(self.set_sizes)
        names = [s.name for s in self.specs]
        before: dict[str, set[str]] = {n: set() for n in names}
        after: dict[str, set[str]] = {n: set() for n in names}
        for (name, entry), change in entries.items():
            was = self.entry_refs.get((name, entry), 0)
            if was > 0:
                before[name].add(entry)
            if was + change > 0:
                after[name].add(entry)
            set_sizes[name] += (was + change > 0) - (was > 0)
        # A set that outgrows its maxelem is resized, which refills it whole: the diff then
        # sees all its members (rare: capacity() leaves room to double).
        grown = _grown(set_sizes, self.specs)
        merged: Counter[tuple[str, str]] | None = None
        for spec in self.specs:
            if grown[spec.name] is not spec:
                if merged is None:  # the whole counts after the change, once
                    merged = Counter(self.entry_refs)
                    merged.update(entries)
                before[spec.name] = {e for n, e in self.entry_refs if n == spec.name}
                after[spec.name] = {e for (n, e), c in merged.items() if n == spec.name and c > 0}
        rules = _rules(self.families, set_sizes, out_filter, cfg)
        chains = chains_after(self.rules)
        des = Desired(self.families, dict(part.services), dict(part.dests), dict(part.owners),
                      frozenset(a for a, change in addrs.items()
                                if self.addr_refs.get(a, 0) + change > 0),
                      tuple(grown.values()), {n: frozenset(m) for n, m in after.items()}, rules,
                      problems=part.problems)
        obs = Observed(kernel, {n: frozenset(m) for n, m in before.items()},
                       {s.name: s for s in self.specs}, True,
                       frozenset(a for a in addrs if self.addr_refs.get(a, 0) > 0),
                       chains)
        return diff(des, obs, cfg.exclude_cidrs, force_delete)

    def commit(self, part: Desired, dirty: Collection[ServiceId], cfg: Config,
               scope: Collection[ServiceKey]) -> None:
        """Record that `part` now stands for the services in `dirty`."""
        for sid in dirty:
            self._remove(sid)
        touched = set(scope) | part.owners.keys()
        owners_before = {k: self.owners.get(k) for k in touched}
        for k in scope:
            self.services.pop(k, None)
            self.real_servers -= self.dest_counts.pop(k, 0)
            self.owners.pop(k, None)
        for sid, ix in part.index.items():
            self._add(sid, ix)
        self.services.update(part.services)
        for k, v in part.dests.items():
            self.real_servers += len(v) - self.dest_counts.get(k, 0)
            self.dest_counts[k] = len(v)
        self.owners.update(part.owners)
        if any(self.owners.get(k) != v for k, v in owners_before.items()):
            self.owners_version += 1
        self.rules = _rules(self.families, self.set_sizes, self.out_filter, cfg)
        self.specs = tuple(_grown(self.set_sizes, self.specs).values())  # as plan() resized them


def _rules(families: tuple[int, ...], set_sizes: Mapping[str, int],
           out_filter: Mapping[tuple[int, IPAddress, str, int], int], cfg: Config
           ) -> dict[int, Rules]:
    out: dict[int, Rules] = {}
    for fam in families:
        nonempty = frozenset(T.BY_FAMILY_NAME[name][0] for name, n in set_sizes.items()
                             if n > 0 and T.BY_FAMILY_NAME[name][1] == fam)
        of = [(a, p, port) for f, a, p, port in out_filter if f == fam]
        out[fam] = family_rules(fam, cfg, nonempty, of)
    return out


def _grown(set_sizes: Mapping[str, int], specs: tuple[SetSpec, ...]) -> dict[str, SetSpec]:
    """`specs`, with each hash set too small for its member count resized."""
    out = {}
    for s in specs:
        n = set_sizes.get(s.name, 0)
        out[s.name] = dataclasses.replace(s, maxelem=capacity(n)) \
            if s.is_hash and n > s.maxelem else s
    return out


def _decrement(c: Counter[Any], keys: Iterable[Any]) -> None:
    """Counter.subtract without keeping zeros (and without a pass over the whole counter)."""
    for k in keys:
        n = c[k] - 1
        if n > 0:
            c[k] = n
        else:
            del c[k]
