"""The image, built from the project's Dockerfile as `make e2e` builds it, and run (host, no lab).

The part of `make e2e` that fits `make test`: buildah (Debian's) builds the Dockerfile on the
local bookworm base (integration/node/images.py; the base is cached, and buildah's layer cache
makes an unchanged rebuild take seconds), and the image then runs what the DaemonSet runs: the
entrypoint selecting a backend and exec'ing `ipvsproxy`, every pinned package installed and
consistent (`pip check`), the command and its subcommands importable. The rest, a node running
it, is `make e2e` (docs/e2e.md).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator

import pytest

from integration.node import images

# make test runs as root and installs buildah (make setup): there a missing buildah is a
# failure, not a skip; only a developer's unprivileged run skips
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (buildah)")


def test_buildah_is_installed() -> None:
    assert shutil.which("buildah"), "buildah missing: run make setup (host-packages)"


@pytest.fixture(scope="module")
def container() -> Iterator[str]:
    img = images.ipvsproxy()
    ctr = images.buildah("from", "--quiet", img.name).strip()
    try:
        yield ctr
    finally:
        images.buildah("rm", ctr)


def run(ctr: str, *argv: str, env: tuple[str, ...] = ()) -> str:
    return images.buildah("run", "--isolation", "chroot",
                          *[a for e in env for a in ("--env", e)], ctr, "--", *argv)


def test_the_entrypoint_selects_the_backend_and_runs_ipvsproxy(container: str) -> None:
    out = run(container, "sh", "-c", "/usr/local/bin/ipvsproxy-entrypoint ipvsproxy --version "
              "2>&1; readlink -f /usr/sbin/iptables", env=("IPTABLES_MODE=legacy",))
    lines = out.splitlines()
    record = json.loads(lines[0])
    assert record["event"] == "iptables backend legacy (from IPTABLES_MODE)"
    assert lines[1:] == ["ipvsproxy 0.1.0", "/usr/sbin/xtables-legacy-multi"]


def test_every_pinned_package_is_installed_and_consistent(container: str) -> None:
    assert "No broken requirements found." in run(container, "python3", "-m", "pip", "check")
    frozen = run(container, "python3", "-m", "pip", "freeze")
    assert "kubernetes==37.0.2" in frozen.split()
    assert "pyroute2==0.9.7" in frozen.split()


def test_the_image_is_the_command(container: str) -> None:
    cfg = json.loads(images.buildah("inspect", "--type", "container", container))
    oci = cfg["OCIv1"]["config"]
    assert oci["Entrypoint"] == ["/usr/local/bin/ipvsproxy-entrypoint", "ipvsproxy"]
    assert oci["User"] == "0"
    # every subcommand loads (imports and flags), in the image's Python
    for sub in ("run", "sync", "ls", "cleanup", "explain"):
        assert "usage: ipvsproxy" in run(container, "ipvsproxy", sub, "--help")
    for tool in ("ipset", "ipvsadm", "iptables-nft", "iptables-legacy", "modprobe"):
        assert run(container, "sh", "-c", f"command -v {tool}").strip()
