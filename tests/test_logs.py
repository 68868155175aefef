"""How the system's actors log (``runtime.logs``): time, level and logger on each line,
INFO kept, one handler however often an actor's constructor runs."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest

from runtime.logs import LOG_LEVEL_ENV, PACKAGES, configure_actor_logging


@pytest.fixture
def actor_loggers() -> Iterator[None]:
    """This process's loggers as they were: the test process is no actor."""
    saved = {p: (logging.getLogger(p).handlers[:], logging.getLogger(p).level) for p in PACKAGES}
    yield
    for package, (handlers, level) in saved.items():
        logger = logging.getLogger(package)
        logger.handlers[:], logger.propagate = handlers, True
        logger.setLevel(level)


def test_an_actors_info_lines_carry_the_time_level_and_logger_once(
    actor_loggers: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(LOG_LEVEL_ENV, raising=False)
    configure_actor_logging()
    configure_actor_logging()  # a restarted actor's constructor runs again
    logging.getLogger("actors.control.replica_keeper").info("replica %s leads epoch %d", "d1", 2)
    logging.getLogger("storage.segment_log").debug("not at INFO")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
    assert re.fullmatch(rf"{stamp} INFO actors.control.replica_keeper: replica d1 leads epoch 2",
                        lines[0]), lines  # fmt: skip


def test_the_level_is_the_settings_and_a_wrong_one_is_said_and_replaced_by_info(
    actor_loggers: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LOG_LEVEL_ENV, "warning")
    configure_actor_logging()
    logging.getLogger("runtime.x").info("dropped")
    logging.getLogger("runtime.x").warning("kept")
    err = capsys.readouterr().err
    assert "dropped" not in err and "WARNING runtime.x: kept" in err
    for package in PACKAGES:
        logging.getLogger(package).handlers.clear()
    monkeypatch.setenv(LOG_LEVEL_ENV, "loud")
    configure_actor_logging()
    logging.getLogger("actors.y").info("at info")
    err = capsys.readouterr().err
    assert "RAYTOPICS_LOG_LEVEL='LOUD' is not a logging level" in err
    assert "INFO actors.y: at info" in err
