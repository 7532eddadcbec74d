"""Reading Kubernetes objects from files: YAML or JSON, one or many documents, `kind: List` (what
`kubectl get KINDS -A -o yaml|json` writes), a directory of such files (sorted by name), or
standard input (`-`).

JSON is recognised by its first character whatever the file is called (`kubectl -o json >
dump.yaml` happens), and read with the json module, also as a stream of concatenated documents.
YAML goes first to ipvsproxy.inputs.kubeyaml, which reads the regular subset kubectl writes at a few
times the JSON time and gives exactly what libyaml's loader would (issue 22: libyaml's loader
takes 50-100x the JSON time); a file outside that subset (comments, anchors, flow style ...) is
read with libyaml's loader (`yaml.CSafeLoader`, which PyYAML's wheels carry), each as kubectl
means it (ipvsproxy/inputs/kubectl_yaml.py: `note: =`, an unquoted timestamp, are strings). PyYAML's
pure-Python loader takes ~10x as long again (12.4 s against 1.5 s for 2,000 services x 10
endpoints), so without libyaml a large file outside the subset gets a warning that says why it
is slow.

Text nested deeper than any Kubernetes object (kubectl_yaml.MAX_DEPTH, 1,000 levels, for
YAML; the json module's own bound, the interpreter's recursion limit, for JSON) is refused
with a message naming the file: libyaml's loader would end the process (issue 32, item 11).
In a directory, a file that cannot be read is reported and the others are read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SUFFIXES = {".yaml", ".yml", ".json"}
SLOW_YAML_BYTES = 1 << 20  # without libyaml, a file this big is worth a warning


class ManifestError(Exception):
    """A file that cannot be read or parsed; the message names it."""


def _json_documents(text: str) -> list[Any]:
    """One JSON document, or several one after another (as `kubectl get a -o json; kubectl get
    b -o json` writes them)."""
    try:
        return [json.loads(text)]
    except json.JSONDecodeError as first:
        decoder = json.JSONDecoder()
        docs: list[Any] = []
        i, n = 0, len(text)
        while True:
            while i < n and text[i].isspace():
                i += 1
            if i == n:
                return docs
            try:
                doc, i = decoder.raw_decode(text, i)
            except json.JSONDecodeError:
                raise first from None
            docs.append(doc)


def _too_deep(name: str, what: str) -> ManifestError:
    from ipvsproxy.inputs.kubectl_yaml import MAX_DEPTH

    depth = (f"more than {MAX_DEPTH:,} levels deep" if what == "YAML" else
             "deeper than the json module reads (about 1,000 levels)")
    return ManifestError(f"{name}: refused: {what} nested {depth}; no Kubernetes object "
                         "nests more than a few dozen")


def _yaml_documents(text: str, name: str) -> list[Any]:
    import yaml

    from ipvsproxy.inputs import kubeyaml
    from ipvsproxy.inputs.kubectl_yaml import KubectlLoader, KubectlPyLoader, too_deep

    docs = kubeyaml.load_all(text)
    if docs is not None:
        return [d for d in docs if d is not None]
    loader = KubectlLoader if hasattr(yaml, "CSafeLoader") else KubectlPyLoader
    if loader is KubectlPyLoader and len(text) >= SLOW_YAML_BYTES:
        print(f"warning: {name}: PyYAML has no libyaml here, so this YAML is read with its "
              "pure-Python loader (about 10x slower; JSON is read fast)", file=sys.stderr)
    # libyaml's loader recurses in C as deep as the text nests: 30,000 levels end the process
    if too_deep(text):
        raise _too_deep(name, "YAML")
    try:
        return [d for d in yaml.load_all(text, Loader=loader) if d is not None]
    except (yaml.YAMLError, ValueError) as exc:
        raise ManifestError(f"{name}: invalid YAML: {exc}") from None
    except RecursionError:  # the pure-Python loader, short of the bound
        raise _too_deep(name, "YAML") from None


def parse(text: str, name: str) -> list[Any]:
    """The documents of one file's text (`name` is for messages)."""
    if text.lstrip()[:1] in ("{", "["):
        try:
            return _json_documents(text)
        except RecursionError:  # the json module's bound: the interpreter's, ~1,000 levels
            raise _too_deep(name, "JSON") from None
        except json.JSONDecodeError as exc:
            if name.endswith(".json"):
                raise ManifestError(f"{name}: invalid JSON: {exc}") from None
            # not JSON after all: YAML flow style starts the same way
    return _yaml_documents(text, name)


def _load(path: Path) -> list[Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ManifestError(f"{path}: {exc.strerror or exc}") from None
    if path.suffix == ".json" and not text.strip():
        raise ManifestError(f"{path}: invalid JSON: the file is empty")
    return parse(text, str(path))


def load_objects(path: str) -> list[Any]:
    if path == "-":
        return parse(sys.stdin.read(), "<stdin>")
    p = Path(path)
    if p.is_dir():
        # a file that cannot be read costs its own objects only, as an invalid object does
        files = sorted(f for f in p.rglob("*") if f.suffix in SUFFIXES and f.is_file())
        out: list[Any] = []
        for f in files:
            try:
                out += _load(f)
            except ManifestError as exc:
                print(f"warning: {exc}; its objects are left out, the other files are read",
                      file=sys.stderr)
        return out
    if not p.exists():
        raise ManifestError(f"{path}: no such file or directory")
    return _load(p)
