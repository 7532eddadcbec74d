"""Free TCP ports for listeners that tests and benches open later, in another process or after
the choice: taken below the kernel's ephemeral range (net.ipv4.ip_local_port_range), so no
outgoing connection of any process on the machine can be given one as its source port between
the choice and the bind. Asking the kernel for port 0 picks from that very range, and a CI run
once lost a health-check port that way ("Address already in use"). Kubernetes keeps its
NodePort range (30000-32767) below the ephemeral range for the same reason."""

from __future__ import annotations

import random
import socket

FLOOR = 10000  # below: well-known and registered ports other software may expect to own


def ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    with open(path) as f:
        return int(f.read().split()[0])


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n ports nothing listens on now, chosen below the ephemeral range from a random start
    (two runs at once rarely pick the same), each checked by binding it."""
    top = ephemeral_low()
    if top - FLOOR < n:
        raise RuntimeError(f"only {top - FLOOR} ports below the ephemeral range ({top}); "
                           f"{n} wanted")
    start = random.randrange(FLOOR, top)
    ports: list[int] = []
    socks: list[socket.socket] = []
    try:
        for i in range(top - FLOOR):
            port = FLOOR + (start - FLOOR + i) % (top - FLOOR)
            s = socket.socket()
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
            ports.append(port)
            if len(ports) == n:
                return ports
        raise RuntimeError(f"only {len(ports)} free ports below {top}; {n} wanted")
    finally:
        for s in socks:
            s.close()
