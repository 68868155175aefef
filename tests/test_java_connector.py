"""The Spark connector's own unit tests (``java/test.sh``: plain Java, no Spark cluster):
murmur3 against the Python hash, the data plane's frames, Arrow decoding, the
gateway contract as the connector speaks it, and the sink's chunking."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_connector_unit_tests_pass() -> None:
    result = subprocess.run(
        ["bash", str(ROOT / "java" / "test.sh")],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "all raytopics connector tests passed" in result.stdout
