"""Round robin (`rr`): net/netfilter/ipvs/ip_vs_rr.c of Linux 6.1.

The kernel's state is one pointer, `svc->sched_data`: the list entry of the last destination
picked, or the list head itself on a new service (ip_vs_rr_init_svc, ip_vs_rr.c:26-30).

- Picking (ip_vs_rr_schedule, ip_vs_rr.c:52-98): walk the list from the entry after the
  pointer, to the end and on from the start, back to the pointer's own entry; take the first
  destination that is not overloaded and has a positive weight (ip_vs_rr.c:70-73), and move the
  pointer to it (ip_vs_rr.c:89). From the list head, one walk over all destinations.
- Adding a destination (ip_vs_ctl.c:989) puts it at the head of the list; rr has no add_dest
  (ip_vs_rr.c:107), so the pointer stays where it is.
- Removing the destination the pointer is on (ip_vs_rr_del_dest, ip_vs_rr.c:33-46) moves the
  pointer to the entry before it (or the head).

The kernel does not expose the pointer: from outside, only a service whose history is known
(a freshly created one, say) has a predictable sequence. RrState replays such a history.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from scheduler.common import Dest, IPAddress, Pick, find_dest

HEAD = -1  # the pointer is at the list head (&svc->destinations)


def _available(dest: Dest) -> bool:
    return not dest.overloaded and dest.weight > 0  # ip_vs_rr.c:70-71


@dataclass
class RrState:
    """A service's rr state: its destination list (kernel order) and the pointer, as an index
    into the list or HEAD."""

    dests: list[Dest] = field(default_factory=list)
    pos: int = HEAD

    @classmethod
    def fresh(cls, added: Iterable[Dest] = ()) -> RrState:
        """A service just created (pointer at the head), then given `added` one by one in
        that order (each goes to the head of the list)."""
        state = cls()
        for dest in added:
            state.add_dest(dest)
        return state

    def add_dest(self, dest: Dest) -> None:
        """__ip_vs_update_dest(add) (ip_vs_ctl.c:987-993): at the head of the list."""
        self.dests.insert(0, dest)
        if self.pos != HEAD:
            self.pos += 1

    def del_dest(self, addr: IPAddress, port: int) -> None:
        """__ip_vs_unlink_dest (ip_vs_ctl.c:1236-1262) then ip_vs_rr_del_dest."""
        i = find_dest(self.dests, addr, port)
        del self.dests[i]
        if self.pos == i:
            self.pos = i - 1 if i > 0 else HEAD  # ip_vs_rr.c:42-43: p->next->prev
        elif self.pos > i:
            self.pos -= 1

    def upd_dest(self, dest: Dest) -> None:
        """A changed weight or flag; rr has no upd_dest, the list order stays."""
        self.dests[find_dest(self.dests, dest.addr, dest.port)] = dest

    def _walk(self) -> list[int]:
        """The indexes ip_vs_rr_schedule looks at, in order (ip_vs_rr.c:66-81)."""
        n = len(self.dests)
        if self.pos == HEAD:
            return list(range(n))
        return [(self.pos + 1 + k) % n for k in range(n)]

    def peek(self) -> Dest | None:
        for i in self._walk():
            if _available(self.dests[i]):
                return self.dests[i]
        return None

    def schedule(self) -> Dest | None:
        """ip_vs_rr_schedule: the next pick; moves the pointer."""
        for i in self._walk():
            if _available(self.dests[i]):
                self.pos = i
                return self.dests[i]
        return None

    def sequence(self, n: int) -> list[Dest | None]:
        """The next n picks (moves the pointer)."""
        return [self.schedule() for _ in range(n)]


@dataclass(frozen=True, slots=True)
class RrPick(Pick):
    """An rr (or wrr) pick: the coming picks from the assumed position; `known_position`
    says whether that position is the kernel's (a replayed history) or an assumption."""

    upcoming: tuple[Dest | None, ...] = ()
    known_position: bool = False

    def to_json(self) -> dict[str, object]:
        out = Pick.to_json(self)
        out["upcoming"] = [None if d is None else str(d) for d in self.upcoming]
        out["known_position"] = self.known_position
        return out


def cycle(dests: Sequence[Dest]) -> list[Dest]:
    """One full round of rr picks from the list head: the available destinations in list
    order."""
    return [d for d in dests if _available(d)]


def schedule(dests: Sequence[Dest], state: RrState | None = None, upcoming: int = 0) -> RrPick:
    """The next rr pick. With `state` (a replayed history), the kernel's; without, the pick of
    a service whose pointer is at the list head (as when it was just created), which the
    kernel cannot confirm."""
    known = state is not None
    st = RrState(list(dests)) if state is None else RrState(list(state.dests), state.pos)
    round_ = cycle(st.dests)
    n = upcoming or max(len(round_), 1)
    seq = st.sequence(n)
    dest = seq[0]
    if dest is None:
        reason = "no destination has a positive weight and is not overloaded"
    else:
        order = ", ".join(str(d) for d in round_)
        where = ("from the replayed position" if known else
                 "the kernel does not expose its round-robin position; assuming the position of "
                 "a freshly created service (the list head)")
        reason = (f"round robin over the {len(round_)} available server(s) in kernel list "
                  f"order ({order}); {where}")
    return RrPick("rr", dest, reason, upcoming=tuple(seq), known_position=known)
