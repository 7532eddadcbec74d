"""ipvsproxy's own API code driven against the real server, and what the server recorded of it.

`reflect_once` runs one `Reflector` (kube/reflector.py) through a LIST and the opening of its
WATCH, in the calling thread; `run_proxy_calls` runs every request path of the product: the
daemon's reflectors (`start_reflectors`' kinds and selectors) and `sync --once`'s listing
(`list_objects`). The server's audit log then says which requests were made and how each was
answered, in its own terms (user, API group, resource, verb, code).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from integration.upstream.client import Client
from ipvsproxy.kube import rest
from ipvsproxy.kube.listing import LABEL_SELECTOR, list_objects
from ipvsproxy.kube.reflector import Reflector

NODE = "node-a"
# The daemon's reflectors as start_reflectors makes them: kind, path, selectors.
REFLECTORS: list[tuple[str, str, dict[str, str]]] = [
    ("Service", rest.SERVICES, {"label_selector": LABEL_SELECTOR}),
    ("EndpointSlice", rest.ENDPOINT_SLICES, {"label_selector": LABEL_SELECTOR}),
    ("Node", rest.NODES, {"field_selector": f"metadata.name={NODE}"}),
    ("ServiceCIDR", rest.SERVICE_CIDRS, {}),
]
Rule = tuple[str, str, str]  # (API group, resource, verb)


class NullSink:
    def list_page(self, kind: str, items: list[dict[str, Any]], first: bool) -> None:
        pass

    def list_done(self, kind: str) -> None:
        pass

    def event(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        pass


def api_client(kubeconfig: Path) -> Any:
    """The official client configured from `kubeconfig` by the loader `ipvsproxy` uses
    (kube/listing.py load_client_config), into a configuration of its own."""
    from kubernetes import config as _config

    config: Any = _config  # the client's config loaders are untyped
    return config.new_client_from_config(config_file=str(kubeconfig))


def reflect_once(client: Any, kind: str, path: str, selectors: dict[str, str]
                 ) -> list[tuple[str, int]]:
    """One Reflector's LIST and the opening of its WATCH (or the first refusal); returns
    [(verb, HTTP status)] in order."""
    from kubernetes.client.exceptions import ApiException

    stop = threading.Event()
    seen: list[tuple[str, int]] = []
    get = rest.Get(client, path)

    def call(**kw: Any) -> Any:
        verb = "watch" if kw.get("watch") else "list"
        try:
            resp = get(**kw)
        except ApiException as exc:
            seen.append((verb, int(exc.status)))
            stop.set()
            raise
        seen.append((verb, 200))
        if verb == "watch":
            stop.set()  # the reflector closes it and returns
        return resp

    r = Reflector(kind, call, NullSink(), stop, label_selector=selectors.get("label_selector"),
                  field_selector=selectors.get("field_selector"), min_watch_timeout=5,
                  max_watch_timeout=6, socket_timeout=30, wait=lambda _delay: True)
    r.run()
    return seen


def run_proxy_calls(kubeconfig: Path) -> dict[str, Any]:
    """Every request path of the product with `kubeconfig`'s credentials: each reflector's
    LIST and WATCH, then `sync --once`'s listing. Returns what each said (statuses, or the
    listing's error)."""
    client = api_client(kubeconfig)
    out: dict[str, Any] = {}
    try:
        for kind, path, selectors in REFLECTORS:
            out[kind] = reflect_once(client, kind, path, selectors)
        try:
            out["listing"] = len(list_objects(client, NODE))
        except Exception as exc:
            out["listing"] = f"{type(exc).__name__}: {getattr(exc, 'status', '')}"
    finally:
        client.close()
    return out


def audited_rules(cp: Any, user: str, since: int) -> dict[Rule, set[int]]:
    """(API group, resource, verb) -> the codes the server answered, for `user`'s requests
    after the first `since` audit entries."""
    out: dict[Rule, set[int]] = {}
    for ev in cp.audit(user)[since:]:
        if ev["resource"] is None:  # a non-resource URL (none expected)
            key = ("", ev["uri"], ev["verb"])
        else:
            key = (ev["apiGroup"] or "", ev["resource"], ev["verb"])
        out.setdefault(key, set()).add(ev["code"])
    return out


def role_rules(role: dict[str, Any]) -> set[Rule]:
    """A ClusterRole's rules expanded to (API group, resource, verb)."""
    return {(g, r, v) for rule in role.get("rules") or [] for g in rule.get("apiGroups") or []
            for r in rule.get("resources") or [] for v in rule.get("verbs") or []}


def can(cp: Client, user: str, rule: Rule) -> bool:
    """The server's answer to a SubjectAccessReview (asked as the admin, so the account's own
    record stays its own): may ServiceAccount `user` do `rule`?"""
    group, resource, verb = rule
    namespace = user.split(":")[2]
    got = cp.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": ["system:serviceaccounts",
                                          f"system:serviceaccounts:{namespace}",
                                          "system:authenticated"],
                 "resourceAttributes": {"group": group, "resource": resource, "verb": verb}}})
    return bool(got["status"].get("allowed"))
