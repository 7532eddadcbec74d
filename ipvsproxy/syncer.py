"""One sync, end to end: objects -> desired -> observe -> diff -> apply. Used by `sync --once`
(and by the daemon, which drives the same steps from watches).

On a cold node (no kube-ipvs0, nothing in ipvsproxy's sets) a sync first programs
tables.FIRST_SERVICES alone, from their own objects, before it parses the rest: a new node of a
10,000-service cluster reaches the API server and DNS in seconds rather than when the whole table
is in (upstream #133773). The full sync right after covers them again and reports any failure."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ipvsproxy.core import tables as T
from ipvsproxy.core.cluster import build_snapshot, first_objects
from ipvsproxy.core.desired import Desired, HostFacts, compute_desired
from ipvsproxy.core.model import Problem
from ipvsproxy.core.plan import Plan, diff
from ipvsproxy.core.takeover import Takeover
from ipvsproxy.settings.config import Config


@dataclass(frozen=True, slots=True)
class Outcome:
    desired: Desired
    plan: Plan
    failures: tuple[Any, ...] = ()
    seconds: float = 0.0
    first_seconds: float | None = None  # when FIRST_SERVICES were programmed (a cold start)

    @property
    def problems(self) -> tuple[Problem, ...]:
        return self.desired.problems + self.plan.problems


def desired_from(docs: Iterable[Any], cfg: Config, host: HostFacts) -> Desired:
    return compute_desired(build_snapshot(docs, cfg.hostname), host, cfg)


def sync(docs: list[Any], cfg: Config, dry_run: bool = False) -> Outcome:
    """`docs` as read (a `kind: List` is not expanded: first_objects and build_snapshot each
    expand it as they go, and a pass of its own would delay the first services)."""
    from ipvsproxy.kernel import dataplane
    from ipvsproxy.kernel.host import host_facts

    t0 = time.monotonic()
    host = host_facts()
    first = None
    if not dry_run and program_first(docs, cfg, host):
        first = time.monotonic() - t0
    des = desired_from(docs, cfg, host)
    takeover = Takeover.of(host.addresses) if cfg.adopt_kube_proxy else None
    plan = diff(des, dataplane.observe(des, nft=takeover is not None), cfg.exclude_cidrs,
                takeover=takeover)
    failures: list[Any] = [] if dry_run else dataplane.apply(plan)
    return Outcome(des, plan, tuple(failures), time.monotonic() - t0, first)


def program_first(docs: list[Any], cfg: Config, host: HostFacts) -> bool:
    """Program FIRST_SERVICES alone, on a cold node only; True if it did. Only there is their
    plan purely additive: with nothing of ours in the kernel, it deletes and rewrites nothing."""
    from ipvsproxy.kernel import dataplane
    from ipvsproxy.kernel.dummy import DummyLink

    with DummyLink() as link:
        if link.index() is not None:
            return False
    des = desired_from(first_objects(docs, T.FIRST_SERVICES), cfg, host)
    if not des.services:
        return False
    obs = dataplane.observe(des)
    if any(obs.sets.values()):
        return False
    dataplane.apply(diff(des, obs, cfg.exclude_cidrs))
    return True
