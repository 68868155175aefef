"""The chaos seeds run beside a parallel run's workers, from its start.

The ten seeds are bound by their schedule (ten times 20 s of load and faults), not by
the machine: alone they keep well under a core busy. On an xdist worker they held that
worker for their whole length. So in a parallel run xdist's controller starts the
harness as soon as a worker has collected the chaos test (before any test runs), and
the test, ordered last on its worker (``conftest._group_and_order``), waits for the
harness's exit and checks its output. Run without xdist, or alone, the test starts the
harness itself and waits the same way.

Who calls what: ``conftest.pytest_configure`` registers ``ControllerPlugin`` in a
parallel run's controller only; the test calls ``directory_of`` / ``start`` / ``wait``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE_ID = "tests/chaos/test_chaos.py::test_ten_seeds_in_a_row"
SEEDS, DURATION_S = "1-10", 20
_DIRECTORY_KEY = "raytopics_chaos_directory"  # in an xdist worker's ``workerinput``
_STARTED, _EXIT, _LOG, _ERRORS = "started", "exit-code", "chaos.log", "chaos.err"
_STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class Outcome:
    """What the harness left: its exit code, its stdout (a line per seed) and stderr."""

    exit_code: int
    output: str
    errors: str


def start(directory: Path) -> subprocess.Popen[bytes]:
    """Start the harness on a cluster of its own under ``directory``, in a process group
    of its own (``stop`` ends the Ray processes it started too). A shell records its
    exit code in a file: the waiter may be another process than the starter."""
    directory.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAYTOPICS_"))}
    env |= {"RAYTOPICS_STORAGE_ROOT": str(directory / "storage"), "RAY_AUTH_MODE": "disabled"}
    harness = [sys.executable, "-m", "tests.chaos.harness", "--seeds", SEEDS]
    harness += ["--duration", str(DURATION_S)]
    exit_code = f"echo $? > {_EXIT}.part; mv {_EXIT}.part {_EXIT}"
    script = f'cd "{directory}" && "$@" > {_LOG} 2> {_ERRORS}; {exit_code}'
    (directory / _STARTED).write_text(f"{time.time()}\n")
    return subprocess.Popen(
        ["sh", "-c", script, "sh", *harness],
        env=env | {"PYTHONPATH": str(ROOT)}, start_new_session=True,
    )  # fmt: skip


def started(directory: Path) -> bool:
    return (directory / _STARTED).exists()


def wait(directory: Path, timeout_s: float) -> Outcome:
    """The harness's outcome once it exited; ``TimeoutError`` (with what it printed so
    far) if it runs longer than ``timeout_s`` from its start."""
    since = float((directory / _STARTED).read_text())
    while not (directory / _EXIT).exists():
        if time.time() - since > timeout_s:
            raise TimeoutError(f"the chaos harness ran over {timeout_s} s:\n{_read(directory)}")
        time.sleep(1.0)
    return Outcome(int((directory / _EXIT).read_text()), *_read(directory))


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


def directory_of(config: pytest.Config) -> Path | None:
    """Where the controller runs (or would run) the harness; None without xdist."""
    workerinput = getattr(config, "workerinput", None)
    value = workerinput.get(_DIRECTORY_KEY) if workerinput else None
    return Path(value) if value else None


class ControllerPlugin:
    """xdist's controller: gives every worker the harness's directory and starts the
    harness once a worker's collection holds the chaos test."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: object) -> None:
        node.workerinput[_DIRECTORY_KEY] = str(self.directory)  # type: ignore[attr-defined]

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: object, ids: list[str]) -> None:  # noqa: ARG002
        if self.process is None and any(i.split("@")[0] == NODE_ID for i in ids):
            self.process = start(self.directory)

    def pytest_unconfigure(self) -> None:
        if self.process is not None:
            stop(self.process)
