"""Which Kubernetes service port owns each virtual server: published by the syncs (`run` and
`sync --once`), read by `ipvsproxy ls --services` and `ipvsproxy explain --service`.

The kernel keeps no names, so the syncs write them next to what they program: one file,
`/run/ipvsproxy/services` (IPVSPROXY_STATE_DIR names another folder), one line per virtual
server, the key as ipvsproxy prints it (`TCP 10.96.0.10:80`, `UDP [fd00::a]:53`, `FWM 7`,
`FWM 7 IPv6`), a tab, and `namespace/name:port` (`namespace/name` for an unnamed port). Lines
keep the desired state's order, so a service port's ClusterIP comes before its other frontends.
The file is replaced atomically (a temporary file renamed over it), readable by all, writable by
root only; /run is a tmpfs, so it vanishes with a reboot, as the kernel's tables do.
"""

from __future__ import annotations

import ipaddress
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ipvsproxy.core.ipvs import AF_INET, AF_INET6, Protocol, ServiceKey

DEFAULT_DIR = "/run/ipvsproxy"
FILE = "services"


def path() -> Path:
    return Path(os.environ.get("IPVSPROXY_STATE_DIR") or DEFAULT_DIR) / FILE


def render(owners: Mapping[ServiceKey, str]) -> str:
    return "".join(f"{key}\t{owner}\n" for key, owner in owners.items())


def parse_key(text: str) -> ServiceKey:
    """The inverse of str(ServiceKey). ValueError when it is not one."""
    words = text.split()
    if len(words) in (2, 3) and words[0] == "FWM":
        if len(words) == 3 and words[2] != "IPv6":
            raise ValueError(f"not a virtual server: {text!r}")
        return ServiceKey.mark(int(words[1]), AF_INET6 if len(words) == 3 else AF_INET)
    if len(words) != 2 or words[0] not in ("TCP", "UDP", "SCTP"):
        raise ValueError(f"not a virtual server: {text!r}")
    host, sep, port = words[1].rpartition(":")
    if not sep:
        raise ValueError(f"not a virtual server: {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return ServiceKey.inet(Protocol[words[0]], ipaddress.ip_address(host), int(port))


def parse(text: str) -> dict[ServiceKey, str]:
    """Lines that do not parse are skipped: a damaged file costs names, never the listing."""
    out: dict[ServiceKey, str] = {}
    for line in text.splitlines():
        key, sep, owner = line.partition("\t")
        if not sep or not owner:
            continue
        try:
            out[parse_key(key)] = owner
        except ValueError:
            continue
    return out


def read(where: Path | None = None) -> dict[ServiceKey, str]:
    """The published names; empty when no sync has published any (or the file is unreadable)."""
    try:
        return parse((where or path()).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return {}


def write(owners: Mapping[ServiceKey, str], where: Path | None = None) -> None:
    """Replace the file with these names (atomically). OSError when the folder is unusable."""
    target = where or path()
    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{FILE}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(render(owners))
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove(where: Path | None = None) -> None:
    (where or path()).unlink(missing_ok=True)


class Publisher:
    """Writes the names after a sync only when they changed since the last write."""

    def __init__(self, where: Path | None = None) -> None:
        self.where = where
        self.last: dict[ServiceKey, str] | None = None

    def publish(self, owners: Mapping[ServiceKey, str]) -> bool:
        if self.last is not None and self.last == owners:
            return False
        write(owners, self.where)
        self.last = dict(owners)
        return True


def lookup(names: Mapping[ServiceKey, str], service: str, af: int | None = None
           ) -> list[ServiceKey]:
    """The virtual servers of `namespace/name[:port]` (port: the port's name, or its number
    as a virtual server of the service carries it), in published order, of family `af` if
    given. Without a port, every port of the service matches."""
    ns_name, _, port = service.partition(":")
    keys = [k for k, owner in names.items() if (af is None or k.af == af)
            and (owner == ns_name or owner.startswith(ns_name + ":"))]
    if not port:
        return keys
    by_name = [k for k in keys if names[k] == f"{ns_name}:{port}"]
    if by_name or not port.isdigit():
        return by_name
    # a port number: the service ports one of whose virtual servers listens on it
    owners = {names[k] for k in keys if k.port == int(port)}
    return [k for k in keys if names[k] in owners]
