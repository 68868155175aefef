"""The README's Python tour runs as written (docs that match the code)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_tour_runs(ray_cluster, unique):
    text = README.read_text()
    tour = re.search(r"## A tour in Python\s+```python\n(.*?)```", text, re.S)
    assert tour, "the README lost its Python tour"
    code = tour.group(1).replace("topic://acme/orders/events", f"topic://acme/orders/tour-{unique}")
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the documented code itself
    stats = scope["admin"].get_stats(scope["topic"])
    assert stats["records"] == 3 and stats["subscriptions"]["billing"]["backlog"] == 0
    scope["admin"].delete_scalable_topic(scope["topic"])


def test_the_tour_twice_as_two_programs_delivers_or_fails_loudly(unique, tmp_path):
    """Run as two programs in a row, the tour never exits 0 with messages lost: the
    first delivers all three, the second is refused loudly (the topic outlived the
    first program), not served the first one's files as its own."""
    import os
    import subprocess
    import sys

    text = README.read_text()
    code = re.search(r"## A tour in Python\s+```python\n(.*?)```", text, re.S).group(1)
    topic = f"topic://acme/orders/twice-{unique}"
    program = tmp_path / "tour.py"
    program.write_text(code.replace("topic://acme/orders/events", topic))
    # As a newcomer runs it: no cluster named, so each program uses the embedded Ray
    # of the storage root (started by the first, stopped as it exits, started again).
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAYTOPICS_STORAGE_ROOT"] = str(tmp_path / "root")
    runs = [
        subprocess.run([sys.executable, str(program)], env=env, capture_output=True, text=True,
                       timeout=300, check=False, cwd=README.parent)
        for _ in range(2)
    ]  # fmt: skip
    first, second = runs
    assert first.returncode == 0, first.stderr[-3000:]
    assert "'backlog': 0" in first.stdout, first.stdout
    assert second.returncode != 0, "the second program exited 0"
    assert "TopicAlreadyExistsError" in second.stderr, second.stderr[-3000:]
