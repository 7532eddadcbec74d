"""IPVS generic-netlink wire format: encode requests, decode replies. Bytes in, bytes out.

The only place that builds IPVS messages. pyroute2 spends ~280 us of Python per message; this
encoder builds a request in a few microseconds, and the decoder walks a dump with struct and
memoryview. Attribute numbers and types follow include/uapi/linux/ip_vs.h; attribute order follows
ipvsadm's libipvs (ipvs_nl_fill_service_attr / ipvs_nl_fill_dest_attr) except that a real
server's address family comes first, and the bytes are tested
against pyroute2's own encoder (tests/unit/test_ipvs_codec.py).
"""

from __future__ import annotations

import os
import struct
from _socket import htons  # (not socket: see core/ipvs.py AF_INET)
from collections.abc import Callable, Iterator
from ipaddress import IPv4Address, IPv6Address

from ipvsproxy.core.ipvs import (
    AF_INET,
    AF_INET6,
    CONN_F_FWD_MASK,
    FWD_BY_CODE,
    SVC_F_HASHED,
    DestKey,
    Fwd,
    IpvsInfo,
    ObservedDest,
    Protocol,
    RealServer,
    ServiceKey,
    Stats,
    Timeouts,
    VirtualServer,
)

# netlink.h
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
GENL_VERSION = 1  # IPVS_GENL_VERSION

# ip_vs.h commands
CMD_NEW_SERVICE, CMD_SET_SERVICE, CMD_DEL_SERVICE, CMD_GET_SERVICE = 1, 2, 3, 4
CMD_NEW_DEST, CMD_SET_DEST, CMD_DEL_DEST, CMD_GET_DEST = 5, 6, 7, 8
CMD_SET_CONFIG, CMD_GET_CONFIG, CMD_GET_INFO, CMD_ZERO, CMD_FLUSH = 12, 13, 15, 16, 17

# IPVS_CMD_ATTR_*
A_SERVICE, A_DEST, A_TIMEOUT_TCP, A_TIMEOUT_TCP_FIN, A_TIMEOUT_UDP = 1, 2, 4, 5, 6
# IPVS_SVC_ATTR_*
S_AF, S_PROTOCOL, S_ADDR, S_PORT, S_FWMARK, S_SCHED, S_FLAGS = 1, 2, 3, 4, 5, 6, 7
S_TIMEOUT, S_NETMASK, S_STATS, S_PE_NAME, S_STATS64 = 8, 9, 10, 11, 12
# IPVS_DEST_ATTR_*
D_ADDR, D_PORT, D_FWD, D_WEIGHT, D_UTHRESH, D_LTHRESH = 1, 2, 3, 4, 5, 6
D_ACTIVE, D_INACT, D_PERSIST, D_STATS, D_AF, D_STATS64 = 7, 8, 9, 10, 11, 12
D_TUN_TYPE, D_TUN_PORT, D_TUN_FLAGS = 13, 14, 15
# IPVS_INFO_ATTR_*
I_VERSION, I_CONN_TAB_SIZE = 1, 2

NLA_F_NESTED = 0x8000
_HDR = HDR = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_GENL = struct.Struct("=BBH")  # genlmsghdr: cmd, version, reserved
_NLA = struct.Struct("=HH")
_U16 = struct.Struct("=H")
_BE16 = struct.Struct(">H")
_U32 = struct.Struct("=I")
_ERR = struct.Struct("=i")


class DecodeError(ValueError):
    """A netlink reply that does not parse: truncated, or lengths that do not add up."""


def _nla(atype: int, payload: bytes) -> bytes:
    n = 4 + len(payload)
    return _NLA.pack(n, atype) + payload + b"\0" * (-n & 3)


def _addr(addr: IPv4Address | IPv6Address) -> bytes:
    return addr.packed  # 4 bytes for IPv4 (the kernel zero-fills nf_inet_addr), 16 for IPv6


def service_key_attrs(key: ServiceKey) -> bytes:
    out = _nla(S_AF, _U16.pack(key.af))
    if key.fwmark:
        return out + _nla(S_FWMARK, _U32.pack(key.fwmark))
    assert key.addr is not None
    return (out + _nla(S_PROTOCOL, _U16.pack(key.protocol)) + _nla(S_ADDR, _addr(key.addr))
            + _nla(S_PORT, _BE16.pack(key.port)))


def _netmask_bytes(vs: VirtualServer) -> bytes:
    # The kernel reads the attribute as __be32 and, for IPv6, compares that raw value with
    # 1..128 (ip_vs_ctl.c ip_vs_add_service), so IPv6 carries the prefix length in host order.
    if vs.key.af == AF_INET6:
        return _U32.pack(vs.effective_netmask)
    return struct.pack(">I", vs.effective_netmask)


def service_attrs(vs: VirtualServer) -> bytes:
    out = service_key_attrs(vs.key) + _nla(S_SCHED, vs.scheduler.encode() + b"\0")
    if vs.pe_name:
        out += _nla(S_PE_NAME, vs.pe_name.encode() + b"\0")
    # flags + mask: the mask says which bits this request sets (all of them, as ipvsadm does).
    return (out + _nla(S_FLAGS, struct.pack("=II", vs.flags & ~SVC_F_HASHED, 0xFFFFFFFF))
            + _nla(S_TIMEOUT, _U32.pack(vs.timeout)) + _nla(S_NETMASK, _netmask_bytes(vs)))


def dest_key_attrs(dest: DestKey) -> bytes:
    # The family goes first (and also into deletes) so a real server of another family than its
    # service (tunnel forwarding) is named exactly; pyroute2 needs it first to type the address.
    af = AF_INET6 if dest.addr.version == 6 else AF_INET
    return (_nla(D_AF, _U16.pack(af)) + _nla(D_ADDR, _addr(dest.addr))
            + _nla(D_PORT, _BE16.pack(dest.port)))


# A real server's attributes but a tunnel's, in one pack: what the attribute by attribute
# encoding below makes of it, byte for byte (tests/unit/test_ipvs_codec.py). A cold node
# encodes one per real server (138,867 at 10,000 services): a whole request went from 3.08 to
# 2.04 us on the host with it. The port is big-endian in the attribute: htons() of it packs
# as a native u16.
_DEST_AF = {4: (struct.Struct("=HHH2xHH4sHHH2xHHIHHIHHIHHI"), 8, AF_INET),
            6: (struct.Struct("=HHH2xHH16sHHH2xHHIHHIHHIHHI"), 20, AF_INET6)}


def dest_attrs(rs: RealServer) -> bytes:
    if rs.fwd != Fwd.TUNNEL:
        key = rs.key
        addr = key.addr
        packer, addr_len, af = _DEST_AF[addr.version]
        return packer.pack(6, D_AF, af, addr_len, D_ADDR, addr.packed, 6, D_PORT, htons(key.port),
                           8, D_FWD, int(rs.fwd) & CONN_F_FWD_MASK, 8, D_WEIGHT, rs.weight,
                           8, D_UTHRESH, rs.u_threshold, 8, D_LTHRESH, rs.l_threshold)
    out = (dest_key_attrs(rs.key) + _nla(D_FWD, _U32.pack(int(rs.fwd) & CONN_F_FWD_MASK))
           + _nla(D_WEIGHT, _U32.pack(rs.weight)))
    if rs.fwd == Fwd.TUNNEL:
        out += (_nla(D_TUN_TYPE, bytes([rs.tun_type])) + _nla(D_TUN_PORT, _BE16.pack(rs.tun_port))
                + _nla(D_TUN_FLAGS, _U16.pack(rs.tun_flags)))
    return (out + _nla(D_UTHRESH, _U32.pack(rs.u_threshold))
            + _nla(D_LTHRESH, _U32.pack(rs.l_threshold)))


def message(family: int, cmd: int, flags: int, seq: int, attrs: bytes = b"") -> bytes:
    body = _GENL.pack(cmd, GENL_VERSION, 0) + attrs
    return _HDR.pack(16 + len(body), family, flags, seq, 0) + body


def nested(atype: int, payload: bytes) -> bytes:
    # ipvsadm (libnl nla_nest_start) does not set NLA_F_NESTED, and neither does pyroute2.
    return _nla(atype, payload)


# ---------------------------------------------------------------------------------- decoding


def iter_messages(buf: bytes | memoryview) -> Iterator[tuple[int, int, int, memoryview]]:
    """Yield (type, flags, seq, payload) for each netlink message in a receive buffer."""
    mv = memoryview(buf)
    off, end = 0, len(mv)
    while off + 16 <= end:
        length, mtype, flags, seq, _pid = _HDR.unpack_from(mv, off)
        if length < 16 or off + length > end:
            raise DecodeError(f"netlink message length {length} at offset {off} overruns {end}")
        yield mtype, flags, seq, mv[off + 16: off + length]
        off += (length + 3) & ~3
    if off < end and any(mv[off:end]):
        raise DecodeError(f"{end - off} trailing bytes after the last netlink message")


def replies(recv: Callable[[], bytes], seq: int, what: str) -> list[memoryview]:
    """The payloads answering request `seq` (a dump's parts, or a reply before its ack), read
    with recv() until its NLMSG_DONE or NLMSG_ERROR; an error raises OSError naming `what`."""
    out: list[memoryview] = []
    while True:
        done = False
        for mtype, _flags, mseq, payload in iter_messages(recv()):
            if mseq != seq:
                continue
            if mtype == NLMSG_DONE:
                done = True
            elif mtype == NLMSG_ERROR:
                err = error_code(payload)
                if err:
                    raise OSError(err, f"{what}: {os.strerror(err)}")
                done = True  # the ack
            else:
                out.append(payload)
        if done:
            return out


def error_code(payload: memoryview) -> int:
    """The errno of an NLMSG_ERROR payload (0 for an ack), as a positive number."""
    if len(payload) < 4:
        raise DecodeError("truncated NLMSG_ERROR")
    return -int(_ERR.unpack_from(payload, 0)[0])


def attrs(mv: memoryview) -> dict[int, memoryview]:
    out: dict[int, memoryview] = {}
    off, end = 0, len(mv)
    while off + 4 <= end:
        n, t = _NLA.unpack_from(mv, off)
        if n < 4 or off + n > end:
            raise DecodeError(f"attribute length {n} at offset {off} overruns {end}")
        out[t & 0x3FFF] = mv[off + 4: off + n]
        off += (n + 3) & ~3
    return out


def _u32(a: dict[int, memoryview], t: int, default: int = 0) -> int:
    v = a.get(t)
    if v is None:
        return default
    if len(v) < 4:
        raise DecodeError(f"attribute {t} too short for u32")
    return int(_U32.unpack_from(v)[0])


def _u16(a: dict[int, memoryview], t: int, be: bool = False) -> int:
    v = a.get(t)
    if v is None:
        return 0
    if len(v) < 2:
        raise DecodeError(f"attribute {t} too short for u16")
    return int((_BE16 if be else _U16).unpack_from(v)[0])


def _ip(v: memoryview | None, af: int) -> IPv4Address | IPv6Address:
    if v is None:
        raise DecodeError("address attribute missing")
    if af == AF_INET6:
        if len(v) < 16:
            raise DecodeError("IPv6 address attribute too short")
        return IPv6Address(bytes(v[:16]))
    if len(v) < 4:
        raise DecodeError("IPv4 address attribute too short")
    return IPv4Address(bytes(v[:4]))


def decode_stats(a: dict[int, memoryview]) -> Stats:
    """Prefer the 64-bit nest (IPVS_*_ATTR_STATS64, kernel >= 4.1), else the 32-bit one."""
    raw = a.get(S_STATS64)  # S_STATS64 == D_STATS64 == 12, S_STATS == D_STATS == 10
    wide = raw is not None
    if raw is None:
        raw = a.get(S_STATS)
    if raw is None:
        return Stats()
    s = attrs(raw)
    vals = []
    for t in range(1, 11):
        v = s.get(t)
        if v is None:
            vals.append(0)
        elif wide or t in (4, 5):  # inbytes/outbytes are u64 even in the 32-bit nest
            if len(v) < 8:
                raise DecodeError(f"stats attribute {t} too short")
            vals.append(int(struct.unpack_from("=Q", v)[0]))
        else:
            vals.append(int(_U32.unpack_from(v)[0]) if len(v) >= 4 else 0)
    return Stats(*vals)


def decode_service(payload: memoryview) -> tuple[VirtualServer, Stats]:
    top = attrs(payload[4:])
    nest = top.get(A_SERVICE)
    if nest is None:
        raise DecodeError("service message without IPVS_CMD_ATTR_SERVICE")
    a = attrs(nest)
    af = _u16(a, S_AF)
    fwmark = _u32(a, S_FWMARK)
    if fwmark:
        key = ServiceKey(af, Protocol.NONE, None, 0, fwmark)
    else:
        key = ServiceKey(af, Protocol(_u16(a, S_PROTOCOL)), _ip(a.get(S_ADDR), af),
                         _u16(a, S_PORT, be=True))
    flags = _u32(a, S_FLAGS)  # struct ip_vs_flags {flags, mask}: the first u32 is the flags
    nm = a.get(S_NETMASK)
    if nm is None or len(nm) < 4:
        netmask = -1
    elif af == AF_INET6:
        netmask = int(_U32.unpack_from(nm)[0])
    else:
        netmask = int(struct.unpack_from(">I", nm)[0])
    sched = bytes(a.get(S_SCHED, memoryview(b""))).split(b"\0", 1)[0].decode(errors="replace")
    pe = bytes(a.get(S_PE_NAME, memoryview(b""))).split(b"\0", 1)[0].decode(errors="replace")
    vs = VirtualServer(key, sched, flags & ~SVC_F_HASHED, _u32(a, S_TIMEOUT), netmask, pe)
    return vs, decode_stats(a)


def decode_dest(payload: memoryview, svc_af: int) -> ObservedDest:
    top = attrs(payload[4:])
    nest = top.get(A_DEST)
    if nest is None:
        raise DecodeError("dest message without IPVS_CMD_ATTR_DEST")
    a = attrs(nest)
    af = _u16(a, D_AF) or svc_af
    conn_flags = _u32(a, D_FWD)
    rs = RealServer(
        DestKey(_ip(a.get(D_ADDR), af), _u16(a, D_PORT, be=True)),
        FWD_BY_CODE[conn_flags & CONN_F_FWD_MASK],
        _u32(a, D_WEIGHT), _u32(a, D_UTHRESH), _u32(a, D_LTHRESH),
        a[D_TUN_TYPE][0] if D_TUN_TYPE in a and len(a[D_TUN_TYPE]) else 0,
        _u16(a, D_TUN_PORT, be=True), _u16(a, D_TUN_FLAGS),
    )
    return ObservedDest(rs, _u32(a, D_ACTIVE), _u32(a, D_INACT), _u32(a, D_PERSIST),
                        decode_stats(a))


def decode_info(payload: memoryview) -> IpvsInfo:
    a = attrs(payload[4:])
    return IpvsInfo(_u32(a, I_VERSION), _u32(a, I_CONN_TAB_SIZE))


def decode_timeouts(payload: memoryview) -> Timeouts:
    a = attrs(payload[4:])
    return Timeouts(_u32(a, A_TIMEOUT_TCP), _u32(a, A_TIMEOUT_TCP_FIN), _u32(a, A_TIMEOUT_UDP))


# A GET_DEST dump request for an inet service, in one pack: nlmsghdr, genlmsghdr, the service
# nest with family, protocol, address and port, byte for byte what message() and
# service_key_attrs() build (tested).
_DEST_REQ = {
    AF_INET: struct.Struct("=IHHII BBH HH HH H2x HH H2x HH 4s HH H2x"),
    AF_INET6: struct.Struct("=IHHII BBH HH HH H2x HH H2x HH 16s HH H2x"),
}


def dest_dump_request(family: int, seq: int, key: ServiceKey) -> bytes:
    """The GET_DEST dump request for one service (real servers with counters)."""
    st = _DEST_REQ.get(key.af) if not key.fwmark and key.addr is not None else None
    if st is None or key.addr is None or key.addr.version != (6 if key.af == AF_INET6 else 4):
        return message(family, CMD_GET_DEST, NLM_F_REQUEST | NLM_F_DUMP, seq,
                       nested(A_SERVICE, service_key_attrs(key)))
    alen = 4 + len(key.addr.packed)
    nest = 4 + 8 + 8 + alen + 8
    return st.pack(st.size, family, NLM_F_REQUEST | NLM_F_DUMP, seq, 0, CMD_GET_DEST, GENL_VERSION,
                   0, nest, A_SERVICE, 6, S_AF, key.af, 6, S_PROTOCOL, int(key.protocol), alen,
                   S_ADDR, key.addr.packed, 6, S_PORT, htons(key.port))
