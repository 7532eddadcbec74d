"""The fake API server (tests/apiserver.py) as the official `kubernetes` client sees it: LIST
pagination as one consistent snapshot, 410 Gone for expired continue tokens and watches,
label and field selectors, watch replay, bookmarks, timeouts, selector transitions, restarts
on the same port and cut watch connections."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import config as kconfig
from kubernetes.client import (
    ApiClient,
    ApisApi,
    Configuration,
    CoreV1Api,
    DiscoveryV1Api,
    VersionApi,
)
from kubernetes.client.exceptions import ApiException
from kubernetes.watch import watch as kwatch

from tests.apiserver import ApiServer

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


def open_watch(core: CoreV1Api, **kw: Any) -> tuple[Any, Iterator[dict[str, Any]]]:
    """A raw watch on Services: the response and an iterator of its decoded events."""
    resp = core.list_service_for_all_namespaces(watch=True, _preload_content=False,
                                                _request_timeout=5, **kw)

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
