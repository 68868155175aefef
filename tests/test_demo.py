"""``./dev.sh demo`` tells the product's story and checks itself: the demo program
on its own embedded Ray, as a fresh machine runs it. How long it takes is printed, not
asserted (beside the rest of the suite on two cores it takes twice what it takes alone):
its subprocess time-out only catches a hang."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_embedded import Place, place  # noqa: F401 - tests/ is on sys.path under pytest

pytestmark = pytest.mark.integration  # Rays of its own (own storage root and Ray temp dir)

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_the_demo_splits_merges_checks_order_and_queries_with_spark(place: Place) -> None:  # noqa: F811
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "examples/demo.py"],
        cwd=REPO, env=place.env | {"PYSPARK_PYTHON": sys.executable},
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    took = time.monotonic() - started
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    print(f"the demo took {took:.0f} s")
    assert len(re.findall(r"split +#\d+ -> #\d+ \+ #\d+", out)) >= 2, out
    assert len(re.findall(r"merged +#\d+ \+ #\d+ -> #\d+", out)) >= 1, out
    counts = re.search(r"produced ([\d,]+) messages, consumed ([\d,]+)", out)
    assert counts and counts.group(1) == counts.group(2), out
    assert "order check: every one of 200 keys arrived complete, once and in order" in out
    spark = re.search(r"Spark: ([\d,]+) rows read \(produced ([\d,]+)\)", out)
    assert spark and spark.group(1) == spark.group(2) == counts.group(1), out
    assert "the DAG now:" in out and "raytopics top demo/shop" in out
