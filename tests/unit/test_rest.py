"""kube.rest.Get against the client's generated methods: the same request handed to the
client's transport (method, URL with its query, headers, body, timeout) for every keyword
combination the reflectors use, and the same behaviour against the test API server (raw
pages, a watch stream, ApiException with the status on 404)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.client import ApiClient, Configuration, CoreV1Api, DiscoveryV1Api
from kubernetes.client.exceptions import ApiException

from ipvsproxy.kube import rest
from ipvsproxy.kube.listing import LABEL_SELECTOR
from tests.apiserver import ApiServer


class _Sent(Exception):
    """Raised by the recording transport: the request got as far as the wire."""


def _recording_client(token: str | None = "t0ken") -> tuple[ApiClient, list[tuple[Any, ...]]]:
    cfg = Configuration(host="https://10.96.0.1:443")
    if token:
        cfg.api_key = {"BearerToken": token}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
    api = ApiClient(cfg)
    sent: list[tuple[Any, ...]] = []

    def request(method: str, url: str, headers: Any = None, body: Any = None,
                post_params: Any = None, _request_timeout: Any = None) -> Any:
        sent.append((method, url, dict(headers or {}), body, post_params, _request_timeout))
        raise _Sent

    api.rest_client.request = request  # type: ignore[method-assign]
    return api, sent


def _sent(call: Any, **kw: Any) -> None:
    with pytest.raises(_Sent):
        call(_preload_content=False, **kw)


_KEYWORDS = st.fixed_dictionaries({}, optional={
    "label_selector": st.sampled_from([LABEL_SELECTOR, "app=x", "a in (b,c)"]),
    "field_selector": st.sampled_from(["metadata.name=node-a", "metadata.name=n/1 x"]),
    "limit": st.integers(1, 1000),
    "_continue": st.text("abcXYZ019+/=", min_size=1, max_size=12),
    "resource_version": st.text("0123456789", min_size=1, max_size=8),
    "watch": st.booleans(),
    "allow_watch_bookmarks": st.booleans(),
    "timeout_seconds": st.integers(1, 600),
    "_request_timeout": st.sampled_from([None, 5, (3.0, 30.0)]),
})


@settings(max_examples=150, deadline=None)
@given(kw=_KEYWORDS, which=st.sampled_from(["services", "slices", "nodes"]),
       token=st.sampled_from([None, "t0ken"]))
def test_get_sends_what_the_generated_list_methods_send(kw: dict[str, Any], which: str,
                                                        token: str | None) -> None:
    api, sent = _recording_client(token)
    generated = {"services": CoreV1Api(api).list_service_for_all_namespaces,
                 "slices": DiscoveryV1Api(api).list_endpoint_slice_for_all_namespaces,
                 "nodes": CoreV1Api(api).list_node}[which]
    path = {"services": rest.SERVICES, "slices": rest.ENDPOINT_SLICES, "nodes": rest.NODES}
    _sent(generated, **kw)
    _sent(rest.Get(api, path[which]), **kw)
    assert len(sent) == 2
    # the one difference: a list asks for a compressed answer, as kube-proxy's client does
    ours = sent[1][2].pop("Accept-Encoding", None)
    assert ours == (None if kw.get("watch") else "gzip")
    assert sent[0] == sent[1]


def test_get_one_node_sends_what_read_node_sends() -> None:
    api, sent = _recording_client()
    with pytest.raises(_Sent):
        CoreV1Api(api).read_node("node a/1", _preload_content=False)
    _sent(rest.Get(api, rest.NODE, name="node a/1"))
    assert sent[1][2].pop("Accept-Encoding") == "gzip"
    assert sent[0] == sent[1]
    assert sent[1][1] == "https://10.96.0.1:443/api/v1/nodes/node%20a%2F1"


def test_unknown_keywords_and_preloading_are_refused() -> None:
    api, sent = _recording_client()
    with pytest.raises(TypeError, match="pretty"):
        rest.Get(api, rest.SERVICES)(pretty="true")
    with pytest.raises(TypeError, match="raw responses"):
        rest.Get(api, rest.SERVICES)(_preload_content=True)
    assert sent == []


@pytest.fixture
def server() -> Iterator[ApiServer]:
    s = ApiServer()
    s.start()
    yield s
    s.stop()


def _client(server: ApiServer) -> ApiClient:
    cfg = Configuration()
    cfg.host = server.url
    return ApiClient(cfg)


def test_pages_watch_and_errors_against_the_test_api_server(server: ApiServer) -> None:
    server.load([{"kind": "Service", "metadata": {"namespace": "default", "name": f"s{i}"},
                  "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}}
                 for i in range(3)])
    api = _client(server)
    get = rest.Get(api, rest.SERVICES)
    first = json.loads(get(limit=2).data)
    assert [i["metadata"]["name"] for i in first["items"]] == ["s0", "s1"]
    rest_page = json.loads(get(limit=2, _continue=first["metadata"]["continue"]).data)
    assert [i["metadata"]["name"] for i in rest_page["items"]] == ["s2"]
    rv = first["metadata"]["resourceVersion"]

    watch = get(watch=True, resource_version=rv, timeout_seconds=1, _request_timeout=5)
    server.put({"kind": "Service", "metadata": {"namespace": "default", "name": "new"},
                "spec": {"clusterIP": "10.96.0.2", "ports": [{"port": 80}]}})
    line = next(iter(watch.stream(amt=None)))
    event = json.loads(line.split(b"\n")[0])
    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "new")
    watch.close()

    with pytest.raises(ApiException) as exc:
        rest.Get(api, rest.NODE, name="node-z")()
    assert exc.value.status == 404 and json.loads(exc.value.body)["reason"] == "NotFound"
    assert server.requests[-1] == ("GET", "/api/v1/nodes/node-z")


def test_a_large_list_comes_compressed_and_reads_as_json(server: ApiServer) -> None:
    # 2,000 Services of ~150 bytes: a page of 1,000 is over the API server's 128 KiB threshold
    server.load([{"kind": "Service", "metadata": {"namespace": "default", "name": f"s{i}",
                                                  "labels": {"app": "x" * 40}},
                  "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}}
                 for i in range(2000)])
    get = rest.Get(_client(server), rest.SERVICES)
    page = json.loads(get(limit=1000).data)
    assert server.gzipped == 1
    assert [i["metadata"]["name"] for i in page["items"][:2]] == ["s0", "s1"]
    assert len(page["items"]) == 1000
    small = json.loads(get(limit=5).data)  # under the threshold: plain, as the real one sends it
    assert len(small["items"]) == 5 and server.gzipped == 1
