"""Pure models of the kernel's IPVS schedulers. Imports nothing from ipvsproxy.

One module per scheduler, each mirroring its C file in net/netfilter/ipvs/ of Linux 6.1 (the
lab's Debian kernel; scheduler.common says which source and how lines are cited):

- scheduler.rr   ip_vs_rr.c   round robin (a replayable state: the kernel hides its position)
- scheduler.wrr  ip_vs_wrr.c  weighted round robin (likewise)
- scheduler.lc   ip_vs_lc.c   least connection, and the overhead formula
- scheduler.wlc  ip_vs_wlc.c  weighted least connection
- scheduler.sh   ip_vs_sh.c   source hashing, sh-port, sh-fallback
- scheduler.mh   ip_vs_mh.c   Maglev hashing, mh-port, mh-fallback (scheduler.siphash: hsiphash)

Every model takes the destinations in the kernel's list order (what a netlink dump returns) and
returns a Pick: the destination the kernel would choose, or None, and why.

    from scheduler import Conn, Dest, predict
    pick = predict("sh", dests, Conn(client_ip, client_port), flags)
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler import lc, mh, rr, sh, wlc, wrr
from scheduler.common import (
    AF_INET,
    AF_INET6,
    SVC_F_SCHED1,
    SVC_F_SCHED2,
    Conn,
    Dest,
    Pick,
    addr_port,
)

MODELLED = ("rr", "wrr", "lc", "wlc", "sh", "mh")

__all__ = [
    "AF_INET",
    "AF_INET6",
    "MODELLED",
    "SVC_F_SCHED1",
    "SVC_F_SCHED2",
    "Conn",
    "Dest",
    "Pick",
    "UnknownScheduler",
    "addr_port",
    "flag_names",
    "predict",
]


class UnknownScheduler(ValueError):
    """A scheduler this package has no model of (dh, sed, nq, fo, ovf, lblc, lblcr, twos)."""


def flag_names(scheduler: str, flags: int) -> list[str]:
    """The scheduler flags as ipvsadm names them (sh-fallback, sh-port, mh-fallback, mh-port)."""
    if scheduler not in ("sh", "mh"):
        return []
    out = []
    if flags & SVC_F_SCHED1:
        out.append(f"{scheduler}-fallback")
    if flags & SVC_F_SCHED2:
        out.append(f"{scheduler}-port")
    return out


def predict(scheduler: str, dests: Sequence[Dest], conn: Conn, flags: int = 0,
            af: int | None = None) -> Pick:
    """The destination the kernel's `scheduler` picks for a new connection from `conn`.

    `flags` are the service's flags (SVC_F_SCHED1 = -fallback, SVC_F_SCHED2 = -port); `af` the
    service's address family (default: the client's). rr and wrr are predicted from the start
    of their rotation (see scheduler.rr and scheduler.wrr): the kernel hides its position."""
    if scheduler == "sh":
        return sh.schedule(dests, conn, sh_port=bool(flags & SVC_F_SCHED2),
                           sh_fallback=bool(flags & SVC_F_SCHED1), af=af)
    if scheduler == "mh":
        return mh.schedule(dests, conn, mh_port=bool(flags & SVC_F_SCHED2),
                           mh_fallback=bool(flags & SVC_F_SCHED1), af=af)
    if scheduler == "lc":
        return lc.schedule(dests)
    if scheduler == "wlc":
        return wlc.schedule(dests)
    if scheduler == "rr":
        return rr.schedule(dests)
    if scheduler == "wrr":
        return wrr.schedule(dests)
    raise UnknownScheduler(scheduler)
