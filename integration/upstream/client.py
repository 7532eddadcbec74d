"""A client of the real API server for the tests, as its admin or with any bearer token.

This module owns what a test does with a cluster: `apply` objects (server-side apply, then the
status subresource where one is given), `delete` them, `apply_rbac` (deploy/rbac.yaml), a
ServiceAccount `token` (the TokenRequest API: since 1.24 there are no secret tokens), and
`kubeconfig`s for the admin or a token. `Client.from_kubeconfig` makes one from a kubeconfig
file (server, CA, bearer token), which is how a lab guest's test reaches a server on the host.
It starts nothing (integration/upstream/controlplane.py owns the processes). Standard library
only (PyYAML for deploy/rbac.yaml and a YAML kubeconfig).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Self

ROOT = Path(__file__).resolve().parents[2]
RBAC = ROOT / "deploy" / "rbac.yaml"
FIELD_MANAGER = "ipvsproxy-tests"

Obj = dict[str, Any]

# kind -> (apiVersion, plural, namespaced, has a status subresource)
KINDS: dict[str, tuple[str, str, bool, bool]] = {
    "Service": ("v1", "services", True, True),
    "EndpointSlice": ("discovery.k8s.io/v1", "endpointslices", True, False),
    "Node": ("v1", "nodes", False, True),
    "Namespace": ("v1", "namespaces", False, False),
    "ConfigMap": ("v1", "configmaps", True, False),
    "Secret": ("v1", "secrets", True, False),
    "Pod": ("v1", "pods", True, True),
    "ServiceAccount": ("v1", "serviceaccounts", True, False),
    "ServiceCIDR": ("networking.k8s.io/v1", "servicecidrs", False, True),
    "ClusterRole": ("rbac.authorization.k8s.io/v1", "clusterroles", False, False),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "clusterrolebindings", False, False),
    "Role": ("rbac.authorization.k8s.io/v1", "roles", True, False),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", "rolebindings", True, False),
}


class ApiError(Exception):
    """A request the API server answered with a failure status; carries the Status body."""

    def __init__(self, status: int, body: Any, what: str) -> None:
        message = body.get("message") if isinstance(body, dict) else str(body)[:300]
        super().__init__(f"{what}: {status} {message}")
        self.status, self.body = status, body


def api_path(obj: Obj, name: str | None = None, subresource: str = "") -> str:
    """The REST path of `obj`'s collection, or of the object `name` (and its subresource)."""
    version, plural, namespaced, _ = KINDS[obj["kind"]]
    base = f"/api/{version}" if "/" not in version else f"/apis/{version}"
    if namespaced:
        base += f"/namespaces/{(obj.get('metadata') or {}).get('namespace') or 'default'}"
    path = f"{base}/{plural}"
    if name:
        path += f"/{name}" + (f"/{subresource}" if subresource else "")
    return path


def complete(obj: Obj) -> Obj:
    """`obj` with apiVersion set from its kind (test objects often carry only the kind)."""
    return obj if "apiVersion" in obj else {"apiVersion": KINDS[obj["kind"]][0], **obj}


class Client:
    """What a test does with the API server as its admin (or with another token)."""

    url: str
    ca_pem: str
    admin_token: str

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Self:
        """A client with the first cluster's server and CA and the first user's token."""
        text = path.read_text()
        if text.lstrip().startswith("{"):
            cfg = json.loads(text)
        else:
            import yaml

            cfg = yaml.safe_load(text)
        c = cls.__new__(cls)
        cluster = cfg["clusters"][0]["cluster"]
        c.url = cluster["server"].rstrip("/")
        c.ca_pem = base64.b64decode(cluster["certificate-authority-data"]).decode()
        c.admin_token = cfg["users"][0]["user"]["token"]
        return c

    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem)

    def request(self, method: str, path: str, body: Any = None, *, token: str | None = None,
                query: dict[str, str] | None = None, content_type: str = "application/json",
                raw: bool = False, timeout: float = 30.0) -> Any:
        """One HTTPS request with the admin token (or `token`); the decoded JSON answer.
        A failure status raises ApiError with the server's Status body."""
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else (body if isinstance(body, bytes)
                                          else json.dumps(body).encode())
        req = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Bearer {token or self.admin_token}",
            "Accept": "application/json", "Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self._ssl()) as r:
                text = r.read()
        except urllib.error.HTTPError as e:
            payload = e.read()
            try:
                err: Any = json.loads(payload)
            except ValueError:
                err = payload.decode(errors="replace")
            raise ApiError(e.code, err, f"{method} {path}") from None
        if raw:
            return text.decode()
        return json.loads(text) if text else None

    def get(self, obj: Obj) -> Obj:
        return self.request("GET", api_path(obj, obj["metadata"]["name"]))  # type: ignore[no-any-return]

    def collection(self, kind: str, namespace: str | None = None, **query: str) -> Obj:
        """A LIST of `kind` (all namespaces unless `namespace`), as the server sends it."""
        path = api_path({"kind": kind, "metadata": {"namespace": namespace or "default"}})
        if namespace is None and KINDS[kind][2]:
            path = path.replace("/namespaces/default", "")
        return self.request("GET", path, query=query or None)  # type: ignore[no-any-return]

    def apply(self, objects: Obj | Iterable[Obj]) -> list[Obj]:
        """Create or update each object as `kubectl apply --server-side --force-conflicts`
        does (one field manager: a field left out of a later apply is removed), then set its
        status through the status subresource where it has one (a Service's load-balancer
        ingress, a Node's addresses). Returns the objects as the server stored them."""
        out = []
        for obj in [objects] if isinstance(objects, dict) else list(objects):
            obj = complete(obj)
            name = obj["metadata"]["name"]
            query = {"fieldManager": FIELD_MANAGER, "force": "true"}
            body = {k: v for k, v in obj.items() if k != "status"}
            stored = self.request("PATCH", api_path(obj, name), body, query=query,
                                  content_type="application/apply-patch+yaml")
            if "status" in obj and KINDS[obj["kind"]][3]:
                # A JSON merge patch, as kubelets and controllers write status (and replacing
                # lists whole): server-side apply refuses a Node's addresses with two entries
                # of one type (a dual-stack node's two InternalIPs), which its schema keys by
                # type.
                stored = self.request("PATCH", api_path(obj, name, "status"),
                                      {"status": obj["status"]},
                                      content_type="application/merge-patch+json")
            out.append(stored)
        return out

    def delete(self, obj: Obj, missing_ok: bool = True) -> None:
        try:
            self.request("DELETE", api_path(complete(obj), obj["metadata"]["name"]))
        except ApiError as exc:
            if not (missing_ok and exc.status == 404):
                raise

    def resource_version(self) -> str:
        """The store's current resourceVersion (etcd's revision), from a one-item list."""
        got = self.request("GET", "/api/v1/namespaces", query={"limit": "1"})
        return str(got["metadata"]["resourceVersion"])

    def apply_rbac(self, path: Path = RBAC) -> list[Obj]:
        """deploy/rbac.yaml (its ServiceAccount, ClusterRole and ClusterRoleBinding), applied."""
        import yaml

        return self.apply([d for d in yaml.safe_load_all(path.read_text()) if d])

    def token(self, namespace: str, service_account: str, seconds: int = 3600) -> str:
        """A bound token for the ServiceAccount from the TokenRequest API (what a kubelet
        mounts into the pod as a projected volume)."""
        got = self.request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": seconds}})
        return str(got["status"]["token"])

    def kubeconfig(self, path: Path, token: str | None = None) -> Path:
        """A kubeconfig (mode 0600) for the admin, or for `token`."""
        cluster: Obj = {"server": self.url, "certificate-authority-data":
                        base64.b64encode(self.ca_pem.encode()).decode()}
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": cluster}],
            "users": [{"name": "test", "user": {"token": token or self.admin_token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}]},
            indent=1))
        os.chmod(path, 0o600)
        return path
