"""Polling for a condition that the system reaches by itself (a maintenance round, an
actor exiting, a node joining), shared by tests that run as scripts too."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")


def wait_for(condition: Callable[[], _T], timeout_s: float = 90, step_s: float = 0.3) -> _T:
    """``condition()``'s first truthy value; fails the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s"
        time.sleep(step_s)
    return value
