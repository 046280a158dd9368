"""The Python driver a database store's URI needs (``postgresql://``, ``mysql+pymysql://``, ``mssql://``):
the one SQLAlchemy names, its default for a bare scheme; whether it is installed is found without importing it."""

from __future__ import annotations

import importlib.util
import socket

from mlflow.exceptions import MlflowException
from mlflow.store.db.db_types import DATABASE_ENGINES, SQLITE
from mlflow.utils.uri import get_uri_scheme

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
    """Why no database answers at the host and port of the database store ``uri`` (a TCP connect
    within ``timeout_s``; MLflow's own engine retries for about 100 s), or ``None``: it answers, or
    the URI is no database's or names no host (a local socket)."""
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
    if not url.host:
        return None
    port = url.port or DEFAULT_PORTS[engine]
    try:
        socket.create_connection((url.host, port), timeout=timeout_s).close()
    except OSError as error:
        return f"no database answers at {url.host}:{port} ({error.strerror or error})"
    return None
