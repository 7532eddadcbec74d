"""The IPVS kernel layer against a real kernel, with ipvsadm as the oracle.

- rule sets applied through IpvsClient are exactly what `ipvsadm -Sn` shows;
- rule sets loaded with `ipvsadm -R` are exactly what IpvsClient.dump() returns;
- a batch with failing operations reports exactly those, and applies the rest;
- edits, deletes, timeouts, info, zero and flush.
"""

from __future__ import annotations

import errno
import random
import subprocess
from ipaddress import IPv4Address, IPv6Address, ip_address

import pytest

from ipvsproxy.core.ipvs import (
    AF_INET,
    AF_INET6,
    DestKey,
    Fwd,
    IpvsOp,
    OpKind,
    Protocol,
    RealServer,
    ServiceKey,
    Timeouts,
    VirtualServer,
)
from ipvsproxy.kernel.ipvs import IpvsClient
from ipvsproxy.kernel.ipvs_codec import iter_messages
from tests.kernel.conftest import sh

pytestmark = [pytest.mark.kernel, pytest.mark.lab_cost(25)]  # seconds, balances lab guests

SCHEDULERS = ["rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf",
              "mh"]  # Debian's 6.1 kernel does not build ip_vs_twos
FLAG_NAMES = {"sh-fallback": 0x8, "mh-fallback": 0x8, "flag-1": 0x8, "sh-port": 0x10,
              "mh-port": 0x10, "flag-2": 0x10, "flag-3": 0x20}
PROTO_OPT = {"-t": Protocol.TCP, "-u": Protocol.UDP, "--sctp-service": Protocol.SCTP}
FWD_OPT = {"-m": Fwd.MASQ, "-g": Fwd.ROUTE, "-i": Fwd.TUNNEL}

Rules = dict[ServiceKey, tuple[VirtualServer, dict[DestKey, RealServer]]]


def _hostport(text: str) -> tuple[IPv4Address | IPv6Address, int]:
    host, _, port = text.rpartition(":")
    return ip_address(host.strip("[]")), int(port)


def parse_save(text: str) -> Rules:
    """Read `ipvsadm -Sn` output into the same values the kernel layer speaks."""
    rules: Rules = {}
    for line in text.splitlines():
        tok = line.split()
        if not tok:
            continue
        opts: dict[str, str] = {}
        i = 1
        while i < len(tok):
            if tok[i] in ("-6", "-o", "-m", "-g", "-i"):
                opts[tok[i]] = ""
                i += 1
            else:
                opts[tok[i]] = tok[i + 1]
                i += 2
        if "-f" in opts:
            key = ServiceKey.mark(int(opts["-f"]), AF_INET6 if "-6" in opts else 2)
        else:
            (flag,) = [f for f in PROTO_OPT if f in opts]
            addr, port = _hostport(opts[flag])
            key = ServiceKey.inet(PROTO_OPT[flag], addr, port)
        if tok[0] == "-A":
            flags = 0
            for name in filter(None, opts.get("-b", "").split(",")):
                flags |= FLAG_NAMES[name]
            netmask = -1
            if "-p" in opts:
                flags |= 0x1
                if "-M" in opts:
                    m = opts["-M"]
                    netmask = int(m) if key.af == AF_INET6 else int(IPv4Address(m))
            if "-o" in opts:
                flags |= 0x4
            vs = VirtualServer(key, opts["-s"], flags, int(opts.get("-p", 0)), netmask,
                               opts.get("--pe", ""))
            rules[key] = (_norm(vs), {})
        else:
            addr, port = _hostport(opts["-r"])
            (fwd,) = [FWD_OPT[f] for f in FWD_OPT if f in opts]
            rs = RealServer(DestKey(addr, port), fwd, int(opts["-w"]), int(opts.get("-x", 0)),
                            int(opts.get("-y", 0)))
            rules[key][1][rs.key] = rs
    return rules


def parse_thresholds(text: str) -> dict[tuple[str, DestKey], tuple[int, int]]:
    """Read `ipvsadm -Ln --thresholds`: (service, dest) -> (upper, lower)."""
    out: dict[tuple[str, DestKey], tuple[int, int]] = {}
    svc = ""
    for line in text.splitlines()[3:]:
        tok = line.split()
        if tok[0] != "->":
            svc = " ".join(tok[:2])
            continue
        addr, port = _hostport(tok[1])
        out[(svc, DestKey(addr, port))] = (int(tok[2]), int(tok[3]))
    return out


def with_thresholds(rules: Rules, text: str) -> Rules:
    """The -Sn parse plus the thresholds that only the listing shows."""
    th = parse_thresholds(text)
    out: Rules = {}
    for key, (vs, dests) in rules.items():
        k = vs.key
        svc = (f"FWM {k.fwmark}" if k.fwmark
               else f"{k.protocol.name} {_fmt_host(k.addr, k.port)}")  # type: ignore[arg-type]
        out[key] = (vs, {dk: rs._replace(u_threshold=th[(svc, dk)][0],
                                         l_threshold=th[(svc, dk)][1]) for dk, rs in dests.items()})
    return out


def _norm(vs: VirtualServer) -> VirtualServer:
    """Persistence netmask only means something with persistence; ipvsadm omits it otherwise."""
    persistent = vs.flags & 0x1
    full = 128 if vs.key.af == AF_INET6 else 0xFFFFFFFF
    nm = vs.effective_netmask if persistent else full
    return VirtualServer(vs.key, vs.scheduler, vs.flags, vs.timeout if persistent else 0,
                         nm, vs.pe_name)


def random_rules(rng: random.Random, n_services: int, max_dests: int) -> Rules:
    rules: Rules = {}
    while len(rules) < n_services:
        six = rng.random() < 0.3
        if rng.random() < 0.1:
            key = ServiceKey.mark(rng.randint(1, 2**31), AF_INET6 if six else 2)
        else:
            addr: IPv4Address | IPv6Address = (
                IPv6Address(rng.getrandbits(120) | (0xFD << 120)) if six
                else IPv4Address(rng.randint(0x0A000001, 0x0AFFFFFE)))
            key = ServiceKey.inet(rng.choice(list(PROTO_OPT.values())), addr,
                                  rng.randint(1, 65535))
        sched = rng.choice(SCHEDULERS)
        flags = 0
        if sched in ("sh", "mh"):
            flags |= rng.choice([0, 0x8, 0x10, 0x18])
        timeout, netmask = 0, -1
        if rng.random() < 0.3:
            flags |= 0x1
            timeout = rng.randint(1, 86400)
            if rng.random() < 0.5:
                netmask = (rng.randint(8, 128) if six
                           else (0xFFFFFFFF << rng.randint(0, 24)) & 0xFFFFFFFF)
        if key.protocol == Protocol.UDP and rng.random() < 0.3:
            flags |= 0x4
        vs = VirtualServer(key, sched, flags, timeout, netmask)
        dests: dict[DestKey, RealServer] = {}
        for _ in range(rng.randint(0, max_dests)):
            dk = DestKey(IPv6Address(rng.getrandbits(112) | (0xFD01 << 112)) if six
                         else IPv4Address(rng.randint(0x0AF40001, 0x0AF4FFFE)),
                         0 if key.fwmark else rng.randint(1, 65535))
            fwd = rng.choice([Fwd.MASQ, Fwd.MASQ, Fwd.ROUTE, Fwd.TUNNEL])
            if key.fwmark:
                fwd = rng.choice([Fwd.ROUTE, Fwd.TUNNEL])  # NAT needs a port
            if fwd != Fwd.MASQ:  # ipvsadm gives non-NAT real servers the service's port
                dk = DestKey(dk.addr, key.port)
            # the kernel refuses a lower threshold above the upper one (ERANGE)
            upper = rng.choice([0, rng.randint(1, 10**6)])
            lower = rng.choice([0, rng.randint(0, upper)])
            dests[dk] = RealServer(dk, fwd, rng.randint(0, 65535), upper, lower)
        rules[key] = (_norm(vs), dests)
    return rules


def ops_for(rules: Rules) -> list[IpvsOp]:
    ops = []
    for vs, dests in rules.values():
        ops.append(IpvsOp(OpKind.ADD_SERVICE, service=vs))
        ops.extend(IpvsOp(OpKind.ADD_DEST, service=vs, dest=rs) for rs in dests.values())
    return ops


def _fmt_host(a: IPv4Address | IPv6Address, port: int) -> str:
    return f"[{a}]:{port}" if a.version == 6 else f"{a}:{port}"


def restore_text(rules: Rules) -> str:
    """ipvsadm -R input for the rules (written here independently of ipvsproxy's renderer)."""
    lines = []
    fl = {0x8: "flag-1", 0x10: "flag-2", 0x20: "flag-3"}
    for vs, dests in rules.values():
        k = vs.key
        sel = (f"-f {k.fwmark}" + (" -6" if k.af == AF_INET6 else "") if k.fwmark else
               f"{ {v: f for f, v in PROTO_OPT.items()}[k.protocol]} {_fmt_host(k.addr, k.port)}")  # type: ignore[arg-type]
        line = f"-A {sel} -s {vs.scheduler}"
        bflags = [fl[b] for b in (0x8, 0x10, 0x20) if vs.flags & b]
        if bflags:
            line += " -b " + ",".join(bflags)
        if vs.flags & 0x1:
            line += f" -p {vs.timeout}"
            nm = vs.effective_netmask
            line += f" -M {nm if k.af == AF_INET6 else IPv4Address(nm)}"
        if vs.flags & 0x4:
            line += " -o"
        lines.append(line)
        for rs in dests.values():
            f = {Fwd.MASQ: "-m", Fwd.ROUTE: "-g", Fwd.TUNNEL: "-i"}[rs.fwd]
            lines.append(f"-a {sel} -r {_fmt_host(rs.key.addr, rs.key.port)} {f} -w {rs.weight}"
                         f" -x {rs.u_threshold} -y {rs.l_threshold}")
    return "\n".join(lines) + "\n"


def flat(rules: Rules) -> set[str]:
    out = set()
    for vs, dests in rules.values():
        out.add(repr(vs))
        out.update(f"{vs.key} -> {rs!r}" for rs in dests.values())
    return out


def assert_same(got: Rules, want: Rules) -> None:
    g, w = flat(got), flat(want)
    assert not (g - w) and not (w - g), (
        "only in got:\n" + "\n".join(sorted(g - w))
        + "\nonly in want:\n" + "\n".join(sorted(w - g)))


def observed_rules(client: IpvsClient) -> Rules:
    return {o.service.key: (_norm(o.service), {d.dest.key: d.dest for d in o.dests})
            for o in client.dump()}


@pytest.mark.parametrize("seed", [1, 2])
def test_applied_rules_are_what_ipvsadm_shows(clean_ipvs: None, seed: int) -> None:
    rules = random_rules(random.Random(seed), 80, 6)
    with IpvsClient() as client:
        failures = client.apply(ops_for(rules))
    assert failures == []
    assert_same(with_thresholds(parse_save(sh("ipvsadm -Sn")), sh("ipvsadm -Ln --thresholds")),
                rules)


@pytest.mark.parametrize("seed", [4, 5])
def test_ipvsadm_restored_rules_are_what_observe_returns(clean_ipvs: None, seed: int) -> None:
    rules = random_rules(random.Random(seed), 80, 6)
    subprocess.run(["ipvsadm", "-R"], input=restore_text(rules), text=True, check=True)
    with IpvsClient() as client:
        assert_same(observed_rules(client), rules)
        # one service at a time too
        key = next(iter(rules))
        one = client.get_service(key)
        assert one is not None and _norm(one.service) == rules[key][0]
        missing = ServiceKey.inet(Protocol.TCP, IPv4Address("192.0.2.1"), 1)
        assert client.get_service(missing) is None


def test_a_dump_read_by_a_child_process_is_the_dump_read_here(
        clean_ipvs: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above FORK_MIN services a dump's real servers are read by a forked child (ipvs_dump);
    the result is what this process reads itself, and what was restored."""
    from ipvsproxy.kernel import ipvs_dump

    rules = random_rules(random.Random(7), ipvs_dump.FORK_MIN + 300, 6)
    subprocess.run(["ipvsadm", "-R"], input=restore_text(rules), text=True, check=True)
    readers: list[str] = []
    for name in ("forked", "in_process"):
        real = getattr(ipvs_dump, name)
        monkeypatch.setattr(ipvs_dump, name,
                            lambda *a, _n=name, _f=real: (readers.append(_n), _f(*a))[1])
    with IpvsClient() as client:
        forked = client.dump()
        assert readers == ["forked"]
        monkeypatch.setattr(ipvs_dump, "FORK_MIN", 10**9)
        here = client.dump()
        assert readers == ["forked", "in_process"]
    assert forked == here
    assert_same({o.service.key: (_norm(o.service), {d.dest.key: d.dest for d in o.dests})
                 for o in forked}, rules)


def test_a_full_sync_read_settles_what_equals_the_desired(clean_ipvs: None) -> None:
    """dump(share=...), a full sync's read. A virtual server whose real servers are exactly the
    desired ones, in the order the kernel lists them (the reverse of the order they were added:
    ip_vs_ctl.c puts a new one at the head), reads as_desired with none of them held
    (DumpDecoder.many_settled, compared as words); one whose real servers differ in a value, or
    come in another order, is read in full and holds the desired objects where they are all
    equal (shared_dests). Apart from that the read equals one without sharing."""
    rules = random_rules(random.Random(8), 60, 6)
    want = {k: tuple(d.values()) for k, (_, d) in rules.items()}
    v4 = [k for k, w in want.items() if len(w) >= 2 and k.af == AF_INET]
    odd, flipped = v4[0], v4[1]
    want[odd] = (want[odd][0]._replace(weight=want[odd][0].weight + 1), *want[odd][1:])
    want[flipped] = want[flipped][::-1]  # the kernel lists it in this order, not reversed
    with IpvsClient() as client:
        assert client.apply(ops_for(rules)) == []
        plain = {o.service.key: o for o in client.dump(stats=False)}  # (its layouts learned)
        shared = client.dump(stats=False, share=want)
    assert plain.keys() == {o.service.key for o in shared}
    settled = 0
    for o in shared:
        p, w = plain[o.service.key], want[o.service.key]
        assert o.service == p.service and o.stats == p.stats
        got = [d.dest for d in p.dests]
        if o.as_desired:
            assert o.dests == () and got == list(reversed(w))
            settled += 1
            continue
        assert o.dests == p.dests
        # only what differs, or what many_settled does not read (IPv6 real servers)
        assert got != list(reversed(w)) or o.service.key.af == AF_INET6 or any(
            d.dest.key.addr.version == 6 for d in p.dests)
        if o.service.key == flipped:
            assert all(d.dest is r for d, r in zip(o.dests, w, strict=True))
        if o.service.key == odd:
            assert not any(d.dest is r for d in o.dests for r in w)
    assert settled >= 25


def test_partial_failure_reports_exactly_the_failed_ops(clean_ipvs: None) -> None:
    a = VirtualServer(ServiceKey.inet(Protocol.TCP, IPv4Address("10.96.0.1"), 443), "rr")
    b = VirtualServer(ServiceKey.inet(Protocol.UDP, IPv4Address("10.96.0.10"), 53), "wrr")
    ghost = VirtualServer(ServiceKey.inet(Protocol.TCP, IPv4Address("10.96.9.9"), 80), "rr")
    bad_sched = VirtualServer(ServiceKey.inet(Protocol.TCP, IPv4Address("10.96.0.2"), 80),
                              "nosuchsched")  # > 15 chars would fail the policy (EINVAL)
    rs1 = RealServer(DestKey(IPv4Address("10.244.0.5"), 6443))
    rs2 = RealServer(DestKey(IPv4Address("10.244.0.6"), 53), weight=3)
    ops = [
        IpvsOp(OpKind.ADD_SERVICE, service=a),
        IpvsOp(OpKind.ADD_SERVICE, service=a),  # EEXIST
        IpvsOp(OpKind.ADD_DEST, service=ghost, dest=rs1),  # no such service
        IpvsOp(OpKind.ADD_SERVICE, service=bad_sched),  # no such scheduler
        IpvsOp(OpKind.ADD_DEST, service=a, dest=rs1),
        IpvsOp(OpKind.ADD_SERVICE, service=b),
        IpvsOp(OpKind.ADD_DEST, service=b, dest=rs2),
        IpvsOp(OpKind.DEL_DEST, service=b, dest=rs1),  # not a dest of b
    ]
    with IpvsClient() as client:
        failures = client.apply(ops, batch=3)  # failures straddle batch boundaries
        got = [(f.op, f.errno) for f in failures]
        assert [op for op, _ in got] == [ops[1], ops[2], ops[3], ops[7]]
        assert [e for _, e in got] == [errno.EEXIST, errno.ESRCH, errno.ENOENT, errno.ENOENT]
        assert "add_service TCP 10.96.0.1:443: EEXIST" in str(failures[0])
        assert_same(observed_rules(client), {
            a.key: (_norm(a), {rs1.key: rs1}),
            b.key: (_norm(b), {rs2.key: rs2}),
        })
        assert_same(parse_save(sh("ipvsadm -Sn")), observed_rules(client))


class _Counting:
    """The client's socket, counting the answers it reads."""

    def __init__(self, sock: object) -> None:
        self.sock, self.answers = sock, 0

    def recv_into(self, buf: bytearray) -> int:
        n: int = self.sock.recv_into(buf)  # type: ignore[attr-defined]
        self.answers += sum(1 for _ in iter_messages(memoryview(buf)[:n]))
        return n

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


def test_a_batch_is_answered_once_and_each_failure_on_its_own(clean_ipvs: None) -> None:
    """Only a batch's last request asks for an ack (kernel/nlsock.py): operations that succeed,
    in batches of 256, are one answer a batch; the same again, all failing, are one answer
    each, and each failure names its operation."""
    rules = random_rules(random.Random(6), 150, 6)
    ops = ops_for(rules)
    batches = -(-len(ops) // 256)
    assert batches >= 2
    with IpvsClient() as client:
        counting = _Counting(client.sock)
        client.sock = counting  # type: ignore[assignment]
        assert client.apply(ops) == []
        assert counting.answers == batches
        again = client.apply(ops)
        assert counting.answers == batches + len(ops)
        assert [f.op for f in again] == ops
        assert {f.errno for f in again} == {errno.EEXIST}
    assert_same(with_thresholds(parse_save(sh("ipvsadm -Sn")), sh("ipvsadm -Ln --thresholds")),
                rules)


def test_edit_and_delete(clean_ipvs: None) -> None:
    vs = VirtualServer(ServiceKey.inet(Protocol.TCP, IPv6Address("fd00::10"), 80), "rr")
    rs = RealServer(DestKey(IPv6Address("fd01::5"), 8080), weight=1)
    with IpvsClient() as client:
        assert client.apply([IpvsOp(OpKind.ADD_SERVICE, service=vs),
                             IpvsOp(OpKind.ADD_DEST, service=vs, dest=rs)]) == []
        vs2 = VirtualServer(vs.key, "sh", 0x1 | 0x8 | 0x10, 600, 64)
        rs2 = RealServer(rs.key, Fwd.MASQ, 0, 100, 10)  # drained: weight 0
        assert client.apply([IpvsOp(OpKind.EDIT_SERVICE, service=vs2),
                             IpvsOp(OpKind.EDIT_DEST, service=vs2, dest=rs2)]) == []
        assert observed_rules(client) == {vs.key: (vs2, {rs.key: rs2})}
        assert "-s sh -p 600 -M 64 -b sh-fallback,sh-port" in sh("ipvsadm -Sn")
        assert client.apply([IpvsOp(OpKind.DEL_DEST, service=vs2, dest=rs2),
                             IpvsOp(OpKind.DEL_SERVICE, service=vs2)]) == []
        assert client.dump() == []


def test_info_timeouts_zero_flush(clean_ipvs: None) -> None:
    with IpvsClient() as client:
        info = client.info()
        header = sh("ipvsadm -Ln").splitlines()[0]
        assert header == (f"IP Virtual Server version {info.version_str} "
                          f"(size={info.conn_tab_size})")
        client.set_timeouts(Timeouts(901, 121, 301))
        assert client.timeouts() == Timeouts(901, 121, 301)
        assert sh("ipvsadm -L --timeout").strip() == "Timeout (tcp tcpfin udp): 901 121 301"
        client.set_timeouts(Timeouts(900, 120, 300))
        sh("ipvsadm -A -t 10.0.0.1:80 && ipvsadm -A -u 10.0.0.1:53")
        client.zero()
        client.flush()
        assert client.dump() == []


def test_family_resolution_agrees_with_pyroute2(ipvs_modules: None) -> None:
    from pyroute2.netlink.generic import GenericNetlinkSocket
    from pyroute2.netlink.generic.ipvs import ipvsmsg

    from ipvsproxy.kernel.ipvs import resolve_family

    gs = GenericNetlinkSocket()
    try:
        gs.bind("IPVS", ipvsmsg)
        assert resolve_family() == gs.prid
    finally:
        gs.close()
