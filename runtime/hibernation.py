"""Which segments' processes may exit (hibernate) because nothing needs them running.

A segment actor costs a process (~85 MB) whether or not anyone uses it, and a long-lived
elastic topic accumulates sealed segments. Two kinds need none while idle: a tiered
segment (its records are in the object store, its state in its record) and a sealed
segment every subscription has drained (nothing is owed to anyone; its files stay where
they are). Either is started again, on demand, by the next reader. Pure: the
controller's maintenance acts on it, from the stats of one round.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def idle_tiered(stats: Mapping[int, Mapping[str, Any]], idle_s: float) -> list[int]:
    """Tiered segments whose running actor no reader has used for ``idle_s`` seconds: their
    process may exit (hibernate); the next reader starts it again."""
    return sorted(
        segment_id
        for segment_id, st in stats.items()
        if st.get("tiered") and not st.get("hibernating") and st.get("idleS", 0.0) >= idle_s
    )


def idle_drained(stats: Mapping[int, Mapping[str, Any]], idle_s: float) -> list[int]:
    """Sealed segments on local disk with nothing unacknowledged for any subscription and
    no reader or writer for ``idle_s`` seconds: their process may exit."""
    return sorted(
        segment_id
        for segment_id, st in stats.items()
        if st.get("terminated")
        and not st.get("tiered")
        and not st.get("hibernating")
        and st.get("idleS", 0.0) >= idle_s
        and all(sub["backlog"] == 0 for sub in st.get("subscriptions", {}).values())
    )
