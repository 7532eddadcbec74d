"""Stale UDP conntrack entries of IPVS services (kernel/conntrack.py) with real datagrams.

`ipvsproxy sync --once` programs a UDP service 10.96.0.53:53 with two pods (network namespaces of
integration/vm/pods.sh, each running a UDP server on 5300 that answers with the pod's name:
a plain loop, as pods.sh's forking socat lets a lingering child swallow the next datagram
under emulation) and the daemon's sysctls, among them
net.ipv4.vs.conntrack=1 (IPVS flows go through conntrack) and net.ipv4.vs.expire_nodest_conn=1.
The outside client (192.168.1.100) sends each datagram from a fixed source port, so each source
port is one IPVS connection and one conntrack entry, pinned to one pod.

What the kernel (Debian 6.1) does, which these tests pin down:
- IPVS writes the real server into the conntrack entry's reply tuple when it schedules a flow:
  reply source = pod address *and* port 5300. (The reply destination is the node's bridge
  address and a new port: the proxy masquerades outside clients of cluster IPs.)
- With expire_nodest_conn=1, deleting a real server expires its IPVS connections at once (a
  work item the deletion queues, kernels >= 5.9), and their conntrack entries go with them: the
  kernel clears the stale entries itself (test_kernel_itself_drops_...).
- With expire_nodest_conn=0 at deletion (older kernels had no such work item; this is the
  state the sweep exists for), the entries stay, and IPVS drops every datagram of the flow
  until its IPVS connection times out (5 min). With expire_nodest_conn=1 by the time the next
  datagram comes, IPVS reschedules it, but only if its conntrack entry is new: an old
  (confirmed) one makes IPVS drop that datagram and expire the connection (ip_vs_in, "old_ct").
  So deleting the stale entry is what lets the *first* datagram after the change through.
"""

from __future__ import annotations

import functools
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.core.conntrack_filters import udp_filters
from ipvsproxy.core.ipvs import DestKey, Protocol, RealServer, ServiceKey
from ipvsproxy.kernel.conntrack import clear_stale_udp
from tests.kernel import forked
from tests.kernel.conftest import sh
from tests.kernel.test_traffic import PODS, PODS_SH, service, slice_, sync

pytestmark = [pytest.mark.kernel, pytest.mark.lab_cost(60)]  # seconds, balances lab guests

VIP, VPORT, TPORT = "10.96.0.53", 53, 5300
CLIENT = "192.168.1.100"
KEY = ServiceKey.inet(Protocol.UDP, ip_address(VIP), VPORT)
POD_IP = {name: addr for name, (addr, _) in PODS.items()}
# Long enough that no entry times out while the slow emulated guest works (default 30 s / 120 s)
CT_SYSCTLS = {"net.netfilter.nf_conntrack_udp_timeout": "600",
              "net.netfilter.nf_conntrack_udp_timeout_stream": "600"}


def cluster(pods: list[str]) -> list[dict[str, Any]]:
    return [
        {"kind": "Node", "metadata": {"name": "node-a"},
         "status": {"addresses": [{"type": "InternalIP", "address": "192.168.1.10"}]}},
        service("dns", VIP, [{"name": "dns", "port": VPORT, "protocol": "UDP"}]),
        slice_("dns-1", "dns", pods, [{"name": "dns", "port": TPORT, "protocol": "UDP"}]),
    ]


def dests(*pods: str) -> dict[ServiceKey, tuple[RealServer, ...]]:
    """Desired.dests of the service with these pods (what the daemon would hand over)."""
    return {KEY: tuple(RealServer(DestKey(ip_address(POD_IP[p]), TPORT)) for p in pods)}


SERVER = (  # one UDP server per pod: answers every datagram with the pod's name
    "import socket, sys\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    f"s.bind(('', {TPORT}))\n"
    "while True:\n"
    "    _, peer = s.recvfrom(100)\n"
    "    s.sendto(sys.argv[1].encode(), peer)\n"
)


def ask(sport: int, dst: str = VIP, port: int = VPORT, timeout: float = 3.0) -> str | None:
    """One datagram from the client's source port `sport`; the answering pod, None if none."""
    code = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('', {sport})); s.settimeout({timeout})\n"
        f"s.sendto(b'q', ({dst!r}, {port}))\n"
        "try:\n    print(s.recv(100).decode().strip())\n"
        "except OSError:\n    print('-')\n"  # timed out, or refused (ICMP)
    )
    p = subprocess.run(["ip", "netns", "exec", "client", sys.executable, "-c", code],
                       capture_output=True, text=True, check=True)
    out = p.stdout.strip()
    return None if out == "-" else out


def flows() -> dict[int, tuple[str, int, str, int]]:
    """The client's UDP conntrack entries, by source port: (orig dst, orig dport, reply src,
    reply sport), as `conntrack -L` prints them (its own netlink dump, not ours)."""
    out: dict[int, tuple[str, int, str, int]] = {}
    for line in sh(f"conntrack -L -p udp -s {CLIENT} 2>/dev/null").splitlines():
        kv = [f.split("=", 1) for f in line.split() if "=" in f]
        src = [v for k, v in kv if k == "src"]
        dst = [v for k, v in kv if k == "dst"]
        sport = [int(v) for k, v in kv if k == "sport"]
        dport = [int(v) for k, v in kv if k == "dport"]
        out[sport[0]] = (dst[0], dport[0], src[1], sport[1])
    return out


def one_flow_per_pod(first_port: int) -> dict[str, int]:
    """Source ports whose flows the scheduler (rr) pinned to pod1 and to pod2."""
    got: dict[str, int] = {}
    for sport in range(first_port, first_port + 6):
        pod = ask(sport)
        assert pod in ("pod1", "pod2"), f"no answer through the service from port {sport}"
        got.setdefault(pod, sport)
        if len(got) == 2:
            return got
    raise AssertionError(f"round robin never reached both pods: {got}")


def ipvs_conn_dest(sport: int) -> str | None:
    """The real server of the client's IPVS connection from `sport` (ipvsadm -Lnc)."""
    for line in sh("ipvsadm -Lnc").splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[3] == f"{CLIENT}:{sport}":
            return parts[5]
    return None


def wait_until(cond: Any, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.2)
    return bool(cond())


@pytest.fixture(scope="module")
def node(ipvs_modules: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("conntrack")
    forked.run(["cleanup"])
    sh("ipvsadm -C")
    saved = {k: sh(f"sysctl -n {k}").strip() for k in CT_SYSCTLS}
    sh("sysctl -qw " + " ".join(f"{k}={v}" for k, v in CT_SYSCTLS.items()))
    sh(f"{PODS_SH} up pod1 pod2")
    servers = [subprocess.Popen(["ip", "netns", "exec", pod, sys.executable, "-c", SERVER, pod])
               for pod in ("pod1", "pod2")]
    try:
        for pod, sport in (("pod1", 40990), ("pod2", 40991)):
            up = functools.partial(lambda p, s: ask(s, POD_IP[p], TPORT, 1.0) == p, pod, sport)
            assert wait_until(up, 30), f"{pod}'s UDP server does not answer"
        yield tmp
    finally:
        for proc in servers:
            proc.kill()
            proc.wait()
        forked.run(["cleanup"])
        sh(f"{PODS_SH} down")
        sh("sysctl -qw " + " ".join(f"{k}={v}" for k, v in saved.items()))
        sh(f"conntrack -D -s {CLIENT} 2>/dev/null", check=False)


@pytest.fixture
def both(node: Path) -> Path:
    """Each test starts from the daemon's state: both pods, the daemon's sysctls."""
    sync(node, cluster(["pod1", "pod2"]))
    sh(f"conntrack -D -s {CLIENT} 2>/dev/null", check=False)  # no entries of earlier tests
    assert sh("sysctl -n net.ipv4.vs.conntrack").strip() == "1"
    assert sh("sysctl -n net.ipv4.vs.expire_nodest_conn").strip() == "1"
    return node


def test_stale_flow_is_deleted_and_its_next_datagram_reaches_the_other_pod(both: Path) -> None:
    # Keep the kernel from clearing the entry itself (see the module docstring)
    sh("sysctl -qw net.ipv4.vs.expire_nodest_conn=0")
    pinned = one_flow_per_pod(41000)
    stale_port, kept_port = pinned["pod1"], pinned["pod2"]
    # Foreign flows straight to the pods, not through the service: one to the pod that goes
    assert ask(41100, POD_IP["pod1"], TPORT) == "pod1"
    assert ask(41101, POD_IP["pod2"], TPORT) == "pod2"
    before = flows()
    # IPVS put the real server (address and port) into the reply tuple
    assert before[stale_port] == (VIP, VPORT, POD_IP["pod1"], TPORT)
    assert before[kept_port] == (VIP, VPORT, POD_IP["pod2"], TPORT)
    assert before[41100] == (POD_IP["pod1"], TPORT, POD_IP["pod1"], TPORT)

    # pod1 leaves: a UDP real server is deleted at once (as the daemon does)
    sh(f"ipvsadm -d -u {VIP}:{VPORT} -r {POD_IP['pod1']}:{TPORT}")
    time.sleep(1)
    after_removal = flows()
    assert after_removal[stale_port] == before[stale_port], "the stale entry is still there"
    assert ipvs_conn_dest(stale_port) == f"{POD_IP['pod1']}:{TPORT}"

    doomed = {p for p, (dst, _, rsrc, _) in after_removal.items()
              if dst == VIP and rsrc == POD_IP["pod1"]}
    assert doomed == {stale_port}
    deleted = clear_stale_udp(udp_filters(dests("pod2"), [KEY]), socket.AF_INET)
    assert deleted == 1
    after = flows()
    assert stale_port not in after
    assert after == {p: v for p, v in after_removal.items() if p != stale_port}
    assert {kept_port, 41100, 41101} <= after.keys()
    # a second sweep finds nothing more
    assert clear_stale_udp(udp_filters(dests("pod2"), [KEY]), 4) == 0

    # The daemon's setting: the next datagram of the flow is rescheduled, and as its conntrack
    # entry is new, this very datagram gets through (to the pod that is left)
    sh("sysctl -qw net.ipv4.vs.expire_nodest_conn=1")
    assert ask(stale_port) == "pod2"
    assert flows()[stale_port] == (VIP, VPORT, POD_IP["pod2"], TPORT)
    assert ask(kept_port) == "pod2"
    assert ask(41100, POD_IP["pod1"], TPORT) == "pod1"  # the foreign flow still works


def test_without_the_sweep_the_first_datagram_is_lost(both: Path) -> None:
    """The control: same steps, no sweep. IPVS sees the old conntrack entry, drops the
    datagram and expires the connection; only the next one is rescheduled."""
    sh("sysctl -qw net.ipv4.vs.expire_nodest_conn=0")
    stale_port = one_flow_per_pod(42000)["pod1"]
    sh(f"ipvsadm -d -u {VIP}:{VPORT} -r {POD_IP['pod1']}:{TPORT}")
    time.sleep(1)
    assert flows()[stale_port][2] == POD_IP["pod1"]
    sh("sysctl -qw net.ipv4.vs.expire_nodest_conn=1")
    assert ask(stale_port, timeout=2) is None
    assert ask(stale_port) == "pod2"


def test_kernel_itself_drops_the_entries_of_a_deleted_real_server(both: Path) -> None:
    """With expire_nodest_conn=1 (the daemon's sysctl) the sync that deletes pod1's real server
    also makes the kernel expire its IPVS connections and their conntrack entries."""
    pinned = one_flow_per_pod(43000)
    stale_port, kept_port = pinned["pod1"], pinned["pod2"]
    assert ask(43100, POD_IP["pod1"], TPORT) == "pod1"
    assert flows()[stale_port][2] == POD_IP["pod1"]

    sync(both, cluster(["pod2"]))  # the daemon's own path
    assert wait_until(lambda: stale_port not in flows()), flows()
    assert ipvs_conn_dest(stale_port) is None
    assert {kept_port, 43100} <= flows().keys()
    # nothing left for the sweep
    assert clear_stale_udp(udp_filters(dests("pod2"), [KEY]), socket.AF_INET) == 0
    assert ask(stale_port) == "pod2"


def test_ipv6_entries_and_other_families_untouched(node: Path) -> None:
    """The IPv6 dump path, on entries made over ctnetlink (the lab's pods are IPv4 only)."""
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple, NFCTSocket

    af = socket.AF_INET6
    vip, client = "fd00:96::53", "fd00:1::100"
    key = ServiceKey.inet(Protocol.UDP, ip_address(vip), VPORT)
    made = {40001: "fd00:244::11", 40002: "fd00:244::12", 40003: "fd00:244::12"}
    with NFCTSocket(nfgen_family=af) as ct:
        for sport, backend in made.items():
            bport = TPORT + (1 if sport == 40003 else 0)  # 40003: right address, wrong port
            ct.entry("add", timeout=300,
                     tuple_orig=NFCTAttrTuple(family=af, saddr=client, daddr=vip, proto=17,
                                              sport=sport, dport=VPORT),
                     tuple_reply=NFCTAttrTuple(family=af, saddr=backend, daddr=client,
                                               proto=17, sport=bport, dport=sport))
    try:
        f = udp_filters({key: (RealServer(DestKey(ip_address("fd00:244::12"), TPORT)),)}, [key])
        assert clear_stale_udp(f, socket.AF_INET) == 0  # no IPv4 filter: IPv6 untouched
        assert clear_stale_udp(f, 6) == 2
        left = sh(f"conntrack -L -f ipv6 -p udp -s {client} 2>/dev/null")
        assert "sport=40002" in left
        assert "sport=40001" not in left and "sport=40003" not in left
    finally:
        sh(f"conntrack -D -f ipv6 -s {client} 2>/dev/null", check=False)
