"""Fixtures for the tests against the real API server (etcd and kube-apiserver of the release
integration/upstream/go.mod pins, run by integration/upstream/controlplane.py) on the host: no
kernel needed, so they run with the unit tests.

One control plane for the package, started before its first test and stopped after its last.
It is never skipped: without the binaries every test here fails, naming `make setup`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from integration.upstream.client import RBAC
from integration.upstream.controlplane import ControlPlane, Missing
from tests.realapi.proxycalls import can, role_rules

SA_NAMESPACE, SA_NAME = "kube-system", "ipvsproxy"
SA_USER = f"system:serviceaccount:{SA_NAMESPACE}:{SA_NAME}"


def wait_for(what: str, cond: Callable[[], Any], timeout: float = 60.0,
             diagnose: Callable[[], str] | None = None) -> Any:
    """Poll `cond` until it is truthy (and return it), or fail after `timeout` seconds: a bound
    on waiting, never a claim about how fast something is."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}"
                                 + (f"\n{diagnose()}" if diagnose else ""))
        time.sleep(0.05)


def proxy_role() -> dict[str, Any]:
    """deploy/rbac.yaml's ClusterRole."""
    return next(d for d in yaml.safe_load_all(RBAC.read_text()) if d and d["kind"] == "ClusterRole")


@pytest.fixture(scope="package")
def control_plane() -> Iterator[ControlPlane]:
    try:
        cp = ControlPlane()
    except Missing as exc:
        pytest.fail(f"the real control plane cannot start: {exc}", pytrace=False)
    try:
        cp.start()
    except BaseException:
        cp.close()
        raise
    print(f"control plane up: etcd {cp.timings['etcd']:.2f} s, "
          f"kube-apiserver {cp.timings['kube-apiserver']:.2f} s")
    yield cp
    cp.close()


class Applied:
    """Applies objects through the control plane and deletes them all again at the end."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.objects: list[dict[str, Any]] = []

    def apply(self, objects: dict[str, Any] | Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        objs = [objects] if isinstance(objects, dict) else list(objects)
        self.objects.extend(objs)
        return self.cp.apply(objs)

    def delete(self, obj: dict[str, Any]) -> None:
        self.cp.delete(obj)

    def cleanup(self) -> None:
        if not self.cp.running:
            self.cp.start()
        for obj in reversed(self.objects):
            self.cp.delete(obj)


@pytest.fixture
def cluster(control_plane: ControlPlane) -> Iterator[Applied]:
    """The running control plane's objects: what a test applies is deleted after it, and an
    API server it left stopped is started again."""
    if not control_plane.running:
        control_plane.start()
    applied = Applied(control_plane)
    try:
        yield applied
    finally:
        applied.cleanup()


@pytest.fixture(scope="package")
def proxy_token(control_plane: ControlPlane) -> str:
    """deploy/rbac.yaml applied for real, and a token of its ServiceAccount from the
    TokenRequest API, once the authorizer has seen the binding."""
    control_plane.apply_rbac()
    token = control_plane.token(SA_NAMESPACE, SA_NAME)
    rules = role_rules(proxy_role())
    wait_for("the ClusterRoleBinding to reach the authorizer",
             lambda: all(can(control_plane, SA_USER, r) for r in rules))
    return token


@pytest.fixture
def proxy_kubeconfig(control_plane: ControlPlane, proxy_token: str, tmp_path: Path) -> Path:
    return control_plane.kubeconfig(tmp_path / "kubeconfig", proxy_token)
