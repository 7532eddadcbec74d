"""Issue 32, item 8: what clients and tenants do to the daemon's HTTP servers never leaves the
process without file descriptors. A child process (tests/unit/http_child.py) runs /healthz, the
metrics server and the health-check node ports of a tenant's 600 LoadBalancer Services with a
descriptor limit of 1024, soft and hard (nothing to raise: the budget alone must hold); this
process holds 1,500 idle connections spread over five of its listeners. The child must still
open a socket, run a subprocess and make a temporary file, and the kubelet's probe and a load
balancer's check must still be answered."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import structlog

from integration.ports import free_ports
from ipvsproxy.daemon import fds, http
from ipvsproxy.daemon.hcnp import HealthCheckPorts
from ipvsproxy.daemon.health import Health
from ipvsproxy.daemon.metrics import Metrics
from tests.unit.test_http import get
from tests.unit.test_http_abuse import wait_for

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 1024  # a container runtime's usual soft limit (containerd 2's hard one is higher)
TENANT_SERVICES = 600  # LoadBalancer Services with externalTrafficPolicy Local
IDLE_PER_LISTENER = 300
SERVICES = 2000  # more than the default NodePort range holds less the other Services'


class Child:
    def __init__(self, nofile: int, ports: list[int], log: IO[bytes]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.unit.http_child", "--nofile", str(nofile)], cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(ports) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the child died while starting (exit {self.proc.wait()})"
        self.ports: dict[str, Any] = json.loads(line)

    def check(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("check\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the child died (exit {self.proc.wait()})"
        doc: dict[str, Any] = json.loads(line)
        doc["fds"] = len(os.listdir(f"/proc/{self.proc.pid}/fd"))
        return doc

    def stop(self) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def log() -> Iterator[IO[bytes]]:
    """The child's stderr; this process may hold as many descriptors as it is allowed."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 5 * IDLE_PER_LISTENER + SERVICES + 200
    assert hard >= need, f"these tests need {need} descriptors; the hard limit is {hard}"
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryFile() as f:
        yield f


def answered(port: int, path: str = "/healthz") -> int:
    """The status of a GET, 0 when none came (in 5 s)."""
    try:
        return get(f"http://127.0.0.1:{port}{path}")[0]
    except OSError:
        return 0


def test_idle_connections_over_many_listeners_leave_the_process_its_descriptors(
        log: IO[bytes]) -> None:
    child = Child(LIMIT, free_ports(TENANT_SERVICES), log)
    idle: list[socket.socket] = []
    try:
        opened = child.ports["open"]
        assert len(opened) >= 10, f"only {len(opened)} health-check ports opened"
        targets = [child.ports["healthz"], child.ports["metrics"], *opened[:3]]
        for port in targets:
            for _ in range(IDLE_PER_LISTENER):
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", port))
                idle.append(s)
            time.sleep(0.2)  # let the server take them (a full accept queue drops SYNs)
        # each answer comes after the idle connections queued before it were accepted
        codes = {"healthz": answered(targets[0]),
                 "metrics": answered(targets[1]),
                 **{f"lb {p}": answered(p, "/") for p in (*targets[2:], opened[-1])}}
        state = child.check()
        assert {k: state[k] for k in ("socket", "subprocess", "tempfile")} == \
            {"socket": "ok", "subprocess": "ok", "tempfile": "ok"}, state
        assert set(codes.values()) == {200}, codes
        # a quarter of the descriptors is left for the reconciler, whatever the clients do
        assert state["fds"] <= LIMIT * 3 // 4, state
    finally:
        for s in idle:
            s.close()
        child.stop()
    log.seek(0)
    text = log.read().decode()
    assert "Traceback" not in text and '"exception"' not in text, text[-3000:]


def test_thousands_of_health_check_services_cannot_take_every_descriptor(
        log: IO[bytes]) -> None:
    child = Child(LIMIT, free_ports(SERVICES), log)
    try:
        opened = child.ports["open"]
        state = child.check()
        assert {k: state[k] for k in ("socket", "subprocess", "tempfile")} == \
            {"socket": "ok", "subprocess": "ok", "tempfile": "ok"}, state
        assert state["fds"] <= LIMIT * 3 // 4, state
        assert answered(opened[0], "/") == 200 and answered(child.ports["healthz"]) == 200
    finally:
        child.stop()
    log.seek(0)
    lines = [json.loads(line) for line in log.read().decode().splitlines() if line.strip()]
    # the Services left without a listener are named in one bounded warning, not one each
    left_out = [e for e in lines if e.get("level") == "warning"]
    assert len(left_out) == 1, left_out[:5]
    assert left_out[0]["not_opened"] == SERVICES - len(opened)
    assert not any("exception" in e for e in lines)


# --- in this process: the budget's fairness, the listener cap, the limit raised --------------

def connect_idle(port: int, n: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]


def still_open(socks: list[socket.socket]) -> int:
    """How many the server has not closed (poll: these may be numbered beyond select's 1024)."""
    def closed(s: socket.socket) -> bool:
        poller = select.poll()
        poller.register(s, select.POLLIN)
        if not poller.poll(0):
            return False
        try:
            return s.recv(1, socket.MSG_PEEK) == b""
        except ConnectionResetError:
            return True

    return sum(not closed(s) for s in socks)


def test_one_budget_for_all_servers_is_shared_fairly() -> None:
    """Three servers (three threads: /healthz, metrics, health-check ports) and five listeners
    share a budget of 40: an attacker's 100 idle connections on each of four listeners leave
    each about a quarter, the total stays within the budget (plus one per other thread, for the
    moment it takes that thread to give one up), and a newcomer on each listener is answered."""
    budget = fds.Budget(40)
    health = Health((4,), 30.0)
    health.updated(4)
    healthz = http.start_healthz("127.0.0.1:0", health, Metrics(), budget=budget)
    served = http.start_metrics("127.0.0.1:0", Metrics(), budget=budget)
    hc = HealthCheckPorts(health, ["127.0.0.1"], budget=budget)
    ports = free_ports(3)
    hc.sync({("tenant", f"lb-{i}"): (p, 1) for i, p in enumerate(ports)})
    attacked = [healthz.port, served.port, ports[0], ports[1]]
    idle: dict[int, list[socket.socket]] = {}
    try:
        for port in attacked:
            idle[port] = connect_idle(port, 100)
            wait_for("the server took them", lambda: budget.held() >= min(40, len(idle) * 10))
        # all taken from the accept queues (where they cost no descriptor), and evicted
        wait_for("the total within the budget",
                 lambda: sum(still_open(socks) for socks in idle.values()) <= 40 + 2)
        held = {port: still_open(socks) for port, socks in idle.items()}
        assert sum(held.values()) <= 40 + 2, held
        assert all(8 <= n <= 12 for n in held.values()), held
        assert get(f"http://127.0.0.1:{healthz.port}/healthz")[0] == 200
        assert get(f"http://127.0.0.1:{served.port}/healthz")[0] == 200
        for port in ports:  # the third was not attacked
            assert get(f"http://127.0.0.1:{port}/")[0] == 200
        assert budget.held() <= 40 + 2
    finally:
        for socks in idle.values():
            for s in socks:
                s.close()
        healthz.stop()
        served.stop()
        hc.close()
    assert budget.held() == 0


def test_health_check_listeners_beyond_the_cap_wait_for_room() -> None:
    health = Health((4,), 30.0)
    health.updated(4)
    hc = HealthCheckPorts(health, ["127.0.0.1"], max_listeners=4)
    ports = free_ports(10)
    want = {("tenant", f"lb-{i}"): (p, 1) for i, p in enumerate(ports)}
    try:
        with structlog.testing.capture_logs() as logs:
            hc.sync(want)
            hc.sync(want)  # the same left out: not logged again
        assert sorted(hc.open_ports().values()) == sorted(ports[:4])
        warnings = [e for e in logs if e["log_level"] == "warning"]
        assert len(warnings) == 1 and warnings[0]["not_opened"] == 6
        assert warnings[0]["services"] == [f"tenant/lb-{i}" for i in range(4, 9)]
        for p in ports[4:]:
            with socket.socket() as s:
                assert s.connect_ex(("127.0.0.1", p)) != 0
        del want[("tenant", "lb-0")], want[("tenant", "lb-1")]
        hc.sync(want)  # room for two more
        assert sorted(hc.open_ports().values()) == sorted(ports[2:6])
        assert get(f"http://127.0.0.1:{ports[5]}/")[0] == 200
    finally:
        hc.close()


def test_the_shares_of_the_descriptor_limit() -> None:
    assert fds.shares(1024) == fds.Shares(connections=256, listeners=256)
    assert fds.shares(1 << 20) == fds.Shares(connections=4096, listeners=1 << 18)
    assert fds.shares(40) == fds.Shares(connections=16, listeners=16)


def test_the_soft_limit_is_raised_to_the_hard_one_and_logged() -> None:
    """As `ipvsproxy run` starts (before it finds the host has no IPVS and stops)."""
    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 4096))

    p = subprocess.run([sys.executable, "-m", "ipvsproxy", "run", "--hostname-override", "n",
                        "--healthz-bind-address", "127.0.0.1:0",
                        "--metrics-bind-address", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=60, check=False,
                       preexec_fn=limits)
    lines = [json.loads(line) for line in p.stderr.splitlines() if line.startswith("{")]
    [raised] = [e for e in lines if e["event"] == "file descriptor limit"]
    assert (raised["soft_was"], raised["soft"], raised["hard"]) == (1024, 4096, 4096)
    assert (raised["http_connections"], raised["health_check_listeners"]) == (1024, 1024)
