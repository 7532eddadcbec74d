"""ipvsproxy's reflectors (kube/reflector.py) against the real API server, with deploy/'s
ServiceAccount token, into the daemon's real store.

What the real server does here, each checked as it happens:
* lists and watches: Services and EndpointSlices created, changed and deleted through the API
  arrive as events; kube-proxy's label selector and the own Node's field selector are applied
  by the server;
* bookmarks: the server's watch cache sends one shortly before a watch's timeout (and about
  every minute), carrying its resourceVersion, and only when it is newer than what the watch has
  delivered; an object the selector hides still moves that resourceVersion on;
* 410 Gone: the watch cache serves a resourceVersion etcd has compacted as long as it holds it;
  after an API server restart its history starts at etcd's revision of then, and a watch from
  before gets a 410 (as an ERROR event in a 200 stream) and the reflector lists again; a list's
  continue token from before the restart and compaction gets an HTTP 410 and the list restarts;
* an API server stopped and started again: the reflectors retry and catch up.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from integration.upstream.controlplane import ControlPlane
from ipvsproxy.kube import rest
from ipvsproxy.kube.listing import LABEL_SELECTOR
from ipvsproxy.kube.reflector import Reflector, _lines, start_reflectors
from tests.realapi.conftest import Applied, wait_for
from tests.realapi.proxycalls import NODE, api_client
from tests.unit.kube_objects import ep, node, port, service, slice_
from tests.unit.test_reflector_apiserver import Recorder

OTHER_PROXY = {"service.kubernetes.io/service-proxy-name": "another-proxy"}
HEADLESS = {"service.kubernetes.io/headless": ""}
# Watches of a few seconds, so bookmarks (two seconds before a watch's end) come within the
# test; retries within a second.
SHORT = {"min_watch_timeout": 5, "max_watch_timeout": 6, "socket_timeout": 30,
         "backoff_initial": 0.1, "backoff_max": 0.5}
# Watches longer than any test: what arrives comes through the watch, not a new one.
LONG = {"min_watch_timeout": 300, "max_watch_timeout": 301, "socket_timeout": 30}


@pytest.fixture
def client(proxy_kubeconfig: Path) -> Iterator[Any]:
    c = api_client(proxy_kubeconfig)
    yield c
    c.close()


class Running:
    """Reflectors on their threads, stopped (and their threads joined) at the end."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def reflector(self, kind: str, path: str, client: Any, sink: Any, **kw: Any) -> Reflector:
        r = Reflector(kind, rest.Get(client, path), sink, self.stop, **kw)
        t = threading.Thread(target=r.run, name=f"test-reflector-{kind}", daemon=True)
        t.start()
        self.threads.append(t)
        def interrupt_on_stop() -> None:  # as start_reflectors does
            self.stop.wait()
            r.interrupt()

        threading.Thread(target=interrupt_on_stop, daemon=True).start()
        return r

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        assert not any(t.is_alive() for t in self.threads)


@pytest.fixture
def running() -> Iterator[Running]:
    r = Running()
    yield r
    r.close()


def calls_of(rec: Recorder, kind: str) -> list[tuple[str, tuple[str, ...]]]:
    return [(what, names) for what, k, names in list(rec.calls) if k == kind]


def rv_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["resourceVersion"])


def test_lists_and_watches_what_the_api_server_holds(
        cluster: Applied, client: Any, running: Running) -> None:
    cluster.apply([node(NODE, "192.168.1.10"), node("node-b", "192.168.1.11"),
                   service("a", "10.96.10.1", port(80, "http")),
                   slice_("a", ep("10.244.1.1"), port_name="http"),
                   service("theirs", "10.96.10.2", labels=OTHER_PROXY),
                   slice_("theirs", ep("10.244.1.2"),
                          labels={**OTHER_PROXY, "kubernetes.io/service-name": "theirs"}),
                   service("hl", "None"),
                   slice_("hl", ep("10.244.1.3"),
                          labels={**HEADLESS, "kubernetes.io/service-name": "hl"})])
    rec = Recorder()
    running.threads += start_reflectors(client, NODE, rec, running.stop, **LONG)
    wait_for("the first lists", rec.store.initialized)
    store = rec.store
    # the server applied the selectors: another proxy's objects, headless slices and other
    # nodes never came (a headless Service is not labelled: it came, the store skips it)
    assert set(store.services) == {("default", "a"), ("default", "kubernetes")}
    assert "hl" in rec.names()
    assert {k for k in store.slices if k[1] != "kubernetes"} == {("default", "a-ipv4")}
    assert store.node is not None and store.node.name == NODE
    assert not {"theirs", "node-b"} & rec.names()
    assert "kubernetes" in store.cidrs  # the ServiceCIDR the API server made from its flags

    cluster.apply([service("b", "10.96.10.3", port(80, "http")),
                   slice_("b", ep("10.244.1.4"), port_name="http"),
                   service("a", "10.96.10.1", port(8080, "http"))])
    cluster.delete(service("a", "10.96.10.1"))
    cluster.apply(node(NODE, "192.168.1.20"))
    wait_for("the changes as events",
             lambda: ("default", "b-ipv4") in store.slices
             and ("default", "a") not in store.services
             and store.node is not None and "192.168.1.20" in str(store.node))
    svc = calls_of(rec, "Service")
    assert ("ADDED", ("b",)) in svc and ("MODIFIED", ("a",)) in svc and ("DELETED", ("a",)) in svc
    assert ("MODIFIED", (NODE,)) in calls_of(rec, "Node")
    # one list per kind: everything after it came through the watches
    assert [w for w, _ in svc].count("replace") == 1


def test_bookmarks_carry_the_resource_version_past_what_the_selector_hides(
        cluster: Applied, client: Any, running: Running) -> None:
    cluster.apply(service("a", "10.96.11.1"))
    rec = Recorder()
    r = running.reflector("Service", rest.SERVICES, client, rec, label_selector=LABEL_SELECTOR,
                          **SHORT)
    wait_for("the list", lambda: "Service" in rec.store.listed)
    hidden = cluster.apply(service("theirs", "10.96.11.2", labels=OTHER_PROXY))[0]
    # No event can carry this resourceVersion (the selector hides the object): a bookmark does.
    wait_for("a bookmark with the hidden object's resourceVersion",
             lambda: r.resource_version is not None
             and int(r.resource_version) >= int(rv_of(hidden)), timeout=120)
    assert "theirs" not in rec.names()
    assert [c for c in rec.calls if c[0] != "replace"] == []


def test_a_bookmark_as_the_server_sends_it(cluster: Applied, client: Any) -> None:
    listed = cluster.apply(service("a", "10.96.12.1"))[0]
    get = rest.Get(client, rest.SERVICES)
    resp = get(watch=True, resource_version=rv_of(listed), allow_watch_bookmarks=True,
               timeout_seconds=5, label_selector=LABEL_SELECTOR, _request_timeout=(10, 60))
    try:
        hidden = cluster.apply(service("theirs", "10.96.12.2", labels=OTHER_PROXY))[0]
        events = [json.loads(line) for line in _lines(resp) if line]
    finally:
        resp.release_conn()
    # nothing but the bookmark two seconds before the end: an object with a kind and a
    # resourceVersion only, the one the reflector resumes from. A slow server may send it
    # twice: the cacher files the watcher by whole seconds and, woken just before the
    # deadline minus 2 s, files it again for that same moment (cache_watcher.go
    # nextBookmarkTime, cacher.go watcherBookmarkTimeBuckets); CI saw two, both alike.
    assert events and {e["type"] for e in events} == {"BOOKMARK"}, events
    for event in events:
        obj = event["object"]
        assert obj["kind"] == "Service" and obj["apiVersion"] == "v1"
        assert int(obj["metadata"]["resourceVersion"]) >= int(rv_of(hidden))


def test_the_watch_cache_serves_a_compacted_version_until_the_api_server_restarts(
        control_plane: ControlPlane, cluster: Applied, client: Any) -> None:
    old = rv_of(cluster.apply(service("a", "10.96.13.1"))[0])
    cluster.apply(service("a", "10.96.13.1", port(81)))
    control_plane.compact()
    assert control_plane.compacted(int(old))
    get = rest.Get(client, rest.SERVICES)

    def watch_from(rv: str) -> list[dict[str, Any]]:
        resp = get(watch=True, resource_version=rv, timeout_seconds=1,
                   _request_timeout=(10, 30))
        try:
            return [json.loads(line) for line in _lines(resp) if line]
        finally:
            resp.release_conn()

    # etcd no longer has it, the watch cache still does: the change since is replayed
    assert [e["type"] for e in watch_from(old)] == ["MODIFIED"]
    control_plane.restart()
    events = watch_from(old)
    assert [(e["type"], e["object"]["code"], e["object"]["reason"]) for e in events] == [
        ("ERROR", 410, "Expired")], events


class Gate:
    """A reflector's backoff `wait`: the first one blocks until `release`; later ones pass."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.entered = threading.Event()
        self.released = threading.Event()
        self.delays: list[float] = []

    def __call__(self, delay: float) -> bool:
        self.delays.append(delay)
        self.entered.set()
        self.released.wait()
        return self.stop.is_set()


def test_a_watch_from_before_restart_and_compaction_gets_410_and_the_reflector_relists(
        control_plane: ControlPlane, cluster: Applied, client: Any, running: Running) -> None:
    cluster.apply([service("a", "10.96.14.1"), service("b", "10.96.14.2")])
    rec = Recorder()
    gate = Gate(running.stop)
    with structlog.testing.capture_logs() as logs:
        r = running.reflector("Service", rest.SERVICES, client, rec,
                              label_selector=LABEL_SELECTOR, wait=gate, **LONG)
        wait_for("the list", lambda: "Service" in rec.store.listed)
        seen = r.resource_version
        assert seen is not None
        # etcd's revision moves on past what the reflector has seen (any write does)
        cluster.apply({"kind": "ConfigMap", "metadata": {"name": "elsewhere",
                                                         "namespace": "default"}})
        control_plane.stop()
        wait_for("the reflector to fail and back off", gate.entered.is_set)
        control_plane.start()
        # while it waits: a change, a new Service and a deletion it will not see as events
        cluster.apply([service("a", "10.96.14.1", port(81)), service("c", "10.96.14.3")])
        cluster.delete(service("b", "10.96.14.2"))
        control_plane.compact()
        assert control_plane.compacted(int(seen))
        gate.released.set()
        wait_for("the relist", lambda: {n for _, n in rec.store.services}
                 == {"kubernetes", "a", "c"} and rec.store.services[("default", "a")]
                 .ports[0].port == 81)
    expired = [e for e in logs if e["event"] == "resource version expired, re-listing"]
    # the server's own reason, from the ERROR event of the watch from the old version
    assert expired and "too old resource version" in expired[0]["error"], logs
    svc = calls_of(rec, "Service")
    # two lists; b went away through the second, never as an event
    assert [w for w, _ in svc].count("replace") == 2, svc
    assert ("DELETED", ("b",)) not in svc
    assert svc[-1][0] == "replace" and set(svc[-1][1]) == {"kubernetes", "a", "c"}


class BlockingFirstPage(Recorder):
    """A sink that holds the reflector on its first list's first page until released."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.released = threading.Event()
        self.firsts = 0

    def list_page(self, kind: str, items: list[dict[str, Any]], first: bool) -> None:
        if first:
            self.firsts += 1
            if self.firsts == 1:
                self.entered.set()
                self.released.wait()
        super().list_page(kind, items, first)


def test_a_continue_token_from_before_restart_and_compaction_restarts_the_list(
        control_plane: ControlPlane, cluster: Applied, client: Any, running: Running) -> None:
    cluster.apply([service("a", "10.96.15.1"), service("b", "10.96.15.2")])
    sink = BlockingFirstPage()
    with structlog.testing.capture_logs() as logs:
        running.reflector("Service", rest.SERVICES, client, sink, label_selector=LABEL_SELECTOR,
                          page=1, **LONG)
        wait_for("the first page", sink.entered.is_set)
        cluster.delete(service("b", "10.96.15.2"))
        control_plane.restart()
        control_plane.compact()
        sink.released.set()
        wait_for("the list", lambda: "Service" in sink.store.listed)
    assert {n for _, n in sink.store.services} == {"kubernetes", "a"}
    assert sink.firsts == 2  # started over
    assert any(e["event"] == "list continue token expired, restarting list" for e in logs), logs


def test_the_api_server_stopped_and_started_again_the_reflectors_catch_up(
        control_plane: ControlPlane, cluster: Applied, client: Any, running: Running) -> None:
    cluster.apply([node(NODE, "192.168.1.10"), service("a", "10.96.16.1"),
                   slice_("a", ep("10.244.1.1"))])
    rec = Recorder()
    running.threads += start_reflectors(client, NODE, rec, running.stop, **SHORT)
    wait_for("the first lists", rec.store.initialized)
    with structlog.testing.capture_logs() as logs:
        control_plane.stop()
        wait_for("the reflectors to notice", lambda: any(
            e["event"] in ("watch failed", "list failed") for e in list(logs)), timeout=120)
        assert ("default", "a") in rec.store.services  # nothing is forgotten meanwhile
        control_plane.start()
        cluster.apply([service("b", "10.96.16.2"), slice_("b", ep("10.244.1.2"))])
        cluster.delete(service("a", "10.96.16.1"))
        cluster.delete(slice_("a"))
        wait_for("the reflectors to catch up",
                 lambda: ("default", "b") in rec.store.services
                 and ("default", "b-ipv4") in rec.store.slices
                 and ("default", "a") not in rec.store.services
                 and ("default", "a-ipv4") not in rec.store.slices, timeout=120)
    failed = [e for e in logs if e["event"] in ("watch failed", "list failed")]
    assert failed and all(e["log_level"] == "warning" for e in failed)
