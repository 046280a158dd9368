"""The Python driver a database store's URI needs (``postgresql://``, ``mysql+pymysql://``, ``mssql://``):
the one SQLAlchemy names, its default for a bare scheme; whether it is installed is found without importing it.
Whether the database answers and lets the store connect is found at once, where MLflow retries ~100 s."""

from __future__ import annotations

import importlib.util
import math
import socket
from typing import TYPE_CHECKING

from mlflow.exceptions import MlflowException
from mlflow.store.db.db_types import DATABASE_ENGINES, SQLITE
from mlflow.utils.uri import get_uri_scheme

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

DRIVER_MODULES = {"mysqldb": "MySQLdb", "mysqlconnector": "mysql.connector", "mariadbconnector": "mariadb"}
"""The module of each driver whose module SQLAlchemy names otherwise (any other is the driver's name)."""
DRIVER_PACKAGES = {
    "psycopg": "'psycopg[binary]'",
    "psycopg2": "psycopg2-binary",
    "mysqldb": "mysqlclient",
    "mysqlconnector": "mysql-connector-python",
}
"""What pip installs each driver from, where that is not its module's name."""
DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
"""Where each database listens when its URI names no port."""
TIMEOUT_ARGS = {
    "psycopg2": "connect_timeout",
    "psycopg": "connect_timeout",
    "pg8000": "timeout",
    "pymysql": "connect_timeout",
    "mysqldb": "connect_timeout",
    "mysqlconnector": "connection_timeout",
    "mariadbconnector": "connect_timeout",
    "pyodbc": "timeout",
    "pymssql": "login_timeout",
}
"""Each driver's connect-timeout argument."""
PASSING_REFUSALS = ("starting up", "shutting down", "recovery mode", "too many", "connection slots")
"""Refusals of a server that may soon accept the connection, which MLflow's retries then outlast."""


def database_problem(uri: str) -> str | None:
    """Why the database store ``uri`` names cannot be opened here, found without connecting: MLflow
    knows no such database, SQLAlchemy no such driver, or the driver is not installed; ``None`` for
    other stores (a sqlite file, a server) and where the driver is installed."""
    try:
        engine = get_uri_scheme(uri)
    except MlflowException as error:  # a database MLflow does not support, or no URI of one
        return error.message
    if engine not in DATABASE_ENGINES or engine == SQLITE:
        return None
    from sqlalchemy.engine import make_url  # a fifth of a second, for a database's URI only
    from sqlalchemy.exc import ArgumentError

    try:
        driver = make_url(uri).get_dialect().driver
    except ArgumentError as error:  # an unknown driver, a URI SQLAlchemy cannot parse
        return f"SQLAlchemy cannot use it ({error})"
    module = DRIVER_MODULES.get(driver, driver)
    if _installed(module):
        return None
    return (
        f"{uri.partition('://')[0]}:// needs the Python driver {module}, which is not installed; install it "
        f"(pip install {DRIVER_PACKAGES.get(driver, module)}) or name an installed one ({engine}+DRIVER://)"
    )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the package of a dotted name is missing (mysql of mysql.connector)
        return False


def database_unreachable(uri: str, timeout_s: float) -> str | None:
    """Why the database store ``uri`` cannot be used, found at once where MLflow's own engine
    retries for about 100 s: no database answers at its host and port (a TCP connect within
    ``timeout_s``), or the one that answers refuses the connection (a wrong password, user or
    database: one connection). ``None``: it connects, or the URI is no database's."""
    try:
        engine = get_uri_scheme(uri)
    except MlflowException:  # no database MLflow knows: database_problem names it
        return None
    if engine not in DEFAULT_PORTS:
        return None
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(uri)
    except ArgumentError:  # database_problem names it
        return None
    failed = "no connection to the database on its local socket"  # no server there, or one refusing
    if url.host:
        port = url.port or DEFAULT_PORTS[engine]
        failed = f"the database at {url.host}:{port} refused the connection"
        try:
            socket.create_connection((url.host, port), timeout=timeout_s).close()
        except OSError as error:
            return f"no database answers at {url.host}:{port} ({error.strerror or error})"
    refused = _connection_refused(url, timeout_s)
    return f"{failed}: {refused}" if refused else None


def _connection_refused(url: URL, timeout_s: float) -> str | None:
    """The first line of the driver's error where one connection to ``url`` fails for good (a
    login, a database); ``None`` where it connects, or fails in a way MLflow's retries may outlast
    (a server starting up or full) or the probe cannot judge (then MLflow meets it as before)."""
    from sqlalchemy import create_engine
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.pool import NullPool

    try:
        key = TIMEOUT_ARGS.get(url.get_dialect().driver)  # the driver's own connect timeout, in whole seconds
        timeout = {key: max(1, math.ceil(timeout_s))} if key else {}
        engine = create_engine(url, poolclass=NullPool, connect_args=timeout)
        with engine.connect():
            return None
    except DBAPIError as error:
        return lasting_refusal(str(error.orig or error).strip() or type(error.orig or error).__name__)
    except Exception:  # a driver's own surprise: MLflow's engine meets it as before
        return None


def lasting_refusal(error: str) -> str | None:
    """The first line of a driver's connection error, unless the refusal may soon pass (then ``None``)."""
    return None if any(phrase in error.lower() for phrase in PASSING_REFUSALS) else error.splitlines()[0].strip()
