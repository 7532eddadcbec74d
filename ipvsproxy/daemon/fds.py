"""The daemon's file descriptors: the soft RLIMIT_NOFILE raised to the hard limit at start, and
the share of them the HTTP servers may hold, so that nothing a client or a tenant does leaves
the reconciler without the sockets (netlink, the API server), pipes (iptables-restore, ipset)
and files it needs (issue 32, item 8).

Of the limit, a quarter at most goes to the HTTP servers' connections (one Budget for all of
them, at most MAX_CONNECTIONS) and a quarter to health-check node port listeners; at least half
stays for the rest. Owns the numbers and the Budget's bookkeeping; the servers (daemon/http.py)
do the evicting, the health-check ports (daemon/hcnp.py) the refusing.
"""

from __future__ import annotations

import resource
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

log = structlog.get_logger("ipvsproxy.fds")

MAX_CONNECTIONS = 4096  # whatever the limit: memory, and a 256-per-listener cap anyway
MIN_SHARE = 16  # the least either share gets, however low the limit


@dataclass(frozen=True, slots=True)
class Shares:
    connections: int  # HTTP connections, all servers together
    listeners: int  # health-check node port listening sockets


def shares(limit: int | None = None) -> Shares:
    """What the HTTP servers may hold under a descriptor limit (the soft one now by default)."""
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit == resource.RLIM_INFINITY:
        limit = 1 << 20
    quarter = limit // 4
    return Shares(max(MIN_SHARE, min(quarter, MAX_CONNECTIONS)), max(MIN_SHARE, quarter))


def raise_soft_limit() -> tuple[int, int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard one, as Go does at start (kube-proxy gets it for
    free): (soft before, soft now, hard), logged. A runtime that gives 1024 soft and a higher
    hard limit (containerd 2) would otherwise leave the daemon 1024."""
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    now = before
    if before != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            now = hard
        except (OSError, ValueError) as exc:
            log.warning("cannot raise the file descriptor limit", soft=before, hard=hard,
                        error=str(exc))
    share = shares(now)
    log.info("file descriptor limit", soft_was=before, soft=now, hard=hard,
             http_connections=share.connections, health_check_listeners=share.listeners)
    return before, now, hard


class Budget:
    """The connections every HTTP server of the process holds together, and who holds how many.
    Thread-safe: each server runs in a thread of its own. When the total is full, the listener
    holding the most gives one up (its oldest not being answered), whichever listener the new
    connection came to: an attacker's many connections on some listeners cost those listeners,
    and a newcomer anywhere (the kubelet, a load balancer's check) is still taken."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._lock = threading.Lock()
        self._held: dict[Any, int] = {}  # listener -> connections
        self._count = 0
        self._waiting: list[Callable[[], None]] = []  # to call when the total is not over

    def held(self) -> int:
        return self._count

    def take(self, listener: Any) -> None:
        with self._lock:
            self._held[listener] = self._held.get(listener, 0) + 1
            self._count += 1

    def give(self, listener: Any) -> None:
        with self._lock:
            left = self._held[listener] - 1
            if left:
                self._held[listener] = left
            else:
                del self._held[listener]
            self._count -= 1
            wake = self._waiting if self._count <= self.total else []
            if wake:
                self._waiting = []
        for poke in wake:
            poke()

    def victim(self, room: int, prefer: Any = None) -> Any:
        """The listener that must give up a connection so that `room` more fit: the one holding
        the most, `prefer` when it holds as many; None when they fit."""
        with self._lock:
            if self._count + room <= self.total or not self._held:
                return None
            most = max(self._held.values())
            if self._held.get(prefer) == most:
                return prefer
            return next(k for k, v in self._held.items() if v == most)

    def wait(self, poke: Callable[[], None]) -> None:
        """Call poke once the total is not over (at once if it is not)."""
        with self._lock:
            if self._count > self.total:
                self._waiting.append(poke)
                return
        poke()


_PROCESS: Budget | None = None
_PROCESS_LOCK = threading.Lock()


def process_budget() -> Budget:
    """The one Budget of this process's servers, sized from the soft limit when first asked
    (after `ipvsproxy run` raised it)."""
    global _PROCESS
    with _PROCESS_LOCK:
        if _PROCESS is None:
            _PROCESS = Budget(shares().connections)
        return _PROCESS
