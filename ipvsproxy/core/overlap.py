"""A periodic full sync read beside incremental syncs: what they touched, and the full plan
without it. Pure (no I/O).

At 50,000 services a full sync (desired state, the whole kernel read back, the diff) took 85-93 s
under emulation, longer than its 30 s period, and every endpoint change waited behind one (p50
39 s). So the daemon computes the periodic full sync's plan in the background while incremental
syncs go on applying changes (daemon/background.py). When it is done, the plan was made from a
desired state and a kernel read that may be older than those incrementals: whatever they touched
(their virtual servers, set members and addresses, old and new) is dropped from it, as the
incrementals made it current and read the kernel back themselves; the rest of the plan repairs
drift as any full sync does. What cannot be split so, a set refilled whole (ResizeSet) while an
incremental changed members, is refused: the caller then runs a blocking full sync.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from ipaddress import IPv4Address, IPv6Address

from ipvsproxy.core import tables as T
from ipvsproxy.core.desired import ServiceIndex
from ipvsproxy.core.ipvs import ServiceKey
from ipvsproxy.core.plan import (
    Address,
    Iptables,
    Ipvs,
    Plan,
    ResizeSet,
    SetMembers,
    Step,
    owned_entry,
)

IPAddress = IPv4Address | IPv6Address
_VS_SETS = frozenset((T.OWNED, T.FOREIGN))  # members name a virtual server (owned_entry)


@dataclass(slots=True)
class Touched:
    """What the incremental syncs applied while a full sync was being read touched."""

    keys: set[ServiceKey] = field(default_factory=set)  # virtual servers (old and new)
    entries: set[tuple[str, str]] = field(default_factory=set)  # (family set name, member)
    addresses: set[IPAddress] = field(default_factory=set)
    rules: bool = False  # an incremental rewrote chains (its plan held an Iptables step)
    resized: bool = False  # an incremental refilled a set whole

    def __bool__(self) -> bool:
        return bool(self.keys or self.entries or self.addresses or self.rules or self.resized)

    def add(self, before: Iterable[ServiceIndex], after: Iterable[ServiceIndex],
            scope: Iterable[ServiceKey], plan: Plan) -> None:
        """One incremental sync: the changed services' index before and after it, the virtual
        servers it read back, the plan it applied."""
        self.keys.update(scope)
        for ix in (*before, *after):
            self.keys.update(ix.keys)
            self.entries.update(ix.entries)
            self.addresses.update(ix.addresses)
        for s in plan.steps:
            if isinstance(s, Iptables):
                self.rules = True
            elif isinstance(s, ResizeSet):
                self.resized = True
            elif isinstance(s, SetMembers):  # e.g. a virtual server recorded as foreign
                self.entries.update((s.spec.name, e) for e in s.entries)
            elif isinstance(s, Address):
                self.addresses.add(s.addr)


def without(plan: Plan, touched: Touched) -> Plan | None:
    """`plan` (a full sync's, read before or during the incrementals of `touched`) without
    what they touched; None when it cannot be split (a set it or they refill whole)."""
    if not touched:
        return plan
    if touched.resized or any(isinstance(s, ResizeSet) for s in plan.steps):
        return None
    vs_entries = {owned_entry(k) for k in touched.keys} - {None}
    steps: list[Step] = []
    for s in plan.steps:
        if isinstance(s, Ipvs):
            svc = s.op.service
            if svc is not None and svc.key in touched.keys:
                continue
        elif isinstance(s, SetMembers):
            base = T.BY_FAMILY_NAME.get(s.spec.name, (s.spec.name, 4))[0]
            kept = tuple(e for e in s.entries if (s.spec.name, e) not in touched.entries
                         and not (base in _VS_SETS and e in vs_entries))
            if not kept:
                continue
            if len(kept) != len(s.entries):
                s = replace(s, entries=kept)
        elif isinstance(s, Address):
            if s.addr in touched.addresses:
                continue
        elif isinstance(s, Iptables) and touched.rules:
            continue  # chains as the incrementals left them; the next full sync checks them
        steps.append(s)
    return replace(plan, steps=tuple(steps),
                   draining=tuple(d for d in plan.draining if d[0] not in touched.keys),
                   foreign=tuple(k for k in plan.foreign if k not in touched.keys))
