"""`ipvsproxy` commands in their own processes, forked from one interpreter that imported them.

Under the lab's software emulation a new Python process that imports ipvsproxy's command
modules costs 10-60 s before it does anything (pyroute2 ~12 s, the kubernetes client ~17 s,
structlog ~6 s: every stat and open of an import is an emulated round trip to the 9p root), and
the kernel tests start ipvsproxy about a hundred times. So they fork each command from a
multiprocessing forkserver that imported those modules once. The command still runs in a
process of its own (its own pid, file descriptors, signal handlers and exit status) through
`ipvsproxy.cli.main`, the function behind the console script and `python -m ipvsproxy`; only
the imports are shared. test_ls runs `python -m ipvsproxy` itself once to prove the entry point.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

# Everything a command imports lazily (ipvsproxy.cli loads a subcommand's module on demand).
PRELOAD = [
    "ipvsproxy.cli", "ipvsproxy.commands.sync", "ipvsproxy.commands.run",
    "ipvsproxy.commands.ls", "ipvsproxy.commands.explain", "ipvsproxy.commands.cleanup",
    "ipvsproxy.daemon.reconciler", "ipvsproxy.daemon.metrics", "ipvsproxy.daemon.http",
    "ipvsproxy.kube.reflector", "ipvsproxy.kernel.dataplane", "ipvsproxy.kernel.conntrack",
    # ipvsproxy.lean keeps these to what the commands use: no generated API classes
    # (kube/rest.py), not the whole of the two packages' __init__
    "kubernetes.config", "kubernetes.client.api_client", "kubernetes.client.exceptions",
    "pyroute2", "prometheus_client", "structlog", "yaml",
]

_ctx = multiprocessing.get_context("forkserver")
_ctx.set_forkserver_preload(PRELOAD)


def _command(argv: list[str], out: str, err: str | None, env: dict[str, str]) -> None:
    """The forked child: stdio to the given files, then the CLI, exiting with its code."""
    os.environ.update(env)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd if err is None else os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a hung command's stacks, on demand
    from ipvsproxy.cli import main

    try:
        code = main(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)


class Proc:
    """A forked command, with the part of subprocess.Popen's interface the tests use."""

    def __init__(self, argv: Sequence[str], out: Path, err: Path | None,
                 env: Mapping[str, str] | None) -> None:
        self.args = ["ipvsproxy", *argv]
        self._p = _ctx.Process(target=_command, args=(
            list(argv), str(out), None if err is None else str(err), dict(env or {})))
        self._p.start()
        assert self._p.pid is not None
        self.pid: int = self._p.pid

    @property
    def returncode(self) -> int | None:
        return self._p.exitcode

    def poll(self) -> int | None:
        return self._p.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._p.join(timeout)
        if self._p.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self._p.exitcode

    def send_signal(self, sig: int) -> None:
        if self._p.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(argv: Sequence[str], out: Path, err: Path | None = None,
          env: Mapping[str, str] | None = None) -> Proc:
    """Start `ipvsproxy ARGV` with stdout to `out` and stderr to `err` (or also `out`)."""
    return Proc(argv, out, err, env)


def run(argv: Sequence[str], env: Mapping[str, str] | None = None,
        timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
    """Run `ipvsproxy ARGV` to the end; its output as text, like subprocess.run(text=True)."""
    with tempfile.TemporaryDirectory(prefix="ipvsproxy-cmd-") as d:
        out, err = Path(d) / "out", Path(d) / "err"
        p = start(argv, out, err, env)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise
        return subprocess.CompletedProcess(p.args, rc, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))


def check(*argv: str, env: Mapping[str, str] | None = None) -> str:
    """`ipvsproxy ARGV`'s stdout; fails the test with its output if it exits non-zero."""
    p = run(argv, env)
    if p.returncode != 0:
        raise AssertionError(f"ipvsproxy {' '.join(argv)} exited {p.returncode}:\n"
                             f"{p.stdout}{p.stderr}")
    return p.stdout
