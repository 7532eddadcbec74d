"""The periodic full sync's reading half, on a thread of its own (core/overlap.py says why).

`Reading` computes the host facts, the whole desired state, the kernel read back and the diff;
it only reads. The reconciler's loop goes on with incremental syncs meanwhile, records in
`touched` and `parts` what they applied, and when `done` it applies the plan without what they
touched (Reconciler._finish_reading). A blocking full sync started meanwhile makes the reading
stale (`stop`: it ends at its next phase and its result is dropped).
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
                host = self.kernel.host_facts()
                laps.lap("host")
                self._check()
                des = compute_desired(self.snapshot(), host, self.cfg)
                laps.lap("desired")
                self._check()
                obs = self.kernel.observe(des, False)
                laps.lap("observe")
                self._check()
                plan = diff(des, obs, self.cfg.exclude_cidrs, self.expired)
                laps.lap("diff")
                self.phases = laps.seconds
                self.result = Result(host, des, plan)
        except Stale:
            pass
        except Exception as exc:  # handed to the loop, which counts and retries it
            self.error = exc
        finally:
            self.seconds = time.monotonic() - t0
            self._done.set()
            self.wake()
