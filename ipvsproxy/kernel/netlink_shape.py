"""A generic-netlink message layout learned from one message, to read many like it in C.

Messages of one kind from a dump (IPVS real servers, say) come in the same attribute layout: a
Shape learned from one message the generic decoder accepted reads the values of a whole message
with one struct.Struct, and checks a run of same-length messages at once (big-integer masks,
strided word compares) for the same length, type, attribute headers and checked values. Used by
ipvs_shapes.py, which says which attributes to read and how.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection, Sequence
from operator import itemgetter
from typing import Any

from ipvsproxy.kernel.ipvs_codec import _NLA, _U32, DecodeError

# How the fast path reads an attribute of a given value length: a struct format, None (treated
# as absent, as the generic decoder treats it) or SHORT (the generic decoder rejects it).
SHORT = "short"


def fixed(fmt: str, short: str | None = SHORT) -> Callable[[int], str | None]:
    need = struct.calcsize("=" + fmt)
    return lambda n: fmt if n >= need else short


def walk(msg: memoryview, start: int, end: int, path: tuple[int, ...],
         out: list[tuple[int, tuple[int, ...]]], nests: Collection[tuple[int, ...]]) -> None:
    """Every attribute from start to end as (offset, path), into out; into the `nests`."""
    off = start
    while off + 4 <= end:
        n, t = _NLA.unpack_from(msg, off)
        if n < 4 or off + n > end:
            raise DecodeError("bad attribute while learning a layout")
        p = (*path, t & 0x3FFF)
        out.append((off, p))
        if p in nests:
            walk(msg, off + 4, off + n, p, out, nests)
        off += (n + 3) & ~3


class Shape:
    """A learned message layout (see the module docstring).

    `st` reads the sequence number (index 0) and the values of a message; `at[path]` is the
    index of an attribute's value (an attribute that is absent, or that the generic decoder reads
    as absent, is not in `at`), `offsets[path]` the byte offset of that value in the message.
    The rest of a message must equal the learned one: its length, type, every attribute header
    and the `checked` values. `run()` tests that for many messages at once, as big integers: the
    bytes of a run, masked, equal the learned bytes repeated.
    """

    __slots__ = ("_mask", "_runs", "_words", "at", "count", "offsets", "size", "st")

    def __init__(self, msg: memoryview, nests: Collection[tuple[int, ...]],
                 readers: Callable[[tuple[int, ...]], Callable[[int], str | None] | None],
                 checked: Sequence[tuple[int, ...]] = ()) -> None:
        length = int(_U32.unpack_from(msg)[0])
        heads: list[tuple[int, tuple[int, ...]]] = []
        walk(msg, 20, length, (), heads, nests)
        if len({p for _, p in heads}) != len(heads):
            raise DecodeError("an attribute repeats: not learned")
        self.size = (length + 3) & ~3
        mask = bytearray(self.size)
        mask[0:6] = b"\xff" * 6  # nlmsg_len, nlmsg_type (not flags, seq, pid)
        items: list[tuple[int, str, tuple[int, ...]]] = [(8, "I", ())]  # the sequence number
        for off, p in heads:
            n = int(_NLA.unpack_from(msg, off)[0])
            mask[off:off + 4] = b"\xff" * 4
            reader = readers(p)
            fmt = reader(n - 4) if reader is not None else None
            if fmt is SHORT:
                raise DecodeError(f"attribute {p} too short: not learned")
            if fmt is not None:
                items.append((off + 4, fmt, p))
                if p in checked:
                    width = struct.calcsize("=" + fmt)
                    mask[off + 4:off + 4 + width] = b"\xff" * width
        items.sort(key=lambda it: it[0])
        parts, cur = ["="], 0
        for off, fmt, _ in items:
            if off < cur:
                raise DecodeError("overlapping attributes: not learned")
            parts.append(f"{off - cur}x{fmt}")
            cur = off + struct.calcsize("=" + fmt)
        if cur > self.size:
            raise DecodeError("attributes overrun the message: not learned")
        parts.append(f"{self.size - cur}x")
        self.st = struct.Struct("".join(parts))
        self.count = len(items)
        self.at = {key: i for i, (_, _, key) in enumerate(items) if key}
        self.offsets = {key: off for off, _, key in items if key}
        learned = bytes(msg[:self.size]).ljust(self.size, b"\0")
        self._mask = (bytes(mask), bytes(a & b for a, b in zip(learned, mask, strict=True)))
        self._words = [(k // 4, learned[k:k + 4]) for k in range(0, self.size, 4)
                       if any(mask[k:k + 4])]
        self._runs: dict[int, tuple[int, int]] = {}

    def _masks(self, m: int) -> tuple[int, int]:
        got = self._runs.get(m)
        if got is None:
            if len(self._runs) > 64:
                self._runs.clear()
            mask, want = self._mask
            got = self._runs[m] = (int.from_bytes(mask * m, "little"),
                                   int.from_bytes(want * m, "little"))
        return got

    def run(self, buf: memoryview, off: int, end: int) -> memoryview | None:
        """The longest run of messages of this shape at off (None: not even one)."""
        size = self.size
        m = (end - off) // size
        if not m:
            return None
        run = buf[off:off + m * size]
        mask, want = self._masks(m)
        if int.from_bytes(run, "little") & mask == want:
            return run
        mask, want = self._masks(1)
        k = 0
        while k < m and int.from_bytes(run[k * size:(k + 1) * size], "little") & mask == want:
            k += 1
        return run[:k * size] if k else None

    def covers(self, buf: memoryview) -> bool:
        """Whether buf is nothing but messages of this shape. Word by word across all of them:
        each 32-bit word the mask touches, read at that offset from every message (a strided
        view), must be the learned word repeated. That is stricter than the mask where a word
        is only partly checked (it also holds the message flags or an attribute's zero
        padding, which in a dump do not vary); a false "no" only costs the slower path."""
        size = self.size
        m, rest = divmod(len(buf), size)
        if rest or not m:
            return False
        words, step = buf.cast("I"), size >> 2
        return all(words[k::step].tobytes() == w * m for k, w in self._words)

    def getter(self, paths: Sequence[tuple[int, ...]]) -> Callable[[tuple[Any, ...]], Any]:
        """Reads these paths from a value tuple; absent ones read the 0 appended at `count`."""
        at = [self.at.get(p, self.count) for p in paths]
        if len(at) > 1 and at == list(range(at[0], at[0] + len(at))):
            return itemgetter(slice(at[0], at[0] + len(at)))  # one slice (the counters)
        return itemgetter(*at)

    def complete(self, paths: Sequence[tuple[int, ...]]) -> bool:
        return all(p in self.at for p in paths)
