"""ipvs_dump.forked: a child process reads the replies, this one gets them, failures included.

The child's reads are replaced by a fake (no IPVS on the host); the lab's kernel test
(tests/kernel/test_ipvs.py) compares forked and in-process dumps of a real kernel."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Sequence
from ipaddress import IPv4Address

import pytest

from ipvsproxy.core.ipvs import Protocol, ServiceKey
from ipvsproxy.kernel import ipvs_dump

KEYS = [ServiceKey.inet(Protocol.TCP, IPv4Address(0x0A600000 + i), 80) for i in range(700)]


def _fake_replies(n: int, seq: int) -> list[ipvs_dump.Reply]:
    out: list[ipvs_dump.Reply] = []
    for i in range(n):
        q = seq + i
        if i % 7 == 3:
            out.append((q, [], 0))  # no real servers
        elif i % 11 == 5:
            out.append((q, [bytes([i % 256]) * 40], None))  # the NLMSG_DONE in the data
        elif i % 13 == 6:
            out.append((q, [], errno.ENOENT))
        else:
            out.append((q, [os.urandom(300 * (1 + i % 4))], 0))
    return out


def _flat(batches: Iterator[list[ipvs_dump.Reply]]) -> list[ipvs_dump.Reply]:
    return [r for batch in batches for r in batch]


def test_the_child_hands_on_every_reply_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    want = _fake_replies(len(KEYS), 1000)

    def fake(family: int, keys: Sequence[ServiceKey], seq: int,
             collect: int = ipvs_dump.COLLECT) -> Iterator[list[ipvs_dump.Reply]]:
        assert (family, list(keys), seq) == (0x25, KEYS, 1000)
        for i in range(0, len(want), 50):
            yield want[i:i + 50]

    monkeypatch.setattr(ipvs_dump, "in_process", fake)
    monkeypatch.setattr(ipvs_dump, "FORK_COLLECT", 16 << 10)
    batches = list(ipvs_dump.forked(0x25, KEYS, 1000))
    assert len(batches) > 1  # decoding can start before the child is done
    # several buffers of one dump arrive as one (the decoders read them the same)
    assert _flat(iter(batches)) == [(q, [b"".join(b)] if b else [], e) for q, b, e in want]


def test_a_failure_in_the_child_is_raised_here(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(family: int, keys: Sequence[ServiceKey], seq: int,
                collect: int = ipvs_dump.COLLECT) -> Iterator[list[ipvs_dump.Reply]]:
        yield _fake_replies(10, seq)
        raise OSError(errno.ETIMEDOUT, "timed out")

    monkeypatch.setattr(ipvs_dump, "in_process", failing)
    with pytest.raises(OSError, match="timed out") as info:
        _flat(ipvs_dump.forked(0x25, KEYS, 1))
    assert info.value.errno == errno.ETIMEDOUT

    def crashing(family: int, keys: Sequence[ServiceKey], seq: int,
                 collect: int = ipvs_dump.COLLECT) -> Iterator[list[ipvs_dump.Reply]]:
        yield _fake_replies(10, seq)
        os._exit(3)  # no word from the child: the pipe ends early

    monkeypatch.setattr(ipvs_dump, "in_process", crashing)
    with pytest.raises(RuntimeError, match="exited with status 0x300"):
        _flat(ipvs_dump.forked(0x25, KEYS, 1))


def test_a_reader_that_stops_early_leaves_no_child(monkeypatch: pytest.MonkeyPatch) -> None:
    def endless(family: int, keys: Sequence[ServiceKey], seq: int,
                collect: int = ipvs_dump.COLLECT) -> Iterator[list[ipvs_dump.Reply]]:
        while True:
            yield _fake_replies(100, seq)

    real_fork, children = os.fork, []

    def fork() -> int:
        pid = real_fork()
        if pid:
            children.append(pid)
        return pid

    monkeypatch.setattr(ipvs_dump, "in_process", endless)
    monkeypatch.setattr(ipvs_dump, "FORK_COLLECT", 1 << 10)
    monkeypatch.setattr(os, "fork", fork)
    gen = ipvs_dump.forked(0x25, KEYS, 1)
    next(gen)
    gen.close()  # kills and reaps the child
    # that child only: pytest has others (the kernel lab's guest runs beside the host's tests)
    [child] = children
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)


def test_only_single_threaded_processes_with_enough_services_fork(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    # pytest itself may have a thread (the kernel lab's, beside the host's tests): the
    # single-threaded case as the count says it
    with monkeypatch.context() as m:
        m.setattr(threading, "active_count", lambda: 1)
        assert ipvs_dump.may_fork(ipvs_dump.FORK_MIN)
        assert not ipvs_dump.may_fork(ipvs_dump.FORK_MIN - 1)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not ipvs_dump.may_fork(ipvs_dump.FORK_MIN)
    finally:
        stop.set()
        t.join()
