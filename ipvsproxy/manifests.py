"""Reading Kubernetes objects from files: YAML or JSON, one or many documents, `kind: List`,
or a directory of such files (sorted by name)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SUFFIXES = {".yaml", ".yml", ".json"}


class ManifestError(Exception):
    """A file that cannot be read or parsed; the message names it."""


def _load(path: Path) -> list[Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ManifestError(f"{path}: {exc.strerror or exc}") from None
    if path.suffix == ".json":
        try:
            return [json.loads(text)]
        except json.JSONDecodeError as exc:
            raise ManifestError(f"{path}: invalid JSON: {exc}") from None
    import yaml

    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: invalid YAML: {exc}") from None


def load_objects(path: str) -> list[Any]:
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.suffix in SUFFIXES and f.is_file())
        return [d for f in files for d in _load(f)]
    if not p.exists():
        raise ManifestError(f"{path}: no such file or directory")
    return _load(p)
