"""Health-check node ports (daemon/hcnp.py) on real sockets: opened, updated and closed with
the services, upstream's answers (service_health.go), and a port that cannot be bound."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import structlog

from integration.ports import free_ports
from ipvsproxy.daemon.hcnp import HealthCheckPorts
from tests.unit.test_http import get


class FakeHealth:
    def __init__(self) -> None:
        self.healthy = True

    def is_healthy(self) -> bool:
        return self.healthy


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture
def hc() -> Iterator[tuple[HealthCheckPorts, FakeHealth]]:
    health = FakeHealth()
    ports = HealthCheckPorts(health, ["127.0.0.1"])
    yield ports, health
    ports.close()


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}/"


def test_answers_as_upstream(hc: tuple[HealthCheckPorts, FakeHealth]) -> None:
    ports, health = hc
    (p,) = free_ports(1)
    ports.sync({("shop", "front"): (p, 2)})
    code, headers, body = get(url(p))
    assert code == 200
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["X-Load-Balancing-Endpoint-Weight"] == "2"
    assert body.decode() == ('{\n\t"service": {\n\t\t"namespace": "shop",\n\t\t"name": "front"\n'
                             '\t},\n\t"localEndpoints": 2,\n\t"serviceProxyHealthy": true\n}')
    health.healthy = False
    code, _, body = get(url(p) + "any/path")
    assert code == 503 and body.endswith(b'"serviceProxyHealthy": false\n}')


def test_open_update_and_close(hc: tuple[HealthCheckPorts, FakeHealth]) -> None:
    ports, _ = hc
    a, b, c = free_ports(3)
    ports.sync({("default", "a"): (a, 1), ("default", "b"): (b, 0)})
    assert get(url(a))[0] == 200
    code, headers, body = get(url(b))
    assert code == 503 and headers["X-Load-Balancing-Endpoint-Weight"] == "0"
    assert b'"localEndpoints": 0' in body
    # b gains a local endpoint, a loses its own, and a moves to another port
    ports.sync({("default", "a"): (c, 0), ("default", "b"): (b, 3)})
    assert get(url(b))[0] == 200 and b'"localEndpoints": 3' in get(url(b))[2]
    assert get(url(c))[0] == 503 and refused(a)
    assert ports.open_ports() == {("default", "a"): c, ("default", "b"): b}
    ports.sync({("default", "b"): (b, 3)})
    assert refused(c) and get(url(b))[0] == 200
    ports.close()
    assert refused(b) and ports.open_ports() == {}


def test_a_port_that_cannot_be_bound_is_logged_and_retried(
        hc: tuple[HealthCheckPorts, FakeHealth]) -> None:
    ports, _ = hc
    a, b = free_ports(2)
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", b))
    squatter.listen()
    try:
        with structlog.testing.capture_logs() as logs:
            want = {("default", "a"): (a, 1), ("shop", "taken"): (b, 1)}
            ports.sync(want)
            ports.sync(want)  # still failing: not logged again at every sync
        failed = [e for e in logs if e["log_level"] == "warning"]
        assert len(failed) == 1
        assert failed[0]["service"] == "shop/taken" and failed[0]["port"] == b
        assert "in use" in failed[0]["error"]
        assert get(url(a))[0] == 200  # the others work
        assert ports.open_ports() == {("default", "a"): a}
    finally:
        squatter.close()
    ports.sync(want)  # the port is free now: opened at the next sync
    assert get(url(b))[0] == 200


def test_two_services_on_one_port_the_second_one_fails(
        hc: tuple[HealthCheckPorts, FakeHealth]) -> None:
    ports, _ = hc
    (p,) = free_ports(1)
    with structlog.testing.capture_logs() as logs:
        ports.sync({("default", "a"): (p, 1), ("default", "b"): (p, 1)})
    assert [e["service"] for e in logs if e["log_level"] == "warning"] == ["default/b"]
    assert b'"name": "a"' in get(url(p))[2]


def test_no_addresses_listens_on_every_address() -> None:
    ports = HealthCheckPorts(FakeHealth(), None)
    (p,) = free_ports(1)
    try:
        ports.sync({("default", "a"): (p, 1)})
        assert get(url(p))[0] == 200
    finally:
        ports.close()
    assert refused(p)
