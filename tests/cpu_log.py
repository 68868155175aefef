"""What each test costs the machine, not only how long it takes: with ``-p cpu_log``
(a serial run), each test's line in ``build/cpu.tsv`` holds its node id, its wall
seconds, the CPU seconds the whole machine spent meanwhile and when it started (Unix
time, to line a test up with what process accounting or a sampler saw then) (every process: the
test's, its Ray's, its subprocesses'). Most of the suite's time is CPU spent by
processes other than pytest, which per-process timers miss.

    .venv/bin/python -m pytest -p cpu_log
    sort -t$'\\t' -k3 -rn build/cpu.tsv | head -25
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

# A parallel run's workers each write a file of their own (``cpu-gw0.tsv``, ...), whose
# CPU column is then the machine's, shared with the other workers' tests.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
_NAME = f"cpu-{_WORKER}.tsv" if _WORKER else "cpu.tsv"
OUT = Path(__file__).resolve().parents[1] / "build" / _NAME
_TICK = os.sysconf("SC_CLK_TCK")
_started: dict[str, tuple[float, float, float]] = {}


def _busy_s() -> float:
    """CPU seconds the machine has spent busy since boot (every core, /proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / _TICK


def pytest_sessionstart(session: pytest.Session) -> None:  # noqa: ARG001 - pytest's hook
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text("nodeid\twall_s\tcpu_s\tstarted\n")


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:  # noqa: ARG001
    _started[nodeid] = (time.monotonic(), _busy_s(), time.time())


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:  # noqa: ARG001
    wall_start, cpu_start, started = _started.pop(nodeid)
    wall, cpu = time.monotonic() - wall_start, _busy_s() - cpu_start
    with OUT.open("a") as out:
        out.write(f"{nodeid}\t{wall:.2f}\t{cpu:.2f}\t{started:.1f}\n")
