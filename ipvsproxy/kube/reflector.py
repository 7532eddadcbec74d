"""List-then-watch of one kind of object from the API server, as raw JSON, into the store.

This module owns the proxy's connection to the API server after start-up: one `Reflector` per
kind (Services, EndpointSlices, the own Node), each on its own daemon thread, keeping the sink
(daemon/store.py: `replace` for a complete list, `event` for a watch event) equal to the cluster.
It follows client-go's reflector (k8s.io/client-go/tools/cache/reflector.go, ListAndWatch):

* a consistent, paginated LIST (`limit`/`continue`, all pages from the first page's snapshot),
  handed over whole so the store can work out what was deleted meanwhile;
* a WATCH from the list's resourceVersion with bookmarks and a server-side timeout randomised
  in [min, max) to spread reconnects over time (client-go: [5 min, 10 min));
* a watch that ends normally is reopened from the last resourceVersion seen, without a LIST;
* 410 Gone (a watch ERROR event, or an HTTP 410 on a watch or on a `continue` token) means the
  history is compacted: LIST again;
* other failures are logged and retried after a capped, jittered exponential backoff (client-go:
  0.8 s doubling to 30 s, jitter 1.0), resuming the watch if a resourceVersion is known.

Raw JSON (`_preload_content=False`) rather than the client's model objects, which cost ~22 KB
and ~200 us per EndpointSlice (shared/reference/libraries.md §4.4); `Watch(deserialize=False)`
is not used either, as it mishandles ERROR events and never tracks the resourceVersion (§4.2).
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import structlog

from ipvsproxy.kube import rest
from ipvsproxy.kube.listing import LABEL_SELECTOR

log = structlog.get_logger("ipvsproxy.reflector")

CHANGES = ("ADDED", "MODIFIED", "DELETED")
# client-go reports a watch closed within a second without any event as an error ("very short
# watch"): a server that accepts watches and drops them at once must not be hammered.
SHORT_WATCH = 1.0


class Sink(Protocol):
    """Where listed and watched objects go. A list arrives page by page (first: it starts over,
    as after an expired continue token), then list_done: what was held and not listed is gone."""

    def list_page(self, kind: str, items: list[dict[str, Any]], first: bool) -> None: ...
    def list_done(self, kind: str) -> None: ...
    def event(self, kind: str, type_: str, obj: dict[str, Any]) -> None: ...


class Gone(Exception):
    """410: the resourceVersion (or continue token) is older than the API server's history."""


class _Stopped(Exception):
    pass


class Backoff:
    """Capped exponential backoff with jitter: initial, 2x, 4x ... up to `cap`, each delay
    stretched by up to `jitter` times itself (wait.Jitter in client-go). Unlike client-go, whose
    jitter may take a delay to twice its cap, no delay here exceeds `cap`."""

    def __init__(self, initial: float, cap: float, jitter: float, rng: random.Random) -> None:
        self.initial, self.cap, self.jitter, self.rng = initial, cap, jitter, rng
        self._base = initial

    def next(self) -> float:
        base, self._base = self._base, min(self._base * 2, self.cap)
        return min(self.cap, base * (1 + self.jitter * self.rng.random()))

    def reset(self) -> None:
        self._base = self.initial


class Reflector:
    """Keeps `sink` up to date with one kind of object until `stop` is set.

    `list_fn` takes the keywords of the `kubernetes` client's list methods (a `rest.Get`, or
    e.g. `CoreV1Api.list_service_for_all_namespaces`); it serves both LIST and WATCH. Call `stop()`
    (or `interrupt()` after setting the event) to end a blocking read at once.

    `page` is the LIST page size; the server ends each watch after a whole number of seconds
    drawn from [min_watch_timeout, max_watch_timeout); `socket_timeout` bounds each socket read
    of a LIST, and of a WATCH beyond its server-side timeout; `wait(delay)` sleeps a backoff
    and returns True when stopped (default `stop.wait`; tests record the delays instead).
    """

    def __init__(self, kind: str, list_fn: Callable[..., Any], sink: Sink,
                 stop: threading.Event, *, label_selector: str | None = None,
                 field_selector: str | None = None, page: int = 500,
                 min_watch_timeout: float = 300, max_watch_timeout: float = 600,
                 socket_timeout: float = 60, connect_timeout: float = 10,
                 backoff_initial: float = 0.8, backoff_max: float = 30, jitter: float = 1.0,
                 rng: random.Random | None = None,
                 wait: Callable[[float], bool] | None = None, optional: bool = False) -> None:
        self.kind = kind
        self.optional = optional  # a 404 on the first list: the API is absent; stop quietly
        self._list_fn = list_fn
        self._sink = sink
        self._stop = stop
        self._selectors = {k: v for k, v in (("label_selector", label_selector),
                                             ("field_selector", field_selector)) if v}
        self._page = page
        self._watch_timeouts = (min_watch_timeout, max_watch_timeout)
        self._socket_timeout = socket_timeout
        self._connect_timeout = connect_timeout
        self._rng = rng or random.Random()
        self.backoff = Backoff(backoff_initial, backoff_max, jitter, self._rng)
        self._wait = wait or stop.wait  # returns True once stopped
        self._lock = threading.Lock()
        self._resp: Any = None  # the open response, for interrupt()
        # The last resourceVersion seen (list, event or bookmark); None: LIST before watching.
        self.resource_version: str | None = None

    # ------------------------------------------------------------------------------- control

    def stop(self) -> None:
        self._stop.set()
        self.interrupt()

    def interrupt(self) -> None:
        """Unblock a read in progress: shut the socket down (urllib3's `shutdown()`, what
        `kubernetes.watch.Watch.stop` does too: closing alone does not wake a blocked recv),
        then close. The reading thread sees an error, finds `stop` set and returns."""
        with self._lock:
            resp = self._resp
            if resp is None:
                return
            for name in ("shutdown", "close"):
                with contextlib.suppress(Exception):
                    getattr(resp, name)()

    # ---------------------------------------------------------------------------------- loop

    def run(self) -> None:
        while not self._stop.is_set():
            listing = self.resource_version is None
            try:
                if listing:
                    self._list()
                    listing = False
                self._watch()
                continue  # ended normally: watch again from the last resourceVersion
            except _Stopped:
                break
            except Exception as exc:
                if self._stop.is_set():
                    break
                if self.optional and listing and getattr(exc, "status", None) == 404:
                    log.info("not served by this API server; not watched", kind=self.kind)
                    break
                # client-go waits out its backoff between ListAndWatch attempts, after a 410
                # too: a server that keeps failing is not hammered.
                delay = self.backoff.next()
                if _is_gone(exc):
                    # The history is compacted: only a fresh LIST catches up, and the store's
                    # `replace` turns what vanished meanwhile into deletions.
                    self.resource_version = None
                    log.info("resource version expired, re-listing", kind=self.kind,
                             error=_describe(exc), retry_in=round(delay, 2))
                else:
                    log.warning("list failed" if listing else "watch failed", kind=self.kind,
                                error=_describe(exc), retry_in=round(delay, 2),
                                resource_version=self.resource_version)
            if self._wait(delay):
                break
        log.debug("reflector stopped", kind=self.kind)

    # ---------------------------------------------------------------------------------- LIST

    def _list(self) -> None:
        """Every page into the sink as it is read, then list_done. An expired continue token
        (410) restarts the list at once, as client-go's pager does; a second 410 in a row goes
        to the backoff."""
        for attempt in (1, 2):
            try:
                count, rv = self._pages()
            except Exception as exc:
                if attempt == 1 and _is_gone(exc) and not self._stop.is_set():
                    log.info("list continue token expired, restarting list", kind=self.kind)
                    continue
                raise
            self._sink.list_done(self.kind)
            self.resource_version = rv
            self.backoff.reset()
            log.info("listed", kind=self.kind, items=count, resource_version=rv)
            return

    def _pages(self) -> tuple[int, str]:
        count = 0
        token: str | None = None
        rv: str | None = None
        while True:
            kw: dict[str, Any] = {"limit": self._page}
            if token:
                kw["_continue"] = token
            resp = self._call(_request_timeout=(self._connect_timeout, self._socket_timeout),
                              **kw)
            try:
                body = json.loads(resp.data)
            finally:
                self._done(resp)
            meta = body.get("metadata") or {}
            # every page comes from the first page's snapshot: its RV is the one to watch from
            rv = rv or meta.get("resourceVersion")
            items = body.get("items") or []
            for item in items:
                item["kind"] = self.kind  # list items carry no kind
            token = meta.get("continue")
            del body
            if token or rv:  # (a last page without a resourceVersion is refused below)
                self._sink.list_page(self.kind, items, first=count == 0)
            count += len(items)
            del items
            if not token:
                if not rv:
                    raise ValueError("list without metadata.resourceVersion")
                return count, rv

    # --------------------------------------------------------------------------------- WATCH

    def _watch(self) -> None:
        """One watch connection, until the server ends it (normal return) or it fails."""
        lo, hi = self._watch_timeouts
        timeout = max(1, int(self._rng.uniform(lo, hi)))  # timeoutSeconds is an integer
        rv = self.resource_version
        started = time.monotonic()
        # The read timeout outlasts the server-side timeout: a stream silent for longer than
        # that is a dead connection (a half-open TCP connection would otherwise block forever).
        resp = self._call(watch=True, resource_version=rv, allow_watch_bookmarks=True,
                          timeout_seconds=timeout,
                          _request_timeout=(self._connect_timeout,
                                            timeout + self._socket_timeout))
        events = 0
        try:
            for line in _lines(resp):
                if self._stop.is_set():
                    raise _Stopped
                if not line:
                    continue
                self._handle(json.loads(line))
                events += 1
                if events == 1:
                    self.backoff.reset()
        finally:
            self._done(resp, close=True)
        if self._stop.is_set():
            raise _Stopped
        if events == 0 and time.monotonic() - started < SHORT_WATCH:
            raise ConnectionError("very short watch: closed within a second without any event")
        log.debug("watch ended", kind=self.kind, events=events, resource_version=rv)

    def _handle(self, ev: Any) -> None:
        if not isinstance(ev, dict) or not isinstance(ev.get("object"), dict):
            raise ValueError(f"malformed watch event: {str(ev)[:200]}")
        type_, obj = ev.get("type"), ev["object"]
        if type_ == "ERROR":
            code, msg = obj.get("code"), obj.get("message")
            if code == 410:
                raise Gone(msg)
            raise RuntimeError(f"watch error {code} {obj.get('reason')}: {msg}")
        meta = obj.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if type_ in CHANGES:
            obj["kind"] = self.kind
            self._sink.event(self.kind, type_, obj)
        elif type_ != "BOOKMARK":  # a bookmark only moves the resourceVersion on
            raise ValueError(f"unknown watch event type {type_!r}")
        if rv:
            self.resource_version = rv

    # ------------------------------------------------------------------------------- requests

    def _call(self, **kw: Any) -> Any:
        resp = self._list_fn(_preload_content=False, **self._selectors, **kw)
        with self._lock:
            self._resp = resp
        if self._stop.is_set():  # stop() came while the request was on its way
            self._done(resp, close=True)
            raise _Stopped
        return resp

    def _done(self, resp: Any, close: bool = False) -> None:
        # Forget the response before giving the connection back to the pool, so interrupt()
        # can never shut down a connection another reflector is reusing.
        with self._lock:
            if self._resp is resp:
                self._resp = None
        with contextlib.suppress(Exception):
            if close:
                resp.close()
            resp.release_conn()


def _lines(resp: Any) -> Iterator[str]:
    """The lines of a watch stream as its chunks arrive (`resp.stream()`), invalid UTF-8
    replaced: what the client's iter_resp_lines gives. The API server writes each event in a
    chunk of its own, and such a chunk is taken as it is, where iter_resp_lines copies every
    event through its buffer three times (1.5 us an event)."""
    buf = bytearray()
    for seg in resp.stream(amt=None, decode_content=False):
        if isinstance(seg, str):
            seg = seg.encode()
        end = seg.find(b"\n")
        if end == len(seg) - 1 and end >= 0 and not buf:  # one whole line
            yield seg[:end].decode("utf-8", "replace")
            continue
        buf += seg
        if end < 0:
            continue
        *lines, tail = buf.split(b"\n")
        buf = bytearray(tail)
        for line in lines:
            yield line.decode("utf-8", "replace")


def _is_gone(exc: BaseException) -> bool:
    return isinstance(exc, Gone) or getattr(exc, "status", None) == 410


def _describe(exc: BaseException) -> str:
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status is not None and reason:  # ApiException: its str() carries headers and body
        return f"{status} {reason}"
    return f"{type(exc).__name__}: {exc}"[:500]


def start_reflectors(api_client: Any, node_name: str, sink: Sink, stop: threading.Event,
                     **options: Any) -> list[threading.Thread]:
    """Start the Service, EndpointSlice, Node and ServiceCIDR reflectors on daemon threads;
    returns them.

    Setting `stop` ends them within about a second: one more daemon thread waits for it and
    interrupts the blocked reads. `options` go to every `Reflector` (tests shorten timeouts).
    """
    reflectors = [
        # kube-proxy's selector: skip headless services and those of another proxy
        Reflector("Service", rest.Get(api_client, rest.SERVICES), sink, stop,
                  label_selector=LABEL_SELECTOR, **options),
        Reflector("EndpointSlice", rest.Get(api_client, rest.ENDPOINT_SLICES), sink, stop,
                  label_selector=LABEL_SELECTOR, **options),
        Reflector("Node", rest.Get(api_client, rest.NODES), sink, stop,
                  field_selector=f"metadata.name={node_name}", **options),
        # the service ranges no tenant address may be in (core/desired.py screened)
        Reflector("ServiceCIDR", rest.Get(api_client, rest.SERVICE_CIDRS), sink, stop,
                  optional=True, **options),
    ]
    threads = [threading.Thread(target=r.run, name=f"reflector-{r.kind}", daemon=True)
               for r in reflectors]
    for t in threads:
        t.start()

    def interrupt_on_stop() -> None:
        stop.wait()
        for r in reflectors:
            r.interrupt()

    threading.Thread(target=interrupt_on_stop, name="reflector-stop", daemon=True).start()
    return threads
