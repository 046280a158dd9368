"""What a command prints: standard output whose reader may go away (``python -m axoexp | head -1``),
no fault of the command, which goes on as if nothing had been read, its later output sent to the
null device; and a count in words (:func:`plural`)."""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO


def print_out(text: str) -> None:
    """Print ``text`` to stdout, where its reader may have gone (``| head -1``)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        reader_gone(sys.stdout)


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


def with_article(noun: str) -> str:
    """``a tuple``, ``an int``: a type's name in a line a command prints (by its first letter)."""
    return f"{'an' if noun[:1].lower() in 'aeio' else 'a'} {noun}"


def plural(count: int, noun: str) -> str:
    """``1 thread``, ``2 threads``: a count in a line a command prints."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
