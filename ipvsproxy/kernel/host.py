"""Facts about the host the desired state needs (interface addresses, kernel version), and the
sysctls: read and written under /proc/sys."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import socket
from collections.abc import Iterable
from pathlib import Path

from ipvsproxy.core.desired import KUBE_IPVS0, HostFacts
from ipvsproxy.kernel import addr_codec

PROC_SYS = Path("/proc/sys")


MODULES = Path("/lib/modules")
PROC_MODULES = Path("/proc/modules")
_SCHEDULER = re.compile(r"(?:^|/)ip_vs_([a-z0-9]+)\.ko", re.MULTILINE)


@functools.cache
def ipvs_schedulers(release: str | None = None) -> frozenset[str] | None:
    """The IPVS schedulers this kernel has: built in (modules.builtin), as a module
    (modules.dep) or loaded (/proc/modules), by name; ip_vs_ftp and the like are in it and never
    asked for. None when the kernel's module index cannot be read (a container without the
    node's /lib/modules, which the DaemonSet mounts): then nothing is ruled out here. Read once:
    a kernel's modules change with the kernel, which needs a reboot."""
    base = MODULES / (release or os.uname().release)
    found: set[str] = set()
    read = False
    for name in ("modules.dep", "modules.builtin"):
        with contextlib.suppress(OSError):
            found.update(_SCHEDULER.findall((base / name).read_text(errors="replace")))
            read = True
    with contextlib.suppress(OSError):
        found.update(line.split(" ", 1)[0][len("ip_vs_"):]
                     for line in PROC_MODULES.read_text().splitlines()
                     if line.startswith("ip_vs_"))
    return frozenset(found) if read else None


def host_facts() -> HostFacts:
    """The addresses of every link but kube-ipvs0 (every reader of HostFacts.addresses leaves
    those out, and at 10,000 services they are 10,000: read at every full sync, decoded by
    pyroute2 they cost 0.65 s on the host, several seconds in the lab), the kernel's version
    and its IPVS schedulers."""
    names = dict(socket.if_nameindex())
    skip = next((i for i, n in names.items() if n == KUBE_IPVS0), None)
    addrs = [(names.get(i, ""), a) for i, a in addr_codec.addresses(skip)]
    m = re.match(r"(\d+)\.(\d+)", os.uname().release)
    kernel = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    return HostFacts(tuple(addrs), kernel, ipvs_schedulers())


def read_sysctls(keys: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k in keys:
        with contextlib.suppress(OSError):
            out[k] = (PROC_SYS / k).read_text().strip()
    return out


def write_sysctl(key: str, value: str) -> None:
    (PROC_SYS / key).write_text(value + "\n")
