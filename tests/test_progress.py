"""The run's progress: every window in the log, and a live display drawn only from the observer hooks."""

from __future__ import annotations

import io
import logging
import threading

import pytest

from axoexp.experiment import run_experiment
from axoexp.progress import RunProgress, run_observers
from axoexp.windows import MEASURED, PREPARE, WARMUP


class TerminalBuffer(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_every_window_and_its_duration_is_logged(make_config, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="axoexp")
    run_experiment(
        make_config("run.warmup_updates=2", "run.measured_updates=3", "verify.enabled=true"),
        observers=[RunProgress(display=False)],
    )
    messages = [record.getMessage() for record in caplog.records if record.name == "axoexp.run"]
    assert [message.split(":")[0] for message in messages] == [
        "prepare (compile, capture)",
        "prepare (compile, capture)",
        "warm-up",
        "warm-up",
        "measured",
        "measured",
        "verify",
        "verify",
    ]
    assert messages[3].startswith("warm-up: 2 updates in ") and " s, median " in messages[3]
    assert messages[5].startswith("measured: 3 updates in ")
    assert messages[7].startswith("verify: done in ")


def test_an_interrupted_window_is_logged_as_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="axoexp")
    progress = RunProgress(display=False)
    progress.window_started(MEASURED, 10)
    progress.update_finished(MEASURED, 0, 1.0, 0.5)
    progress.window_finished(MEASURED, 1)
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert record.getMessage().startswith("measured: stopped after 1 of 10 updates in ")


def test_the_display_is_drawn_from_the_hooks_only_and_cleared_after_each_window() -> None:
    terminal = TerminalBuffer()
    progress = RunProgress(display=True, stream=terminal, refresh_s=3600)
    threads = threading.active_count()
    progress.window_started(PREPARE, 0)
    progress.window_finished(PREPARE, 0)
    progress.window_started(WARMUP, 3)
    assert threading.active_count() == threads, "no refresh thread: drawing happens only in the hooks"
    drawn = len(terminal.getvalue())
    for index in range(3):
        progress.update_finished(WARMUP, index, 1.5 + index, 0.25)
    progress.window_finished(WARMUP, 3)
    shown = terminal.getvalue()
    assert "prepare (compile, capture)" in shown and "warm-up" in shown and "last 1.500 ms" in shown[drawn:]
    assert "last 2.500 ms" not in shown, "redrawn at most every refresh_s"
    assert shown.endswith("\x1b[?25h\r\x1b[1A\x1b[2K"), "the bar is cleared when its window ends"


def test_no_display_unless_asked_for_and_on_a_terminal() -> None:
    assert all(observer.console is None for observer in run_observers(progress=False))
    assert all(observer.console is None for observer in run_observers(progress=True, in_this_terminal=False))
