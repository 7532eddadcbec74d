"""The API requests ipvsproxy makes: GETs of Services, EndpointSlices and Nodes, raw JSON.

They go through the official client's `ApiClient` (its configuration, authentication, TLS and
connection pool), but not through its generated API classes: `CoreV1Api` is a 45,000-line
module whose import, with the ~250 pydantic models it pulls in, costs the daemon 22 MB of
resident memory (30-60 s under emulation), and each of its calls validates its arguments with
pydantic's `validate_call`. ipvsproxy reads three collections and one Node; a `Get` sends the
very request the generated method would (tests/unit/test_rest.py compares the two on the wire).
"""

from __future__ import annotations

from typing import Any

SERVICES = "/api/v1/services"
ENDPOINT_SLICES = "/apis/discovery.k8s.io/v1/endpointslices"
NODES = "/api/v1/nodes"
NODE = "/api/v1/nodes/{name}"
SERVICE_CIDRS = "/apis/networking.k8s.io/v1/servicecidrs"

# The generated methods' keywords and their query names, in the order the generated code
# appends them (so the URL is the same, byte for byte).
_QUERY = {
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "_continue": "continue",
    "field_selector": "fieldSelector",
    "label_selector": "labelSelector",
    "limit": "limit",
    "resource_version": "resourceVersion",
    "timeout_seconds": "timeoutSeconds",
    "watch": "watch",
}


class Get:
    """GET `path` as the generated list/read methods do with `_preload_content=False`: returns
    the raw urllib3 response (not read), raises the client's ApiException on a non-2xx status.
    Takes the generated methods' keywords (`label_selector=`, `_continue=`, `watch=` ...)."""

    def __init__(self, api_client: Any, path: str, **path_params: str) -> None:
        self.api_client, self.path, self.path_params = api_client, path, path_params

    def __call__(self, *, _preload_content: bool = False, _request_timeout: Any = None,
                 **kw: Any) -> Any:
        if _preload_content:
            raise TypeError("Get returns raw responses only (_preload_content=False)")
        unknown = kw.keys() - _QUERY.keys()
        if unknown:
            raise TypeError(f"{self.path}: unknown query keywords {sorted(unknown)}")
        query = [(name, kw[key]) for key, name in _QUERY.items() if kw.get(key) is not None]
        header = {"Accept": "application/json"}
        if not kw.get("watch"):
            # A list compressed, as kube-proxy's client-go asks for it (Go's transport sends
            # Accept-Encoding: gzip unless DisableCompression): the API server gzips responses
            # over 128 KiB, and a 10,000-service list is tens of MB of JSON. urllib3 decodes
            # it in C as it is read (`.data`). A watch stream is never compressed.
            header["Accept-Encoding"] = "gzip"
        api = self.api_client
        method, url, headers, body, post = api.param_serialize(
            method="GET", resource_path=self.path, path_params=self.path_params,
            query_params=query, header_params=header, post_params=[],
            files={}, auth_settings=["BearerToken"], collection_formats={})
        resp = api.call_api(method, url, headers, body, post, _request_timeout=_request_timeout)
        if not 200 <= resp.status <= 299:
            from kubernetes.client.exceptions import ApiException

            resp.read()  # as the client's own raw path does: the body goes into the exception
            raise ApiException.from_response(http_resp=resp, body=None, data=None)
        return resp.response
