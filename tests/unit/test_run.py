"""`ipvsproxy run` on the host, which has no IPVS: the daemon refuses to start with the reason
instead of half-programming the node, and bad flags are named. (The daemon itself runs in the
lab: tests/kernel/test_daemon.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ipvsproxy", "run", *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_refuses_to_start_without_ipvs() -> None:
    p = run("--hostname-override", "node-a", "--healthz-bind-address", "127.0.0.1:0",
            "--metrics-bind-address", "127.0.0.1:0")
    assert p.returncode != 0
    assert "IPVS (is the ip_vs module loaded?) is not usable" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("flag, value, words", [
    ("--ipvs-sync-period", "soon", "--ipvs-sync-period"),
    ("--ipvs-min-sync-period", "-1s", "--ipvs-min-sync-period"),
    ("--healthz-bind-address", "nowhere", "--healthz-bind-address"),
    ("--service-metrics", "maybe", "--service-metrics"),
])
def test_bad_flags_are_named(flag: str, value: str, words: str) -> None:
    p = run("--hostname-override", "node-a", flag, value)
    assert p.returncode == 2, p.stderr
    assert words in p.stderr and "Traceback" not in p.stderr


class _Usable:
    """Stands in for a kernel client that works (the host has no IPVS to ask)."""

    def __enter__(self) -> _Usable:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def info(self) -> None:
        return None

    def read_all(self) -> None:
        return None


def _broken(*_: object, **__: object) -> None:
    raise OSError("Operation not permitted")


@pytest.mark.parametrize("broken, words", [
    ("ipvsproxy.kernel.ipset.IPSets", "ipset is not usable: Operation not permitted"),
    ("ipvsproxy.kernel.iptables.save", "iptables is not usable: Operation not permitted"),
])
def test_refuses_to_start_without_ipset_or_iptables(monkeypatch: pytest.MonkeyPatch,
                                                    broken: str, words: str) -> None:
    from ipvsproxy.cli import CliError
    from ipvsproxy.commands.run import preflight

    monkeypatch.setattr("ipvsproxy.kernel.ipvs.IpvsClient", _Usable)
    monkeypatch.setattr("ipvsproxy.kernel.ipset.IPSets", _Usable)
    monkeypatch.setattr("ipvsproxy.kernel.iptables.save", lambda family: "")
    monkeypatch.setattr(broken, _broken)
    with pytest.raises(CliError, match=words):
        preflight()


@pytest.mark.parametrize("strict_arp", [False, True])
def test_sysctls_only_writes_what_the_daemon_would_and_exits(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        strict_arp: bool) -> None:
    """`run --sysctls-only`, the DaemonSet's privileged init container (issue 32, item 12):
    the sysctls desired.sysctls computes for the configuration, written where they differ,
    after an IPVS request (which makes the kernel load ip_vs and its net/ipv4/vs/*); a value
    that cannot be written is an error and exit 1. It never reaches the API server."""
    from ipvsproxy.cli import build_parser
    from ipvsproxy.commands import run
    from ipvsproxy.core import tables as T
    from ipvsproxy.core.desired import HostFacts
    from ipvsproxy.logsetup import setup_logging

    setup_logging(0, "json")
    want = dict(T.SYSCTLS) | (dict(T.STRICT_ARP_SYSCTLS) if strict_arp else {})
    for key in want:
        (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / key).write_text("0\n")
    (tmp_path / "net/ipv4/ip_forward").write_text("1\n")  # already right: left alone
    asked: list[str] = []

    class Ipvs(_Usable):
        def info(self) -> None:
            asked.append("info")

    monkeypatch.setattr("ipvsproxy.kernel.host.PROC_SYS", tmp_path)
    monkeypatch.setattr("ipvsproxy.kernel.host.host_facts", lambda: HostFacts((), (6, 1)))
    monkeypatch.setattr("ipvsproxy.kernel.ipvs.IpvsClient", Ipvs)
    monkeypatch.setattr("ipvsproxy.kube.listing.load_client_config", _broken)
    argv = ["run", "--sysctls-only", "--hostname-override", "node-a",
            *(["--ipvs-strict-arp"] if strict_arp else [])]
    args = build_parser("run").parse_args(argv)
    args.argv = argv
    assert run.run(args) == 0
    assert asked == ["info"]
    assert {k: (tmp_path / k).read_text().strip() for k in want} == want
    err = capsys.readouterr().err
    assert "net.ipv4.ip_forward" not in err  # not written: it held the value
    assert err.count("sysctl written") == len(want) - 1

    (tmp_path / "net/ipv4/vs/conntrack").write_text("0\n")
    monkeypatch.setattr("ipvsproxy.kernel.host.write_sysctl", _broken)  # read-only /proc/sys
    assert run.run(args) == 1
    assert "sysctl not written" in capsys.readouterr().err
