"""A process running the daemon's HTTP servers as `ipvsproxy run` starts them (/healthz, the
metrics server, the health-check node ports of a tenant's LoadBalancer Services) and logging as
the daemon logs (JSON lines on stderr), for tests that attack it from outside and look at what
it can still do and what it wrote. Not a test module.

    python -m tests.unit.http_child [--nofile N]

stdin, first line: a JSON list of health-check node ports (one Service each, on 127.0.0.1).
stdout, first line: {"healthz": port, "metrics": port, "open": [the ports listening]}; then
one JSON line per "check" read on stdin: whether the process can still open a socket, run a
subprocess and make a temporary file. Exits when stdin closes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from tests.unit.test_http import get


def check() -> dict[str, Any]:
    """What the reconciler needs besides the servers: a socket (netlink, the API server), a
    subprocess (iptables-restore, ipset) and a temporary file, each tried once."""

    def sock() -> None:
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()

    def proc() -> None:
        subprocess.run(["true"], check=True, timeout=10)

    def tmp() -> None:
        with tempfile.TemporaryFile() as f:
            f.write(b"x")

    out: dict[str, Any] = {}
    tries: dict[str, Callable[[], None]] = {"socket": sock, "subprocess": proc, "tempfile": tmp}
    for what, attempt in tries.items():
        try:
            attempt()
            out[what] = "ok"
        except OSError as exc:
            out[what] = exc.strerror or str(exc)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nofile", type=int, help="soft and hard RLIMIT_NOFILE to run with")
    args = ap.parse_args()
    if args.nofile:
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, args.nofile))
    from ipvsproxy.daemon import http
    from ipvsproxy.daemon.hcnp import HealthCheckPorts
    from ipvsproxy.daemon.health import Health
    from ipvsproxy.daemon.metrics import Metrics
    from ipvsproxy.logsetup import setup_logging

    setup_logging(fmt="json")
    health = Health((4,), 30.0)
    health.updated(4)
    metrics = Metrics()
    healthz = http.start_healthz("127.0.0.1:0", health, metrics)
    served = http.start_metrics("127.0.0.1:0", metrics)
    ports = json.loads(sys.stdin.readline())
    hc = HealthCheckPorts(health, ["127.0.0.1"])
    hc.sync({("tenant", f"lb-{i:05}"): (p, 1) for i, p in enumerate(ports)})
    # answered once here: the servers' first answers do their imports now, not under attack
    with contextlib.suppress(OSError):
        get(f"http://127.0.0.1:{healthz.port}/healthz")
    print(json.dumps({"healthz": healthz.port, "metrics": served.port,
                      "open": sorted(hc.open_ports().values())}), flush=True)
    for _ in sys.stdin:
        print(json.dumps(check()), flush=True)
    os._exit(0)  # the servers' threads (one per port before issue 32) are not waited for


if __name__ == "__main__":
    sys.exit(main())
