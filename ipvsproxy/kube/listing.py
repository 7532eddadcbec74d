"""One list of Services, EndpointSlices, the own Node and the ServiceCIDRs (where the cluster has
them) from an API server, as raw JSON dicts.

Raw JSON (`_preload_content=False`), not the client's model objects: those cost ~22 KB and
~200 us per EndpointSlice (shared/reference/libraries.md §4). Paginated with `limit`/`continue`
so the API server serves large clusters in chunks. The label selector is kube-proxy's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from ipvsproxy.kube import rest

LABEL_SELECTOR = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"
PAGE = 500


def load_client_config(kubeconfig: str | None) -> Any:
    from kubernetes import client
    from kubernetes import config as _config

    config: Any = _config  # the client's config loaders are untyped

    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
    else:
        config.load_kube_config()
    return client.ApiClient()


def _pages(call: Callable[..., Any], kind: str, **kw: Any) -> Iterator[dict[str, Any]]:
    token = None
    while True:
        resp = call(_preload_content=False, limit=PAGE, _continue=token, **kw)
        body = json.loads(resp.data)
        for item in body.get("items") or []:
            item.setdefault("kind", kind)
            yield item
        token = (body.get("metadata") or {}).get("continue")
        if not token:
            return


def list_objects(api_client: Any, node_name: str) -> list[dict[str, Any]]:
    from kubernetes.client.exceptions import ApiException

    objs = list(_pages(rest.Get(api_client, rest.SERVICES), "Service",
                       label_selector=LABEL_SELECTOR))
    objs += _pages(rest.Get(api_client, rest.ENDPOINT_SLICES), "EndpointSlice",
                   label_selector=LABEL_SELECTOR)
    try:
        raw: Any = rest.Get(api_client, rest.NODE, name=node_name)()
        node = json.loads(raw.data)
        node.setdefault("kind", "Node")
        objs.append(node)
    except ApiException as exc:
        if exc.status != 404:
            raise
    try:
        objs += _pages(rest.Get(api_client, rest.SERVICE_CIDRS), "ServiceCIDR")
    except ApiException as exc:
        if exc.status != 404:  # a cluster before 1.33 has no ServiceCIDR API
            raise
    return objs
