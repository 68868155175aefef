"""Coverage runs only (``./dev.sh coverage``): measure the processes that run the
product, and keep the line data of Ray's worker processes.

``patch = subprocess`` starts coverage in every Python process the tests start,
Ray's own included: its dashboard and agents, log monitor and autoscaler monitor
never run the product, and tracing them only slows the machine (they are among its
busiest processes), so their measurement is stopped at once. So is that of the
tools the tests run (the ``ray`` command, the S3 server, the fuzzer).

Coverage writes a process's data when it exits normally, but Ray ends most of its
workers without that: detached actors are SIGKILLed when their Ray stops, and
``ray.kill`` or a removed node ends a process on the spot. So in a measured Ray
worker a daemon thread saves the data every ``INTERVAL_S`` seconds, starting once
the worker has had time to register with its raylet.

``./dev.sh coverage`` loads this file from a ``.pth`` file in the venv; in every
other run ``start`` returns at once.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

FIRST_SAVE_S = 5.0
INTERVAL_S = 2.0
RAY_WORKER = "default_worker.py"
TOOLS = frozenset({"ray", "moto_server", "st"})  # console scripts that run no product code


def start() -> None:
    if not os.getenv("COVERAGE_PROCESS_CONFIG"):
        return
    program = _program()
    if program.endswith(RAY_WORKER):
        threading.Thread(target=_save_forever, daemon=True, name="coverage-saver").start()
    elif "site-packages" in program or os.path.basename(program) in TOOLS:
        _stop_measuring()


def _program() -> str:
    """The script this process runs: the first argument of its command line that is not an
    option of the interpreter (``sys.argv[0]`` is this file while ``runpy`` runs it)."""
    return next((arg for arg in sys.orig_argv[1:] if not arg.startswith("-")), "")


def _stop_measuring() -> None:
    import coverage

    measured = coverage.Coverage.current()
    if measured is not None:
        measured.stop()
        measured._auto_save = False  # noqa: SLF001 - nothing measured, nothing to write


def _save_forever() -> None:
    import coverage

    time.sleep(FIRST_SAVE_S)
    measured = coverage.Coverage.current()
    while measured is not None:
        with contextlib.suppress(Exception):  # a save racing the tracer: the next one wins
            measured.save()
        time.sleep(INTERVAL_S)


start()
