"""Facts about the host the desired state needs (interface addresses, kernel version), and the
sysctls: read and written under /proc/sys."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from ipaddress import ip_address
from pathlib import Path

from pyroute2 import IPRoute

from ipvsproxy.core.desired import HostFacts

PROC_SYS = Path("/proc/sys")


def host_facts() -> HostFacts:
    with IPRoute() as ipr:
        names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
        addrs = []
        for msg in ipr.get_addr():
            a = msg.get_attr("IFA_ADDRESS")
            if a:
                addrs.append((names.get(msg["index"], ""), ip_address(a)))
    m = re.match(r"(\d+)\.(\d+)", os.uname().release)
    kernel = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    return HostFacts(tuple(addrs), kernel)


def read_sysctls(keys: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k in keys:
        with contextlib.suppress(OSError):
            out[k] = (PROC_SYS / k).read_text().strip()
    return out


def write_sysctl(key: str, value: str) -> None:
    (PROC_SYS / key).write_text(value + "\n")
