"""Build the upstream test components once and cache them outside the checkout.

kube-apiserver, kube-proxy, kube-controller-manager, kube-scheduler, kubelet and kubectl
(k8s.io/kubernetes) and etcd (go.etcd.io/etcd/server/v3) are built
from the Go module proxy with the go.mod beside this file, into
``~/.cache/ipvsproxy-upstream/<key>/`` where the key hashes go.mod, go.sum, etcd/main.go and the
Go version: a second ``make setup`` finds them and builds nothing; a new pin builds anew. These
binaries are for the tests only (the real control plane and the reference kube-proxy); nothing
of the product is Go. Beside them, kubectl's YAML writer for the reader's tests (kubectl_yaml).

    python -m integration.upstream.build            # build if missing (and kubectl_yaml's);
                                                    # print the bin folder
    python -m integration.upstream.build --print    # print the folder, fail if not built
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "ipvsproxy-upstream"
# What is built, and from which package of the module graph.
PACKAGES = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
    "etcd": "./etcd",
    # The node of `make e2e` (integration/node/): the rest of a control plane, a kubelet, and
    # the kubectl an operator types (deploy/README.md's commands, `apply -k` included).
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kubelet": "k8s.io/kubernetes/cmd/kubelet",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
}
KEYED_FILES = ("go.mod", "go.sum", "etcd/main.go")


def kubernetes_version() -> str:
    """The k8s.io/kubernetes version go.mod pins (``v1.35.4``)."""
    m = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", (HERE / "go.mod").read_text(), re.M)
    if not m:
        raise SystemExit("integration/upstream/go.mod requires no k8s.io/kubernetes version")
    return m.group(1)


def _go() -> str:
    go = shutil.which("go")
    if not go:
        raise SystemExit("go is not on PATH: the upstream test components are built with Go 1.25+")
    return go


def _digest(files: tuple[str, ...]) -> str:
    """12 hex digits of a hash over these files (names and contents) and the Go version."""
    h = hashlib.sha256()
    for name in files:
        h.update(name.encode() + b"\0" + (HERE / name).read_bytes() + b"\0")
    h.update(subprocess.run([_go(), "env", "GOVERSION"], capture_output=True, text=True,
                            check=True).stdout.encode())
    return h.hexdigest()[:12]


def cache_key() -> str:
    return f"{kubernetes_version()}-{_digest(KEYED_FILES)}"


def bin_dir() -> Path:
    return CACHE / cache_key()


def built() -> Path | None:
    d = bin_dir()
    return d if (d / ".complete").exists() else None


def build() -> Path:
    """Build every binary into a fresh folder and mark it complete only at the end."""
    if (d := built()) is not None:
        return d
    final = bin_dir()
    work = final.with_name(final.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    version = kubernetes_version()
    major, minor = version.lstrip("v").split(".")[:2]
    # What `make` in kubernetes stamps into its binaries (hack/lib/version.sh): the API server
    # reports it at /version, and kube-proxy logs it.
    stamp = " ".join(
        f"-X {pkg}.{var}={val}"
        for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for var, val in (("gitVersion", version), ("gitMajor", major), ("gitMinor", minor),
                         ("gitTreeState", "clean"))
    )
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod")
    for name, pkg in PACKAGES.items():
        t = time.monotonic()
        print(f"building {name} ({pkg}) ...", file=sys.stderr, flush=True)
        subprocess.run([_go(), "build", "-trimpath", "-ldflags", f"-s -w {stamp}",
                        "-o", str(work / name), pkg], cwd=HERE, env=env, check=True)
        print(f"built {name} in {time.monotonic() - t:.0f} s", file=sys.stderr, flush=True)
    (work / ".complete").write_text(version + "\n")
    shutil.rmtree(final, ignore_errors=True)
    work.rename(final)
    return final


# kubectl's YAML writer (kubectlyaml/main.go: sigs.k8s.io/yaml at the version k8s.io/kubernetes
# requires, so go.mod and go.sum pin it), for the tests of ipvsproxy's YAML reader. Small, so
# it has a cache folder of its own: building it never makes the binaries above build again.
EMITTER_FILES = ("go.mod", "go.sum", "kubectlyaml/main.go")


def kubectl_yaml() -> Path:
    """The path of the kubectl-yaml binary, built once into CACHE/kubectl-yaml-<hash>/."""
    final = CACHE / f"kubectl-yaml-{_digest(EMITTER_FILES)}"
    binary = final / "kubectl-yaml"
    if binary.exists():
        return binary
    work = final.with_name(final.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    # -mod=readonly: the module graph is go.mod's as it is (the package needs no new pin)
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=readonly")
    subprocess.run([_go(), "build", "-trimpath", "-ldflags", "-s -w", "-o",
                    str(work / "kubectl-yaml"), "./kubectlyaml"], cwd=HERE, env=env, check=True)
    shutil.rmtree(final, ignore_errors=True)
    work.rename(final)
    return binary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true",
                        help="print the cached folder; fail if not built")
    args = parser.parse_args(argv)
    if args.print:
        d = built()
        if d is None:
            print(f"upstream binaries not built (expected in {bin_dir()}): run make setup",
                  file=sys.stderr)
            return 1
    else:
        t = time.monotonic()
        fresh = built() is None
        d = build()
        if fresh:
            print(f"upstream binaries built in {time.monotonic() - t:.0f} s: {d}", file=sys.stderr)
        kubectl_yaml()
    print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
