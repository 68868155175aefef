"""How long each test took in a whole run, so that a parallel run starts the longest
work first (``conftest.pytest_collection_modifyitems``): with the longest last, the
run waits for it alone at the end.

``tests/weights.json`` maps a test's node id to its seconds (setup, call and
teardown). Refresh it after tests were added or got faster or slower:

    ./dev.sh test --junitxml=build/junit.xml
    .venv/bin/python -m tests.weights build/junit.xml

A test missing from the file weighs ``UNKNOWN_S``; only the order depends on the
figures, never what runs.
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

FILE = Path(__file__).with_name("weights.json")
UNKNOWN_S = 2.0
# A test run with ``--dist loadgroup`` is reported as ``name@group``; parameters end in "]".
GROUP_SUFFIX = re.compile(r"@[^@\]]*$")


def load() -> dict[str, float]:
    try:
        return json.loads(FILE.read_text())
    except (OSError, ValueError):
        return {}


def from_junit(path: Path) -> dict[str, float]:
    """Node id → seconds, from pytest's JUnit XML (``junit_duration_report=total``)."""
    weights = {}
    for case in ElementTree.parse(path).iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        name = GROUP_SUFFIX.sub("", case.get("name", ""))  # xdist's ``@group``, not the id
        weights[f"{module}::{name}"] = round(float(case.get("time", 0)), 2)
    return dict(sorted(weights.items()))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.weights JUNIT_XML", file=sys.stderr)
        return 2
    weights = from_junit(Path(argv[0]))
    FILE.write_text(json.dumps(weights, indent=1) + "\n")
    print(f"{len(weights)} tests, {sum(weights.values()):.0f} s in all -> {FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
