"""The IPVS netlink codec, byte for byte against pyroute2's own encoder and decoder.

pyroute2 (ipvsmsg) is the reference: for random services and real servers our request bytes
must equal the bytes pyroute2 produces for the same attributes, and our decoder must read
pyroute2-encoded messages (the same layout as the kernel's dump replies) back exactly.
"""

from __future__ import annotations

import contextlib
import struct
from ipaddress import IPv4Address, IPv6Address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroute2.netlink.generic.ipvs import ipvsmsg

from ipvsproxy.core.ipvs import (
    AF_INET,
    AF_INET6,
    DestKey,
    Fwd,
    IpvsOp,
    OpKind,
    Protocol,
    RealServer,
    ServiceKey,
    VirtualServer,
)
from ipvsproxy.kernel import ipvs_codec as c
from ipvsproxy.kernel.ipvs import encode_op

FAMILY = 0x25
SCHEDULERS = ["rr", "wrr", "lc", "wlc", "sh", "mh", "dh", "sed", "nq", "lblc", "lblcr", "fo", "ovf"]

v4 = st.integers(0, 2**32 - 1).map(IPv4Address)
v6 = st.integers(0, 2**128 - 1).map(IPv6Address)
ports = st.integers(0, 65535)


@st.composite
def service_keys(draw: st.DrawFn) -> ServiceKey:
    if draw(st.booleans()) and draw(st.booleans()):
        return ServiceKey.mark(draw(st.integers(1, 2**32 - 1)), draw(st.sampled_from([2, 10])))
    addr = draw(st.one_of(v4, v6))
    return ServiceKey.inet(draw(st.sampled_from([Protocol.TCP, Protocol.UDP, Protocol.SCTP])),
                           addr, draw(ports))


@st.composite
def services(draw: st.DrawFn) -> VirtualServer:
    key = draw(service_keys())
    netmask = draw(st.integers(1, 128)) if key.af == AF_INET6 else draw(st.integers(0, 2 ** 32 - 1))
    return VirtualServer(key, draw(st.sampled_from(SCHEDULERS)), draw(st.integers(0, 0x3F)) & ~0x2,
                         draw(st.integers(0, 2**31)), netmask,
                         draw(st.sampled_from(["", "sip"])))


@st.composite
def dests(draw: st.DrawFn) -> RealServer:
    return RealServer(DestKey(draw(st.one_of(v4, v6)), draw(ports)),
                      draw(st.sampled_from([Fwd.MASQ, Fwd.LOCALNODE, Fwd.ROUTE, Fwd.BYPASS])),
                      draw(st.integers(0, 65535)), draw(st.integers(0, 2**32 - 1)),
                      draw(st.integers(0, 2**32 - 1)))


def _pr_key(key: ServiceKey) -> list[tuple[str, object]]:
    a: list[tuple[str, object]] = [("IPVS_SVC_ATTR_AF", key.af)]
    if key.fwmark:
        return [*a, ("IPVS_SVC_ATTR_FWMARK", key.fwmark)]
    return [*a, ("IPVS_SVC_ATTR_PROTOCOL", int(key.protocol)),
            ("IPVS_SVC_ATTR_ADDR", str(key.addr)), ("IPVS_SVC_ATTR_PORT", key.port)]


def _pr_netmask(vs: VirtualServer) -> str:
    # pyroute2 types the netmask as ip4addr: give it the four bytes our encoder must send.
    raw = (struct.pack("=I", vs.effective_netmask) if vs.key.af == AF_INET6
           else struct.pack(">I", vs.effective_netmask))
    return str(IPv4Address(raw))


def _pr_service(vs: VirtualServer) -> list[tuple[str, object]]:
    a = [*_pr_key(vs.key), ("IPVS_SVC_ATTR_SCHED_NAME", vs.scheduler)]
    if vs.pe_name:
        a.append(("IPVS_SVC_ATTR_PE_NAME", vs.pe_name))
    return [*a, ("IPVS_SVC_ATTR_FLAGS", {"flags": vs.flags, "mask": 0xFFFFFFFF}),
            ("IPVS_SVC_ATTR_TIMEOUT", vs.timeout), ("IPVS_SVC_ATTR_NETMASK", _pr_netmask(vs))]


def _pr_dest(rs: RealServer) -> list[tuple[str, object]]:
    return [*_pr_dest_key(rs),
            ("IPVS_DEST_ATTR_FWD_METHOD", int(rs.fwd)), ("IPVS_DEST_ATTR_WEIGHT", rs.weight),
            ("IPVS_DEST_ATTR_U_THRESH", rs.u_threshold),
            ("IPVS_DEST_ATTR_L_THRESH", rs.l_threshold)]


def _pr_dest_key(rs: RealServer) -> list[tuple[str, object]]:
    return [("IPVS_DEST_ATTR_ADDR_FAMILY", rs.af), ("IPVS_DEST_ATTR_ADDR", str(rs.key.addr)),
            ("IPVS_DEST_ATTR_PORT", rs.key.port)]


def _pyroute2(cmd: int, flags: int, seq: int, attrs: list[tuple[str, object]]) -> bytes:
    msg = ipvsmsg()
    msg["cmd"] = cmd
    msg["version"] = 1
    msg["attrs"] = attrs
    msg["header"]["type"] = FAMILY
    msg["header"]["flags"] = flags
    msg["header"]["sequence_number"] = seq
    msg["header"]["pid"] = 0
    msg.encode()
    return bytes(msg.data)


ACK = c.NLM_F_REQUEST | c.NLM_F_ACK


@settings(max_examples=300, deadline=None)
@given(services(), st.integers(1, 2**31 - 1))
def test_service_requests_equal_pyroute2(vs: VirtualServer, seq: int) -> None:
    for kind in (OpKind.ADD_SERVICE, OpKind.EDIT_SERVICE):
        ours = encode_op(IpvsOp(kind, service=vs), FAMILY, seq)
        attrs = [("IPVS_CMD_ATTR_SERVICE", {"attrs": _pr_service(vs)})]
        ref = _pyroute2(int(kind), ACK, seq, attrs)
        assert ours == ref
    ours = encode_op(IpvsOp(OpKind.DEL_SERVICE, service=vs), FAMILY, seq)
    ref = _pyroute2(3, ACK, seq, [("IPVS_CMD_ATTR_SERVICE", {"attrs": _pr_key(vs.key)})])
    assert ours == ref


@settings(max_examples=300, deadline=None)
@given(services(), dests(), st.integers(1, 2**31 - 1))
def test_dest_requests_equal_pyroute2(vs: VirtualServer, rs: RealServer, seq: int) -> None:
    svc = ("IPVS_CMD_ATTR_SERVICE", {"attrs": _pr_key(vs.key)})
    for kind in (OpKind.ADD_DEST, OpKind.EDIT_DEST):
        ours = encode_op(IpvsOp(kind, service=vs, dest=rs), FAMILY, seq)
        ref = _pyroute2(int(kind), ACK, seq, [svc, ("IPVS_CMD_ATTR_DEST", {"attrs": _pr_dest(rs)})])
        assert ours == ref
    ours = encode_op(IpvsOp(OpKind.DEL_DEST, service=vs, dest=rs), FAMILY, seq)
    ref = _pyroute2(7, ACK, seq, [svc, ("IPVS_CMD_ATTR_DEST", {"attrs": _pr_dest_key(rs)})])
    assert ours == ref


def test_simple_commands_equal_pyroute2() -> None:
    assert encode_op(IpvsOp(OpKind.FLUSH), FAMILY, 9) == _pyroute2(17, ACK, 9, [])
    assert encode_op(IpvsOp(OpKind.ZERO), FAMILY, 9) == _pyroute2(16, ACK, 9, [])


def _reply(cmd: int, attrs: list[tuple[str, object]]) -> memoryview:
    """A pyroute2-encoded message, as the payload after nlmsghdr (what the decoder gets)."""
    raw = _pyroute2(cmd, c.NLM_F_MULTI, 1, attrs)
    ((_t, _f, _s, payload),) = list(c.iter_messages(raw))
    return payload


STATS64 = {"attrs": [(f"IPVS_STATS_ATTR_{n}", v) for n, v in [
    ("CONNS", 1), ("INPKTS", 2), ("OUTPKTS", 3), ("INBYTES", 2**40), ("OUTBYTES", 5), ("CPS", 6),
    ("INPPS", 7), ("OUTPPS", 8), ("INBPS", 9), ("OUTBPS", 2**33)]]}


@settings(max_examples=300, deadline=None)
@given(services())
def test_decode_service_reads_pyroute2_encoding(vs: VirtualServer) -> None:
    attrs = [*_pr_service(vs), ("IPVS_SVC_ATTR_STATS64", STATS64)]
    got, stats = c.decode_service(_reply(4, [("IPVS_CMD_ATTR_SERVICE", {"attrs": attrs})]))
    assert got == vs
    assert (stats.conns, stats.inbytes, stats.outbps) == (1, 2**40, 2**33)


@settings(max_examples=300, deadline=None)
@given(dests(), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_decode_dest_reads_pyroute2_encoding(rs: RealServer, active: int, inact: int) -> None:
    attrs = [*_pr_dest(rs), ("IPVS_DEST_ATTR_ACTIVE_CONNS", active),
             ("IPVS_DEST_ATTR_INACT_CONNS", inact), ("IPVS_DEST_ATTR_STATS64", STATS64)]
    got = c.decode_dest(_reply(8, [("IPVS_CMD_ATTR_DEST", {"attrs": attrs})]), AF_INET)
    assert got.dest == rs
    assert (got.active_conns, got.inact_conns, got.stats.inpkts) == (active, inact, 2)


def test_hashed_flag_is_never_sent_and_stripped_on_read() -> None:
    vs = VirtualServer(ServiceKey.inet(Protocol.TCP, IPv4Address("10.0.0.1"), 80), flags=0x3)
    msg = encode_op(IpvsOp(OpKind.ADD_SERVICE, service=vs), FAMILY, 1)
    ((_t, _f, _s, payload),) = list(c.iter_messages(msg))
    got, _ = c.decode_service(payload)
    assert got.flags == 0x1


def test_ipv6_netmask_is_the_prefix_length_in_host_order() -> None:
    vs = VirtualServer(ServiceKey.inet(Protocol.TCP, IPv6Address("fd00::1"), 80))
    assert struct.pack("=I", 128) in c.service_attrs(vs)
    assert vs.effective_netmask == 128


def test_ack_and_error_messages() -> None:
    ok = struct.pack("=IHHII", 36, c.NLMSG_ERROR, 0, 5, 0) + struct.pack("=i", 0) + b"\0" * 16
    bad = struct.pack("=IHHII", 36, c.NLMSG_ERROR, 0, 6, 0) + struct.pack("=i", -17) + b"\0" * 16
    got = [(seq, c.error_code(p)) for _, _, seq, p in c.iter_messages(ok + bad)]
    assert got == [(5, 0), (6, 17)]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_give_clean_errors_only(data: bytes) -> None:
    try:
        for _t, _f, _s, payload in c.iter_messages(data):
            for decode in (c.decode_info, c.decode_timeouts):
                decode(payload)
            with contextlib.suppress(c.DecodeError, ValueError):
                c.decode_service(payload)
            c.decode_dest(payload, AF_INET)
    except (c.DecodeError, ValueError):
        pass


@pytest.mark.parametrize("cut", range(1, 60, 7))
def test_truncated_dump_reply_is_a_decode_error(cut: int) -> None:
    vs = VirtualServer(ServiceKey.inet(Protocol.UDP, IPv4Address("10.0.0.53"), 53), "sh")
    msg = _pyroute2(4, c.NLM_F_MULTI, 1, [("IPVS_CMD_ATTR_SERVICE", {"attrs": _pr_service(vs)})])
    with pytest.raises(c.DecodeError):
        for _t, _f, _s, p in c.iter_messages(msg[:-cut]):
            c.decode_service(p)


@settings(max_examples=200, deadline=None)
@given(st.lists(dests(), min_size=1, max_size=6), st.integers(0, 2**32 - 1))
def test_fast_dump_decoder_equals_generic(rss: list[RealServer], active: int) -> None:
    dec = c.DumpDecoder()
    for rs in rss * 2:  # the second round goes through learned layouts
        attrs = [*_pr_dest(rs), ("IPVS_DEST_ATTR_ACTIVE_CONNS", active),
                 ("IPVS_DEST_ATTR_STATS64", STATS64)]
        payload = _reply(8, [("IPVS_CMD_ATTR_DEST", {"attrs": attrs})])
        assert dec.dest(payload, AF_INET) == c.decode_dest(payload, AF_INET)


def test_fast_dump_decoder_falls_back_on_a_different_shape() -> None:
    dec = c.DumpDecoder()
    rs = RealServer(DestKey(IPv4Address("10.0.0.1"), 80), weight=5)
    full = [*_pr_dest(rs), ("IPVS_DEST_ATTR_STATS64", STATS64)]
    # same length, different attribute order: the header check must catch it
    swapped = [full[1], full[0], *full[2:]]
    for attrs in (full, swapped, full):
        payload = _reply(8, [("IPVS_CMD_ATTR_DEST", {"attrs": attrs})])
        assert dec.dest(payload, AF_INET) == c.decode_dest(payload, AF_INET)


@settings(max_examples=100, deadline=None)
@given(services(), st.lists(dests(), min_size=1, max_size=4))
def test_key_cache_encodes_the_same_bytes(vs: VirtualServer, rss: list[RealServer]) -> None:
    from ipvsproxy.kernel.ipvs import _encode

    cache: dict[ServiceKey, bytes] = {}
    for kind in (OpKind.ADD_DEST, OpKind.EDIT_DEST, OpKind.DEL_DEST):
        for i, rs in enumerate(rss):
            op = IpvsOp(kind, service=vs, dest=rs)
            assert _encode(op, FAMILY, i + 1, cache) == encode_op(op, FAMILY, i + 1)
