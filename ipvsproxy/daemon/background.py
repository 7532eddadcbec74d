"""A full sync's reading half (`read_full`), and the periodic one on a thread of its own
(core/overlap.py says why).

`read_full` computes the host facts, the whole desired state, the kernel read back and the diff,
and laps each phase; it only reads. A blocking full sync (Reconciler._full_sync) calls it in the
loop. `Reading` calls it on a thread of its own while the loop goes on with incremental syncs,
records in `touched` and `parts` what they applied, and when `done` the loop applies the plan
without what they touched (Reconciler._finish_reading). A blocking full sync started meanwhile
makes the reading stale (`stop`: it ends at its next phase and its result is dropped).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from ipvsproxy.core.desired import Desired, HostFacts, compute_desired
from ipvsproxy.core.gcpause import paused
from ipvsproxy.core.ipvs import DestKey, ServiceKey
from ipvsproxy.core.overlap import Touched
from ipvsproxy.core.plan import Plan, diff
from ipvsproxy.core.takeover import Takeover
from ipvsproxy.daemon.laps import Laps
from ipvsproxy.settings.config import Config

log = structlog.get_logger("ipvsproxy.sync")


class Stale(Exception):
    """The reading was stopped: a blocking full sync made it stale."""


@dataclass(slots=True)
class Result:
    host: HostFacts
    des: Desired
    plan: Plan
    nft_tables: frozenset[str] = frozenset()  # kube-proxy's nftables tables found (a takeover)


def _go_on() -> None:
    pass


def read_full(kernel: Any, snapshot: Callable[[], Any], cfg: Config,
              expired: Callable[[], frozenset[tuple[ServiceKey, DestKey]]],
              taking_over: bool, laps: Laps, check: Callable[[], None] = _go_on) -> Result:
    """Host facts, desired state, the kernel read back and the diff, each phase lapped in
    `laps`; `check` runs between phases (a Reading stops there when it went stale).
    `taking_over`: kube-proxy's state is read and planned for adoption (core/takeover.py)."""
    host = kernel.host_facts()
    laps.lap("host")
    check()
    des = compute_desired(snapshot(), host, cfg)
    laps.lap("desired")
    check()
    takeover = Takeover.of(host.addresses) if taking_over else None
    obs = kernel.observe(des, takeover is not None)
    laps.lap("observe")
    check()
    plan = diff(des, obs, cfg.exclude_cidrs, expired(), takeover)
    laps.lap("diff")
    return Result(host, des, plan, obs.nft_tables)


@dataclass(slots=True)
class Reading:
    kernel: Any  # reconciler.Kernel
    snapshot: Callable[[], Any]  # Store.snapshot
    cfg: Config
    expired: frozenset[tuple[ServiceKey, DestKey]]
    wake: Callable[[], None]  # Store.notify: the loop looks at `done` when woken
    started: float = field(default_factory=time.monotonic)
    touched: Touched = field(default_factory=Touched)
    parts: list[tuple[Any, Any, Any]] = field(default_factory=list)  # (part, dirty, scope)
    result: Result | None = None
    error: BaseException | None = None
    seconds: float = 0.0
    # the seconds of its phases (wall time: incremental syncs run beside it, see daemon/laps.py)
    phases: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _done: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Reading:
        threading.Thread(target=self._run, name="full-sync-read", daemon=True).start()
        return self

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def _check(self) -> None:
        if self._stop.is_set():
            raise Stale

    def _run(self) -> None:
        t0 = time.monotonic()
        laps = Laps()
        try:
            with paused():  # see _full in reconciler.py
                self.result = read_full(self.kernel, self.snapshot, self.cfg,
                                        lambda: self.expired, False, laps, self._check)
                self.phases = laps.seconds
        except Stale:
            pass
        except Exception as exc:  # handed to the loop, which counts and retries it
            self.error = exc
        finally:
            self.seconds = time.monotonic() - t0
            self._done.set()
            self.wake()
