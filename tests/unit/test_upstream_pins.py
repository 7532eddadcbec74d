"""integration/upstream/go.mod pins one Kubernetes release: every staging module at that
release's v0.x, and the cache key moves with the pins (a new pin never reuses old binaries)."""

from __future__ import annotations

import re

from integration.upstream import build

GO_MOD = (build.HERE / "go.mod").read_text()


def test_every_staging_module_is_pinned_to_the_releases_v0() -> None:
    version = build.kubernetes_version()
    assert re.fullmatch(r"v1\.\d+\.\d+", version)
    staging = "v0." + version.removeprefix("v1.")
    replaced = re.findall(r"^\s*(k8s\.io/\S+) => (k8s\.io/\S+) (v\S+)$", GO_MOD, re.M)
    assert len(replaced) >= 30
    for name, target, v in replaced:
        assert name == target and v == staging, (name, target, v)
    for needed in ("k8s.io/api", "k8s.io/client-go", "k8s.io/kube-proxy", "k8s.io/apiserver"):
        assert needed in {n for n, _, _ in replaced}


def test_the_cache_key_names_the_release_and_hashes_the_pins() -> None:
    key = build.cache_key()
    assert key.startswith(build.kubernetes_version() + "-")
    assert build.bin_dir().parent == build.CACHE
