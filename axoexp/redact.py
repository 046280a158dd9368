"""Text as axoexp shows it: the password of a URI in it (``postgresql://user:secret@host/db``, or
an error quoting one) never reaches a terminal, a log file, a run's tags or a CI transcript."""

from __future__ import annotations

import logging
import re

_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*\\*://[^/@:\s\\]*\\*):[^/@\s]*@")
"""A URI's ``user:password@``, also as Hydra escapes an override (``postgresql\\://user\\:secret@``)."""
HIDDEN = "***"


def redacted(text: object) -> str:
    """``text`` with the password of every URI's user info replaced by ``***``, as SQLAlchemy
    shows one; the rest as it is."""
    return _PASSWORD.sub(rf"\g<head>:{HIDDEN}@", str(text))


class RedactingFilter(logging.Filter):
    """Redacts each record's message: Hydra's own lines quote the overrides (``#0 : tracking.uri=...``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        shown = redacted(message)
        if shown != message:
            record.msg, record.args = shown, None
        return True
