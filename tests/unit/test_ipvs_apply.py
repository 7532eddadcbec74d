"""IpvsClient.apply's batching: the kernel gets every request once, in order, one batch per
send(), whether the batches are sent from this thread (two batches or fewer) or from a second
one while the next is encoded; failures come back per request, and a batch that raises stops
the rest. What the requests do in a real kernel is tests/kernel/test_ipvs.py's (its partial
failure test goes through three batches, so through the second thread)."""

from __future__ import annotations

import errno
import struct
import threading
from ipaddress import IPv4Address

import pytest

from ipvsproxy.core.ipvs import DestKey, IpvsOp, OpKind, Protocol, RealServer, ServiceKey
from ipvsproxy.core.ipvs import VirtualServer as VS
from ipvsproxy.kernel import ipvs_codec as c
from ipvsproxy.kernel.ipvs import IpvsClient, IpvsError

FAMILY = 0x1F  # any generic-netlink family id: the scripted kernel below does not check it


def _ack(seq: int, err: int) -> bytes:
    body = struct.pack("=i", -err) + struct.pack("=IHHII", 16, 0, 0, seq, 0)
    return struct.pack("=IHHII", 16 + len(body), c.NLMSG_ERROR, 0, seq, 0) + body


class ScriptedKernel:
    """A socket whose every send() is one batch: it records each request's (seq, command) and
    answers each with an ack, or with an error for the ports in `refuse`; send number
    `raise_on` raises instead."""

    def __init__(self, refuse: frozenset[int] = frozenset(), raise_on: int | None = None,
                 first_send_waits_for: threading.Event | None = None) -> None:
        self.batches: list[list[tuple[int, int]]] = []
        self.threads: set[str] = set()
        self.refuse, self.raise_on, self.gate = refuse, raise_on, first_send_waits_for
        self.gate_opened: bool | None = None
        self.answers = b""

    def send(self, data: bytes) -> int:
        self.threads.add(threading.current_thread().name)
        if self.gate is not None and not self.batches:
            # the first batch is in the kernel: the next one is encoded meanwhile, or never
            self.gate_opened = self.gate.wait(timeout=30)
        if self.raise_on == len(self.batches):
            self.batches.append([])
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        batch = []
        for _mtype, _flags, seq, payload in c.iter_messages(data):
            batch.append((seq, payload[0]))
            port = None
            if payload[0] == c.CMD_NEW_SERVICE:
                svc = c.attrs(c.attrs(payload[4:])[c.A_SERVICE])
                port = struct.unpack(">H", svc[c.S_PORT])[0]
            self.answers += _ack(seq, errno.EEXIST if port in self.refuse else 0)
        self.batches.append(batch)
        return len(data)

    def recv(self, _size: int) -> bytes:
        out, self.answers = self.answers, b""
        return out

    def close(self) -> None:
        pass


def _services(n: int) -> list[IpvsOp]:
    return [IpvsOp(OpKind.ADD_SERVICE, service=VS(ServiceKey.inet(
        Protocol.TCP, IPv4Address("10.96.0.1"), port), "rr")) for port in range(1, n + 1)]


def _client(kernel: ScriptedKernel) -> IpvsClient:
    client = IpvsClient(family=FAMILY)
    client.sock.close()
    client.sock = kernel  # type: ignore[assignment]
    return client


def _port(op: IpvsOp) -> int:
    assert op.service is not None
    return op.service.key.port


@pytest.mark.parametrize("n", [5, 6, 7, 40])
def test_every_request_once_in_order_one_batch_per_send(n: int) -> None:
    kernel = ScriptedKernel(refuse=frozenset({2, 4, 7, 33}))
    ops = _services(n)
    failures = _client(kernel).apply(ops, batch=3)
    assert [len(b) for b in kernel.batches] == [len(ops[i:i + 3]) for i in range(0, n, 3)]
    seqs = [seq for b in kernel.batches for seq, _ in b]
    assert seqs == sorted(seqs) and len(set(seqs)) == n
    assert {cmd for b in kernel.batches for _, cmd in b} == {c.CMD_NEW_SERVICE}
    assert [(_port(f.op), f.errno) for f in failures] == \
        [(p, errno.EEXIST) for p in (2, 4, 7, 33) if p <= n]
    # two batches or fewer: sent from the caller's thread; more: from the sender thread
    assert kernel.threads == ({"MainThread"} if n <= 6 else {"ipvs-apply"})


def test_the_next_batch_is_encoded_while_the_kernel_has_the_first() -> None:
    encoding_the_second = threading.Event()
    kernel = ScriptedKernel(first_send_waits_for=encoding_the_second)
    client = _client(kernel)
    encode = client._encode_batch

    def watched(chunk: list[IpvsOp], keys: dict[ServiceKey, bytes]) -> tuple[bytes, dict]:
        if _port(chunk[0]) == 4:
            encoding_the_second.set()
        return encode(chunk, keys)

    client._encode_batch = watched  # type: ignore[method-assign]
    assert client.apply(_services(9), batch=3) == []
    assert kernel.gate_opened is True
    assert [len(b) for b in kernel.batches] == [3, 3, 3]


def test_a_batch_that_raises_stops_the_rest_and_raises_in_the_caller() -> None:
    kernel = ScriptedKernel(raise_on=1)
    with pytest.raises(OSError, match="temporarily unavailable"):
        _client(kernel).apply(_services(30), batch=3)
    # the first batch went, the second raised, and nothing after it was sent
    assert [len(b) for b in kernel.batches] == [3, 0]


def test_failures_are_ipvs_errors_naming_the_operation() -> None:
    kernel = ScriptedKernel(refuse=frozenset({8}))
    dest = RealServer(DestKey(IPv4Address("10.244.0.5"), 80))
    ops = [*_services(9), IpvsOp(OpKind.ADD_DEST, service=_services(1)[0].service, dest=dest)]
    (failure,) = _client(kernel).apply(ops, batch=2)
    assert isinstance(failure, IpvsError) and failure.op is ops[7]
    assert "EEXIST" in str(failure)
