"""The chaos suite in CI size: ten seeds in a row on one multi-node cluster.

The harness runs in its own process because it owns a ``ray.cluster_utils.Cluster``
(this session's tests share another Ray). In a parallel run xdist's controller starts it
when the tests are collected, beside the workers (``tests/chaos/background.py``); this
test then waits for it. Each seed prints its fault schedule and its result, so a failure
replays with ``python -m tests.chaos.harness --seeds N``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.chaos import background

pytestmark = pytest.mark.integration  # a multi-node cluster of its own

SEED_BUDGET_S = 300  # the acceptance bound for one seed
# ~4-6 minutes in all on a shared 2-core machine; the timeouts only catch hangs
SUITE_TIMEOUT_S = 1500


@pytest.mark.chaos
@pytest.mark.timeout(SUITE_TIMEOUT_S + 60)
def test_ten_seeds_in_a_row(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    directory = background.directory_of(request.config)
    if directory is None or not background.started(directory):
        directory = tmp_path
        process = background.start(directory)
    else:
        process = None
    print(f"chaos output: {directory}")  # tail -f its chaos.log while it runs
    try:
        outcome = background.wait(directory, SUITE_TIMEOUT_S)
    finally:
        if process is not None:
            background.stop(process)
    print(outcome.output)
    results = [json.loads(line) for line in outcome.output.splitlines() if line.startswith("{")]
    assert outcome.exit_code == 0, outcome.output[-4000:] + outcome.errors[-4000:]
    assert [r["seed"] for r in results] == list(range(1, 11))
    for result in results:
        assert result["violations"] == [] and result["acked"] > 0, result
        assert result["stream_delivered"] == result["acked"]  # exactly once
        assert result["wall_s"] <= SEED_BUDGET_S, result
