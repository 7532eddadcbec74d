"""A checker for `sync --dry-run` lines: each must be a command the real tool would accept.

Pure (no tool is run: the host kernel has no IPVS and tests run unprivileged). Each command is
split as a shell would and checked against the tool's grammar, as far as ipvsproxy uses it:
ipvsadm's options, ipset's create options and canonical entries (core.ipset_text), iptables'
matches and targets (each option after the `-m` module that provides it, set match directions
as many as the set has dimensions), and `ip` / `sysctl` forms. `check` raises AssertionError.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterable, Mapping
from ipaddress import ip_address, ip_interface, ip_network

from ipvsproxy.core.ipset_text import SetSpec, SetType, canonical_entry, parse_save

SCHEDULERS = {"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf",
              "mh", "twos"}
DIMENSIONS = {SetType.HASH_IP: 1, SetType.BITMAP_PORT: 1, SetType.HASH_IP_PORT: 2,
              SetType.HASH_IP_PORT_IP: 3, SetType.HASH_IP_PORT_NET: 3}
# iptables option -> (arguments, module or target it belongs to; "" = basic)
IPT_OPTS: dict[str, tuple[int, str]] = {
    "-s": (1, ""), "-d": (1, ""), "-p": (1, ""), "-i": (1, ""), "-o": (1, ""),
    "--comment": (1, "comment"), "--match-set": (2, "set"), "--mark": (1, "mark"),
    "--ctstate": (1, "conntrack"), "--src-type": (1, "addrtype"), "--dst-type": (1, "addrtype"),
    "--physdev-is-in": (0, "physdev"), "--vaddr": (1, "ipvs"), "--vproto": (1, "ipvs"),
    "--vport": (1, "ipvs"), "--set-xmark": (1, "MARK"), "--reject-with": (1, "REJECT"),
    "--random-fully": (0, "MASQUERADE")}
BUILTIN_TARGETS = {"ACCEPT", "DROP", "RETURN", "MARK", "MASQUERADE", "REJECT"}
ADDRPORT = re.compile(r"(?:\[(?P<v6>[0-9a-f:.]+)\]|(?P<v4>[0-9.]+)):(?P<port>\d+)")


def _addrport(text: str) -> str:
    m = ADDRPORT.fullmatch(text)
    if not m or not 0 <= int(m["port"]) <= 65535:
        raise argparse.ArgumentTypeError(f"not an address:port: {text}")
    a = ip_address(m["v6"] or m["v4"])
    assert (a.version == 6) == bool(m["v6"]), text
    return text


def _ipvsadm_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ipvsadm", add_help=False, exit_on_error=False)
    cmd = p.add_mutually_exclusive_group(required=True)
    for flag, name in (("-A", "add_service"), ("-E", "edit_service"), ("-D", "delete_service"),
                       ("-a", "add_server"), ("-e", "edit_server"), ("-d", "delete_server")):
        cmd.add_argument(flag, dest=name, action="store_true")
    cmd.add_argument("--set", nargs=3, type=int)
    svc = p.add_mutually_exclusive_group()
    for flag in ("-t", "-u", "--sctp-service"):
        svc.add_argument(flag, dest="service", type=_addrport)
    p.add_argument("-s", dest="scheduler", choices=sorted(SCHEDULERS))
    p.add_argument("-p", dest="persistent", type=int)
    p.add_argument("-M", dest="netmask")
    p.add_argument("-b", dest="sched_flags")
    p.add_argument("-r", dest="server", type=_addrport)
    fwd = p.add_mutually_exclusive_group()
    for flag in ("-m", "-g", "-i"):
        fwd.add_argument(flag, dest="fwd", action="store_const", const=flag)
    for flag in ("-w", "-x", "-y"):
        p.add_argument(flag, type=int)
    return p


def _ipvsadm(argv: list[str]) -> None:
    try:
        a = _ipvsadm_parser().parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as exc:
        raise AssertionError(f"ipvsadm {shlex.join(argv)}: {exc}") from None
    if a.set:
        return
    assert a.service, "every ipvsadm command here names a virtual server"
    if a.add_service or a.edit_service:
        assert a.scheduler and a.server is None and a.fwd is None
        if a.netmask:
            ip_address(a.netmask) if "." in a.netmask else int(a.netmask)
    elif a.delete_service:
        assert a.scheduler is a.server is a.fwd is None
    elif a.delete_server:
        assert a.server and a.fwd is None and a.w is None
    else:
        assert a.server and a.fwd and a.w is not None and 0 <= a.w <= 65535
        assert (a.service.startswith("[")) == (a.server.startswith("[")), "one family"


def _ipset(argv: list[str], specs: dict[str, SetSpec]) -> None:
    verb = argv[0]
    if verb == "create":
        saved = parse_save(shlex.join(argv))[argv[1]]
        specs[argv[1]] = saved.spec()  # raises unless type and options are ones ipset takes
        return
    assert verb in ("add", "del") and len(argv) == 3, argv
    assert canonical_entry(specs[argv[1]], argv[2]) == argv[2]


def _rule(words: list[str], specs: Mapping[str, SetSpec], chains: set[str]) -> None:
    modules: set[str] = set()
    target = ""
    i = 0
    while i < len(words):
        w = words[i]
        if w == "!":
            i += 1
            continue
        if w == "-m":
            modules.add(words[i + 1])
            i += 2
            continue
        if w == "-j":
            target = words[i + 1]
            assert target in BUILTIN_TARGETS or target in chains, target
            i += 2
            continue
        nargs, owner = IPT_OPTS[w]
        assert owner == "" or owner in modules or owner == target, f"{w} needs {owner}"
        args = words[i + 1:i + 1 + nargs]
        assert len(args) == nargs and not any(a.startswith("-") for a in args[:1] if nargs)
        if w in ("-s", "-d"):
            ip_network(args[0])
        elif w == "--match-set":
            spec = specs[args[0]]
            dirs = args[1].split(",")
            assert len(dirs) == DIMENSIONS[spec.type] and set(dirs) <= {"src", "dst"}, args
        i += 1 + nargs
    assert target, f"no target: {words}"


def check(lines: Iterable[str], chains: Iterable[str] = (), sets: Iterable[SetSpec] = ()
          ) -> int:
    """Check every line; returns how many there were. `chains` and `sets`: the chains and sets
    that exist already, besides those the lines create."""
    specs = {s.name: s for s in sets}
    known = set(chains)
    n = 0
    for line in lines:
        n += 1
        argv = shlex.split(line)
        tool, rest = argv[0], argv[1:]
        if tool == "ipvsadm":
            _ipvsadm(rest)
        elif tool == "ipset":
            _ipset(rest, specs)
        elif tool in ("iptables", "ip6tables"):
            assert rest[0] == "-t" and rest[1] in ("nat", "filter"), line
            op, chain = rest[2], rest[3]
            if op in ("-N", "-F"):
                assert len(rest) == 4, line
                known.add(chain)
            else:
                assert op in ("-A", "-I"), line
                words = rest[5:] if op == "-I" else rest[4:]
                if op == "-I":
                    assert rest[4].isdigit(), line
                _rule(words, specs, known)
        elif tool == "ip":
            if rest[:2] == ["link", "add"]:
                assert rest[2:] == ["kube-ipvs0", "type", "dummy"], line
            else:
                assert rest[0] == "addr" and rest[1] in ("add", "del"), line
                assert rest[3:] == ["dev", "kube-ipvs0"], line
                iface = ip_interface(rest[2])
                assert iface.network.prefixlen == iface.max_prefixlen, line
        elif tool == "sysctl":
            assert rest[0] == "-w" and re.fullmatch(r"net(\.[a-z_0-9]+)+=\d+", rest[1]), line
        else:
            raise AssertionError(f"unknown tool: {line}")
    return n
