"""`ipvsproxy run` waits for its ports while another process holds them (issue 36): in a
DaemonSet swap kube-proxy's pod may still be ending, and nothing is synced before the ports are
ipvsproxy's, so the two proxies never program one node at once."""

from __future__ import annotations

import socket
import threading

import pytest

from ipvsproxy.cli import CliError
from ipvsproxy.commands.run import _start_servers
from ipvsproxy.daemon.health import Health
from ipvsproxy.daemon.metrics import Metrics
from ipvsproxy.settings.config import Config


def held_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_port_another_process_holds_is_waited_for() -> None:
    other = held_port()
    port = other.getsockname()[1]
    cfg = Config(healthz_bind_address=f"127.0.0.1:{port}", metrics_bind_address="")
    threading.Timer(1.0, other.close).start()  # kube-proxy's pod ends
    servers = _start_servers(cfg, Metrics(), Health((4,), 30.0), wait=30.0)
    try:
        assert [s.port for s in servers] == [port]
    finally:
        for s in servers:
            s.stop()


def test_a_port_still_held_after_the_wait_ends_the_start_with_the_reason() -> None:
    other = held_port()
    port = other.getsockname()[1]
    cfg = Config(healthz_bind_address="127.0.0.1:0", metrics_bind_address=f"127.0.0.1:{port}")
    try:
        with pytest.raises(CliError, match="Address already in use"):
            _start_servers(cfg, Metrics(), Health((4,), 30.0), wait=1.0)
    finally:
        other.close()
