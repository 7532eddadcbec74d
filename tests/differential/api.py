"""A small client for the real API server, from a kubeconfig: what the differential suite writes.

It runs where the proxies run (inside the lab guest, which reaches the API server on the host
through qemu's user network), so it is built from a kubeconfig file (server, CA, bearer token),
not from integration/upstream/controlplane.py's ControlPlane object, which lives on the host.
It applies generate.py's `Change`s (create, replace, status, delete), loads a whole cluster and
removes everything a cluster made. Standard library only.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.differential.generate import (
    LABEL_MANAGED_BY,
    MANAGED_BY,
    Change,
    Cluster,
    Obj,
)

# kind -> (apiVersion, plural, namespaced)
KINDS: dict[str, tuple[str, str, bool]] = {
    "Service": ("v1", "services", True),
    "EndpointSlice": ("discovery.k8s.io/v1", "endpointslices", True),
    "Node": ("v1", "nodes", False),
    "Namespace": ("v1", "namespaces", False),
}


class ApiError(Exception):
    def __init__(self, status: int, body: Any, what: str) -> None:
        message = body.get("message") if isinstance(body, dict) else str(body)[:300]
        super().__init__(f"{what}: {status} {message}")
        self.status, self.body = status, body


def path_of(kind: str, namespace: str = "", name: str = "", sub: str = "") -> str:
    version, plural, namespaced = KINDS[kind]
    base = f"/api/{version}" if "/" not in version else f"/apis/{version}"
    if namespaced:
        base += f"/namespaces/{namespace}"
    p = f"{base}/{plural}"
    if name:
        p += f"/{name}" + (f"/{sub}" if sub else "")
    return p


class Api:
    def __init__(self, server: str, ca_pem: str, token: str) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.ssl = ssl.create_default_context(cadata=ca_pem)
        self.warnings: list[str] = []

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Api:
        cfg = json.loads(path.read_text()) if path.read_text().lstrip().startswith("{") \
            else _yaml(path)
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
        ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
        return cls(cluster["server"], ca, user["token"])

    def request(self, method: str, path: str, body: Any = None, *,
                content_type: str = "application/json", query: dict[str, str] | None = None,
                timeout: float = 60.0) -> Any:
        url = self.server + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Accept": "application/json",
            "Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.ssl) as r:
                warn = r.headers.get_all("Warning") or []
                self.warnings.extend(warn)
                text = r.read()
        except urllib.error.HTTPError as e:
            payload = e.read()
            try:
                err: Any = json.loads(payload)
            except ValueError:
                err = payload.decode(errors="replace")
            raise ApiError(e.code, err, f"{method} {path}") from None
        return json.loads(text) if text else None

    # ---- objects

    def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            got: Obj = self.request("GET", path_of(kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return got

    def items(self, kind: str, namespace: str = "", selector: str = "") -> list[Obj]:
        query = {"labelSelector": selector} if selector else None
        got = self.request("GET", path_of(kind, namespace), query=query)
        return [dict(o, kind=kind, apiVersion=KINDS[kind][0]) for o in got.get("items", [])]

    def apply(self, change: Change, retry_for: float = 60.0) -> Obj | None:
        """One change. A create whose clusterIP or nodePort the server has not released yet
        (it releases them after a delete, asynchronously) is retried for `retry_for` s."""
        obj = change.obj
        kind, ns, name = obj["kind"], obj["metadata"].get("namespace", ""), \
            obj["metadata"]["name"]
        deadline = time.monotonic() + retry_for
        while True:
            try:
                if change.op == "create":
                    return self.request("POST", path_of(kind, ns), obj)  # type: ignore[no-any-return]
                if change.op == "replace":
                    return self.request("PUT", path_of(kind, ns, name), obj)  # type: ignore[no-any-return]
                if change.op == "status":
                    return self.request(  # type: ignore[no-any-return]
                        "PATCH", path_of(kind, ns, name, "status"), {"status": obj["status"]},
                        content_type="application/merge-patch+json")
                if change.op == "delete":
                    try:
                        self.request("DELETE", path_of(kind, ns, name))
                    except ApiError as exc:
                        if exc.status != 404:
                            raise
                    return None
                raise ValueError(change.op)
            except ApiError as exc:
                text = str(exc)
                busy = exc.status in (409, 422) and ("already allocated" in text
                                                     or "provided port is already" in text
                                                     or "object is being deleted" in text)
                if change.op == "create" and exc.status == 409 and kind == "Namespace":
                    return None
                if not busy or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def apply_all(self, changes: Iterable[Change]) -> None:
        for c in changes:
            self.apply(c)

    def load(self, cluster: Cluster) -> None:
        """Load a cluster into a server that holds none of its objects (see `reset`)."""
        for c in cluster.steps():
            if c.obj["kind"] == "Node" and self.get("Node", "", c.obj["metadata"]["name"]):
                self.apply(Change("delete", c.obj, "load"))
                self._gone("Node", "", c.obj["metadata"]["name"])
            self.apply(c)

    def reset(self, namespaces: Iterable[str], node: str) -> None:
        """Delete every Service and EndpointSlice of `namespaces` and the Node `node`, and wait
        until they are gone (namespaces stay: without a controller manager nobody would
        finish deleting one)."""
        for ns in namespaces:
            if self.get("Namespace", "", ns) is None:
                continue
            self.request("DELETE", path_of("EndpointSlice", ns))  # deletecollection
            for o in self.items("Service", ns):
                self.apply(Change("delete", o, "reset"))
        if self.get("Node", "", node) is not None:
            self.apply(Change("delete", {"kind": "Node", "metadata": {"name": node}}, "reset"))
        for ns in namespaces:
            if self.get("Namespace", "", ns) is None:
                continue
            for kind in ("EndpointSlice", "Service"):
                for o in self.items(kind, ns):
                    self._gone(kind, ns, o["metadata"]["name"])
        self._gone("Node", "", node)

    def _gone(self, kind: str, ns: str, name: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.get(kind, ns, name) is not None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{kind} {ns}/{name} still exists {timeout:.0f}s after its "
                                   "delete")
            time.sleep(0.2)

    def dump(self, namespaces: Iterable[str], node: str) -> list[Obj]:
        """The objects a proxy sees (ours, the Node, default/kubernetes), as the server holds
        them: for `ipvsproxy sync --from-file` comparisons and for reports."""
        out: list[Obj] = []
        for ns in [*namespaces, "default"]:
            for kind in ("Service", "EndpointSlice"):
                out += self.items(kind, ns)
        n = self.get("Node", "", node)
        if n is not None:
            out.append(dict(n, kind="Node", apiVersion="v1"))
        return out


def managed(obj: Obj) -> bool:
    return bool(obj.get("metadata", {}).get("labels", {}).get(LABEL_MANAGED_BY) == MANAGED_BY)


def _yaml(path: Path) -> Any:
    import yaml

    return yaml.safe_load(path.read_text())
