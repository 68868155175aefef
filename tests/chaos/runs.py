"""The chaos runs the suite makes: the ten seeds, and the replicated seeds. Each is the
harness (``tests.chaos.harness``) in a process of its own, on a cluster of its own, in a
process group of its own (``stop`` ends the Ray processes it started too).

Running them beside the workers of a parallel run, started by xdist's controller, was
tried: the seeds keep most of a core busy, and the heaviest tests, which start first,
ran up to twice as long beside them (tests/README.md). They run on a worker.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_SCHEDULED, _EXIT, _LOG, _ERRORS = "scheduled", "exit-code", "chaos.log", "chaos.err"
_STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class ChaosRun:
    """One harness run: its subdirectory and its arguments."""

    name: str
    args: tuple[str, ...]


TEN_SEEDS = ChaosRun(
    "ten-seeds",
    ("--seeds", "1-10", "--duration", "20"),
)
REPLICATED_SEEDS = ChaosRun(
    "replicated-seeds",
    ("--replicated", "--seeds", "6,13", "--duration", "20"),
)


@dataclass(frozen=True)
class Outcome:
    """What the harness left: its exit code, its stdout (a line per seed) and stderr."""

    exit_code: int
    output: str
    errors: str


def start(directory: Path, run: ChaosRun) -> subprocess.Popen[bytes]:
    """Start ``run`` on a cluster of its own under ``directory / run.name``. A shell
    records its exit code in a file, which ``wait`` waits for."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAYTOPICS_"))}
    place = directory / run.name
    env |= {
        "RAY_AUTH_MODE": "disabled",
        "PYTHONPATH": str(ROOT),
        "RAYTOPICS_STORAGE_ROOT": str(place / "storage"),
    }
    place.mkdir(parents=True, exist_ok=True)
    (place / _SCHEDULED).write_text(f"{time.time()}\n")
    harness = shlex.join([sys.executable, "-m", "tests.chaos.harness", *run.args])
    script = f"{harness} > {_LOG} 2> {_ERRORS}; echo $? > {_EXIT}.part; mv {_EXIT}.part {_EXIT}"
    return subprocess.Popen(["sh", "-c", script], cwd=place, env=env, start_new_session=True)


def wait(directory: Path, run: ChaosRun, timeout_s: float) -> Outcome:
    """The run's outcome once it exited; ``TimeoutError`` (with what it printed so far)
    if it has not exited ``timeout_s`` after it started."""
    place = directory / run.name
    since = float((place / _SCHEDULED).read_text())
    while not (place / _EXIT).exists():
        if time.time() - since > timeout_s:
            raise TimeoutError(f"the chaos harness ran over {timeout_s} s:\n{_read(place)}")
        time.sleep(1.0)
    return Outcome(int((place / _EXIT).read_text()), *_read(place))


def _read(directory: Path) -> tuple[str, str]:
    return tuple(  # type: ignore[return-value]
        (directory / name).read_text() if (directory / name).exists() else ""
        for name in (_LOG, _ERRORS)
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    """End the harness and every process of its group: politely, then not."""
    if process.poll() is not None:
        return
    for sig, grace in ((signal.SIGTERM, _STOP_GRACE_S), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(grace or None)
            return
        except subprocess.TimeoutExpired:
            continue
