"""The real-IPVS kernel lab: Debian's standard kernel under qemu (software emulation) via virtme-ng.

The host kernel has no IPVS. This module fetches the kernel that Debian's `linux-image-amd64`
depends on (extracted, never installed), caches it under one directory, and runs a command in a
guest that shares the host's filesystem. It owns nothing else: the pytest bridge
(`pytest_lab.py`) and `make lab` are built on `run()`.

Facts this relies on (measured, see shared/kernel-lab.md):
- a stock guest kernel hangs under /dev/kvm here, so qemu runs with --disable-kvm;
- the `-cloud` flavour lacks 9p, so only the standard flavour works;
- without --verbose, virtme-ng does not show what the command prints, so the command writes its
  output and exit code into a --rwdir folder that the host reads afterwards;
- the guest's root is the host's, read-only; virtme-ng overlays /tmp, /usr, /etc, /var, and we
  add a writable overlay over the checkout (writes inside the guest never reach the host);
- the guest finds modules under the host's /lib/modules/<version>, which we populate from the
  cache and index with depmod.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "ipvsproxy-lab"
# The meta-package whose dependency names the current standard kernel.
META_PACKAGE = "linux-image-amd64"


class LabError(Exception):
    """The lab could not fetch its kernel or boot; the message says why and what to do."""


@dataclass(frozen=True)
class Kernel:
    version: str
    vmlinuz: Path
    modules: Path


@dataclass(frozen=True)
class LabResult:
    rc: int
    output: str
    kernel_release: str
    boot_seconds: float  # host wall time from launching qemu until the command started
    total_seconds: float


def cache_dir() -> Path:
    return Path(os.environ.get("IPVSPROXY_LAB_CACHE", str(DEFAULT_CACHE))).expanduser()


def _sh(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=False, text=True, capture_output=True, **kw)  # type: ignore[call-overload, no-any-return]


def resolve_kernel_package() -> str:
    """The package name `linux-image-amd64` depends on, e.g. linux-image-6.1.0-56-amd64."""
    for attempt in range(2):
        out = _sh(["apt-cache", "depends", META_PACKAGE])
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "Depends:" and parts[1].startswith("linux-image-"):
                return parts[1]
        if attempt == 0:  # apt lists may be empty on a fresh machine
            _sh(["apt-get", "update", "-qq"])
    raise LabError(
        f"cannot resolve the kernel package: `apt-cache depends {META_PACKAGE}` names none "
        "(is apt reachable? try `apt-get update`)"
    )


def ensure_kernel(cache: Path | None = None) -> Kernel:
    """Return the cached lab kernel, downloading and extracting it on first use only.

    IPVSPROXY_LAB_KERNEL names another version of Debian's kernel that apt can fetch (and pins
    it for later runs); IPVSPROXY_LAB_KERNEL_DEB is the path or URL of any Debian linux-image
    .deb, e.g. a newer release's, used for that run only (see docs/testing.md, Development)."""
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    deb = os.environ.get("IPVSPROXY_LAB_KERNEL_DEB", "")
    kernel = _kernel_from_deb(deb, cache) if deb else _debian_kernel(cache)
    _install_modules(kernel)
    return kernel


def _debian_kernel(cache: Path) -> Kernel:
    pinned = cache / "current"
    version = os.environ.get("IPVSPROXY_LAB_KERNEL", "")
    if not version and pinned.exists():
        version = pinned.read_text().strip()
    root = cache / version if version else None
    if root is None or not (root / "boot" / f"vmlinuz-{version}").exists():
        package = f"linux-image-{version}" if version else resolve_kernel_package()
        version = package.removeprefix("linux-image-")
        _refuse_cloud(package)
        root = cache / version
        _download_and_extract(package, root)
    pinned.write_text(version + "\n")
    return _kernel_in(root, version)


def _kernel_in(root: Path, version: str) -> Kernel:
    # Releases since Debian 13 ship their modules under usr/lib (merged /usr).
    modules = root / "lib" / "modules" / version
    if not modules.exists():
        modules = root / "usr" / "lib" / "modules" / version
    return Kernel(version, root / "boot" / f"vmlinuz-{version}", modules)


def _kernel_from_deb(deb: str, cache: Path) -> Kernel:
    """The kernel of a linux-image .deb (a path or an http(s) URL), extracted once into the
    cache under a folder named after the .deb."""
    name = deb.rstrip("/").rsplit("/", 1)[-1]
    _refuse_cloud(name)
    root = cache / "debs" / name.removesuffix(".deb")
    if not any(root.glob("boot/vmlinuz-*")):
        root.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
            local = Path(deb)
            if deb.startswith(("http://", "https://")):
                local = Path(tmp) / name
                got = _sh(["curl", "-fsSL", "--retry", "3", "-o", str(local), deb])
                if got.returncode != 0:
                    raise LabError(f"cannot download {deb}: {got.stderr.strip()[-400:]}")
            _extract(local, root, Path(tmp))
    found = sorted(root.glob("boot/vmlinuz-*"))
    if len(found) != 1:
        raise LabError(f"{deb} holds {len(found)} kernels under boot/, not one")
    return _kernel_in(root, found[0].name.removeprefix("vmlinuz-"))


def _download_and_extract(package: str, root: Path) -> None:
    with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
        got = _sh(["apt-get", "download", package], cwd=tmp)
        debs = list(Path(tmp).glob("*.deb"))
        if not debs:
            raise LabError(f"apt-get download {package} failed: {got.stderr.strip()[-400:]}")
        _extract(debs[0], root, Path(tmp))


def _extract(deb: Path, root: Path, tmp: Path) -> None:
    """Unpack `deb` into `root`, replacing it, through a staging folder in `tmp` (a folder
    beside `root`, so the last step is one rename)."""
    staging = tmp / "x"
    ext = _sh(["dpkg-deb", "-x", str(deb), str(staging)])
    if ext.returncode != 0:
        raise LabError(f"dpkg-deb -x {deb.name} failed: {ext.stderr.strip()}")
    if root.exists():
        shutil.rmtree(root)
    staging.rename(root)


def _refuse_cloud(name: str) -> None:
    if "-cloud-" in name:
        raise LabError(f"{name}: the cloud kernel has no 9p; use the standard flavour")


def _install_modules(kernel: Kernel) -> None:
    """The guest loads modules from the host's /lib/modules/<version> (shared root filesystem)."""
    target = Path("/lib/modules") / kernel.version
    if (target / "modules.dep").exists():
        return
    if os.geteuid() != 0:
        raise LabError(f"{target} is missing and only root can install it (run as root)")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(kernel.modules, target, symlinks=True)
    dep = _sh(["depmod", kernel.version])
    if dep.returncode != 0:
        raise LabError(f"depmod {kernel.version} failed: {dep.stderr.strip()}")


def _vng() -> list[str]:
    venv_bin = Path(sys.executable).parent
    vng = shutil.which("vng", path=f"{venv_bin}:{os.environ.get('PATH', '')}")
    if not vng:
        raise LabError("virtme-ng (vng) is not installed: `make setup` installs it")
    if not shutil.which("qemu-system-x86_64"):
        raise LabError("qemu-system-x86_64 is missing: `make setup` installs qemu-system-x86")
    return [vng]


# Files glibc reads again and again: get/protobyname/number() read protocols and
# nsswitch.conf, getaddrinfo() stats resolv.conf, get/hostbyaddr/servbyport() read hosts and
# services. The guest's /etc is the host's over 9p, where each access is an emulated round trip
# (~3-10 ms): `ipset restore` of 1,000 tcp entries took 18 s, 20,000 took 220 s. On a node these
# files sit in the page cache; a tmpfs copy bound over each makes the guest behave like one for
# every command (the tools, the kernel and the files' contents are unchanged). Writes go to the
# copies and vanish with the guest, like every other write outside a --rwdir.
NODE_LIKE_ETC = ("protocols", "services", "hosts", "host.conf", "nsswitch.conf", "resolv.conf",
                 "gai.conf")

# Byte code: the guest writes __pycache__ into its throwaway overlay of the checkout, so a
# command's second Python process starts from .pyc files, as an installed package does.
GUEST_SCRIPT = """#!/bin/bash
cat /proc/uptime > {w}/started
uname -r > {w}/uname
etc=$(mktemp -d /run/ipvsproxy-etc.XXXXXX) && for f in {etc_files}; do
    [ -f /etc/$f ] && cp /etc/$f $etc/$f && mount --bind $etc/$f /etc/$f
done
cd {cwd} || exit 97
export IPVSPROXY_IN_LAB=1 HOST_KERNEL_RELEASE={host_release}
unset PYTHONDONTWRITEBYTECODE
export PATH={venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
( {command} ) > {w}/output 2>&1 < /dev/null
echo $? > {w}/rc
"""


def run(
    command: str,
    *,
    timeout: float = 1800.0,
    memory: str = "2G",
    cpus: int = 2,
    stream: bool = False,
    cwd: Path = PROJECT_ROOT,
    kernel: Kernel | None = None,
    extra_rwdirs: list[Path] | None = None,
    network: bool = False,
    vng_args: list[str] | None = None,
    on_start: Callable[[subprocess.Popen[str]], None] | None = None,
) -> LabResult:
    """Boot the lab kernel, run `command` (bash) in `cwd`, return its output and exit code.

    `network`: give the guest a NIC on qemu's user network (slirp), with no address (no
    DHCP) and its driver (virtio_net, a module) not even loaded: a test that needs it loads it
    and brings it up with a route to 10.0.2.2 only, which is the host's 127.0.0.1 as the guest
    sees it (tests/kernel/test_real_apiserver.py reaches the host's API server so). Measured:
    the boot costs no more, the NIC is up in 0.4 s, a first HTTPS request to the host takes
    0.4 s (TLS under emulation) and the next ones ~10 ms.

    `vng_args`: more virtme-ng arguments, e.g. `--disk` and `--qemu-opts` for the node of
    `make e2e` (integration/node/), whose NIC is a tap device the host reaches. `on_start`
    gets the virtme-ng process (its own process group) as soon as it runs, for a caller that
    runs this in a thread and must be able to end the guest.
    """
    kernel = kernel or ensure_kernel()
    vng = _vng()
    with tempfile.TemporaryDirectory(prefix="ipvsproxy-lab-") as wdir:
        w = Path(wdir)
        (w / "cmd.sh").write_text(
            GUEST_SCRIPT.format(
                w=w, cwd=cwd, command=command, host_release=os.uname().release,
                venv_bin=Path(sys.executable).parent, etc_files=" ".join(NODE_LIKE_ETC),
            )
        )
        argv = [
            *vng, "--run", str(kernel.vmlinuz), "--disable-kvm", "--force-9p",
            "--memory", memory, "--cpus", str(cpus),
            "--rwdir", str(w), "--overlay-rwdir", str(cwd), "--cwd", str(cwd),
            *[a for d in (extra_rwdirs or []) for a in ("--rwdir", str(d))],
            *(["--network", "user", "--no-dhcp"] if network else []),
            *(vng_args or []),
            "--exec", f"bash {w}/cmd.sh",
        ]
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        start = time.monotonic()
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=env, start_new_session=True,
        )
        if on_start is not None:
            on_start(proc)
        vng_log: list[str] = []
        reader = threading.Thread(target=lambda: vng_log.extend(proc.stdout or []), daemon=True)
        reader.start()
        try:
            boot = _wait(proc, w, start, timeout, stream)
        finally:
            if proc.poll() is None:  # interrupted: never leave a qemu behind
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        reader.join(timeout=5)
        total = time.monotonic() - start
        output = _output(w)
        if not (w / "rc").exists():
            tail = "".join(vng_log)[-2000:]
            raise LabError(
                f"the lab guest (kernel {kernel.version}) did not finish its command "
                f"(vng exit {proc.returncode}, {total:.0f}s). "
                f"Command output:\n{output[-2000:]}\nvirtme-ng said:\n{tail}"
            )
        return LabResult(
            rc=int((w / "rc").read_text().strip() or 1),
            output=output,
            kernel_release=(w / "uname").read_text().strip(),
            boot_seconds=boot if boot is not None else total,
            total_seconds=total,
        )


def _output(w: Path) -> str:
    """What the guest has printed so far ("" before it starts writing)."""
    try:
        return (w / "output").read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _wait(proc: subprocess.Popen[str], w: Path, start: float, timeout: float,
          stream: bool) -> float | None:
    boot: float | None = None
    shown = 0
    while True:
        done = proc.poll() is not None
        if boot is None and (w / "started").exists():
            boot = time.monotonic() - start
        if stream and (text := _output(w)):
            sys.stdout.write(text[shown:])
            sys.stdout.flush()
            shown = len(text)
        if done:
            return boot
        if time.monotonic() - start > timeout:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            # What the guest had printed tells a hung test from a slow machine.
            raise LabError(f"the lab guest exceeded its {timeout:.0f}s limit and was killed; "
                           f"the end of its output:\n{_output(w)[-3000:]}")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a command inside the real-IPVS kernel lab.")
    parser.add_argument("command", nargs="*", help="shell command to run in the guest")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--fetch-only", action="store_true", help="only fetch and cache the kernel")
    parser.add_argument("--rwdir", action="append", default=[], type=Path,
                        help="a host folder the guest may write into (writes elsewhere vanish)")
    parser.add_argument("--network", action="store_true",
                        help="a NIC on qemu's user network, unconfigured (see run())")
    parser.add_argument("--memory", default="2G",
                        help="the guest's memory (qemu -m); make bench-large needs more than 2G")
    args = parser.parse_args(argv)
    # SIGTERM (timeout(1), CI cancellation) unwinds like Ctrl-C, so run() kills the guest.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not args.command and not args.fetch_only:
        parser.error("a command is required (or --fetch-only)")
    try:
        kernel = ensure_kernel()
        if args.fetch_only:
            print(f"lab kernel {kernel.version} cached in {kernel.vmlinuz.parent.parent}")
            return 0
        res = run(" ".join(args.command), timeout=args.timeout, stream=True, kernel=kernel,
                  extra_rwdirs=[d.resolve() for d in args.rwdir], network=args.network,
                  memory=args.memory)
    except LabError as exc:
        print(f"lab: {exc}", file=sys.stderr)
        return 3
    print(
        f"lab: kernel {res.kernel_release} (host {os.uname().release}), "
        f"boot {res.boot_seconds:.1f}s, total {res.total_seconds:.1f}s, exit {res.rc}",
        file=sys.stderr,
    )
    return res.rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
