"""Source hashing (`sh`): net/netfilter/ipvs/ip_vs_sh.c of Linux 6.1.

The kernel keeps a table of IP_VS_SH_TAB_SIZE buckets (256: CONFIG_IP_VS_SH_TAB_BITS is 8 in
Debian's config and by default, ip_vs_sh.c:61-66), each pointing at a destination:

- Filling (ip_vs_sh_reassign, ip_vs_sh.c:162-204), on every destination added, removed or
  changed (ip_vs_sh.c:263-272, 356-358): bucket after bucket, the destinations in list order,
  each taking `weight` consecutive buckets, round and round until all buckets are filled. The
  test is `++d_count >= weight` (ip_vs_sh.c:195), so a destination of weight 0 still takes one
  bucket per round.
- Hashing (ip_vs_sh_hashkey, ip_vs_sh.c:83-97): `(offset + hash_32(ntohs(port) +
  ntohl(addr_fold), 8)) & 255`, where hash_32 (include/linux/hash.h:60-69) is
  `(val * 0x61C88647) >> 24` in 32-bit arithmetic, addr_fold the client address (the XOR of its
  words for IPv6) and port the client's source port with `sh-port`, else 0
  (ip_vs_sh.c:314, 321-322).
- Picking without `sh-fallback` (ip_vs_sh_get, ip_vs_sh.c:103-111): the bucket's destination,
  or none if it has weight 0 or is overloaded.
- Picking with `sh-fallback` (ip_vs_sh_get_fallback, ip_vs_sh.c:120-157): the bucket's
  destination if usable; otherwise for offset 0..255, roffset = (offset + ihash) % 256 and the
  bucket hashkey(roffset) = (roffset + ihash) % 256, that is (2 * ihash + offset) % 256: the
  scan starts at twice the first bucket, not at the bucket after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.common import U32, Conn, Dest, Pick, addr_fold, af_of, usable

TAB_BITS = 8  # ip_vs_sh.c:61-64, CONFIG_IP_VS_SH_TAB_BITS=8 in Debian's 6.1 config
GOLDEN_RATIO_32 = 0x61C88647  # include/linux/hash.h:41


def hash_32(val: int, bits: int) -> int:
    """include/linux/hash.h:60-69 (x86 has no arch-specific __hash_32)."""
    return ((val * GOLDEN_RATIO_32) & U32) >> (32 - bits)


def hashkey(af: int, conn: Conn, port: int, offset: int, bits: int = TAB_BITS) -> int:
    """ip_vs_sh_hashkey (ip_vs_sh.c:83-97): the bucket of a client address (and port)."""
    val = (port + addr_fold(af, conn.addr)) & U32
    return (offset + hash_32(val, bits)) & ((1 << bits) - 1)


def build_table(dests: Sequence[Dest], bits: int = TAB_BITS) -> tuple[int | None, ...]:
    """ip_vs_sh_reassign (ip_vs_sh.c:162-204): for each bucket, the index in `dests` (kernel
    list order) of its destination; all None when the service has no destination."""
    size = 1 << bits
    if not dests:  # ip_vs_sh.c:174, 180-181
        return (None,) * size
    table: list[int | None] = []
    p = 0
    d_count = 0
    for _ in range(size):
        table.append(p)
        d_count += 1
        if d_count >= dests[p].weight:  # ip_vs_sh.c:195-198
            p = (p + 1) % len(dests)  # ip_vs_sh.c:183-184 skips the list head
            d_count = 0
    return tuple(table)


@dataclass(frozen=True, slots=True)
class ShPick(Pick):
    """An sh pick: the client's bucket, the destination the table holds there, and with
    sh-fallback the buckets tried after it (in order, the last one the pick)."""

    bucket: int = 0
    table_size: int = 1 << TAB_BITS
    hashed_port: int = 0
    entry: Dest | None = None
    fallback_buckets: tuple[int, ...] = ()
    fallback: bool = False

    def to_json(self) -> dict[str, object]:
        out = Pick.to_json(self)
        out.update({
            "bucket": self.bucket,
            "table_size": self.table_size,
            "hashed_port": self.hashed_port,
            "table_entry": None if self.entry is None else str(self.entry),
            "fallback": self.fallback,
            "fallback_buckets": list(self.fallback_buckets),
        })
        return out


def _state(dest: Dest) -> str:
    if dest.weight <= 0:
        return "has weight 0"
    return "is overloaded"


def schedule(dests: Sequence[Dest], conn: Conn, *, sh_port: bool = False,
             sh_fallback: bool = False, af: int | None = None,
             table: Sequence[int | None] | None = None) -> ShPick:
    """ip_vs_sh_schedule (ip_vs_sh.c:308-342) for a new connection from `conn`.

    `dests` in kernel list order (a netlink dump's order); `af` is the service's address family
    (default: the client's); `table` a precomputed build_table(dests)."""
    family = af_of(conn.addr) if af is None else af
    tab = build_table(dests) if table is None else table
    size = len(tab)
    bits = size.bit_length() - 1
    port = conn.port if sh_port else 0
    ihash = hashkey(family, conn, port, 0, bits)
    idx = tab[ihash]
    entry = None if idx is None else dests[idx]
    with_port = f"port {port} + " if sh_port else ""
    hashed = f"hash_32({with_port}{conn.addr}) -> bucket {ihash} of {size}"

    def pick(dest: Dest | None, reason: str, tried: Sequence[int] = ()) -> ShPick:
        return ShPick("sh", dest, f"{hashed}, which {reason}", bucket=ihash, table_size=size,
                      hashed_port=port, entry=entry, fallback_buckets=tuple(tried),
                      fallback=sh_fallback)

    if entry is None:
        return pick(None, "is empty (the service has no destinations)")
    if usable(entry):
        return pick(entry, f"holds {entry}")
    if not sh_fallback:
        return pick(None, f"holds {entry}; it {_state(entry)} and without sh-fallback no other "
                          "server is tried")
    tried: list[int] = []
    for offset in range(size):  # ip_vs_sh.c:142-154
        roffset = (offset + ihash) % size
        bucket = hashkey(family, conn, port, roffset, bits)
        tried.append(bucket)
        idx = tab[bucket]
        if idx is None:  # pragma: no cover - only with no destinations, handled above
            break
        dest = dests[idx]
        if usable(dest):
            return pick(dest, f"holds {entry}; it {_state(entry)}, so sh-fallback scanned from "
                              f"bucket {tried[0]} (2 x {ihash} mod {size}) and took {dest} in "
                              f"bucket {bucket}", tried)
    return pick(None, f"holds {entry}; it {_state(entry)} and sh-fallback found no usable "
                      "server in any bucket", tried)
