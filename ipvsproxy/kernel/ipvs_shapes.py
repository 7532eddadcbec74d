"""The learned layouts of IPVS dump messages: one DestShape or ServiceShape reads a whole
real-server or virtual-server message with one struct.Struct.

Every real server (and every virtual server with the same scheduler name) comes back from the
kernel in the same attribute layout (ip_vs_ctl.c ip_vs_genl_fill_dest / _fill_service). A Shape
(netlink_shape.py) is learned from a message the generic decoder (ipvs_codec) accepted, and
struct.iter_unpack then reads a run of same-length messages in one C call. A message goes
through a Shape only if its length, type, every attribute header and its address family equal
the learned ones (checked for a whole run at once). Values become NamedTuples straight from the
unpacked tuple (tuple.__new__, no Python-level constructor), and real servers with the same
address share one address object (ipvs_addrs.py). Walking the receive buffers and choosing a
shape or the generic decoder for each message is ipvs_decoder.py's.
"""

from __future__ import annotations

import typing
from _socket import ntohl, ntohs  # (not socket: see core/ipvs.py AF_INET)
from collections.abc import Callable, Iterable
from typing import Any

from ipvsproxy.core.ipvs import (
    AF_INET6,
    CONN_F_FWD_MASK,
    FWD_BY_CODE,
    SVC_F_HASHED,
    DestKey,
    ObservedDest,
    Protocol,
    RealServer,
    ServiceKey,
    Stats,
    VirtualServer,
)
from ipvsproxy.kernel.ipvs_addrs import Addrs
from ipvsproxy.kernel.ipvs_codec import (
    _NLA,
    _U16,
    _U32,
    A_DEST,
    A_SERVICE,
    D_ACTIVE,
    D_ADDR,
    D_AF,
    D_FWD,
    D_INACT,
    D_LTHRESH,
    D_PERSIST,
    D_PORT,
    D_STATS,
    D_STATS64,
    D_TUN_FLAGS,
    D_TUN_PORT,
    D_TUN_TYPE,
    D_UTHRESH,
    D_WEIGHT,
    S_ADDR,
    S_AF,
    S_FLAGS,
    S_FWMARK,
    S_NETMASK,
    S_PE_NAME,
    S_PORT,
    S_PROTOCOL,
    S_SCHED,
    S_STATS,
    S_STATS64,
    S_TIMEOUT,
    DecodeError,
)
from ipvsproxy.kernel.netlink_shape import Shape, fixed, walk

_NESTS = {(A_SERVICE,), (A_DEST,), (A_SERVICE, S_STATS), (A_SERVICE, S_STATS64),
          (A_DEST, D_STATS), (A_DEST, D_STATS64)}



class Interned(typing.Protocol):
    """What a shape reads through from the decoder walking the buffers (ipvs_decoder's
    DumpDecoder): the address objects shared by every real server with the same address and
    the scheduler and persistence-engine names already decoded. A protocol, so that this
    module does not import the decoder, which imports it."""

    addrs: Addrs
    names: dict[bytes, str]

    def name(self, raw: bytes) -> str: ...


_FWDS = FWD_BY_CODE
_PROTOS = {int(p): p for p in Protocol}
_NO_STATS = Stats()
_new = tuple.__new__  # builds a NamedTuple from a tuple of its fields, in C


def _stats_readers(nest: tuple[int, ...]) -> dict[tuple[int, ...], Callable[[int], str | None]]:
    wide = nest[1] == S_STATS64  # == D_STATS64
    return {(*nest, t): fixed("Q") if wide or t in (4, 5) else fixed("I", None)
            for t in range(1, 11)}


def _addr_reader(af: int) -> Callable[[int], str | None]:
    # An IPv4 address reads as a native u32 (ntohl gives its number), an IPv6 one as bytes.
    return fixed("16s") if af == AF_INET6 else fixed("I")


_D = [(A_DEST, t) for t in (D_ADDR, D_PORT, D_FWD, D_WEIGHT, D_UTHRESH, D_LTHRESH, D_TUN_TYPE,
                            D_TUN_PORT, D_TUN_FLAGS, D_ACTIVE, D_INACT, D_PERSIST)]
_S = [(A_SERVICE, t) for t in (S_PROTOCOL, S_ADDR, S_PORT, S_FWMARK, S_SCHED, S_FLAGS, S_TIMEOUT,
                               S_NETMASK, S_PE_NAME)]


def _stats_paths(paths: set[tuple[int, ...]], top: int, wide: int,
                 narrow: int) -> list[tuple[int, ...]] | None:
    """The ten counter paths the generic decoder reads: the 64-bit nest if present, else the
    32-bit one, else none (all zero)."""
    for nest in (wide, narrow):
        if (top, nest) in paths:
            return [(top, nest, t) for t in range(1, 11)]
    return None


# The loop that turns a dest shape's value tuples into ObservedDests is generated per shape, as
# collections.namedtuple generates its __new__: the learned indexes become constants, so a row
# is read with v[i] and nothing is built but the objects themselves (no itemgetter tuple of the
# twelve fields, no unpacking): about 15% faster on the hottest loop of a dump (measured). Only
# integers from the learned layout go into the text.
_DEST_ROWS = """def rows(values, append, addrs):
    addr_of, make_addr = addrs.get, addrs.__missing__
    for v in values:
        append(new(observed, (new(real_server, (new(dest_key, (addr_of({addr}) or make_addr({addr}),
                                                              {port})),
                                                fwds[{fwd} & {mask}], {weight}, {uth}, {lth},
                                                {ttype}, {tport}, {tflags})),
                              {act}, {inact}, {pers}, {stats})))
"""


def _value(shape: Shape, path: tuple[int, ...]) -> str:
    """A generated row's read of `path`: v[i], or 0 where it is absent (as the generic decoder
    reads it)."""
    i = shape.at.get(path)
    return "0" if i is None else f"v[{int(i)}]"


def _listing_rows(shape: Shape) -> Callable[[Iterable[tuple[Any, ...]],
                                             Callable[[tuple[int, ...]], None]], None]:
    addr, port, fwd, weight, act, inact = (
        _value(shape, (A_DEST, t)) for t in (D_ADDR, D_PORT, D_FWD, D_WEIGHT, D_ACTIVE, D_INACT))
    code = _LISTING_ROWS.format(addr=addr, port="0" if port == "0" else f"ntohs({port})",
                                fwd=fwd, mask=CONN_F_FWD_MASK, weight=weight, act=act,
                                inact=inact)
    names: dict[str, Any] = {"ntohs": ntohs, "ntohl": ntohl}
    exec(code, names)
    return names["rows"]  # type: ignore[no-any-return]


def _dest_rows(shape: Shape, stats: list[tuple[int, ...]] | None
               ) -> Callable[[Iterable[tuple[Any, ...]], Callable[[ObservedDest], None],
                              Addrs], None]:
    """The generated row loop (above) of a learned dest shape; stats None: no counters."""
    def value(path: tuple[int, ...]) -> str:
        return _value(shape, path)

    addr, port, fwd, weight, uth, lth, ttype, tport, tflags, act, inact, pers = map(value, _D)
    if stats is None:
        counters = "no_stats"
    else:
        at = [shape.at.get(p, -1) for p in stats]
        if -1 not in at and at == list(range(at[0], at[0] + len(at))):
            counters = f"new(counters, v[{at[0]}:{at[-1] + 1}])"
        else:
            counters = "new(counters, (" + ", ".join(map(value, stats)) + ",))"
    code = _DEST_ROWS.format(
        addr=addr, port="0" if port == "0" else f"ntohs({port})", fwd=fwd, mask=CONN_F_FWD_MASK,
        weight=weight, uth=uth, lth=lth, ttype=ttype,
        tport="0" if tport == "0" else f"({tport} and ntohs({tport}))", tflags=tflags, act=act,
        inact=inact, pers=pers, stats=counters)
    names: dict[str, Any] = {
        "new": _new, "observed": ObservedDest, "real_server": RealServer, "dest_key": DestKey,
        "counters": Stats, "no_stats": _NO_STATS, "fwds": _FWDS, "ntohs": ntohs}
    exec(code, names)
    return names["rows"]  # type: ignore[no-any-return]


# The same for DumpDecoder.many_listing_rows: IPv4 real servers as `ls -Ln` prints them.
_LISTING_ROWS = """def rows(values, append):
    for v in values:
        append((ntohl({addr}), {port}, {fwd} & {mask}, {weight}, {act}, {inact}))
"""


class DestShape:
    __slots__ = ("_rows", "addr_word", "listing", "settle", "shape")

    def __init__(self, msg: memoryview, svc_af: int) -> None:
        heads: list[tuple[int, tuple[int, ...]]] = []
        walk(msg, 20, int(_U32.unpack_from(msg)[0]), (), heads, _NESTS)
        paths = {p for _, p in heads}
        af = svc_af
        af_path = (A_DEST, D_AF)
        if af_path in paths:  # the family decides the address format: learn it first
            af_off = next(off for off, p in heads if p == af_path)
            if int(_NLA.unpack_from(msg, af_off)[0]) < 6:
                raise DecodeError("short address family: not learned")
            af = int(_U16.unpack_from(msg, af_off + 4)[0]) or svc_af
        readers: dict[tuple[int, ...], Callable[[int], str | None]] = {
            (A_DEST, D_ADDR): _addr_reader(af), af_path: fixed("H"),
            (A_DEST, D_TUN_TYPE): fixed("B", None)}
        for t in (D_PORT, D_TUN_PORT, D_TUN_FLAGS):
            readers[(A_DEST, t)] = fixed("H")
        for t in (D_FWD, D_WEIGHT, D_UTHRESH, D_LTHRESH, D_ACTIVE, D_INACT, D_PERSIST):
            readers[(A_DEST, t)] = fixed("I")
        stats = _stats_paths(paths, A_DEST, D_STATS64, D_STATS)
        if stats:  # only the nest the generic decoder reads
            readers.update(_stats_readers(stats[0][:2]))
        shape = Shape(msg, _NESTS, readers.get, [af_path])
        if (A_DEST,) not in paths or not shape.complete(_D[:1]):
            raise DecodeError("no address: not learned")
        self.shape = shape
        self._rows = (_dest_rows(shape, None), _dest_rows(shape, stats) if stats else None)
        # Where an IPv4 address is, in 32-bit words from the message start (for add_ipv4).
        addr_off = next(off for off, p in heads if p == (A_DEST, D_ADDR)) + 4
        self.addr_word = addr_off // 4 if af != AF_INET6 and addr_off % 4 == 0 else None
        self.listing = _listing_rows(shape) if af != AF_INET6 else None
        # Where each value a RealServer holds is (address, port, forwarding method, weight, the
        # thresholds, the three tunnel values), in 32-bit words from the message start, None
        # where it is absent (it reads as 0): DumpDecoder.many_settled compares them with the
        # desired real servers as columns of words. IPv4 only (None for IPv6).
        self.settle: tuple[int | None, ...] | None = None
        offs = [shape.offsets.get(p) for p in _D[:9]]
        if af != AF_INET6 and all(o is None or o % 4 == 0 for o in offs):
            self.settle = tuple(None if o is None else o >> 2 for o in offs)

    def decode(self, buf: memoryview, off: int, end: int, seq: int, out: list[ObservedDest],
               dec: Interned, with_stats: bool) -> int:
        """Decode the run of messages of this shape at off; the bytes consumed (0: none)."""
        shape = self.shape
        run = shape.run(buf, off, end)
        if run is None:
            return 0
        size = shape.size
        seqs = run.cast("I")[2::size >> 2].tolist()  # every message's sequence number
        m = len(seqs)
        if seqs.count(seq) != m:  # stop at the first message of another request
            m = next(i for i, s in enumerate(seqs) if s != seq)
            run = run[:m * size]
        self.rows(run, out, dec, with_stats)
        return m * size

    def rows(self, run: memoryview, out: list[ObservedDest], dec: Interned,
             with_stats: bool) -> None:
        """Decode messages of this shape (checked: shape, sequence numbers) into out."""
        plain, counted = self._rows
        rows = counted if with_stats and counted is not None else plain
        rows(self.shape.st.iter_unpack(run), out.append, dec.addrs)


class ServiceShape:
    __slots__ = ("af", "fields", "netmask", "pad", "shape", "stats")

    def __init__(self, msg: memoryview) -> None:
        heads: list[tuple[int, tuple[int, ...]]] = []
        walk(msg, 20, int(_U32.unpack_from(msg)[0]), (), heads, _NESTS)
        paths = {p for _, p in heads}
        af_path = (A_SERVICE, S_AF)
        self.af = 0
        if af_path in paths:
            af_off = next(off for off, p in heads if p == af_path)
            if int(_NLA.unpack_from(msg, af_off)[0]) < 6:
                raise DecodeError("short address family: not learned")
            self.af = int(_U16.unpack_from(msg, af_off + 4)[0])

        def bytes_reader(n: int) -> str:
            return f"{n}s"

        readers: dict[tuple[int, ...], Callable[[int], str | None]] = {
            af_path: fixed("H"), (A_SERVICE, S_PROTOCOL): fixed("H"),
            (A_SERVICE, S_ADDR): _addr_reader(self.af), (A_SERVICE, S_PORT): fixed("H"),
            (A_SERVICE, S_FWMARK): fixed("I"), (A_SERVICE, S_SCHED): bytes_reader,
            (A_SERVICE, S_PE_NAME): bytes_reader, (A_SERVICE, S_FLAGS): fixed("I"),
            (A_SERVICE, S_TIMEOUT): fixed("I"), (A_SERVICE, S_NETMASK): fixed("I", None)}
        stats = _stats_paths(paths, A_SERVICE, S_STATS64, S_STATS)
        if stats:
            readers.update(_stats_readers(stats[0][:2]))
        shape = Shape(msg, _NESTS, readers.get, [af_path])
        if (A_SERVICE,) not in paths:
            raise DecodeError("no service: not learned")
        # netmask: absent (or short) reads -1; IPv6 carries a prefix length in host order
        self.netmask = (0 if (A_SERVICE, S_NETMASK) not in shape.at
                        else 1 if self.af == AF_INET6 else 2)
        self.shape = shape
        # A service has an address unless it has a fwmark; without one the generic decoder
        # raises, so such a shape is used for fwmark services only (a 0 mark falls back).
        self.fields = shape.getter(_S)
        self.stats = shape.getter(stats) if stats else None
        self.pad = not shape.complete(_S + (stats or []))

    def decode(self, buf: memoryview, off: int, end: int, seq: int,
               out: list[tuple[VirtualServer, Stats]], dec: Interned, with_stats: bool) -> int:
        shape = self.shape
        run = shape.run(buf, off, end)
        if run is None:
            return 0
        fields, pad, af = self.fields, self.pad, self.af
        has_addr = (A_SERVICE, S_ADDR) in shape.at
        nm_mode = self.netmask
        stats = self.stats if with_stats else None
        addr_of = dec.addrs.__getitem__
        name_of = dec.names.get
        done = 0
        for v in shape.st.iter_unpack(run):
            if v[0] != seq:
                break
            if pad:
                v += (0,)
            proto, raw, port, fwmark, sched, flags, timeout, nm, pe = fields(v)
            if fwmark:
                key = _new(ServiceKey, (af, Protocol.NONE, None, 0, fwmark))
            else:
                protocol = _PROTOS.get(proto)
                if protocol is None or not has_addr:
                    break  # the generic decoder says what is wrong with it
                key = _new(ServiceKey, (af, protocol, addr_of(raw), ntohs(port), 0))
            out.append((_new(VirtualServer, (
                            key, (name_of(sched) or dec.name(sched)) if sched else "",
                            flags & ~SVC_F_HASHED, timeout,
                            -1 if not nm_mode else ntohl(nm) if nm_mode == 2 else nm,
                            (name_of(pe) or dec.name(pe)) if pe else "")),
                        _NO_STATS if stats is None else _new(Stats, stats(v))))
            done += 1
        return done * shape.size
