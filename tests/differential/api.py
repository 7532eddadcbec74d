"""The differential suite's writes through the real API server: cluster.py's `Change`s.

`Api` is integration/upstream/client.py's `Client` (made from a kubeconfig: the suite runs
inside the lab guest, and the server may be on the host) with what the suite does to a cluster:
apply a `Change` (create, replace, status, delete; a create retried while the server has not
yet released a deleted Service's clusterIP or nodePort), load a whole cluster, remove
everything a cluster made, and dump what a proxy sees. Standard library only.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from integration.upstream.client import KINDS, ApiError, Client, Obj, api_path
from tests.differential.cluster import Change, Cluster


def path_of(kind: str, namespace: str = "", name: str = "", sub: str = "") -> str:
    return api_path({"kind": kind, "metadata": {"namespace": namespace}}, name, sub)


class Api(Client):
    def find(self, kind: str, namespace: str, name: str) -> Obj | None:
        """The object, or None where there is none."""
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

    def write(self, change: Change, retry_for: float = 60.0) -> Obj | None:
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

    def write_all(self, changes: Iterable[Change]) -> None:
        for c in changes:
            self.write(c)

    def load(self, cluster: Cluster) -> None:
        """Load a cluster into a server that holds none of its objects (see `reset`)."""
        for c in cluster.steps():
            if c.obj["kind"] == "Node" and self.find("Node", "", c.obj["metadata"]["name"]):
                self.write(Change("delete", c.obj, "load"))
                self._gone("Node", "", c.obj["metadata"]["name"])
            self.write(c)

    def reset(self, namespaces: Iterable[str], node: str) -> None:
        """Delete every Service and EndpointSlice of `namespaces` and the Node `node`, and wait
        until they are gone (namespaces stay: without a controller manager nobody would
        finish deleting one)."""
        for ns in namespaces:
            if self.find("Namespace", "", ns) is None:
                continue
            self.request("DELETE", path_of("EndpointSlice", ns))  # deletecollection
            for o in self.items("Service", ns):
                self.write(Change("delete", o, "reset"))
        if self.find("Node", "", node) is not None:
            self.write(Change("delete", {"kind": "Node", "metadata": {"name": node}}, "reset"))
        for ns in namespaces:
            if self.find("Namespace", "", ns) is None:
                continue
            for kind in ("EndpointSlice", "Service"):
                for o in self.items(kind, ns):
                    self._gone(kind, ns, o["metadata"]["name"])
        self._gone("Node", "", node)

    def _gone(self, kind: str, ns: str, name: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.find(kind, ns, name) is not None:
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
        n = self.find("Node", "", node)
        if n is not None:
            out.append(dict(n, kind="Node", apiVersion="v1"))
        return out

