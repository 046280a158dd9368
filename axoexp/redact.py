"""Text as axoexp shows and stores it: the password of a URI in it
(``postgresql://user:secret@host/db``, ``...?password=secret``, or an error quoting one) never
reaches a terminal, a log file, a run's params, tags or config artifacts, or a CI transcript."""

from __future__ import annotations

import logging
import re

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


class RedactingFilter(logging.Filter):
    """Redacts each record's message: Hydra's own lines quote the overrides (``#0 : tracking.uri=...``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: the handler reports it, as without this filter
            return True
        shown = redacted(message)
        if shown != message:
            record.msg, record.args = shown, None
        return True
