"""The scheduler models (the `scheduler` package) and `ipvsproxy explain` against the kernel's
own schedulers, with real TCP connections.

Pods are network namespaces on a bridge (integration/vm/pods.sh); port 7000 of each sends the
pod's name on accept and holds the connection until the client closes. The "client" namespace
gets 250 extra source addresses (10.77.0.0/16, routed back through it), and each connection is
bound to a chosen one. Both ends run in the test process itself (its sockets are made inside
the namespaces with setns): no Python process to start, which costs seconds under emulation.
Services are on 10.96.77.1, a local address of the node (a dummy link), created with
`ipvsadm -R` so the order in which real servers were added is known.

Each model gets the real servers as the kernel dumps them (kernel list order), so what is
compared is the scheduler, not our idea of the list.
"""

from __future__ import annotations

import ctypes
import errno
import json
import random
import selectors
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from ipvsproxy.core.explain import explain, model_dests
from ipvsproxy.core.ipvs import ObservedService, Protocol, ServiceKey
from ipvsproxy.kernel.ipvs import IpvsClient
from scheduler import AF_INET, AF_INET6, SVC_F_SCHED1, SVC_F_SCHED2, Conn, Dest, lc, mh, sh, wlc
from scheduler.rr import RrState
from scheduler.wrr import WrrState
from tests.kernel import forked
from tests.kernel.conftest import sh as shell

pytestmark = [pytest.mark.kernel, pytest.mark.lab_cost(60)]  # seconds, balances lab guests

PODS = [f"sch-pod{i}" for i in range(1, 6)]
POD_IP = {name: f"10.245.0.{11 + i}" for i, name in enumerate(PODS)}
POD_IP6 = {name: f"fd00:245::{11 + i}" for i, name in enumerate(PODS)}
IP_POD = {ip: name for m in (POD_IP, POD_IP6) for name, ip in m.items()}
CLIENT_NS = "sch-client"
VIP = "10.96.77.1"
VIP6 = "fd00:96::1"
NAME_PORT = 7000
N_CLIENTS = 250
# Deterministic, spread over a /16 (IPv4) or a /64 (IPv6): the hashes take the whole address.
CLIENTS = [str(IPv4Address("10.77.0.0") + n)
           for n in random.Random(6).sample(range(1, 65535), N_CLIENTS)]
CLIENTS6 = [str(IPv6Address("fd00:77::") + random.Random(n).getrandbits(64))
            for n in range(N_CLIENTS)]

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


@contextmanager
def netns(name: str) -> Iterator[None]:
    """Run the block with this thread in the named network namespace (sockets made inside stay
    in it; everything else about them works from anywhere)."""
    with open(f"/run/netns/{name}") as target, open("/proc/thread-self/ns/net") as home:
        if _libc.setns(target.fileno(), CLONE_NEWNET):
            raise OSError(ctypes.get_errno(), f"setns {name}")
        try:
            yield
        finally:
            if _libc.setns(home.fileno(), CLONE_NEWNET):  # pragma: no cover
                raise OSError(ctypes.get_errno(), "setns back")


class NameServers:
    """Port NAME_PORT of every pod: send the pod's name on accept, close when the client does.
    One thread serves them all (the listening sockets are made inside the pods' namespaces)."""

    def __init__(self, pods: Sequence[str], port: int = NAME_PORT) -> None:
        self.sel = selectors.DefaultSelector()
        for pod in pods:
            with netns(pod):
                srv = socket.socket(socket.AF_INET6)
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4 and IPv6
            srv.bind(("::", port))
            srv.listen(1024)
            srv.setblocking(False)
            self.sel.register(srv, selectors.EVENT_READ, (pod + "\n").encode())
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping:
            for key, _ in self.sel.select(0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if key.data:  # a listening socket: data is the name
                    try:
                        conn, _ = sock.accept()
                        conn.send(key.data)
                    except OSError:
                        continue
                    conn.setblocking(False)
                    self.sel.register(conn, selectors.EVENT_READ, b"")
                    continue
                try:
                    more = sock.recv(64)
                except OSError:
                    more = b""
                if not more:
                    self.sel.unregister(sock)
                    sock.close()

    def stop(self) -> None:
        self.stopping = True
        self.thread.join()
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]


@dataclass(frozen=True)
class Reached:
    pod: str | None  # None: the connection failed (err says how)
    sport: int
    err: str


class Client:
    """Connections from the client namespace: each socket is bound to a chosen source address;
    `width` connections at once (1: one after another, in order)."""

    def __init__(self, ns: str = CLIENT_NS, dst: str = VIP) -> None:
        self.ns = ns
        self.dst = dst
        self.held: dict[str, socket.socket] = {}

    def connect(self, srcs: Sequence[str], port: int, keep: bool = False, width: int = 1,
                dst: str | None = None) -> list[Reached]:
        out: list[Reached | None] = [None] * len(srcs)
        to = dst or self.dst
        family = socket.AF_INET6 if ":" in to else socket.AF_INET
        sel = selectors.DefaultSelector()
        todo = list(enumerate(srcs))[::-1]

        def finish(sock: socket.socket, i: int, src: str, name: str | None, err: str) -> None:
            sel.unregister(sock)
            out[i] = Reached(name, sock.getsockname()[1], err)
            if keep and name:
                self.held[f"{src}:{out[i].sport}"] = sock  # type: ignore[union-attr]
            else:
                sock.close()

        while todo or sel.get_map():
            while todo and len(sel.get_map()) < width:
                i, src = todo.pop()
                with netns(self.ns):
                    sock = socket.socket(family)
                sock.setblocking(False)
                sock.bind((src, 0))
                rc = sock.connect_ex((to, port))
                if rc not in (0, errno.EINPROGRESS):
                    out[i] = Reached(None, sock.getsockname()[1], errno.errorcode[rc])
                    sock.close()
                    continue
                sel.register(sock, selectors.EVENT_WRITE, [i, src, b"", time.monotonic()])
            for key, _ in sel.select(0.5):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                sock = ready
                i, src, got, _t = key.data
                if key.events & selectors.EVENT_WRITE:
                    rc = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if rc:
                        finish(sock, i, src, None, errno.errorcode.get(rc, str(rc)))
                    else:
                        sel.modify(sock, selectors.EVENT_READ, key.data)
                    continue
                try:
                    chunk = sock.recv(64)
                except OSError as exc:
                    finish(sock, i, src, None, errno.errorcode.get(exc.errno or 0, str(exc)))
                    continue
                key.data[2] = got = got + chunk
                if not chunk or got.endswith(b"\n"):
                    finish(sock, i, src, got.decode().strip() or None, "" if chunk else "EOF")
            now = time.monotonic()
            for key in list(sel.get_map().values()):
                if now - key.data[3] > 5:
                    finish(key.fileobj, key.data[0], key.data[1], None,  # type: ignore[arg-type]
                           "timeout")
        sel.close()
        assert all(r is not None for r in out)
        return out  # type: ignore[return-value]

    def close(self, keys: Sequence[str]) -> None:
        """Close held connections, given as "src:sport"."""
        for key in keys:
            self.held.pop(key).close()

    def stop(self) -> None:
        self.close(list(self.held))


def ip_batch(lines: Sequence[str], ns: str | None = None) -> None:
    """`ip -batch`: many changes for the price of one process (seconds each under emulation)."""
    cmd = ["ip", *(["-n", ns] if ns else []), "-batch", "-"]
    p = subprocess.run(cmd, input="\n".join(lines) + "\n", text=True, capture_output=True,
                       check=False)
    assert p.returncode == 0, f"{' '.join(cmd)}: {p.stderr}"


def topology_up() -> None:
    """Pods on a bridge (sch-br0, 10.245.0.1/24 and fd00:245::1/64), the client namespace on a
    veth (sch-ext, 192.168.77.1/24 and fd00:168::1/64) with its 2 x 250 source addresses routed
    back through it, and the service addresses on a dummy link."""
    root = [f"netns add {ns}" for ns in [*PODS, CLIENT_NS]]
    root += ["link add sch-br0 type bridge", "addr add 10.245.0.1/24 dev sch-br0",
             "addr add fd00:245::1/64 dev sch-br0 nodad", "link set sch-br0 up"]
    for i, pod in enumerate(PODS):
        root += [f"link add sch-v{i} type veth peer name eth0 netns {pod}",
                 f"link set sch-v{i} master sch-br0 up"]
    root += [f"link add sch-ext type veth peer name eth0 netns {CLIENT_NS}",
             "addr add 192.168.77.1/24 dev sch-ext", "addr add fd00:168::1/64 dev sch-ext nodad",
             "link set sch-ext up",
             "link add sch-vip type dummy", "link set sch-vip up",
             f"addr add {VIP}/32 dev sch-vip", f"addr add {VIP6}/128 dev sch-vip nodad",
             "route add 10.77.0.0/16 via 192.168.77.2", "route add fd00:77::/64 via fd00:168::2"]
    ip_batch(root)
    for pod in PODS:
        ip_batch([f"addr add {POD_IP[pod]}/24 dev eth0",
                  f"addr add {POD_IP6[pod]}/64 dev eth0 nodad", "link set lo up",
                  "link set eth0 up", "route add default via 10.245.0.1",
                  "route add ::/0 via fd00:245::1"], pod)
    ip_batch(["addr add 192.168.77.2/24 dev eth0", "addr add fd00:168::2/64 dev eth0 nodad",
              "link set lo up", "link set eth0 up", "route add default via 192.168.77.1",
              "route add ::/0 via fd00:168::1",
              *(f"addr add {a}/32 dev eth0" for a in CLIENTS),
              *(f"addr add {a}/128 dev eth0 nodad" for a in CLIENTS6)], CLIENT_NS)


def topology_down() -> None:
    subprocess.run(["ip", "-force", "-batch", "-"], text=True, capture_output=True, check=False,
                   input="".join(f"netns del {ns}\n" for ns in [*PODS, CLIENT_NS])
                   + "link del sch-br0\nlink del sch-vip\n")


FORWARDING = ("/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding")


@pytest.fixture(scope="module")
def client(ipvs_modules: None) -> Iterator[Client]:
    shell("ipvsadm -C")
    topology_down()  # leftovers of an interrupted run
    saved = [Path(f).read_text() for f in FORWARDING]
    for f in FORWARDING:
        Path(f).write_text("1\n")
    servers = c = None
    try:
        topology_up()
        servers = NameServers(PODS)
        c = Client()
        yield c
    finally:
        if c is not None:
            c.stop()
        if servers is not None:
            servers.stop()
        shell("ipvsadm -C", check=False)
        topology_down()
        for f, value in zip(FORWARDING, saved, strict=True):
            Path(f).write_text(value)


def create(port: int, scheduler: str, weights: Sequence[int], flags: str = "",
           extra: str = "", v6: bool = False) -> list[str]:
    """A new TCP service on VIP:port (VIP6 with v6); real servers pod1.. added in order with
    these weights (masquerading). Returns the pods in the order they were added."""
    pods = PODS[:len(weights)]
    opts = f" -b {flags}" if flags else ""
    vip = f"[{VIP6}]" if v6 else VIP
    rules = [f"-A -t {vip}:{port} -s {scheduler}{opts}{extra}"]
    rules += [f"-a -t {vip}:{port} -r {f'[{POD_IP6[p]}]' if v6 else POD_IP[p]}:{NAME_PORT} "
              f"-m -w {w}" for p, w in zip(pods, weights, strict=True)]
    subprocess.run(["ipvsadm", "-R"], input="\n".join(rules) + "\n", text=True, check=True)
    return pods


def observe(port: int, v6: bool = False) -> ObservedService:
    with IpvsClient() as ipvs:
        observed = ipvs.get_service(ServiceKey.inet(Protocol.TCP, ip_address(VIP6 if v6 else VIP),
                                                    port))
    assert observed is not None
    return observed


def kernel_dests(port: int, v6: bool = False) -> list[Dest]:
    return model_dests(observe(port, v6).dests)[0]


def pod_of(dest: Dest | None) -> str | None:
    return None if dest is None else IP_POD[str(dest.addr)]


def compare(predicted: list[str | None], reached: list[Reached], what: str) -> None:
    """Every connection reached the predicted pod (None: the kernel refused it)."""
    wrong = [(i, want, got) for i, (want, got) in enumerate(zip(predicted, reached, strict=True))
             if want != got.pod]
    assert not wrong, (f"{what}: {len(wrong)} of {len(reached)} connections differ from the "
                       f"model (client, predicted, reached): {wrong[:10]}")


# ------------------------------------------------------------------------------------ sh, mh

class HashCase(NamedTuple):
    name: str
    scheduler: str
    flags: str
    weights: list[int]  # of pod1, pod2 ... in the order they are added
    quiesce: str | None = None  # a pod whose weight is then set to 0
    v6: bool = False


HASH_CASES = [
    HashCase("sh-equal", "sh", "", [1, 1, 1, 1, 1]),
    HashCase("sh-weighted-zero", "sh", "", [3, 1, 0, 2, 5]),
    HashCase("sh-fallback", "sh", "sh-fallback", [3, 1, 0, 2, 5]),
    HashCase("sh-port", "sh", "sh-port", [1, 2, 1, 1, 3]),
    HashCase("sh-port-fallback", "sh", "sh-fallback,sh-port", [2, 0, 1, 1, 0]),
    HashCase("sh-ipv6-port", "sh", "sh-port", [1, 2, 0, 1, 3], v6=True),
    HashCase("mh-weighted-zero", "mh", "", [3, 1, 0, 2, 5]),
    HashCase("mh-fallback-port", "mh", "mh-fallback,mh-port", [3, 1, 0, 2, 5]),
    HashCase("mh-quiesced", "mh", "", [2, 3, 1, 1, 2], "sch-pod2"),
    HashCase("mh-quiesced-fallback", "mh", "mh-fallback", [2, 3, 1, 1, 2], "sch-pod2"),
    HashCase("mh-ipv6-quiesced", "mh", "", [2, 3, 1, 1, 2], "sch-pod2", v6=True),
]


@pytest.mark.parametrize("case", HASH_CASES, ids=[c.name for c in HASH_CASES])
def test_hashing_schedulers_match_the_model_for_every_client(client: Client,
                                                             case: HashCase) -> None:
    scheduler, flags, weights, quiesce, v6 = case[1:]
    port = 7100 + HASH_CASES.index(case)
    added = create(port, scheduler, weights, flags, v6=v6)
    vip, pod_ip, srcs = (f"[{VIP6}]", POD_IP6, CLIENTS6) if v6 else (VIP, POD_IP, CLIENTS)
    last_weight = {}
    if quiesce:  # weight to 0 after a positive one: mh keeps its last_weight
        rs = f"[{pod_ip[quiesce]}]" if v6 else pod_ip[quiesce]
        shell(f"ipvsadm -e -t {vip}:{port} -r {rs}:{NAME_PORT} -m -w 0")
        last_weight[ip_address(pod_ip[quiesce])] = weights[added.index(quiesce)]
    dests = kernel_dests(port, v6)
    assert [pod_of(d) for d in dests] == added[::-1]  # newest first: list_add_rcu at the head
    dests = [Dest(d.addr, d.port, d.weight, overloaded=d.overloaded,
                  last_weight=last_weight.get(d.addr)) for d in dests]
    reached = client.connect(srcs, port, width=32, dst=VIP6 if v6 else VIP)
    bits = (SVC_F_SCHED1 if "fallback" in flags else 0) | (SVC_F_SCHED2 if "port" in flags else 0)
    af = AF_INET6 if v6 else AF_INET
    table = sh.build_table(dests) if scheduler == "sh" else mh.build_table(dests, af)
    predicted = []
    entries_unusable = 0
    for src, got in zip(srcs, reached, strict=True):
        conn = Conn(ip_address(src), got.sport)
        if scheduler == "sh":
            pick: Any = sh.schedule(dests, conn, sh_port=bool(bits & SVC_F_SCHED2),
                                    sh_fallback=bool(bits & SVC_F_SCHED1), af=af, table=table)
        else:
            pick = mh.schedule(dests, conn, mh_port=bool(bits & SVC_F_SCHED2),
                               mh_fallback=bool(bits & SVC_F_SCHED1), af=af, table=table)
        entries_unusable += pick.entry is not None and pick.entry.weight == 0
        predicted.append(pod_of(pick.dest))
    compare(predicted, reached, case.name)
    # the cases exercise what they say
    assert len({p for p in predicted if p}) == sum(1 for w in weights if w) - bool(quiesce)
    refused = sum(r.pod is None for r in reached)
    assert refused == (0 if "fallback" in flags else entries_unusable)
    assert all(r.err == "ECONNREFUSED" for r in reached if r.pod is None)
    # sh gives a weight-0 server a bucket per round; mh gives a server no table entry unless
    # its last non-zero weight was positive (quiesced)
    if (scheduler == "sh" and 0 in weights) or quiesce:
        assert entries_unusable > 0
    else:
        assert entries_unusable == 0


# ------------------------------------------------------------------------------------ rr, wrr

ROTATION_CASES = [
    ("rr", "rr", [1, 1, 0, 1, 1]),
    ("wrr", "wrr", [4, 6, 2, 0, 3]),
    ("wrr-gcd", "wrr", [6, 4, 2, 8]),
]


@pytest.mark.parametrize("case", ROTATION_CASES, ids=[c[0] for c in ROTATION_CASES])
def test_rotation_of_a_fresh_service_follows_the_model(
        client: Client, case: tuple[str, str, list[int]]) -> None:
    name, scheduler, weights = case
    port = 7200 + ROTATION_CASES.index(case)
    added = create(port, scheduler, weights)
    dests = [Dest(IPv4Address(POD_IP[p]), NAME_PORT, w) for p, w in zip(added, weights,
                                                                          strict=True)]
    state: RrState | WrrState = (RrState.fresh(dests) if scheduler == "rr"
                                 else WrrState.fresh(dests))
    predicted = [pod_of(d) for d in state.sequence(100)]
    ans = explain(observe(port), Conn(IPv4Address(CLIENTS[0])))
    # successive connections, from a few source addresses (rr and wrr do not look at them)
    reached = client.connect([CLIENTS[i % 4] for i in range(100)], port)
    compare(predicted, reached, name)
    if scheduler == "rr":  # explain assumes a fresh rr position: right on a fresh service
        upcoming = getattr(ans.pick, "upcoming", ())
        assert [pod_of(d) for d in upcoming] == predicted[:len(upcoming)]


# ------------------------------------------------------------------------------------ lc, wlc


def settle(port: int, want_active: int) -> ObservedService:
    """The service as the kernel reports it once the active count is what the test expects (a
    closed connection leaves ESTABLISHED when the client's FIN goes through)."""
    for _ in range(100):
        observed = observe(port)
        if sum(d.active_conns for d in observed.dests) == want_active:
            return observed
        time.sleep(0.05)
    raise AssertionError(f"active connections never reached {want_active}: {observed}")


@pytest.mark.parametrize("scheduler,weights", [("lc", [1, 1, 0, 1, 1]),
                                               ("wlc", [1, 3, 2, 0, 1])])
def test_least_connection_follows_the_model_with_connections_held(
        client: Client, scheduler: str, weights: list[int]) -> None:
    port = 7300 + (scheduler == "wlc")
    create(port, scheduler, weights)
    model = lc if scheduler == "lc" else wlc
    rng = random.Random(scheduler)
    held: list[str] = []
    reached = set()
    for step in range(24):
        if held and step % 4 == 3:  # close one held connection: active -> inactive
            client.close([held.pop(rng.randrange(len(held)))])
        observed = settle(port, len(held))
        pick = model.schedule(model_dests(observed.dests)[0])
        said = explain(observed, Conn(IPv4Address(CLIENTS[step]))).real_server
        (got,) = client.connect([CLIENTS[step]], port, keep=True)
        assert got.pod == pod_of(pick.dest) == pod_of(said), (
            f"step {step}: model {pick.reason}; kernel sent it to {got.pod}")
        held.append(f"{CLIENTS[step]}:{got.sport}")
        reached.add(got.pod)
    # every server of positive weight took connections
    assert len(reached) == sum(1 for w in weights if w)
    client.close(held)


# ------------------------------------------------------------------------------------ explain


def explain_cli(port: int, src: str, sport: int) -> dict[str, Any]:
    p = forked.run(["explain", "-t", f"{VIP}:{port}", "--client", f"{src}:{sport}", "-o",
                    "json"])
    assert p.returncode == 0, p.stdout + p.stderr
    out: dict[str, Any] = json.loads(p.stdout)
    return out


@pytest.mark.parametrize("scheduler,flags", [("sh", "sh-port"), ("mh", "mh-port")])
def test_explain_agrees_with_the_pod_reached(client: Client, scheduler: str, flags: str) -> None:
    port = 7400 + (scheduler == "mh")
    create(port, scheduler, [2, 1, 0, 1, 3], flags)
    srcs = CLIENTS[:50]
    reached = client.connect(srcs, port, width=32)
    observed = observe(port)
    for src, got in zip(srcs, reached, strict=True):
        answer = explain(observed, Conn(IPv4Address(src), got.sport)).to_json()
        want = None if got.pod is None else f"{POD_IP[got.pod]}:{NAME_PORT}"
        assert answer["real_server"] == want, (src, got, answer)
    if scheduler == "sh":  # the weight-0 server's buckets: explain says null, the kernel refuses
        assert any(r.pod is None for r in reached)
    # the command itself (a Python process costs seconds under emulation: one is enough), for
    # a client that reached a pod
    src, got = next((s, r) for s, r in zip(srcs, reached, strict=True) if r.pod)
    out = explain_cli(port, src, got.sport)
    assert out["scheduler"] == scheduler and flags in out["flags"]
    assert out["real_server"] == f"{POD_IP[str(got.pod)]}:{NAME_PORT}"
    assert out["reason"]


def test_explain_persistence_template_wins(client: Client) -> None:
    port = 7410
    create(port, "rr", [1, 1, 1], extra=" -p 300")
    src = CLIENTS[0]
    (first,) = client.connect([src], port)
    assert first.pod is not None
    out = explain_cli(port, src, 0)
    assert out["real_server"] == f"{POD_IP[first.pod]}:{NAME_PORT}"
    assert out["template"]["client_network"] == src
    assert "template" in out["reason"]
    # and the kernel agrees: the next connections from that client go there too
    assert {r.pod for r in client.connect([src] * 3, port)} == {first.pod}
    # a client without a template: the scheduler decides, and the output says so
    observed = observe(port)
    with open("/proc/net/ip_vs_conn") as f:
        table = f.read()
    other = explain(observed, Conn(IPv4Address(CLIENTS[1])), table).to_json()
    assert other["template"] is None and "no persistence template" in str(other["reason"])
    same = explain(observed, Conn(IPv4Address(src)), table).to_json()
    assert same["real_server"] == out["real_server"]
