"""A full sync's read of the steady state (kernel/ipvs_decoder.py many_settled, core/plan.py
diff): a virtual server whose real servers are exactly the desired ones, as the kernel lists
them, is told from the dump's words without building them, and the diff then leaves it alone.
Checked here against the decoder's own reading of the same bytes; the kernel test in
tests/kernel/test_ipvs.py checks it against a real kernel's dump."""

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ipvsproxy.core.ipvs import AF_INET, DestKey, Fwd, ObservedDest, RealServer
from ipvsproxy.kernel.ipvs_decoder import DumpDecoder
from tests.unit.test_ipvs_codec import _dest_rows, _kernel_dest, _one_by_one, _with_seq

# How a test turns a dump's real servers (as decoded) into the desired ones
CHANGES = ["same", "same", "same", "none", "weight", "fewer", "more", "order", "addr", "port",
           "fwd", "threshold", "tunnel"]


def _desired(read: tuple[ObservedDest, ...], how: str) -> tuple[RealServer, ...] | None:
    """The desired real servers of a dump that read as `read`: exactly what the kernel holds
    (its order is the reverse of the desired), or one thing different."""
    want = [d.dest for d in reversed(read)]
    if how == "none":
        return None
    if how == "more" or not want:
        return (*want, RealServer(DestKey(IPv4Address("10.9.9.9"), 99)))
    first = want[0]
    if how == "weight":
        want[0] = first._replace(weight=first.weight + 1)
    elif how == "fewer":
        want.pop()
    elif how == "order" and len(want) > 1 and want[0] != want[-1]:
        want.reverse()
    elif how == "addr":
        want[0] = first._replace(key=DestKey(IPv4Address((int(first.key.addr) + 1) % 2**32),
                                             first.key.port))
    elif how == "port":
        want[0] = first._replace(key=first.key._replace(port=(first.key.port + 1) % 65536))
    elif how == "fwd":
        want[0] = first._replace(fwd=Fwd.ROUTE if first.fwd != Fwd.ROUTE else Fwd.MASQ)
    elif how == "threshold":
        want[0] = first._replace(l_threshold=3)
    elif how == "tunnel":
        want[0] = first._replace(tun_port=4789)
    return tuple(want)


@settings(max_examples=200, deadline=None)
@given(st.lists(_dest_rows, min_size=1, max_size=8), st.integers(1, 2**31 - 100),
       st.integers(1, 5), st.data())
def test_settled_is_exactly_the_desired_real_servers_in_the_kernels_order(
        services: list[list[Any]], seq0: int, per_buf: int, data: st.DataObject) -> None:
    replies: list[tuple[int, list[bytes], int | None]] = []
    for i, rows in enumerate(services):
        msgs = [_with_seq(_kernel_dest(a.packed, AF_INET, p, f, w, n), seq0 + i)
                for a, p, f, w, n in rows]
        replies.append((seq0 + i, [b"".join(msgs[j:j + per_buf])
                                   for j in range(0, len(msgs), per_buf)], 0))
    dec = DumpDecoder()
    read = _one_by_one(dec, replies, stats=False)  # the decoder's reading (and its layout)
    wants = [_desired(r, data.draw(st.sampled_from(CHANGES))) for r in read]
    # as a full sync's dump starts: the desired addresses' objects handed to the decoder
    dec.new_dump([rs.key.addr for w in wants if w for rs in w])
    expect = [w is not None and [d.dest for d in r] == list(reversed(w))
              for r, w in zip(read, wants, strict=True)]
    got = dec.many_settled(replies, AF_INET, wants)
    if any(r for r in read):  # with no real server at all, no layout was learned
        assert got == expect
    else:
        assert got == [w == () for w in wants]


def test_settled_needs_a_learned_layout_and_ipv4() -> None:
    def dest(i: int, seq: int) -> bytes:
        return _with_seq(_kernel_dest(IPv4Address(0x0A000000 + i).packed, AF_INET, 80, 0, 1, i),
                         seq)

    dec = DumpDecoder()
    replies: list[tuple[int, list[bytes], int | None]] = [
        (10, [dest(1, 10) + dest(2, 10)], 0), (11, [dest(3, 11)], 0)]
    want = [(RealServer(DestKey(IPv4Address(0x0A000002), 80)),
             RealServer(DestKey(IPv4Address(0x0A000001), 80))),
            (RealServer(DestKey(IPv4Address(0x0A000003), 80)),)]
    assert dec.many_settled(replies, AF_INET, want) is None  # nothing learned yet
    read = _one_by_one(dec, replies)
    assert [[d.dest for d in r][::-1] for r in read] == [list(w) for w in want]
    assert dec.many_settled(replies, AF_INET, want) == [True, True]
    assert dec.many_settled(replies, AF_INET, [want[0], None]) == [True, False]
    assert dec.many_settled([(*replies[0][:2], None)], AF_INET, want[:1]) is None
    padded = bytearray(dest(3, 11))
    padded[50] = 1  # the port's padding (the port at 48): what the rows would not read so
    assert dec.many_settled([(11, [bytes(padded)], 0)], AF_INET, want[1:]) is None
