"""`ipvsproxy run` on the host, which has no IPVS: the daemon refuses to start with the reason
instead of half-programming the node, and bad flags are named. (The daemon itself runs in the
lab: tests/kernel/test_daemon.py.)"""

from __future__ import annotations

import subprocess
import sys

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
