"""The reflectors (kube/reflector.py `start_reflectors`) against the in-process fake API server
(tests/apiserver.py) through the real `kubernetes` client and urllib3 sockets, into the real
store: the initial lists, events, a re-list after compaction, an outage, kube-proxy's label
selector, and a prompt stop of all threads. Watch timeouts and backoffs are cut to fractions
of a second so the whole file runs in a few seconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog
from kubernetes.client import ApiClient, Configuration

from ipvsproxy.daemon.store import Store
from ipvsproxy.kube.reflector import start_reflectors
from tests.apiserver import ApiServer
from tests.unit.kube_objects import NODE, ep, node, service, slice_

FAST = {"min_watch_timeout": 1, "max_watch_timeout": 2, "socket_timeout": 2,
        "connect_timeout": 1, "backoff_initial": 0.05, "backoff_max": 0.2}
HEADLESS = {"service.kubernetes.io/headless": ""}


class Recorder:
    """The real store as the sink, with a log of what the reflectors handed it."""

    def __init__(self) -> None:
        self.store = Store(NODE)
        self.calls: list[tuple[str, str, tuple[str, ...]]] = []
        self._lock = threading.Lock()
        self._listing: dict[str, tuple[str, ...]] = {}

    def list_page(self, kind: str, items: list[dict[str, Any]], first: bool) -> None:
        with self._lock:
            names = tuple(i["metadata"]["name"] for i in items)
            self._listing[kind] = names if first else self._listing.get(kind, ()) + names
        self.store.list_page(kind, items, first)

    def list_done(self, kind: str) -> None:
        with self._lock:  # a whole list: logged as one replace
            self.calls.append(("replace", kind, self._listing.pop(kind, ())))
        self.store.list_done(kind)

    def event(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        with self._lock:
            self.calls.append((type_, kind, (obj["metadata"]["name"],)))
        self.store.event(kind, type_, obj)

    def names(self) -> set[str]:
        return {n for _, _, names in self.calls for n in names}

    def services(self) -> set[str]:
        return {name for _, name in self.store.services}


class Proxy:
    def __init__(self, server: ApiServer, **options: Any) -> None:
        self.sink = Recorder()
        self.stop = threading.Event()
        self.client: Any = ApiClient(Configuration(host=server.url))  # untyped
        self.threads = start_reflectors(self.client, NODE, self.sink, self.stop,
                                        **{**FAST, **options})

    def close(self) -> float:
        """Stop the reflectors; returns how long their threads took to end."""
        started = time.monotonic()
        self.stop.set()
        for t in self.threads:
            t.join(5)
        took = time.monotonic() - started
        self.client.close()
        return took


def eventually(cond: Callable[[], bool], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.fixture
def server() -> Iterator[ApiServer]:
    s = ApiServer()
    s.bookmark_interval = 0.5
    s.start()
    yield s
    s.stop()


@pytest.fixture
def proxy(server: ApiServer) -> Iterator[Callable[..., Proxy]]:
    started: list[Proxy] = []

    def start(**options: Any) -> Proxy:
        started.append(Proxy(server, **options))
        return started[-1]

    yield start
    for p in started:
        p.close()


def lists(server: ApiServer, path: str) -> int:
    """LIST (not WATCH) requests for a collection so far."""
    return sum(1 for _, p in list(server.requests)
               if p.split("?")[0] == path and "watch=" not in p)


def test_initial_lists_of_all_three_kinds(server: ApiServer, proxy: Callable[..., Proxy]
                                          ) -> None:
    server.load([service("a", "10.96.0.1"), slice_("a", ep("10.244.1.1")), node(),
                 node("node-b")])
    p = proxy()
    eventually(p.sink.store.initialized)
    store = p.sink.store
    assert set(store.services) == {("default", "a")}
    assert set(store.slices) == {("default", "a-ipv4")}
    assert store.node is not None
    # only the own Node is listed: the field selector
    assert ("replace", "Node", (NODE,)) in p.sink.calls and "node-b" not in p.sink.names()


def test_changes_arrive_as_events(server: ApiServer, proxy: Callable[..., Proxy]) -> None:
    server.load([service("a", "10.96.0.1"), node()])
    p = proxy()
    eventually(p.sink.store.initialized)
    server.put(service("b", "10.96.0.2"))
    server.put(slice_("b", ep("10.244.1.2")))
    server.put(service("a", "10.96.0.9"))
    server.delete("Service", "default", "a")
    eventually(lambda: p.sink.services() == {"b"} and ("default", "b-ipv4") in p.sink.store.slices)
    assert ("ADDED", "Service", ("b",)) in p.sink.calls
    assert ("MODIFIED", "Service", ("a",)) in p.sink.calls
    assert ("DELETED", "Service", ("a",)) in p.sink.calls
    assert lists(server, "/api/v1/services") == 1  # watch timeouts re-watched, never re-listed


def test_compaction_forces_a_relist_that_converges(server: ApiServer,
                                                   proxy: Callable[..., Proxy]) -> None:
    server.load([service("a", "10.96.0.1"), service("b", "10.96.0.2"), node()])
    # long watches and a backoff of 0.5 s: the changes below land while no watch is open
    p = proxy(min_watch_timeout=30, max_watch_timeout=31, backoff_initial=0.5, jitter=0)
    eventually(p.sink.store.initialized)
    server.bookmark_interval = 3600  # no bookmark may carry the watch past the compaction
    before = lists(server, "/api/v1/services")
    server.cut_watches()
    server.delete("Service", "default", "b")
    server.put(service("c", "10.96.0.3"))
    server.compact()
    eventually(lambda: p.sink.services() == {"a", "c"})
    assert lists(server, "/api/v1/services") == before + 1
    # b went away through the fresh list, not through an event
    assert ("replace", "Service", ("a", "c")) in p.sink.calls
    assert not [c for c in p.sink.calls if c[0] == "DELETED"]


def test_outage_reconnects_and_converges(server: ApiServer, proxy: Callable[..., Proxy]
                                         ) -> None:
    server.load([service("a", "10.96.0.1"), node()])
    with structlog.testing.capture_logs() as logs:
        p = proxy()
        eventually(p.sink.store.initialized)
        server.stop()
        server.put(service("b", "10.96.0.2"))
        server.delete("Service", "default", "a")
        time.sleep(0.5)  # the reflectors fail and back off meanwhile
        assert p.sink.services() == {"a"}
        server.start()
        eventually(lambda: p.sink.services() == {"b"})
    failed = [e for e in logs if e["event"] in ("watch failed", "list failed")]
    assert failed and all(e["log_level"] == "warning" and e["error"] for e in failed)
    # resumed from the last resourceVersion: the history was still there, no re-list
    assert lists(server, "/api/v1/services") == 1


def test_objects_out_of_the_label_selector_never_arrive(server: ApiServer,
                                                        proxy: Callable[..., Proxy]) -> None:
    server.load([service("hl", "None", labels=HEADLESS),
                 slice_("hl", ep("10.244.1.1"), labels={**HEADLESS,
                                                        "kubernetes.io/service-name": "hl"}),
                 service("other", "10.96.0.5",
                         labels={"service.kubernetes.io/service-proxy-name": "cilium"}),
                 service("a", "10.96.0.1"), node()])
    p = proxy()
    eventually(p.sink.store.initialized)
    server.put(service("hl2", "None", labels=HEADLESS))
    server.put(service("z", "10.96.0.26"))  # after hl2: once z is in, hl2 went by
    eventually(lambda: "z" in p.sink.services())
    assert p.sink.services() == {"a", "z"}
    assert not {"hl", "hl2", "other"} & p.sink.names()
    assert not p.sink.store.slices


def test_stop_ends_all_threads_promptly(server: ApiServer, proxy: Callable[..., Proxy]) -> None:
    server.load([service("a", "10.96.0.1"), node()])
    server.bookmark_interval = 3600
    p = proxy(min_watch_timeout=60, max_watch_timeout=61)  # silent, blocked watches
    eventually(p.sink.store.initialized)
    time.sleep(0.2)
    assert all(t.is_alive() for t in p.threads)
    assert p.close() < 2
    assert not any(t.is_alive() for t in p.threads)


def test_stop_during_an_outage(server: ApiServer, proxy: Callable[..., Proxy]) -> None:
    server.stop()
    p = proxy(backoff_initial=5, backoff_max=5)
    time.sleep(0.2)  # every reflector failed to list and waits out its backoff
    assert not p.sink.store.initialized()
    assert p.close() < 2
