"""The chaos suite in CI size: ten seeds in a row on one multi-node cluster.

The harness runs in its own process because it owns a ``ray.cluster_utils.Cluster``
(this session's tests share another Ray). Each seed prints its fault schedule and
its result, so a failure replays with ``python -m tests.chaos.harness --seeds N``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # a multi-node cluster of its own

ROOT = Path(__file__).resolve().parents[2]
SEEDS = "1-10"
SEED_BUDGET_S = 300  # the acceptance bound for one seed
# ~6-12 minutes in all on a shared 2-core machine; the timeouts only catch hangs
SUITE_TIMEOUT_S = 1500


@pytest.mark.chaos
@pytest.mark.timeout(SUITE_TIMEOUT_S + 60)
def test_ten_seeds_in_a_row(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAYTOPICS_"))}
    env |= {"RAYTOPICS_STORAGE_ROOT": str(tmp_path), "RAY_AUTH_MODE": "disabled"}
    log, errors = tmp_path / "chaos.log", tmp_path / "chaos.err"  # tail -f while it runs
    print(f"chaos output: {log}")
    with log.open("w") as out, errors.open("w") as err:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.chaos.harness", "--seeds", SEEDS, "--duration", "20"],
            cwd=ROOT, env=env, stdout=out, stderr=err, timeout=SUITE_TIMEOUT_S,
        )  # fmt: skip
    output = log.read_text()
    print(output)
    results = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, output[-4000:] + errors.read_text()[-4000:]
    assert [r["seed"] for r in results] == list(range(1, 11))
    for result in results:
        assert result["violations"] == [] and result["acked"] > 0, result
        assert result["stream_delivered"] == result["acked"]  # exactly once
        assert result["wall_s"] <= SEED_BUDGET_S, result
