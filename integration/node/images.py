"""The images of `make e2e`, built without Docker: a base, ipvsproxy, the workload, kube-proxy.

No registry is reachable from this project's machines, so nothing is pulled:

- **the base** is Debian bookworm made by `debootstrap` from Debian's packages, plus the Python
  the project's Dockerfile expects of `python:3.11-slim-bookworm` (`python`, `pip`, installing
  into the system, CA certificates); its root filesystem is cached as a tar under
  ``~/.cache/ipvsproxy-images/base-<key>/``, the key hashing the recipe below, and imported into
  buildah's storage (also under that cache) as ``localhost/ipvsproxy-e2e/base:<key>``;
- **ipvsproxy's image** is built from the project's own Dockerfile by buildah (Debian's), the
  base given as the build argument ``BASE``: the Dockerfile is the one users build, only its
  ``FROM`` differs;
- **the workload** (``integration/node/workload/``: an HTTP and UDP echo answering with its
  pod's name), **kube-proxy** (the v1.35.4 binary of integration/upstream/ with the tools its
  image has) and **the pause image** (a static C program, what containerd runs as each pod's
  sandbox) are built the same way.

Each image is written as a docker-archive tar, which the node imports into containerd
(`ctr images import`). buildah's layer cache makes a second build of an unchanged image
take seconds.

    python -m integration.node.images [--only NAME ...]   # build all, print the archives
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "ipvsproxy-images"
# Image names: under localhost/, so nobody mistakes them for published ones.
REPO = "localhost/ipvsproxy-e2e"

# The base: what python:3.11-slim-bookworm gives the Dockerfile. That image is Debian bookworm
# slim with CPython 3.11 in /usr/local, pip installing into it, CA certificates, netbase and
# tzdata. Debian's own python3 (3.11.2) takes its place; its pip refuses to install into the
# system (PEP 668's EXTERNALLY-MANAGED marker), which the official image does not, so the
# marker goes.
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-pip", "ca-certificates", "netbase", "tzdata")
BASE_SCRIPT = """set -eu
rm -f /usr/lib/python3.11/EXTERNALLY-MANAGED
ln -sf /usr/bin/python3 /usr/local/bin/python
ln -sf /usr/bin/pip3 /usr/local/bin/pip
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/* /usr/share/doc/* /usr/share/man/*
"""


class ImageError(Exception):
    """An image could not be built; the message says what failed."""


def _run(argv: list[str], *, what: str, cwd: Path | None = None,
         env: dict[str, str] | None = None, quiet: bool = True) -> str:
    p = subprocess.run(argv, cwd=cwd, env=env, text=True, stdin=subprocess.DEVNULL,
                       capture_output=quiet, check=False)
    if p.returncode != 0:
        tail = ((p.stdout or "") + (p.stderr or ""))[-3000:]
        raise ImageError(f"{what} failed (exit {p.returncode}): {' '.join(argv)}\n{tail}")
    return p.stdout or ""


def _need(tool: str, package: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise ImageError(f"{tool} is missing: `make host-packages` installs {package}")
    return path


def buildah(*args: str, quiet: bool = True) -> str:
    """buildah with the project's own storage under the cache (never the machine's default),
    chroot isolation and the host's network for RUN steps (apt-get and pip in the Dockerfile
    reach Debian's mirror and PyPI; no CNI setup on the build machine)."""
    return _run([_need("buildah", "buildah"), "--root", str(CACHE / "containers"),
                 "--runroot", "/run/ipvsproxy-e2e-buildah", "--storage-driver", "overlay",
                 *args], what=f"buildah {args[0]}", quiet=quiet)


def _exists(image: str) -> bool:
    p = subprocess.run([_need("buildah", "buildah"), "--root", str(CACHE / "containers"),
                        "--runroot", "/run/ipvsproxy-e2e-buildah", "--storage-driver", "overlay",
                        "inspect", "--type", "image", image],
                       capture_output=True, check=False)
    return p.returncode == 0


# --------------------------------------------------------------------------------------- base


def base_key() -> str:
    h = hashlib.sha256()
    for part in (SUITE, MIRROR, " ".join(BASE_PACKAGES), BASE_SCRIPT):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:12]


def base_rootfs() -> Path:
    """The base's root filesystem as a tar: debootstrap once, then from the cache."""
    key = base_key()
    final = CACHE / f"base-{key}"
    tar = final / "rootfs.tar"
    if tar.exists():
        return tar
    debootstrap = _need("debootstrap", "debootstrap")
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"base-{key}.", dir=CACHE))
    try:
        rootfs = work / "rootfs"
        t = time.monotonic()
        print(f"images: debootstrap {SUITE} into {rootfs} ...", file=sys.stderr, flush=True)
        _run([debootstrap, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
              SUITE, str(rootfs), MIRROR], what="debootstrap")
        _run(["chroot", str(rootfs), "/bin/sh", "-c", BASE_SCRIPT], what="base set-up")
        (work / "out").mkdir()
        _run(["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf",
              str(work / "out" / "rootfs.tar"), "."], what="tar of the base")
        (work / "out" / "recipe").write_text(
            f"debootstrap --variant=minbase --include={','.join(BASE_PACKAGES)} {SUITE} "
            f"{MIRROR}\n{BASE_SCRIPT}")
        shutil.rmtree(final, ignore_errors=True)
        (work / "out").rename(final)
        print(f"images: base built in {time.monotonic() - t:.0f} s: {tar}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return tar


def base_image() -> str:
    """The base in buildah's storage (imported from the cached tar when missing)."""
    name = f"{REPO}/base:{base_key()}"
    if _exists(name):
        return name
    tar = base_rootfs()
    ctr = buildah("from", "--quiet", "scratch").strip()
    try:
        buildah("add", ctr, str(tar), "/")
        buildah("config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
                "/sbin:/bin", "--env", "LANG=C.UTF-8", "--cmd", "python3", ctr)
        buildah("commit", "--quiet", ctr, name)
    finally:
        buildah("rm", ctr)
    return name


# ------------------------------------------------------------------------------------- images


@dataclass(frozen=True)
class Image:
    name: str      # e.g. localhost/ipvsproxy-e2e/ipvsproxy:0.1.0
    archive: Path  # docker-archive tar for `ctr images import`
    id: str        # the image ID buildah gave it


def _archive(name: str) -> Image:
    image_id = buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}",
                       name).strip()
    out = CACHE / "archives"
    out.mkdir(parents=True, exist_ok=True)
    safe = name.replace("/", "_").replace(":", "_")
    archive = out / f"{safe}-{image_id[:12]}.tar"
    if not archive.exists():
        tmp = archive.with_suffix(".partial")
        tmp.unlink(missing_ok=True)
        buildah("push", "--quiet", name, f"docker-archive:{tmp}:{name}")
        tmp.rename(archive)
        for old in out.glob(f"{safe}-*.tar"):  # an older build of the same name
            if old != archive:
                old.unlink()
    return Image(name, archive, image_id)


def _machine_trust() -> tuple[str, ...]:
    """The build machine's CA bundle over the image's, for the RUN steps only (a bind mount is
    not committed into the image): where the machine reaches PyPI through a TLS-inspecting
    proxy, Debian's pip in the base trusts what the machine trusts. Nothing when the machine
    has no bundle of its own."""
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    return ("--volume", f"{bundle}:{bundle}:ro") if bundle.exists() else ()


def build(name: str, dockerfile: Path, context: Path, base: str,
          extra: tuple[str, ...] = ()) -> Image:
    """`buildah bud` of `dockerfile` in `context` with BASE=`base`; the image, archived."""
    t = time.monotonic()
    buildah("bud", "--quiet", "--layers", "--isolation", "chroot", "--network", "host",
            *_machine_trust(), "--build-arg", f"BASE={base}", "-f", str(dockerfile),
            "-t", name, *extra, str(context))
    img = _archive(name)
    print(f"images: {name} ({img.id[:12]}) in {time.monotonic() - t:.0f} s",
          file=sys.stderr, flush=True)
    return img


def ipvsproxy(tag: str = "0.1.0", revision: str = "") -> Image:
    """The project's Dockerfile, as a user builds it, on the local base. `revision` labels a
    second build (a new image for a rolling update) without changing anything else."""
    extra = ("--label", f"org.opencontainers.image.revision={revision}") if revision else ()
    return build(f"{REPO}/ipvsproxy:{tag}", ROOT / "Dockerfile", ROOT, base_image(), extra)


def workload() -> Image:
    return build(f"{REPO}/echo:1", HERE / "workload" / "Dockerfile", HERE / "workload",
                 base_image())


def pause() -> Image:
    return build(f"{REPO}/pause:1", HERE / "pause" / "Dockerfile", HERE / "pause", base_image())


def kube_proxy() -> Image:
    """kube-proxy v1.35.4 (integration/upstream's build) with the node tools its own image
    has (iptables both backends, ipset, ipvsadm, conntrack, kmod)."""
    from integration.upstream import build as upstream

    bins = upstream.built()
    if bins is None:
        raise ImageError("kube-proxy is not built: run `make setup`")
    with tempfile.TemporaryDirectory(prefix="kube-proxy-image-") as tmp:
        shutil.copy2(bins / "kube-proxy", Path(tmp) / "kube-proxy")
        shutil.copy2(HERE / "kube-proxy" / "Dockerfile", Path(tmp) / "Dockerfile")
        return build(f"{REPO}/kube-proxy:{upstream.kubernetes_version()}",
                     Path(tmp) / "Dockerfile", Path(tmp), base_image())


BUILDERS = {"ipvsproxy": ipvsproxy, "echo": workload, "pause": pause, "kube-proxy": kube_proxy}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(BUILDERS),
                        help="build only these (default: all)")
    args = parser.parse_args(argv)
    try:
        for name in args.only or list(BUILDERS):
            img = BUILDERS[name]()
            print(f"{img.name} {img.archive}")
    except ImageError as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
