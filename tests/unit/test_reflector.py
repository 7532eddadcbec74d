"""The reflector (kube/reflector.py) against a scripted `list_fn`: paginated LIST into `replace`,
WATCH events into `event` with their kind, resourceVersion tracking (objects and bookmarks),
re-watch without re-list after a normal end, re-list on 410, capped backoff on errors, prompt
stop, and the arguments the client is called with."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from kubernetes.client.exceptions import ApiException

from ipvsproxy.kube import rest
from ipvsproxy.kube.listing import LABEL_SELECTOR
from ipvsproxy.kube.reflector import Backoff, Reflector, start_reflectors

# --------------------------------------------------------------------------- fakes


class ListResp:
    """A finished LIST response, as urllib3's HTTPResponse offers it."""

    def __init__(self, items: list[dict[str, Any]], rv: str, cont: str | None = None) -> None:
        meta: dict[str, Any] = {"resourceVersion": rv}
        if cont:
            meta["continue"] = cont
        self.data = json.dumps({"kind": "List", "metadata": meta, "items": items}).encode()
        self.released = self.closed = False

    def release_conn(self) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True


class WatchResp:
    """A WATCH response: `stream()` yields the chunks (an exception in them is raised there),
    then ends (EOF) or, with `block`, waits like a silent connection until shut down."""

    def __init__(self, *chunks: bytes | dict[str, Any] | BaseException, block: bool = False):
        self.chunks = chunks
        self.block = block
        self.reading = threading.Event()
        self.shut = threading.Event()
        self.closed = self.released = False

    def stream(self, amt: int | None = None, decode_content: bool | None = None
               ) -> Iterator[bytes]:
        for c in self.chunks:
            if isinstance(c, BaseException):
                raise c
            yield c if isinstance(c, bytes) else json.dumps(c).encode() + b"\n"
        if self.block:
            self.reading.set()
            self.shut.wait(5)
            raise OSError("connection shut down")

    def shutdown(self) -> None:
        self.shut.set()

    def close(self) -> None:
        self.closed = True
        self.shut.set()

    def release_conn(self) -> None:
        self.released = True


class Api:
    """A scripted list_fn: each call takes the next item (a response, or an exception to
    raise). When the script is used up it sets `stop` and fails, which ends `run()`."""

    def __init__(self, stop: threading.Event, *script: Any) -> None:
        self.stop = stop
        self.script = list(script)
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kw: Any) -> Any:
        self.calls.append(kw)
        if not self.script:
            self.stop.set()
            raise ConnectionError("script done")
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    def kinds(self) -> list[str]:
        """'list' or 'watch@<rv>' per call, the script's own log of what run() did."""
        return [f"watch@{c['resource_version']}" if c.get("watch") else
                f"list{'+' if c.get('_continue') else ''}" for c in self.calls]


class Sink:
    def __init__(self) -> None:
        self.log: list[tuple[str, ...]] = []
        self.replaced: list[tuple[str, list[dict[str, Any]]]] = []
        self.events: list[tuple[str, str, dict[str, Any]]] = []

        self.listing: dict[str, list[dict[str, Any]]] = {}
        self.pages: list[tuple[str, int, bool]] = []  # kind, items, first

    def list_page(self, kind: str, items: list[dict[str, Any]], first: bool) -> None:
        self.pages.append((kind, len(items), first))
        self.listing[kind] = (self.listing.pop(kind, []) if not first else []) + items

    def list_done(self, kind: str) -> None:
        self.replace(kind, self.listing.pop(kind, []))

    def replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        """A whole list, as list_page + list_done handed it over (what the log records)."""
        self.replaced.append((kind, items))
        self.log.append(("replace", kind, *(i["metadata"]["name"] for i in items)))

    def event(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        self.events.append((kind, type_, obj))
        self.log.append((type_, kind, obj["metadata"]["name"]))


def svc(name: str, rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"namespace": "default", "name": name, "resourceVersion": rv},
            "spec": {"clusterIP": "10.96.0.1"}}


def ev(type_: str, name: str, rv: str) -> dict[str, Any]:
    return {"type": type_, "object": {"kind": "Service", **svc(name, rv)}}


def bookmark(rv: str) -> dict[str, Any]:
    return {"type": "BOOKMARK", "object": {"kind": "Service", "metadata": {"resourceVersion": rv}}}


def gone_event() -> dict[str, Any]:
    return {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                        "message": "too old resource version: 10 (50)"}}


def make(*script: Any, **kw: Any) -> tuple[Reflector, Api, Sink, list[float]]:
    """A reflector on a scripted Api; its backoff waits are recorded, not slept."""
    stop = threading.Event()
    api, sink, waits = Api(stop, *script), Sink(), []

    def wait(delay: float) -> bool:
        waits.append(delay)
        return stop.is_set()

    kw.setdefault("jitter", 0.0)
    r = Reflector("Service", api, sink, stop, wait=wait, rng=random.Random(1), **kw)
    return r, api, sink, waits


# --------------------------------------------------------------------------- LIST


def test_list_follows_continue_and_replaces_once_with_kind() -> None:
    r, api, sink, _ = make(ListResp([svc("a")], "10", cont="tok"), ListResp([svc("b")], "10"),
                           page=1)
    r.run()
    assert sink.log == [("replace", "Service", "a", "b")]
    assert sink.pages == [("Service", 1, True), ("Service", 1, False)]  # each page as read
    assert all(i["kind"] == "Service" for i in sink.replaced[0][1])
    first, second, watch = api.calls
    assert first["limit"] == 1 and "_continue" not in first
    assert second["_continue"] == "tok"
    assert all(c["_preload_content"] is False for c in api.calls)
    assert watch["watch"] is True and watch["resource_version"] == "10"


def test_list_uses_the_first_pages_resource_version() -> None:
    r, api, _, _ = make(ListResp([svc("a")], "10", cont="tok"), ListResp([], "12"))
    r.run()
    assert api.kinds() == ["list", "list+", "watch@10"]


def test_expired_continue_token_restarts_the_list_at_once() -> None:
    r, api, sink, waits = make(ListResp([svc("a")], "10", cont="tok"),
                               ApiException(status=410, reason="Expired"),
                               ListResp([svc("a"), svc("b")], "20"))
    r.run()
    assert api.kinds() == ["list", "list+", "list", "watch@20"]
    assert sink.log == [("replace", "Service", "a", "b")]
    # the page read before the 410 went in; the list then started over (first=True): only
    # the complete list decides what is gone
    assert sink.pages == [("Service", 1, True), ("Service", 2, True)]
    assert waits == []  # restarted at once, no backoff


def test_list_failure_backs_off_and_lists_again() -> None:
    refused = ConnectionRefusedError(111, "refused")
    r, api, _, waits = make(refused, ListResp([], "5"), refused, backoff_initial=0.5)
    with structlog.testing.capture_logs() as logs:
        r.run()
    assert api.kinds() == ["list", "list", "watch@5", "watch@5"]
    failed = [e for e in logs if e["event"] == "list failed"]
    assert failed[0]["kind"] == "Service" and "refused" in failed[0]["error"]
    assert failed[0]["log_level"] == "warning"
    assert waits == [0.5, 0.5]  # the successful list reset the backoff


# --------------------------------------------------------------------------- WATCH


def test_watch_events_reach_the_sink_with_kind_and_move_the_resource_version() -> None:
    added = ev("ADDED", "b", "11")
    del added["object"]["kind"]
    r, api, sink, _ = make(ListResp([svc("a")], "10"),
                           WatchResp(added, ev("MODIFIED", "a", "12"), ev("DELETED", "b", "13")))
    r.run()
    assert sink.log == [("replace", "Service", "a"), ("ADDED", "Service", "b"),
                        ("MODIFIED", "Service", "a"), ("DELETED", "Service", "b")]
    assert all(o["kind"] == "Service" for _, _, o in sink.events)
    # the watch ended normally: watched again from the last RV, no LIST in between
    assert api.kinds() == ["list", "watch@10", "watch@13"]


def test_bookmark_moves_the_resource_version_only() -> None:
    r, api, sink, _ = make(ListResp([], "10"), WatchResp(ev("ADDED", "a", "11"), bookmark("15")),
                           WatchResp(bookmark("17")))
    r.run()
    assert [e[1] for e in sink.events] == ["ADDED"]
    assert api.kinds() == ["list", "watch@10", "watch@15", "watch@17"]
    assert r.resource_version == "17"


def test_events_split_across_chunks_and_blank_lines() -> None:
    line = json.dumps(ev("ADDED", "a", "11")).encode() + b"\n"
    r, _, sink, _ = make(ListResp([], "10"), WatchResp(line[:7], line[7:] + b"\n", b"\n"))
    r.run()
    assert sink.log[1:] == [("ADDED", "Service", "a")]


def test_watch_arguments() -> None:
    r, api, _, _ = make(ListResp([], "1"), *(WatchResp(bookmark(str(i))) for i in range(2, 40)),
                        min_watch_timeout=300, max_watch_timeout=600, socket_timeout=30,
                        connect_timeout=5)
    r.run()
    watches = [c for c in api.calls if c.get("watch")]
    assert len(watches) == 39
    timeouts = [c["timeout_seconds"] for c in watches]
    assert all(isinstance(t, int) and 300 <= t < 600 for t in timeouts)
    assert len(set(timeouts)) > 10  # randomised, spreading reconnects
    for c in watches:
        assert c["allow_watch_bookmarks"] is True and c["_preload_content"] is False
        # the socket read timeout outlasts the server-side timeout
        assert c["_request_timeout"] == (5, c["timeout_seconds"] + 30)
        assert "limit" not in c and "_continue" not in c


def test_selectors_are_passed_to_list_and_watch() -> None:
    r, api, _, _ = make(ListResp([], "1"), WatchResp(bookmark("2")),
                        label_selector="!a,!b", field_selector="metadata.name=n")
    r.run()
    assert len(api.calls) == 3
    for c in api.calls:
        assert c["label_selector"] == "!a,!b" and c["field_selector"] == "metadata.name=n"
    r, api, _, _ = make(ListResp([], "1"))
    r.run()
    assert "label_selector" not in api.calls[0] and "field_selector" not in api.calls[0]


# --------------------------------------------------------------------------- 410


def test_gone_error_event_relists() -> None:
    r, api, sink, waits = make(ListResp([svc("a"), svc("b")], "10"),
                               WatchResp(ev("MODIFIED", "a", "11"), gone_event()),
                               ListResp([svc("a", "60")], "60"))
    with structlog.testing.capture_logs() as logs:
        r.run()
    assert api.kinds() == ["list", "watch@10", "list", "watch@60"]
    assert sink.log == [("replace", "Service", "a", "b"), ("MODIFIED", "Service", "a"),
                        ("replace", "Service", "a")]  # b gone: the store works it out
    assert any(e["event"] == "resource version expired, re-listing" for e in logs)
    assert waits[0] == 0.8  # client-go backs off between ListAndWatch attempts


def test_gone_api_exception_on_watch_relists() -> None:
    r, api, _, _ = make(ListResp([], "10"), ApiException(status=410, reason="Gone"),
                        ListResp([], "70"))
    r.run()
    assert api.kinds() == ["list", "watch@10", "list", "watch@70"]


# --------------------------------------------------------------------------- errors


def test_errors_back_off_exponentially_capped_and_reset_after_success() -> None:
    refused = ConnectionRefusedError(111, "Connection refused")
    r, api, _, waits = make(ListResp([], "10"), *[refused] * 6,
                            WatchResp(ev("ADDED", "a", "11")), refused, refused,
                            backoff_initial=1, backoff_max=8)
    r.run()
    # the watch is retried from the last RV, never re-listed
    assert api.kinds() == ["list"] + ["watch@10"] * 7 + ["watch@11"] * 3
    assert waits == [1, 2, 4, 8, 8, 8, 1, 2]  # an event reset the backoff


def test_backoff_jitter_stays_within_base_and_cap() -> None:
    b = Backoff(0.8, 30, 1.0, random.Random(7))
    bases = [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30, 30]
    delays = [b.next() for _ in bases]
    for d, base in zip(delays, bases, strict=True):
        assert base <= d <= min(30, 2 * base)
    assert len(set(delays[:5])) == 5
    b.reset()
    assert 0.8 <= b.next() <= 1.6


def test_stream_failures_rewatch_from_the_last_resource_version() -> None:
    r, api, sink, waits = make(
        ListResp([], "10"),
        WatchResp(ev("ADDED", "a", "11"), OSError("connection reset")),
        WatchResp(ev("ADDED", "b", "12"), b"{not json\n"),
        WatchResp({"type": "ERROR", "object": {"kind": "Status", "code": 500,
                                               "reason": "InternalError", "message": "boom"}}),
        WatchResp({"type": "WHATEVER", "object": {}}),
        WatchResp(b"[1, 2]\n"),
        WatchResp(ev("ADDED", "c", "13")))
    with structlog.testing.capture_logs() as logs:
        r.run()
    assert api.kinds() == ["list", "watch@10", "watch@11", "watch@12", "watch@12", "watch@12",
                           "watch@12", "watch@13"]
    assert [e[2]["metadata"]["name"] for e in sink.events] == ["a", "b", "c"]
    failed = [e for e in logs if e["event"] == "watch failed"]
    assert len(failed) == 5 and all(e["kind"] == "Service" for e in failed)
    assert "InternalError" in failed[2]["error"]
    assert len(waits) == 5


def test_very_short_empty_watch_counts_as_a_failure() -> None:
    r, api, _, waits = make(ListResp([], "10"), WatchResp(), WatchResp(),
                            backoff_initial=1, backoff_max=8)
    r.run()
    assert api.kinds() == ["list", "watch@10", "watch@10", "watch@10"]
    assert waits == [1, 2]


def test_sink_failure_is_retried() -> None:
    class Flaky(Sink):
        fail = True

        def replace(self, kind: str, items: list[dict[str, Any]]) -> None:
            if self.fail:
                self.fail = False
                raise RuntimeError("sink broke")
            super().replace(kind, items)

    stop = threading.Event()
    api, sink = Api(stop, ListResp([], "3"), ListResp([svc("a")], "4")), Flaky()
    Reflector("Service", api, sink, stop, wait=lambda d: stop.is_set()).run()
    assert sink.log == [("replace", "Service", "a")]


def test_responses_are_released() -> None:
    page, watch = ListResp([], "10"), WatchResp(ev("ADDED", "a", "11"))
    r, _, _, _ = make(page, watch)
    r.run()
    assert page.released and watch.closed and watch.released


# --------------------------------------------------------------------------- stop


def test_stop_interrupts_a_blocked_watch_promptly() -> None:
    stop = threading.Event()
    watch = WatchResp(ev("ADDED", "a", "11"), block=True)
    api, sink = Api(stop, ListResp([], "10"), watch), Sink()
    r = Reflector("Service", api, sink, stop)
    t = threading.Thread(target=r.run, daemon=True)
    t.start()
    assert watch.reading.wait(2)
    started = time.monotonic()
    r.stop()
    t.join(1)
    assert not t.is_alive() and time.monotonic() - started < 1
    assert watch.shut.is_set() and watch.closed
    assert len(api.calls) == 2  # no reconnect after stop


def test_stop_ends_a_backoff_wait() -> None:
    stop = threading.Event()
    api = Api(stop, *[ConnectionRefusedError()] * 5)
    r = Reflector("Service", api, Sink(), stop, backoff_initial=30)
    t = threading.Thread(target=r.run, daemon=True)
    t.start()
    while not api.calls:
        time.sleep(0.01)
    time.sleep(0.05)
    stop.set()
    t.join(1)
    assert not t.is_alive() and len(api.calls) == 1


def test_stop_during_the_request_closes_the_response() -> None:
    stop = threading.Event()
    watch = WatchResp(block=True)

    def list_fn(**kw: Any) -> Any:
        if not kw.get("watch"):
            return ListResp([], "1")
        stop.set()  # stop arrives while the watch request is on its way
        return watch

    Reflector("Service", list_fn, Sink(), stop).run()
    assert watch.closed and not watch.reading.is_set()


def test_start_reflectors_watches_four_kinds_and_stops_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stop = threading.Event()
    watches: list[WatchResp] = []
    calls: list[tuple[str, dict[str, Any]]] = []
    lock = threading.Lock()

    def fn(name: str) -> Any:
        def list_fn(**kw: Any) -> Any:
            with lock:
                calls.append((name, kw))
                if not kw.get("watch"):
                    return ListResp([], "1")
                watches.append(WatchResp(block=True))
                return watches[-1]
        return list_fn

    names = {rest.SERVICES: "services", rest.ENDPOINT_SLICES: "endpointslices",
             rest.NODES: "nodes", rest.SERVICE_CIDRS: "servicecidrs"}
    monkeypatch.setattr(rest, "Get", lambda api, path: fn(names[path]))
    sink = Sink()
    threads = start_reflectors(object(), "node-a", sink, stop)
    assert len(threads) == 4 and all(t.daemon for t in threads)
    deadline = time.monotonic() + 2
    while len(watches) < 4 or not all(w.reading.is_set() for w in watches):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert sorted(k for k, _ in sink.replaced) == ["EndpointSlice", "Node", "Service",
                                                   "ServiceCIDR"]
    sel = {name: (kw.get("label_selector"), kw.get("field_selector")) for name, kw in calls}
    assert sel == {"services": (LABEL_SELECTOR, None), "endpointslices": (LABEL_SELECTOR, None),
                   "nodes": (None, "metadata.name=node-a"), "servicecidrs": (None, None)}
    stop.set()
    for t in threads:
        t.join(1)
        assert not t.is_alive()
    assert all(w.closed for w in watches)


def test_a_list_is_logged() -> None:
    with structlog.testing.capture_logs() as logs:
        make(ListResp([], "1"))[0].run()
    assert {"event": "listed", "kind": "Service", "items": 0, "resource_version": "1",
            "log_level": "info"} in logs


def test_an_optional_kind_the_server_does_not_serve_stops_quietly() -> None:
    """A cluster before 1.33 has no ServiceCIDR API: its reflector ends at the first 404
    instead of retrying forever (the three kinds the first sync waits for are not optional)."""
    calls = []

    def list_fn(**kw: Any) -> Any:
        calls.append(kw)
        raise ApiException(status=404, reason="Not Found")

    stop = threading.Event()
    r = Reflector("ServiceCIDR", list_fn, Sink(), stop, optional=True, wait=lambda d: False)
    with structlog.testing.capture_logs() as logs:
        r.run()
    assert len(calls) == 1
    assert any(e["event"] == "not served by this API server; not watched" for e in logs)
