"""Byte-exact ipvsadm 1.31 listings (-L, --stats, --rate, -S, --timeout ...) from IPVS values.

Pure: it takes the frozen values of ipvsproxy.core.ipvs and returns text. Name lookups (what
ipvsadm does without -n) go through an injected Resolver. Every quirk cited below is from
ipvsadm.c or libipvs/libipvs.c of ipvsadm 1.31 (Debian bookworm's 1:1.31-1) and glibc 2.36.
"""

from __future__ import annotations

from _socket import inet_ntoa as _ntoa  # (not socket: see core/ipvs.py AF_INET)
from collections.abc import Mapping, Sequence
from ipaddress import IPv4Address, IPv6Address
from operator import itemgetter
from typing import Protocol as TypingProtocol

from ipvsproxy.core.ipvs import (
    AF_INET,
    AF_INET6,
    FWD_BY_CODE,
    SVC_F_ONEPACKET,
    SVC_F_PERSISTENT,
    SVC_F_SCHED1,
    SVC_F_SCHED2,
    SVC_F_SCHED3,
    Fwd,
    IpvsInfo,
    ObservedDest,
    ObservedService,
    Protocol,
    ServiceKey,
    Stats,
    Timeouts,
    VirtualServer,
)
from ipvsproxy.core.ipvsadm_sort import WRAP, glibc_qsort, int32, sort_dests, sort_services

IPAddress = IPv4Address | IPv6Address

# Printing format flags (ipvsadm.c FMT_*).
FMT_NONE = 0x0000
FMT_NUMERIC = 0x0001
FMT_RULE = 0x0002
FMT_STATS = 0x0004
FMT_RATE = 0x0008
FMT_THRESHOLDS = 0x0010
FMT_PERSISTENTCONN = 0x0020
FMT_NOSORT = 0x0040
FMT_EXACT = 0x0080
FMT_TUN_INFO = 0x0100

# Tunnel types and encapsulation flags (ip_vs.h IP_VS_CONN_F_TUNNEL_TYPE_*, ..._ENCAP_FLAG_*).
TUN_IPIP, TUN_GUE, TUN_GRE = 0, 1, 2
_TUNNAMES = ("ipip", "gue", "gre")
_TUNFLAGS = ("-c", "+c", "r+c")
_TUN_FLAGS_OPTS = ("--tun-nocsum", "--tun-csum", "--tun-remcsum")

_SCHED_FLAGS = SVC_F_SCHED1 | SVC_F_SCHED2 | SVC_F_SCHED3
_ADDRPORT_BUF = 60  # addrport_to_anyname: malloc(60) + snprintf, so at most 59 characters
_NULL = "(null)"  # what glibc's printf prints for a NULL %s (fwd_name of an unknown method)


class Resolver(TypingProtocol):
    """The two lookups ipvsadm makes without -n. None means "not found"."""

    def host(self, addr: IPAddress) -> str | None:
        """gethostbyaddr(addr)->h_name (ipvsadm.c addr_to_host)."""

    def service(self, port: int, proto: str) -> str | None:
        """getservbyport(port, proto)->s_name, proto "tcp", "udp" or "sctp" (port_to_service)."""


class NoResolver:
    """Resolves nothing: names fall back to numbers, as when every lookup fails."""

    def host(self, addr: IPAddress) -> str | None:
        del addr
        return None

    def service(self, port: int, proto: str) -> str | None:
        del port, proto
        return None


NO_RESOLVER = NoResolver()

# ---------------------------------------------------------------------------------------------
# Addresses and names


def inet_ntop(addr: IPAddress) -> str:
    """glibc inet_ntop: like ipaddress, except the IPv4 tail of ::a.b.c.d and ::ffff:a.b.c.d."""
    if type(addr) is IPv4Address:
        return _ntoa(addr.packed)  # what str() gives, in half the time
    if addr.version == 4:  # a subclass
        return str(addr)
    packed = addr.packed
    words = [int.from_bytes(packed[i:i + 2], "big") for i in range(0, 16, 2)]
    best_base, best_len, cur_base, cur_len = -1, 0, -1, 0
    for i, w in enumerate([*words, 1]):  # the sentinel closes a trailing run of zeros
        if w == 0:
            if cur_base == -1:
                cur_base, cur_len = i, 0
            cur_len += 1
        elif cur_base != -1:
            if best_base == -1 or cur_len > best_len:
                best_base, best_len = cur_base, cur_len
            cur_base = -1
    if best_len < 2:
        best_base = -1
    out = ""
    for i, w in enumerate(words):
        if best_base != -1 and best_base <= i < best_base + best_len:
            if i == best_base:
                out += ":"
            continue
        if i:
            out += ":"
        if i == 6 and best_base == 0 and (best_len == 6 or (best_len == 5 and words[5] == 0xFFFF)):
            out += str(IPv4Address(packed[12:]))
            break
        out += f"{w:x}"
    if best_base != -1 and best_base + best_len == 8:
        out += ":"
    return out


_PROTO_LOWER: dict[int, str] = {Protocol.TCP: "tcp", Protocol.UDP: "udp", Protocol.SCTP: "sctp"}
_PROTO_UPPER: dict[int, str] = {Protocol.TCP: "TCP", Protocol.UDP: "UDP", Protocol.SCTP: "SCTP"}
_PROTO_OPTION: dict[int, str] = {Protocol.TCP: "-t", Protocol.UDP: "-u",
                                 Protocol.SCTP: "--sctp-service"}  # option_from_protocol


def addrport_to_anyname(addr: IPAddress, port: int, proto: int, fmt: int,
                        resolver: Resolver = NO_RESOLVER) -> str:
    """ipvsadm.c addrport_to_anyname: "a:p" or "[a]:p", names unless FMT_NUMERIC."""
    lb, rb = ("", "") if addr.version == 4 else ("[", "]")
    if fmt & FMT_NUMERIC:
        text = f"{lb}{inet_ntop(addr)}{rb}:{port}"
    else:
        # addr_to_anyname / port_to_anyname: the looked-up name, else the number.
        host = resolver.host(addr) or inet_ntop(addr)
        pname = _PROTO_LOWER.get(proto)
        service = resolver.service(port, pname) if pname else None
        text = f"{lb}{host}{rb}:{service or port}"
    return text[:_ADDRPORT_BUF - 1]


# ---------------------------------------------------------------------------------------------
# Pieces of print_service_entry


def largenum(i: int, fmt: int) -> str:
    """ipvsadm.c print_largenum."""
    if fmt & FMT_EXACT:
        s = str(i)
        return s.rjust(9 if len(s) <= 8 else len(s) + 1)
    if i < 100_000_000:
        return f"{i:9d}"
    if i < 1_000_000_000:
        return f"{i // 1000:8d}K"
    if i < 100_000_000_000:
        return f"{i // 1_000_000:8d}M"
    if i < 100_000_000_000_000:
        return f"{i // 1_000_000_000:8d}G"
    return f"{i // 1_000_000_000_000:8d}T"


def sched_flags(scheduler: str, flags: int) -> str:
    """ipvsadm.c print_sched_flags (may be empty, e.g. sh with only flag-3)."""
    table: tuple[tuple[int, str], ...]
    if scheduler in ("sh", "mh"):
        table = ((SVC_F_SCHED1, f"{scheduler}-fallback"), (SVC_F_SCHED2, f"{scheduler}-port"))
    else:
        table = ((SVC_F_SCHED1, "flag-1"), (SVC_F_SCHED2, "flag-2"), (SVC_F_SCHED3, "flag-3"))
    return ",".join(name for bit, name in table if flags & bit)


def _c_int(v: int) -> int:
    """An unsigned 32-bit value printed with %d."""
    return int32(v)


_FWD_NAMES = {0: "Masq", 1: "Local", 2: "Tunnel", 3: "Route"}  # fwd_name
_FWD_SWITCHES = {0: "-m", 1: "-g", 2: "-i", 3: "-g"}  # fwd_switch


def _fwd_name(fwd: int) -> str:
    return _FWD_NAMES.get(fwd, _NULL)


def _fwd_switch(fwd: int) -> str:
    return _FWD_SWITCHES.get(fwd, _NULL)


def _tun_info(d: ObservedDest) -> str:
    """ipvsadm.c fwd_tun_info, "n/a" when it returns NULL; snprintf(info, 16) cuts at 15."""
    rs = d.dest
    if rs.fwd != Fwd.TUNNEL:
        return "n/a"
    if rs.tun_type == TUN_IPIP:
        return "ipip"
    if rs.tun_type == TUN_GUE:
        return f"gue:{rs.tun_port}:{_tun_flag(rs.tun_flags, _TUNFLAGS)}"[:15]
    if rs.tun_type == TUN_GRE:
        return f"gre:{_tun_flag(rs.tun_flags, _TUNFLAGS)}"[:15]
    return "n/a"


def _tun_flag(flags: int, table: tuple[str, ...]) -> str:
    return table[flags] if 0 <= flags < len(table) else _NULL


def service_name(key: ServiceKey, fmt: int, resolver: Resolver = NO_RESOLVER) -> str:
    """svc_name of print_service_entry: "-t a:p" / "TCP  a:p" / "-f 5 -6" / "FWM  5 IPv6"."""
    if key.fwmark:
        mark = _c_int(key.fwmark)  # sprintf "%d" of a u32 in 1.31
        six = key.af == AF_INET6
        if fmt & FMT_RULE:
            return f"-f {mark} -6" if six else f"-f {mark}"
        return f"FWM  {mark} IPv6" if six else f"FWM  {mark}"
    assert key.addr is not None
    vname = addrport_to_anyname(key.addr, key.port, key.protocol, fmt, resolver)
    if fmt & FMT_RULE:
        stype = _PROTO_OPTION.get(key.protocol, "--xxx-service")
        return f"{stype} {vname}"
    name = f"{_PROTO_UPPER.get(key.protocol, '?'):<4} {vname}"  # protocol_name
    return name if key.af == AF_INET6 else name[:33]


def _persistence(svc: ObservedService, word: str, mask_word: str) -> str:
    """" persistent 300 mask 255.255.255.0" (listing) or " -p 300 -M 255.255.255.0" (rule)."""
    vs = svc.service
    if not vs.flags & SVC_F_PERSISTENT:
        return ""
    out = f" {word} {vs.timeout}"
    netmask = vs.effective_netmask
    if vs.key.af == AF_INET and netmask != 0xFFFFFFFF:
        out += f" {mask_word} {IPv4Address(netmask & 0xFFFFFFFF)}"  # inet_ntoa
    if vs.key.af == AF_INET6 and netmask != 128:
        out += f" {mask_word} {int32(netmask)}"  # "%i"
    return out


def _service_line(svc: ObservedService, svc_name: str, fmt: int) -> str:
    vs = svc.service
    if fmt & FMT_RULE:
        line = f"-A {svc_name} -s {vs.scheduler}" + _persistence(svc, "-p", "-M")
        if vs.pe_name:  # saved even without -p
            line += f" --pe {vs.pe_name}"
        if vs.flags & SVC_F_ONEPACKET:
            line += " -o"
        if vs.flags & _SCHED_FLAGS:
            line += " -b " + sched_flags(vs.scheduler, vs.flags)
        return line
    if fmt & FMT_STATS:
        s = svc.stats
        return f"{svc_name:<33}" + "".join(
            largenum(v, fmt) for v in (s.conns, s.inpkts, s.outpkts, s.inbytes, s.outbytes))
    if fmt & FMT_RATE:
        s = svc.stats
        return f"{svc_name:<33}" + "".join(
            largenum(v, fmt) for v in (s.cps, s.inpps, s.outpps, s.inbps, s.outbps))
    line = f"{svc_name} {vs.scheduler}"
    if vs.flags & _SCHED_FLAGS:
        line += f" ({sched_flags(vs.scheduler, vs.flags)})"
    line += _persistence(svc, "persistent", "mask")
    if vs.flags & SVC_F_PERSISTENT and vs.pe_name:  # listed only for persistent services
        line += f" pe {vs.pe_name}"
    if vs.flags & SVC_F_ONEPACKET:
        line += " ops"
    return line


def _dest_line(svc_name: str, d: ObservedDest, proto: int, fmt: int, resolver: Resolver) -> str:
    rs = d.dest
    dname = addrport_to_anyname(rs.key.addr, rs.key.port, proto, fmt, resolver)
    if not fmt & FMT_RULE and rs.af != AF_INET6:
        dname = dname[:28]
    weight = _c_int(rs.weight)
    if fmt & FMT_RULE:
        line = f"-a {svc_name} -r {dname} {_fwd_switch(rs.fwd)} -w {weight}"
        if rs.fwd == Fwd.TUNNEL:  # print_tunnel_rule
            if rs.tun_type == TUN_GRE:
                line += f" --tun-type gre {_tun_flag(rs.tun_flags, _TUN_FLAGS_OPTS)}"
            elif rs.tun_type == TUN_GUE:
                line += (f" --tun-type gue --tun-port {rs.tun_port}"
                         f" {_tun_flag(rs.tun_flags, _TUN_FLAGS_OPTS)}")
            elif rs.tun_type == TUN_IPIP:
                line += " --tun-type ipip"
        return line
    s: Stats = d.stats
    if fmt & FMT_STATS:
        return f"  -> {dname:<28}" + "".join(
            largenum(v, fmt) for v in (s.conns, s.inpkts, s.outpkts, s.inbytes, s.outbytes))
    if fmt & FMT_RATE:
        return (f"  -> {dname:<28} {s.cps:8d} {s.inpps:8d} {s.outpps:8d}"
                + largenum(s.inbps, fmt) + largenum(s.outbps, fmt))
    if fmt & FMT_THRESHOLDS:
        return (f"  -> {dname:<28} {rs.u_threshold:<10d} {rs.l_threshold:<10d} "
                f"{d.active_conns:<10d} {d.inact_conns:<10d}")
    if fmt & FMT_PERSISTENTCONN:
        return (f"  -> {dname:<28} {rs.weight:<9d} {d.persist_conns:<11d} "
                f"{d.active_conns:<10d} {d.inact_conns:<10d}")
    if fmt & FMT_TUN_INFO:
        return (f"  -> {dname:<28} {_fwd_name(rs.fwd):<7} {_tun_info(d):<13} {weight:<6d} "
                f"{d.active_conns:<10d} {d.inact_conns:<10d}")
    return (f"  -> {dname:<28} {_fwd_name(rs.fwd):<7} {weight:<6d} "
            f"{d.active_conns:<10d} {d.inact_conns:<10d}")


# ---------------------------------------------------------------------------------------------
# Whole listings


def service_entry(svc: ObservedService, fmt: int, resolver: Resolver = NO_RESOLVER,
                  names: Mapping[ServiceKey, str] | None = None) -> str:
    """ipvsadm.c print_service_entry: the service line, then its (sorted) destinations.

    names (beyond ipvsadm, for --services): ServiceKey -> "ns/name:port", appended to the
    service line after two spaces when present.
    """
    key = svc.service.key
    svc_name = service_name(key, fmt, resolver)
    line = _service_line(svc, svc_name, fmt)
    if names and key in names:
        line += "  " + names[key]
    lines = [line]
    if fmt & _PLAIN_MASK == FMT_NUMERIC:
        lines += _plain_numeric_lines(svc.dests, key.protocol, fmt, resolver)
    else:
        dests = svc.dests if fmt & FMT_NOSORT else sort_dests(svc.dests)
        lines += [_dest_line(svc_name, d, key.protocol, fmt, resolver) for d in dests]
    return "\n".join(lines) + "\n"


# The formats that change a real-server line; without any of them, and with FMT_NUMERIC, the
# line is _plain_numeric_lines' (the default -Ln listing, tens of thousands of lines).
_PLAIN_MASK = (FMT_NUMERIC | FMT_RULE | FMT_STATS | FMT_RATE | FMT_THRESHOLDS | FMT_PERSISTENTCONN
               | FMT_TUN_INFO)


def _plain_numeric_lines(dests: Sequence[ObservedDest], proto: int, fmt: int,
                         resolver: Resolver) -> list[str]:
    """The real-server lines of the -Ln listing, in ipvsadm's order (sort_dests): the same
    text as _dest_line, for tens of thousands of lines. When every address is IPv4 (the common
    case) each is turned into a number once, for the order and for the text."""
    keys = [d.dest.key for d in dests]
    nums = [int(a) for a, _ in keys if type(a) is IPv4Address]
    nosort = fmt & FMT_NOSORT
    if len(nums) == len(keys) and (nosort or not nums or max(nums) - min(nums) < WRAP):
        rows = [(n, k.port, d) for n, k, d in zip(nums, keys, dests, strict=True)]
        if not nosort:
            rows.sort(key=_ADDR_PORT)  # what sort_dests does when every address is IPv4
        out = []
        for n, port, d in rows:
            rs = d.dest
            weight = rs.weight
            if not 0 <= weight <= 0x7FFFFFFF:
                weight = int32(weight)
            out.append(_PLAIN % (f"{_ntoa(n.to_bytes(4, 'big'))}:{port}",  # at most 21 chars
                                 _FWD_NAMES.get(rs.fwd, _NULL), weight, d.active_conns,
                                 d.inact_conns))
        return out
    out = []
    for d in dests if nosort else sort_dests(dests):
        rs = d.dest
        dname = addrport_to_anyname(rs.key.addr, rs.key.port, proto, fmt, resolver)
        if rs.af != AF_INET6:
            dname = dname[:28]
        out.append(_PLAIN % (dname, _FWD_NAMES.get(rs.fwd, _NULL), _c_int(rs.weight),
                             d.active_conns, d.inact_conns))
    return out


_ADDR_PORT = itemgetter(0, 1)
_PLAIN = "  -> %-28s %-7s %-6d %-10d %-10d"  # printf formats run twice as fast as f-strings


def is_plain(fmt: int) -> bool:
    """Whether fmt is the plain -Ln listing (list_plain's)."""
    return fmt & _PLAIN_MASK == FMT_NUMERIC


# fwd_name by the low 3 bits of a real server's IPVS_DEST_ATTR_FWD_METHOD, as decoded
_LISTING_FWD = tuple(_FWD_NAMES.get(f, _NULL) for f in FWD_BY_CODE)


def _cmp_rows(r1: tuple[int, ...], r2: tuple[int, ...]) -> int:
    """cmp_dests for two IPv4 listing rows (address, port, ...)."""
    return int32(r1[0] - r2[0]) or r1[1] - r2[1]


def listing_lines(rows: list[tuple[int, ...]], fmt: int) -> list[str]:
    """The real-server lines of the plain -Ln listing from IPv4 listing rows (address as a
    host-order integer, port, forwarding method (low 3 bits), weight, active, inactive), as
    the kernel layer's listing_rows() reads them: the text _plain_numeric_lines makes of the
    same real servers, in the same order (tested against it)."""
    if len(rows) > 1 and not fmt & FMT_NOSORT:
        first = [r[0] for r in rows]
        # (address, port) is unique in a service: tuple order is sort_dests' order
        rows = sorted(rows) if max(first) - min(first) < WRAP else glibc_qsort(rows, _cmp_rows)
    return [_PLAIN % (f"{_ntoa(n.to_bytes(4, 'big'))}:{port}", _LISTING_FWD[fwd & 7],
                      weight if weight <= 0x7FFFFFFF else int32(weight), act, inact)
            for n, port, fwd, weight, act, inact in rows]


def plain_block(vs: VirtualServer, dests: list[tuple[int, ...]] | tuple[ObservedDest, ...],
                fmt: int, resolver: Resolver = NO_RESOLVER,
                names: Mapping[ServiceKey, str] | None = None) -> str:
    """service_entry for the plain -Ln listing (is_plain(fmt)), the real servers given as the
    kernel layer's listing_rows() gives them: listing rows or ObservedDests."""
    key = vs.key
    line = _service_line(ObservedService(vs), service_name(key, fmt, resolver), fmt)
    if names and key in names:
        line += "  " + names[key]
    lines = (listing_lines(dests, fmt) if isinstance(dests, list)
             else _plain_numeric_lines(dests, key.protocol, fmt, resolver))
    lines.insert(0, line)
    lines.append("")
    return "\n".join(lines)


def list_plain(info: IpvsInfo, services: Sequence[VirtualServer], blocks: Sequence[str],
               fmt: int) -> str:
    """list_all for the plain -Ln listing from the plain_block of each virtual server (both in
    kernel order): the blocks in ipvsadm's order."""
    if not fmt & FMT_NOSORT:
        at = {vs.key: i for i, vs in enumerate(services)}
        blocks = [blocks[at[s.service.key]]
                  for s in sort_services([ObservedService(vs) for vs in services])]
    return version_line(info) + title(fmt) + "".join(blocks)


def title(fmt: int) -> str:
    """ipvsadm.c print_title (nothing in FMT_RULE)."""
    head = "  -> RemoteAddress:Port\n"
    col = "Prot LocalAddress:Port"
    if fmt & FMT_STATS:
        return f"{col:<33} {'Conns':>8} {'InPkts':>8} {'OutPkts':>8} {'InBytes':>8} " \
               f"{'OutBytes':>8}\n" + head
    if fmt & FMT_RATE:
        return f"{col:<33} {'CPS':>8} {'InPPS':>8} {'OutPPS':>8} {'InBPS':>8} {'OutBPS':>8}\n" \
               + head
    if fmt & FMT_THRESHOLDS:
        return f"{col:<33} {'Uthreshold':<10} {'Lthreshold':<10} {'ActiveConn':<10} " \
               f"{'InActConn':<10}\n" + head
    if fmt & FMT_PERSISTENTCONN:
        return f"{col:<33} {'Weight':<9} {'PersistConn':<11} {'ActiveConn':<10} " \
               f"{'InActConn':<10}\n" + head
    if fmt & FMT_TUN_INFO:
        return ("Prot LocalAddress:Port Scheduler Flags\n"
                "  -> RemoteAddress:Port           Forward TunnelInfo    Weight ActiveConn "
                "InActConn\n")
    if fmt & FMT_RULE:
        return ""
    return ("Prot LocalAddress:Port Scheduler Flags\n"
            "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n")


def version_line(info: IpvsInfo) -> str:
    v = info.version
    return (f"IP Virtual Server version {(v >> 16) & 0xFF}.{(v >> 8) & 0xFF}.{v & 0xFF} "
            f"(size={_c_int(info.conn_tab_size)})\n")


def list_all(info: IpvsInfo, services: Sequence[ObservedService], fmt: int,
             resolver: Resolver = NO_RESOLVER,
             names: Mapping[ServiceKey, str] | None = None) -> str:
    """ipvsadm.c list_all (-L and, with FMT_RULE, -S): services in dump order, sorted unless
    FMT_NOSORT."""
    out = "" if fmt & FMT_RULE else version_line(info)
    ordered = services if fmt & FMT_NOSORT else sort_services(services)
    out += title(fmt)
    return out + "".join(service_entry(s, fmt, resolver, names) for s in ordered)


def list_service(svc: ObservedService, fmt: int, resolver: Resolver = NO_RESOLVER,
                 names: Mapping[ServiceKey, str] | None = None) -> str:
    """ipvsadm.c list_service (-L -t/-u/--sctp-service/-f): titles and one block, no version."""
    return title(fmt) + service_entry(svc, fmt, resolver, names)


def list_timeout(t: Timeouts) -> str:
    """ipvsadm.c list_timeout."""
    return f"Timeout (tcp tcpfin udp): {_c_int(t.tcp)} {_c_int(t.tcp_fin)} {_c_int(t.udp)}\n"
