"""Standard output whose reader may go away (``python -m axoexp.report | head -1``)."""

from __future__ import annotations

import os
import sys


def print_out(text: str) -> bool:
    """Print ``text`` to stdout; ``False`` where its reader has gone (``| head -1``): stdout then
    goes to the null device, so nothing later (nor the exit's flush) fails on it."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
        return False
    return True
