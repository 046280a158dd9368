"""Text as axoexp shows and stores it: the password of a URI in it
(``postgresql://user:secret@host/db``, ``...?password=secret``, or an error quoting one) never
reaches a terminal, a log file, a run's params, tags or config artifacts, or a CI transcript.

It is hidden where text leaves the process: the terminal (:func:`axoexp.stdout.print_out`,
:func:`axoexp.stdout.say`), MLflow (:class:`axoexp.tracking.RedactingClient`), log lines
(:func:`hide_passwords_in_logs`), and an exception's message as it is made, since a traceback or a
library's caller shows it as it is. The files of a run's output directory keep the URI as typed:
the journal's sync needs it."""

from __future__ import annotations

import logging
import re
from typing import Any

_USER_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*\\*://[^/@:\s\\]*\\*):[^@\s]*@")
"""A URI's ``user:password@``, also as Hydra escapes an override (``postgresql\\://user\\:secret@``);
the password may hold a ``/``, as SQLAlchemy reads one (a path's ``:x@`` is hidden too: the safer mistake)."""
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&](?:password|pwd)=)[^&\s'\"]*", re.IGNORECASE)
"""A password given as a query parameter, as the database drivers accept one."""
HIDDEN = "***"


def redacted(text: object) -> str:
    """``text`` with every URI's password replaced by ``***``, as SQLAlchemy shows one; the rest as it is."""
    shown = _USER_PASSWORD.sub(rf"\g<head>:{HIDDEN}@", str(text))
    return _QUERY_PASSWORD.sub(rf"\g<head>{HIDDEN}", shown)


def hide_passwords_in_logs() -> None:
    """Every log record this process makes from now on has any URI's password hidden in its message
    and its traceback, whatever logging configuration handles it (axoexp's, Hydra's, a user's own): Hydra's lines quote
    the overrides (``#0 : tracking.uri=...``), MLflow's and SQLAlchemy's quote URIs, axoexp's name
    its store. Records are made only at a level a logger lets through. Calling it again does nothing."""
    make = logging.getLogRecordFactory()
    if getattr(make, "hides_passwords", False):
        return

    def record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        made = make(*args, **kwargs)
        try:
            message = made.getMessage()
        except Exception:  # a malformed call: the handler reports it, as it would
            return made
        shown = redacted(message)
        if shown != message:
            made.msg, made.args = shown, None
        if made.exc_info and not made.exc_text:  # its traceback, as a handler's Formatter would write it
            try:
                traceback = logging.Formatter().formatException(made.exc_info)
            except Exception:  # not an exception's (type, value, traceback): the handler reports it, as it would
                return made
            shown = redacted(traceback)
            if shown != traceback:
                made.exc_text = shown  # Formatters write a record's exc_text where it has one
        return made

    record.hides_passwords = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(record)
