"""The command line: subcommands, help, the not-yet-built exit code, logging set-up."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ipvsproxy.cli import SUBCOMMANDS, build_parser, main


def test_help_lists_the_five_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in ("run", "sync", "ls", "cleanup", "explain"):
        assert f"    {name} " in out
    assert set(SUBCOMMANDS) == {"run", "sync", "ls", "cleanup", "explain"}


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_each_subcommand_has_help_that_says_what_it_does(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: ipvsproxy {name}" in out
    assert len(out.split("\n\n")[1]) > 40  # a real description paragraph


def test_global_flags_parse() -> None:
    args = build_parser().parse_args(["-v", "2", "--log-format", "json", "run"])
    assert (args.verbosity, args.log_format, args.command) == (2, "json", "run")


def test_python_dash_m_runs_the_same_cli() -> None:
    p = subprocess.run([sys.executable, "-m", "ipvsproxy", "--help"], capture_output=True,
                       text=True, check=False)
    assert p.returncode == 0
    assert "explain" in p.stdout


def test_a_listing_exits_with_its_message_and_code() -> None:
    """The process ends with ls's code and what it wrote (ipvsadm's messages and codes for
    options it refuses, before any kernel access)."""
    for argv, message in ((["ls", "-Ln", "--timeout", "--stats"],
                           "options conflicts in the list command\n"),
                          (["ls", "-Ln", "-f", "0"], "invalid fwmark value `0' specified\n"),
                          (["-v", "1", "ls", "-Ln", "-f", "0"],
                           "invalid fwmark value `0' specified\n")):
        p = subprocess.run([sys.executable, "-m", "ipvsproxy", *argv], capture_output=True,
                           text=True, check=False)
        assert (p.returncode, p.stdout, p.stderr) == (2, "", message)


def test_json_logs_when_not_a_terminal() -> None:
    code = (
        "import structlog; from ipvsproxy.logsetup import setup_logging; setup_logging(0);"
        "structlog.get_logger().info('sync_done', ops=3)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import json

    line = json.loads(p.stderr.strip())
    assert line["event"] == "sync_done"
    assert line["ops"] == 3
    assert line["level"] == "info"


def test_ls_imports_no_dataclasses_python_socket_or_importlib() -> None:
    code = ("import sys; from ipvsproxy.commands import ls; import ipvsproxy.cli; "
            "import ipvsproxy.kernel.ipvs, ipvsproxy.kernel.ipvs_dump; "
            "print(sorted(m for m in ('dataclasses', 'inspect', 'ast', 'socket', 'importlib') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
