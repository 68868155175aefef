"""How the system's actors log.

Ray configures its own ``ray`` logger in a worker and nothing else, so without a handler
of its own an actor's INFO lines (an election, a lost follower replaced, an autoscale
decision) were dropped, and its warnings reached the worker's log through Python's last
resort handler: the bare message, with no time and no logger name, which leaves an
operator nothing to line a warning up against. Each actor process gives the system's
packages one handler writing to stderr (Ray's ``worker-*.err`` file of that process),
with the time, the level and the logger, at ``RAYTOPICS_LOG_LEVEL`` (``INFO``).

Only actors: a client library leaves the application's logging to the application.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

LOG_LEVEL_ENV = "RAYTOPICS_LOG_LEVEL"
DEFAULT_LEVEL = "INFO"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The packages whose modules run inside the system's actors.
PACKAGES = ("actors", "runtime", "storage")


class _ActorHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to this process's stderr as it is when a line is written (as logging's last
    resort does), and marks the handler this module added, so a second call adds none."""

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        """``StreamHandler`` sets its stream once; this one has none of its own."""


def configure_actor_logging() -> None:
    """Give the system's loggers their handler in this (actor) process, once. A level
    that is not one of logging's names is reported and ``INFO`` used instead."""
    level = os.environ.get(LOG_LEVEL_ENV, DEFAULT_LEVEL).strip().upper()
    unknown = not isinstance(logging.getLevelName(level), int)
    handler = _ActorHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    for package in PACKAGES:
        logger = logging.getLogger(package)
        if any(isinstance(h, _ActorHandler) for h in logger.handlers):
            continue
        logger.addHandler(handler)
        logger.setLevel(DEFAULT_LEVEL if unknown else level)
        logger.propagate = False  # a handler Ray or a library put on the root: not twice
    if unknown:
        logging.getLogger(__name__).warning(
            "%s=%r is not a logging level (DEBUG, INFO, WARNING, ERROR): %s is used",
            LOG_LEVEL_ENV, level, DEFAULT_LEVEL,
        )  # fmt: skip
