"""Logging setup: structlog, JSON in production, key=value on a terminal."""

from __future__ import annotations

import logging
import sys

import structlog


class _CurrentStderr:
    """Whatever `sys.stderr` is when a line is written, not when logging was set up:
    a CLI run in-process (as tests do) must not pin logging to a stream that closes."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


# What --log-level takes; anything else is refused at start (it used to mean "info").
LOG_LEVELS = ("debug", "info", "warning", "error")


# The last configuration set in this process (None: never set), which the workers
# it starts are given (meshbridge.workers).
configured: tuple[str, str] | None = None


def configure_logging(fmt: str = "console", level: str = "info") -> None:
    global configured
    configured = (fmt, level)
    renderer: structlog.typing.Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    numeric = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
