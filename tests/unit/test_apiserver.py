"""The fake API server (tests/apiserver.py) as the official `kubernetes` client sees it: LIST
pagination as one consistent snapshot, 410 Gone for expired continue tokens and watches,
label and field selectors, watch replay, bookmarks, timeouts, selector transitions, restarts
on the same port and cut watch connections.

And its RBAC, when enforced: requests mapped to (group, resource, verb) as the real API server
maps them, 401 without the token, 403 with the real Status and wording for what the rules do
not grant (a write included, before its 405), discovery for every authenticated user,
deploy/rbac.yaml's ClusterRole loaded as rules, and the daemon's own reflectors listing and
watching all three kinds with nothing but PROXY_RULES, never refused."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from kubernetes import config as kconfig
from kubernetes.client import (
    ApiClient,
    ApisApi,
    Configuration,
    CoreV1Api,
    CoreV1Event,
    DiscoveryV1Api,
    V1ObjectMeta,
    V1ObjectReference,
    VersionApi,
)
from kubernetes.client.exceptions import ApiException
from kubernetes.watch import watch as kwatch

from tests.apiserver import (
    PROXY_RULES,
    ApiServer,
    Attributes,
    request_attributes,
    rules_of,
)

# the client's watch and config modules are untyped
load_kube_config: Any = kconfig.load_kube_config
iter_resp_lines: Any = kwatch.iter_resp_lines
Watch: Any = kwatch.Watch
PROXY_SELECTOR = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"


def svc(name: str, ns: str = "default", **labels: str) -> dict[str, Any]:
    return {"kind": "Service", "metadata": {"namespace": ns, "name": name, "labels": labels},
            "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80, "protocol": "TCP"}]}}


def eps(name: str, service: str, **labels: str) -> dict[str, Any]:
    return {"kind": "EndpointSlice", "addressType": "IPv4", "endpoints": [], "ports": [],
            "metadata": {"namespace": "default", "name": name,
                         "labels": {"kubernetes.io/service-name": service, **labels}}}


def node(name: str) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name}, "status": {}}


@pytest.fixture
def api() -> Iterator[ApiServer]:
    server = ApiServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def core(api: ApiServer) -> CoreV1Api:
    cfg = Configuration()
    cfg.host = api.url
    return CoreV1Api(ApiClient(cfg))


def body(resp: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(resp.data)
    return doc


def list_services(core: CoreV1Api, **kw: Any) -> dict[str, Any]:
    return body(core.list_service_for_all_namespaces(_preload_content=False, **kw))


def names(doc: dict[str, Any]) -> list[str]:
    return [i["metadata"]["name"] for i in doc["items"]]


def open_watch(core: CoreV1Api, list_fn: Callable[..., Any] | None = None, **kw: Any
               ) -> tuple[Any, Iterator[dict[str, Any]]]:
    """A raw watch (on Services unless another list method is given): the response and an
    iterator of its decoded events."""
    list_fn = list_fn or core.list_service_for_all_namespaces
    resp = list_fn(watch=True, _preload_content=False, _request_timeout=5, **kw)

    def events() -> Iterator[dict[str, Any]]:
        for line in iter_resp_lines(resp):
            if line:
                yield json.loads(line)
    return resp, events()


def brief(ev: dict[str, Any]) -> tuple[str, str, str]:
    md = ev["object"]["metadata"]
    return ev["type"], md.get("name", ""), md["resourceVersion"]


def test_pages_are_one_consistent_snapshot(api: ApiServer, core: CoreV1Api) -> None:
    api.load([svc(f"s{i}") for i in range(5)] + [svc("a", ns="kube-system")])
    first = list_services(core, limit=2)
    rv = first["metadata"]["resourceVersion"]
    assert first["kind"] == "ServiceList" and names(first) == ["s0", "s1"]
    assert "kind" not in first["items"][0]  # like the real server, items carry no kind
    # changes after the first page do not show in the later pages
    api.delete("Service", "default", "s3")
    changed = api.put({**svc("s4"), "spec": {"clusterIP": "10.96.9.9"}})
    api.put(svc("s5"))
    second = list_services(core, limit=2, _continue=first["metadata"]["continue"])
    third = list_services(core, limit=2, _continue=second["metadata"]["continue"])
    assert names(second) == ["s2", "s3"] and names(third) == ["s4", "a"]
    assert third["items"][0]["spec"]["clusterIP"] == "10.96.0.1"
    assert "continue" not in third["metadata"]
    assert {p["metadata"]["resourceVersion"] for p in (second, third)} == {rv}
    # sorted by namespace, then name
    now = list_services(core)
    assert names(now) == ["s0", "s1", "s2", "s4", "s5", "a"]
    assert int(now["metadata"]["resourceVersion"]) == int(rv) + 3
    assert changed["metadata"]["resourceVersion"] == str(int(rv) + 2)


def test_an_expired_continue_token_is_410_gone(api: ApiServer, core: CoreV1Api) -> None:
    api.load([svc(f"s{i}") for i in range(3)])
    first = list_services(core, limit=1)
    api.compact()  # nothing changed since the list: its snapshot is still there
    assert names(list_services(core, limit=1, _continue=first["metadata"]["continue"])) == ["s1"]
    api.put(svc("s9"))
    api.compact()
    with pytest.raises(ApiException) as exc:
        list_services(core, limit=1, _continue=first["metadata"]["continue"])
    assert exc.value.status == 410
    status = json.loads(exc.value.body or "")
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "Expired", 410)


def test_label_selectors(api: ApiServer, core: CoreV1Api) -> None:
    api.load([svc("plain", app="web"), svc("other", app="db"),
              svc("mine", **{"service.kubernetes.io/service-proxy-name": "cilium"}),
              svc("headless", app="web", **{"service.kubernetes.io/headless": ""}),
              eps("plain-1", "plain"), eps("headless-1", "headless",
                                           **{"service.kubernetes.io/headless": ""})])
    assert names(list_services(core, label_selector=PROXY_SELECTOR)) == ["other", "plain"]
    assert names(list_services(core, label_selector="app=web")) == ["headless", "plain"]
    assert names(list_services(core, label_selector="app==db")) == ["other"]
    assert names(list_services(core, label_selector="app!=web")) == ["mine", "other"]
    assert names(list_services(core, label_selector="app")) == ["headless", "other", "plain"]
    assert names(list_services(core, label_selector="app=web,!service.kubernetes.io/headless")
                 ) == ["plain"]
    disc = DiscoveryV1Api(core.api_client)
    slices = body(disc.list_endpoint_slice_for_all_namespaces(
        _preload_content=False, label_selector=PROXY_SELECTOR))
    assert slices["kind"] == "EndpointSliceList" and names(slices) == ["plain-1"]
    with pytest.raises(ApiException) as exc:
        list_services(core, label_selector="a=b=c")
    assert exc.value.status == 400


def test_nodes_field_selector_and_get(api: ApiServer, core: CoreV1Api) -> None:
    api.load([node("node-a"), node("node-b")])
    got = body(core.list_node(_preload_content=False, field_selector="metadata.name=node-b"))
    assert got["kind"] == "NodeList" and names(got) == ["node-b"]
    one = body(core.read_node("node-a", _preload_content=False))
    assert (one["kind"], one["apiVersion"], one["metadata"]["name"]) == ("Node", "v1", "node-a")
    assert one["metadata"]["uid"] and one["metadata"]["creationTimestamp"]
    with pytest.raises(ApiException) as exc:
        core.read_node("node-z", _preload_content=False)
    assert exc.value.status == 404 and json.loads(exc.value.body or "")["reason"] == "NotFound"
    api.delete("Node", "", "node-b")
    assert names(body(core.list_node(_preload_content=False))) == ["node-a"]


def test_watch_replays_from_a_resource_version(api: ApiServer, core: CoreV1Api) -> None:
    a = api.put(svc("a"))
    rv = a["metadata"]["resourceVersion"]
    api.put(svc("b"))
    api.put(eps("a-1", "a"))  # another kind: not on a Service watch
    api.put(svc("a", app="x"))
    api.delete("Service", "default", "b")
    resp, events = open_watch(core, resource_version=rv)
    got = [next(events) for _ in range(3)]
    api.put(svc("c"))  # and then it streams
    got.append(next(events))
    resp.close()
    r = int(rv)
    assert [brief(e) for e in got] == [("ADDED", "b", str(r + 1)), ("MODIFIED", "a", str(r + 3)),
                                       ("DELETED", "b", str(r + 4)), ("ADDED", "c", str(r + 5))]
    assert got[1]["object"]["kind"] == "Service" and got[1]["object"]["apiVersion"] == "v1"
    assert got[1]["object"]["metadata"]["uid"] == a["metadata"]["uid"]


def test_a_watch_without_a_resource_version_starts_with_the_current_objects(
        api: ApiServer, core: CoreV1Api) -> None:
    api.load([svc("a"), svc("b"), svc("c", app="x")])
    api.delete("Service", "default", "b")
    resp, events = open_watch(core, resource_version="0", label_selector="!app")
    first = next(events)
    api.put(svc("d"))
    second = next(events)
    resp.close()
    assert [brief(first)[:2], brief(second)[:2]] == [("ADDED", "a"), ("ADDED", "d")]


def test_a_watch_below_the_compaction_floor_gets_a_410_error(
        api: ApiServer, core: CoreV1Api) -> None:
    rv = api.put(svc("a"))["metadata"]["resourceVersion"]
    api.put(svc("b"))
    api.compact()
    resp, events = open_watch(core, resource_version=rv)
    assert [(e["type"], e["object"]["reason"], e["object"]["code"]) for e in events] == [
        ("ERROR", "Expired", 410)]  # one event, then the stream ends
    resp.close()
    with pytest.raises(ApiException) as exc:  # the client's Watch turns it into an exception
        list(Watch().stream(core.list_service_for_all_namespaces, resource_version=rv,
                            timeout_seconds=5))
    assert exc.value.status == 410
    # from the floor itself a watch works
    resp, events = open_watch(core, resource_version=api.resource_version)
    api.put(svc("c"))
    assert brief(next(events))[:2] == ("ADDED", "c")
    resp.close()


def test_bookmarks_and_timeout_seconds(api: ApiServer, core: CoreV1Api) -> None:
    api.bookmark_interval = 0.2
    rv = api.put(svc("a"))["metadata"]["resourceVersion"]
    t0 = time.monotonic()
    resp, events = open_watch(core, resource_version=rv, allow_watch_bookmarks=True,
                              timeout_seconds=1)
    got = list(events)  # the stream ends by itself after timeoutSeconds
    elapsed = time.monotonic() - t0
    resp.close()
    assert 0.9 < elapsed < 3, elapsed
    assert 3 <= len(got) <= 7 and {e["type"] for e in got} == {"BOOKMARK"}
    assert got[-1]["object"] == {"kind": "Service", "apiVersion": "v1",
                                 "metadata": {"resourceVersion": rv}}


def test_timeout_seconds_ends_a_quiet_stream_without_bookmarks(
        api: ApiServer, core: CoreV1Api) -> None:
    t0 = time.monotonic()
    events = list(Watch().stream(core.list_service_for_all_namespaces,
                                 resource_version=api.resource_version, timeout_seconds=1))
    assert events == [] and 0.9 < time.monotonic() - t0 < 3


def test_selector_transitions_are_deleted_and_added(api: ApiServer, core: CoreV1Api) -> None:
    resp, events = open_watch(core, resource_version=api.resource_version,
                              label_selector="app=web")
    api.put(svc("other", app="db"))  # never matches: never seen
    api.put(svc("s", app="web"))
    api.put(svc("s", app="db"))  # stops matching
    api.put(svc("s", app="db", tier="x"))  # still not matching: not seen
    api.put(svc("s", app="web"))  # matches again
    api.put(svc("s", app="web", tier="y"))
    api.delete("Service", "default", "s")
    got = [next(events) for _ in range(5)]
    resp.close()
    r = int(got[0]["object"]["metadata"]["resourceVersion"])
    assert [brief(e) for e in got] == [
        ("ADDED", "s", str(r)), ("DELETED", "s", str(r + 1)), ("ADDED", "s", str(r + 3)),
        ("MODIFIED", "s", str(r + 4)), ("DELETED", "s", str(r + 5))]
    # a DELETED for leaving the selector carries the last matching state
    assert got[1]["object"]["metadata"]["labels"] == {"app": "web"}


def test_stop_then_start_again_on_the_same_port(api: ApiServer, core: CoreV1Api) -> None:
    api.put(svc("a"))
    port = api.port
    resp, events = open_watch(core, resource_version=api.resource_version)
    api.stop()
    with pytest.raises(urllib3.exceptions.ProtocolError):
        next(events)  # the open watch is cut
    resp.close()
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        list_services(core)
    api.start()
    assert api.port == port
    assert names(list_services(core)) == ["a"]
    resp, events = open_watch(core, resource_version=api.resource_version)
    api.put(svc("b"))
    assert brief(next(events))[:2] == ("ADDED", "b")
    resp.close()


def test_cut_watches_ends_open_streams_only(api: ApiServer, core: CoreV1Api) -> None:
    resp, events = open_watch(core, resource_version=api.resource_version)
    api.put(svc("a"))
    rv = brief(next(events))[2]
    api.cut_watches()
    with pytest.raises(urllib3.exceptions.ProtocolError):
        next(events)
    resp.close()
    # the server is still up: a new watch resumes from the last resourceVersion seen
    api.put(svc("b"))
    resp, events = open_watch(core, resource_version=rv)
    assert brief(next(events))[:2] == ("ADDED", "b")
    resp.close()


def test_requests_are_recorded_and_discovery_answers(api: ApiServer, core: CoreV1Api) -> None:
    list_services(core, limit=5, label_selector="app")
    version = body(VersionApi(core.api_client).get_code(_preload_content=False))
    groups = body(ApisApi(core.api_client).get_api_versions(_preload_content=False))
    assert version["major"] == "1" and groups["groups"][0]["name"] == "discovery.k8s.io"
    assert api.requests[0] == ("GET", "/api/v1/services?labelSelector=app&limit=5")
    assert api.requests[1:] == [("GET", "/version/"), ("GET", "/apis/")]
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(api.url + "/api/v1/pods", timeout=5)
    assert exc.value.code == 404 and json.loads(exc.value.read())["reason"] == "NotFound"


def test_the_kubeconfig_it_writes_reaches_it(api: ApiServer, tmp_path: Path) -> None:
    api.put(node("node-a"))
    cfg = Configuration()
    load_kube_config(config_file=str(api.kubeconfig(tmp_path / "kubeconfig")),
                            client_configuration=cfg)
    assert cfg.host == api.url
    got = body(CoreV1Api(ApiClient(cfg)).read_node("node-a", _preload_content=False))
    assert got["metadata"]["name"] == "node-a"


# ---------------------------------------------------------------------------------- RBAC

TOKEN = "ipvsproxy-token"
USER = '"system:serviceaccount:kube-system:ipvsproxy"'  # as quoted in a 403 message
ROOT = Path(__file__).resolve().parents[2]


def client_of(api: ApiServer, tmp_path: Path) -> ApiClient:
    """A client configured as the daemon is: from the kubeconfig the server writes (carrying
    the token enforce_rbac() was given)."""
    cfg = Configuration()
    load_kube_config(config_file=str(api.kubeconfig(tmp_path / "kubeconfig")),
                     client_configuration=cfg)
    return ApiClient(cfg)


@pytest.fixture
def proxy_api(api: ApiServer, tmp_path: Path) -> ApiClient:
    """The server enforcing PROXY_RULES, and a client with the right token."""
    api.load([svc("a"), eps("a-1", "a"), node("node-a"), node("node-b")])
    api.enforce_rbac(TOKEN, PROXY_RULES)
    return client_of(api, tmp_path)


def refusal(exc: pytest.ExceptionInfo[ApiException]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(exc.value.body or "")
    assert doc["code"] == exc.value.status
    return doc


def forbidden(message: str, **details: str) -> dict[str, Any]:
    """The real API server's 403 body, field for field."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": "Forbidden", "details": details, "code": 403}


EVENT = CoreV1Event(metadata=V1ObjectMeta(name="e"),
                    involved_object=V1ObjectReference(kind="Node", name="node-a"))
UNAUTHORIZED = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Unauthorized", "reason": "Unauthorized", "code": 401}


def fetch(api: ApiServer, path: str, token: str | None = TOKEN, method: str = "GET"
          ) -> tuple[int, dict[str, Any]]:
    """A plain request, for paths the client has no method for; (status, JSON body)."""
    req = urllib.request.Request(api.url + path, method=method, data=b"{}" if method != "GET"
                                 else None)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_requests_map_to_what_rbac_authorizes() -> None:
    """request_attributes works a request out as the real API server's RequestInfo does."""
    A = Attributes
    nodes = "/api/v1/nodes"
    cases = {
        ("GET", "/api/v1/services?limit=500"): A("list", "", "services"),
        ("GET", "/api/v1/namespaces/default/services"): A("list", "", "services", "default"),
        ("GET", f"{nodes}?watch=True"): A("watch", "", "nodes"),
        ("GET", f"{nodes}?watch=1&watch=false"): A("watch", "", "nodes"),  # the first counts
        ("GET", f"{nodes}?watch=yes"): A("watch", "", "nodes"),  # only 0/false are false
        ("GET", f"{nodes}?watch=FALSE"): A("list", "", "nodes"),
        ("GET", f"{nodes}?watch=0"): A("list", "", "nodes"),
        ("GET", "/api/v1/watch/nodes"): A("watch", "", "nodes"),  # the deprecated path
        # a list or watch selecting one object by name names it
        ("GET", f"{nodes}?fieldSelector=metadata.name%3Dnode-a&watch=true"):
            A("watch", "", "nodes", name="node-a"),
        ("GET", f"{nodes}?fieldSelector=metadata.name!%3Dnode-a"): A("list", "", "nodes"),
        ("GET", "/api/v1/nodes/node-a"): A("get", "", "nodes", name="node-a"),
        ("PUT", "/api/v1/nodes/node-a/status"): A("update", "", "nodes/status", name="node-a"),
        ("GET", "/apis/discovery.k8s.io/v1/endpointslices"):
            A("list", "discovery.k8s.io", "endpointslices"),
        ("POST", "/api/v1/namespaces/default/events"): A("create", "", "events", "default"),
        ("PATCH", "/apis/events.k8s.io/v1/namespaces/ns/events/e"):
            A("patch", "events.k8s.io", "events", "ns", "e"),
        ("DELETE", "/api/v1/namespaces/ns/pods"): A("deletecollection", "", "pods", "ns"),
        ("DELETE", "/api/v1/namespaces/ns/pods/p"): A("delete", "", "pods", "ns", "p"),
        # a namespace's own subresource, not a resource in the namespace
        ("PUT", "/api/v1/namespaces/ns/finalize"):
            A("update", "", "namespaces/finalize", "ns", "ns"),
        ("GET", "/api/v1/namespaces/ns"): A("get", "", "namespaces", "ns", "ns"),
        # non-resource requests
        ("GET", "/apis/discovery.k8s.io/v1"): A("get", path="/apis/discovery.k8s.io/v1"),
        ("GET", "/api/v1"): A("get", path="/api/v1"),
        ("GET", "/version/"): A("get", path="/version/"),
        ("POST", "/apis"): A("post", path="/apis"),
    }
    assert {k: request_attributes(*k) for k in cases} == cases


def test_rules_of_a_cluster_role() -> None:
    role = {"kind": "ClusterRole", "rules": [
        {"apiGroups": ["", "apps"], "resources": ["pods", "deployments"], "verbs": ["get"]},
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["list", "watch"]}]}
    assert rules_of(role) == {("", "pods", "get"), ("", "deployments", "get"),
                              ("apps", "pods", "get"), ("apps", "deployments", "get"),
                              ("*", "*", "list"), ("*", "*", "watch")}
    for narrowed in ({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"],
                      "resourceNames": ["node-a"]},
                     {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}):
        with pytest.raises(ValueError, match="not supported"):
            rules_of({"rules": [narrowed]})


def test_proxy_rules_allow_listing_and_watching_the_four_kinds(
        api: ApiServer, proxy_api: ApiClient) -> None:
    rules = set(PROXY_RULES)
    assert rules == {("", "services", "list"), ("", "services", "watch"),
                     ("discovery.k8s.io", "endpointslices", "list"),
                     ("discovery.k8s.io", "endpointslices", "watch"),
                     ("", "nodes", "list"), ("", "nodes", "watch"),
                     ("networking.k8s.io", "servicecidrs", "list"),
                     ("networking.k8s.io", "servicecidrs", "watch")}
    core, disc = CoreV1Api(proxy_api), DiscoveryV1Api(proxy_api)
    assert names(list_services(core, label_selector=PROXY_SELECTOR)) == ["a"]
    assert names(body(disc.list_endpoint_slice_for_all_namespaces(
        _preload_content=False, limit=10))) == ["a-1"]
    assert names(body(core.list_node(_preload_content=False,
                                     field_selector="metadata.name=node-a"))) == ["node-a"]
    rv = api.resource_version
    watches = [open_watch(core, resource_version=rv),
               open_watch(core, disc.list_endpoint_slice_for_all_namespaces, resource_version=rv),
               open_watch(core, core.list_node, resource_version=rv,
                          field_selector="metadata.name=node-a")]
    api.load([svc("b"), eps("b-1", "b"), {**node("node-a"), "status": {"phase": "x"}}])
    got = [brief(next(events))[:2] for _, events in watches]
    for resp, _ in watches:
        resp.close()
    assert got == [("ADDED", "b"), ("ADDED", "b-1"), ("MODIFIED", "node-a")]
    assert api.refused == []


def test_proxy_rules_forbid_everything_else_in_the_real_wording(
        api: ApiServer, proxy_api: ApiClient) -> None:
    core = CoreV1Api(proxy_api)
    cannot = f"is forbidden: User {USER} cannot"
    cases: list[tuple[Callable[[], Any], dict[str, Any]]] = [
        (lambda: core.read_node("node-a"), forbidden(
            f'nodes "node-a" {cannot} get resource "nodes" in API group "" at the cluster scope',
            name="node-a", kind="nodes")),
        (lambda: core.list_pod_for_all_namespaces(), forbidden(
            f'pods {cannot} list resource "pods" in API group "" at the cluster scope',
            kind="pods")),
        (lambda: core.list_namespaced_pod("default", watch=True, _preload_content=False),
         forbidden(f'pods {cannot} watch resource "pods" in API group "" in the namespace '
                   '"default"', kind="pods")),
        (lambda: core.read_namespaced_secret("db", "default"), forbidden(
            f'secrets "db" {cannot} get resource "secrets" in API group "" in the namespace '
            '"default"', name="db", kind="secrets")),
        (lambda: core.list_namespaced_secret("default", field_selector="metadata.name=db"),
         forbidden(f'secrets "db" {cannot} list resource "secrets" in API group "" in the '
                   'namespace "default"', name="db", kind="secrets")),
        # a write: 403, not the 405 of the read-only server
        (lambda: core.create_namespaced_event("default", EVENT), forbidden(
            f'events {cannot} create resource "events" in API group "" in the namespace '
            '"default"', kind="events")),
        (lambda: core.patch_node_status("node-a", {"status": {}}), forbidden(
            f'nodes "node-a" {cannot} patch resource "nodes/status" in API group "" at the '
            'cluster scope', name="node-a", kind="nodes")),
        (lambda: DiscoveryV1Api(proxy_api).delete_collection_namespaced_endpoint_slice(
            "default"), forbidden(
            f'endpointslices.discovery.k8s.io {cannot} deletecollection resource '
            '"endpointslices" in API group "discovery.k8s.io" in the namespace "default"',
            group="discovery.k8s.io", kind="endpointslices")),
    ]
    for call, expected in cases:
        with pytest.raises(ApiException) as exc:
            call()
        assert (exc.value.status, refusal(exc)) == (403, expected)
    assert [(m, code) for m, _, code in api.refused] == [
        ("GET", 403)] * 5 + [("POST", 403), ("PATCH", 403), ("DELETE", 403)]
    assert api.refused[0][1] == "/api/v1/nodes/node-a"
    # a non-resource URL that is not discovery
    assert fetch(api, "/metrics") == (403, forbidden(
        f'forbidden: User {USER} cannot get path "/metrics"'))


def test_without_the_token_every_request_is_401(api: ApiServer, proxy_api: ApiClient,
                                                core: CoreV1Api) -> None:
    wrong = CoreV1Api(ApiClient(Configuration(host=api.url), header_name="Authorization",
                                header_value="Bearer not-the-token"))
    for client in (core, wrong):  # no token; a token the server does not know
        for call in (client.list_service_for_all_namespaces,
                     VersionApi(client.api_client).get_code,  # discovery too
                     lambda c=client: c.create_namespaced_event("default", EVENT)):
            with pytest.raises(ApiException) as exc:
                call()
            assert (exc.value.status, refusal(exc)) == (401, UNAUTHORIZED)
    assert fetch(api, "/api/v1/services", token=None) == (401, UNAUTHORIZED)
    assert fetch(api, "/api/v1/services", token=TOKEN.upper()) == (401, UNAUTHORIZED)
    assert [(m, code) for m, _, code in api.refused] == [
        ("GET", 401), ("GET", 401), ("POST", 401)] * 2 + [("GET", 401)] * 2


def test_discovery_is_allowed_to_every_authenticated_user(api: ApiServer,
                                                          proxy_api: ApiClient) -> None:
    version = body(VersionApi(proxy_api).get_code(_preload_content=False))
    groups = body(ApisApi(proxy_api).get_api_versions(_preload_content=False))
    assert version["major"] == "1" and groups["groups"][0]["name"] == "discovery.k8s.io"
    assert fetch(api, "/api")[0] == 200
    # allowed, so the fake's own answer: it serves no group's resource list
    assert fetch(api, "/apis/discovery.k8s.io/v1")[0] == 404
    # discovery is get only
    assert fetch(api, "/apis", method="POST") == (403, forbidden(
        f'forbidden: User {USER} cannot post path "/apis"'))
    assert [(m, p) for m, p, _ in api.refused] == [("POST", "/apis")]


def test_what_the_rules_allow_is_served_as_without_rbac(api: ApiServer, tmp_path: Path) -> None:
    """Authorized requests go on to the server's usual answers: a permitted write still gets
    the read-only 405, a permitted unknown resource 404; wildcards match as in RBAC."""
    api.enforce_rbac(TOKEN, {("", "events", "create"), ("", "*", "list"), ("*", "*/status", "get")})
    client = client_of(api, tmp_path)
    core = CoreV1Api(client)
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_event("default", EVENT)
    assert (exc.value.status, refusal(exc)["reason"]) == (405, "MethodNotAllowed")
    assert names(list_services(core)) == []
    for path, code in (("/api/v1/pods", 404), ("/apis/apps/v1/deployments", 403),
                       ("/apis/apps/v1/namespaces/ns/deployments/d/status", 404),
                       ("/api/v1/nodes/node-a", 403)):
        assert fetch(api, path)[0] == code, path
    assert [(p, c) for _, p, c in api.refused] == [
        ("/apis/apps/v1/deployments", 403), ("/api/v1/nodes/node-a", 403)]


def test_the_deploy_cluster_role_also_grants_get_nodes(api: ApiServer, tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text()))
    (role,) = [d for d in docs if d and d["kind"] == "ClusterRole"]
    rules = rules_of(role)
    assert rules == PROXY_RULES | {("", "nodes", "get")}  # `ipvsproxy sync --once` reads it
    api.put(node("node-a"))
    api.enforce_rbac(TOKEN, rules)
    core = CoreV1Api(client_of(api, tmp_path))
    assert body(core.read_node("node-a", _preload_content=False))["metadata"]["name"] == "node-a"
    assert names(body(core.list_node(_preload_content=False))) == ["node-a"]
    with pytest.raises(ApiException) as exc:
        core.list_pod_for_all_namespaces()
    assert exc.value.status == 403
    assert api.refused == [("GET", "/api/v1/pods", 403)]


class Sink:
    """The reflectors' store, reduced to a log of what they handed it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()

    def list_page(self, kind: str, items: list[dict[str, Any]], first: bool) -> None:
        with self._lock:
            self.calls += [("replace", kind, i["metadata"]["name"]) for i in items]

    def list_done(self, kind: str) -> None:
        pass

    def event(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
        with self._lock:
            self.calls.append((type_, kind, obj["metadata"]["name"]))


def run_reflectors(api: ApiServer, tmp_path: Path, until: Callable[[Sink], bool]) -> Sink:
    """The daemon's reflectors, with the client the daemon builds from a kubeconfig
    (kube/listing.py load_client_config), run until `until(sink)` or 10 s."""
    from ipvsproxy.kube.listing import load_client_config
    from ipvsproxy.kube.reflector import start_reflectors

    client = load_client_config(str(api.kubeconfig(tmp_path / "kubeconfig")))
    sink, stop = Sink(), threading.Event()
    threads = start_reflectors(client, "node-a", sink, stop, min_watch_timeout=1,
                               max_watch_timeout=2, socket_timeout=2, connect_timeout=1,
                               backoff_initial=0.05, backoff_max=0.2)
    try:
        deadline = time.monotonic() + 10
        while not until(sink) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        client.close()
    return sink


@pytest.fixture
def default_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """load_client_config sets the client's process-wide default configuration: undone after."""
    monkeypatch.setattr(Configuration, "_default", None)


@pytest.mark.usefixtures("default_config")
def test_the_daemons_reflectors_need_nothing_but_the_proxy_rules(api: ApiServer,
                                                                 tmp_path: Path) -> None:
    """The host-level proof: list and watch of all three kinds, never refused."""
    api.bookmark_interval = 0.2
    api.load([svc("a"), eps("a-1", "a"), node("node-a")])
    api.enforce_rbac(TOKEN, PROXY_RULES)
    added = False

    def changed(sink: Sink) -> bool:
        nonlocal added
        if not added and {k for _, k, _ in sink.calls} == {"Service", "EndpointSlice", "Node"}:
            added = True  # everything listed: now a change for each watch to deliver
            api.load([svc("b"), eps("b-1", "b"), {**node("node-a"), "status": {"phase": "x"}}])
        return {("ADDED", "Service", "b"), ("ADDED", "EndpointSlice", "b-1"),
                ("MODIFIED", "Node", "node-a")} <= set(sink.calls)

    sink = run_reflectors(api, tmp_path, changed)
    assert changed(sink), sink.calls
    assert api.refused == []
    # and every rule was needed: each kind was both listed and watched
    assert {request_attributes(m, p).rule for m, p in api.requests} == PROXY_RULES


@pytest.mark.usefixtures("default_config")
def test_a_rule_missing_shows_in_refused(api: ApiServer, tmp_path: Path) -> None:
    """The proof above can fail: without the watch on nodes, the Node reflector is refused."""
    api.load([node("node-a")])
    api.enforce_rbac(TOKEN, PROXY_RULES - {("", "nodes", "watch")})
    run_reflectors(api, tmp_path, lambda sink: len(api.refused) >= 2)  # and retried
    assert {(request_attributes(m, p), code) for m, p, code in api.refused} == {
        (Attributes("watch", "", "nodes", name="node-a"), 403)}
