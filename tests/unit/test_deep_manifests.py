"""Over-deep input (issue 32, item 11): YAML nested 30,000 levels ended the process inside
libyaml (SIGSEGV), JSON nested 100,000 levels with an uncaught RecursionError. Each attack is
performed as a user would, a new `ipvsproxy sync --once --from-file ... -o json` process on the
host: it must be refused with a message naming the file, and in a directory the other files
must still be read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ipvsproxy.inputs import kubeyaml, manifests
from ipvsproxy.inputs.kubectl_yaml import MAX_DEPTH, too_deep

ROOT = Path(__file__).resolve().parents[2]

SERVICE = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": "web", "namespace": "default"},
           "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                    "ports": [{"name": "http", "protocol": "TCP", "port": 80}]}}

ATTACKS = {
    "flow.yaml": "a: " + "[" * 30_000 + "]" * 30_000 + "\n",
    "compact.yaml": "- " * 30_000 + "a\n",
    "mappings.yaml": "a: " + "{a: " * 30_000 + "1" + "}" * 30_000 + "\n",
    "deep.json": '{"a":' * 100_000 + "1" + "}" * 100_000,
    "arrays.json": "[" * 100_000 + "]" * 100_000,
}


def sync_json(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ipvsproxy", "sync", "--once", "--from-file",
                           str(path), "-o", "json", "--hostname-override", "node-a"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_over_deep_input_is_refused_naming_the_file(tmp_path: Path, name: str) -> None:
    f = tmp_path / name
    f.write_text(ATTACKS[name])
    p = sync_json(f)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])  # not -11 (SIGSEGV), not 1
    assert f"{f}: refused: {'JSON' if name.endswith('json') else 'YAML'} nested" in p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_in_a_directory_the_other_files_are_read(tmp_path: Path) -> None:
    for name, text in ATTACKS.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "web.yaml").write_text(json.dumps(SERVICE))
    p = sync_json(tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert [v["virtual_server"] for v in json.loads(p.stdout)["virtual_servers"]] == [
        "TCP 10.96.0.10:80"]
    for name in ATTACKS:
        assert f"warning: {tmp_path / name}: refused:" in p.stderr
        assert "the other files are read" in p.stderr


def nested_yaml(levels: int) -> str:
    """`levels` collections, one in another, as block mappings kubectl would indent."""
    return "".join("  " * i + "a:\n" for i in range(levels - 1)) + "  " * (levels - 1) + "a: 1\n"


def test_the_bound_is_exact_and_far_above_real_objects() -> None:
    """MAX_DEPTH collections are read, one more is refused, whichever reader would read it."""
    assert MAX_DEPTH >= 1000
    for text, depth in [("a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n",
                         MAX_DEPTH), ("- " * MAX_DEPTH + "a\n", MAX_DEPTH),
                        (nested_yaml(MAX_DEPTH), MAX_DEPTH)]:
        assert not too_deep(text)
        assert manifests.parse(text, "ok.yaml")
        deeper = "- " + text.replace("\n", "\n  ").rstrip(" ")  # one more: a sequence around
        assert too_deep(deeper), depth
        with pytest.raises(manifests.ManifestError, match=r"x\.yaml: refused: YAML nested more "
                                                          r"than 1,000 levels deep"):
            manifests.parse(deeper, "x.yaml")
    # the fast reader hands over anything indented deep enough to come near the bound
    assert kubeyaml.load_all(nested_yaml(200)) is not None
    assert kubeyaml.load_all(nested_yaml(300)) is None
    # JSON: the json module's own bound (the interpreter's recursion limit) is the limit
    assert manifests.parse('{"a":' * 900 + "1" + "}" * 900, "ok.json")


def test_a_long_line_or_many_brackets_in_strings_cost_a_count_not_a_refusal() -> None:
    """The cheap bound (twice the longest line, plus every bracket) is only a bound: text
    over it is counted event by event and read when it is not deep."""
    text = ("a: '" + "[" * 5000 + "'\nb: " + "x" * 5000 + "\n")
    assert not too_deep(text)
    assert manifests.parse(text, "ok.yaml") == [{"a": "[" * 5000, "b": "x" * 5000}]
