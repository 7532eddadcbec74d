"""kernel.started: a command started now, read later, never blocked by its own output."""

from __future__ import annotations

import subprocess
import time

from ipvsproxy.kernel.started import Started


def test_output_larger_than_a_pipe_does_not_stop_the_command() -> None:
    run = Started(["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x; echo oops >&2; exit 3"])
    deadline = time.monotonic() + 30
    while run._proc.poll() is None:  # it finishes while nobody reads
        assert time.monotonic() < deadline, "the command waited for a reader"
        time.sleep(0.01)
    p = run.wait()
    assert isinstance(p, subprocess.CompletedProcess)
    assert (p.returncode, len(p.stdout), p.stdout[:3], p.stderr) == (3, 3000000, "xxx", "oops\n")
    assert run._out.closed and run._err.closed


def test_what_subprocess_run_gives() -> None:
    argv = ["sh", "-c", "printf 'a\\nb'; printf 'e' >&2"]
    want = subprocess.run(argv, capture_output=True, text=True, check=False)
    got = Started(argv).wait()
    assert (got.args, got.returncode, got.stdout, got.stderr) == (
        want.args, want.returncode, want.stdout, want.stderr)
