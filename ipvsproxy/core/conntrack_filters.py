"""Which conntrack entries of UDP services are stale: pure decisions, no I/O.

UDP has no end of connection. A client that keeps sending from one source port keeps its
conntrack entry alive (30 s unreplied, 120 s once a stream), and the entry pins the flow to the
backend it was first sent to, long after that backend left the service. kube-proxy therefore
sweeps conntrack after UDP endpoint changes (pkg/proxy/conntrack/cleanup.go, CleanStaleEntries,
a reconciler since 1.31): it dumps the UDP entries and deletes those whose *original
destination* is a service frontend (ClusterIP, external IP or LoadBalancer IP with the service
port, or a NodePort) and whose *reply source* (the DNATed backend) is not one of that service
port's serving endpoints. In IPVS mode with `net.ipv4.vs.conntrack=1` the kernel writes the real
server into the reply tuple when IPVS schedules a flow (ip_vs_nfct.c, ip_vs_update_conntrack),
so the reply source is the real server's address *and port*.

This module decides; ipvsproxy.kernel.conntrack dumps and deletes. Differences from upstream,
all deliberate:

- The frontends are the IPVS virtual servers themselves, one filter per UDP virtual server
  (af, address, port); NodePorts are therefore matched per node address (this node's NodePort
  virtual servers, one per node IP, see shared/reference/kube-proxy-ipvs.md §1.2), not as
  "*:nodePort" on any destination address.
- The valid backends of a frontend are the real servers of *that* virtual server (its traffic
  policy already applied), compared by address and port; upstream compares endpoint addresses
  only and uses the service's endpoints for every frontend. IPVS would send a new flow to
  exactly these real servers, so a flow pinned anywhere else is one IPVS would not make now.
- A real server present at weight 0 counts as valid. The daemon deletes UDP/SCTP real servers
  at once (no graceful termination: kube-proxy's graceful_termination.go skips it for UDP and
  SCTP), so a UDP real server at weight 0 was put there on purpose (a per-service weight) and
  its established flows are left alone, as upstream leaves flows to serving-but-terminating
  endpoints alone.
- As upstream, a frontend without any real server gets no filter: there is nowhere better to
  send its flows, and when real servers come back the virtual server changes again, and that
  sweep removes whatever is still pinned to an old backend.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from ipvsproxy.core.ipvs import AF_INET, AF_INET6, IPAddress, Protocol, RealServer, ServiceKey

IPPROTO_UDP = int(socket.IPPROTO_UDP)  # 17

FilterKey = tuple[int, IPAddress, int]  # (address family, frontend address, frontend port)
Backends = frozenset[tuple[IPAddress, int]]  # valid (real server address, port)
Filters = dict[FilterKey, Backends]


class Flow(NamedTuple):
    """The parts of a dumped conntrack entry that decide whether it is stale."""

    proto: int  # L4 protocol number of the original tuple
    orig_dst: IPAddress  # where the client sent it (a service frontend?)
    orig_dport: int
    reply_src: IPAddress  # who answers: the real server IPVS chose (ip_vs_update_conntrack)
    reply_sport: int


def udp_filters(dests: Mapping[ServiceKey, tuple[RealServer, ...]],
                keys: Iterable[ServiceKey]) -> Filters:
    """(af, frontend address, port) -> the (address, port) of its valid real servers, for every
    UDP virtual server among `keys` that has real servers (see the module docstring).

    `dests` is the desired state (Desired.dests); a key absent from it (a deleted service) or
    without real servers gets no filter. fwmark and non-UDP keys are ignored.
    """
    out: Filters = {}
    for key in keys:
        if key.fwmark or key.protocol is not Protocol.UDP or key.addr is None:
            continue
        real = dests.get(key, ())
        if not real:
            continue
        out[(key.af, key.addr, key.port)] = frozenset((rs.key.addr, rs.key.port) for rs in real)
    return out


def is_stale(flow: Flow, filters: Mapping[FilterKey, Backends]) -> bool:
    """A UDP flow sent to a filtered frontend whose reply comes from none of its valid real
    servers. Also true for a flow to the frontend that IPVS never translated (reply source =
    the frontend itself, e.g. created before the virtual server existed): as upstream, it is
    not DNATed to a serving endpoint. Flows to anything else are never stale."""
    if flow.proto != IPPROTO_UDP:
        return False
    af = AF_INET6 if flow.orig_dst.version == 6 else AF_INET
    valid = filters.get((af, flow.orig_dst, flow.orig_dport))
    return valid is not None and (flow.reply_src, flow.reply_sport) not in valid


def stale(flows: Iterable[Flow], filters: Mapping[FilterKey, Backends]) -> list[Flow]:
    """The flows to delete, in the order given."""
    if not filters:
        return []
    return [f for f in flows if is_stale(f, filters)]


def address_family(family: int) -> int:
    """AF_INET / AF_INET6 from either an address family or an IP version (4, 6), since the
    daemon's configuration speaks in versions (Config.families) and ServiceKey.af in AF_*."""
    if family in (AF_INET, 4):
        return AF_INET
    if family in (AF_INET6, 6):
        return AF_INET6
    raise ValueError(f"not an IP family: {family!r}")
