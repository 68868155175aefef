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

ROOT = Path(__file__).resolve().parents[2]
SEEDS = "1-10"


@pytest.mark.chaos
@pytest.mark.timeout(900)
def test_ten_seeds_in_a_row(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAYTOPICS_"))}
    env |= {"RAYTOPICS_STORAGE_ROOT": str(tmp_path), "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.chaos.harness", "--seeds", SEEDS, "--duration", "20"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=840,
    )  # fmt: skip
    print(proc.stdout)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert [r["seed"] for r in results] == list(range(1, 11))
    for result in results:
        assert result["violations"] == [] and result["acked"] > 0, result
        assert result["stream_delivered"] == result["acked"]  # exactly once
