"""The lab guest's path to a control plane on the host.

`serve_control` runs, on the host, a small HTTP control server next to the API server for what
a guest cannot do through the API (stop, start, compact, move etcd's revision on, read the
audit log); `guest_info` is what the guest needs to find both; `Remote` is the guest's side: a
`Client` of the API server at 10.0.2.2 (qemu's user network forwards it to the host's
127.0.0.1) with the control calls. Starting etcd and kube-apiserver inside the emulated guest
takes ~45 s against ~4 s on the host, which is why they run there. Standard library only.
"""

from __future__ import annotations

import functools
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from integration.upstream.client import Client, Obj
from integration.upstream.controlplane import GUEST_SIDE_ADDRESS, ControlPlane

Extra = Mapping[tuple[str, str], Callable[[dict[str, str]], Any]]


def serve_control(cp: ControlPlane, host: str = "127.0.0.1", extra: Extra | None = None
                  ) -> ThreadingHTTPServer:
    """An HTTP server on `host`, free port, for a lab guest's tests to do what the API does not:
    POST /stop[?kill=1], /start (the API server), /compact, /etcd-bump (etcd; each answers the
    revision); GET /running, /starts, /compacted?revision=N, /etcd-revision, /audit?user=U;
    and `extra`'s (method, path) actions, each called with the query's parameters (the
    side-by-side bench's POST /load). One request at a time; an error answers 500 with its
    message. Call `shutdown()`, then `cp.close()`."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _do(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            q = dict(urllib.parse.parse_qsl(url.query))
            actions: dict[tuple[str, str], Callable[[], Any]] = {
                ("POST", "/stop"): lambda: cp.stop(kill=q.get("kill") == "1"),
                ("POST", "/start"): lambda: cp.start().timings,
                ("POST", "/compact"): cp.compact,
                ("POST", "/etcd-bump"): cp.etcd_bump,
                ("GET", "/compacted"): lambda: cp.compacted(int(q["revision"])),
                ("GET", "/etcd-revision"): cp.etcd_revision,
                ("GET", "/running"): lambda: cp.running,
                ("GET", "/starts"): lambda: cp.starts,
                ("GET", "/audit"): lambda: cp.audit(q.get("user")),
            }
            for key, fn in (extra or {}).items():
                actions[key] = functools.partial(fn, q)
            action = actions.get((self.command, url.path))
            if action is None:
                self._answer(404, {"error": f"no {self.command} {url.path}"})
                return
            try:
                with lock:
                    result = action()
            except Exception as exc:
                self._answer(500, {"error": f"{type(exc).__name__}: {exc}"})
                return
            self._answer(200, {"result": result})

        do_GET = do_POST = _do

    server = ThreadingHTTPServer((host, 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="controlplane-control",
                     daemon=True).start()
    return server


def guest_info(cp: ControlPlane, control: ThreadingHTTPServer) -> Obj:
    """What a lab guest needs to reach the control plane on the host (`Remote.from_file`)."""
    return {"url": f"https://{GUEST_SIDE_ADDRESS}:{cp.port}",
            "control": f"http://{GUEST_SIDE_ADDRESS}:{control.server_address[1]}",
            "ca_pem": cp.ca_pem, "admin_token": cp.admin_token,
            "host_url": cp.url, "apiserver_argv": cp.apiserver_argv()}


class Remote(Client):
    """A control plane on the host, from a lab guest: the API server at 10.0.2.2 through qemu's
    user network, and `stop`, `start`, `compact`, `etcd_bump` through its control server."""

    def __init__(self, info: Obj) -> None:
        self.url, self.control = info["url"], info["control"]
        self.ca_pem, self.admin_token = info["ca_pem"], info["admin_token"]
        self.info = info

    @classmethod
    def from_file(cls, path: str | Path) -> Remote:
        return cls(json.loads(Path(path).read_text()))

    def call(self, method: str, path: str, timeout: float = 180.0) -> Any:
        """One call to the control server (an `extra` action too); its answer's result."""
        return self._control(method, path, timeout)

    def _control(self, method: str, path: str, timeout: float = 180.0) -> Any:
        req = urllib.request.Request(self.control + path, method=method,
                                     data=b"" if method == "POST" else None)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())["result"]
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"control plane {method} {path}: {e.code} {e.read()[:500]!r}"
                               ) from None

    def stop(self, kill: bool = False) -> None:
        self._control("POST", "/stop" + ("?kill=1" if kill else ""))

    def start(self) -> Any:
        return self._control("POST", "/start")

    def running(self) -> bool:
        return bool(self._control("GET", "/running"))

    @property
    def starts(self) -> list[tuple[float, float]]:
        return [(a, b) for a, b in self._control("GET", "/starts")]

    def compact(self) -> int:
        return int(self._control("POST", "/compact"))

    def compacted(self, revision: int) -> bool:
        return bool(self._control("GET", f"/compacted?revision={revision}"))

    def etcd_bump(self) -> int:
        return int(self._control("POST", "/etcd-bump"))

    def etcd_revision(self) -> int:
        return int(self._control("GET", "/etcd-revision"))

    def audit(self, user: str | None = None) -> list[Obj]:
        query = "?" + urllib.parse.urlencode({"user": user}) if user else ""
        return list(self._control("GET", "/audit" + query))


def unready(event: Obj, starts: Iterable[tuple[float, float]]) -> bool:
    """Whether an audit event came while the API server was starting (not yet ready)."""
    return any(spawned <= event["time"] <= ready for spawned, ready in starts)
