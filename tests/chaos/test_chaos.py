"""The chaos suite in CI size: ten seeds in a row on one multi-node cluster, and two
seeds with replicated segments on another.

The harness runs in its own process because it owns a ``ray.cluster_utils.Cluster``
(this session's tests share another Ray; ``tests/chaos/runs.py``). A parallel run hands
the two tests out one by one. Each seed prints its fault schedule and its result, so a
failure replays with ``python -m tests.chaos.harness [--replicated] --seeds N``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.chaos import runs

pytestmark = pytest.mark.integration  # a multi-node cluster of its own

SEED_BUDGET_S = 300  # the acceptance bound for one seed
# ~4-6 minutes in all on a shared 2-core machine; the timeouts only catch hangs
SUITE_TIMEOUT_S = 1500


def outcome_of(run: runs.ChaosRun, tmp_path: Path) -> str:
    """The run's output once it passed."""
    print(f"chaos output: {tmp_path / run.name}")  # tail -f its chaos.log while it runs
    process = runs.start(tmp_path, run)
    try:
        outcome = runs.wait(tmp_path, run, SUITE_TIMEOUT_S)
    finally:
        runs.stop(process)
    print(outcome.output)
    assert outcome.exit_code == 0, outcome.output[-4000:] + outcome.errors[-4000:]
    return outcome.output


def check_seeds(output: str, seeds: list[int]) -> None:
    results = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert [r["seed"] for r in results] == seeds
    for result in results:
        assert result["violations"] == [] and result["acked"] > 0, result
        assert result["stream_delivered"] == result["acked"]  # exactly once
        assert result["wall_s"] <= SEED_BUDGET_S, result


@pytest.mark.chaos
@pytest.mark.timeout(SUITE_TIMEOUT_S + 60)
def test_ten_seeds_in_a_row(tmp_path: Path) -> None:
    check_seeds(outcome_of(runs.TEN_SEEDS, tmp_path), list(range(1, 11)))


@pytest.mark.chaos
@pytest.mark.timeout(SUITE_TIMEOUT_S + 60)
def test_replicated_seeds(tmp_path: Path) -> None:
    """Replicated segments (``tests/chaos/replicated.py``): leaders' nodes removed under
    three producers, during splits and merges."""
    check_seeds(outcome_of(runs.REPLICATED_SEEDS, tmp_path), [6, 13])
