"""IPVS over generic netlink: observe (dump) and apply (batched, pipelined) virtual/real servers.

The family id comes from the kernel's genl controller; requests and replies go through a plain
AF_NETLINK socket with the codec in ipvs_codec.py, because pyroute2's per-call path costs
~280 us of Python per message and one round trip per operation.

Batching: many requests are written in one send(); the kernel handles each in turn inside that
send (netlink_rcv_skb walks every message of the buffer and answers each failure), so one failed
operation never loses the others. Only a batch's last request asks for an ack (nlsock.py says
why). NETLINK_CAP_ACK keeps answers small and a large receive buffer holds a batch of them.

Real servers are dumped per virtual server, pipelined over many sockets, in this process or in
a forked child while this process decodes (ipvs_dump.py); the replies are decoded in batches.
"""

from __future__ import annotations

import _socket  # the C module (see core/ipvs.py AF_INET)
import contextlib
import errno as errno_mod
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from types import TracebackType
from typing import TypeVar

from ipvsproxy.core.gcpause import paused
from ipvsproxy.core.ipvs import (
    AF_INET,
    IPAddress,
    IpvsInfo,
    IpvsOp,
    ObservedDest,
    ObservedService,
    OpKind,
    RealServer,
    ServiceKey,
    Stats,
    Timeouts,
    VirtualServer,
    shared_dests,
)
from ipvsproxy.kernel import ipvs_codec as c
from ipvsproxy.kernel import ipvs_dump, nlsock
from ipvsproxy.kernel.ipvs_decoder import DumpDecoder

_NO_STATS = Stats()

_new = tuple.__new__  # a NamedTuple from the tuple of its fields, in C
_T = TypeVar("_T")

NETLINK_GENERIC = 16
BATCH = 256  # requests per send(); their acks wait in the receive buffer (nlsock.roomy)
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2
_RECV = 1 << 20
_DUMP_RECV = 64 << 10  # a dump reply buffer (skb) is at most 32 KiB


class IpvsUnavailable(RuntimeError):
    """The kernel has no IPVS (module not loaded and cannot be loaded)."""


class IpvsError(Exception):
    """One failed IPVS operation: which one, and the kernel's errno."""

    def __init__(self, op: IpvsOp, errno: int) -> None:
        super().__init__(op, errno)
        self.op = op
        self.errno = errno

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IpvsError) and (self.op, self.errno) == (other.op, other.errno)

    def __hash__(self) -> int:
        return hash((self.op, self.errno))

    def __str__(self) -> str:
        name = errno_mod.errorcode.get(self.errno, str(self.errno))
        return f"{self.op}: {name} ({os.strerror(self.errno)})"


def resolve_family() -> int:
    """The IPVS generic-netlink family id, asked of the kernel's genl controller.

    One CTRL_CMD_GETFAMILY request on a raw socket: pyroute2's resolution gives the same id
    (tested in the lab) but importing it and starting its socket machinery costs seconds under
    emulation and ~100 ms on hardware, which `ipvsproxy ls` cannot afford. The kernel loads
    ip_vs on this lookup if it can (genl_ctrl request_module of the family alias).
    """
    s = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_RAW, NETLINK_GENERIC)
    with contextlib.closing(s):
        s.bind((0, 0))
        nlsock.give_up_after(s, 10)
        name = c._nla(CTRL_ATTR_FAMILY_NAME, b"IPVS\0")
        s.send(c.message(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, c.NLM_F_REQUEST | c.NLM_F_ACK, 1, name))
        while True:
            for mtype, _flags, _seq, payload in c.iter_messages(s.recv(65536)):
                if mtype == c.NLMSG_ERROR:
                    err = c.error_code(payload)
                    if err:
                        raise IpvsUnavailable(
                            f"the kernel has no IPVS generic netlink family ({os.strerror(err)}); "
                            "is the ip_vs module available?")
                elif mtype == GENL_ID_CTRL:
                    fid = c.attrs(payload[4:]).get(CTRL_ATTR_FAMILY_ID)
                    if fid is not None and len(fid) >= 2:
                        return int(c._U16.unpack_from(fid)[0])


def _encode(op: IpvsOp, family: int, seq: int,
            keys: dict[ServiceKey, bytes] | None = None, ack: bool = True) -> bytes:
    flags = c.NLM_F_REQUEST | c.NLM_F_ACK if ack else c.NLM_F_REQUEST
    kind = op.kind
    if kind in (OpKind.ADD_DEST, OpKind.EDIT_DEST, OpKind.DEL_DEST):
        assert op.service is not None and op.dest is not None
        # A service's key attributes repeat in every one of its real-server ops: within a
        # batch they are encoded once (keys is the batch's cache).
        skey = keys.get(op.service.key) if keys is not None else None
        if skey is None:
            skey = c.nested(c.A_SERVICE, c.service_key_attrs(op.service.key))
            if keys is not None:
                keys[op.service.key] = skey
        dest = (c.dest_key_attrs(op.dest.key) if kind == OpKind.DEL_DEST
                else c.dest_attrs(op.dest))
        body = skey + c.nested(c.A_DEST, dest)
    elif kind in (OpKind.ADD_SERVICE, OpKind.EDIT_SERVICE):
        assert op.service is not None
        body = c.nested(c.A_SERVICE, c.service_attrs(op.service))
    elif kind == OpKind.DEL_SERVICE:
        assert op.service is not None
        body = c.nested(c.A_SERVICE, c.service_key_attrs(op.service.key))
    elif kind == OpKind.SET_TIMEOUTS:
        assert op.timeouts is not None
        t = op.timeouts
        body = (c._nla(c.A_TIMEOUT_TCP, c._U32.pack(t.tcp))
                + c._nla(c.A_TIMEOUT_TCP_FIN, c._U32.pack(t.tcp_fin))
                + c._nla(c.A_TIMEOUT_UDP, c._U32.pack(t.udp)))
    elif kind == OpKind.ZERO:
        body = c.nested(c.A_SERVICE, c.service_key_attrs(op.service.key)) if op.service else b""
    elif kind == OpKind.FLUSH:
        body = b""
    else:  # pragma: no cover - OpKind is closed
        raise ValueError(kind)
    return c.message(family, int(kind), flags, seq, body)


def encode_op(op: IpvsOp, family: int, seq: int) -> bytes:
    """The request bytes for one operation (public for tests and benchmarks)."""
    return _encode(op, family, seq)


class IpvsClient:
    """One netlink socket to the kernel's IPVS. Not thread-safe; one per thread."""

    def __init__(self, family: int | None = None) -> None:
        self.family = family if family is not None else resolve_family()
        self.sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_RAW, NETLINK_GENERIC)
        nlsock.roomy(self.sock)
        self.sock.bind((0, 0))
        nlsock.give_up_after(self.sock, 30)
        self._seq = 0
        self._decoder = DumpDecoder()
        self._view = memoryview(bytearray(_DUMP_RECV))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> IpvsClient:
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0x7FFFFFFF or 1
        return self._seq

    # ------------------------------------------------------------------------------ apply

    def apply(self, ops: Sequence[IpvsOp], batch: int = BATCH) -> list[IpvsError]:
        """Apply ops in order, pipelined in batches. Returns the failures (empty: all applied)."""
        failures: list[IpvsError] = []
        keys: dict[ServiceKey, bytes] = {}
        for start in range(0, len(ops), batch):
            chunk = ops[start:start + batch]
            pending: dict[int, IpvsOp] = {}
            parts = []
            last = len(chunk) - 1
            seq = 0
            for i, op in enumerate(chunk):
                seq = self._next_seq()
                pending[seq] = op
                # only the last asks for an ack; the others are answered if they fail
                parts.append(_encode(op, self.family, seq, keys, i == last))
            self.sock.send(b"".join(parts))
            failures.extend(IpvsError(op, err)
                            for op, err in nlsock.await_acks(self.sock, pending, seq))
        return failures

    # ---------------------------------------------------------------------------- observe

    def _request(self, cmd: int, attrs: bytes = b"") -> list[memoryview]:
        """Send one request (not a dump), return the payloads of its replies (raise on error)."""
        seq = self._next_seq()
        self.sock.send(c.message(self.family, cmd, c.NLM_F_REQUEST | c.NLM_F_ACK, seq, attrs))
        return c.replies(lambda: self.sock.recv(_RECV), seq, f"IPVS command {cmd}")

    def services(self, stats: bool = True) -> list[tuple[VirtualServer, Stats]]:
        out: list[tuple[VirtualServer, Stats]] = []
        seq = self._next_seq()
        decode, view, recv_into = self._decoder.services, self._view, self.sock.recv_into
        self.sock.send(c.message(self.family, c.CMD_GET_SERVICE, c.NLM_F_REQUEST | c.NLM_F_DUMP,
                                 seq))
        while (err := decode(view[:recv_into(view)], seq, out, stats)) is None:
            pass
        if err:
            raise OSError(err, f"IPVS command {c.CMD_GET_SERVICE}: {os.strerror(err)}")
        return out

    def dests(self, key: ServiceKey, stats: bool = True) -> tuple[ObservedDest, ...]:
        # Each receive buffer is read into the one preallocated buffer; the decoder copies what
        # it keeps. The kernel sends at most one dump buffer (skb) of 32 KiB per receive.
        out: list[ObservedDest] = []
        seq = self._next_seq()
        af, decode, view, recv_into = key.af, self._decoder.dests, self._view, self.sock.recv_into
        self.sock.send(c.dest_dump_request(self.family, seq, key))
        while (err := decode(view[:recv_into(view)], seq, af, out, stats)) is None:
            pass
        if err:
            raise OSError(err, f"IPVS command {c.CMD_GET_DEST}: {os.strerror(err)}")
        return tuple(out)

    def dump(self, stats: bool = True, reuse: Iterable[IPAddress] = (),
             share: Mapping[ServiceKey, tuple[RealServer, ...]] | None = None
             ) -> list[ObservedService]:
        """Every virtual server with its real servers, in kernel order. With stats=False the
        counters and rates are not decoded (they read as zero): the sync path needs none.
        `reuse`: address objects to use for those addresses (DumpDecoder.new_dump); `share`:
        the desired real servers. A virtual server whose real servers are exactly its share, as
        the kernel lists them, is read as_desired (DumpDecoder.many_settled: compared as words,
        nothing built or kept); the others are decoded and hold the shared objects where they
        are equal to them (core/ipvs.py shared_dests), so that the read does not keep a second
        copy of the desired state."""
        self._decoder.new_dump(reuse)
        # A dump allocates ~5 objects per real server, none of them in a cycle: the cyclic
        # garbage collector would scan all of them again and again (a third of the time).
        with paused():
            out: list[ObservedService] = []
            for part, replies in self._batches(stats):
                if share is None:
                    found = self._decode_batch(replies, part, stats, self._decoder.many_dests)
                    out += map(_new, repeat(ObservedService), zip(
                        [vs for vs, _ in part], found, [st for _, st in part],
                        repeat(False, len(part)), strict=True))
                    continue
                wants = list(map(share.get, [vs.key for vs, _ in part]))
                settled = self._settled(replies, part, wants)
                rest = [i for i, done in enumerate(settled) if not done]
                found = list(map(shared_dests, self._decode_batch(
                    [replies[i] for i in rest], [part[i] for i in rest], stats,
                    self._decoder.many_dests), [wants[i] for i in rest]))
                dests: list[tuple[ObservedDest, ...]] = [()] * len(part)
                for i, got in zip(rest, found, strict=True):
                    dests[i] = got
                out += map(_new, repeat(ObservedService), zip(
                    [vs for vs, _ in part], dests, [st for _, st in part], settled,
                    strict=True))
            return out

    def _settled(self, replies: list[ipvs_dump.Reply], part: list[tuple[VirtualServer, Stats]],
                 wants: list[tuple[RealServer, ...] | None]) -> list[bool]:
        """Which of `part` hold exactly their wants (DumpDecoder.many_settled), per address
        family; none where the decoder cannot tell at once (it has not learned the layout yet,
        IPv6, an odd message): those are decoded."""
        settled = [False] * len(part)
        by_af: dict[int, list[int]] = {}
        for i, (vs, _) in enumerate(part):
            by_af.setdefault(vs.key.af, []).append(i)
        for af, idx in by_af.items():
            got = self._decoder.many_settled([replies[i] for i in idx], af,
                                             [wants[i] for i in idx])
            for i, done in zip(idx, got or (), strict=False):
                settled[i] = done
        return settled

    def listing_rows(self, services: Sequence[VirtualServer] | None = None, fork: bool = True
                     ) -> Iterator[tuple[VirtualServer, list[tuple[int, ...]]
                                         | tuple[ObservedDest, ...]]]:
        """What `ls -Ln` prints, batch by batch as the replies come: every virtual server (in
        kernel order; or these ones) with its real servers, as DumpDecoder.many_listing_rows() reads
        them where it can (IPv4 real servers of the usual layout: no objects built), else as
        dump() does. No counters. fork=False: no child process reads them."""
        self._decoder.new_dump()
        given = None if services is None else [(vs, _NO_STATS) for vs in services]
        for part, replies in self._batches(False, given, fork):
            found = self._decode_batch(replies, part, False, self._listing_many)
            yield from zip([vs for vs, _ in part], found, strict=True)

    def _listing_many(self, replies: list[ipvs_dump.Reply], af: int, stats: bool
                      ) -> list[list[tuple[int, ...]]] | None:
        return self._decoder.many_listing_rows(replies, af) if af == AF_INET else None

    def _batches(self, stats: bool, services: list[tuple[VirtualServer, Stats]] | None = None,
                 fork: bool = True) -> Iterator[tuple[list[tuple[VirtualServer, Stats]],
                                                      list[ipvs_dump.Reply]]]:
        """The virtual servers (one dump, kernel order; or these) and, batch by batch, the
        replies of their real-server dumps: read by a child process where that pays
        (ipvs_dump) unless fork is False."""
        if services is None:
            services = self.services(stats)
        if not services:
            return
        keys = [vs.key for vs, _ in services]
        seq = self._seq + 1
        self._seq = (seq + len(keys)) & 0x7FFFFFFF
        forked = fork and ipvs_dump.may_fork(len(keys))
        read = ipvs_dump.forked if forked else ipvs_dump.in_process
        done = 0
        for replies in read(self.family, keys, seq):
            yield services[done:done + len(replies)], replies
            done += len(replies)

    def _decode_batch(self, replies: list[ipvs_dump.Reply],
                      part: list[tuple[VirtualServer, Stats]], stats: bool,
                      many: Callable[[list[ipvs_dump.Reply], int, bool], Sequence[_T] | None]
                      ) -> list[_T | tuple[ObservedDest, ...]]:
        """The real servers of each service of `part` from its dump's replies. Per address
        family, the first dump alone (decoding it teaches the decoder the layout), the rest at
        once through `many` (DumpDecoder.many_dests, or listing rows); one by one where `many`
        declines (None)."""
        by_af: dict[int, list[int]] = {}
        for i, (vs, _) in enumerate(part):
            by_af.setdefault(vs.key.af, []).append(i)
        found: list[_T | tuple[ObservedDest, ...]] = [()] * len(part)
        for af, idx in by_af.items():
            found[idx[0]] = self._decode_dests(*replies[idx[0]], af, stats)
            rest = [replies[i] for i in idx[1:]]
            got: Sequence[_T | tuple[ObservedDest, ...]] | None = many(rest, af, stats)
            if got is None:
                got = [self._decode_dests(*r, af, stats) for r in rest]
            for i, dests in zip(idx[1:], got, strict=True):
                found[i] = dests
        return found

    def _decode_dests(self, seq: int, bufs: list[bytes], end: int | None, af: int,
                      stats: bool) -> tuple[ObservedDest, ...]:
        """The real servers of one dump (ipvs_dump.read_dump), decoded buffer by buffer."""
        dests: list[ObservedDest] = []
        err = end
        for buf in bufs:
            got = self._decoder.dests(memoryview(buf), seq, af, dests, stats)
            if got is not None:
                err = got
                break
        if err is None:
            raise c.DecodeError("a real-server dump ended without NLMSG_DONE")
        if err:
            raise OSError(err, f"IPVS command {c.CMD_GET_DEST}: {os.strerror(err)}")
        return tuple(dests)

    def get_service(self, key: ServiceKey) -> ObservedService | None:
        try:
            payloads = self._request(c.CMD_GET_SERVICE,
                                     c.nested(c.A_SERVICE, c.service_key_attrs(key)))
        except OSError as exc:
            if exc.errno in (errno_mod.ESRCH, errno_mod.ENOENT):
                return None
            raise
        if not payloads:
            return None
        vs, st = c.decode_service(payloads[0])
        return ObservedService(vs, self.dests(vs.key), st)

    def info(self) -> IpvsInfo:
        return c.decode_info(self._request(c.CMD_GET_INFO)[0])

    def timeouts(self) -> Timeouts:
        return c.decode_timeouts(self._request(c.CMD_GET_CONFIG)[0])

    # ------------------------------------------------------------------- single commands

    def _one(self, op: IpvsOp) -> None:
        failures = self.apply([op])
        if failures:
            raise failures[0]

    def set_timeouts(self, t: Timeouts) -> None:
        self._one(IpvsOp(OpKind.SET_TIMEOUTS, timeouts=t))

    def flush(self) -> None:
        self._one(IpvsOp(OpKind.FLUSH))

    def zero(self, service: VirtualServer | None = None) -> None:
        self._one(IpvsOp(OpKind.ZERO, service=service))


def apply_ops(ops: Iterable[IpvsOp]) -> list[IpvsError]:
    with IpvsClient() as client:
        return client.apply(list(ops))
