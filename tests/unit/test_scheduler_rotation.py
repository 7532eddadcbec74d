"""rr, wrr, lc and wlc models (scheduler.rr, .wrr, .lc, .wlc) against hand-worked cases from
the kernel's C code, and properties; plus the shared helpers of scheduler.common."""

from __future__ import annotations

import collections
from fractions import Fraction
from ipaddress import IPv4Address

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import Conn, Dest, UnknownScheduler, flag_names, lc, predict, rr, wlc, wrr
from scheduler.common import overload_state
from scheduler.rr import HEAD, RrState
from scheduler.wrr import WrrState


def d(name: str, weight: int = 1, active: int = 0, inact: int = 0, **kw: object) -> Dest:
    last = ord(name) - ord("a") + 1
    return Dest(IPv4Address(f"10.0.0.{last}"), 80, weight, active, inact,
                **kw)  # type: ignore[arg-type]


def names(seq: list[Dest | None]) -> str:
    return "".join("-" if x is None else chr(ord("a") + int(x.addr) % 256 - 1) for x in seq)


C = Conn(IPv4Address("192.168.0.1"), 1000)

# ------------------------------------------------------------------------------------------ rr


def test_rr_fresh_service_starts_at_the_newest_destination() -> None:
    # added a, b, c: the list is c, b, a (each new one at the head)
    state = RrState.fresh([d("a"), d("b"), d("c")])
    assert names(state.sequence(7)) == "cbacbac"


def test_rr_skips_weight_zero_and_overloaded() -> None:
    state = RrState([d("a"), d("b", 0), d("c", overloaded=True), d("d")])
    assert names(state.sequence(5)) == "adada"
    assert names(RrState([d("a", 0), d("b", overloaded=True)]).sequence(2)) == "--"
    assert names(RrState().sequence(1)) == "-"


def test_rr_add_keeps_the_position_and_delete_moves_it_back() -> None:
    state = RrState([d("a"), d("b"), d("c")])
    assert names(state.sequence(2)) == "ab"
    state.add_dest(d("x"))  # list x a b c, pointer still on b
    assert state.pos == 2
    assert names(state.sequence(3)) == "cxa"
    state.del_dest(IPv4Address("10.0.0.1"), 80)  # pointer on a: moves to x (before a)
    assert state.pos == 0
    assert names(state.sequence(3)) == "bcx"
    state.del_dest(IPv4Address("10.0.0.24"), 80)  # x, first: the pointer goes to the head
    assert state.pos == HEAD
    assert names(state.sequence(2)) == "bc"


def test_rr_update_keeps_order() -> None:
    state = RrState([d("a"), d("b"), d("c")])
    state.upd_dest(d("b", 0))
    assert names(state.sequence(4)) == "acac"


def test_rr_predict_without_history_says_the_position_is_unknown() -> None:
    pick = predict("rr", [d("a"), d("b", 0), d("c")], C)
    assert isinstance(pick, rr.RrPick)
    assert names(list(pick.upcoming)) == "ac"
    assert pick.dest == d("a")
    assert not pick.known_position
    assert "does not expose" in pick.reason
    assert pick.to_json()["upcoming"] == ["10.0.0.1:80", "10.0.0.3:80"]
    known = rr.schedule([d("a"), d("c")], state=RrState([d("a"), d("c")], 0), upcoming=3)
    assert names(list(known.upcoming)) == "cac" and known.known_position


@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=8),
       st.integers(0, 7))
def test_rr_visits_available_destinations_cyclically(spec: list[tuple[int, bool]],
                                                     start: int) -> None:
    dests = [d(chr(ord("a") + i), w, overloaded=o) for i, (w, o) in enumerate(spec)]
    state = RrState(dests, start % len(dests))
    available = [i for i, x in enumerate(dests) if x.weight > 0 and not x.overloaded]
    got = state.sequence(2 * len(dests))
    if not available:
        assert got == [None] * len(got)
        return
    after = [i for i in available if i > start % len(dests)] + \
            [i for i in available if i <= start % len(dests)]
    assert got == [dests[after[k % len(after)]] for k in range(len(got))]


# ----------------------------------------------------------------------------------------- wrr


def test_wrr_steady_state_period_hand_worked() -> None:
    # list a4 b3 c2, di 1, mw 4: cw 4: a | cw 3: a b | cw 2: a b c | cw 1: a b c
    state = WrrState.init_service([d("a", 4), d("b", 3), d("c", 2)])
    assert (state.di, state.mw, state.cw) == (1, 4, 4)
    assert names(state.sequence(18)) == "aababcabc" * 2


def test_wrr_gcd_steps_hand_worked() -> None:
    # a6 b4 c2: di 2, mw 6 - 1 = 5. cw 5: a | 3: a b | 1: a b c
    state = WrrState.init_service([d("a", 6), d("b", 4), d("c", 2)])
    assert (state.di, state.mw) == (2, 5)
    assert names(state.sequence(12)) == "aababc" * 2
    assert names(wrr.cycle([d("a", 6), d("b", 4), d("c", 2)])) == "aababc"


def test_wrr_fresh_service_depends_on_the_order_of_additions() -> None:
    # created empty: di 1, mw 0, cw 0. Add a3: di 3, mw 3 - 2 = 1, cw 0 -> 1.
    # Add b5: di 1, mw 5, cw 1 stays. List b a. First pass at cw 1: b a; then cw 5: b;
    # 4: b; 3: b a; 2: b a; 1: b a.
    state = WrrState.fresh([d("a", 3), d("b", 5)])
    assert (state.di, state.mw, state.cw) == (1, 5, 1)
    assert names(state.sequence(2 + 8 + 8)) == "ba" + "bbbababa" * 2
    # the other order: b5 then a3. b: di 5, mw 1, cw 1; a: di 1, mw 5, cw 1. List a b.
    # cw 1: a b | 5: b | 4: b | 3: a b | 2: a b | 1: a b
    state = WrrState.fresh([d("b", 5), d("a", 3)])
    assert names(state.sequence(2 + 8)) == "ab" + "bbababab"


def test_wrr_dest_changed_rounds_cw_with_di() -> None:
    state = WrrState([d("a", 6), d("b", 3)], cl=0, cw=4, mw=4, di=3)
    state.dest_changed()  # di 3, mw 6 - 2 = 4; cw 4 not > 4: (4 / 3) * 3 + 1 = 4
    assert (state.cl, state.cw, state.mw, state.di) == (HEAD, 4, 4, 3)
    state.cw = 2
    state.upd_dest(d("b", 9))  # di 3, mw 9 - 2 = 7; cw (2 / 3) * 3 + 1 = 1
    assert (state.cw, state.mw) == (1, 7)
    state.cw = 9
    state.del_dest(IPv4Address("10.0.0.2"), 80)  # di 6, mw 1; cw 9 > 1 -> 1
    assert (state.cw, state.mw, state.di) == (1, 1, 6)


def test_wrr_nothing_available() -> None:
    assert WrrState.init_service([d("a", 0), d("b", 0)]).schedule() is None  # mw 0
    state = WrrState.init_service([d("a", 2, overloaded=True), d("b", 1, overloaded=True)])
    assert names(state.sequence(3)) == "---"
    # from a position inside the list too (the last_pass / stop logic ends the walk)
    state = WrrState.init_service([d("a", 2), d("b", 1), d("c", 3)])
    state.sequence(2)
    state.dests = [Dest(x.addr, x.port, x.weight, overloaded=True) for x in state.dests]
    assert state.schedule() is None


def test_wrr_skips_overloaded_keeps_period() -> None:
    state = WrrState.init_service([d("a", 2), d("b", 2, overloaded=True), d("c", 1)])
    assert names(state.sequence(6)) == "aacaac"


def test_wrr_predict_without_history() -> None:
    pick = predict("wrr", [d("a", 3), d("b", 3), d("c", 1)], C)
    assert isinstance(pick, rr.RrPick)
    assert names(list(pick.upcoming)) == "abababc"
    assert "7 picks" in pick.reason and "does not expose" in pick.reason
    assert predict("wrr", [d("a", 0)], C).dest is None


@settings(max_examples=100)
@given(st.lists(st.tuples(st.integers(0, 12), st.booleans()), min_size=1, max_size=6))
def test_wrr_steady_period_gives_each_weight_over_gcd(spec: list[tuple[int, bool]]) -> None:
    dests = [d(chr(ord("a") + i), w, overloaded=o) for i, (w, o) in enumerate(spec)]
    state = WrrState.init_service(dests)
    live = [x for x in dests if x.weight > 0 and not x.overloaded]
    period = sum(x.weight for x in live) // state.di
    got = state.sequence(max(period, 1) * 2)
    if not live:
        assert set(got) == {None}
        return
    counts = collections.Counter(got)
    # With overloaded destinations out, passes at low cw can still take every live one:
    # each live destination appears at least weight / di times per period.
    assert None not in counts
    if all(not o for _, o in spec):
        assert counts == {x: 2 * x.weight // state.di for x in live}


# ------------------------------------------------------------------------------------- lc, wlc


def test_overhead_formula_of_debian_6_1_192() -> None:
    # (activeconns << 8) + totalconns, totalconns = active + inactive
    assert lc.overhead(d("a", active=2, inact=5)) == 2 * 256 + 7
    assert lc.overhead(d("a", active=2, inact=5), "inactconns") == 2 * 256 + 5


def test_lc_least_overhead_ties_to_the_earlier() -> None:
    dests = [d("a", active=1), d("b", inact=256), d("c", inact=300)]
    # a 257, b 256, c 300 -> b; with the older formula a 256, b 256: tie -> a
    assert lc.schedule(dests).dest == dests[1]
    assert lc.schedule(dests, "inactconns").dest == dests[0]
    tie = [d("a", inact=3), d("b", inact=3)]
    assert lc.schedule(tie).dest == tie[0]


def test_lc_skips_weight_zero_and_overloaded_but_ignores_other_weights() -> None:
    dests = [d("a", 0), d("b", 1, overloaded=True), d("c", 100, active=1), d("d", 1, inact=5)]
    pick = lc.schedule(dests)
    assert pick.dest == dests[3]  # 5 < 257: weight does not matter to lc
    assert [c.skipped for c in pick.compared] == ["weight 0", "overloaded", "", ""]
    assert "256 * active + (active + inactive)" in pick.reason
    assert lc.schedule([d("a", 0)]).dest is None
    js = pick.to_json()
    assert js["real_server"] == "10.0.0.4:80"
    assert js["compared"][2] == {"real_server": "10.0.0.3:80", "weight": 100,  # type: ignore[index]
                                 "activeconns": 1, "inactconns": 0, "overhead": 257,
                                 "skipped": None}


def test_wlc_hand_worked() -> None:
    # a: w1, 1 active -> 257. b: w3, 2 active 1 inactive -> 512 + 3 = 515.
    # 257 * 3 = 771 > 515 * 1: b
    dests = [d("a", 1, active=1), d("b", 3, active=2, inact=1)]
    assert wlc.schedule(dests).dest == dests[1]
    # tie: a w2 overhead 2, b w1 overhead 1: 2 * 1 > 1 * 2 is false: a stays
    tie = [d("a", 2, inact=2), d("b", 1, inact=1)]
    assert wlc.schedule(tie).dest == tie[0]


def test_wlc_first_candidate_and_weight_zero_later() -> None:
    # a weight 0 is skipped as first candidate; c weight 0 later is compared but loses:
    # 5 * 0 > 0 * 1 is false
    dests = [d("a", 0), d("b", 1, inact=5), d("c", 0), d("e", 1, overloaded=True)]
    pick = wlc.schedule(dests)
    assert pick.dest == dests[1]
    assert [c.skipped for c in pick.compared] == ["weight 0", "", "", "overloaded"]
    assert wlc.schedule([d("a", 0), d("b", overloaded=True)]).dest is None
    assert predict("wlc", dests, C).dest == dests[1]
    assert predict("lc", dests, C).dest == dests[1]


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4), st.integers(0, 600),
                          st.booleans()), min_size=1, max_size=8))
def test_lc_and_wlc_pick_the_first_minimum(spec: list[tuple[int, int, int, bool]]) -> None:
    dests = [d(chr(ord("a") + i), w, a, n, overloaded=o) for i, (w, a, n, o) in enumerate(spec)]
    eligible = [x for x in dests if x.weight > 0 and not x.overloaded]
    lc_pick = lc.schedule(dests).dest
    wlc_pick = wlc.schedule(dests).dest
    if not eligible:
        assert lc_pick is None and wlc_pick is None
        return
    best = min(lc.overhead(x) for x in eligible)
    assert lc_pick == next(x for x in eligible if lc.overhead(x) == best)
    wbest = min(Fraction(lc.overhead(x), x.weight) for x in eligible)
    assert wlc_pick == next(x for x in eligible if Fraction(lc.overhead(x), x.weight) == wbest)


# ----------------------------------------------------------------------------------- common


def test_overload_state_from_thresholds() -> None:
    assert overload_state(0, 0, 1000) is False
    # upper 100, lower default 100 - 25 = 75
    assert overload_state(100, 0, 100) is True
    assert overload_state(100, 0, 74) is False
    assert overload_state(100, 0, 75) is None
    assert overload_state(100, 0, 99) is None
    assert overload_state(100, 50, 49) is False
    assert overload_state(100, 50, 50) is None


def test_flag_names_and_unknown_scheduler() -> None:
    assert flag_names("sh", 0x18) == ["sh-fallback", "sh-port"]
    assert flag_names("mh", 0x08) == ["mh-fallback"]
    assert flag_names("rr", 0x18) == []
    with pytest.raises(UnknownScheduler):
        predict("dh", [d("a")], C)
