"""`ipvsproxy explain`, the pure part: from a service as the kernel reports it, the text of
/proc/net/ip_vs_conn and a client, which real server the client's next connection reaches and
why. The scheduler models are the `scheduler` package; this module maps the kernel's objects onto
them and adds what happens before a scheduler is asked:

- Persistence (ip_vs_sched_persist, net/netfilter/ipvs/ip_vs_core.c:252-416 in Linux 6.1): on a
  persistent service the kernel first looks for a connection template of the client's network
  (address masked with the service's netmask, ip_vs_core.c:277-284) and the service
  (ip_vs_core.c:305-337); a valid one decides (ip_vs_core.c:339-341, 380-384) whatever the
  scheduler would say. A template is valid while its real server is still in the service, and,
  with the sysctl expire_quiescent_template, while that server's weight is not 0
  (ip_vs_check_template, ip_vs_conn.c:756-799).
- Overload: a dump does not carry IP_VS_DEST_F_OVERLOAD; it is inferred from the thresholds and
  the connection counts (scheduler.common.overload_state).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address, ip_address

from ipvsproxy.core.ipvs import (
    AF_INET6,
    SVC_F_ONEPACKET,
    SVC_F_PERSISTENT,
    SVC_F_SCHED2,
    IPAddress,
    ObservedDest,
    ObservedService,
    Protocol,
    VirtualServer,
)
from scheduler import MODELLED, Conn, Dest, Pick, UnknownScheduler, flag_names, predict
from scheduler.common import addr_port, overload_state

FTPPORT = 21  # include/net/ip_vs.h FTPPORT: persistent FTP templates have vport 0
TEMPLATE_STATES = ("NONE", "ASSURED")  # ip_vs_proto.c:41-44, ip_vs_state_name of templates


@dataclass(frozen=True, slots=True)
class ConnEntry:
    """One line of /proc/net/ip_vs_conn (ip_vs_conn_seq_show, ip_vs_conn.c:1108-1168)."""

    protocol: str
    caddr: IPAddress
    cport: int
    vaddr: IPAddress
    vport: int
    daddr: IPAddress
    dport: int
    state: str
    expires: int

    @property
    def is_template(self) -> bool:
        return self.cport == 0 and self.state in TEMPLATE_STATES


def _addr(text: str) -> IPAddress:
    if ":" in text:
        return IPv6Address(text)
    return IPv4Address(int(text, 16))


def parse_conn_table(text: str) -> list[ConnEntry]:
    """The entries of /proc/net/ip_vs_conn; lines that do not parse are skipped."""
    out = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 9:
            continue
        try:
            out.append(ConnEntry(f[0], _addr(f[1]), int(f[2], 16), _addr(f[3]), int(f[4], 16),
                                 _addr(f[5]), int(f[6], 16), f[7], int(f[8])))
        except ValueError:
            continue
    return out


def client_network(service: VirtualServer, addr: IPAddress) -> IPAddress:
    """The client address masked with the service's persistence netmask
    (ip_vs_core.c:277-284: an IPv4 mask, or an IPv6 prefix length)."""
    mask = service.effective_netmask
    if isinstance(addr, IPv6Address):
        bits = min(max(mask, 0), 128)
        return IPv6Address(int(addr) & (((1 << bits) - 1) << (128 - bits)))
    return IPv4Address(int(addr) & mask & 0xFFFFFFFF)


def template_key(service: VirtualServer, client: IPAddress) -> tuple[str, IPAddress, IPAddress,
                                                                     int]:
    """(protocol name, client network, vaddr, vport) of the service's templates for a client
    (ip_vs_core.c:305-337): port services <proto, cnet, 0, vaddr, vport> (vport 0 for FTP),
    fwmark services <IP, cnet, 0, fwmark as an address, 0>."""
    key = service.key
    cnet = client_network(service, client)
    if key.fwmark:
        mark: IPAddress = (IPv6Address(key.fwmark << 96) if key.af == AF_INET6
                           else IPv4Address(key.fwmark))
        return "IP", cnet, mark, 0
    assert key.addr is not None
    vport = 0 if key.port == FTPPORT else key.port
    return key.protocol.name, cnet, key.addr, vport


def find_template(entries: Sequence[ConnEntry], service: VirtualServer,
                  client: IPAddress) -> ConnEntry | None:
    want = template_key(service, client)
    for e in entries:
        if e.is_template and (e.protocol, e.caddr, e.vaddr, e.vport) == want:
            return e
    return None


def model_dests(dests: Sequence[ObservedDest]) -> tuple[list[Dest], list[str]]:
    """The scheduler models' destinations (same order), and notes on what a dump cannot tell."""
    out = []
    notes = []
    for od in dests:
        rs = od.dest
        overloaded = overload_state(rs.u_threshold, rs.l_threshold,
                                    od.active_conns + od.inact_conns)
        if overloaded is None:
            notes.append(f"{rs.key}: {od.active_conns + od.inact_conns} connections is between "
                         f"its thresholds, where the kernel keeps the overload flag it had; "
                         "assumed not overloaded")
        out.append(Dest(rs.key.addr, rs.key.port, rs.weight, od.active_conns, od.inact_conns,
                        bool(overloaded)))
    return out, notes


def parse_client(text: str) -> Conn:
    """IP, IP:PORT, IPv6, or [IPv6]:PORT."""
    text = text.strip()
    try:
        if text.startswith("["):
            host, sep, rest = text[1:].partition("]")
            if not sep:
                raise ValueError
            port = int(rest[1:]) if rest.startswith(":") else 0
            if rest and not rest.startswith(":"):
                raise ValueError
            return Conn(IPv6Address(host), _port(port))
        if text.count(":") == 1:
            host, _, port_text = text.partition(":")
            return Conn(IPv4Address(host), _port(int(port_text)))
        return Conn(ip_address(text), 0)
    except ValueError:
        raise ValueError(f"invalid client `{text}': want IP, IP:PORT or [IPv6]:PORT") from None


def _port(port: int) -> int:
    if not 0 <= port <= 65535:
        raise ValueError(port)
    return port


@dataclass(frozen=True, slots=True)
class Explanation:
    """The answer: the real server (None: none would be picked), the scheduler, and why."""

    service: str
    client: Conn
    scheduler: str
    flags: list[str]
    real_server: Dest | None
    reason: str
    persistent: bool = False
    persistence_timeout: int = 0
    template: ConnEntry | None = None
    pick: Pick | None = None
    notes: list[str] = field(default_factory=list)
    dests: list[Dest] = field(default_factory=list)

    @property
    def real_server_text(self) -> str | None:
        return None if self.real_server is None else str(self.real_server)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "service": self.service,
            "client": str(self.client),
            "real_server": self.real_server_text,
            "scheduler": self.scheduler,
            "flags": self.flags,
            "reason": self.reason,
            "persistent": self.persistent,
        }
        if self.persistent:
            out["persistence_timeout"] = self.persistence_timeout
            out["template"] = None if self.template is None else {
                "client_network": str(self.template.caddr),
                "real_server": addr_port(self.template.daddr, self.template.dport),
                "expires": self.template.expires,
                "state": self.template.state,
            }
        if self.pick is not None:
            model = self.pick.to_json()
            for k in ("scheduler", "reason"):
                model.pop(k, None)
            out["scheduler_pick"] = model
        out["real_servers"] = [
            {"real_server": str(d), "weight": d.weight, "activeconns": d.activeconns,
             "inactconns": d.inactconns, "overloaded": d.overloaded} for d in self.dests]
        out["notes"] = self.notes
        return out

    def to_text(self) -> str:
        flags = f" ({', '.join(self.flags)})" if self.flags else ""
        lines = [
            f"service      {self.service}",
            f"client       {self.client}",
            f"scheduler    {self.scheduler}{flags}",
        ]
        if self.persistent:
            lines.append(f"persistent   {self.persistence_timeout} s"
                         + ("" if self.template is None else
                            f"; template {self.template.caddr} -> "
                            f"{addr_port(self.template.daddr, self.template.dport)}, "
                            f"expires in {self.template.expires} s"))
        lines.append(f"real server  {self.real_server_text or 'none'}")
        lines.append(f"reason       {self.reason}")
        upcoming = getattr(self.pick, "upcoming", None)
        if upcoming:
            lines.append("upcoming     " + ", ".join(
                "none" if d is None else str(d) for d in upcoming))
        compared = getattr(self.pick, "compared", None)
        if compared:
            lines.append("compared     " + "; ".join(
                f"{c.dest} weight {c.dest.weight} active {c.dest.activeconns} inactive "
                f"{c.dest.inactconns} overhead {c.overhead}"
                + (f" ({c.skipped}, skipped)" if c.skipped else "") for c in compared))
        for note in self.notes:
            lines.append(f"note         {note}")
        return "\n".join(lines) + "\n"


def explain(observed: ObservedService, client: Conn, conn_table: str | None = None,
            expire_quiescent_template: bool = False) -> Explanation:
    """Which real server the next connection of `client` to `observed` reaches, and why.
    `conn_table` is the text of /proc/net/ip_vs_conn (None: not read, templates unknown)."""
    vs = observed.service
    dests, notes = model_dests(observed.dests)
    sched = vs.scheduler
    flags = flag_names(sched, vs.flags)
    if vs.flags & SVC_F_ONEPACKET and vs.key.protocol == Protocol.UDP:
        flags.append("ops")
    persistent = bool(vs.flags & SVC_F_PERSISTENT)

    def answer(real_server: Dest | None, reason: str, template: ConnEntry | None,
               pick: Pick | None) -> Explanation:
        return Explanation(str(vs.key), client, sched, flags, real_server, reason, persistent,
                           vs.timeout if persistent else 0, template, pick, notes, dests)

    if sched == "mh" and any(d.weight == 0 for d in dests):
        notes.append("mh builds its table from each server's last non-zero weight, which no "
                     "dump shows: a weight-0 server is assumed to have been added with weight "
                     "0; one set to 0 from a positive weight still holds its table entries")

    if sched in ("sh", "mh") and vs.flags & SVC_F_SCHED2 and not client.port:
        notes.append(f"{sched}-port hashes the client's source port too and none was given: "
                     "port 0 assumed (give --client IP:PORT)")
    template = None
    if persistent:
        if conn_table is None:
            notes.append("the connection table could not be read: persistence templates "
                         "unknown")
        else:
            template = find_template(parse_conn_table(conn_table), vs, client.addr)
    pick: Pick | None = None
    with contextlib.suppress(UnknownScheduler):
        pick = predict(sched, dests, client, vs.flags, vs.key.af)

    if template is not None:
        target = next((d for d in dests if d.addr == template.daddr
                       and (template.dport == 0 or d.port == template.dport)), None)
        valid = target is not None and not (expire_quiescent_template and target.weight == 0)
        where = (f"the persistence template of {template.caddr} "
                 f"({template.expires} s left) names "
                 f"{addr_port(template.daddr, template.dport)}")
        if valid and target is not None:
            reason = f"{where}; a valid template wins over the scheduler"
            if pick is not None:
                reason += f" (which would pick {pick.dest or 'none'})"
            return answer(target, reason, template, pick)
        why = ("no longer in the service" if target is None else
               "has weight 0 and expire_quiescent_template is set")
        notes.append(f"{where}, but that server {why}: the template is invalid and the "
                     "scheduler picks again")

    if pick is None:
        reason = (f"no model of scheduler {sched!r} (modelled: {', '.join(MODELLED)})")
        return answer(None, reason, template, None)
    reason = pick.reason
    if persistent and template is None and conn_table is not None:
        reason = (f"no persistence template for {client_network(vs, client.addr)}, so the "
                  f"scheduler decides (and a template is created): {reason}")
    return answer(pick.dest, reason, template, pick)
