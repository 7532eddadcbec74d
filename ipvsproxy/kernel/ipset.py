"""ipsets in the kernel: create, list, bulk add/delete, flush, destroy, and atomic replace.

Control operations (create, destroy, swap, flush, names, headers) go through pyroute2's IPSet
socket. Members never do: pyroute2 encodes ~5,000 entries/s, `ipset restore` ~150,000+, so bulk
changes are one `ipset restore` process per batch and members are read by parsing `ipset save`.
Each restore script opens with its set's `create` line, which the tool needs to batch (_fill);
so replace()'s scratch set is created by the tool. The text forms (entries, scripts, parsing)
live in ipvsproxy.core.ipset_text.

`ipset restore` is not transactional: it sends lines in batches, so a failing line may leave
earlier lines applied. `replace` is the all-or-nothing path: it fills a scratch set and swaps it
in only if the fill succeeded; iptables rules keep referring to the set by name across the swap
(the kernel swaps the two sets' names and reference counts, not the rules).

Costs worth knowing: the tool resolves each entry's protocol with getprotobyname() (one read of
/etc/protocols per entry) and each address with getaddrinfo() (one stat of /etc/resolv.conf),
a large share of its per-entry cost (in the lab, whose /etc is 9p, nearly all of it); a netlink
encoder could beat the tool. pyroute2 creates sets with the
kernel's newest revision of the type; an `ipset` tool older than the kernel may then be unable
to print them (`ipset save` fails), which read() reports as IPSetToolError.
"""

from __future__ import annotations

import dataclasses
import errno
import socket
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from pyroute2 import IPSet
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.nfnetlink.ipset import (
    IPSET_ERR_BUSY,
    IPSET_ERR_EXIST_SETNAME2,
    IPSET_ERR_TYPE_MISMATCH,
    IPSET_FLAG_LIST_HEADER,
    IPSET_FLAG_LIST_SETNAME,
    IPSET_FLAG_WITH_COMMENT,
)

from ipvsproxy.core.ipset_text import (
    Family,
    MemberDelta,
    SavedSet,
    SetSpec,
    SetType,
    diff_members,
    parse_restore_error,
    parse_save,
    parse_version,
    render_adds,
    render_create,
    render_dels,
    render_delta,
    temp_name,
)
from ipvsproxy.kernel.started import Started

MIN_VERSION = (6, 0)  # what kube-proxy requires of the ipset tool
_FAMILY = {Family.INET: socket.AF_INET, Family.INET6: socket.AF_INET6}
_FAMILY_BACK = {socket.AF_INET: Family.INET, socket.AF_INET6: Family.INET6}


class IPSetError(Exception):
    """Base of every ipset failure raised here."""


class IPSetToolError(IPSetError):
    """The `ipset` tool is missing, too old, or printed something unexpected."""


class NoSuchSet(IPSetError):
    pass


class SetExists(IPSetError):
    """create(exist_ok=False) of a set that exists."""


class SetMismatch(IPSetError):
    """A set of this name exists with another type/family/options, or two sets cannot swap."""


class SetInUse(IPSetError):
    """The kernel refused to destroy a set that something (an iptables rule) references."""


class RestoreError(IPSetError):
    """A failed `ipset restore`: the set, the line (number and text) and ipset's message."""

    def __init__(self, set_name: str | None, line_no: int | None, line: str | None,
                 message: str) -> None:
        super().__init__(f"ipset restore failed in set {set_name} at line {line_no} "
                         f"({line!r}): {message}")
        self.set_name, self.line_no, self.line, self.message = set_name, line_no, line, message


@dataclass(frozen=True, slots=True)
class SetHeader:
    """A set's header as the kernel reports it (no members)."""

    spec: SetSpec
    revision: int
    references: int  # iptables rules (and list:set members) holding the set
    entries: int


def tool_version(binary: str = "ipset") -> tuple[int, int]:
    """The ipset tool's version; IPSetToolError if it is missing or older than 6.0."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise IPSetToolError(f"cannot run {binary}: {exc}") from exc
    try:
        version = parse_version(out.stdout + out.stderr)
    except ValueError as exc:
        raise IPSetToolError(str(exc)) from exc
    if version < MIN_VERSION:
        raise IPSetToolError(f"{binary} {version[0]}.{version[1]} is older than 6.0")
    return version


class IPSets:
    """One pyroute2 IPSet socket plus the `ipset` tool. Not thread-safe; one per thread."""

    def __init__(self, binary: str = "ipset") -> None:
        self.binary = binary
        self.version = tool_version(binary)
        self._nl: Any = IPSet()

    def close(self) -> None:
        self._nl.close()

    def __enter__(self) -> IPSets:
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ---- control, over netlink -----------------------------------------------------------

    def names(self) -> list[str]:
        msgs = self._nl.list(flags=IPSET_FLAG_LIST_SETNAME)
        return [m.get_attr("IPSET_ATTR_SETNAME") for m in msgs]

    def exists(self, name: str) -> bool:
        try:
            list(self._nl.headers(name))
        except NetlinkError as exc:
            if exc.code == errno.ENOENT:
                return False
            raise
        return True

    def header(self, name: str) -> SetHeader:
        try:
            (msg,) = list(self._nl.list(name, flags=IPSET_FLAG_LIST_HEADER))
        except NetlinkError as exc:
            raise self._error(exc, name) from exc
        data = msg.get_attr("IPSET_ATTR_DATA")
        try:
            stype = SetType(msg.get_attr("IPSET_ATTR_TYPENAME"))
        except ValueError:
            raise SetMismatch(f"{name} is a {msg.get_attr('IPSET_ATTR_TYPENAME')} set, "
                              "not a type this module manages") from None
        comment = bool((data.get_attr("IPSET_ATTR_CADT_FLAGS") or 0) & IPSET_FLAG_WITH_COMMENT)
        if stype is SetType.BITMAP_PORT:
            lo, hi = data.get_attr("IPSET_ATTR_PORT_FROM"), data.get_attr("IPSET_ATTR_PORT_TO")
            spec = SetSpec(name, stype, None, port_range=(lo, hi), comment=comment)
        else:
            spec = SetSpec(name, stype, _FAMILY_BACK[msg.get_attr("IPSET_ATTR_FAMILY")],
                           data.get_attr("IPSET_ATTR_HASHSIZE"),
                           data.get_attr("IPSET_ATTR_MAXELEM"), comment=comment)
        return SetHeader(spec, msg.get_attr("IPSET_ATTR_REVISION"),
                         data.get_attr("IPSET_ATTR_REFERENCES"),
                         data.get_attr("IPSET_ATTR_ELEMENTS"))

    def create(self, spec: SetSpec, exist_ok: bool = True) -> bool:
        """Create the set; True if it was created. With exist_ok, an existing set that matches
        `spec` is fine and any other is SetMismatch (hashsize aside: the kernel grows it as the
        set fills). The kernel's own `-exist` check is not enough: it lets an inet set pass for
        an inet6 one."""
        kw: dict[str, Any] = {"comment": spec.comment}
        if spec.type is SetType.BITMAP_PORT:
            kw["bitmap_ports_range"] = spec.port_range
        else:
            assert spec.family is not None
            kw.update(family=_FAMILY[spec.family], hashsize=spec.hashsize, maxelem=spec.maxelem)
        try:
            self._nl.create(spec.name, stype=spec.type.value, exclusive=True, **kw)
        except NetlinkError as exc:
            if exc.code != errno.EEXIST:
                raise self._error(exc, spec.name) from exc
            if not exist_ok:
                raise SetExists(spec.name) from exc
            have = self.header(spec.name).spec
            if dataclasses.replace(have, hashsize=spec.hashsize) != spec:
                raise SetMismatch(f"{spec.name} exists as {have}, not as {spec}") from exc
            return False
        return True

    def destroy(self, name: str, missing_ok: bool = True) -> None:
        try:
            self._nl.destroy(name)
        except NetlinkError as exc:
            if exc.code == errno.ENOENT and missing_ok:
                return
            raise self._error(exc, name) from exc

    def flush(self, name: str) -> None:
        try:
            self._nl.flush(name)
        except NetlinkError as exc:
            raise self._error(exc, name) from exc

    def swap(self, a: str, b: str) -> None:
        try:
            self._nl.swap(a, b)
        except NetlinkError as exc:
            raise self._error(exc, f"{a}/{b}") from exc

    @staticmethod
    def _error(exc: NetlinkError, name: str) -> IPSetError:
        if exc.code in (errno.ENOENT, IPSET_ERR_EXIST_SETNAME2):
            return NoSuchSet(name)
        if exc.code == IPSET_ERR_BUSY:
            return SetInUse(f"{name} is referenced (an iptables rule?) and cannot be destroyed")
        if exc.code == IPSET_ERR_TYPE_MISMATCH:
            return SetMismatch(f"{name}: types or families differ")
        return IPSetError(f"{name}: {exc}")

    # ---- members, through the tool -------------------------------------------------------

    def read_all(self) -> dict[str, SavedSet]:
        """Every set with its members (`ipset save`)."""
        return self.start_read_all()()

    def start_read_all(self) -> Callable[[], dict[str, SavedSet]]:
        """read_all(), its `ipset save` started now: call the result for what it returns."""
        run = Started([self.binary, "save"])

        def finish() -> dict[str, SavedSet]:
            p = run.wait()
            if p.returncode != 0:
                raise IPSetToolError(f"ipset save: {p.stderr.strip()}")
            return parse_save(p.stdout)

        return finish

    def read(self, name: str) -> SavedSet:
        """One set with its members (`ipset save NAME`); NoSuchSet if it does not exist."""
        p = self._run(["save", name], check=False)
        if p.returncode != 0:
            if "does not exist" in p.stderr:
                raise NoSuchSet(name)
            raise IPSetToolError(f"ipset save {name}: {p.stderr.strip()}")
        return parse_save(p.stdout)[name]

    def members(self, name: str) -> frozenset[str]:
        return self.read(name).members

    def restore(self, lines: Sequence[str], exist: bool = True) -> None:
        """Run one `ipset restore` over `lines`; RestoreError names the failing line."""
        if not lines:
            return
        args = ["restore", "-exist"] if exist else ["restore"]
        p = self._run(args, stdin="\n".join(lines) + "\n", check=False)
        if p.returncode != 0:
            f = parse_restore_error(p.stderr, lines)
            raise RestoreError(f.set_name, f.line_no, f.line, f.message)

    def _fill(self, spec: SetSpec, body: list[str], exist: bool) -> None:
        # The script starts with the set's own `create` line. Without it the tool does not know
        # the set's type in this session and makes one netlink round trip per line instead of
        # batching (measured: 2,013 sends for 2,000 adds, against 15 with the line), which made
        # a 50,000-entry load 1.4x slower on a host and 1.7x in the lab. With -exist the line
        # is a no-op on a set that matches it.
        if body:
            self.restore([render_create(spec), *body], exist=exist)

    def add(self, name: str, entries: Iterable[str],
            comments: Mapping[str, str] | None = None) -> None:
        """Add entries; ones already present are fine (-exist)."""
        self._fill(self.header(name).spec, render_adds(name, entries, comments), exist=True)

    def delete(self, name: str, entries: Iterable[str]) -> None:
        """Delete entries; ones already absent are fine (-exist)."""
        self._fill(self.header(name).spec, render_dels(name, entries), exist=True)

    def apply(self, name: str, delta: MemberDelta,
              comments: Mapping[str, str] | None = None) -> None:
        """Deletes then adds, in one restore."""
        self._fill(self.header(name).spec, render_delta(name, delta, comments), exist=True)

    def sync(self, spec: SetSpec, desired: Iterable[str],
             comments: Mapping[str, str] | None = None) -> MemberDelta:
        """Make the set exist and hold exactly `desired` (canonical entries), changing only the
        difference; returns what was changed."""
        self.create(spec, exist_ok=True)
        delta = diff_members(self.members(spec.name), frozenset(desired))
        self._fill(spec, render_delta(spec.name, delta, comments), exist=True)
        return delta

    def replace(self, spec: SetSpec, entries: Iterable[str],
                comments: Mapping[str, str] | None = None) -> None:
        """Atomically make `spec.name` hold exactly `entries`, with `spec`'s sizes.

        Fills a scratch set of the same spec and swaps it in; the old content goes away with the
        scratch set. Rules that match the set see the old members until the swap and the new
        ones after it, never a half-filled set. If filling fails, the live set is untouched."""
        tmp = temp_name(spec.name)
        try:
            have = self.header(spec.name).spec
        except NoSuchSet:
            self.create(spec)
        else:
            # Sizes and the comment flag may differ: the swap brings in the scratch set's, which
            # is how a referenced set is resized. Type and family may not.
            if (have.type, have.family) != (spec.type, spec.family):
                raise SetMismatch(f"{spec.name} is {have.type} {have.family}, cannot become "
                                  f"{spec.type} {spec.family}")
        self.destroy(tmp)  # a leftover of an interrupted run
        try:
            # The scratch set is created by the script's first line (see _fill). No -exist: in
            # a fresh set a duplicate can only be one member spelled twice, which would make
            # later diffs never converge; better to fail loudly here.
            body = render_adds(tmp, entries, comments)
            if body:
                self._fill(spec.renamed(tmp), body, exist=False)
            else:
                self.create(spec.renamed(tmp), exist_ok=False)
        except RestoreError as exc:
            line = exc.line.replace(tmp, spec.name, 1) if exc.line else None
            raise RestoreError(spec.name, exc.line_no, line, exc.message) from exc
        else:
            self.swap(tmp, spec.name)
        finally:
            self.destroy(tmp)

    def _run(self, args: list[str], stdin: str | None = None,
             check: bool = True) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([self.binary, *args], input=stdin, capture_output=True, text=True,
                           check=False)
        if check and p.returncode != 0:
            raise IPSetToolError(f"ipset {' '.join(args)}: {p.stderr.strip()}")
        return p
