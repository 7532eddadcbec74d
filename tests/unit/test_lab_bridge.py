"""The pytest bridge to the kernel lab: results come back, skips and boot failures fail.

The real boot is exercised by every kernel test in `make test`. Here `lab.run` is replaced by a
stand-in that runs the guest-side pytest command on the host, to check the bridge's plumbing
(report replay, skip -> failure, missing report -> failure) quickly. The boot-failure test uses
the real `lab` module with a kernel that does not exist; the timeout test, its wait with a
process that never ends.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from integration.vm import lab

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[2]

CONFTEST = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
pytest_plugins = ["integration.vm.pytest_lab"]
"""

STANDIN = CONFTEST + """
import os, subprocess
from integration.vm import lab

def fake_run(command, *, cwd, extra_rwdirs, **kw):
    env = dict(os.environ, IPVSPROXY_IN_LAB="1", HOST_KERNEL_RELEASE="host")
    p = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True)
    if os.environ.get("DROP_REPORT"):
        for d in extra_rwdirs:
            for f in d.glob("report.json"):
                f.unlink()
    return lab.LabResult(p.returncode, p.stdout + p.stderr, "guest-1.0", 0.1, 0.2)

lab.run = fake_run
"""

TESTS = """
import pytest

@pytest.mark.kernel
def test_k_pass():
    pass

@pytest.mark.kernel
def test_k_fail():
    assert 1 == 2, "guest says no"

@pytest.mark.kernel
def test_k_skip():
    pytest.skip("no ipvs here")

def test_host_only():
    pass
"""


def _project(pytester: pytest.Pytester, conftest: str) -> None:
    pytester.makeconftest(textwrap.dedent(conftest))
    pytester.makeini("[pytest]\nmarkers =\n    kernel: lab\n")
    pytester.makepyfile(test_mod=TESTS)


def test_guest_results_replayed_and_skip_becomes_failure(pytester: pytest.Pytester) -> None:
    _project(pytester, STANDIN)
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    res.assert_outcomes(passed=2, failed=2)
    out = res.stdout.str()
    assert "guest says no" in out
    assert "kernel test skipped inside the lab (no ipvs here)" in out
    assert "kernel tests ran inside lab guest 1: kernel guest-1.0" in out


def test_missing_guest_report_fails_every_kernel_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _project(pytester, STANDIN)
    monkeypatch.setenv("DROP_REPORT", "1")
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    res.assert_outcomes(passed=1, failed=3)
    assert "wrote no report" in res.stdout.str()


def test_lab_that_cannot_boot_fails_loudly(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _project(pytester, CONFTEST)
    monkeypatch.setenv("IPVSPROXY_LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("IPVSPROXY_LAB_KERNEL", "0.0.0-0-nonexistent-amd64")
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    res.assert_outcomes(passed=1, failed=3)
    out = res.stdout.str()
    assert "kernel lab could not boot or finish" in out
    assert "apt-get download linux-image-0.0.0-0-nonexistent-amd64 failed" in out


def test_only_selected_kernel_tests_go_to_the_guest(pytester: pytest.Pytester) -> None:
    _project(pytester, STANDIN)
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "k_pass")
    res.assert_outcomes(passed=1, deselected=3)
    assert "booting 1 guest(s) to run 1 kernel test(s)" in res.stdout.str()


MORE_TESTS = """
import pytest

pytestmark = [pytest.mark.kernel, pytest.mark.lab_cost(500)]

def test_story_step_1():
    pass

def test_story_step_2():
    pass
"""


def test_files_are_shared_out_to_guests_whole(pytester: pytest.Pytester) -> None:
    _project(pytester, STANDIN)
    pytester.makepyfile(test_story=MORE_TESTS)
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--lab-guests", "2")
    res.assert_outcomes(passed=4, failed=2)
    out = res.stdout.str()
    assert "booting 2 guest(s) to run 5 kernel test(s)" in out
    # the costly file alone in one guest, the other file's three tests in the other
    assert "kernel tests ran inside lab guest 1: kernel guest-1.0 (host" in out
    assert ", 2 test(s)," in out and ", 3 test(s)," in out


# A guest that says when it started and runs until it is killed (or until GUEST_ENDS exists).
SLOW_GUEST = CONFTEST + """
import os, subprocess, time
from pathlib import Path
from integration.vm import lab

def slow_run(command, *, cwd, extra_rwdirs, on_start, **kw):
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True, text=True)
    on_start(proc)
    Path(os.environ["MARKS"], "guest.pid").write_text(str(proc.pid))
    while proc.poll() is None and not Path(os.environ["MARKS"], "GUEST_ENDS").exists():
        time.sleep(0.05)
    proc.kill()
    env = dict(os.environ, IPVSPROXY_IN_LAB="1", HOST_KERNEL_RELEASE="host")
    p = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True)
    return lab.LabResult(p.returncode, p.stdout + p.stderr, "guest-1.0", 0.1, 0.2)

lab.run = slow_run
"""

HOST_WAITS_FOR_GUEST = """
import os, time
from pathlib import Path

def test_host_runs_while_the_guest_does():
    marks = Path(os.environ["MARKS"])
    deadline = time.monotonic() + 30
    while not (marks / "guest.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (marks / "guest.pid").exists(), "the guest had not started"
    (marks / "GUEST_ENDS").touch()
"""


def test_the_guest_runs_beside_the_host_tests(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _project(pytester, SLOW_GUEST)
    pytester.makepyfile(test_host=HOST_WAITS_FOR_GUEST)
    monkeypatch.setenv("MARKS", str(tmp_path))
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    # the host test saw the guest running before any kernel test's turn came
    res.assert_outcomes(passed=3, failed=2)
    out = res.stdout.str()
    assert out.index("test_host.py .") < out.index("kernel lab: booting 1 guest(s)")


def test_a_run_stopped_before_the_kernel_tests_leaves_no_guest(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _project(pytester, SLOW_GUEST)
    pytester.makepyfile(test_host="def test_host_fails():\n    assert False\n")
    monkeypatch.setenv("MARKS", str(tmp_path))
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-x", timeout=60)
    res.assert_outcomes(failed=1)
    pid = int((tmp_path / "guest.pid").read_text())
    gone = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
    assert gone.stdout.strip() in ("", "Z"), f"the guest {pid} outlived pytest: {gone.stdout}"


def test_shards_balance_by_cost_and_keep_files_whole() -> None:
    from integration.vm.pytest_lab import _shards

    class Item:
        def __init__(self, nodeid: str, cost: float | None) -> None:
            self.nodeid, self.cost = nodeid, cost

        def get_closest_marker(self, name: str) -> object:
            return None if self.cost is None else pytest.mark.lab_cost(self.cost).mark

    items = [Item("a.py::t1", 300), Item("a.py::t2", 300), Item("b.py::t1", 200),
             Item("c.py::t1", 150), Item("d.py::t1", None), Item("d.py::t2", None)]
    groups = _shards(items, 2)  # type: ignore[arg-type]
    # costs a 300 (the file's marker), b 200, c 150, d 2 x 10: a | b, c | d to a (300 < 350)
    assert groups == [["a.py::t1", "a.py::t2", "d.py::t1", "d.py::t2"], ["b.py::t1", "c.py::t1"]]
    assert _shards(items, 9) == [[i.nodeid for i in items if i.nodeid.startswith(f)]  # type: ignore[arg-type]
                                 for f in "abcd"]
    assert _shards(items, 1) == [[i.nodeid for i in items]]  # type: ignore[arg-type]


def _deb(tmp_path: Path, name: str, version: str) -> Path:
    """A linux-image .deb laid out as Debian 13's are: the modules under usr/lib."""
    tree = tmp_path / "tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: linux-image-{version}\nVersion: 1\nArchitecture: amd64\n"
        "Maintainer: test <t@example.org>\nDescription: test\n")
    (tree / "boot").mkdir()
    (tree / "boot" / f"vmlinuz-{version}").write_bytes(b"kernel")
    (tree / "usr" / "lib" / "modules" / version).mkdir(parents=True)
    deb = tmp_path / name
    subprocess.run(["dpkg-deb", "-b", str(tree), str(deb)], check=True, capture_output=True)
    return deb


def test_a_kernel_from_any_linux_image_deb(tmp_path: Path) -> None:
    version = "9.9.9+deb99-amd64"
    deb = _deb(tmp_path, f"linux-image-{version}-unsigned_9.9.9-1_amd64.deb", version)
    cache = tmp_path / "cache"
    kernel = lab._kernel_from_deb(str(deb), cache)
    assert kernel.version == version
    assert kernel.vmlinuz.read_bytes() == b"kernel"
    assert kernel.modules.is_dir() and kernel.modules.parts[-4:-1] == ("usr", "lib", "modules")
    deb.unlink()  # extracted once: the cache serves the next run
    assert lab._kernel_from_deb(str(deb), cache) == kernel
    assert not (cache / "current").exists()  # a .deb is for the run that names it only


def test_a_cloud_kernel_deb_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(lab.LabError, match="cloud kernel has no 9p"):
        lab._kernel_from_deb("https://example.org/linux-image-6.12-cloud-amd64_1_amd64.deb",
                             tmp_path)


def test_a_guest_over_its_time_is_killed_and_its_last_output_shown(tmp_path: Path) -> None:
    # stands in for virtme-ng: a process group that never ends, with what the guest printed
    (tmp_path / "output").write_text("test_a passed\n" + "x" * 5000 + "\nstuck in test_b\n")
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True, text=True)
    with pytest.raises(lab.LabError, match=r"exceeded its 0s limit") as err:
        lab._wait(proc, tmp_path, 0.0, 0.2, stream=False)
    assert proc.poll() is not None  # killed, not left running
    assert str(err.value).endswith("stuck in test_b\n") and "test_a" not in str(err.value)
    assert lab._output(tmp_path / "nothing yet") == ""
