"""What a command prints: standard output whose reader may go away (``python -m axoexp | head -1``),
no fault of the command, which goes on as if nothing had been read, its later output sent to the
null device; stderr without Hydra's own line for a failed job (:class:`WithoutHydrasJobLine`); and
a count in words (:func:`plural`)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

from axoexp.redact import redacted

HYDRA_JOB_ERROR = "Error executing job with overrides: "
"""How Hydra starts the line it writes to stderr for a sweep's first failed job (``JobReturn.return_value``)."""


def print_out(text: str) -> None:
    """Print ``text`` to stdout, any URI's password hidden, where its reader may have gone (``| head -1``)."""
    try:
        print(redacted(text), flush=True)
    except BrokenPipeError:
        reader_gone(sys.stdout)


def say(command: str, message: object) -> None:
    """``COMMAND: MESSAGE`` on stderr, any URI's password hidden: every command's own line (an error,
    an interruption, what it did); with :func:`print_out` and the redacting MLflow client
    (:class:`~axoexp.tracking.RedactingClient`), where a value is made safe on its way out."""
    print(f"{command}: {redacted(message)}", file=sys.stderr, flush=True)


def flush_out() -> None:
    """Flush stdout (what Hydra printed for ``--help`` or ``--cfg``), where its reader may have gone."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        reader_gone(sys.stdout)


def reader_gone(stream: TextIO) -> None:
    """Point ``stream``'s file at the null device, its reader being gone: nothing later written to
    it (nor the exit's flush of what it still holds) fails."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, stream.fileno())
    os.close(null)


class ConsoleHandler(logging.StreamHandler[TextIO]):
    """The console handler of Hydra's logging configs (``hydra.job_logging``, ``hydra.hydra_logging``):
    once its stream's reader has gone, the lines go to the null device, where
    :class:`logging.StreamHandler` printed ``--- Logging error ---`` and a call stack for each."""

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], BrokenPipeError):
            reader_gone(self.stream)
        else:
            super().handleError(record)


class WithoutHydrasJobLine:
    """The command's stderr, less Hydra's ``Error executing job with overrides: [...]`` line: a
    sweep's own lines name each failed job by its run and why it failed, and a run's last line says
    why it failed, where Hydra's names only the first failed job's overrides, escaped as Hydra
    escapes them (``http\\://``), with the sweep's own (its parent run's id) and any password in a
    URI as typed (also before a traceback under ``HYDRA_FULL_ERROR=1``). Everything else is written
    as it comes."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return len(text) if text.startswith(HYDRA_JOB_ERROR) else self.stream.write(text)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding: the stream's own
        return getattr(self.stream, name)


def with_article(noun: str) -> str:
    """``a tuple``, ``an int``: a type's name in a line a command prints (by its first letter)."""
    return f"{'an' if noun[:1].lower() in 'aeio' else 'a'} {noun}"


def type_in_words(value: object) -> str:
    """``None``, ``a str``, ``an int``: what a hook returned, in a line that says it is not what was asked."""
    return "None" if value is None else with_article(type(value).__name__)


def plural(count: int, noun: str) -> str:
    """``1 thread``, ``2 threads``: a count in a line a command prints."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
