"""The weights that order a parallel run are read back under the ids the run looks up."""

from __future__ import annotations

from pathlib import Path

from tests import weights

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.chaos.test_chaos"
  name="test_ten_seeds_in_a_row@tests/chaos/test_chaos.py" time="312.87"/>
<testcase classname="tests.test_readme"
  name="test_the_python_blocks_run[spark.md]@spark" time="56.9"/>
<testcase classname="tests.test_readme" name="test_the_shell_blocks_run[clients.md]" time="40.4"/>
<testcase classname="tests.test_x" name="test_ids[a@b]" time="1.5"/>
</testsuite></testsuites>
"""


def test_a_loadgroup_runs_names_are_read_without_their_group(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(JUNIT)
    assert weights.from_junit(report) == {
        "tests/chaos/test_chaos.py::test_ten_seeds_in_a_row": 312.87,
        "tests/test_readme.py::test_the_python_blocks_run[spark.md]": 56.9,
        "tests/test_readme.py::test_the_shell_blocks_run[clients.md]": 40.4,
        "tests/test_x.py::test_ids[a@b]": 1.5,
    }


def test_every_weight_names_a_test_as_collected() -> None:
    """No key carries a group: such a weight would never be found, and the run's order
    would fall back to unknown weights for every test (the chaos seeds started last)."""
    assert all(weights.GROUP_SUFFIX.search(name) is None for name in weights.load())
