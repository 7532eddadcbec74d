"""Manifests in every format users have (issue 22): YAML (kubectl's subset by the fast reader,
the rest by libyaml's loader, a warned fallback), JSON by content whatever the name, JSON
streams, kind: List, directories and standard input."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from ipvsproxy.inputs import manifests
from ipvsproxy.inputs.kubectl_yaml import KubectlLoader, KubectlPyLoader
from ipvsproxy.inputs.manifests import ManifestError, load_objects
from tests.unit.kube_objects import ep, node, port, service, slice_


def dump() -> dict[str, Any]:
    """What `kubectl get services,endpointslices,nodes -A -o yaml|json` writes: one List."""
    items = [service("web", "10.96.0.10", port(80, "http"), ns="a"),
             slice_("web", ep("10.244.1.5", "node-a"), port_name="http", ns="a"), node()]
    for o, v in zip(items, ("v1", "discovery.k8s.io/v1", "v1"), strict=True):
        o["apiVersion"] = v
        o["metadata"]["creationTimestamp"] = "2026-11-24T10:00:00Z"
    return {"apiVersion": "v1", "kind": "List", "items": items,
            "metadata": {"resourceVersion": ""}}


@pytest.mark.parametrize("name,text", [
    ("d.yaml", yaml.safe_dump(dump())),
    ("d.json", json.dumps(dump(), indent=4)),
    ("d.yaml", json.dumps(dump(), indent=4)),  # kubectl -o json > d.yaml
    ("d", json.dumps(dump())),
])
def test_one_list_in_every_spelling(tmp_path: Path, name: str, text: str) -> None:
    f = tmp_path / name
    f.write_text(text)
    assert load_objects(str(f)) == [dump()]


def test_json_streams_and_yaml_streams(tmp_path: Path) -> None:
    items = dump()["items"]
    f = tmp_path / "s.json"
    f.write_text("\n".join(json.dumps(i, indent=2) for i in items))
    assert load_objects(str(f)) == items
    g = tmp_path / "s.yaml"
    g.write_text(yaml.safe_dump_all(items))
    assert load_objects(str(g)) == items


def test_yaml_flow_style_that_starts_like_json(tmp_path: Path) -> None:
    f = tmp_path / "flow.yaml"
    f.write_text("{kind: Service, metadata: {name: a}}\n")
    assert load_objects(str(f)) == [{"kind": "Service", "metadata": {"name": "a"}}]


def test_standard_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump(dump())))
    assert load_objects("-") == [dump()]


def test_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{\"kind\": ")
    with pytest.raises(ManifestError, match=r"bad\.json: invalid JSON"):
        load_objects(str(bad))
    bad_yaml = tmp_path / "bad.yaml"
    for text in ("a: [\n", "metadata:\n  name: 'x\n", "a: *nowhere\n"):
        bad_yaml.write_text(text)
        with pytest.raises(ManifestError, match=r"bad\.yaml: invalid YAML"):
            load_objects(str(bad_yaml))


def test_kubectls_yaml_is_read_by_the_fast_reader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kubectl's layout (here PyYAML's, the same subset) never reaches a YAML library's
    loader; the documents are those libyaml's loader gives, empty ones dropped."""
    text = "---\n" + yaml.safe_dump(dump()) + "---\n---\n" + yaml.safe_dump(dump()["items"][0])
    f = tmp_path / "d.yaml"
    f.write_text(text)
    expected = [d for d in yaml.load_all(text, Loader=yaml.CSafeLoader) if d is not None]
    monkeypatch.setattr(yaml, "load_all", None)
    assert load_objects(str(f)) == expected == [dump(), dump()["items"][0]]


def test_libyaml_is_used_and_its_absence_is_warned_for_large_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    """YAML outside the fast reader's subset (a comment, here) goes to libyaml's loader."""
    assert yaml.__with_libyaml__  # the wheels carry it: a fresh venv must have it
    used: list[Any] = []
    real = yaml.load_all
    monkeypatch.setattr(yaml, "load_all", lambda s, Loader: used.append(Loader) or real(s, Loader))
    f = tmp_path / "d.yaml"
    f.write_text("# kubectl get services,endpointslices,nodes -A -o yaml\n"
                 + yaml.safe_dump(dump()))
    assert load_objects(str(f)) == [dump()]
    assert used == [KubectlLoader] and issubclass(KubectlLoader, yaml.CSafeLoader)
    monkeypatch.delattr(yaml, "CSafeLoader")
    monkeypatch.setattr(manifests, "SLOW_YAML_BYTES", 10)
    assert load_objects(str(f)) == [dump()]
    assert used[-1] is KubectlPyLoader and issubclass(KubectlPyLoader, yaml.SafeLoader)
    assert "pure-Python loader" in capsys.readouterr().err
