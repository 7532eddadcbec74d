"""Least connection (`lc`): net/netfilter/ipvs/ip_vs_lc.c of Linux 6.1, and the overhead both
lc and wlc compare.

Overhead (ip_vs_dest_conn_overhead, include/net/ip_vs.h:1744-1756): in Debian's 6.1.192 it is
`(activeconns << 8) + totalconns`, where totalconns counts every connection of the destination,
active or not (ip_vs_conn.c:632-635, 726-728). In terms of what a dump reports (inactconns =
totalconns - activeconns, include/net/ip_vs.h:1758-1763) that is 257 * active + inactive.
Older kernels compared `(activeconns << 8) + inactconns`, 256 * active + inactive; `formula`
selects that one for them.

Picking (ip_vs_lc_schedule, ip_vs_lc.c:23-63): over the list in order, skipping overloaded
destinations and those of weight 0 (ip_vs_lc.c:42-44), the destination with the strictly least
overhead (`doh < loh`, ip_vs_lc.c:46): on a tie the one earlier in the list wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from scheduler.common import Dest, Pick

Formula = Literal["totalconns", "inactconns"]
FORMULA: Formula = "totalconns"  # Debian 6.1.192: include/net/ip_vs.h:1744-1756


def overhead(dest: Dest, formula: Formula = FORMULA) -> int:
    """ip_vs_dest_conn_overhead (include/net/ip_vs.h:1744-1756)."""
    if formula == "totalconns":
        return (dest.activeconns << 8) + dest.totalconns
    return (dest.activeconns << 8) + dest.inactconns


def formula_text(formula: Formula = FORMULA) -> str:
    if formula == "totalconns":
        return "overhead = 256 * active + (active + inactive)"
    return "overhead = 256 * active + inactive"


@dataclass(frozen=True, slots=True)
class Compared:
    """One destination as lc or wlc saw it: its overhead, or why it was skipped."""

    dest: Dest
    overhead: int
    skipped: str = ""  # "overloaded", "weight 0"; empty when compared

    def to_json(self) -> dict[str, object]:
        return {"real_server": str(self.dest), "weight": self.dest.weight,
                "activeconns": self.dest.activeconns, "inactconns": self.dest.inactconns,
                "overhead": self.overhead, "skipped": self.skipped or None}


@dataclass(frozen=True, slots=True)
class LcPick(Pick):
    """An lc or wlc pick with every destination's overhead, in list order."""

    compared: tuple[Compared, ...] = ()
    formula: str = ""

    def to_json(self) -> dict[str, object]:
        out = Pick.to_json(self)
        out["formula"] = self.formula
        out["compared"] = [c.to_json() for c in self.compared]
        return out


def schedule(dests: Sequence[Dest], formula: Formula = FORMULA) -> LcPick:
    """ip_vs_lc_schedule (ip_vs_lc.c:23-63). `dests` in kernel list order."""
    least: Dest | None = None
    loh = 0
    compared = []
    for dest in dests:
        doh = overhead(dest, formula)
        if dest.overloaded or dest.weight == 0:  # ip_vs_lc.c:42-44
            compared.append(Compared(dest, doh, "overloaded" if dest.overloaded else "weight 0"))
            continue
        compared.append(Compared(dest, doh))
        if least is None or doh < loh:  # ip_vs_lc.c:46-49
            least, loh = dest, doh
    text = formula_text(formula)
    return LcPick("lc", least, reason("least connection", text, least, compared, weighted=False),
                  compared=tuple(compared), formula=text)


def reason(name: str, text: str, least: Dest | None, compared: Sequence[Compared],
           weighted: bool) -> str:
    """The words of an lc-family pick: the winner's overhead and the others' (over their
    weights when the scheduler divides by weight)."""
    if least is None:
        return "every destination is overloaded or has weight 0"

    def cost(c: Compared) -> str:
        return f"{c.overhead}/{c.dest.weight}" if weighted else str(c.overhead)

    others = ", ".join(f"{c.dest} {cost(c)}" for c in compared
                       if not c.skipped and c.dest is not least)
    won = next(c for c in compared if c.dest is least)
    return (f"{name}: {text}; {least} has the least, {cost(won)}"
            + (f" (others: {others})" if others else "")
            + "; on a tie the earlier in kernel list order wins")
