"""Logging set-up: structlog configured once; stdlib loggers (pyroute2, kubernetes) go through it.

JSON lines when stderr is not a terminal (DaemonSet logs), a readable console otherwise.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

import structlog

LogFormat = Literal["json", "console"]

# -v counts: 0 -> warnings and above for libraries, info for us; 1 -> info; 2+ -> debug.
_LEVELS = {0: logging.INFO, 1: logging.INFO, 2: logging.DEBUG}


class _StderrLogger:
    """Writes each line to whatever ``sys.stderr`` is *now*.

    structlog's WriteLogger keeps the stream it was built with; when that stream is later
    replaced and closed (pytest's capture, a daemonised child) every log call raises
    "I/O operation on closed file" -- in a sync loop that turned a log line into a failure.
    """

    def msg(self, message: str) -> None:
        stream = sys.stderr
        stream.write(message + "\n")
        stream.flush()

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


def _stderr_logger(*_args: Any) -> _StderrLogger:
    return _StderrLogger()


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A StreamHandler bound to the current ``sys.stderr`` for the same reason."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def default_format() -> LogFormat:
    return "console" if sys.stderr.isatty() else "json"


def setup_logging(verbosity: int = 0, fmt: LogFormat | None = None) -> None:
    """Configure structlog and the stdlib root logger. Safe to call more than once."""
    fmt = fmt or default_format()
    level = _LEVELS.get(min(verbosity, 2), logging.DEBUG)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    tb: list[Any] = [structlog.processors.dict_tracebacks] if fmt == "json" else []
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[*shared, *tb, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tb, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # Libraries are noisy at INFO; they only speak up at -vv.
    root.setLevel(logging.DEBUG if verbosity >= 2 else logging.WARNING)
