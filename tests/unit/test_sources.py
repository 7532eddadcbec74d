"""Where sync gets its objects: manifest files (YAML/JSON, many documents, kind: List,
directories) and a paginated list from an API server (a fake list call here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.core.cluster import build_snapshot
from ipvsproxy.inputs.manifests import ManifestError, load_objects
from ipvsproxy.kube.listing import _pages


def test_yaml_documents_lists_and_directories(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "kind: Service\nmetadata: {name: a, namespace: n}\n"
        "spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n---\n---\nkind: ConfigMap\n")
    (tmp_path / "b.json").write_text(json.dumps({
        "kind": "List", "items": [{"kind": "Service", "metadata": {"name": "b", "namespace": "n"},
                                   "spec": {"clusterIP": "10.96.0.2", "ports": [{"port": 80}]}}]}))
    (tmp_path / "notes.txt").write_text("not a manifest")
    docs = load_objects(str(tmp_path))
    snap = build_snapshot(docs, "node-a")
    assert [s.name for s in snap.services] == ["a", "b"]
    assert snap.problems == ()


def test_typed_list_items_get_their_kind(tmp_path: Path) -> None:
    f = tmp_path / "l.yaml"
    f.write_text("kind: ServiceList\nitems:\n- metadata: {name: a, namespace: n}\n"
                 "  spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n")
    assert [s.name for s in build_snapshot(load_objects(str(f)), "x").services] == ["a"]


@pytest.mark.parametrize("name, text, reason", [
    ("bad.yaml", "kind: [", "invalid YAML"),
    ("bad.json", "{", "invalid JSON"),
])
def test_unreadable_files_are_named(tmp_path: Path, name: str, text: str, reason: str) -> None:
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(ManifestError, match=f"{name}: {reason}"):
        load_objects(str(f))
    with pytest.raises(ManifestError, match="no such file"):
        load_objects(str(tmp_path / "missing.yaml"))


class _Resp:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()


def test_list_pages_follow_continue_tokens() -> None:
    calls: list[dict[str, Any]] = []
    pages = {None: ({"items": [{"metadata": {"name": "a"}}], "metadata": {"continue": "t1"}}),
             "t1": ({"items": [{"metadata": {"name": "b"}}], "metadata": {}})}

    def call(**kw: Any) -> _Resp:
        calls.append(kw)
        return _Resp(pages[kw["_continue"]])

    items = list(_pages(call, "Service", label_selector="x"))
    assert [i["metadata"]["name"] for i in items] == ["a", "b"]
    assert all(i["kind"] == "Service" for i in items)
    assert [c["_continue"] for c in calls] == [None, "t1"]
    assert all(c["_preload_content"] is False and c["label_selector"] == "x" for c in calls)
