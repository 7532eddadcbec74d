"""An in-process fake Kubernetes API server for tests: Services, EndpointSlices and Nodes over
plain HTTP, good enough for the official `kubernetes` client to LIST (with limit/continue
pagination served as a consistent snapshot) and WATCH (chunked newline-delimited JSON, replay
from a resourceVersion, bookmarks, timeoutSeconds, 410 Gone below the compaction floor), with
label and field selectors and the real API server's selector transitions on watches.

It owns the store (every version of every object since start, and the event log), the HTTP
handler and the knobs tests turn: `put`, `delete`, `load`, `compact`, `cut_watches`, `stop` and
`start` again on the same port. Standard library only.

It authorizes nothing unless asked: `enforce_rbac(token, rules)` makes it authenticate every
request by its bearer token (401 otherwise) and authorize it as the real API server's RBAC does
(403 with the real message otherwise), before serving anything and before the 405 of its
read-only methods, recording each refusal in `refused`. A request is mapped to the (API group,
resource, verb) RBAC matches by `request_attributes`, k8s.io/apiserver's RequestInfo; the rules
come from PolicyRules (`rules_of` a ClusterRole) or `PROXY_RULES`, what `ipvsproxy run` needs.
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import copy
import json
import re
import socket
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)
# kind -> (apiVersion, collection path)
KINDS = {"Service": ("v1", "/api/v1/services"),
         "EndpointSlice": ("discovery.k8s.io/v1", "/apis/discovery.k8s.io/v1/endpointslices"),
         "Node": ("v1", "/api/v1/nodes"),
         "ServiceCIDR": ("networking.k8s.io/v1", "/apis/networking.k8s.io/v1/servicecidrs")}
PATHS = {path: kind for kind, (_, path) in KINDS.items()}
DISCOVERY: dict[str, Obj] = {
    "/version": {"major": "1", "minor": "33", "gitVersion": "v1.33.0", "platform": "linux/amd64"},
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [{
        "name": "discovery.k8s.io", "versions": [{"groupVersion": "discovery.k8s.io/v1",
                                                  "version": "v1"}],
        "preferredVersion": {"groupVersion": "discovery.k8s.io/v1", "version": "v1"}}, {
        "name": "networking.k8s.io", "versions": [{"groupVersion": "networking.k8s.io/v1",
                                                   "version": "v1"}],
        "preferredVersion": {"groupVersion": "networking.k8s.io/v1", "version": "v1"}}]}}


class HttpError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def status(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    """A metav1.Status failure body, as the API server sends it."""
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                 "message": message, "reason": reason}
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def parse_selector(text: str, fields: bool = False) -> list[tuple[str, str, str]]:
    """`a,!b,c=d,e==f,g!=h` -> [(op, key, value)] with op one of exists, !exists, =, !=."""
    out = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        m = re.fullmatch(r"([^=!\s]+)\s*(==|=|!=)\s*([^=!\s]*)", term)
        if m:
            out.append(("!=" if m[2] == "!=" else "=", m[1], m[3]))
        elif not fields and re.fullmatch(r"!?[^=!\s]+", term):
            out.append(("!exists", term[1:], "") if term[0] == "!" else ("exists", term, ""))
        else:
            raise HttpError(400, "BadRequest", f"unable to parse requirement: {term!r}")
        if fields and m and m[1] not in ("metadata.name", "metadata.namespace"):
            raise HttpError(400, "BadRequest", f"field label not supported: {m[1]}")
    return out


def _matches(reqs: list[tuple[str, str, str]], values: dict[str, str]) -> bool:
    for op, key, value in reqs:
        have = values.get(key)
        if ((op == "exists" and have is None) or (op == "!exists" and have is not None)
                or (op == "=" and have != value) or (op == "!=" and have == value)):
            return False
    return True


@dataclass
class Query:
    """What a LIST or WATCH asked for, parsed from its query string."""
    labels: list[tuple[str, str, str]] = field(default_factory=list)
    fields: list[tuple[str, str, str]] = field(default_factory=list)

    def matches(self, obj: Obj) -> bool:
        md = obj.get("metadata") or {}
        return _matches(self.labels, md.get("labels") or {}) and _matches(
            self.fields, {"metadata.name": md.get("name", ""),
                          "metadata.namespace": md.get("namespace", "")})


# ------------------------------------------------------------------------------------- RBAC

# (API group, resource, verb): one entry of a PolicyRule expanded; "*" matches anything
Rule = tuple[str, str, str]
# What `ipvsproxy run` needs: its three reflectors list and watch Services, EndpointSlices and
# the own Node (kube/reflector.py), and nothing else.
PROXY_RULES: frozenset[Rule] = frozenset(
    (group, resource, verb) for group, resource in (
        ("", "services"), ("discovery.k8s.io", "endpointslices"), ("", "nodes"),
        ("networking.k8s.io", "servicecidrs"))
    for verb in ("list", "watch"))
# deploy/rbac.yaml's ServiceAccount, as the API server names it in a 403
PROXY_USER = "system:serviceaccount:kube-system:ipvsproxy"
_VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch",
          "DELETE": "delete"}
# The non-resource URLs the built-in system:discovery and system:public-info-viewer roles grant
# to every user: a trailing * matches any suffix, as in a PolicyRule's nonResourceURLs.
_PUBLIC_URLS = ("/api", "/api/*", "/apis", "/apis/*", "/openapi", "/openapi/*", "/version",
                "/version/", "/healthz", "/livez", "/readyz")


@dataclass(frozen=True)
class Attributes:
    """What RBAC decides a request on: the fields of k8s.io/apiserver's RequestInfo it reads.
    A non-resource request (discovery, /version) has no resource, only a path."""
    verb: str
    group: str = ""
    resource: str = ""  # "nodes", or "nodes/status" for a subresource
    namespace: str = ""
    name: str = ""
    path: str = ""

    @property
    def rule(self) -> Rule:
        return self.group, self.resource, self.verb


def watch_requested(query: dict[str, list[str]]) -> bool:
    """The `watch` parameter as the API server decodes it (Convert_Slice_string_To_bool): the
    first value; absent, "0" and "false" (any case) are false, anything else (even "") true."""
    values = query.get("watch") or []
    return bool(values) and values[0] != "0" and values[0].lower() != "false"


def request_attributes(method: str, path: str) -> Attributes:
    """A request's attributes as RequestInfoFactory.NewRequestInfo (k8s.io/apiserver
    pkg/endpoints/request/requestinfo.go) works them out, so the fake authorizes what the real
    one would: GET on a collection is list (watch with ?watch=...), on an object get; DELETE on a
    collection deletecollection; /namespaces/NS/... names the namespace, not the resource; a
    third part is a subresource (nodes/status); a list or watch selecting one metadata.name
    names that object. Paths under neither /api/VERSION nor /apis/GROUP/VERSION are
    non-resource requests, whose verb is the lower-case HTTP method."""
    url = urlsplit(path)
    parts = [p for p in url.path.split("/") if p]
    width = {"api": 2, "apis": 3}.get(parts[0] if parts else "")  # /api/V, /apis/GROUP/V
    if width is None or len(parts) <= width:
        return Attributes(method.lower(), path=url.path)
    group, parts = parts[1] if width == 3 else "", parts[width:]
    if parts[0] == "watch" and len(parts) > 1:  # the deprecated /api/v1/watch/... paths
        verb, parts = "watch", parts[1:]
    else:
        verb = _VERBS.get(method, "")
    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in ("status", "finalize"):  # not a namespace's own
            parts = parts[2:]
    resource = parts[0] if len(parts) < 3 else f"{parts[0]}/{parts[2]}"
    name = parts[1] if len(parts) > 1 else ""
    if not name and verb == "get":
        query = parse_qs(url.query, keep_blank_values=True)
        verb = "watch" if watch_requested(query) else "list"
        for term in (query.get("fieldSelector") or [""])[0].split(","):
            m = re.fullmatch(r"\s*metadata\.name\s*==?\s*([^=!\s]*)\s*", term)
            if m and m[1] not in (".", "..") and not set(m[1]) & {"/", "%"}:
                name = m[1]  # a valid path segment only, as the API server checks
                break
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(verb, group, resource, namespace, name)


def rbac_rule(http_method: str, path: str) -> Rule | None:
    """The (group, resource, verb) a request is authorized as; None for a non-resource request.
    /api/v1/nodes -> ("", "nodes", "list"), .../endpointslices?watch=true -> watch."""
    a = request_attributes(http_method, path)
    return a.rule if a.resource else None


def rules_of(role: Obj) -> set[Rule]:
    """The rules of a ClusterRole document: each PolicyRule's apiGroups x resources x
    verbs. The fake matches on those three only: a rule narrowed by resourceNames, or one for
    nonResourceURLs, is refused rather than silently widened or dropped."""
    out: set[Rule] = set()
    for rule in role.get("rules") or ():
        if rule.get("resourceNames") or rule.get("nonResourceURLs"):
            raise ValueError(f"not supported by the fake API server's RBAC: {rule}")
        out |= {(g, r, v) for g in rule.get("apiGroups") or () for r in rule.get("resources")
                or () for v in rule.get("verbs") or ()}
    return out


def _allows(rules: frozenset[Rule], a: Attributes) -> bool:
    """RBAC's rule matching (k8s.io/kubernetes pkg/apis/rbac/v1 evaluation_helpers.go): "*"
    matches any group, resource or verb, and "*/SUB" any resource's subresource SUB."""
    if not a.resource:
        return a.verb == "get" and any(
            a.path == u or (u.endswith("*") and a.path.startswith(u[:-1])) for u in _PUBLIC_URLS)
    sub = a.resource.partition("/")[2]
    return any(g in ("*", a.group) and v in ("*", a.verb)
               and (r in ("*", a.resource) or (sub and r == f"*/{sub}")) for g, r, v in rules)


def forbidden(user: str, a: Attributes) -> HttpError:
    """The API server's 403 (responsewriters.Forbidden, then apierrors.NewForbidden), word for
    word: `services is forbidden: User "..." cannot list resource "services" in API group ""
    at the cluster scope`, `nodes "a" is forbidden: ...`, `forbidden: User "..." cannot get path
    "/metrics"`. Go's %q quoting is JSON's for these ASCII strings."""
    q = json.dumps
    if not a.resource:
        return HttpError(403, "Forbidden", f"forbidden: User {q(user)} cannot {a.verb} path "
                                           f"{q(a.path)}", {})
    where = f"in the namespace {q(a.namespace)}" if a.namespace else "at the cluster scope"
    why = (f"User {q(user)} cannot {a.verb} resource {q(a.resource)} in API group {q(a.group)} "
           f"{where}")
    resource = a.resource.partition("/")[0]  # the GroupResource leaves the subresource out
    what = f"{resource}.{a.group}" if a.group else resource
    details = {k: v for k, v in (("name", a.name), ("group", a.group), ("kind", resource)) if v}
    return HttpError(403, "Forbidden", f"{what} {q(a.name)} is forbidden: {why}" if a.name
                     else f"{what} is forbidden: {why}", details)


@dataclass(frozen=True)
class _Rbac:
    token: str
    rules: frozenset[Rule]
    user: str


@dataclass
class Event:
    rv: int
    kind: str
    type: str  # ADDED, MODIFIED or DELETED
    obj: Obj
    prev: Obj | None  # the version before a MODIFIED


@dataclass(eq=False)
class _Watch:
    sock: socket.socket
    cut: bool = False


def key_of(obj: Obj) -> Key:
    md = obj["metadata"]
    return md.get("namespace") or "", md["name"]


class ApiServer:
    """The fake API server. All state is guarded by one lock; watches wait on its condition."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.bookmark_interval = 1.0
        self.requests: list[tuple[str, str]] = []
        self.gzipped = 0  # responses sent compressed (the client asked, and they were large)
        # (method, path, 401 or 403) of every request enforce_rbac() turned away
        self.refused: list[tuple[str, str, int]] = []
        self._rbac: _Rbac | None = None
        self._cond = threading.Condition()
        self._rv = 1
        self._floor = 1  # compaction: resourceVersions below it are gone (410)
        self._history: dict[str, dict[Key, list[tuple[int, Obj | None]]]] = {k: {} for k in KINDS}
        self._events: list[Event] = []
        self._event_rvs: list[int] = []
        self._conns: set[socket.socket] = set()
        self._watches: set[_Watch] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- lifecycle

    def start(self) -> None:
        server = _Server(("127.0.0.1", self.port), _Handler)
        server.api = self
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,),
                                        name=f"apiserver:{self.port}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Close the listening socket and every open connection, watches included."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._cond:
            server.closed = True
            self._cut(all_connections=True)
        if self._thread:
            self._thread.join()

    def kubeconfig(self, path: str | Path) -> Path:
        """Write a kubeconfig (JSON, which is YAML) pointing at this server, with the token
        enforce_rbac() was given if it was called first; returns the path."""
        user = {"token": self._rbac.token} if self._rbac else {}
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "fake",
               "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
               "users": [{"name": "fake", "user": user}],
               "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}
        Path(path).write_text(json.dumps(doc, indent=1))
        return Path(path)

    def enforce_rbac(self, token: str, rules: Iterable[Rule], user: str = PROXY_USER) -> None:
        """From now on, answer only requests bearing `token` (as `user`), and only what `rules`
        allow, plus the discovery URLs every user may read. Anything else is refused: 401
        without that token (as with --anonymous-auth=false: no anonymous user), 403 for what
        the rules do not allow."""
        with self._cond:
            self._rbac = _Rbac(token, frozenset(rules), user)

    def _authorize(self, method: str, path: str, authorization: str | None) -> None:
        """Raise the 401 or 403 HttpError the request gets, recording it in `refused`."""
        with self._cond:
            rbac = self._rbac
        if rbac is None:
            return
        scheme, _, token = (authorization or "").strip().partition(" ")
        a = request_attributes(method, path)
        if scheme.lower() != "bearer" or token != rbac.token:
            error = HttpError(401, "Unauthorized", "Unauthorized")
        elif not _allows(rbac.rules, a):
            error = forbidden(rbac.user, a)
        else:
            return
        with self._cond:
            self.refused.append((method, path, error.code))
        raise error

    def cut_watches(self) -> None:
        """Close every open watch connection abruptly (no terminating chunk)."""
        with self._cond:
            self._cut(all_connections=False)

    def _cut(self, all_connections: bool) -> None:
        socks = {w.sock for w in self._watches} | (self._conns if all_connections else set())
        for w in self._watches:
            w.cut = True
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self._cond.notify_all()

    # -- the store

    @property
    def resource_version(self) -> str:
        with self._cond:
            return str(self._rv)

    def put(self, obj: Obj) -> Obj:
        """Create or replace an object; returns a copy of it as stored."""
        with self._cond:
            stored = self._put(obj)
            self._cond.notify_all()
            return copy.deepcopy(stored)

    def load(self, objs: list[Obj]) -> None:
        with self._cond:
            for obj in objs:
                self._put(obj)
            self._cond.notify_all()

    def _put(self, obj: Obj) -> Obj:
        kind = obj["kind"]
        new = copy.deepcopy(obj)
        new.setdefault("apiVersion", KINDS[kind][0])
        md = new.setdefault("metadata", {})
        versions = self._history[kind].setdefault(key_of(new), [])
        prev = versions[-1][1] if versions else None
        old_md = prev["metadata"] if prev else {}
        md.setdefault("uid", old_md.get("uid") or str(uuid.uuid4()))
        md.setdefault("creationTimestamp", old_md.get("creationTimestamp")
                      or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        self._rv += 1
        md["resourceVersion"] = str(self._rv)
        versions.append((self._rv, new))
        self._record(Event(self._rv, kind, "MODIFIED" if prev else "ADDED", new, prev))
        return new

    def delete(self, kind: str, namespace: str, name: str) -> Obj:
        """Delete an object (KeyError if there is none); returns its last state."""
        with self._cond:
            versions = self._history[kind].get((namespace, name))
            if not versions or versions[-1][1] is None:
                raise KeyError(f"{kind} {namespace}/{name}")
            self._rv += 1
            gone = copy.deepcopy(versions[-1][1])
            assert gone is not None
            gone["metadata"]["resourceVersion"] = str(self._rv)
            versions.append((self._rv, None))
            self._record(Event(self._rv, kind, "DELETED", gone, None))
            self._cond.notify_all()
            return copy.deepcopy(gone)

    def objects(self) -> list[Obj]:
        """Every object that exists now, of every kind (copies)."""
        with self._cond:
            return [copy.deepcopy(obj) for kind in KINDS
                    for _, obj in self._snapshot(kind, self._rv)]

    def _record(self, event: Event) -> None:
        self._events.append(event)
        self._event_rvs.append(event.rv)

    def compact(self) -> None:
        """Move the compaction floor to the current resourceVersion: watches from an older one
        and continue tokens of an older list now get 410 Gone. Open watches are unaffected."""
        with self._cond:
            self._floor = self._rv

    def _snapshot(self, kind: str, rv: int) -> list[tuple[Key, Obj]]:
        out = []
        for key, versions in self._history[kind].items():
            i = bisect.bisect_right(versions, rv, key=lambda v: v[0])
            if i and (obj := versions[i - 1][1]) is not None:
                out.append((key, obj))
        return sorted(out, key=lambda ko: ko[0])

    # -- requests

    def list_page(self, kind: str, q: Query, limit: int, token: str | None) -> Obj:
        """One LIST page. The items share nested data with the store: serialize, don't mutate."""
        with self._cond:
            rv, start = self._rv, None
            if token:
                try:
                    doc = json.loads(base64.urlsafe_b64decode(token))
                    rv, start = int(doc["rv"]), tuple(doc["start"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise HttpError(400, "BadRequest", f"invalid continue token: {exc}") from None
                if rv < self._floor:
                    raise HttpError(410, "Expired", "The provided continue parameter is too old "
                                    "to display a consistent list result. You can start a new "
                                    "list without the continue parameter.")
            items = [(k, o) for k, o in self._snapshot(kind, rv)
                     if (start is None or k > start) and q.matches(o)]
        page = items[:limit] if limit > 0 else items
        meta: Obj = {"resourceVersion": str(rv)}
        if len(page) < len(items):
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(
                {"v": "meta.k8s.io/v1", "rv": rv, "start": list(page[-1][0])}).encode()).decode()
        # like the real API server, list items carry no kind and apiVersion
        items_out = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
                     for _, o in page]
        return {"kind": f"{kind}List", "apiVersion": KINDS[kind][0], "metadata": meta,
                "items": items_out}

    def get(self, kind: str, namespace: str, name: str) -> Obj:
        with self._cond:
            versions = self._history[kind].get((namespace, name))
            if not versions or versions[-1][1] is None:
                raise HttpError(404, "NotFound", f'{kind.lower()}s "{name}" not found')
            return copy.deepcopy(versions[-1][1])

    def _to_watch_event(self, e: Event, q: Query) -> Obj | None:
        """The event a watch with these selectors sees, as the API server's cacher does it."""
        now = q.matches(e.obj)
        before = e.prev is not None and q.matches(e.prev)
        if e.type == "MODIFIED" and before and not now:
            assert e.prev is not None
            gone = copy.deepcopy(e.prev)
            gone["metadata"]["resourceVersion"] = str(e.rv)
            return {"type": "DELETED", "object": gone}
        if e.type == "MODIFIED" and now and not before:
            return {"type": "ADDED", "object": e.obj}
        return {"type": e.type, "object": e.obj} if now else None

    def watch(self, h: _Handler, kind: str, q: Query, params: dict[str, str]) -> None:
        rv_param = params.get("resourceVersion", "")
        bookmarks = params.get("allowWatchBookmarks", "").lower() in ("true", "1")
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        deadline = time.monotonic() + timeout if timeout is not None else float("inf")
        w = _Watch(h.connection)
        initial: list[Obj] = []
        with self._cond:
            if rv_param in ("", "0"):
                pos = self._rv
                initial = [{"type": "ADDED", "object": o}
                           for _, o in self._snapshot(kind, pos) if q.matches(o)]
            elif not rv_param.isdigit():
                raise HttpError(400, "BadRequest", f"invalid resourceVersion {rv_param!r}")
            elif int(rv_param) < self._floor:
                pos = -1
            else:
                pos = int(rv_param)
            self._watches.add(w)
        try:
            h.start_chunked()
            if pos < 0:
                h.chunk({"type": "ERROR", "object": status(410, "Expired", (
                    f"too old resource version: {rv_param} ({self._floor})"))})
                h.end_chunked()
                return
            for ev in initial:
                h.chunk(ev)
            next_bookmark = time.monotonic() + self.bookmark_interval
            while True:
                wake = min(deadline, next_bookmark) if bookmarks else deadline
                with self._cond:
                    while not w.cut and pos >= self._rv and time.monotonic() < wake:
                        self._cond.wait(None if wake == float("inf") else wake - time.monotonic())
                    if w.cut:
                        h.close_connection = True
                        return
                    i = bisect.bisect_right(self._event_rvs, pos)
                    events = [out for e in self._events[i:] if e.kind == kind
                              and (out := self._to_watch_event(e, q)) is not None]
                    pos = self._rv
                for ev in events:
                    h.chunk(ev)
                now = time.monotonic()
                if bookmarks and (now >= next_bookmark or now >= deadline):
                    h.chunk({"type": "BOOKMARK", "object": {
                        "kind": kind, "apiVersion": KINDS[kind][0],
                        "metadata": {"resourceVersion": str(pos)}}})
                    next_bookmark = now + self.bookmark_interval
                if now >= deadline:
                    h.end_chunked()
                    return
        finally:
            with self._cond:
                self._watches.discard(w)


class _Server(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True
    api: ApiServer
    closed = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # cut by stop() or cut_watches()
            super().handle_error(request, client_address)


GZIP_THRESHOLD = 128 * 1024  # k8s.io/apiserver responsewriters defaultGzipThresholdBytes


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.api._cond:
            self.server.api._conns.add(self.connection)
            if self.server.closed:
                self.connection.shutdown(socket.SHUT_RDWR)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        with self.server.api._cond:
            self.server.api._conns.discard(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_json(self, code: int, body: Obj) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        # as the real one (apiserver responsewriters.deferredResponseWriter): gzip, level 1,
        # when the client accepts it and the answer is over 128 KiB
        if "gzip" in (self.headers.get("Accept-Encoding") or "") and len(data) > GZIP_THRESHOLD:
            z = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # the gzip format
            data = z.compress(data) + z.flush()
            self.send_header("Content-Encoding", "gzip")
            with self.server.api._cond:
                self.server.api.gzipped += 1
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_chunked(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def chunk(self, event: Obj) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def serve(self) -> None:
        """Every method: recorded, authorized (if enforce_rbac() was called) before anything
        else, a forbidden write included, then served: GET, or 405 for the read-only rest."""
        api = self.server.api
        with api._cond:
            api.requests.append((self.command, self.path))
        if self.command != "GET":  # read the body off the connection, which may be reused
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            api._authorize(self.command, self.path, self.headers.get("Authorization"))
            if self.command != "GET":
                raise HttpError(405, "MethodNotAllowed", "the fake API server is read-only")
            return self.serve_get()
        except HttpError as e:
            return self.send_json(e.code, status(e.code, e.reason, e.message, e.details))

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = serve

    def serve_get(self) -> None:
        api = self.server.api
        url = urlsplit(self.path)
        query = parse_qs(url.query, keep_blank_values=True)
        params = {k: v[-1] for k, v in query.items()}
        path = url.path.rstrip("/")
        try:
            if path in DISCOVERY:
                return self.send_json(200, DISCOVERY[path])
            if path.startswith("/api/v1/nodes/") and path.count("/") == 4:
                return self.send_json(200, api.get("Node", "", path.rsplit("/", 1)[1]))
            kind = PATHS.get(path)
            if kind is None:
                raise HttpError(404, "NotFound", "the server could not find the requested resource")
            q = Query(parse_selector(params.get("labelSelector", "")),
                      parse_selector(params.get("fieldSelector", ""), fields=True))
            # read as the authorizer reads it: a request authorized as a list never watches
            if watch_requested(query):
                return api.watch(self, kind, q, params)
            limit = int(params.get("limit") or 0)
            return self.send_json(200, api.list_page(kind, q, limit, params.get("continue")))
        except HttpError as e:
            return self.send_json(e.code, status(e.code, e.reason, e.message))
        except ValueError as e:
            return self.send_json(400, status(400, "BadRequest", str(e)))
        except OSError:  # the client went away, or stop() / cut_watches() cut the connection
            self.close_connection = True
