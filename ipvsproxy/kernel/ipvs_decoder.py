"""IPVS dumps decoded fast: DumpDecoder walks the receive buffers of a dump and reads each
message through a learned shape (ipvs_shapes.py) when it fits, else through the generic decoder
(ipvs_codec), which then learns its shape.

One receive buffer holds many messages back to back; a run of messages of one learned layout is
read at once, and a message is taken only if its sequence number is the request's. Tested
against the generic decoder in tests/unit/test_ipvs_codec.py.
"""

from __future__ import annotations

from _socket import htonl, ntohs  # (not socket: see core/ipvs.py AF_INET)
from collections.abc import Callable, Iterable, Sequence
from ipaddress import IPv4Address, IPv6Address
from itertools import chain, repeat
from operator import and_, attrgetter, itemgetter
from typing import Any, TypeVar

from ipvsproxy.core.ipvs import (
    CONN_F_FWD_MASK,
    FWD_BY_CODE,
    ObservedDest,
    RealServer,
    Stats,
    VirtualServer,
)
from ipvsproxy.kernel.ipvs_addrs import Addrs, ipv4_number
from ipvsproxy.kernel.ipvs_codec import (
    _HDR,
    _U32,
    NLMSG_DONE,
    NLMSG_ERROR,
    DecodeError,
    decode_dest,
    decode_service,
    error_code,
)
from ipvsproxy.kernel.ipvs_shapes import _NO_STATS, DestShape, ServiceShape

_T = TypeVar("_T")


class DumpDecoder:
    """Decodes the receive buffers of dumps through learned shapes, else the generic decoder.

    One per client. Address objects are shared within a dump and with the dump before it (a
    node's pods serve many services); new_dump() starts a dump, so the cache never holds more
    than two dumps' addresses.
    """

    def __init__(self) -> None:
        self._dest_shapes: dict[int, dict[int, list[DestShape]]] = {}  # service af, length
        self._service_shapes: dict[int, list[ServiceShape]] = {}
        # An address as a shape reads it (a native u32 for IPv4, 16 bytes for IPv6) -> its object
        self.addrs = Addrs()
        self.names: dict[bytes, str] = {}

    def new_dump(self, reuse: Iterable[IPv4Address | IPv6Address] = ()) -> None:
        """A new dump starts. `reuse`: address objects it should hand out for these addresses
        (the desired state's: the observed values then hold the very objects they are compared
        with, equal by identity instead of through IPv4Address.__eq__, and none is made anew)."""
        before = self.addrs
        before.before = {}  # one dump back only
        self.addrs = Addrs(before)
        # All in C, repeats included (the dict keeps one of each): hashing 180,000 addresses
        # into a set first, through IPv4Address.__hash__, took longer than the rest.
        v4: list[IPv4Address] = list(filter(IPv4Address.__instancecheck__, reuse))  # type: ignore[arg-type]
        self.addrs.update(zip(map(htonl, map(ipv4_number, v4)), v4, strict=True))

    def name(self, raw: bytes) -> str:
        """A scheduler or persistence-engine name attribute as the generic decoder reads it."""
        name = self.names[raw] = raw.split(b"\0", 1)[0].decode(errors="replace")
        return name

    def _walk(self, buf: memoryview, seq: int, out: list[Any], stats: bool,
              shapes: dict[int, list[Any]], generic: Callable[[memoryview], Any],
              learn: Callable[[memoryview], Any]) -> int | None:
        """Decode one receive buffer of dump `seq` into out: each message by a learned shape
        of its length, else by `generic` (whose layout is then learned).

        None: the dump goes on; 0: it is done; otherwise the errno the kernel answered."""
        end, off = len(buf), 0
        while off + 16 <= end:
            for shape in shapes.get(_U32.unpack_from(buf, off)[0], ()):
                got = shape.decode(buf, off, end, seq, out, self, stats)
                if got:
                    off += got
                    break
            else:
                msg, mtype, mseq = _message_at(buf, off, end)
                if mseq == seq:
                    if mtype in (NLMSG_DONE, NLMSG_ERROR):
                        return error_code(msg[16:]) if mtype == NLMSG_ERROR else 0
                    out.append(generic(msg[16:]))
                    learned = _learn(learn, msg)
                    if learned is not None:
                        shapes.setdefault(len(msg), []).append(learned)
                off += (len(msg) + 3) & ~3
        if off < end:
            _trailing(buf, off, end)
        return None

    def dests(self, buf: memoryview, seq: int, svc_af: int, out: list[ObservedDest],
              stats: bool = True) -> int | None:
        """Decode one receive buffer of the GET_DEST dump `seq` into out (see _walk)."""
        shapes = self._dest_shapes.setdefault(svc_af, {})

        def generic(payload: memoryview) -> ObservedDest:
            od = decode_dest(payload, svc_af)
            return od if stats else od._replace(stats=_NO_STATS)

        return self._walk(buf, seq, out, stats, shapes, generic,
                          lambda msg: DestShape(msg, svc_af))

    def many_dests(self, replies: Sequence[tuple[int, list[bytes], int | None]], svc_af: int,
                   stats: bool = True) -> list[tuple[ObservedDest, ...]] | None:
        """The real servers of many GET_DEST dumps (seq, data buffers, how it ended: see
        ipvs_dump.read_dump) of services of one family, in one pass: when every message of them
        has one learned shape and its dump's sequence number, and every dump ended with an
        NLMSG_DONE of its own. That is the steady state of a dump; it saves the per-dump
        checks and calls, a third of the decoding at ten real servers a service. None: not so;
        decode them one by one with dests()."""
        found = self._bulk(replies, svc_af)
        if found is None:
            return None
        shape, blob, counts = found
        if shape is None:
            return [() for _ in replies]
        size = shape.shape.size
        if shape.addr_word is not None:
            self.addrs.add_ipv4(blob.cast("I")[shape.addr_word::size >> 2].tolist())
        flat: list[ObservedDest] = []
        shape.rows(blob, flat, self, stats)
        return [tuple(part) for part in _split(flat, counts)]

    def many_settled(self, replies: Sequence[tuple[int, list[bytes], int | None]], svc_af: int,
                     wants: Sequence[tuple[RealServer, ...] | None]) -> list[bool] | None:
        """Whether each of many GET_DEST dumps (as many_dests takes them) holds exactly the real
        servers of its `want`, in the order the kernel lists a virtual server programmed from
        `want` and unchanged since (the reverse: ip_vs_ctl.c __ip_vs_update_dest puts a new
        real server at the head), in every value a RealServer holds. Read as columns of 32-bit
        words across all the dumps at once; no object is built. This is a full sync's read of
        the steady state: a settled virtual server needs nothing of its real servers as read
        (none to add, edit or drain), so the read keeps none of them (at 50,000 services the
        ~700,000 real servers a read built and the diff then dropped). None: as many_dests, or
        IPv6 real servers; a want of None is never settled."""
        found = self._bulk(replies, svc_af)
        if found is None:
            return None
        shape, blob, counts = found
        if shape is None:  # no real server in any of them
            return [w is not None and not w for w in wants]
        if shape.settle is None:
            return None
        words, step = blob.cast("I"), shape.shape.size >> 2
        n = len(blob) // shape.shape.size

        def col(w: int | None) -> list[int]:
            return [0] * n if w is None else words[w::step].tolist()

        addr, port, fwd, weight, uth, lth, ttype, tport, tflags = shape.settle
        try:
            # as the shape's rows read them: a u16 value in a word with its zero padding; any
            # other padding fails ntohs and then nothing is settled
            got: list[list[Any]] = [
                list(map(self.addrs.__getitem__, col(addr))), list(map(ntohs, col(port))),
                list(map(FWD_BY_CODE.__getitem__, map(and_, col(fwd), repeat(CONN_F_FWD_MASK)))),
                col(weight), col(uth), col(lth), col(ttype), list(map(ntohs, col(tport))),
                col(tflags)]
        except OverflowError:
            return None
        lens = [-1 if w is None else len(w) for w in wants]
        if lens == counts and got == _columns(list(chain.from_iterable(
                [w[::-1] for w in wants if w is not None]))):
            return [True] * len(wants)  # the steady state: one compare for the whole batch
        out, at = [], 0
        for want, count, length in zip(wants, counts, lens, strict=True):
            ok = count == length and want is not None and all(
                k[at:at + count] == v for k, v in zip(got, _columns(want[::-1]), strict=True))
            out.append(ok)
            at += count
        return out

    def many_listing_rows(self, replies: Sequence[tuple[int, list[bytes], int | None]],
                          svc_af: int) -> list[list[tuple[int, ...]]] | None:
        """What the plain `ls -Ln` listing prints of the real servers of many dumps, as
        many_dests() would find them, without building them: per real server (address as a
        host-order integer, port, forwarding method in the low 3 bits, weight, active and
        inactive connections). For IPv4 real servers only; None as many_dests() (or IPv6)."""
        found = self._bulk(replies, svc_af)
        if found is None:
            return None
        shape, blob, counts = found
        if shape is None:
            return [[] for _ in replies]
        if shape.listing is None:
            return None
        flat: list[tuple[int, ...]] = []
        shape.listing(shape.shape.st.iter_unpack(blob), flat.append)
        return _split(flat, counts)

    def _bulk(self, replies: Sequence[tuple[int, list[bytes], int | None]], svc_af: int
              ) -> tuple[DestShape | None, memoryview, list[int]] | None:
        """The learned shape, joined data and message counts of many dumps (see many_dests);
        (None, ...) when they hold no real server at all; None when they can't be read at once."""
        if any(end != 0 for _, _, end in replies):
            return None
        blob = memoryview(b"".join([b for _, bufs, _ in replies for b in bufs]))
        if not blob:
            return None, blob, [0] * len(replies)
        for shape in self._dest_shapes.get(svc_af, {}).get(_U32.unpack_from(blob)[0], ()):
            size = shape.shape.size
            counts = [sum(map(len, bufs)) // size for _, bufs, _ in replies]
            if sum(counts) * size != len(blob) or not shape.shape.covers(blob):
                continue
            want = list(chain.from_iterable(map(repeat, [q for q, _, _ in replies], counts)))
            if blob.cast("I")[2::size >> 2].tolist() != want:
                return None
            return shape, blob, counts
        return None

    def services(self, buf: memoryview, seq: int, out: list[tuple[VirtualServer, Stats]],
                 stats: bool = True) -> int | None:
        """Decode one receive buffer of the GET_SERVICE dump `seq` into out (see _walk)."""
        def generic(payload: memoryview) -> tuple[VirtualServer, Stats]:
            vs, st = decode_service(payload)
            return vs, st if stats else _NO_STATS

        return self._walk(buf, seq, out, stats, self._service_shapes, generic, ServiceShape)


# The values of a RealServer as many_settled reads them from the kernel's words: the address,
# the port, then the forwarding method and the rest in the NamedTuple's order.
_RS_COLUMNS: tuple[Callable[[RealServer], Any], ...] = (
    attrgetter("key.addr"), attrgetter("key.port"), *map(itemgetter, range(1, 8)))


def _columns(rss: Sequence[RealServer]) -> list[list[Any]]:
    return [list(map(get, rss)) for get in _RS_COLUMNS]


def _learn(make: Callable[..., _T], *args: Any) -> _T | None:
    try:
        return make(*args)
    except DecodeError:  # an odd message: it stays on the generic path
        return None


def _split(flat: list[_T], counts: Sequence[int]) -> list[list[_T]]:
    out, at = [], 0
    for n in counts:
        out.append(flat[at:at + n])
        at += n
    return out


def _message_at(buf: memoryview, off: int, end: int) -> tuple[memoryview, int, int]:
    length, mtype, _flags, seq, _pid = _HDR.unpack_from(buf, off)
    if length < 16 or off + length > end:
        raise DecodeError(f"netlink message length {length} at offset {off} overruns {end}")
    return buf[off:off + length], mtype, seq


def _trailing(buf: memoryview, off: int, end: int) -> None:
    if any(buf[off:end]):
        raise DecodeError(f"{end - off} trailing bytes after the last netlink message")
