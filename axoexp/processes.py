"""Processes by pid, through psutil: is one still alive (and the same one), which are ours."""

from __future__ import annotations

import os

import psutil


def start_time(pid: int) -> str | None:
    """When process ``pid`` started, to tell it from a later reuse of its pid (``None`` if gone)."""
    try:
        return f"{psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        return None


def alive(pid: int, started: str | None = None) -> bool:
    """Whether process ``pid`` of this host runs, and is the one that started at ``started``."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # it has exited
            return False
        return started is None or f"{process.create_time():.2f}" == started
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # exists, owned by someone else


def command_line(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def descendants(pid: int | None = None, recursive: bool = True) -> list[int]:
    """Every process below ``pid`` (default: this one); its children alone unless ``recursive``."""
    try:
        return [child.pid for child in psutil.Process(os.getpid() if pid is None else pid).children(recursive)]
    except psutil.NoSuchProcess:
        return []
