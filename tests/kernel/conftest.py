"""Fixtures for kernel tests. They run inside the lab guest only (the bridge sends them there)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

SCHEDULER_MODULES = ["ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_lc", "ip_vs_wlc", "ip_vs_sh",
                     "ip_vs_mh", "ip_vs_dh", "ip_vs_sed", "ip_vs_nq"]


def sh(cmd: str, check: bool = True) -> str:
    """Run a shell command in the guest; fail the test with its output if it fails."""
    p = subprocess.run(cmd, shell=True, text=True, capture_output=True, check=False)
    if check and p.returncode != 0:
        raise AssertionError(f"`{cmd}` exited {p.returncode}: {p.stdout}{p.stderr}")
    return p.stdout


@pytest.fixture(scope="session")
def ipvs_modules() -> None:
    sh("modprobe -a " + " ".join(SCHEDULER_MODULES))


@pytest.fixture
def clean_ipvs(ipvs_modules: None) -> Iterator[None]:
    """An empty IPVS table before and after the test."""
    sh("ipvsadm -C")
    yield
    sh("ipvsadm -C")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The seed of the differential cluster this run met (new at each run), and how to meet
    it again: printed where `make test` ends, pass or fail."""
    import sys

    mod = sys.modules.get("tests.kernel.test_differential")
    if mod is not None and not terminalreporter.config.getoption("--lab-report"):
        terminalreporter.write_line(f"differential cluster: seed {mod.SEED} (again: {mod.AGAIN})")
