"""The shell around the pure diff: observe the node's dataplane, apply a plan, and the cleanup plan.

`observe()` reads IPVS (netlink dump), ipsets (`ipset save`), kube-ipvs0, iptables-save, sysctls
and IPVS timeouts into a core.plan.Observed. `apply()` walks a plan in order, batching what can
be batched (consecutive IPVS ops in one pipelined netlink exchange, consecutive set changes in
one `ipset restore`); a failure is recorded and the walk goes on. Nothing here decides what to do.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Any

from ipvsproxy.core.desired import Desired
from ipvsproxy.core.ipset_text import InvalidSpec, render_adds, render_create, render_dels
from ipvsproxy.core.ipvs import ObservedService, ServiceKey
from ipvsproxy.core.plan import (
    Address,
    CreateLink,
    CreateSet,
    DeleteNftTables,
    Iptables,
    Ipvs,
    Observed,
    Plan,
    ResizeSet,
    SetMembers,
    SetTimeouts,
    Step,
    Sysctl,
    step_kind,
)
from ipvsproxy.kernel import iptables
from ipvsproxy.kernel import nft as nft_module
from ipvsproxy.kernel.dummy import DummyLink
from ipvsproxy.kernel.host import read_sysctls, write_sysctl
from ipvsproxy.kernel.ipset import IPSetError, IPSets
from ipvsproxy.kernel.ipvs import IpvsClient


@dataclass(frozen=True, slots=True)
class Failure:
    what: str  # the operation, as --dry-run would print it
    error: str
    kind: str = ""  # plan.step_kind of the step; a failed set step counts all its entries
    count: int = 1

    def __str__(self) -> str:
        return f"{self.what}: {self.error}"


def observe(des: Desired, nft: bool = False) -> Observed:
    """Read what the kernel holds of everything `des` talks about; `nft`: also which of
    kube-proxy's nftables tables exist (a takeover)."""
    # `ipset save` and iptables-save run (on another CPU) while IPVS and kube-ipvs0 are read
    with IPSets() as ipsets:
        saved_sets = ipsets.start_read_all()
    saved_rules = [(fam, iptables.start_save(fam)) for fam in des.families]
    # the diff reads no counters: skip decoding them
    with IpvsClient() as ipvs:
        services: dict[Any, Any] = {s.service.key: s for s in ipvs.dump(
            stats=False, reuse=_addresses(des), share=des.dests)}
        timeouts = ipvs.timeouts() if des.timeouts is not None else None
    with DummyLink() as link:
        exists = link.index() is not None
        addrs = link.addresses() if exists else frozenset()
    ours = {s.name for s in des.specs}
    sets: dict[str, frozenset[str]] = {}
    specs: dict[str, Any] = {}
    for name, saved in saved_sets().items():
        if name in ours:
            sets[name] = saved.members
            with contextlib.suppress(InvalidSpec):
                specs[name] = saved.spec()
    chains: dict[Any, Any] = {}
    for fam, rules in saved_rules:
        chains.update(iptables.chains_of(rules(), fam))
    return Observed(services, sets, specs, exists, addrs, chains,
                    read_sysctls(k for k, _ in des.sysctls), timeouts,
                    nft_module.kube_proxy_tables() if nft else frozenset())


def _addresses(des: Desired) -> Iterator[Any]:
    """The addresses of the desired virtual and real servers, repeats and fwmark services' None
    included (new_dump keeps the addresses once), gathered in C (map, not a loop: 150,000 of
    them at 10,000 services): ServiceKey.addr is field 2, RealServer.key.addr 0.0."""
    vips = map(itemgetter(2), des.services)
    rips = map(itemgetter(0), map(itemgetter(0), chain.from_iterable(des.dests.values())))
    return chain(vips, rips)


def read_services(keys: Iterable[ServiceKey]) -> dict[ServiceKey, ObservedService]:
    """Just these virtual servers, with their real servers (an incremental sync's scope)."""
    out: dict[ServiceKey, ObservedService] = {}
    with IpvsClient() as ipvs:
        for key in keys:
            got = ipvs.get_service(key)
            if got is not None:
                out[key] = got
    return out


def _run(steps: Sequence[Step], i: int) -> list[Any]:
    """The steps from i on that are applied as one batch: of steps[i]'s type (and, for
    addresses, the same direction)."""
    first = steps[i]
    j = i + 1
    while j < len(steps) and type(steps[j]) is type(first) and (
            not isinstance(first, Address) or steps[j].add == first.add):  # type: ignore[union-attr]
        j += 1
    return list(steps[i:j])


# The kinds of kernel work an apply's seconds are added to (apply's `seconds`)
APPLY_KINDS = {Ipvs: "apply_ipvs", SetMembers: "apply_ipsets", CreateSet: "apply_ipsets",
               ResizeSet: "apply_ipsets", Address: "apply_addresses"}


def apply(plan: Plan, seconds: dict[str, float] | None = None) -> list[Failure]:
    """Apply the plan's steps in order; `seconds`, when given, gets the time spent on each kind
    of kernel work added (APPLY_KINDS, "apply_other" for the rest: rules, link, sysctls)."""
    failures: list[Failure] = []
    steps = plan.steps
    i = 0
    ipvs: IpvsClient | None = None
    clock = time.perf_counter
    t0 = 0.0
    try:
        while i < len(steps):
            step = steps[i]
            if seconds is not None:
                t0 = clock()
            batch = _BATCHES.get(type(step))
            if isinstance(step, Ipvs):
                run = _run(steps, i)
                i += len(run)
                ipvs = ipvs or IpvsClient()
                for err in ipvs.apply([s.op for s in run]):
                    failures.append(Failure(Ipvs(err.op).lines()[0], str(err),
                                            step_kind(Ipvs(err.op))))
            elif batch is not None:
                run = _run(steps, i)
                i += len(run)
                failures += batch(run)
            else:
                try:
                    _apply_one(step, ipvs)
                except Exception as exc:
                    failures.append(Failure(step.lines()[0], str(exc) or type(exc).__name__,
                                            step_kind(step)))
                i += 1
            if seconds is not None:
                kind = APPLY_KINDS.get(type(step), "apply_other")
                seconds[kind] = seconds.get(kind, 0.0) + clock() - t0
    finally:
        if ipvs is not None:
            ipvs.close()
    return failures


def _apply_members(steps: list[SetMembers]) -> list[Failure]:
    """All consecutive set changes in one `ipset restore`; on failure, set by set."""
    def script(group: list[SetMembers]) -> list[str]:
        lines: list[str] = []
        for s in group:
            lines.append(render_create(s.spec))
            lines += (render_adds if s.add else render_dels)(s.spec.name, s.entries)
        return lines

    with IPSets() as ipsets:
        try:
            ipsets.restore(script(steps))
            return []
        except IPSetError:
            pass
        failures = []
        for s in steps:
            try:
                ipsets.restore(script([s]))
            except IPSetError as exc:
                failures.append(Failure(s.lines()[0] + (" ..." if len(s.entries) > 1 else ""),
                                        str(exc), step_kind(s), len(s.entries)))
        return failures


def _create_sets(steps: list[CreateSet]) -> list[Failure]:
    """One netlink socket for all of them: opening one costs more than a create."""
    failures = []
    with IPSets() as ipsets:
        for s in steps:
            try:
                ipsets.create(s.spec, exist_ok=True)
            except Exception as exc:
                failures.append(Failure(s.lines()[0], str(exc) or type(exc).__name__,
                                        step_kind(s)))
    return failures


def _apply_addresses(steps: list[Address]) -> list[Failure]:
    with DummyLink() as link:
        try:
            (link.add if steps[0].add else link.remove)([s.addr for s in steps])
            return []
        except Exception:
            pass
        failures = []
        for s in steps:
            try:
                (link.add if s.add else link.remove)([s.addr])
            except Exception as exc:
                failures.append(Failure(s.lines()[0], str(exc), step_kind(s)))
        return failures


# The steps applied a run at a time (consecutive steps of one type, _run) besides Ipvs, which
# apply() sends over the client it keeps open for the steps after them
_BATCHES: dict[type, Callable[[list[Any]], list[Failure]]] = {
    SetMembers: _apply_members, CreateSet: _create_sets, Address: _apply_addresses}


def _apply_one(step: Step, ipvs: IpvsClient | None) -> None:
    if isinstance(step, Sysctl):
        write_sysctl(step.key, step.value)
    elif isinstance(step, CreateLink):
        with DummyLink() as link:
            link.ensure()
    elif isinstance(step, ResizeSet):
        with IPSets() as ipsets:
            ipsets.replace(step.spec, step.entries)
    elif isinstance(step, Iptables):
        iptables.restore(step.family, step.payload)
    elif isinstance(step, SetTimeouts):
        with IpvsClient() as client:
            client.set_timeouts(step.timeouts)
    elif isinstance(step, DeleteNftTables):
        nft_module.delete_tables(step.tables)
    else:  # pragma: no cover - every step type is handled above
        raise TypeError(step)
