"""Weighted least connection (`wlc`): net/netfilter/ipvs/ip_vs_wlc.c of Linux 6.1.

Picking (ip_vs_wlc_schedule, ip_vs_wlc.c:28-85): the first destination in list order that is
not overloaded and has a positive weight is the first candidate (ip_vs_wlc.c:50-57); each
later one that is not overloaded replaces it when
`(s64)loh * dest->weight > (s64)doh * least->weight` (ip_vs_wlc.c:65-74), that is when its
overhead per weight is strictly less. A later destination of weight 0 is compared too
(loh * 0 > doh * w never holds, so it never wins). Ties go to the earlier one.
The overhead is lc's (scheduler.lc.overhead).
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.common import Dest
from scheduler.lc import FORMULA, Compared, Formula, LcPick, formula_text, overhead, reason


def schedule(dests: Sequence[Dest], formula: Formula = FORMULA) -> LcPick:
    """ip_vs_wlc_schedule (ip_vs_wlc.c:28-85). `dests` in kernel list order."""
    compared: list[Compared] = []
    least: Dest | None = None
    loh = 0
    for dest in dests:
        doh = overhead(dest, formula)
        if least is None:  # ip_vs_wlc.c:50-57: the first candidate
            if not dest.overloaded and dest.weight > 0:
                least, loh = dest, doh
                compared.append(Compared(dest, doh))
            else:
                compared.append(Compared(dest, doh,
                                         "overloaded" if dest.overloaded else "weight 0"))
            continue
        if dest.overloaded:  # ip_vs_wlc.c:66-67
            compared.append(Compared(dest, doh, "overloaded"))
            continue
        compared.append(Compared(dest, doh))
        if loh * dest.weight > doh * least.weight:  # ip_vs_wlc.c:69-73
            least, loh = dest, doh
    text = formula_text(formula) + "; compared as overhead / weight"
    return LcPick("wlc", least, reason("weighted least connection", text, least, compared,
                                       weighted=True), compared=tuple(compared), formula=text)
