"""pytest bridge to the kernel lab: tests marked `kernel` run inside the lab guest, in one boot.

On the host, the first kernel test to run boots the lab once and runs every selected kernel
test inside it (same checkout, same virtualenv, same node ids). The guest serialises each test
report; the host replays them, so kernel tests count in the normal pytest summary.

Rules this enforces (DEVELOPERS.md: "a kernel test that is skipped in CI is a failed test"):
- a kernel test skipped inside the guest is reported as failed on the host;
- if the lab cannot boot, every kernel test fails with the reason;
- a kernel test the guest never reported (crash, timeout) fails with the guest's output.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

import pytest

IN_LAB = os.environ.get("IPVSPROXY_IN_LAB") == "1"
_STATE_KEY = pytest.StashKey[dict[str, Any]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kernel lab")
    group.addoption("--lab-report", default=None, help="(in the guest) write reports here")
    group.addoption(
        "--lab-timeout", type=float, default=float(os.environ.get("IPVSPROXY_LAB_TIMEOUT", 2400)),
        help="seconds the lab guest may run all kernel tests",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_STATE_KEY] = {"reports": None, "error": None, "meta": {}}
    if IN_LAB and config.getoption("--lab-report"):
        config.pluginmanager.register(_GuestRecorder(config), "lab-guest-recorder")


class _GuestRecorder:
    """Inside the guest: collect every report, write them as JSON when the session ends."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.reports: list[dict[str, Any]] = []

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        self.reports.append(data)

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        del session
        path = Path(self.config.getoption("--lab-report"))
        meta = {"uname": os.uname().release}
        path.write_text(json.dumps({"meta": meta, "reports": self.reports}))


@pytest.hookimpl(trylast=True)  # after -k / -m deselection, so only selected tests go
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Keep kernel tests together at the end, so the one boot happens after the fast tests.
    if not IN_LAB:
        items.sort(key=lambda it: it.get_closest_marker("kernel") is not None)
    config.stash[_STATE_KEY]["kernel_ids"] = [
        it.nodeid for it in items if it.get_closest_marker("kernel") is not None
    ]


def _run_lab(config: pytest.Config) -> None:
    state = config.stash[_STATE_KEY]
    state["reports"] = {}
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from integration.vm import lab

    ids = state["kernel_ids"]
    rootdir = Path(str(config.rootpath))
    with tempfile.TemporaryDirectory(prefix="ipvsproxy-kt-") as tmp:
        argsfile = Path(tmp) / "ids"
        argsfile.write_text("\n".join(ids) + "\n")
        report = Path(tmp) / "report.json"
        # The guest writes only into its own overlay; the report goes to a host folder that the
        # lab shares read-write (the lab's work dir is the guest's output channel, ours is tmp).
        cmd = (
            f"{shlex.quote(sys.executable)} -m pytest -p no:cacheprovider -q -o addopts= "
            f"--lab-report={shlex.quote(str(report))} -m kernel @{shlex.quote(str(argsfile))}"
        )
        tw = config.get_terminal_writer()
        tw.line()
        tw.line(f"kernel lab: booting to run {len(ids)} kernel test(s) ...", bold=True)
        try:
            res = lab.run(cmd, timeout=config.getoption("--lab-timeout"), cwd=rootdir,
                          extra_rwdirs=[Path(tmp)])
        except lab.LabError as exc:
            state["error"] = f"kernel lab could not boot or finish: {exc}"
            tw.line(state["error"], red=True)
            return
        state["meta"] = {
            "kernel": res.kernel_release, "boot": res.boot_seconds, "total": res.total_seconds,
        }
        tw.line(
            f"kernel lab: kernel {res.kernel_release} (host {os.uname().release}), "
            f"boot {res.boot_seconds:.1f}s, guest run {res.total_seconds:.1f}s, "
            f"pytest exit {res.rc}"
        )
        if not report.exists():
            state["error"] = (
                f"the kernel tests inside the lab wrote no report (exit {res.rc}). "
                f"Guest output:\n{res.output[-4000:]}"
            )
            return
        data = json.loads(report.read_text())
        state["guest_output"] = res.output
        for rep in data["reports"]:
            state["reports"].setdefault(rep["nodeid"], []).append(rep)


def _failed(item: pytest.Item, when: Literal["call"], text: str) -> pytest.TestReport:
    return pytest.TestReport(item.nodeid, item.location, {}, "failed", text, when, [])


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    del nextitem
    if IN_LAB or item.get_closest_marker("kernel") is None:
        return None
    config = item.config
    state = config.stash[_STATE_KEY]
    if state["reports"] is None:
        _run_lab(config)
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for rep in _replayed(item, state):
        item.ihook.pytest_runtest_logreport(report=rep)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _replayed(item: pytest.Item, state: dict[str, Any]) -> list[pytest.TestReport]:
    if state["error"]:
        return [_failed(item, "call", state["error"])]
    raw = state["reports"].get(item.nodeid)
    if not raw:
        tail = state.get("guest_output", "")[-3000:]
        return [_failed(item, "call", f"the lab never reported this kernel test.\n{tail}")]
    out: list[pytest.TestReport] = []
    for data in raw:
        rep = item.config.hook.pytest_report_from_serializable(config=item.config, data=data)
        if rep.skipped:
            lr = rep.longrepr
            reason = lr[2] if isinstance(lr, (tuple, list)) and len(lr) == 3 else str(lr)
            reason = str(reason).removeprefix("Skipped: ")
            rep = _failed(item, "call", f"kernel test skipped inside the lab ({reason}); "
                                          "a skipped kernel test is a failed test")
        out.append(rep)
    return out


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash[_STATE_KEY]
    meta = state.get("meta") or {}
    if meta:
        terminalreporter.write_line(
            f"kernel tests ran inside the lab: kernel {meta['kernel']} "
            f"(host {os.uname().release}), boot {meta['boot']:.1f}s, "
            f"guest total {meta['total']:.1f}s"
        )
    elif state.get("error"):
        terminalreporter.write_line(state["error"], red=True)
