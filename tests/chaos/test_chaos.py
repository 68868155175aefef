"""The chaos suite in CI size: ten seeds in a row on one multi-node cluster, and two
seeds with replicated segments on another.

The harness runs in its own process because it owns a ``ray.cluster_utils.Cluster``
(this session's tests share another Ray). A parallel run hands
the two tests out one by one. Each seed prints its fault schedule and its result, so a
failure replays with ``python -m tests.chaos.harness [--replicated] --seeds N``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # a multi-node cluster of its own

SEED_BUDGET_S = 300  # the acceptance bound for one seed
# ~4-6 minutes in all on a shared 2-core machine; the timeouts only catch hangs
SUITE_TIMEOUT_S = 1500


ROOT = Path(__file__).resolve().parents[2]
TEN_SEEDS = ("--seeds", "1-10", "--duration", "20")
REPLICATED_SEEDS = ("--replicated", "--seeds", "6,13", "--duration", "20")


def harness_output(args: tuple[str, ...], tmp_path: Path) -> str:
    """The harness's output once it passed, run on a cluster of its own under ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAYTOPICS_"))}
    env |= {"RAYTOPICS_STORAGE_ROOT": str(tmp_path), "RAY_AUTH_MODE": "disabled"}
    log, errors = tmp_path / "chaos.log", tmp_path / "chaos.err"  # tail -f while it runs
    print(f"chaos output: {log}")
    with log.open("w") as out, errors.open("w") as err:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.chaos.harness", *args],
            cwd=ROOT, env=env, stdout=out, stderr=err, timeout=SUITE_TIMEOUT_S,
        )  # fmt: skip
    output = log.read_text()
    print(output)
    assert proc.returncode == 0, output[-4000:] + errors.read_text()[-4000:]
    return output


def check_seeds(output: str, seeds: list[int]) -> list[dict]:
    results = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert [r["seed"] for r in results] == seeds
    for result in results:
        assert result["violations"] == [] and result["acked"] > 0, result
        assert result["stream_delivered"] == result["acked"]  # exactly once
        assert result["wall_s"] <= SEED_BUDGET_S, result
    return results


@pytest.mark.chaos
@pytest.mark.timeout(SUITE_TIMEOUT_S + 60)
def test_ten_seeds_in_a_row(tmp_path: Path) -> None:
    check_seeds(harness_output(TEN_SEEDS, tmp_path), list(range(1, 11)))


@pytest.mark.chaos
@pytest.mark.timeout(SUITE_TIMEOUT_S + 60)
def test_replicated_seeds(tmp_path: Path) -> None:
    """Replicated segments (``tests/chaos/replicated.py``): leaders' nodes removed under
    three producers, during splits and merges."""
    for result in check_seeds(harness_output(REPLICATED_SEEDS, tmp_path), [6, 13]):
        # both schedules lose two leaders' nodes, one at a time (the harness waits)
        faults = "\n".join(result["faults"])
        assert sum("removed node" in f for f in result["faults"]) == 2, faults
