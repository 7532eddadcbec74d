"""integration/ports.py: the ports handed to listeners opened later lie below the ephemeral range,
where no outgoing connection can take one first, and are free when chosen."""

from __future__ import annotations

import random
import socket

import pytest

from integration.ports import FLOOR, ephemeral_low, free_ports


def test_ports_are_distinct_free_and_outside_the_ephemeral_range() -> None:
    ports = free_ports(500)
    assert len(set(ports)) == 500
    assert all(FLOOR <= p < ephemeral_low() for p in ports)
    for p in ports[:50]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_port_in_use_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    (port,) = free_ports(1)
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        monkeypatch.setattr(random, "randrange", lambda lo, hi: port)  # start the scan there
        chosen = free_ports(3)
    assert port not in chosen
