"""One sync, end to end: objects -> desired -> observe -> diff -> apply. Used by `sync --once`
(and by the daemon, which drives the same steps from watches)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ipvsproxy.config import Config
from ipvsproxy.core.cluster import build_snapshot
from ipvsproxy.core.desired import Desired, HostFacts, compute_desired
from ipvsproxy.core.model import Problem
from ipvsproxy.core.plan import Plan, diff


@dataclass(frozen=True, slots=True)
class Outcome:
    desired: Desired
    plan: Plan
    failures: tuple[Any, ...] = ()
    seconds: float = 0.0

    @property
    def problems(self) -> tuple[Problem, ...]:
        return self.desired.problems + self.plan.problems


def desired_from(docs: Iterable[Any], cfg: Config, host: HostFacts) -> Desired:
    return compute_desired(build_snapshot(docs, cfg.hostname), host, cfg)


def sync(docs: Iterable[Any], cfg: Config, dry_run: bool = False) -> Outcome:
    from ipvsproxy.kernel import dataplane
    from ipvsproxy.kernel.host import host_facts

    t0 = time.monotonic()
    des = desired_from(docs, cfg, host_facts())
    plan = diff(des, dataplane.observe(des), cfg.exclude_cidrs)
    failures: list[Any] = [] if dry_run else dataplane.apply(plan)
    return Outcome(des, plan, tuple(failures), time.monotonic() - t0)
