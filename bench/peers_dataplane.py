"""The dataplane through a ClusterIP (issue 33's side-by-side bench, in the lab guest): three
pods (network namespaces on a bridge, each accepting TCP on DP_POD_PORT) behind the dataplane
service, and a client namespace routed through the node, as a pod on another node's subnet
would be. The client measures what a service proxy's dataplane costs a new connection:

- connect latency: one connection at a time, the time connect() takes (SYN to SYN-ACK through
  the node's NAT or IPVS), p50 and p99;
- new connections per second: CLIENTS processes connecting as fast as they can for a while.

The client closes each connection with a reset (SO_LINGER 0), so neither side keeps TIME_WAIT
sockets and the ephemeral ports never run out. Everything stays inside the guest: the namespaces'
only routes lead to the node.

    python -m bench.peers_dataplane serve PORT          # in a pod's namespace
    python -m bench.peers_dataplane client IP PORT ...  # in the client namespace (JSON out)
"""

from __future__ import annotations

import json
import multiprocessing
import socket
import struct
import subprocess
import sys
import time
from typing import Any

from bench.peers_cluster import DP_CLIENT_NET, DP_POD_NET, DP_POD_PORT, DP_PODS

BRIDGE, CLIENT_NS, CLIENT_LINK = "bdp0", "bdp-client", "bdpc0"
LINGER_RESET = struct.pack("ii", 1, 0)


def _sh(cmd: str) -> None:
    subprocess.run(cmd, shell=True, check=True, capture_output=True, text=True)


def up() -> None:
    """The pods and the client namespace, their servers started."""
    _sh("sysctl -qw net.ipv4.ip_forward=1")
    _sh(f"ip link add {BRIDGE} type bridge && ip addr add {DP_POD_NET}.1/24 dev {BRIDGE} "
        f"&& ip link set {BRIDGE} up")
    for n, ip in enumerate(DP_PODS):
        ns = f"bdp-pod{n}"
        _sh(f"ip netns add {ns} && ip link add bdpv{n} type veth peer name eth0 netns {ns} "
            f"&& ip link set bdpv{n} master {BRIDGE} up "
            f"&& ip -n {ns} addr add {ip}/24 dev eth0 && ip -n {ns} link set lo up "
            f"&& ip -n {ns} link set eth0 up && ip -n {ns} route add default via {DP_POD_NET}.1")
        subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "bench.peers_dataplane",
                          "serve", str(DP_POD_PORT)], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    _sh(f"ip netns add {CLIENT_NS} && ip link add {CLIENT_LINK} type veth peer name eth0 "
        f"netns {CLIENT_NS} && ip addr add {DP_CLIENT_NET}.1/24 dev {CLIENT_LINK} "
        f"&& ip link set {CLIENT_LINK} up "
        f"&& ip -n {CLIENT_NS} addr add {DP_CLIENT_NET}.2/24 dev eth0 "
        f"&& ip -n {CLIENT_NS} link set lo up && ip -n {CLIENT_NS} link set eth0 up "
        f"&& ip -n {CLIENT_NS} route add default via {DP_CLIENT_NET}.1")
    # every pod answers on its own address before anything is measured
    for ip in DP_PODS:
        deadline = time.monotonic() + 60
        while True:
            p = subprocess.run(["ip", "netns", "exec", CLIENT_NS, sys.executable, "-c",
                                f"import socket; socket.create_connection(('{ip}', "
                                f"{DP_POD_PORT}), timeout=2).close()"],
                               capture_output=True, check=False)
            if p.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"pod {ip} does not answer: {p.stderr.decode()[-500:]}")
            time.sleep(0.5)


def down() -> None:
    subprocess.run(f"for ns in $(ip netns list | awk '/^bdp-/{{print $1}}'); do "
                   f"ip netns pids $ns | xargs -r kill; ip netns del $ns; done; "
                   f"ip link del {BRIDGE}; ip link del {CLIENT_LINK}", shell=True, check=False,
                   capture_output=True)


def measure(ip: str, port: int, latency_samples: int = 1000, seconds: float = 10.0,
            clients: int = 2) -> dict[str, Any]:
    """The client side, run in the client namespace (a new process there): JSON figures."""
    p = subprocess.run(["ip", "netns", "exec", CLIENT_NS, sys.executable, "-m",
                        "bench.peers_dataplane", "client", ip, str(port), str(latency_samples),
                        str(seconds), str(clients)],
                       capture_output=True, text=True, check=False, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"the dataplane client failed: {p.stderr[-2000:]}")
    return dict(json.loads(p.stdout))


# ------------------------------------------------------------------ inside the namespaces


def serve(port: int) -> None:
    """Accept and close (a FIN: a reset could reach a client still inside connect(), which
    then fails with ECONNRESET; the client's own reset ends the connection)."""
    s = socket.create_server(("0.0.0.0", port), backlog=4096, reuse_port=True)
    while True:
        try:
            c, _ = s.accept()
        except OSError:
            continue
        c.close()


def _connect(ip: str, port: int) -> float:
    s = socket.socket()
    s.settimeout(5.0)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
    t = time.perf_counter()
    try:
        s.connect((ip, port))
        return time.perf_counter() - t
    finally:
        s.close()


def _flood(ip: str, port: int, until: float, out: Any) -> None:
    ok = failed = 0
    while time.perf_counter() < until:
        try:
            _connect(ip, port)
            ok += 1
        except OSError:
            failed += 1
    out.put((ok, failed))


def client(ip: str, port: int, samples: int, seconds: float, clients: int) -> dict[str, Any]:
    for _ in range(50):  # warm: the first connections fill caches (ARP, routes, conntrack)
        _connect(ip, port)
    lat, failed = [], 0
    for _ in range(samples):
        try:
            lat.append(_connect(ip, port))
        except OSError:
            failed += 1
    lat.sort()
    q: Any = multiprocessing.Queue()
    until = time.perf_counter() + 0.5 + seconds
    procs = [multiprocessing.Process(target=_flood, args=(ip, port, until, q))
             for _ in range(clients)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    got = [q.get() for _ in procs]
    for p in procs:
        p.join()
    took = time.perf_counter() - t0
    ok = sum(g[0] for g in got)
    return {"connect_p50_ms": lat[len(lat) // 2] * 1000,
            "connect_p99_ms": lat[max(0, round(0.99 * len(lat)) - 1)] * 1000,
            "latency_samples": len(lat), "latency_failed": failed,
            "connections_per_s": ok / took, "flood_failed": sum(g[1] for g in got),
            "clients": clients, "seconds": round(took, 2)}


def main(argv: list[str]) -> int:
    if argv[0] == "serve":
        serve(int(argv[1]))
        return 0
    if argv[0] == "client":
        ip, port, samples, seconds, clients = argv[1:6]
        print(json.dumps(client(ip, int(port), int(samples), float(seconds), int(clients))))
        return 0
    raise SystemExit(f"unknown command {argv[0]}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
