"""Weighted round robin (`wrr`): net/netfilter/ipvs/ip_vs_wrr.c of Linux 6.1.

The kernel's state is `struct ip_vs_wrr_mark` (ip_vs_wrr.c:60-66): `cl` the list entry of the
last pick (or the head), `cw` the current weight, `mw` the maximum weight less (di - 1), `di`
the gcd of the positive weights (ip_vs_wrr.c:27-55 explain the passes).

- Creating the service (ip_vs_wrr_init_svc, ip_vs_wrr.c:106-124): cl = head, di = gcd (1 with
  no positive weight, ip_vs_wrr.c:69-85), mw = max weight - (di - 1) (ip_vs_wrr.c:91-103),
  cw = mw. A service is created empty, so mw = cw = 0.
- Adding, removing or changing a destination (ip_vs_wrr_dest_changed, ip_vs_wrr.c:138-153):
  cl = head, di and mw recomputed, then cw = mw if cw > mw or cw == 0, else, when di > 1,
  cw = (cw / di) * di + 1. So the first picks of a new service depend on the order its
  destinations were added: adding weight 3 then weight 5 leaves cw = 1 (3's own di is 3 and
  its mw 3 - 2 = 1), and the first pass takes every destination of weight >= 1.
- Picking (ip_vs_wrr_schedule, ip_vs_wrr.c:159-236): from the entry after cl, the first
  destination not overloaded with weight >= cw; at the end of the list cw -= di and the walk
  restarts from the first entry; when cw drops to 0 or below it wraps to mw. The `last_pass`,
  `restarted` and `stop` logic (ip_vs_wrr.c:175-209) ends the search with none when every
  destination was checked at cw <= di.

The kernel does not expose the mark: WrrState replays a known history (a freshly created
service given its destinations one by one).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from scheduler.common import Dest, IPAddress, find_dest, gcd
from scheduler.rr import HEAD, RrPick


def gcd_weight(dests: Sequence[Dest]) -> int:
    """ip_vs_wrr_gcd_weight (ip_vs_wrr.c:69-85)."""
    g = 0
    for dest in dests:
        if dest.weight > 0:
            g = gcd(dest.weight, g) if g > 0 else dest.weight
    return g or 1


def max_weight(dests: Sequence[Dest]) -> int:
    """ip_vs_wrr_max_weight (ip_vs_wrr.c:91-103)."""
    weight = 0
    for dest in dests:
        weight = max(weight, dest.weight)
    return weight


@dataclass
class WrrState:
    """A service's wrr state: its destinations (kernel order) and the mark. cl is an index into
    the list, or HEAD."""

    dests: list[Dest] = field(default_factory=list)
    cl: int = HEAD
    cw: int = 0
    mw: int = 0
    di: int = 1

    @classmethod
    def init_service(cls, dests: Sequence[Dest] = ()) -> WrrState:
        """ip_vs_wrr_init_svc (ip_vs_wrr.c:106-124) on a service holding `dests` (kernel
        order): empty on `ipvsadm -A`, the current ones when a service's scheduler is changed
        to wrr."""
        state = cls(list(dests))
        state.di = gcd_weight(state.dests)
        state.mw = max_weight(state.dests) - (state.di - 1)
        state.cw = state.mw
        return state

    @classmethod
    def fresh(cls, added: Iterable[Dest] = ()) -> WrrState:
        """A service just created, then given `added` one by one in that order."""
        state = cls.init_service()
        for dest in added:
            state.add_dest(dest)
        return state

    def dest_changed(self) -> None:
        """ip_vs_wrr_dest_changed (ip_vs_wrr.c:138-153)."""
        self.cl = HEAD
        self.di = gcd_weight(self.dests)
        self.mw = max_weight(self.dests) - (self.di - 1)
        if self.cw > self.mw or not self.cw:
            self.cw = self.mw
        elif self.di > 1:
            self.cw = (self.cw // self.di) * self.di + 1

    def add_dest(self, dest: Dest) -> None:
        """ip_vs_ctl.c:989-993: at the head of the list, then add_dest."""
        self.dests.insert(0, dest)
        self.dest_changed()

    def del_dest(self, addr: IPAddress, port: int) -> None:
        """ip_vs_ctl.c:1246-1257: unlinked, then del_dest."""
        del self.dests[find_dest(self.dests, addr, port)]
        self.dest_changed()

    def upd_dest(self, dest: Dest) -> None:
        """ip_vs_ctl.c:994-997: a changed destination (weight), then upd_dest."""
        self.dests[find_dest(self.dests, dest.addr, dest.port)] = dest
        self.dest_changed()

    def schedule(self) -> Dest | None:
        """ip_vs_wrr_schedule (ip_vs_wrr.c:159-236): the next pick; moves the mark."""
        n = len(self.dests)
        dest = self.cl
        if self.mw == 0:  # ip_vs_wrr.c:171-173
            return None
        last = dest
        stop: int | None = None
        last_pass = restarted = False
        while True:
            # list_for_each_entry_continue_rcu: the entries after `dest`, up to the head.
            for i in range(dest + 1, n):
                d = self.dests[i]
                if not d.overloaded and d.weight >= self.cw:  # ip_vs_wrr.c:180-182
                    self.cl = i
                    return d
                if i == stop:  # ip_vs_wrr.c:183-184
                    self.cl = i
                    return None
            dest = HEAD  # the walk ended on the head
            self.cw -= self.di  # ip_vs_wrr.c:186
            if self.cw <= 0:
                self.cw = self.mw
                if last_pass or last == HEAD:  # ip_vs_wrr.c:195-197
                    self.cl = HEAD
                    return None
                restarted = True
            last_pass = self.cw <= self.di  # ip_vs_wrr.c:200
            if last_pass and restarted and last != HEAD:  # ip_vs_wrr.c:201-208
                stop = last

    def sequence(self, n: int) -> list[Dest | None]:
        """The next n picks (moves the mark)."""
        return [self.schedule() for _ in range(n)]


def cycle(dests: Sequence[Dest]) -> list[Dest | None]:
    """One full period of wrr picks in steady state (mark at the head, cw = mw): every
    destination of weight w (not overloaded) appears w / di times."""
    state = WrrState.init_service(dests)
    period = sum(d.weight for d in dests if d.weight > 0 and not d.overloaded) // state.di
    return state.sequence(max(period, 1))


def schedule(dests: Sequence[Dest], state: WrrState | None = None, upcoming: int = 0) -> RrPick:
    """The next wrr pick. With `state` (a replayed history), the kernel's; without, the picks
    from a mark at the list head with cw = mw, as ip_vs_wrr_init_svc leaves it, which the
    kernel cannot confirm."""
    known = state is not None
    if state is None:
        st = WrrState.init_service(dests)
    else:
        st = WrrState(list(state.dests), state.cl, state.cw, state.mw, state.di)
    period = cycle(st.dests)
    seq = st.sequence(upcoming or len(period))
    dest = seq[0]
    if dest is None:
        reason = "no destination has a positive weight and is not overloaded"
    else:
        weights = ", ".join(f"{d} weight {d.weight}" for d in st.dests)
        where = ("from the replayed mark" if known else
                 "the kernel does not expose its position (current weight and last pick); "
                 "assuming the start of a period (mark at the list head, cw = max weight)")
        reason = (f"weighted round robin, gcd {gcd_weight(st.dests)}, in kernel list order "
                  f"({weights}); one period is {len(period)} picks; {where}")
    return RrPick("wrr", dest, reason, upcoming=tuple(seq), known_position=known)
