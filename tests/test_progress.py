"""The run's progress: every window in the log, and a live display drawn only from the observer hooks."""

from __future__ import annotations

import io
import logging
import threading
import time

import pytest

from axoexp import progress
from axoexp.experiment import run_experiment
from axoexp.progress import RunProgress, noted_if_slow, run_observers
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
    progress.update_finished(MEASURED, 0, 1.0, 0.5, None)
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
        progress.update_finished(WARMUP, index, 1.5 + index, 0.25, None)
    progress.window_finished(WARMUP, 3)
    shown = terminal.getvalue()
    assert "prepare (compile, capture)" in shown and "warm-up" in shown and "last 1.500 ms" in shown[drawn:]
    assert "last 2.500 ms" not in shown, "redrawn at most every refresh_s"
    assert shown.endswith("\x1b[?25h\r\x1b[1A\x1b[2K"), "the bar is cleared when its window ends"


def test_no_display_unless_asked_for_and_on_a_terminal() -> None:
    assert all(observer.console is None for observer in run_observers(progress=False))
    assert all(observer.console is None for observer in run_observers(progress=True, in_this_terminal=False))


def test_a_phase_without_lines_of_its_own_says_it_is_still_going_and_when_it_ended(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Planning and the population's build ran for minutes in silence at population.time_steps=100000;
    a phase that takes longer than NOTICE_AFTER_S says so while it runs, and its duration as it ends."""
    caplog.set_level(logging.INFO, logger="axoexp")
    with noted_if_slow("long phase", after_s=0.01):
        assert _wait_for(caplog, "long phase: still going after 0 s")
    with noted_if_slow("quick phase", after_s=60):
        pass
    with pytest.raises(KeyboardInterrupt), noted_if_slow("stopped phase", after_s=0):
        raise KeyboardInterrupt
    messages = [record.getMessage() for record in caplog.records]
    assert messages[0] == "long phase: still going after 0 s" and messages[1].startswith("long phase: done in ")
    assert messages[-1].startswith("stopped phase: stopped after ") and not any("quick" in m for m in messages)


def test_a_run_names_its_planning_and_build_when_they_take_long(
    make_config, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="axoexp")
    monkeypatch.setattr(progress, "NOTICE_AFTER_S", 0.0)  # every phase takes "long"
    run_experiment(make_config("run.measured_updates=1"))
    done = [record.getMessage() for record in caplog.records if ": done in " in record.getMessage()]
    assert done[0].startswith("planning (population=lite is built and one update checked before any run exists)")
    assert done[1].startswith("build (population=lite on cpu, its batches, and the held-out loss): done in ")


def _wait_for(caplog: pytest.LogCaptureFixture, message: str, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(record.getMessage() == message for record in caplog.records):
            return True
        time.sleep(0.01)
    return False
