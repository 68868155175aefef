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
