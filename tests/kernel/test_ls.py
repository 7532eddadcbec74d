"""`ipvsproxy ls` against the real ipvsadm 1.31, byte for byte, in the lab kernel.

Each test builds kernel state with ipvsadm itself (random tables from a fixed seed, an empty
table, live traffic through network namespaces) and compares stdout, stderr and the exit code
of `ipvsadm <mode>` with `ipvsproxy ls <mode>` for every listing mode. Counters and rates that
move are compared inside a bracket: ipvsadm, ipvsproxy, ipvsadm again; a try counts only when
both ipvsadm runs agree, so ipvsproxy saw the same kernel state.
"""

from __future__ import annotations

import contextlib
import io
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.cli import main
from ipvsproxy.core import ipvsadm_conn
from tests.kernel.conftest import sh

pytestmark = [pytest.mark.kernel, pytest.mark.lab_cost(140)]  # seconds, balances lab guests

ALL_SCHEDULERS = ["rr", "wrr", "lc", "wlc", "sh", "mh", "dh", "sed", "nq", "lblc", "lblcr",
                  "fo", "ovf", "twos"]
INT_MAX = 2**31 - 1
Result = tuple[int, bytes, bytes]


def ipvsadm(*args: str, stdin: bytes | None = None) -> Result:
    p = subprocess.run(["ipvsadm", *args], input=stdin, capture_output=True, check=False)
    return p.returncode, p.stdout, p.stderr


def ours(*args: str) -> Result:
    """`ipvsproxy ls <args>` in this process (a fresh Python takes ~30 s to start in the lab)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["ls", *args])
    return rc, out.getvalue().encode(), err.getvalue().encode()


def show(r: Result) -> str:
    return f"rc={r[0]}\n--- stdout\n{r[1].decode(errors='replace')}--- stderr\n" \
           f"{r[2].decode(errors='replace')}"


def assert_same(*args: str) -> Result:
    want, got = ipvsadm(*args), ours(*args)
    assert got == want, f"ipvsadm {' '.join(args)}\n== ipvsadm:\n{show(want)}\n" \
                        f"== ipvsproxy ls:\n{show(got)}"
    return want


def assert_same_bracketed(*args: str, tries: int = 25) -> Result:
    """For output that moves (rates, expiry timers): ours must equal ipvsadm run just before and
    just after it, when those two agree."""
    last: tuple[Result, Result] | None = None
    for _ in range(tries):
        before = ipvsadm(*args)
        got = ours(*args)
        after = ipvsadm(*args)
        if before == after:
            if got == before:
                return got
            last = (before, got)
        time.sleep(0.13)
    assert last is not None, f"ipvsadm {' '.join(args)} never gave the same output twice"
    want, got = last
    raise AssertionError(f"ipvsadm {' '.join(args)}\n== ipvsadm:\n{show(want)}\n"
                         f"== ipvsproxy ls:\n{show(got)}")


@pytest.fixture(scope="module")
def schedulers(ipvs_modules: None) -> list[str]:
    """The schedulers this kernel has (twos only exists from Linux 6.7 on)."""
    have = [s for s in ALL_SCHEDULERS
            if subprocess.run(["modprobe", f"ip_vs_{s}"], capture_output=True).returncode == 0]
    assert {"rr", "wrr", "lc", "wlc", "sh", "mh", "dh", "sed", "nq", "lblc", "lblcr", "fo",
            "ovf"} <= set(have)
    sh("modprobe ip_vs_pe_sip")
    return have


# ---------------------------------------------------------------------------------------------
# Random tables, written with ipvsadm -R


@dataclass
class Table:
    lines: list[str] = field(default_factory=list)  # ipvsadm -R input
    services: list[list[str]] = field(default_factory=list)  # each one's -t/-u/-f arguments
    keys: set[tuple[str, ...]] = field(default_factory=set)


def _v4(rng: random.Random, dest: bool) -> str:
    first = rng.choice([10, 10, 192, 203, 172, 1, 100, 127, 223] + ([] if dest else [240, 255]))
    if first == 192:
        return f"192.168.{rng.randrange(256)}.{rng.randrange(1, 255)}"
    if first == 203:
        return f"203.0.113.{rng.randrange(1, 255)}"
    return f"{first}.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"


def _v6(rng: random.Random, dest: bool = False) -> str:
    kind = rng.randrange(1 if dest else 0, 6)  # a real server cannot be IPv4-mapped
    if kind == 0:
        return f"::ffff:{rng.randrange(1, 224)}.{rng.randrange(256)}.0.{rng.randrange(1, 255)}"
    if kind == 1:
        return f"::{rng.randrange(1, 224)}.{rng.randrange(256)}.0.{rng.randrange(1, 255)}"
    if kind == 2:
        return f"2001:db8:{rng.randrange(3)}::{rng.randrange(1, 0xFFFF):x}"
    groups = [rng.choice([0, 0, 1, rng.randrange(0x10000)]) for _ in range(7)]
    return "fd00:" + ":".join(f"{g:x}" for g in groups)


def _mask(rng: random.Random) -> str:
    if rng.random() < 0.7:
        n = (0xFFFFFFFF << (32 - rng.randrange(0, 33))) & 0xFFFFFFFF
    else:
        n = rng.randrange(1 << 32)
    return ".".join(str((n >> s) & 255) for s in (24, 16, 8, 0))


def random_table(rng: random.Random, schedulers: list[str], n: int,
                 restorable: bool = False) -> Table:
    """n virtual services of every kind with 0..6 real servers each. restorable leaves out what
    ipvsadm -S itself cannot give back to ipvsadm -R (fwmarks >= 2^31, a bare "-b ")."""
    t = Table()
    while len(t.services) < n:
        kind = rng.choice(["t4", "t4", "u4", "s4", "t6", "u6", "s6", "f4", "f6"])
        six = kind.endswith("6")
        proto = kind[0]
        if proto == "f":
            hi = INT_MAX if restorable else 0xFFFFFFFF
            mark = rng.choice([rng.randrange(1, 5000), rng.randrange(1, hi + 1)])
            svc = ["-f", str(mark)] + (["-6"] if six else [])
            key: tuple[str, ...] = ("f", str(mark), kind)
        else:
            addr = _v6(rng) if six else _v4(rng, dest=False)
            port = rng.choice([0, 80, 443, 53, 8080, rng.randrange(1, 65536)])
            host = f"[{addr}]" if six else addr
            opt = {"t": "-t", "u": "-u", "s": "--sctp-service"}[proto]
            svc = [opt, f"{host}:{port}"]
            key = (proto, str(socket.inet_pton(socket.AF_INET6 if six else socket.AF_INET,
                                               addr)), str(port))
        if key in t.keys:
            continue
        t.keys.add(key)
        sched = rng.choice(schedulers)
        line = ["-A", *svc, "-s", sched]
        port0 = proto != "f" and svc[1].endswith(":0")
        if port0 or rng.random() < 0.35:
            line += ["-p", str(rng.choice([1, 300, 10800, 86400 * 31, rng.randrange(1, 99999)]))]
            if rng.random() < 0.5:
                line += ["-M", str(rng.randrange(1, 129)) if six else _mask(rng)]
        if proto in ("u", "f") and rng.random() < 0.3:
            line.append("-o")
        if proto == "u" and rng.random() < 0.2:
            line += ["--pe", "sip"]
        if rng.random() < 0.4:
            if sched in ("sh", "mh"):
                flags = [f"{sched}-fallback", f"{sched}-port"]
                if not restorable:
                    flags.append("flag-3")
            else:
                flags = ["flag-1", "flag-2", "flag-3"]
            chosen = [f for f in flags if rng.random() < 0.5] or flags[:1]
            line += ["-b", ",".join(chosen)]
        t.lines.append(" ".join(line))
        t.services.append(svc)
        t.lines += _dests(rng, svc, six, proto == "f")
    return t


def _dests(rng: random.Random, svc: list[str], six: bool, fwmark: bool) -> list[str]:
    lines, seen = [], set()
    for _ in range(rng.choice([0, 1, 2, 3, 4, 6])):
        fwd = rng.choice(["-m", "-m", "-g", "-i"])
        d6 = six if fwd != "-i" or rng.random() < 0.7 else not six
        addr = _v6(rng, dest=True) if d6 else _v4(rng, dest=True)
        port = rng.choice([80, 8080, 53, rng.randrange(1, 65536)])
        if fwd != "-m" and not fwmark:
            port = int(svc[1].rsplit(":", 1)[1])  # ipvsadm makes it the service's port
        if (addr, port) in seen:
            continue
        seen.add((addr, port))
        host = f"[{addr}]" if d6 else addr
        line = ["-a", *svc, "-r", f"{host}:{port}", fwd,
                "-w", str(rng.choice([0, 1, 1, 100, 65535, rng.randrange(INT_MAX)]))]
        if fwd == "-i":
            tun = rng.choice(["", "ipip", "gue", "gre"])
            if tun:
                line += ["--tun-type", tun]
            if tun == "gue":
                line += ["--tun-port", str(rng.randrange(1, 65536))]
                line += rng.choice([[], ["--tun-nocsum"], ["--tun-csum"], ["--tun-remcsum"]])
            if tun == "gre":
                line += rng.choice([[], ["--tun-nocsum"], ["--tun-csum"]])
        if rng.random() < 0.3:
            line += ["-x", str(rng.randrange(INT_MAX)), "-y", str(rng.randrange(1000))]
        lines.append(" ".join(line))
    return lines


def load(table: Table) -> None:
    rc, _, err = ipvsadm("-R", stdin=("\n".join(table.lines) + "\n").encode())
    assert (rc, err) == (0, b""), f"ipvsadm -R failed: {err.decode()}\n" + "\n".join(table.lines)


LIST_MODES = [
    ["-Ln"], ["-L", "-n", "--stats"], ["-Ln", "--rate"], ["-Ln", "--stats", "--exact"],
    ["-Ln", "--rate", "--exact"], ["-Ln", "--thresholds"], ["-Ln", "--persistent-conn"],
    ["-Ln", "--tun-info"], ["-Ln", "--nosort"], ["-Ln", "--stats", "--nosort"],
    ["-Ln", "--sort"], ["--list", "--numeric"], ["-l", "-n", "--exact"], ["-S", "-n"],
    ["-Sn"], ["--save", "--numeric"], ["-Ln", "--timeout"], ["--list", "--timeout"],
    ["-L"], ["-S"],  # names: each lookup of an unknown address costs ~10 ms in the lab
]
SPELLINGS = [["-l", "--stats"], ["--save"], ["-L", "-n", "--rate", "--stats"]]
ONE_MODES = [["-Ln"], ["-Ln", "--stats"], ["-Ln", "--rate", "--exact"], ["-Ln", "--thresholds"],
             ["-Ln", "--persistent-conn"], ["-Ln", "--tun-info"]]


def test_empty_table_every_mode(clean_ipvs: None) -> None:
    for mode in [*LIST_MODES, *SPELLINGS, ["-Lnc"], ["-Lc"], ["-Lnc", "--persistent-conn"]]:
        assert_same(*mode)
    for mode in (["-Ln", "-t", "10.1.2.3:80"], ["-L", "-u", "[fd00::1]:53"],
                 ["-Ln", "--sctp-service", "10.1.2.3:9"], ["-Ln", "-f", "1"],
                 ["-Ln", "-f", "1", "-6"], ["-Ln", "-f", "0"], ["-Ln", "-6"],
                 ["-Ln", "-t", "1234"], ["-Ln", "-n"], ["-Ln", "-c", "--timeout"],
                 ["-Ln", "--timeout", "--persistent-conn"], ["-Sn", "--stats"]):
        r = assert_same(*mode)
        assert r[0] != 0


@pytest.mark.parametrize("seed", [1, 2])
def test_random_tables_every_mode(clean_ipvs: None, schedulers: list[str], seed: int) -> None:
    rng = random.Random(seed)
    table = random_table(rng, schedulers, n=40)
    load(table)
    assert ipvsadm("-Ln")[1].count(b"\n") > 40
    for mode in LIST_MODES:
        assert_same(*mode)
    for svc in rng.sample(table.services, 6):
        for mode in ONE_MODES:
            assert_same(*mode, *svc)
    for missing in (["-t", "10.255.255.254:1"], ["-u", "[fd00::dead]:53"], ["-f", "123456789"],
                    ["--sctp-service", "10.255.255.254:2"], ["-f", "123456789", "-6"]):
        r = assert_same("-Ln", *missing)
        assert r == (1, b"", b"No such service\n")


def test_a_large_table_listed_in_two_processes(clean_ipvs: None, schedulers: list[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Above ipvs_dump.FORK_MIN virtual servers the plain -Ln listing reads real servers as
    listing rows, half of them in a forked child: still ipvsadm's text byte for byte (IPv6 and
    fwmark services, whose real servers go the object way, mixed in)."""
    from ipvsproxy.kernel import ipvs_dump

    load(random_table(random.Random(3), schedulers, n=ipvs_dump.FORK_MIN + 150))
    children: list[object] = []
    real = ipvs_dump.Child

    def spy(produce: Any) -> Any:
        children.append(produce)
        return real(produce)

    monkeypatch.setattr(ipvs_dump, "Child", spy)
    for mode in (["-Ln"], ["-Ln", "--nosort"], ["-Ln", "--exact"], ["--list", "--numeric"]):
        assert_same(*mode)
    assert len(children) == 4


def save_blocks(save: bytes) -> dict[str, list[str]]:
    """-S output as {"-A ..." line: its "-a ..." lines, sorted}: the order ipvsadm prints
    depends on the kernel's dump order (its comparator is not a total order), and a restored
    table is dumped in another order than the original."""
    blocks: dict[str, list[str]] = {}
    for line in save.decode().splitlines():
        if line.startswith("-A "):
            current = blocks.setdefault(line, [])
        else:
            current.append(line)
    return {k: sorted(v) for k, v in blocks.items()}


def test_save_is_restored_by_ipvsadm(clean_ipvs: None, schedulers: list[str]) -> None:
    table = random_table(random.Random(7), schedulers, n=50, restorable=True)
    load(table)
    before = assert_same("-S", "-n")
    rc, saved, _ = ours("-S", "-n")
    assert rc == 0 and saved == before[1]
    sh("ipvsadm -C")
    rc, _, err = ipvsadm("-R", stdin=saved)
    assert (rc, err) == (0, b"")
    after = assert_same("-S", "-n")
    assert save_blocks(after[1]) == save_blocks(before[1])
    assert_same("-Ln")
    assert_same("-Ln", "--nosort")


def test_quirks_that_ipvsadm_cannot_restore(clean_ipvs: None) -> None:
    for line in ("-A -f 4294967295 -s rr", "-A -f 2147483648 -6 -s wlc -p 5 -M 96",
                 "-A -f 7 -s sh -b flag-3", "-A -t 10.0.0.4:0 -s mh -b flag-3 -p 30",
                 "-a -f 7 -r 10.1.1.1:99 -i --tun-type gre --tun-csum"):
        sh(f"ipvsadm {line}")
    for mode in LIST_MODES:
        assert_same(*mode)
    assert_same("-Ln", "-f", "4294967295")
    assert_same("-Ln", "-f", "2147483648", "-6")


def test_timeouts(clean_ipvs: None) -> None:
    try:
        sh("ipvsadm --set 1000 61 299")
        assert assert_same("-L", "--timeout")[1] == b"Timeout (tcp tcpfin udp): 1000 61 299\n"
        assert_same("-Ln", "--timeout")
    finally:
        sh("ipvsadm --set 900 120 300")
    assert_same("--list", "--timeout")


# ---------------------------------------------------------------------------------------------
# Names without -n: /etc/hosts (the lab's /etc is a throwaway overlay) and /etc/services

HOSTS = {
    "10.66.0.1": "a-very-long-host-name-for-the-virtual-service.example.internal",
    "10.66.0.2": "backend-two",
    "10.66.0.3": "an-even-longer-backend-host-name-that-is-cut.example.internal",
    "fd66::1": "an-ipv6-virtual-service-with-a-long-name.cluster.example.internal",
    "fd66::2": "v6-backend",
}


@contextlib.contextmanager
def extra_hosts() -> Iterator[None]:
    with open("/etc/hosts") as f:
        saved = f.read()
    try:
        with open("/etc/hosts", "a") as f:
            f.write("".join(f"{a} {n}\n" for a, n in HOSTS.items()))
        yield
    finally:
        with open("/etc/hosts", "w") as f:
            f.write(saved)


def test_names_without_numeric(clean_ipvs: None) -> None:
    with extra_hosts():
        for line in ("-A -t 10.66.0.1:80 -s rr", "-a -t 10.66.0.1:80 -r 10.66.0.2:8080 -m",
                     "-a -t 10.66.0.1:80 -r 10.66.0.3:80 -g",
                     "-A -u 10.66.0.2:53 -s rr", "-a -u 10.66.0.2:53 -r 10.66.0.3:12345 -m",
                     "-A --sctp-service 10.66.0.2:5672 -s rr",
                     "-a --sctp-service 10.66.0.2:5672 -r 10.66.0.3:5672 -m",
                     "-A -t [fd66::1]:443 -s rr", "-a -t [fd66::1]:443 -r [fd66::2]:443 -m",
                     "-a -t [fd66::1]:443 -r 10.66.0.2:443 -i",
                     "-A -f 9 -s rr", "-a -f 9 -r 10.66.0.2:53 -m"):
            sh(f"ipvsadm {line}")
        for mode in (["-L"], ["-L", "--stats"], ["-L", "--rate"], ["-L", "--thresholds"],
                     ["-L", "--persistent-conn"], ["-L", "--tun-info"], ["-S"],
                     ["-L", "-t", "a-very-long-host-name-for-the-virtual-service."
                                  "example.internal:http"],
                     ["-L", "-u", "backend-two:domain"], ["-Ln", "-t", "backend-two:www"],
                     ["-L", "-t", "[fd66::1]:https"], ["-L", "-f", "9"]):
            assert_same(*mode)


# ---------------------------------------------------------------------------------------------
# Live traffic: counters, rates, connections

SERVER = """
import socket, socketserver, threading
class T(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            d = self.request.recv(4096)
            if not d:
                return
            self.request.sendall(d * 3)
class U(socketserver.BaseRequestHandler):
    def handle(self):
        data, sock = self.request
        sock.sendto(data * 2, self.client_address)
socketserver.ThreadingTCPServer.allow_reuse_address = True
tcp = socketserver.ThreadingTCPServer(("0.0.0.0", 8080), T)
udp = socketserver.ThreadingUDPServer(("0.0.0.0", 5353), U)
threading.Thread(target=udp.serve_forever, daemon=True).start()
tcp.serve_forever()
"""
BACKENDS = {"lsb1": "10.77.1", "lsb2": "10.77.2"}
VIP = "10.77.0.100"


@pytest.fixture
def backends(clean_ipvs: None) -> Iterator[list[str]]:
    """Two network namespaces, each a real server (TCP echo x3 on 8080, UDP x2 on 5353),
    routed through this namespace, which holds the VIP on a dummy link."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        sh(f"ip link add lsvip0 type dummy && ip link set lsvip0 up && "
           f"ip addr add {VIP}/32 dev lsvip0 && sysctl -qw net.ipv4.ip_forward=1")
        for ns, net in BACKENDS.items():
            veth = f"ls{ns}"
            sh(f"ip netns add {ns} && ip link add {veth} type veth peer name eth0 netns {ns} && "
               f"ip addr add {net}.1/24 dev {veth} && ip link set {veth} up && "
               f"ip -n {ns} addr add {net}.2/24 dev eth0 && ip -n {ns} link set eth0 up && "
               f"ip -n {ns} link set lo up && ip -n {ns} route add default via {net}.1")
            procs.append(subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c",
                                           SERVER]))
        for net in BACKENDS.values():
            _wait_listening(f"{net}.2", 8080)
        yield [f"{net}.2" for net in BACKENDS.values()]
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for ns in BACKENDS:
            sh(f"ip netns del {ns}", check=False)
        sh("ip link del lsvip0", check=False)


def _wait_listening(addr: str, port: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((addr, port), timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _tcp(port: int, n: int, size: int = 300) -> None:
    for _ in range(n):
        with socket.create_connection((VIP, port), timeout=5) as s:
            s.sendall(b"x" * size)
            got = 0
            while got < 3 * size:
                chunk = s.recv(65536)
                assert chunk
                got += len(chunk)


def _udp(port: int, n: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        for i in range(n):
            s.sendto(b"y" * (10 + i), (VIP, port))
            s.recvfrom(4096)


@contextlib.contextmanager
def background(work: Callable[[], None]) -> Iterator[None]:
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            work()
            time.sleep(0.05)

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join(timeout=30)


def ipvsadm_on_snapshot(snapshot: bytes, *args: str) -> Result:
    """ipvsadm reading a saved /proc/net/ip_vs_conn: in a private mount namespace whose /proc
    is a tmpfs holding just that file (ipvsadm reads nothing else from /proc)."""
    script = ('mount -t tmpfs none /proc && mkdir /proc/net && cat > /proc/net/ip_vs_conn && '
              'exec ipvsadm "$@"')
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
                        *args], input=snapshot, capture_output=True, check=False)
    return p.returncode, p.stdout, p.stderr


def test_live_traffic_stats_rates_and_connections(
        backends: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b1, b2 = backends
    for line in (f"-A -t {VIP}:80 -s rr", f"-a -t {VIP}:80 -r {b1}:8080 -m -w 3",
                 f"-a -t {VIP}:80 -r {b2}:8080 -m -w 1 -x 1000 -y 10",
                 f"-A -t {VIP}:81 -s sh -b sh-port -p 60",
                 f"-a -t {VIP}:81 -r {b1}:8080 -m", f"-a -t {VIP}:81 -r {b2}:8080 -m",
                 f"-A -u {VIP}:53 -s wlc", f"-a -u {VIP}:53 -r {b1}:5353 -m",
                 f"-a -u {VIP}:53 -r {b2}:5353 -m -w 2"):
        sh(f"ipvsadm {line}")

    # A few connections opened at once: their timers tick together, once a second, so
    # ipvsadm, ipvsproxy and ipvsadm again can all run between two ticks.
    with contextlib.ExitStack() as stack:
        for port in (80, 80, 80, 81):
            s = stack.enter_context(socket.create_connection((VIP, port), timeout=5))
            s.sendall(b"hello")
            s.recv(100)
        u = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        u.sendto(b"ping", (VIP, 53))
        conns = assert_same_bracketed("-Lnc")
        assert conns[1].count(b"ESTABLISHED") == 4, conns[1].decode()
        assert_same_bracketed("-Lc")
        assert_same_bracketed("-Lnc", "--persistent-conn")

    _tcp(80, 40)
    _tcp(81, 20, size=5000)
    _udp(53, 30)
    time.sleep(2.5)  # let the 2 s rate estimator run at least once

    # Traffic has stopped: counters hold still.
    stats = assert_same_bracketed("-Ln", "--stats")
    rows = {r[1]: r for r in (ln.split() for ln in stats[1].decode().splitlines()) if r}
    # 40 TCP connections (+3 above); 30 datagrams from one UDP socket are one connection.
    assert rows[f"{VIP}:80"][2] == "43" and rows[f"{VIP}:53"][3] == "31", stats[1].decode()
    for mode in (["-Ln", "--stats", "--exact"], ["-L", "--stats"], ["-Ln", "--persistent-conn"],
                 ["-Ln", "--thresholds"], ["-Ln"], ["-L"], ["-S", "-n"],
                 ["-Ln", "--stats", "-t", f"{VIP}:80"], ["-Ln", "--persistent-conn", "-t",
                                                         f"{VIP}:81"]):
        assert_same_bracketed(*mode)

    # Many connections in many states tick at different moments: compare on one snapshot of
    # the kernel's connection table, which ipvsadm and ipvsproxy both read.
    with open("/proc/net/ip_vs_conn", "rb") as f:
        snapshot = f.read()
    assert snapshot.count(b"\n") > 60
    snap = tmp_path / "ip_vs_conn"
    snap.write_bytes(snapshot)
    monkeypatch.setattr(ipvsadm_conn, "CONN_PROC_FILE", str(snap))  # ls reads it at run time
    for mode in (["-Lnc"], ["-Lc"], ["-Lnc", "--persistent-conn"], ["-l", "-c"]):
        want, got = ipvsadm_on_snapshot(snapshot, *mode), ours(*mode)
        assert got == want, f"{mode}\n== ipvsadm:\n{show(want)}\n== ipvsproxy ls:\n{show(got)}"
    assert want[1].count(b"\n") == snapshot.count(b"\n") + 1
    monkeypatch.undo()

    # Rates: the kernel recomputes them every 2 s; keep traffic flowing so they are not zero.
    with background(lambda: (_tcp(80, 3), _udp(53, 3), _tcp(81, 1))):
        time.sleep(4.5)
        for mode in (["-Ln", "--rate"], ["-Ln", "--rate", "--exact"], ["-L", "--rate"],
                     ["-Ln", "--rate", "-u", f"{VIP}:53"]):
            assert_same_bracketed(*mode)
        rate = assert_same_bracketed("-Ln", "--rate")
        rows = {r[1]: r for r in (ln.split() for ln in rate[1].decode().splitlines()) if r}
        assert rows[f"{VIP}:80"][5] != "0", rate[1].decode()  # InBPS
    time.sleep(2.5)  # decaying rates after the traffic stops
    assert_same_bracketed("-Ln", "--rate")


def test_the_installed_command_line(clean_ipvs: None) -> None:
    """Once through a fresh interpreter: `python -m ipvsproxy ls` (slow to start in the lab)."""
    sh("ipvsadm -A -t 10.96.0.1:443 -s rr && ipvsadm -a -t 10.96.0.1:443 -r 192.168.1.10:6443 "
       "-m && ipvsadm -A -f 3754 -s mh -b mh-fallback,mh-port")
    p = subprocess.run([sys.executable, "-m", "ipvsproxy", "ls", "-Ln"], capture_output=True,
                       check=False)
    assert (p.returncode, p.stdout, p.stderr) == ipvsadm("-Ln")


def test_the_script_through_a_pipe(clean_ipvs: None) -> None:
    """The `ipvsproxy` command: a listing larger than a pipe's buffer arrives whole through a
    pipe, and a reader that goes away after the first line ends it with 141 (128 + SIGPIPE)
    and nothing on stderr."""
    vips = [f"10.97.{i // 256}.{i % 256}:80" for i in range(300)]
    rules = "".join(f"-A -t {vip} -s rr\n"
                    + "".join(f"-a -t {vip} -r 10.244.{i % 200}.{j}:8080 -m\n" for j in range(10))
                    for i, vip in enumerate(vips))
    subprocess.run(["ipvsadm", "-R"], input=rules.encode(), check=True)
    script = Path(sys.executable).with_name("ipvsproxy")
    p = subprocess.run([script, "ls", "-Ln"], capture_output=True, check=False)
    assert len(p.stdout) > 128 << 10
    assert (p.returncode, p.stdout, p.stderr) == ipvsadm("-Ln")
    with subprocess.Popen([script, "ls", "-Ln"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()
        assert (proc.wait(timeout=120), first, proc.stderr.read()) == (
            141, p.stdout.splitlines(keepends=True)[0], b"")
