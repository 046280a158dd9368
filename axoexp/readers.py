"""The commands that read the store to decide (``python -m axoexp.report``, ``python -m axoexp.compare``):
the store opened for reading, or one line saying why it cannot be, and the exit status.

Both only read, so a store they cannot write (a read-only mount) serves them; the report then writes
its files but does not log them to the sweep's parent run, and says so.

Exit status, as every axoexp command has it: 2 when the command refused (bad input, or a store that
is no usable MLflow store: damaged, half-built, of an older schema, a file store, another
application's database, a database without its driver), 1 when the store failed (another process
held the sqlite file locked for 20 s, a server did not answer), so that the same command may work
later; 130 Ctrl-C, in one line too. compare's 1 is its verdict, a regression: it exits 2 on every fault.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from mlflow.environment_variables import MLFLOW_TRACKING_URI
from mlflow.tracking import MlflowClient

from axoexp.errors import AxoexpError, NoSweepError, UnusableStoreError, quiet_store_errors
from axoexp.redact import redacted
from axoexp.signals import CTRL_C, OUTSIDE_A_RUN_EXIT
from axoexp.stdout import say
from axoexp.tracking import (
    DEFAULT_TRACKING_URI,
    TRACKING_URI_OPTION,
    UNREACHABLE,
    answering_client,
    bound_http_retries,
    damaged_store,
    no_store_yet,
    resolve_tracking_uri,
    sqlite_damaged,
    sqlite_path,
    store_problem,
    store_read_only,
    store_reason,
    tracking_uri_key,
)

STORE_FAILED = 1  # the exit status of a store that is locked or does not answer


def add_store_option(parser: argparse.ArgumentParser) -> None:
    """The command's :data:`TRACKING_URI_OPTION`, read by :meth:`StoreReader.open` from ``args.tracking_uri``."""
    parser.add_argument(
        TRACKING_URI_OPTION, default=None, help=f"default: ${MLFLOW_TRACKING_URI.name} or {DEFAULT_TRACKING_URI}"
    )


class StoreReader:
    """What :func:`reading` hands its command to open the store with; it keeps the store's URI, so
    that damage found only while reading is named with the command that moves it aside, and why
    that store cannot be written, if it cannot (:func:`~axoexp.tracking.store_read_only`)."""

    def __init__(self) -> None:
        self.uri: str | None = None
        self.read_only: str | None = None

    def open(self, tracking_uri: str | None, none_yet: str) -> MlflowClient:
        """A client of the store ``tracking_uri`` names (else ``$MLFLOW_TRACKING_URI``, else
        ``sqlite:///mlflow.db``) that has been checked for reading: :class:`NoSweepError` where its
        sqlite file does not exist (``none_yet`` says what to do), :class:`UnusableStoreError` naming
        what is wrong with it for reading (:func:`~axoexp.tracking.store_problem`), or
        :class:`~axoexp.errors.StoreLockedError` where another process holds it locked; either line
        begins with where the URI was set (``--tracking-uri=...`` or ``$MLFLOW_TRACKING_URI=...``).
        A store that cannot be written is read as it is (sqlite reads a file on a read-only mount)."""
        uri = resolve_tracking_uri(tracking_uri)
        database = sqlite_path(uri)
        absent = no_store_yet(uri)
        if absent:
            raise NoSweepError(f"no MLflow store: {redacted(uri)} {absent}; {none_yet}")
        problem = store_problem(uri, tracking_uri_key(tracking_uri, TRACKING_URI_OPTION), writes=False)
        if problem:
            raise UnusableStoreError(problem)
        self.uri = uri
        self.read_only = store_read_only(database) if database is not None else None
        return answering_client(uri)


@contextmanager
def reading(command: str, fault_status: int | None = None) -> Iterator[StoreReader]:
    """Run ``command``'s work: bad input or a store that cannot be read ends it with one line
    (``command: ...``, no traceback) and the fault's exit status, or ``fault_status`` for every
    fault (compare's); Ctrl-C ends it with one line and exit 130. HTTP retries are bounded as
    ``tracking.*`` bounds a run's, and MLflow's tracebacks of the database errors it raises again
    are kept off stderr."""
    bound_http_retries()
    quiet_store_errors()
    reader = StoreReader()
    try:
        yield reader
    except AxoexpError as error:
        say(command, error)
        sys.exit(fault_status or error.exit_code)
    except UNREACHABLE as error:
        damaged = sqlite_damaged(reader.uri, error) if reader.uri is not None else None
        if damaged is not None:
            say(command, damaged_store(damaged, store_reason(error)))
            sys.exit(fault_status or UnusableStoreError.exit_code)
        where = f" at {reader.uri}" if reader.uri is not None else ""
        say(command, f"the MLflow store{where} could not be read: {store_reason(error)}")
        sys.exit(fault_status or STORE_FAILED)
    except KeyboardInterrupt:
        say(command, CTRL_C)
        sys.exit(OUTSIDE_A_RUN_EXIT)
