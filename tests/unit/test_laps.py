"""daemon/laps.py: a full sync's phases, timed with a fake clock."""

from __future__ import annotations

from ipvsproxy.daemon.laps import Laps, rounded


def test_laps_add_up_per_name_and_a_restart_drops_the_gap() -> None:
    now = [10.0]
    laps = Laps(lambda: now[0])
    now[0] = 11.5
    laps.lap("desired")
    now[0] = 12.0
    laps.lap("observe")
    now[0] = 20.0
    laps.restart()  # eight seconds that belong to no phase
    now[0] = 20.25
    laps.lap("desired")
    laps.add({"apply_ipvs": 3.0, "observe": 1.0})
    assert laps.seconds == {"desired": 1.75, "observe": 1.5, "apply_ipvs": 3.0}
    assert rounded({"diff": 0.123456}) == {"diff": 0.123}
