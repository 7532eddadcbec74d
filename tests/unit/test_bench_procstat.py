"""bench/procstat.py, the one reader of /proc/PID/status the benches share."""

from __future__ import annotations

import os
import resource

import pytest

from bench import procstat


def test_this_processs_status_reads_as_the_kernel_prints_it() -> None:
    got = procstat.status(os.getpid())
    assert got["Pid"] == procstat.status("self")["Pid"] == os.getpid() and got["Threads"] >= 1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux, as VmHWM
    assert abs(got["VmHWM"] - peak) <= peak // 10 + 1024
    assert "Name" not in got  # not a number


def test_a_missing_field_is_named() -> None:
    with pytest.raises(RuntimeError, match="no VmNothing"):
        procstat.kb("self", "VmNothing")
