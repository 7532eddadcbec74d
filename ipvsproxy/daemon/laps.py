"""Where a full sync's time goes: the seconds of each of its phases (the host's facts, the desired
state, the kernel read back, the diff, and the apply by kind of kernel work), for the sync log
line and the ipvsproxy_sync_phase_seconds histogram. A sync's total says that it was slow; its
phases say why (at 50,000 services a full sync is minutes under emulation, and which part grows
is what a profile would otherwise be needed for)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping


class Laps:
    """A stopwatch: lap(name) adds the seconds since the previous lap (or the start) to name."""

    __slots__ = ("_clock", "_last", "seconds")

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._last = clock()
        self.seconds: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = self._clock()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now

    def restart(self) -> None:
        """The time since the last lap belongs to no phase (another thread's wait)."""
        self._last = self._clock()

    def add(self, more: Mapping[str, float]) -> None:
        for name, s in more.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + s


def rounded(seconds: Mapping[str, float]) -> dict[str, float]:
    """For the log: milliseconds are enough."""
    return {name: round(s, 3) for name, s in seconds.items()}
